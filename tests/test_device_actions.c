/* test_device_actions.c — actions on index lists in backend memory (issue 14, core/policy.h
 * "Device lists"): the backend's check_idx rule on the CPU, device lists (emulated device on
 * the CPU backend) giving exactly what the same host lists give, their errors (out of range,
 * unsorted, duplicates, wrong head count, a list that fits one layer and not another), deferred
 * to the step's sync and named there, row ranges around a list (ev:attend's before / after) equal
 * to the whole list, a kept list copied once a layer, and TokenSelect's decode step without a
 * download. */
#include "engine.h"
#include "ks_lua.h"
#include "ktest.h"
#include "policy_lua.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- check_idx on the CPU */

static uint64_t key_of(int64_t at, int why, int32_t v) { return (uint64_t)at << 34 | (uint64_t)why << 32 | (uint32_t)v; }

KT_TEST(device_actions_check_idx_cpu_rule) {
    ks_backend *b;
    KT_CHECK(ks_backend_create("cpu", &b) == KS_OK, "%s", ks_last_error());
    KT_CHECK(b->check_idx != NULL, "the CPU backend has no check_idx");
    int lim[2] = {10, 6};
    uint64_t slot = 0;
    struct { int32_t x[8]; int rows, k; uint64_t want; int32_t after[8]; } c[] = {
        {{0, 3, 9, 1, 2, 5}, 2, 3, UINT64_MAX, {0, 3, 9, 1, 2, 5}},           /* valid */
        {{0, 3, 10, 1, 2, 5}, 2, 3, key_of(2, 1, 10), {0, 3, 0, 1, 2, 5}},     /* out of range (row 0: [0, 10)) */
        {{0, 3, 9, 1, 2, 6}, 2, 3, key_of(5, 1, 6), {0, 3, 9, 1, 2, 0}},       /* row 1 has 6 rows */
        {{0, 4, 3, 1, 2, 5}, 2, 3, key_of(2, 2, 3), {0, 4, 3, 1, 2, 5}},       /* unsorted */
        {{0, 4, 4, 1, 2, 5}, 2, 3, key_of(2, 3, 4), {0, 4, 4, 1, 2, 5}},       /* duplicate */
        {{-1, 4, 4, 9, 2, 5}, 2, 3, key_of(0, 1, -1), {0, 4, 4, 0, 2, 5}},     /* the first bad entry wins */
        {{0, 4, 4, 9, 2, 5}, 2, 3, key_of(2, 3, 4), {0, 4, 4, 0, 2, 5}},       /* ... in list order, all replaced */
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        KT_CHECK(b->check_idx(b, c[i].x, c[i].rows, c[i].k, lim, &slot) == KS_OK, "%s", ks_last_error());
        KT_CHECK(slot == c[i].want, "case %zu: word %llx, expected %llx", i, (unsigned long long)slot,
                 (unsigned long long)c[i].want);
        KT_CHECK(!memcmp(c[i].x, c[i].after, sizeof(int32_t) * 6), "case %zu: out-of-range entries not replaced by 0", i);
    }
    ks_backend_free(b);
}

/* ---------------------------------------------------------------- one request, its results */

typedef struct run {
    ks_status st;
    char err[1024];
    int32_t ids[16];
    int n_ids;
    int kept_n[8][2];
    int32_t kept[8][2][1200];
    float logit0, logit_last; /* the best logit before the first / the last decode step */
    long downloads_decode, allocs_decode;
} run;

/* Prefill n tokens of a fixed stream, then `steps` greedy decode steps, under policy `p` with
 * parameters "k=v,..." (and _device = mode). Downloads and device tensors made by the decode
 * steps alone go to r->downloads_decode / allocs_decode. */
/* Set the policy's parameters "k=v,..." and _device = mode. */
static ks_status set_params(ks_policy *p, const char *params, const char *mode) {
    char kv[512];
    snprintf(kv, sizeof kv, "%s", params);
    ks_status st = KS_OK;
    for (char *save = NULL, *tok = strtok_r(kv, ",", &save); !st && tok; tok = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(tok, '=');
        if (!eq) continue;
        *eq = 0;
        st = ks_policy_set(p, tok, eq + 1);
    }
    return st ? st : ks_policy_set(p, "_device", mode);
}

/* The fixed prompt stream of these tests: BOS, then n - 1 xorshift tokens of the vocabulary. */
static void fill_prompt(const ks_model *m, int32_t *prompt, int n) {
    uint64_t x = 88172645463325252ull;
    prompt[0] = m->cfg.bos;
    for (int i = 1; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        prompt[i] = 3 + (int32_t)(x % (uint64_t)(m->cfg.vocab - 3));
    }
}

