/* fuzz_lua_prims.c — libFuzzer harness for the Lua side of policies: the primitives
 * (lua/prims_lua.c, lua/prims_scores.c, lua/prims_page.c, lua/ext_rope.c), the tensor userdata and its methods and operators
 * (lua/tensor.c, lua/tensor_methods.c), and the event object with its fields and actions (lua/events.c, with the
 * engine's action validation of core/actions.c), all inside the policy sandbox with its limits.
 *
 * How. At init one sandboxed policy is loaded per device mode ("host" and "emulate", the latter
 * running every primitive through the emulated device of lua/emu_device.c). Its handlers are one
 * small interpreter written in Lua (PROGRAM below) that reads a byte program and executes it as
 * a sequence of opcodes over a pool of values: push a constant (0, -1, NaN, inf, 2^31,
 * math.maxinteger, option names, ...), build a table (numbers, nested, mixed with tensors and
 * strings), build an options table, call a `kvsieve` function, call a tensor method, apply an
 * operator (+ - * / unary minus # tostring < ==), read an event field, call an event method
 * (the actions), keep a value for the next event (so views go stale), close a value. Every call
 * runs under pcall, so one program makes many calls; results join the pool.
 *
 * Input layout: 8 header bytes choose the synthetic events' shapes (query / KV heads up to 64,
 * head_dim, rows, KV rows per head, layer, pass, backend, device mode, event kinds, and a few
 * special values such as NaN in q), then the program, cut at "\xfe\xfe" into up to three
 * parts: the begin handler's, the first event's, the second event's (values kept by the first
 * are stale in the second). The events are built here (core/policy.h's ks_event, on freshly
 * malloc'd buffers of exactly their size, so any read outside them is an ASan report) and the
 * policy's trampolines run them as the engine would; recorded actions are then freed. Limits:
 * _memory_mb 64, _instructions 5e6, _seconds 5 (the sandbox must turn every runaway into an
 * error; libFuzzer's -timeout catches what it does not). */
#include "engine.h"
#include "forward.h"
#include "fuzz_util.h"
#include "ks_lua.h"
#include "policy_lua.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The interpreter (kept in sync with tests/fuzz/make_corpus.py, which writes seed programs
 * with the same opcode and name tables). */