static void run_policy(ks_model *m, ks_policy *p, const char *params, const char *mode, int n, int steps, run *r) {
    memset(r, 0, sizeof *r);
    ks_session *s = NULL;
    r->st = set_params(p, params, mode);
    if (!r->st) r->st = ks_session_create(m, &s);
    if (!r->st) r->st = ks_session_set_policy(s, p);
    int32_t *prompt = malloc(sizeof(int32_t) * n);
    fill_prompt(m, prompt, n);
    if (!r->st) r->st = ks_session_prefill(s, prompt, n);
    free(prompt);
    ks_lpol_devstats d0, d1;
    ks_lpol_dev_stats(p, &d0);
    for (int t = 0; !r->st && t < steps; t++) {
        const float *lg;
        int nv;
        ks_session_logits(s, &lg, &nv);
        int best = 0;
        for (int i = 1; i < nv; i++)
            if (lg[i] > lg[best]) best = i;
        if (t == 0) r->logit0 = lg[best];
        r->logit_last = lg[best];
        r->ids[r->n_ids++] = best;
        r->st = ks_session_decode(s, best);
    }
    ks_lpol_dev_stats(p, &d1);
    r->downloads_decode = d1.downloads - d0.downloads;
    r->allocs_decode = d1.allocs - d0.allocs;
    if (r->st) snprintf(r->err, sizeof r->err, "%s", ks_last_error());
    else
        for (int l = 0; l < KS_MIN(m->cfg.n_layers, 8); l++)
            for (int h = 0; h < KS_MIN(m->cfg.n_kv_heads, 2); h++) {
                const ks_kv_layer *L = &s->kv[l];
                r->kept_n[l][h] = KS_MIN(L->n[h], 1200);
                memcpy(r->kept[l][h], L->pos + (size_t)h * L->capacity, sizeof(int32_t) * r->kept_n[l][h]);
            }
    ks_session_free(s);
}

/* The policy source src loaded afresh as `name`, with how = `how`, run (run_policy: a 300-token
 * prompt) in device mode `mode` for `steps` decode steps. */
static void run_how(ks_model *m, const char *name, const char *src, const char *how, const char *mode, int steps, run *r) {
    ks_policy *p;
    ks_status st = ks_policy_load_string(m, name, src, &p);
    if (st) {
        memset(r, 0, sizeof *r);
        r->st = st;
        snprintf(r->err, sizeof r->err, "%s", ks_last_error());
        return;
    }
    char params[64];
    snprintf(params, sizeof params, "how=%s", how);
    run_policy(m, p, params, mode, 300, steps, r);
    ks_policy_free(p);
}

static int same_run(const run *a, const run *b) {
    if (a->n_ids != b->n_ids || memcmp(a->ids, b->ids, sizeof(int32_t) * a->n_ids) || a->logit0 != b->logit0 ||
        a->logit_last != b->logit_last)
        return 0;
    for (int l = 0; l < 8; l++)
        for (int h = 0; h < 2; h++)
            if (a->kept_n[l][h] != b->kept_n[l][h] || memcmp(a->kept[l][h], b->kept[l][h], sizeof(int32_t) * a->kept_n[l][h]))
                return 0;
    return 1;
}

/* ---------------------------------------------------------------- device lists == host lists */

/* Every action with a list: `how` picks the list's form (host table, unchecked device copy,
 * device list checked by construction), the same rows every time. Prefill: propagate at layer 2
 * (all but every 7th row), retain at layer 3 (per head, different sets); decode: attend at every
 * layer (per head: the first 20 rows and the last 30), retain at layer 5 (the last 200 rows). */
static const char *lists_policy =
    "local ks = require 'kvsieve'\n"
    "local function form(t, p)\n"
    "  if p.how == 'host' then return t end\n"
    "  return ks._upload(ks.tensor(t))\n"
    "end\n"
    "local function rng(a, b, p)\n" /* [a, b): a marked list in the 'checked' form */
    "  if p.how == 'checked' then local v = {} for i = 1, b - a do v[i] = 1.0 end return ks.topk(ks._upload(ks.tensor(v)), b - a) + a end\n"
    "  local t = {} for i = a, b - 1 do t[#t + 1] = i end return form(t, p)\n"
    "end\n"
    "return { name = 'lists', params = { how = 'host' },\n"
    "  prefill_layer_end = function(ev, p)\n"
    "    if ev.layer == 2 then local t = {} for i = 0, ev.n - 1 do if i % 7 ~= 3 then t[#t + 1] = i end end ev:propagate(form(t, p)) end\n"
    "    if ev.layer == 3 then\n"
    "      local n = ev.kv_rows[1]\n"
    "      local a, b = {}, {} for i = 0, n - 1 do if i % 3 ~= 1 then a[#a + 1] = i end if i % 5 ~= 2 then b[#b + 1] = i end end\n"
    "      local k = math.min(#a, #b)\n"
    "      local a2, b2 = {}, {} for i = 1, k do a2[i] = a[i] b2[i] = b[i] end\n"
    "      ev:retain(p.how == 'host' and {a2, b2} or ks._upload(ks.tensor({a2, b2})))\n"
    "    end\n"
    "  end,\n"
    "  decode_qkv = function(ev, p)\n"
    "    local n = ev.kv_rows[1]\n"
    "    if p.how == 'checked' then ev:attend(ks.concat(ks.arange(0, 20), rng(n - 30, n, p)), { renumber = true })\n"
    "    else local t = {} for i = 0, 19 do t[#t + 1] = i end for i = n - 30, n - 1 do t[#t + 1] = i end\n"
    "      ev:attend(form(t, p), { renumber = true }) end\n"
    "    if ev.layer == 5 and n > 200 then ev:retain(rng(n - 200, n, p)) end\n"
    "  end }\n";

KT_TEST(device_actions_lists_equal_host_lists) {
    ks_lua_quiet = 1;
    ks_model *m;
    KT_CHECK(ks_model_open("models/kvsieve-tiny", "cpu", &m) == KS_OK, "%s", ks_last_error());
    static run r[3];
    const char *hows[] = {"host", "unchecked", "checked"};
    for (int i = 0; i < 3; i++) {
        run_how(m, "lists", lists_policy, hows[i], i ? "emulate" : "host", 4, &r[i]);
        KT_CHECK(r[i].st == KS_OK, "%s: %s", hows[i], r[i].err);
    }
    KT_CHECK(r[0].kept_n[5][0] == 200 && r[0].kept_n[3][0] < 200, "the policy did not act (%d, %d rows)", r[0].kept_n[5][0],
             r[0].kept_n[3][0]);
    KT_CHECK(same_run(&r[0], &r[1]), "unchecked device lists differ from host lists");
    KT_CHECK(same_run(&r[0], &r[2]), "device lists checked by construction differ from host lists");
    ks_model_close(m);
}

/* ev:attend(list, {before = ..., after = ...}): rows 0..9, a middle list of 15 rows, the last 10,
 * renumbered, at every layer: as a host list with the ranges, as a device list valid by
 * construction with the ranges (the engine builds the whole list with page_rows where the backend
 * does not read ranges itself, as the CPU backend does not), and as the whole host list. */
static const char *ranges_policy =
    "local ks = require 'kvsieve'\n"
    "return { name = 'ranges', params = { how = 'whole' },\n"
    "  decode_qkv = function(ev, p)\n"
    "    local n = ev.kv_rows[1]\n"
    "    local mid = {} for i = 25, 39 do mid[#mid + 1] = i end\n"
    "    local r = { renumber = true, before = { 0, 10 }, after = { n - 10, n } }\n"
    "    if p.how == 'whole' then\n"
    "      local t = {} for i = 0, 9 do t[#t + 1] = i end for _, v in ipairs(mid) do t[#t + 1] = v end\n"
    "      for i = n - 10, n - 1 do t[#t + 1] = i end\n"
    "      ev:attend(t, { renumber = true })\n"
    "    elseif p.how == 'host' then ev:attend(mid, r)\n"
    "    else local v = {} for i = 1, 15 do v[i] = 1.0 end ev:attend(ks.topk(ks._upload(ks.tensor(v)), 15) + 25, r) end\n"
    "  end }\n";

KT_TEST(device_actions_attend_ranges_equal_whole_list) {
    ks_lua_quiet = 1;
    ks_model *m;
    KT_CHECK(ks_model_open("models/kvsieve-tiny", "cpu", &m) == KS_OK, "%s", ks_last_error());
    static run r[3];
    const char *hows[] = {"whole", "host", "device"};
    for (int i = 0; i < 3; i++) {
        run_how(m, "ranges", ranges_policy, hows[i], i == 2 ? "emulate" : "host", 4, &r[i]);
        KT_CHECK(r[i].st == KS_OK, "%s: %s", hows[i], r[i].err);
    }
    static run full;
    ks_policy *pf;
    KT_CHECK(ks_policy_load(m, "full", &pf) == KS_OK, "%s", ks_last_error());
    run_policy(m, pf, "", "host", 300, 4, &full);
    ks_policy_free(pf);
    KT_CHECK(full.st == KS_OK, "%s", full.err);
    KT_CHECK(r[0].logit_last != full.logit_last, "the whole list changed nothing (the policy did not act)");
    KT_CHECK(same_run(&r[0], &r[1]), "a host list with before / after differs from the whole list");
    KT_CHECK(same_run(&r[0], &r[2]), "a device list with before / after differs from the whole list");
    ks_model_close(m);
}