static const char PROGRAM[] =
    "local ks = require 'kvsieve'\n"
    "local FN = {'scores','pool1d','topk','sort','argsort','rank','unique','union','concat','arange','gather',\n"
    "  'softmax','sum','mean','var','cosine','tensor','zeros','stack','rope','report','unhook','_upload',\n"
    "  'page_reduce','bound_scores','page_rows','ge','where','add'}\n"
    "local TM = {'numel','tolist','item','slice','row','clone','float','int','reshape','size'}\n"
    "local EM = {'restart','propagate','retain','attend','stop','discard_kv','report','kv_pos','kv_keys','kv_values','release',\n"
    "  'replay'}\n"
    "local EF = {'event','layer','pass','n','n_prompt','n_heads','n_kv_heads','head_dim','dim','n_layers','token',\n"
    "  'q','k','v','k_pre','hidden','pos','ids','orig','kv_rows','nope','held_steps'}\n"
    "local K = {0, 1, 2, 3, -1, -2, 4, 5, 8, 16, 0.5, -0.0, 1.5, 1/0, -1/0, 0/0, math.maxinteger, math.mininteger,\n"
    "  2^31, 2^32, 2^53, 1e308, -1e308, 1e-40, 1000, 65536, 2147483647, 100000, 64, 7, -7, 0.25}\n"
    "local S = {'', 'ab', 'rows','qpos','kpos','scale','causal','softmax','key_range','out','reduce','gqa','threads',\n"
    "  'sorted','descending','ddof','renumber','none','sum','max','mean','avg','last','group','div','mod','index',\n"
    "  'value','rsqrt_d','sqrt_d','theta','max_pos','prefill_qkv','decode_qkv','token','x',\n"
    "  'pages','before','after','check','min','minmax','group_max','group_sum','rope','base','values','hold','skip',\n"
    "  'into','page','replay'}\n"
    "local OK = {'rows','qpos','kpos','scale','causal','softmax','key_range','out','reduce','gqa','threads','sorted',\n"
    "  'descending','ddof','renumber','theta','max_pos','bogus','pages','before','after','check','rope','base','values',\n"
    "  'hold','skip','into','page','replay'}\n"
    "local KEEP = {}\n"
    "local DBG = false\n"
    "local unpack = table.unpack\n"
    "local function run(prog, ev)\n"
    "  local pos, np = 1, #prog\n"
    "  local V, c = {}, 0 -- a ring of the last 48 values; c counts pushes\n"
    "  local function b() local x = prog:byte(pos) or 0; pos = pos + 1; return x end\n"
    "  local function push(x) c = c + 1; V[(c - 1) % 48 + 1] = x end\n"
    "  local function arg() -- 255: nil; 200..254: the k-th latest value; else any slot\n"
    "    local x, nv = b(), math.min(c, 48)\n"
    "    if x == 255 or nv == 0 then return nil end\n"
    "    if x >= 200 then local k = x - 200; if k >= nv then return nil end; return V[(c - 1 - k) % 48 + 1] end\n"
    "    return V[1 + x % nv] end\n"
    "  local function pushall(ok, ...)\n"
    "    if ok then for i = 1, select('#', ...) do push((select(i, ...))) end elseif DBG then print('  err', (...)) end end\n"
    "  local function args(n) local a = {}; for i = 1, n do a[i] = arg() end; return a, n end\n"
    "  if ev then push(ev) end\n"
    "  while pos <= np do\n"
    "    local op = b() % 16\n"
    "    if op == 0 then push(K[1 + b() % #K])\n"
    "    elseif op == 1 then push(b() - 128)\n"
    "    elseif op == 2 then push(S[1 + b() % #S])\n"
    "    elseif op == 3 then local n = b() % 6; local t = {}; for i = 1, n do t[i] = arg() end; push(t)\n"
    "    elseif op == 4 then local n = b() % 9; local t = {}; for i = 1, n do t[i] = (b() - 100) / 4 end; push(t)\n"
    "    elseif op == 5 then local r, c = b() % 4, b() % 5; local t = {}\n"
    "      for i = 1, r do local row = {}; for j = 1, c do row[j] = b() - 128 end; t[i] = row end; push(t)\n"
    "    elseif op == 6 then local n = b() % 3; local t = {}; for i = 1, n do t[OK[1 + b() % #OK]] = arg() end; push(t)\n"
    "    elseif op == 7 then local f = ks[FN[1 + b() % #FN]]; local a, n = args(b() % 6)\n"
    "      if f then pushall(pcall(f, unpack(a, 1, n))) end\n"
    "    elseif op == 8 then local r = arg(); local m = TM[1 + b() % #TM]; local a, n = args(b() % 4)\n"
    "      pushall(pcall(function() return r[m](r, unpack(a, 1, n)) end))\n"
    "    elseif op == 9 then local x, y, o = arg(), arg(), b() % 9\n"
    "      pushall(pcall(function()\n"
    "        if o == 0 then return x + y elseif o == 1 then return x - y elseif o == 2 then return x * y\n"
    "        elseif o == 3 then return x / y elseif o == 4 then return -x elseif o == 5 then return #x\n"
    "        elseif o == 6 then return tostring(x) elseif o == 7 then return x < y else return x == y end end))\n"
    "    elseif op == 10 then if ev then local m = EM[1 + b() % #EM]; local a, n = args(b() % 4)\n"
    "      pushall(pcall(function() return ev[m](ev, unpack(a, 1, n)) end)) end\n"
    "    elseif op == 11 then if ev then local f = EF[1 + b() % #EF]; pushall(pcall(function() return ev[f] end)) end\n"
    "    elseif op == 12 then KEEP[1 + b() % 4] = arg()\n"
    "    elseif op == 13 then local x = KEEP[1 + b() % 4]; if x ~= nil then push(x) end\n"
    "    elseif op == 14 then local x = arg(); pcall(function() local c <close> = x end)\n"
    "    else local f = ks[FN[1 + b() % #FN]]; local x = arg(); local n = b()\n"
    "      local a = {}; for i = 1, n do a[i] = x end\n"
    "      if f then pushall(pcall(f, unpack(a, 1, n))) end\n"
    "    end\n"
    "  end\n"
    "end\n"
    "local function hex(s) return (s:gsub('..', function(h) return string.char(tonumber(h, 16)) end)) end\n"
    "local function handler(ev, p) DBG = p.dbg; run(hex(p.prog), ev) end\n"
    "return { params = { prog = '', mode = '', dbg = false },\n"
    "  begin = function(p) KEEP = {}; if p.mode == 'begin' then run(hex(p.prog), nil) end end,\n"
    "  prefill_qkv = handler, prefill_layer_end = handler, prefill_end = handler, decode_qkv = handler, token = handler }\n";

static ks_policy *g_pol[2];  /* [0] _device = host, [1] _device = emulate */
static ks_backend *g_cpu;

static void must(ks_status st, const char *what) {
    if (st == KS_OK) return;
    fprintf(stderr, "fuzz_lua_prims: %s: %s\n", what, ks_last_error());
    abort();
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc; (void)argv;
    ks_lua_quiet = 1;
    ks_backend_opts bo = ks_backend_opts_default();
    bo.n_threads = 1;
    must(ks_cpu_backend_create(&bo, &g_cpu), "cpu backend");
    for (int i = 0; i < 2; i++) {
        must(ks_policy_load_string(NULL, "fuzz.lua", PROGRAM, &g_pol[i]), "load the interpreter policy");
        must(ks_policy_set(g_pol[i], "_device", i ? "emulate" : "host"), "_device");
        must(ks_policy_set(g_pol[i], "_memory_mb", "64"), "_memory_mb");
        must(ks_policy_set(g_pol[i], "_instructions", "5e6"), "_instructions");
        must(ks_policy_set(g_pol[i], "_seconds", "5"), "_seconds");
        must(ks_policy_set(g_pol[i], "_device_mb", "64"), "_device_mb");
        if (getenv("FUZZ_VERBOSE")) must(ks_policy_set(g_pol[i], "dbg", "true"), "dbg"); /* print each failed call */
    }
    return 0;
}

/* ---------------------------------------------------------------- synthetic events */

typedef struct fz_event {
    ks_event ev;
    ks_kv_layer kv;
    float *q, *k, *v, *hidden;
    int32_t *pos, *ids, *orig;
} fz_event;

static uint64_t g_rng;
static float rnd(void) {
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((int)(g_rng >> 40) % 2001 - 1000) / 256.0f;
}
static float *fbuf(size_t n, int special) {
    float *p = malloc(sizeof(float) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) p[i] = rnd();
    if (n && special == 1) p[g_rng % n] = NAN;
    if (n && special == 2) p[g_rng % n] = INFINITY;
    if (n && special == 3) memset(p, 0, sizeof(float) * n);
    return p;
}

static const int kHkv[8] = {1, 2, 3, 4, 8, 16, 32, 64};

/* Build an event of kind `kind` from the header bytes h[0..7]. */
static void make_event(fz_event *e, const uint8_t *h, ks_event_kind kind) {
    memset(e, 0, sizeof *e);
    ks_event *ev = &e->ev;
    int Hkv = kHkv[h[0] & 7], group = 1 + ((h[0] >> 3) & 1), hd = 1 + (h[1] & 7);
    int special = (h[1] >> 3) & 3;
    int n = kind == KS_EV_DECODE_QKV ? 1 : kind == KS_EV_TOKEN ? 0 : 1 + (h[2] & 7);
    ev->kind = kind;
    ev->n_kv_heads = Hkv;
    ev->n_heads = Hkv * group;
    ev->head_dim = hd;
    ev->dim = ev->n_heads * hd;
    ev->n_layers = 3;
    ev->layer = kind == KS_EV_PREFILL_END || kind == KS_EV_TOKEN ? -1 : (h[2] >> 3) % 3;
    ev->pass = (h[2] >> 5) & 1;
    ev->n = kind == KS_EV_TOKEN ? 0 : (kind == KS_EV_PREFILL_END ? n : n);
    ev->n_prompt = n + (h[3] & 3);
    ev->be = (h[2] >> 6) & 1 ? g_cpu : NULL;
    ev->token = (int32_t)(h[3] >> 2) - 8;
    g_rng = h[4] * 0x9e3779b97f4a7c15ull + 1;
    if (kind == KS_EV_TOKEN) return;
    e->pos = malloc(sizeof(int32_t) * n);
    e->ids = malloc(sizeof(int32_t) * n);
    e->orig = malloc(sizeof(int32_t) * n);
    for (int i = 0; i < n; i++) {
        e->pos[i] = (h[3] & 3) + i;
        e->ids[i] = (int32_t)((h[5] + 7 * i) % 50);
        e->orig[i] = i + (h[3] & 3);
    }
    if (kind != KS_EV_DECODE_QKV) {
        ev->pos = e->pos;
        ev->ids = e->ids;
        ev->orig = e->orig;
    }
    if (kind == KS_EV_PREFILL_END) return;
    /* the layer's KV rows: per head 0..7 rows (heads may differ), capacity for this step's */
    int rows0 = h[5] & 7, differ = (h[5] >> 3) & 1, extra = (h[5] >> 4) & 3;
    ks_kv_layer *kv = &e->kv;
    kv->n_kv_heads = Hkv;
    kv->head_dim = hd;
    kv->n = malloc(sizeof(int) * Hkv);
    int maxr = 0;
    for (int j = 0; j < Hkv; j++) {
        kv->n[j] = differ ? (rows0 + j) % 8 : rows0;
        if (kv->n[j] > maxr) maxr = kv->n[j];
    }
    kv->capacity = maxr + n + extra;
    kv->pos = malloc(sizeof(int32_t) * (size_t)Hkv * kv->capacity);
    for (int j = 0; j < Hkv; j++)
        for (int r = 0; r < kv->capacity; r++) kv->pos[(size_t)j * kv->capacity + r] = r * (1 + (h[6] & 1));
    kv->k = fbuf((size_t)Hkv * kv->capacity * hd, special);
    kv->v = fbuf((size_t)Hkv * kv->capacity * hd, 0);
    ev->kv = kv;
    if (kind == KS_EV_PREFILL_LAYER_END) {
        e->hidden = fbuf((size_t)n * ev->dim, special);
        ev->hidden = e->hidden;
        return;
    }
    e->q = fbuf((size_t)n * ev->n_heads * hd, special);
    e->k = fbuf((size_t)n * Hkv * hd, 0);
    e->v = fbuf((size_t)n * Hkv * hd, 0);
    ev->q = e->q;
    ev->k = e->k;
    ev->v = e->v;
    if ((h[6] >> 1) & 1) ev->k_pre = e->k;
}