/* A device list the policy keeps and attends at every step (TokenSelect's cache hits): the engine
 * keeps its copy per layer and reuses it (one copy a layer for the whole run: ks_backend.list_gen
 * counts the copies kept), with the same results as a new equal tensor every step (a copy each
 * time), and as the host table. */
static const char *keep_policy =
    "local ks = require 'kvsieve'\n"
    "local kept = {}\n"
    "return { name = 'keep', params = { how = 'kept', at = 30 },\n"
    "  begin = function() kept = {} end,\n"
    "  decode_qkv = function(ev, p)\n"
    "    local n = ev.kv_rows[1]\n"
    "    if p.how == 'host' then local t = {} for i = p.at, p.at + 29 do t[#t + 1] = i end ev:attend(t, { renumber = true }) return end\n"
    "    local function make() local v = {} for i = 1, 30 do v[i] = 1.0 end return ks.topk(ks._upload(ks.tensor(v)), 30) + p.at end\n"
    "    local sel = p.how == 'kept' and kept[ev.layer] or make()\n"
    "    kept[ev.layer] = sel\n"
    "    ev:attend(sel, { renumber = true })\n"
    "  end }\n";

KT_TEST(device_actions_kept_list_copied_once) {
    ks_lua_quiet = 1;
    ks_model *m;
    KT_CHECK(ks_model_open("models/kvsieve-tiny", "cpu", &m) == KS_OK, "%s", ks_last_error());
    static run r[3];
    const char *hows[] = {"host", "fresh", "kept"};
    uint64_t copies[3];
    const int steps = 5, L = m->cfg.n_layers;
    for (int i = 0; i < 3; i++) {
        uint64_t g0 = m->be->list_gen;
        run_how(m, "keep", keep_policy, hows[i], i ? "emulate" : "host", steps, &r[i]);
        copies[i] = m->be->list_gen - g0;
        KT_CHECK(r[i].st == KS_OK, "%s: %s", hows[i], r[i].err);
    }
    KT_CHECK(same_run(&r[0], &r[1]) && same_run(&r[0], &r[2]), "kept, fresh and host lists give different results");
    KT_CHECK(copies[2] == (uint64_t)L, "a kept list was copied %llu times over %d steps of %d layers (once a layer expected)",
             (unsigned long long)copies[2], steps, L);
    KT_CHECK(copies[1] == (uint64_t)(L * steps), "fresh lists: %llu copies kept, expected %d", (unsigned long long)copies[1],
             L * steps);
    ks_model_close(m);
}

/* Kept lists are known by tensor ids, which are unique only within one policy's Lua state: a
 * session that changes policy must not reuse the old policy's lists. Two loads of the keep policy
 * (rows 30.. and 60..) make the same tensor ids in the same order; a session decodes 2 steps under
 * the first and 2 under the second, with device lists and with host tables: the same logits. */
static void switch_run(ks_model *m, const char *how, const char *mode, float *logit, int32_t *ids) {
    ks_policy *pa = NULL, *pb = NULL;
    ks_session *s = NULL;
    ks_status st = ks_policy_load_string(m, "keep", keep_policy, &pa);
    if (!st) st = ks_policy_load_string(m, "keep", keep_policy, &pb);
    if (!st) st = ks_policy_set(pa, "how", how);
    if (!st) st = ks_policy_set(pb, "how", how);
    if (!st) st = ks_policy_set(pb, "at", "60");
    if (!st) st = ks_policy_set(pa, "_device", mode);
    if (!st) st = ks_policy_set(pb, "_device", mode);
    if (!st) st = ks_session_create(m, &s);
    if (!st) st = ks_session_set_policy(s, pa);
    int32_t prompt[300];
    for (int i = 0; i < 300; i++) prompt[i] = 3 + (i * 7919) % (m->cfg.vocab - 3);
    if (!st) st = ks_session_prefill(s, prompt, 300);
    for (int t = 0; !st && t < 4; t++) {
        if (t == 2) st = ks_session_set_policy(s, pb);
        const float *lg;
        int nv;
        ks_session_logits(s, &lg, &nv);
        int best = 0;
        for (int i = 1; i < nv; i++)
            if (lg[i] > lg[best]) best = i;
        ids[t] = best;
        *logit = lg[best];
        if (!st) st = ks_session_decode(s, best);
    }
    if (st) *logit = NAN;
    ks_session_free(s);
    ks_policy_free(pa);
    ks_policy_free(pb);
}