static void free_event(fz_event *e) {
    /* the recorded actions as the engine frees them: device lists (ks_action_attend_dev: every
     * head's pointer into one backend buffer, shared lists the same pointer) included */
    ks_actions_free(&e->ev.act, e->ev.n_kv_heads);
    free(e->kv.n);
    free(e->kv.pos);
    free(e->kv.k);
    free(e->kv.v);
    free(e->q);
    free(e->k);
    free(e->v);
    free(e->hidden);
    free(e->pos);
    free(e->ids);
    free(e->orig);
}

/* ---------------------------------------------------------------- one input */

static char *hexify(const uint8_t *p, size_t n) {
    static const char dig[] = "0123456789abcdef";
    char *s = malloc(2 * n + 1);
    for (size_t i = 0; i < n; i++) {
        s[2 * i] = dig[p[i] >> 4];
        s[2 * i + 1] = dig[p[i] & 15];
    }
    s[2 * n] = 0;
    return s;
}

static void set_prog(ks_policy *p, const uint8_t *prog, size_t n, const char *mode) {
    char *hx = hexify(prog, n);
    ks_policy_set(p, "prog", hx);
    ks_policy_set(p, "mode", mode);
    free(hx);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 8 || size > 4096) return 0;
    const uint8_t *h = data;
    ks_policy *p = g_pol[(h[7] >> 7) & 1];
    const uint8_t *part[3];
    size_t len[3];
    int np = fz_split(data + 8, size - 8, "\xfe\xfe", part, len, 3);
    /* begin: resets the kept values; runs part 0 when there are several parts */
    set_prog(p, part[0], np > 1 ? len[0] : 0, np > 1 ? "begin" : "");
    if (p->begin) p->begin(p->ud, NULL);
    /* one or two events: kinds from the header */
    for (int i = 0; i < 2; i++) {
        const uint8_t *pr = np > 1 ? (i == 0 ? part[1] : (np > 2 ? part[2] : NULL)) : (i == 0 ? part[0] : NULL);
        size_t pl = np > 1 ? (i == 0 ? len[1] : (np > 2 ? len[2] : 0)) : (i == 0 ? len[0] : 0);
        if (!pr) break;
        ks_event_kind kind = (ks_event_kind)(((i ? h[7] >> 3 : h[7]) & 7) % KS_EV_COUNT);
        if (!p->on[kind]) continue; /* unhooked in begin */
        set_prog(p, pr, pl, "");
        fz_event e;
        make_event(&e, h, kind);
        ks_status st = p->on[kind](p->ud, &e.ev);
        if (getenv("FUZZ_VERBOSE")) fprintf(stderr, "%s: %s\n", ks_event_name(kind), st ? ks_last_error() : "ok");
        free_event(&e);
    }
    ks_clear_error();
    return 0;
}