KT_TEST(device_actions_kept_lists_dropped_with_the_policy) {
    ks_lua_quiet = 1;
    ks_model *m;
    KT_CHECK(ks_model_open("models/kvsieve-tiny", "cpu", &m) == KS_OK, "%s", ks_last_error());
    float lh, ld;
    int32_t ih[4], id[4];
    switch_run(m, "host", "host", &lh, ih);
    switch_run(m, "kept", "emulate", &ld, id);
    KT_CHECK(!isnan(lh) && !isnan(ld), "a run failed: %s", ks_last_error());
    KT_CHECK(lh == ld && !memcmp(ih, id, sizeof ih), "after the policy change the device lists gave %.9g, the host tables %.9g",
             (double)ld, (double)lh);
    ks_model_close(m);
}

/* ---------------------------------------------------------------- errors */

/* One decode-time action per case: the error (at the step's sync for unchecked attend lists,
 * at once for shapes and marked bounds, when applied for retain). */
static const char *bad_policy =
    "local ks = require 'kvsieve'\n"
    "local function up(t) return ks._upload(ks.tensor(t)) end\n"
    "return { name = 'bad', params = { case = '' },\n"
    "  prefill_layer_end = function(ev, p)\n"
    "    if p.case == 'layer' and ev.layer == 0 then local t = {} for i = 0, 9 do t[i + 1] = i end ev:retain(t) end\n"
    "  end,\n"
    "  decode_qkv = function(ev, p)\n"
    "    local n, c = ev.kv_rows[1], p.case\n"
    "    if ev.layer ~= 1 and c ~= 'layer' then return end\n"
    "    if c == 'range' then ev:attend(up({0, 1, n}))\n"
    "    elseif c == 'unsorted' then ev:attend(up({0, 5, 2, 7}))\n"
    "    elseif c == 'duplicate' then ev:attend(up({{0, 1, 2}, {0, 4, 4}}))\n"
    "    elseif c == 'heads' then ev:attend(up({{0}, {1}, {2}}))\n"
    "    elseif c == 'bounds' then ev:attend(ks.concat(ks.arange(0, 3), ks.topk(up({1.0, 2.0}), 1) + n))\n"
    "    elseif c == 'layer' then ev:attend(up({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}))\n"
    "    elseif c == 'retain' then ev:retain(up({3, 2}))\n"
    "    elseif c == 'empty' then ev:attend((ks.topk(up({1.0}), 0)))\n"
    "    elseif c == 'ranges_unchecked' then ev:attend(up({5, 6, 7}), { before = { 0, 2 } })\n"
    "    elseif c == 'ranges_overlap' then ev:attend(ks.topk(up({1.0, 1.0}), 2) + 5, { before = { 0, 6 } })\n"
    "    elseif c == 'ranges_past' then ev:attend(ks.topk(up({1.0, 1.0}), 2) + 5, { after = { 9, n + 1 } })\n"
    "    elseif c == 'ranges_form' then ev:attend(ks.topk(up({1.0, 1.0}), 2) + 5, { before = { 3 } })\n"
    "    elseif c == 'ranges_host_overlap' then ev:attend({ 1, 2 }, { before = { 0, 2 } })\n"
    "    elseif c == 'page_wrong' then ev:attend(ks.topk(up({1.0, 1.0}), 2), { after = { n - 3, n }, page = 8 })\n"
    "    elseif c == 'page_no_after' then ev:attend(ks.topk(up({1.0, 1.0}), 2), { page = 8 })\n"
    "    elseif c == 'page_zero' then ev:attend(ks.topk(up({1.0, 1.0}), 2), { after = { 40, n }, page = 0 })\n"
    "    elseif c == 'page_held' then ev:attend(ks.topk(up({1.0, 1.0}), 2), { after = { 40, n }, page = 8, hold = true })\n"
    "    elseif c == 'replay_zero' then ev:attend(ks.topk(up({1.0, 1.0}), 2), { replay = 0 })\n"
    "    elseif c == 'replay_retain' then ev:retain(ks.topk(up({1.0, 1.0, 1.0}), 2)) ev:replay()\n"
    "    end\n"
    "  end }\n";

KT_TEST(device_actions_errors_are_named) {
    ks_lua_quiet = 1;
    ks_model *m;
    KT_CHECK(ks_model_open("models/kvsieve-tiny", "cpu", &m) == KS_OK, "%s", ks_last_error());
    static const struct { const char *c, *want; } cases[] = {
        {"range", "attend in decode_qkv (layer 1): index 41 at position 2 out of range [0, 41)"},
        {"unsorted", "attend in decode_qkv (layer 1): unsorted index 2 at position 2 (a device list must be ascending)"},
        {"duplicate", "attend in decode_qkv (layer 1): duplicate index 4 at position 2 of KV head 1"},
        {"heads", "attend in decode_qkv (layer 1): 3 lists for 2 KV heads"},
        {"bounds", "attend in decode_qkv (layer 1): a list of 4 indices in [0, 43) does not fit the rows [0, 41)"},
        {"layer", "attend in decode_qkv (layer 0): index 11 at position 11 out of range [0, 11)"},
        {"retain", "retain in decode_qkv (layer 1): unsorted index 2 at position 1"},
        {"empty", "attend in decode_qkv: empty index list"},
        {"ranges_unchecked", "attend in decode_qkv (layer 1): before / after ranges need a list valid by construction"},
        {"ranges_overlap", "attend in decode_qkv (layer 1): rows [0, 6) ++ a list in [5, 7) ++ rows [0, 0) are not ascending"},
        {"ranges_past", "attend in decode_qkv (layer 1): rows [0, 0) ++ a list in [5, 7) ++ rows [9, 42) are not ascending "
                        "inside the 41 rows"},
        {"ranges_form", "attend: option before must be {begin, end}"},
        {"ranges_host_overlap", "attend in decode_qkv (layer 1)"},
        {"page_wrong", "attend: after = {38, 41} is not the current page of 8 rows {40, 41}"},
        {"page_no_after", "attend: page needs an after range and no hold"},
        {"page_zero", "attend: option page must be a number of rows >= 1, got 0"},
        {"page_held", "attend: page needs an after range and no hold"},
        {"replay_zero", "attend: replay must be true, false or a number of rows >= 1, got 0"},
        {"replay_retain", "replay (layer 1): only a device-list attend"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ks_policy *p;
        KT_CHECK(ks_policy_load_string(m, "bad", bad_policy, &p) == KS_OK, "%s", ks_last_error());
        char params[64];
        snprintf(params, sizeof params, "case=%s", cases[i].c);
        static run r;
        run_policy(m, p, params, "emulate", 40, 2, &r);
        ks_policy_free(p);
        KT_CHECK(r.st == KS_ERR_POLICY, "%s: status %d (%s)", cases[i].c, r.st, r.err);
        KT_CHECK(strstr(r.err, cases[i].want) != NULL, "%s: message '%s' lacks '%s'", cases[i].c, r.err, cases[i].want);
        /* unchecked attend lists fail at the step's sync, retain lists when applied (no Lua
         * traceback: the handler had returned), the others inside the handler */
        int deferred = strstr("range unsorted duplicate layer retain", cases[i].c) != NULL;
        KT_CHECK(deferred == !strstr(r.err, "traceback"), "%s: %s where %s expected: %s", cases[i].c,
                 deferred ? "a handler error" : "a deferred error", deferred ? "a deferred one" : "a handler error", r.err);
        if (deferred) KT_CHECK(!strchr(r.err, '\n'), "%s: not one line: %s", cases[i].c, r.err);
    }
    ks_model_close(m);
}

/* ---------------------------------------------------------------- TokenSelect */

/* TokenSelect's decode steps on the (emulated) device: the same ids, logits and kept rows as on
 * the host, and no download: the attend list (topk + shift + concat) stays on the device and is
 * valid by construction. With the selection cache on, the decision stays on the device too (ks.ge,
 * scores skipped, ks.where); traced, the cosine is read on the host (it is printed). */
KT_TEST(device_actions_tokenselect_decode_without_download) {
    ks_lua_quiet = 1;
    ks_model *m;
    KT_CHECK(ks_model_open("models/kvsieve-tiny", "cpu", &m) == KS_OK, "%s", ks_last_error());
    static run host, emu, cache;
    const char *params = "n_init=8,n_local=500,k=40,pool_kernel=3";
    ks_policy *p;
    KT_CHECK(ks_policy_load(m, "tokenselect", &p) == KS_OK, "%s", ks_last_error());
    run_policy(m, p, params, "host", 1100, 4, &host);
    run_policy(m, p, params, "emulate", 1100, 4, &emu);
    KT_CHECK(host.st == KS_OK && emu.st == KS_OK, "%s / %s", host.err, emu.err);
    KT_CHECK(same_run(&host, &emu), "emulated device and host differ");
    KT_CHECK(emu.allocs_decode > 0, "the decode steps made no device tensor");
    KT_CHECK(emu.downloads_decode == 0, "%ld downloads in 4 decode steps", emu.downloads_decode);
    /* the selection cache: decided on the device (no trace), nothing read in a decode step; with
     * trace the cosine is read each layer (it is printed) */
    run_policy(m, p, "cache_theta=0.5", "emulate", 1100, 4, &cache);
    KT_CHECK(cache.st == KS_OK, "%s", cache.err);
    KT_CHECK(cache.downloads_decode == 0, "%ld downloads in 4 decode steps with the cache", cache.downloads_decode);
    KT_CHECK(cache.allocs_decode > emu.allocs_decode, "the cache made no more device tensors (did it run?)");
    run_policy(m, p, "cache_theta=0.5,trace=true", "emulate", 1100, 4, &cache);
    KT_CHECK(cache.st == KS_OK, "%s", cache.err);
    KT_CHECK(cache.downloads_decode > 0, "the traced cache's cosine was not read");
    ks_policy_free(p);
    ks_model_close(m);
}

/* One generation (ks_generate_ids, token events fired) of up to 12 tokens after an n-token prompt
 * under TokenSelect with parameters "k=v,...": its ids, the cache's reports and the downloads. */
typedef struct grun {
    ks_status st;
    char err[512];
    int32_t ids[16];
    int n_ids;
    char hits[32], misses[32], sels[32];
    long downloads;
} grun;

static void gen_policy(ks_model *m, ks_policy *p, const char *params, const char *mode, const int32_t *prompt, int n, grun *r) {
    memset(r, 0, sizeof *r);
    ks_session *s = NULL;
    r->st = set_params(p, params, mode);
    if (!r->st) r->st = ks_session_create(m, &s);
    if (!r->st) r->st = ks_session_set_policy(s, p);
    ks_lpol_devstats d0, d1;
    ks_lpol_dev_stats(p, &d0);
    ks_generate_opts o;
    ks_generate_opts_default(&o);
    o.max_new_tokens = 12;
    if (!r->st) r->st = ks_generate_ids(s, prompt, n, &o, NULL, NULL);
    ks_lpol_dev_stats(p, &d1);
    r->downloads = d1.downloads - d0.downloads;
    if (r->st) snprintf(r->err, sizeof r->err, "%s", ks_last_error());
    else {
        const int32_t *ids = ks_result_ids(s, &r->n_ids);
        r->n_ids = KS_MIN(r->n_ids, 16);
        memcpy(r->ids, ids, sizeof(int32_t) * (size_t)r->n_ids);
        const char *h = ks_policy_report(p, "cache_hits"), *ms = ks_policy_report(p, "cache_misses"),
                   *sl = ks_policy_report(p, "selections");
        snprintf(r->hits, sizeof r->hits, "%s", h ? h : "-");
        snprintf(r->misses, sizeof r->misses, "%s", ms ? ms : "-");
        snprintf(r->sels, sizeof r->sels, "%s", sl ? sl : "-");
    }
    ks_session_free(s);
}

/* The selection cache decided on the device (0 < cache_theta < 1, no trace): ks.ge's mask of the
 * cosine, the scores skipped under it, ks.where keeping the cached list and fingerprint, the hits
 * counted on the device and read once a token. Against the same thresholds traced (the cosine
 * read and compared in Lua, each decision printed): the same generated ids and the same hits,
 * misses and selections, on the host and on the emulated device; 0.5 both hits and misses here,
 * and the device's run reads no more than a value a token. */
KT_TEST(device_actions_tokenselect_cache_decided_on_the_device) {
    ks_lua_quiet = 1;
    ks_model *m;
    KT_CHECK(ks_model_open("models/kvsieve-tiny", "cpu", &m) == KS_OK, "%s", ks_last_error());
    ks_policy *p;
    KT_CHECK(ks_policy_load(m, "tokenselect", &p) == KS_OK, "%s", ks_last_error());
    enum { N = 1100 };
    static int32_t prompt[N];
    fill_prompt(m, prompt, N);
    static grun nocache; /* what the rest of the request reads on the emulated device */
    gen_policy(m, p, "n_init=16,n_local=480,k=64,cache_theta=0,trace=false", "emulate", prompt, N, &nocache);
    KT_CHECK(!nocache.st, "%s", nocache.err);
    static const char *const th[] = {"0.9", "0.5"};
    for (int t = 0; t < 2; t++) {
        static grun traced, host, emu, emu_traced;
        char pt[128], pn[128];
        snprintf(pt, sizeof pt, "n_init=16,n_local=480,k=64,cache_theta=%s,trace=true", th[t]);
        snprintf(pn, sizeof pn, "n_init=16,n_local=480,k=64,cache_theta=%s,trace=false", th[t]);
        gen_policy(m, p, pt, "host", prompt, N, &traced);
        gen_policy(m, p, pn, "host", prompt, N, &host);
        gen_policy(m, p, pn, "emulate", prompt, N, &emu);
        gen_policy(m, p, pt, "emulate", prompt, N, &emu_traced);
        KT_CHECK(!traced.st && !host.st && !emu.st && !emu_traced.st, "theta %s: %s %s %s %s", th[t], traced.err, host.err,
                 emu.err, emu_traced.err);
        const grun *g[3] = {&host, &emu, &emu_traced};
        for (int i = 0; i < 3; i++) {
            KT_CHECK(g[i]->n_ids == traced.n_ids && !memcmp(g[i]->ids, traced.ids, sizeof(int32_t) * (size_t)traced.n_ids),
                     "theta %s, run %d: other ids", th[t], i);
            KT_CHECK(!strcmp(g[i]->hits, traced.hits) && !strcmp(g[i]->misses, traced.misses) && !strcmp(g[i]->sels, traced.sels),
                     "theta %s, run %d: hits %s misses %s selections %s, traced %s %s %s", th[t], i, g[i]->hits,
                     g[i]->misses, g[i]->sels, traced.hits, traced.misses, traced.sels);
        }
        const int L = m->cfg.n_layers, steps = traced.n_ids - 1;
        KT_CHECK(atoi(traced.hits) + atoi(traced.misses) == steps * L, "theta %s: %s + %s decisions for %d steps of %d layers",
                 th[t], traced.hits, traced.misses, steps, L);
        if (t == 1) KT_CHECK(atoi(traced.hits) > 0 && atoi(traced.misses) > L, "theta 0.5: hits %s, misses %s", traced.hits, traced.misses);
        KT_CHECK(emu.downloads <= nocache.downloads + traced.n_ids, "theta %s: %ld downloads for %d tokens (%ld without the cache)",
                 th[t], emu.downloads, traced.n_ids, nocache.downloads);
        KT_CHECK(emu_traced.downloads >= steps * L, "theta %s: traced, %ld downloads", th[t], emu_traced.downloads);
    }
    ks_policy_free(p);
    ks_model_close(m);
}

/* cache_theta = -1, the hit path's measurement mode: every decode step after a layer's first
 * selection reuses it without computing (or reading) the cosine. 4 steps on a 4-layer model: 4
 * misses (the first selections), 12 hits, every later step traced "hit". */
KT_TEST(device_actions_tokenselect_cache_always_hits) {
    ks_lua_quiet = 1;
    ks_model *m;
    KT_CHECK(ks_model_open("models/kvsieve-tiny", "cpu", &m) == KS_OK, "%s", ks_last_error());
    ks_policy *p;
    KT_CHECK(ks_policy_load(m, "tokenselect", &p) == KS_OK, "%s", ks_last_error());
    static run r, r9;
    run_policy(m, p, "n_init=8,n_local=500,k=40,cache_theta=-1,trace=true", "host", 1100, 4, &r);
    KT_CHECK(r.st == KS_OK, "%s", r.err);
    const int L = m->cfg.n_layers;
    const char *hits = ks_policy_report(p, "cache_hits"), *misses = ks_policy_report(p, "cache_misses");
    KT_CHECK(hits && misses, "no cache reports");
    KT_CHECK(atoi(misses) == L && atoi(hits) == 3 * L, "hits %s, misses %s (expected %d, %d)", hits, misses, 3 * L, L);
    for (int s = 1; s < 4; s++)
        for (int l = 0; l < L; l++) {
            char key[32];
            snprintf(key, sizeof key, "c%d.l%d", s, l);
            const char *v = ks_policy_report(p, key);
            KT_CHECK(v && !strcmp(v, "hit"), "%s = %s, expected hit", key, v ? v : "(none)");
        }
    /* a threshold no cosine reaches: the cosine is computed every step and never hits (traced: the
     * bare decode steps of run_policy fire no token event, where the device's decisions are counted) */
    run_policy(m, p, "n_init=8,n_local=500,k=40,cache_theta=1.5,trace=true", "host", 1100, 4, &r9);
    KT_CHECK(r9.st == KS_OK, "%s", r9.err);
    hits = ks_policy_report(p, "cache_hits");
    KT_CHECK(hits && atoi(hits) == 0, "cache_theta 1.5: %s hits", hits ? hits : "(none)");
    ks_policy_free(p);
    ks_model_close(m);
}
