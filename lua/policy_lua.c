/* policy_lua.c — Lua policies: loading, the sandbox, trampolines, the event object and its
 * actions, parameters and reports; the public ks_policy_* API (lua/policy_lua.h).
 *
 * Shape of the code
 *   - A ks_lpol embeds the ks_policy the engine sees. Its on[] slots point at one trampoline
 *     for exactly the handlers the policy table defines (the others stay NULL and cost
 *     nothing); begin clears the report and calls the Lua begin.
 *   - One choke point, lpol_protected(), runs every piece of Lua work on the policy's state:
 *     a C function under lua_pcall with a traceback handler, instruction / wall-clock budgets
 *     armed for the call, the failure classified and counted, and the message formatted as
 *     "policy NAME: WHAT: FILE:LINE: ... traceback". Nothing that can raise a Lua error runs
 *     on a policy state outside it, so no error ever longjmps across an engine frame.
 *   - Each event sets the context (ks_lctx) of the state: views handed out carry its serial
 *     and become stale when the event ends; primitives and actions name the event.
 */
#include "ks_lua.h"
#include "policy_lua.h"

#include <errno.h>
#include <lualib.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define HOOK_EVERY 1000                     /* instructions between hook calls */
#define DEFAULT_MEMORY_MB 64
#define DEFAULT_INSTRUCTIONS 100000000LL
#define DEFAULT_SECONDS 30.0
#define DEFAULT_DEVICE_MB 1024

/* Where an event's views live (the reserved parameter _device, default auto; the CLI sets it
 * from the environment variable KVSIEVE_LUA_DEVICE): */
enum {
    DEV_AUTO = 0,   /* on the engine's device when its backend has primitives (CUDA), else host */
    DEV_HOST = 1,   /* always host views (copies of device buffers): primitives run on the CPU */
    DEV_EMULATE = 2 /* like auto, and on the CPU backend the emulated device (ks_lua.h) */
};
static const char *const dev_mode_names[] = {"auto", "host", "emulate"};

static int dev_mode_parse(const char *v) {
    for (int i = 0; i < 3; i++)
        if (v && !strcasecmp(v, dev_mode_names[i])) return i;
    return -1;
}

int ks_lua_quiet = 0; /* tests: do not log failure kinds to stderr */

const char *ks_fail_kind_name(ks_fail_kind k) {
    static const char *n[] = {"none", "error", "memory", "instructions", "timeout", "return", "stale", "forbidden", "interrupted"};
    return (unsigned)k < KS_FAIL_COUNT ? n[k] : "?";
}

typedef struct lparam {
    char *name;
    int type;     /* LUA_TNUMBER, LUA_TBOOLEAN, LUA_TSTRING, LUA_TTABLE */
    int is_int;   /* number default was an integer */
} lparam;

typedef struct lreport {
    char *key, *val;
    int type;     /* LUA_TNUMBER, LUA_TBOOLEAN, LUA_TSTRING */
} lreport;

struct ks_lpol {
    ks_policy pol;             /* what the engine sees; pol.ud == this */
    char *name;
    char *chunk;               /* file path or chunk name (messages) */
    lua_State *L;              /* the state holding the handlers */
    lua_State *run_L;          /* the thread running them (inline policies: the caller's) */
    int own_state;             /* sandboxed: L is ours */
    ks_lctx ctx;               /* the context of an own state */
    int ref_fn[KS_EV_COUNT];   /* registry refs of the handlers (LUA_NOREF if none) */
    int ref_begin, ref_params, ref_module;
    lparam *params;            /* (n_params) sorted by name */
    int n_params;
    lreport *report;           /* (n_report) */
    int n_report, cap_report;
    size_t report_bytes;       /* keys and values held, counted in ctx.mem_used (own states) */
    int busy;
    long fail_count[KS_FAIL_COUNT];
    unsigned fail_logged;      /* bit per kind */
    ks_model *model;
    int dev_mode;              /* DEV_AUTO / DEV_HOST / DEV_EMULATE */
    size_t dev_limit;          /* bytes of device tensors at once (0 = unlimited): _device_mb */
};

/* ================================================================ small helpers */

static char *xstrdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = malloc(n);
    if (p) memcpy(p, s, n);
    return p;
}

ks_lpol *ks_lpol_of(ks_policy *p) {
    extern void ks_lpol_free_(void *ud);
    return p && p->free == ks_lpol_free_ ? (ks_lpol *)p->ud : NULL;
}

void ks_lpol_set_thread(ks_lpol *lp, lua_State *L) {
    if (lp && !lp->own_state) lp->run_L = L;
}

/* ================================================================ the sandbox allocator and hook */

static void *l_alloc(void *ud, void *ptr, size_t osize, size_t nsize) {
    ks_lctx *c = ud;
    size_t old = ptr ? osize : 0;
    if (nsize == 0) {
        free(ptr);
        c->mem_used -= old;
        return NULL;
    }
    if (nsize <= old) { /* shrinking never fails */
        void *p = realloc(ptr, nsize);
        if (!p) return ptr;
        c->mem_used -= old - nsize;
        return p;
    }
    if (c->mem_limit && c->mem_used + (nsize - old) > c->mem_limit) {
        c->mem_exceeded = 1;
        return NULL;
    }
    void *p = realloc(ptr, nsize);
    if (!p) return NULL;
    c->mem_used += nsize - old;
    return p;
}

static void hook_raise(lua_State *L, ks_lctx *c, ks_fail_kind kind, const char *fmt, ...) {
    char msg[256], where[300] = "";
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    c->fail_kind = kind;
    /* fire on every instruction from now on, so a pcall in the policy cannot swallow this
     * for long: the next instruction outside it raises again */
    lua_sethook(L, NULL, 0, 0);
    extern void ks_lua_count_hook(lua_State *, lua_Debug *);
    lua_sethook(L, ks_lua_count_hook, LUA_MASKCOUNT, 1);
    lua_Debug ar;
    if (lua_getstack(L, 0, &ar) && lua_getinfo(L, "Sl", &ar) && ar.currentline > 0)
        snprintf(where, sizeof where, "%s:%d: ", ar.short_src, ar.currentline);
    lua_pushfstring(L, "%s%s", where, msg);
    lua_error(L);
}

void ks_lua_count_hook(lua_State *L, lua_Debug *ar) {
    (void)ar;
    ks_lctx *c = ks_lua_ctx(L);
    if (c->interrupt && *c->interrupt) hook_raise(L, c, KS_FAIL_INTERRUPTED, "interrupted");
    if (!c->budget_active) return;
    c->instr_count += HOOK_EVERY;
    if (c->instr_limit > 0 && c->instr_count > c->instr_limit)
        hook_raise(L, c, KS_FAIL_INSTRUCTIONS, "instruction budget exceeded (%lld instructions per call; parameter _instructions)",
                   c->instr_limit);
    if (c->seconds > 0) {
        double now = ks_now();
        if (c->deadline == 0) c->deadline = now + c->seconds; /* the call's first tick */
        else if (now > c->deadline)
            hook_raise(L, c, KS_FAIL_TIMEOUT, "wall-clock budget exceeded (%.3g s per call; parameter _seconds)", c->seconds);
    }
}

static void budget_start(ks_lctx *c) {
    c->fail_kind = KS_FAIL_NONE;
    c->mem_exceeded = 0;
    if (!c->sandboxed) return;
    c->instr_count = 0;
    c->deadline = 0;
    c->budget_active = 1;
}

static void budget_stop(lua_State *L, ks_lctx *c) {
    if (!c->sandboxed) return;
    c->budget_active = 0;
    lua_sethook(L, ks_lua_count_hook, LUA_MASKCOUNT, HOOK_EVERY);
}

/* ================================================================ the protected-call choke point */

static int l_msgh(lua_State *L) {
    const char *msg = lua_tostring(L, 1);
    if (!msg) {
        if (luaL_callmeta(L, 1, "__tostring") && lua_type(L, -1) == LUA_TSTRING) msg = lua_tostring(L, -1);
        else msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
    }
    luaL_traceback(L, L, msg, 1);
    return 1;
}

static void log_failure(ks_lpol *p, ks_fail_kind k, const char *msg) {
    if ((unsigned)k >= KS_FAIL_COUNT) k = KS_FAIL_ERROR;
    p->fail_count[k]++;
    if (ks_lua_quiet || (p->fail_logged & (1u << k))) return;
    p->fail_logged |= 1u << k;
    const char *nl = strchr(msg, '\n');
    ks_logf(KS_LOG_WARN, "policy %s: first failure of kind '%s' (later ones are only counted): %.*s", p->name,
            ks_fail_kind_name(k), nl ? (int)(nl - msg) : (int)strlen(msg), msg);
}

/* Drop the "[C]: in ?" frame of the pcall'd trampoline from a traceback, in place. */
static void trim_traceback(char *s) {
    char *t;
    while ((t = strstr(s, "\n\t[C]: in ?")) != NULL) memmove(t, t + 11, strlen(t + 11) + 1);
    size_t n = strlen(s), k = strlen("\nstack traceback:");
    if (n >= k && !strcmp(s + n - k, "\nstack traceback:")) s[n - k] = 0;
}

/* Run fn(ud) on L under lua_pcall with the traceback handler and the budgets. what (and
 * layer >= 0) describe the call in messages ("prefill_qkv (layer 3)", "load", "begin"); they
 * are only formatted on failure. Returns KS_OK, or KS_ERR_POLICY / KS_ERR_INTERRUPTED with
 * "policy NAME: WHAT: MESSAGE" recorded. */
static ks_status lpol_protected(ks_lpol *p, lua_State *L, lua_CFunction fn, void *ud, const char *what, int layer) {
    if (!lua_checkstack(L, 4)) return ks_errorf(KS_ERR_POLICY, "policy %s: %s: Lua stack overflow", p->name, what);
    ks_lctx *c = ks_lua_ctx(L);
    int base = lua_gettop(L);
    lua_pushcfunction(L, l_msgh);
    lua_pushcfunction(L, fn);
    lua_pushlightuserdata(L, ud);
    budget_start(c);
    int r = lua_pcall(L, 1, 0, base + 1);
    budget_stop(L, c);
    if (r == LUA_OK) {
        lua_settop(L, base);
        return KS_OK;
    }
    ks_fail_kind kind = c->fail_kind ? c->fail_kind : KS_FAIL_ERROR;
    char msg[1800];
    if (r == LUA_ERRMEM || (c->mem_exceeded && r == LUA_ERRERR)) {
        kind = c->mem_exceeded ? KS_FAIL_MEMORY : KS_FAIL_ERROR;
        if (c->mem_exceeded)
            snprintf(msg, sizeof msg, "memory limit of %.4g MB exceeded (parameter _memory_mb)", c->mem_limit / 1048576.0);
        else snprintf(msg, sizeof msg, "out of memory");
    } else if (lua_type(L, -1) == LUA_TSTRING) {
        snprintf(msg, sizeof msg, "%s", lua_tostring(L, -1));
        trim_traceback(msg);
    } else snprintf(msg, sizeof msg, "error in the error handler");
    lua_settop(L, base);
    if (c->mem_exceeded && kind == KS_FAIL_ERROR) kind = KS_FAIL_MEMORY;
    /* reclaim what the failed call left behind (a policy cannot define finalizers) */
    if (c->sandboxed) {
        budget_start(c);
        lua_gc(L, LUA_GCCOLLECT);
        budget_stop(L, c);
    }
    c->fail_kind = KS_FAIL_NONE;
    if (p->pol.name) log_failure(p, kind, msg); /* not while loading */
    char wl[32] = "";
    if (layer >= 0) snprintf(wl, sizeof wl, " (layer %d)", layer);
    return ks_errorf(kind == KS_FAIL_INTERRUPTED ? KS_ERR_INTERRUPTED : KS_ERR_POLICY, "policy %s: %s%s: %s", p->name, what, wl, msg);
}

/* ================================================================ the event object */

#define KS_EVENT_MT "kvsieve.event"

typedef struct l_event {
    ks_lctx *ctx;
    uint64_t serial;
    ks_event *ev;
    const char *name;
    int layer;
} l_event;

static l_event *check_event(lua_State *L, int arg, const char *fn) {
    l_event *e = luaL_testudata(L, arg, KS_EVENT_MT);
    if (!e) {
        ks_lua_errorf(L, fn, "argument %d: event object expected, got %s (call it as ev:%s(...))", arg, luaL_typename(L, arg), fn);
        return NULL;
    }
    if (!(e->ctx->in_event && e->ctx->serial == e->serial)) {
        e->ctx->fail_kind = KS_FAIL_STALE;
        if (e->layer >= 0)
            ks_lua_errorf(L, fn, "event object used after its event ended (it was %s, layer %d)", e->name, e->layer);
        else ks_lua_errorf(L, fn, "event object used after its event ended (it was %s)", e->name);
    }
    return e;
}

static int is_cpu(const ks_event *ev) { return !ev->be || !strcmp(ev->be->name, "cpu"); }

/* A scoped view of engine memory: a host view (CPU backend), a device view (the event runs
 * with a device: ctx->dev), or a host copy of a device buffer staged for the event ("host"
 * device mode, or a backend without primitives). bf16: the buffer holds bf16 elements (the
 * CUDA KV cache); host: data is host memory whatever the backend (positions, ids). */
static void push_view(lua_State *L, const ks_event *ev, ks_tdtype dt, int ndim, const int64_t *shape, const int64_t *stride,
                      const void *data, int host, int bf16) {
    ks_lctx *c = ks_lua_ctx(L);
    if (host || (is_cpu(ev) && !c->dev)) {
        ks_lt_view(L, dt, ndim, shape, stride, (void *)data, 1, 0);
        return;
    }
    if (c->dev) {
        void *p = c->dev == ks_lua_emu_backend() ? ks_lua_emu_tag(data) : (void *)data;
        ks_lt_dview(L, c->dev, dt, bf16, ndim, shape, stride, p, 1, 0);
        return;
    }
    ks_backend *be = (ks_backend *)ev->be;
    if (stride || bf16) {
        /* a strided / bf16 device buffer (the KV cache): a device view read through its host
         * copy (which counts as the policy's memory), handed out as a host view of that copy */
        ks_tensor *dv = ks_lt_dview(L, be, dt, bf16, ndim, shape, stride, (void *)data, 1, 0);
        const void *h = ks_lt_host(L, dv);
        ks_lt_view(L, dt, ndim, shape, NULL, (void *)h, 1, -1);
        lua_remove(L, -2);
        return;
    }
    /* a host copy staged for the event's duration; scoped like any view */
    int64_t numel = 1;
    for (int i = 0; i < ndim; i++) numel *= shape[i];
    if (c->n_stage >= (int)(sizeof c->stage / sizeof c->stage[0]))
        ks_lua_errorf(L, "event", "too many device views in one event (at most %d)", (int)(sizeof c->stage / sizeof c->stage[0]));
    void *buf = malloc((size_t)(numel > 0 ? numel : 1) * 4);
    if (!buf) ks_lua_errorf(L, "event", "out of host memory for a %lld-element copy of a device buffer", (long long)numel);
    c->stage[c->n_stage++] = buf;
    c->dev_downloads++;
    ks_status st = be->download(be, buf, data, (size_t)numel * 4);
    if (st) ks_lua_core_error(L, "event", st);
    ks_lt_view(L, dt, ndim, shape, NULL, buf, 1, 0);
}

static int not_here(lua_State *L, const l_event *e, const char *field, const char *where) {
    return ks_lua_errorf(L, "event", "ev.%s is not available in %s (%s)", field, e->name, where);
}

static int l_ev_index(lua_State *L) {
    const char *k = luaL_checkstring(L, 2);
    /* methods: upvalue 1 */
    lua_pushvalue(L, 2);
    if (lua_rawget(L, lua_upvalueindex(1)) != LUA_TNIL) return 1;
    lua_pop(L, 1);
    l_event *e = check_event(L, 1, k);
    ks_event *ev = e->ev;
    int64_t n = ev->n, H = ev->n_heads, Hkv = ev->n_kv_heads, d = ev->head_dim;
    if (!strcmp(k, "event")) lua_pushstring(L, e->name);
    else if (!strcmp(k, "layer")) lua_pushinteger(L, ev->layer);
    else if (!strcmp(k, "pass")) lua_pushinteger(L, ev->pass);
    else if (!strcmp(k, "n")) lua_pushinteger(L, ev->n);
    else if (!strcmp(k, "n_prompt")) lua_pushinteger(L, ev->n_prompt);
    else if (!strcmp(k, "n_heads")) lua_pushinteger(L, ev->n_heads);
    else if (!strcmp(k, "n_kv_heads")) lua_pushinteger(L, ev->n_kv_heads);
    else if (!strcmp(k, "head_dim")) lua_pushinteger(L, ev->head_dim);
    else if (!strcmp(k, "dim")) lua_pushinteger(L, ev->dim);
    else if (!strcmp(k, "n_layers")) lua_pushinteger(L, ev->n_layers);
    else if (!strcmp(k, "token")) {
        if (ev->kind != KS_EV_TOKEN) return not_here(L, e, k, "only in token");
        lua_pushinteger(L, ev->token);
    } else if (!strcmp(k, "q") || !strcmp(k, "k") || !strcmp(k, "v") || !strcmp(k, "k_pre")) {
        const float *p = k[0] == 'q' ? ev->q : k[0] == 'v' ? ev->v : k[1] == '_' ? ev->k_pre : ev->k;
        if (!p) {
            if (!strcmp(k, "k_pre") && ev->q) return not_here(L, e, k, "set pre_rope_keys = true in the policy table");
            return not_here(L, e, k, "only in prefill_qkv and decode_qkv");
        }
        int64_t shape[3] = {n, k[0] == 'q' ? H : Hkv, d};
        push_view(L, ev, KS_T_F32, 3, shape, NULL, p, 0, 0);
    } else if (!strcmp(k, "hidden")) {
        if (!ev->hidden) return not_here(L, e, k, "only in prefill_layer_end");
        int64_t shape[2] = {n, ev->dim};
        push_view(L, ev, KS_T_F32, 2, shape, NULL, ev->hidden, 0, 0);
    } else if (!strcmp(k, "pos") || !strcmp(k, "ids") || !strcmp(k, "orig")) {
        const int32_t *p = k[0] == 'p' ? ev->pos : k[0] == 'i' ? ev->ids : ev->orig;
        if (!p) return not_here(L, e, k, "only in prefill events");
        push_view(L, ev, KS_T_I32, 1, &n, NULL, p, 1, 0);
    } else if (!strcmp(k, "kv_rows")) {
        if (!ev->kv) return not_here(L, e, k, "only in prefill_qkv, prefill_layer_end and decode_qkv");
        lua_createtable(L, ev->n_kv_heads, 0);
        for (int h = 0; h < ev->n_kv_heads; h++) {
            lua_pushinteger(L, ev->kv->n ? ev->kv->n[h] : 0);
            lua_rawseti(L, -2, h + 1);
        }
    } else return ks_lua_errorf(L, "event", "no field or method '%s' (fields: event, layer, pass, n, n_prompt, n_heads, "
                                            "n_kv_heads, head_dim, dim, n_layers, q, k, v, k_pre, hidden, pos, ids, orig, "
                                            "kv_rows, token)", k);
    return 1;
}

static int l_ev_newindex(lua_State *L) {
    return ks_lua_errorf(L, "event", "the event object is read-only (cannot set '%s')", luaL_tolstring(L, 2, NULL));
}

static int l_ev_tostring(lua_State *L) {
    l_event *e = luaL_checkudata(L, 1, KS_EVENT_MT);
    int live = e->ctx->in_event && e->ctx->serial == e->serial;
    if (e->layer >= 0) lua_pushfstring(L, "event(%s, layer %d%s)", e->name, e->layer, live ? "" : ", ended");
    else lua_pushfstring(L, "event(%s%s)", e->name, live ? "" : ", ended");
    return 1;
}

/* ---------------------------------------------------------------- index-list arguments */

/* One index list at arg (i32 tensor or table of integers) -> data + count; the data stays
 * valid while the pushed value (one, always) is on the stack. */
static const int32_t *index_list(lua_State *L, int arg, const char *fn, int *k) {
    ks_tensor *t = ks_lt_test(L, arg);
    if (t) {
        ks_lt_check(L, arg, fn);
        if (t->dtype != KS_T_I32)
            ks_lua_errorf(L, fn, "indices must be integers: an i32 tensor or a table of integers, got an f32 tensor (use :int())");
        if (t->ndim != 1) ks_lua_errorf(L, fn, "an index list must be 1-d, got %d dimensions", t->ndim);
        if (t->numel > INT32_MAX) ks_lua_errorf(L, fn, "an index list of %lld entries is too long", (long long)t->numel);
        int pushed;
        const int32_t *d = ks_lt_contig(L, arg, t, &pushed);
        if (!pushed) lua_pushvalue(L, arg);
        *k = (int)t->numel;
        return d;
    }
    if (!lua_istable(L, arg)) ks_lua_errorf(L, fn, "indices: an i32 tensor or a table of integers expected, got %s", luaL_typename(L, arg));
    t = ks_lt_arg(L, arg, KS_T_I32, fn);
    if (t->ndim != 1) ks_lua_errorf(L, fn, "an index list must be 1-d");
    if (t->numel > INT32_MAX) ks_lua_errorf(L, fn, "an index list of %lld entries is too long", (long long)t->numel);
    *k = (int)t->numel;
    return t->data;
}

/* Is the argument a list of per-head lists? (a table whose first entry is a table or a
 * tensor, or a 2-d i32 tensor) */
static int per_head(lua_State *L, int arg) {
    ks_tensor *t = ks_lt_test(L, arg);
    if (t) return t->ndim == 2;
    if (!lua_istable(L, arg)) return 0;
    lua_rawgeti(L, arg, 1);
    int r = lua_istable(L, -1) || ks_lt_test(L, -1);
    lua_pop(L, 1);
    return r;
}

/* Per-head lists at arg -> arrays (n_kv_heads); values are kept alive on the stack: two slots
 * per head from a table (the entry and its converted list), so the stack is grown first (a C
 * function is only guaranteed LUA_MINSTACK = 20 free slots; real models have 8 to 128 KV
 * heads). */
static void head_lists(lua_State *L, int arg, const char *fn, int Hkv, const int32_t ***idx, int **cnt) {
    if (Hkv < 0 || Hkv > 1000000 || !lua_checkstack(L, 2 * Hkv + 8))
        ks_lua_errorf(L, fn, "cannot hold index lists for %d KV heads (Lua stack)", Hkv);
    const int32_t **ix = lua_newuserdatauv(L, sizeof(*ix) * Hkv, 0);
    int *k = lua_newuserdatauv(L, sizeof(int) * Hkv, 0);
    ks_tensor *t = ks_lt_test(L, arg);
    if (t) {
        ks_lt_check(L, arg, fn);
        if (t->dtype != KS_T_I32) ks_lua_errorf(L, fn, "indices must be an i32 tensor");
        if (t->shape[0] != Hkv) ks_lua_errorf(L, fn, "%lld lists for %d KV heads", (long long)t->shape[0], Hkv);
        if (t->shape[1] > INT32_MAX) ks_lua_errorf(L, fn, "index lists of %lld entries are too long", (long long)t->shape[1]);
        int pushed;
        const int32_t *d = ks_lt_contig(L, arg, t, &pushed);
        for (int h = 0; h < Hkv; h++) {
            ix[h] = d + (size_t)h * t->shape[1];
            k[h] = (int)t->shape[1];
        }
    } else {
        size_t nl = lua_rawlen(L, arg);
        if (nl != (size_t)Hkv) ks_lua_errorf(L, fn, "%zu lists for %d KV heads", nl, Hkv);
        for (int h = 0; h < Hkv; h++) {
            lua_rawgeti(L, arg, h + 1);
            ix[h] = index_list(L, lua_gettop(L), fn, &k[h]); /* leaves the list's value pushed */
        }
    }
    *idx = ix;
    *cnt = k;
}

#define ACT(fn, call)                                                                                                \
    do {                                                                                                             \
        ks_status st_ = (call);                                                                                      \
        if (st_) return ks_lua_core_error(L, fn, st_);                                                               \
    } while (0)

static int l_ev_restart(lua_State *L) {
    l_event *e = check_event(L, 1, "restart");
    int k;
    const int32_t *idx = index_list(L, 2, "restart", &k);
    ACT("restart", ks_action_restart(e->ev, idx, k));
    return 0;
}

static int l_ev_propagate(lua_State *L) {
    l_event *e = check_event(L, 1, "propagate");
    int k;
    const int32_t *idx = index_list(L, 2, "propagate", &k);
    ACT("propagate", ks_action_propagate(e->ev, idx, k));
    return 0;
}

static int l_ev_retain(lua_State *L) {
    l_event *e = check_event(L, 1, "retain");
    if (per_head(L, 2)) {
        const int32_t **idx;
        int *cnt;
        head_lists(L, 2, "retain", e->ev->n_kv_heads, &idx, &cnt);
        ACT("retain", ks_action_retain_heads(e->ev, idx, cnt));
    } else {
        int k;
        const int32_t *idx = index_list(L, 2, "retain", &k);
        ACT("retain", ks_action_retain(e->ev, idx, k));
    }
    return 0;
}

static int l_ev_attend(lua_State *L) {
    l_event *e = check_event(L, 1, "attend");
    int renumber = 0;
    if (!lua_isnoneornil(L, 3)) {
        luaL_checktype(L, 3, LUA_TTABLE);
        lua_pushnil(L);
        while (lua_next(L, 3)) {
            lua_pop(L, 1);
            if (lua_type(L, -1) != LUA_TSTRING || strcmp(lua_tostring(L, -1), "renumber"))
                return ks_lua_errorf(L, "attend", "unknown option '%s' (options: renumber)", luaL_tolstring(L, -1, NULL));
        }
        lua_getfield(L, 3, "renumber");
        renumber = lua_toboolean(L, -1);
        lua_pop(L, 1);
    }
    if (per_head(L, 2)) {
        const int32_t **idx;
        int *cnt;
        head_lists(L, 2, "attend", e->ev->n_kv_heads, &idx, &cnt);
        ACT("attend", ks_action_attend_heads(e->ev, idx, cnt, renumber));
    } else {
        int k;
        const int32_t *idx = index_list(L, 2, "attend", &k);
        ACT("attend", ks_action_attend(e->ev, idx, k, renumber));
    }
    return 0;
}

static int l_ev_stop(lua_State *L) {
    l_event *e = check_event(L, 1, "stop");
    ACT("stop", ks_action_stop(e->ev));
    return 0;
}

/* ev:discard_kv() — prefill_qkv, pass 0, layer 0 only: this pass's KV will not be kept (the
 * policy promises a restart; the engine frees each layer's KV after its attention). */
static int l_ev_discard_kv(lua_State *L) {
    l_event *e = check_event(L, 1, "discard_kv");
    ACT("discard_kv", ks_action_discard_kv(e->ev));
    return 0;
}

static int kv_head_arg(lua_State *L, const l_event *e, int arg, const char *fn) {
    if (!e->ev->kv) ks_lua_errorf(L, fn, "the layer's KV rows are only available in prefill_qkv, prefill_layer_end and decode_qkv");
    lua_Integer h = luaL_checkinteger(L, arg);
    if (h < 0 || h >= e->ev->n_kv_heads) ks_lua_errorf(L, fn, "KV head %lld out of range [0, %d)", (long long)h, e->ev->n_kv_heads);
    return (int)h;
}

static int kv_n(const ks_kv_layer *kv, int h) { return kv->n ? kv->n[h] : 0; }

/* ev:kv_pos(h) -> i32 (rows of head h): the position of each resident KV row (in
 * prefill_qkv: the rows before this step's are appended). */
static int l_ev_kv_pos(lua_State *L) {
    l_event *e = check_event(L, 1, "kv_pos");
    int h = kv_head_arg(L, e, 2, "kv_pos");
    const ks_kv_layer *kv = e->ev->kv;
    int64_t n = kv_n(kv, h);
    push_view(L, e->ev, KS_T_I32, 1, &n, NULL, n ? kv->pos + (size_t)h * kv->capacity : NULL, 1, 0);
    return 1;
}

/* ev:kv_keys() -> (rows, n_kv_heads, head_dim) view of the cached keys (all heads must hold
 * the same number of rows); ev:kv_keys(h) -> (rows_h, 1, head_dim). kv_values likewise. On a
 * device these are device views of the cache (bf16 on CUDA: they read as f32; ks.scores takes
 * them as keys directly, other consumers get an f32 copy). */
static int kv_tensor(lua_State *L, int values) {
    const char *fn = values ? "kv_values" : "kv_keys";
    l_event *e = check_event(L, 1, fn);
    const ks_kv_layer *kv = e->ev->kv;
    if (!kv) return ks_lua_errorf(L, fn, "the layer's KV rows are only available in prefill_qkv, prefill_layer_end and decode_qkv");
    int bf16 = !is_cpu(e->ev); /* backend.h: the CUDA cache is bf16, the CPU cache float32 */
    size_t es = bf16 ? 2 : 4;
    const char *base = values ? kv->v : kv->k;
    int64_t d = e->ev->head_dim, cap = kv->capacity;
    if (!lua_isnoneornil(L, 2)) {
        int h = kv_head_arg(L, e, 2, fn);
        int64_t shape[3] = {kv_n(kv, h), 1, d}, stride[3] = {d, cap * d, 1};
        push_view(L, e->ev, KS_T_F32, 3, shape, stride, shape[0] ? base + (size_t)h * cap * d * es : NULL, 0, bf16);
        return 1;
    }
    for (int h = 1; h < e->ev->n_kv_heads; h++)
        if (kv_n(kv, h) != kv_n(kv, 0))
            return ks_lua_errorf(L, fn, "KV heads hold different row counts (%d and %d): ask per head, ev:%s(h)", kv_n(kv, 0), kv_n(kv, h), fn);
    int64_t shape[3] = {kv_n(kv, 0), e->ev->n_kv_heads, d}, stride[3] = {d, cap * d, 1};
    if (!shape[0]) base = NULL;
    push_view(L, e->ev, KS_T_F32, 3, shape, stride, base, 0, bf16);
    return 1;
}
static int l_ev_kv_keys(lua_State *L) { return kv_tensor(L, 0); }
static int l_ev_kv_values(lua_State *L) { return kv_tensor(L, 1); }

/* ---------------------------------------------------------------- reports */

/* Report copies live outside the Lua heap (they outlive calls) but are the policy's memory:
 * a sandboxed policy's keys and values count against _memory_mb like its Lua objects. */
static void report_uncharge(ks_lpol *p, size_t n) {
    if (n > p->report_bytes) n = p->report_bytes;
    p->report_bytes -= n;
    if (p->own_state) p->ctx.mem_used -= n < p->ctx.mem_used ? n : p->ctx.mem_used;
}

static void report_charge(lua_State *L, ks_lpol *p, size_t n, const char *fn) {
    if (p->own_state) {
        ks_lctx *c = &p->ctx;
        if (c->mem_limit && (n > c->mem_limit || c->mem_used > c->mem_limit - n)) {
            c->mem_exceeded = 1;
            c->fail_kind = KS_FAIL_MEMORY;
            ks_lua_errorf(L, fn, "memory limit of %.4g MB exceeded by a %zu-byte report entry (reports count as the policy's memory; "
                                 "parameter _memory_mb)", c->mem_limit / 1048576.0, n);
        }
        c->mem_used += n;
    }
    p->report_bytes += n;
}

static void report_clear(ks_lpol *p) {
    for (int i = 0; i < p->n_report; i++) {
        free(p->report[i].key);
        free(p->report[i].val);
    }
    p->n_report = 0;
    report_uncharge(p, p->report_bytes);
}

/* Store key = value (string, number, boolean; nil removes). Raises on bad arguments. */
static int do_report(lua_State *L, ks_lpol *p, int karg, const char *fn) {
    const char *key = luaL_checkstring(L, karg);
    char buf[64];
    const char *val = NULL;
    int type = lua_type(L, karg + 1);
    switch (type) {
    case LUA_TNUMBER:
        if (lua_isinteger(L, karg + 1)) snprintf(buf, sizeof buf, "%lld", (long long)lua_tointeger(L, karg + 1));
        else snprintf(buf, sizeof buf, "%.14g", lua_tonumber(L, karg + 1));
        val = buf;
        break;
    case LUA_TBOOLEAN: val = lua_toboolean(L, karg + 1) ? "true" : "false"; break;
    case LUA_TSTRING: val = lua_tostring(L, karg + 1); break;
    case LUA_TNIL: break;
    default: return ks_lua_errorf(L, fn, "value must be a string, number, boolean or nil, got %s", luaL_typename(L, karg + 1));
    }
    for (int i = 0; i < p->n_report; i++)
        if (!strcmp(p->report[i].key, key)) {
            size_t old = strlen(p->report[i].val) + 1;
            if (!val) {
                report_uncharge(p, old + strlen(p->report[i].key) + 1);
                free(p->report[i].key);
                free(p->report[i].val);
                p->report[i] = p->report[--p->n_report];
                return 0;
            }
            /* the new value replaces the old one: only a growth must fit (charged before
             * anything changes, so a refusal leaves the entry and the count as they were) */
            size_t nv = strlen(val) + 1;
            if (nv > old) report_charge(L, p, nv - old, fn);
            char *v = xstrdup(val);
            if (!v) {
                if (nv > old) report_uncharge(p, nv - old);
                return luaL_error(L, "out of memory");
            }
            if (nv < old) report_uncharge(p, old - nv);
            free(p->report[i].val);
            p->report[i].val = v;
            p->report[i].type = type;
            return 0;
        }
    if (!val) return 0;
    if (p->n_report == p->cap_report) {
        int cap = p->cap_report * 2 + 8;
        if (cap > 4096) return ks_lua_errorf(L, fn, "too many report keys (at most 4096)");
        lreport *r = realloc(p->report, sizeof *r * cap);
        if (!r) return luaL_error(L, "out of memory");
        p->report = r;
        p->cap_report = cap;
    }
    size_t nb = strlen(key) + 1 + strlen(val) + 1;
    report_charge(L, p, nb, fn);
    char *k = xstrdup(key), *v = xstrdup(val);
    if (!k || !v) { free(k); free(v); report_uncharge(p, nb); return luaL_error(L, "out of memory"); }
    p->report[p->n_report++] = (lreport){k, v, type};
    return 0;
}

static int l_ev_report(lua_State *L) {
    check_event(L, 1, "report");
    ks_lctx *c = ks_lua_ctx(L);
    return do_report(L, c->pol, 2, "report");
}

/* ks.report(key, value) from begin or a handler. */
static int l_report(lua_State *L) {
    ks_lctx *c = ks_lua_ctx(L);
    if (!c || !c->pol) return ks_lua_errorf(L, "report", "only inside a policy's begin or event handler");
    return do_report(L, c->pol, 1, "report");
}

static const char *const handler_names[KS_EV_COUNT] = {"prefill_qkv", "prefill_layer_end", "prefill_end", "decode_qkv", "token"};

/* ks.unhook(name) from begin: this request runs without the handler `name` (the engine then
 * sees no handler for that event; l_begin re-arms every handler at the next request). */
static int l_unhook(lua_State *L) {
    ks_lctx *c = ks_lua_ctx(L);
    if (!c || !c->pol || c->in_event) return ks_lua_errorf(L, "unhook", "only inside a policy's begin");
    const char *nm = luaL_checkstring(L, 1);
    for (int i = 0; i < KS_EV_COUNT; i++)
        if (!strcmp(nm, handler_names[i])) {
            c->pol->pol.on[i] = NULL;
            return 0;
        }
    return ks_lua_errorf(L, "unhook", "unknown event '%s' (events: prefill_qkv, prefill_layer_end, prefill_end, "
                                      "decode_qkv, token)", nm);
}

/* ================================================================ trampolines */

typedef struct call_args {
    ks_lpol *p;
    ks_event *ev;
    int ref;
} call_args;

/* Under pcall: handler(ev, params); the result must be nothing / nil. */
static int l_dispatch(lua_State *L) {
    call_args *a = lua_touserdata(L, 1);
    ks_lctx *c = ks_lua_ctx(L);
    lua_rawgeti(L, LUA_REGISTRYINDEX, a->ref);
    l_event *e = lua_newuserdatauv(L, sizeof *e, 0);
    e->ctx = c;
    e->serial = c->serial;
    e->ev = a->ev;
    e->name = ks_event_name(a->ev->kind);
    e->layer = a->ev->layer;
    lua_rawgeti(L, LUA_REGISTRYINDEX, c->event_mt_ref);
    lua_setmetatable(L, -2);
    lua_rawgeti(L, LUA_REGISTRYINDEX, a->p->ref_params);
    int top = lua_gettop(L) - 3;
    lua_call(L, 2, LUA_MULTRET);
    int nres = lua_gettop(L) - top;
    if (nres > 0 && !lua_isnil(L, top + 1)) {
        c->fail_kind = KS_FAIL_RETURN;
        return luaL_error(L, "invalid return value: the %s handler returned a %s (handlers return nothing and act "
                             "through ev:retain(...), ev:propagate(...), ...)",
                          e->name, luaL_typename(L, top + 1));
    }
    ks_lt_dev_settle(L); /* nothing stays on a device after its event */
    return 0;
}

static ks_status l_trampoline(void *ud, ks_event *ev) {
    ks_lpol *p = ud;
    const char *name = ks_event_name(ev->kind);
    if (p->busy) return ks_errorf(KS_ERR_POLICY, "policy %s: %s: the policy is already running (re-entered)", p->name, name);
    lua_State *L = p->run_L;
    ks_lctx *c = ks_lua_ctx(L);
    /* enter the event scope (nested scopes restore the outer one) */
    ks_lctx saved = *c;
    c->in_event = 1;
    c->serial = ++c->next_serial;
    c->event = name;
    c->layer = ev->layer;
    c->ev = ev;
    c->pol = p;
    if (ev->sess && ev->sess->interrupt) c->interrupt = ev->sess->interrupt;
    /* where the views live: on the engine's device when it has primitives (or emulated) */
    c->dev = NULL;
    if (ev->be && p->dev_mode != DEV_HOST) {
        if (ev->be->prims) c->dev = (ks_backend *)ev->be;
        else if (p->dev_mode == DEV_EMULATE && is_cpu(ev)) c->dev = ks_lua_emu_backend();
    }
    c->dev_limit = p->dev_limit;
    call_args a = {p, ev, p->ref_fn[ev->kind]};
    p->busy = 1;
    ks_status st = lpol_protected(p, L, l_dispatch, &a, name, ev->layer);
    p->busy = 0;
    ks_lt_dev_drop(L); /* after a failure: what is still on the device is freed */
    for (int i = 0; i < c->n_stage; i++) free(c->stage[i]); /* the event's device-view copies */
    c->n_stage = 0;
    c->dev = saved.dev;
    c->dev_limit = saved.dev_limit;
    c->in_event = saved.in_event;
    c->serial = saved.serial;
    c->event = saved.event;
    c->layer = saved.layer;
    c->ev = saved.ev;
    c->pol = saved.pol;
    c->interrupt = saved.interrupt;
    return st;
}

static int l_begin_call(lua_State *L) {
    call_args *a = lua_touserdata(L, 1);
    lua_rawgeti(L, LUA_REGISTRYINDEX, a->ref);
    lua_rawgeti(L, LUA_REGISTRYINDEX, a->p->ref_params);
    lua_call(L, 1, 1);
    if (!lua_isnil(L, -1)) {
        ks_lua_ctx(L)->fail_kind = KS_FAIL_RETURN;
        return luaL_error(L, "invalid return value: begin returned a %s (it should return nothing)", luaL_typename(L, -1));
    }
    return 0;
}

static ks_status l_begin(void *ud, ks_session *s) {
    ks_lpol *p = ud;
    report_clear(p);
    for (int i = 0; i < KS_EV_COUNT; i++) /* every handler on again (ks.unhook lasts one request) */
        p->pol.on[i] = p->ref_fn[i] != LUA_NOREF ? l_trampoline : NULL;
    if (p->ref_begin == LUA_NOREF) return KS_OK;
    if (p->busy) return ks_errorf(KS_ERR_POLICY, "policy %s: begin: the policy is already running (re-entered)", p->name);
    lua_State *L = p->run_L;
    ks_lctx *c = ks_lua_ctx(L);
    struct ks_lpol *saved_pol = c->pol;
    volatile sig_atomic_t *saved_int = c->interrupt;
    c->pol = p;
    if (s && s->interrupt) c->interrupt = s->interrupt;
    call_args a = {p, NULL, p->ref_begin};
    p->busy = 1;
    ks_status st = lpol_protected(p, L, l_begin_call, &a, "begin", -1);
    p->busy = 0;
    c->pol = saved_pol;
    c->interrupt = saved_int;
    return st;
}

/* ================================================================ the sandboxed standard library */

static int l_forbidden(lua_State *L) {
    ks_lctx *c = ks_lua_ctx(L);
    if (c) c->fail_kind = KS_FAIL_FORBIDDEN;
    return luaL_error(L, "%s is not allowed in a policy (sandbox)", lua_tostring(L, lua_upvalueindex(1)));
}

/* __index of the restricted library tables: any missing field is a forbidden call */
static int l_forbidden_index(lua_State *L) {
    ks_lctx *c = ks_lua_ctx(L);
    if (c) c->fail_kind = KS_FAIL_FORBIDDEN;
    return luaL_error(L, "%s.%s is not allowed in a policy (sandbox)", lua_tostring(L, lua_upvalueindex(1)), luaL_tolstring(L, 2, NULL));
}

static void set_forbidden(lua_State *L, int tbl, const char *qualified, const char *field) {
    lua_pushstring(L, qualified);
    lua_pushcclosure(L, l_forbidden, 1);
    lua_setfield(L, tbl, field);
}

/* A fresh table named `lib` whose missing fields raise; fields listed in keep are copied
 * from the table at src (0 = none). Leaves it on the stack. */
static void restricted_lib(lua_State *L, const char *lib, int src, const char *const *keep) {
    lua_newtable(L);
    int t = lua_gettop(L);
    for (int i = 0; keep && keep[i]; i++) {
        lua_getfield(L, src, keep[i]);
        lua_setfield(L, t, keep[i]);
    }
    lua_newtable(L);
    lua_pushstring(L, lib);
    lua_pushcclosure(L, l_forbidden_index, 1);
    lua_setfield(L, -2, "__index");
    lua_pushstring(L, lib);
    lua_setfield(L, -2, "__metatable");
    lua_setmetatable(L, t);
}

static int l_print(lua_State *L) {
    ks_lctx *c = ks_lua_ctx(L);
    int n = lua_gettop(L);
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    for (int i = 1; i <= n; i++) {
        if (i > 1) luaL_addchar(&b, '\t');
        luaL_tolstring(L, i, NULL);
        luaL_addvalue(&b);
    }
    luaL_pushresult(&b);
    ks_logf(KS_LOG_INFO, "[policy %s] %s", c && c->name ? c->name : "?", lua_tostring(L, -1)); /* host's log */
    return 0;
}

/* load(chunk [, chunkname [, mode [, env]]]) restricted to text chunks */
static int l_safe_load(lua_State *L) {
    int n = lua_gettop(L);
    if (n >= 3 && !lua_isnil(L, 3)) {
        const char *mode = luaL_checkstring(L, 3);
        if (strcmp(mode, "t")) {
            ks_lua_ctx(L)->fail_kind = KS_FAIL_FORBIDDEN;
            return luaL_error(L, "load: only text chunks (mode \"t\") are allowed in a policy (sandbox)");
        }
    }
    if (lua_type(L, 1) == LUA_TSTRING && lua_tostring(L, 1)[0] == LUA_SIGNATURE[0]) {
        ks_lua_ctx(L)->fail_kind = KS_FAIL_FORBIDDEN;
        return luaL_error(L, "load: binary chunks are not allowed in a policy (sandbox)");
    }
    lua_pushvalue(L, lua_upvalueindex(1)); /* the real load */
    lua_pushvalue(L, 1);
    lua_pushvalue(L, 2);
    lua_pushliteral(L, "t");
    int nargs = 3;
    if (n >= 4) { lua_pushvalue(L, 4); nargs = 4; }
    lua_call(L, nargs, LUA_MULTRET);
    return lua_gettop(L) - n;
}

static int l_safe_collectgarbage(lua_State *L) {
    static const char *const ok[] = {"collect", "count", "step", "isrunning", NULL};
    const char *opt = luaL_optstring(L, 1, "collect");
    for (int i = 0; ok[i]; i++)
        if (!strcmp(opt, ok[i])) {
            lua_pushvalue(L, lua_upvalueindex(1));
            lua_insert(L, 1);
            lua_call(L, lua_gettop(L) - 1, LUA_MULTRET);
            return lua_gettop(L);
        }
    ks_lua_ctx(L)->fail_kind = KS_FAIL_FORBIDDEN;
    return luaL_error(L, "collectgarbage(\"%s\") is not allowed in a policy (sandbox)", opt);
}

/* setmetatable without __gc: Lua runs finalizers with hooks disabled, so a finalizer could
 * loop forever out of the budget's reach (tables are the only objects a policy can give a
 * metatable; a __gc added to the metatable later never marks the object). The field is read
 * raw, as Lua's own check reads it: a plain read would run an __index of the metatable's own
 * metatable, which could add a raw __gc after answering nil. No policy code runs between
 * this check and the real setmetatable. The binding's own metatables (tensors, events,
 * restricted libraries) are protected by __metatable, so getmetatable cannot hand them out
 * to be given a __gc either; so no finalizer of a policy ever runs, also not at lua_close. */
static int l_safe_setmetatable(lua_State *L) {
    lua_settop(L, 2);
    if (lua_istable(L, 2) && (lua_pushliteral(L, "__gc"), lua_rawget(L, 2)) != LUA_TNIL) {
        ks_lua_ctx(L)->fail_kind = KS_FAIL_FORBIDDEN;
        return luaL_error(L, "setmetatable: __gc metamethods are not allowed in a policy (sandbox)");
    }
    lua_settop(L, 2);
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 1);
    lua_call(L, 2, 1);
    return 1;
}

static int l_safe_require(lua_State *L) {
    const char *name = luaL_checkstring(L, 1);
    if (!strcmp(name, "kvsieve")) {
        lua_pushvalue(L, lua_upvalueindex(1));
        return 1;
    }
    ks_lua_ctx(L)->fail_kind = KS_FAIL_FORBIDDEN;
    return luaL_error(L, "require \"%s\": only \"kvsieve\" is available to a policy (sandbox)", name);
}

static int l_traceback(lua_State *L) {
    const char *msg = luaL_optstring(L, 1, NULL);
    luaL_traceback(L, L, msg, 1);
    return 1;
}

static void push_config(lua_State *L, const ks_model *m) {
    const ks_config *c = &m->cfg;
    lua_createtable(L, 0, 12);
#define F(k, v) (lua_pushinteger(L, (v)), lua_setfield(L, -2, k))
    F("n_layers", c->n_layers);
    F("n_heads", c->n_heads);
    F("n_kv_heads", c->n_kv_heads);
    F("head_dim", c->head_dim);
    F("dim", c->dim);
    F("ffn", c->ffn);
    F("vocab", c->vocab);
    F("max_pos", c->max_pos);
    F("sliding_window", c->sliding_window);
    F("bos", c->bos);
#undef F
    lua_pushnumber(L, c->rope.theta);
    lua_setfield(L, -2, "rope_theta");
    lua_pushstring(L, c->model_type);
    lua_setfield(L, -2, "arch");
}

void ks_lua_push_config(lua_State *L, const ks_model *m) { push_config(L, m); }

static void event_mt(lua_State *L);

/* ---------------------------------------------------------------- C loops of the standard library
 *
 * The instruction hook only fires between VM instructions, so a standard-library function
 * implemented in C runs out of the budgets' reach for as long as its own loop lasts. Those
 * whose loop is bounded by memory the allocator already refused (string.format, table.pack,
 * utf8, string.byte: the stack) are left as they are; the others are wrapped:
 *   - string.rep of an empty string and an empty separator loops n times making nothing:
 *     answered at once;
 *   - pattern matching (string.find, match, gmatch, gsub) backtracks: a subject of n bytes
 *     costs up to about (n+1)^(quantifiers + 1) steps. The worst case of the pattern on that
 *     subject is bounded first (pattern_cost) and a call that could exceed MATCH_STEPS is
 *     refused with a named error;
 *   - table.insert, remove, move, concat, unpack and sort loop over lengths that __len, or a
 *     raw table's border (#t of {[1]=1, [2]=1, [4]=1, ..., [2^40]=1} is 2^40), makes as
 *     large as it likes, with __index / __newindex possibly C functions (no hook there
 *     either): they are replaced by Lua versions (sandbox_table_lua) whose loops tick the
 *     hook; concat, unpack and sort finish in the C originals on a raw copy whose length is
 *     known, and sort's comparisons run through a Lua function. */

#define MATCH_STEPS 1e9 /* worst-case matcher steps of one call (about a second of CPU) */

/* The end of the character class [...] starting at p[i] == '[' (the index after ']'), or 0
 * when it does not close (the real function then raises its own error). */
static size_t class_end(const char *p, size_t pl, size_t i) {
    i++;
    if (i < pl && p[i] == '^') i++;
    do { /* the first character after [ or [^ is always part of the set (so "[]]" works) */
        if (i >= pl) return 0;
        if (p[i++] == '%') {
            if (i >= pl) return 0;
            i++;
        }
    } while (i >= pl || p[i] != ']');
    return i + 1;
}

/* Worst-case steps of matching pattern p against a subject of n bytes, over every start
 * position: along the pattern, `mult` counts the ways the items so far can match (each *, +,
 * - multiplies it by n+1, each ? by 2) and every item costs mult times its own work (n+1 for
 * a quantified item's expansion, %b and a back-reference, 1 otherwise). Returns 0 for a
 * malformed pattern (the real function reports it). */
static double pattern_cost(const char *p, size_t pl, size_t n) {
    double N = (double)n + 1, mult = 1, per = 0;
    size_t i = 0;
    int anchored = pl > 0 && p[0] == '^';
    if (anchored) i = 1;
    while (i < pl) {
        char c = p[i];
        size_t end;
        if (c == '(' || c == ')') { per += mult; i++; continue; }
        if (c == '$' && i + 1 == pl) { per += mult; i++; continue; }
        if (c == '%') {
            if (i + 1 >= pl) return 0;
            char d = p[i + 1];
            if (d == 'b') { per += mult * N; i += 4; continue; }
            if (d == 'f') {
                if (i + 2 >= pl || p[i + 2] != '[' || !(i = class_end(p, pl, i + 2))) return 0;
                per += mult;
                continue;
            }
            if (d >= '0' && d <= '9') { per += mult * N; i += 2; continue; }
            end = i + 2;
        } else if (c == '[') {
            if (!(end = class_end(p, pl, i))) return 0;
        } else end = i + 1;
        char q = end < pl ? p[end] : 0;
        if (q == '*' || q == '+' || q == '-') { per += mult * N; mult *= N; i = end + 1; }
        else if (q == '?') { per += mult; mult *= 2; i = end + 1; }
        else { per += mult; i = end; }
        if (per > 1e300 || mult > 1e300) return 1e300;
    }
    return per * (anchored ? 1 : N);
}

/* string.find / match / gmatch / gsub: the real function (upvalue 1, its name upvalue 2) when
 * the pattern's worst case on this subject is affordable. */
static int l_safe_match(lua_State *L) {
    size_t n, pl;
    luaL_checklstring(L, 1, &n);
    const char *p = luaL_checklstring(L, 2, &pl);
    const char *name = lua_tostring(L, lua_upvalueindex(2));
    int plain = !strcmp(name, "find") && lua_toboolean(L, 4);
    double cost = plain ? ((double)n + 1) * ((double)pl + 1) : pattern_cost(p, pl, n);
    if (cost > MATCH_STEPS) {
        char msg[400];
        snprintf(msg, sizeof msg, "string.%s: the pattern \"%.40s%s\" could take up to %.3g steps on a %zu-byte subject (at most %.3g "
                                  "in a policy; sandbox): use a simpler pattern or a shorter subject",
                 name, p, pl > 40 ? "..." : "", cost, n, MATCH_STEPS);
        ks_lua_ctx(L)->fail_kind = KS_FAIL_FORBIDDEN;
        return luaL_error(L, "%s", msg);
    }
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 1);
    lua_call(L, lua_gettop(L) - 1, LUA_MULTRET);
    return lua_gettop(L);
}

/* string.rep: an empty string repeated with an empty separator is "" (the real loop would
 * spin n times making nothing); any other result is allocated before its loop runs, so the
 * memory limit bounds it. */
static int l_safe_rep(lua_State *L) {
    size_t l, ls = 0;
    luaL_checklstring(L, 1, &l);
    lua_Integer n = luaL_checkinteger(L, 2);
    if (!lua_isnoneornil(L, 3)) luaL_checklstring(L, 3, &ls);
    if (n <= 0 || l + ls == 0) {
        lua_pushliteral(L, "");
        return 1;
    }
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 1);
    lua_call(L, lua_gettop(L) - 1, 1);
    return 1;
}

/* The table library of a policy (see above): called with the C originals of concat, unpack
 * and sort; returns the replacements. */
static const char sandbox_table_lua[] =
    "local rawconcat, rawunpack, rawsort = ...\n"
    "local type, select, error, mtype, tointeger, fmt = type, select, error, math.type, math.tointeger, string.format\n"
    "local maxint = math.maxinteger\n"
    "local function tab(t, fn)\n"
    "  if type(t) ~= 'table' then error(fmt(\"bad argument #1 to '%s' (table expected, got %s)\", fn, type(t)), 3) end\n"
    "end\n"
    "local function int(v, i, fn)\n"
    "  local n = mtype(v) and tointeger(v)\n"
    "  if not n then error(fmt(\"bad argument #%d to '%s' (number has no integer representation)\", i, fn), 3) end\n"
    "  return n\n"
    "end\n"
    "local function len(t, fn)\n"
    "  local n = #t\n"
    "  if mtype(n) ~= 'integer' then error(fmt(\"object length is not an integer (in '%s')\", fn), 3) end\n"
    "  return n\n"
    "end\n"
    "local T = {}\n"
    "function T.insert(t, ...)\n"
    "  tab(t, 'insert')\n"
    "  local na, e = select('#', ...), len(t, 'insert') + 1\n"
    "  if na == 1 then t[e] = ... return end\n"
    "  if na ~= 2 then error(\"wrong number of arguments to 'insert'\", 2) end\n"
    "  local pos, v = ...\n"
    "  pos = int(pos, 2, 'insert')\n"
    "  if pos < 1 or pos > e then error(\"bad argument #2 to 'insert' (position out of bounds)\", 2) end\n"
    "  for i = e, pos + 1, -1 do t[i] = t[i - 1] end\n"
    "  t[pos] = v\n"
    "end\n"
    "function T.remove(t, pos)\n"
    "  tab(t, 'remove')\n"
    "  local size = len(t, 'remove')\n"
    "  if pos == nil then pos = size else pos = int(pos, 2, 'remove') end\n"
    "  if pos ~= size and (pos < 1 or pos > size + 1) then error(\"bad argument #2 to 'remove' (position out of bounds)\", 2) end\n"
    "  local v = t[pos]\n"
    "  while pos < size do t[pos] = t[pos + 1]; pos = pos + 1 end\n"
    "  t[pos] = nil\n"
    "  return v\n"
    "end\n"
    "function T.move(a1, f, e, t, a2)\n"
    "  tab(a1, 'move')\n"
    "  if a2 == nil then a2 = a1 else tab(a2, 'move') end\n"
    "  f, e, t = int(f, 2, 'move'), int(e, 3, 'move'), int(t, 4, 'move')\n"
    "  if e >= f then\n"
    "    if not (f > 0 or e < maxint + f) then error(\"bad argument #3 to 'move' (too many elements to move)\", 2) end\n"
    "    local n = e - f\n"
    "    if t > maxint - n then error(\"bad argument #4 to 'move' (destination wrap around)\", 2) end\n"
    "    if t > e or t <= f or a1 ~= a2 then\n"
    "      for i = 0, n do a2[t + i] = a1[f + i] end\n"
    "    else\n"
    "      for i = n, 0, -1 do a2[t + i] = a1[f + i] end\n"
    "    end\n"
    "  end\n"
    "  return a2\n"
    "end\n"
    "function T.concat(t, sep, i, j)\n"
    "  tab(t, 'concat')\n"
    "  if sep == nil then sep = '' end\n"
    "  i = i == nil and 1 or int(i, 3, 'concat')\n"
    "  j = j == nil and len(t, 'concat') or int(j, 4, 'concat')\n"
    "  local c, n = {}, 0\n"
    "  for k = i, j do\n"
    "    local v = t[k]\n"
    "    local tv = type(v)\n"
    "    if tv ~= 'string' and tv ~= 'number' then\n"
    "      error(fmt(\"invalid value (at index %d) in table for 'concat'\", k), 2)\n"
    "    end\n"
    "    n = n + 1\n"
    "    c[n] = v\n"
    "  end\n"
    "  return rawconcat(c, sep, 1, n)\n"
    "end\n"
    "function T.unpack(t, i, j)\n"
    "  i = i == nil and 1 or int(i, 2, 'unpack')\n"
    "  j = j == nil and len(t, 'unpack') or int(j, 3, 'unpack')\n"
    "  if i > j then return end\n"
    "  local n = j - i\n"
    "  if n < 0 or n >= 1000000 then error('too many results to unpack', 2) end\n"
    "  local c = {}\n"
    "  for k = 0, n do c[k + 1] = t[i + k] end\n"
    "  return rawunpack(c, 1, n + 1)\n"
    "end\n"
    "function T.sort(t, lt)\n"
    "  tab(t, 'sort')\n"
    "  local n = len(t, 'sort')\n"
    "  if n <= 1 then return end\n"
    "  if n >= 2147483647 then error(\"bad argument #1 to 'sort' (array too big)\", 2) end\n"
    "  if lt ~= nil and type(lt) ~= 'function' then\n"
    "    error(fmt(\"bad argument #2 to 'sort' (function expected, got %s)\", type(lt)), 2)\n"
    "  end\n"
    "  local c = {}\n"
    "  for k = 1, n do c[k] = t[k] end\n"
    "  local cmp = lt and function(a, b) return lt(a, b) end or function(a, b) return a < b end\n"
    "  rawsort(c, cmp)\n"
    "  for k = 1, n do t[k] = c[k] end\n"
    "end\n"
    "return T\n";

/* Install the wrappers above into the string and table libraries of a sandboxed state. */
static void sandbox_c_loops(lua_State *L) {
    lua_getglobal(L, LUA_STRLIBNAME);
    int s = lua_gettop(L);
    static const char *const match_fns[] = {"find", "match", "gmatch", "gsub", NULL};
    for (int i = 0; match_fns[i]; i++) {
        lua_getfield(L, s, match_fns[i]);
        lua_pushstring(L, match_fns[i]);
        lua_pushcclosure(L, l_safe_match, 2);
        lua_setfield(L, s, match_fns[i]);
    }
    lua_getfield(L, s, "rep");
    lua_pushcclosure(L, l_safe_rep, 1);
    lua_setfield(L, s, "rep");
    lua_pop(L, 1);
    lua_getglobal(L, LUA_TABLIBNAME);
    int t = lua_gettop(L);
    if (luaL_loadbufferx(L, sandbox_table_lua, sizeof sandbox_table_lua - 1, "=[sandbox table library]", "t") != LUA_OK) lua_error(L);
    lua_getfield(L, t, "concat");
    lua_getfield(L, t, "unpack");
    lua_getfield(L, t, "sort");
    lua_call(L, 3, 1);
    static const char *const table_fns[] = {"insert", "remove", "move", "concat", "unpack", "sort", NULL};
    for (int i = 0; table_fns[i]; i++) {
        lua_getfield(L, -1, table_fns[i]);
        lua_setfield(L, t, table_fns[i]);
    }
    lua_pop(L, 2);
}

void ks_policy_module_open(lua_State *L, int sandboxed) {
    (void)sandboxed;
    lua_pushcfunction(L, l_report);
    lua_setfield(L, -2, "report");
    lua_pushcfunction(L, l_unhook);
    lua_setfield(L, -2, "unhook");
    event_mt(L);
    ks_lctx *c = ks_lua_ctx(L);
    if (c && !c->event_mt_ref) {
        luaL_getmetatable(L, KS_EVENT_MT);
        c->event_mt_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    }
}

static void event_mt(lua_State *L) {
    if (luaL_newmetatable(L, KS_EVENT_MT)) {
        static const luaL_Reg methods[] = {{"restart", l_ev_restart}, {"propagate", l_ev_propagate}, {"retain", l_ev_retain},
                                           {"attend", l_ev_attend},   {"stop", l_ev_stop}, {"discard_kv", l_ev_discard_kv},           {"report", l_ev_report},
                                           {"kv_pos", l_ev_kv_pos},   {"kv_keys", l_ev_kv_keys},     {"kv_values", l_ev_kv_values},
                                           {NULL, NULL}};
        luaL_newlib(L, methods);
        lua_pushcclosure(L, l_ev_index, 1);
        lua_setfield(L, -2, "__index");
        lua_pushcfunction(L, l_ev_newindex);
        lua_setfield(L, -2, "__newindex");
        lua_pushcfunction(L, l_ev_tostring);
        lua_setfield(L, -2, "__tostring");
        lua_pushliteral(L, KS_EVENT_MT);
        lua_setfield(L, -2, "__metatable");
    }
    lua_pop(L, 1);
}

/* Under pcall on a fresh sandboxed state: the allowed libraries, the restricted module. */
static int l_open_sandbox(lua_State *L) {
    ks_lpol *p = lua_touserdata(L, 1);
    luaL_requiref(L, LUA_GNAME, luaopen_base, 1);
    luaL_requiref(L, LUA_STRLIBNAME, luaopen_string, 1);
    luaL_requiref(L, LUA_TABLIBNAME, luaopen_table, 1);
    luaL_requiref(L, LUA_MATHLIBNAME, luaopen_math, 1);
    luaL_requiref(L, LUA_UTF8LIBNAME, luaopen_utf8, 1);
    luaL_requiref(L, LUA_COLIBNAME, luaopen_coroutine, 1);
    luaL_requiref(L, LUA_OSLIBNAME, luaopen_os, 0);
    int os_full = lua_gettop(L);
    lua_settop(L, os_full);
    lua_pushglobaltable(L);
    int g = lua_gettop(L);
    /* os: clock, time, date, difftime */
    static const char *const os_keep[] = {"clock", "time", "date", "difftime", NULL};
    restricted_lib(L, "os", os_full, os_keep);
    lua_setfield(L, g, "os");
    restricted_lib(L, "io", 0, NULL);
    lua_setfield(L, g, "io");
    restricted_lib(L, "package", 0, NULL);
    int pk = lua_gettop(L);
    set_forbidden(L, pk, "package.loadlib", "loadlib");
    lua_setfield(L, g, "package");
    restricted_lib(L, "debug", 0, NULL);
    lua_pushcfunction(L, l_traceback);
    lua_setfield(L, -2, "traceback");
    lua_setfield(L, g, "debug");
    set_forbidden(L, g, "dofile", "dofile");
    set_forbidden(L, g, "loadfile", "loadfile");
    lua_getglobal(L, LUA_STRLIBNAME);
    set_forbidden(L, lua_gettop(L), "string.dump", "dump");
    lua_pop(L, 1);
    lua_getfield(L, g, "load");
    lua_pushcclosure(L, l_safe_load, 1);
    lua_setfield(L, g, "load");
    lua_getfield(L, g, "collectgarbage");
    lua_pushcclosure(L, l_safe_collectgarbage, 1);
    lua_setfield(L, g, "collectgarbage");
    lua_getfield(L, g, "setmetatable");
    lua_pushcclosure(L, l_safe_setmetatable, 1);
    lua_setfield(L, g, "setmetatable");
    lua_pushcfunction(L, l_print);
    lua_setfield(L, g, "print");
    sandbox_c_loops(L);
    /* the restricted kvsieve module: tensors, primitives, report, config */
    lua_newtable(L);
    int mod = lua_gettop(L);
    ks_lt_open(L);
    ks_prims_open(L);
    ks_ext_rope_open(L);
    ks_policy_module_open(L, 1);
    if (p->model) {
        push_config(L, p->model);
        lua_setfield(L, mod, "config");
    }
    lua_pushliteral(L, "kvsieve (policy sandbox)");
    lua_setfield(L, mod, "_NAME");
    lua_pushvalue(L, mod);
    p->ref_module = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_pushvalue(L, mod);
    lua_pushcclosure(L, l_safe_require, 1);
    lua_setfield(L, g, "require");
    return 0;
}

/* ================================================================ loading */


static int cmp_param(const void *a, const void *b) { return strcmp(((const lparam *)a)->name, ((const lparam *)b)->name); }

static void params_free(ks_lpol *p) {
    for (int i = 0; i < p->n_params; i++) free(p->params[i].name);
    free(p->params);
    p->params = NULL;
    p->n_params = 0;
}

static const char *allowed_keys =
    "name, description, paper, params, pre_rope_keys, begin, prefill_qkv, prefill_layer_end, prefill_end, decode_qkv, token";

/* Validate the policy table at idx and take what the engine needs: handlers, params, name.
 * Raises on errors (runs under pcall). */
static void take_policy_table(lua_State *L, int idx, ks_lpol *p) {
    idx = lua_absindex(L, idx);
    /* name first, so later messages can use it */
    if (lua_getfield(L, idx, "name") != LUA_TNIL) {
        if (!lua_isstring(L, -1) || lua_type(L, -1) != LUA_TSTRING) luaL_error(L, "name must be a string");
        char *nm = xstrdup(lua_tostring(L, -1));
        if (!nm) luaL_error(L, "out of memory");
        free(p->name);
        p->name = nm;
        if (p->own_state) p->ctx.name = p->name;
    }
    lua_pop(L, 1);
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        if (lua_type(L, -2) != LUA_TSTRING) luaL_error(L, "the policy table has a non-string key (%s)", luaL_typename(L, -2));
        const char *k = lua_tostring(L, -2);
        int ok = k[0] == '_';
        static const char *const plain[] = {"name", "description", "paper", "params", "pre_rope_keys", "prefill_chunk", NULL};
        for (int i = 0; !ok && plain[i]; i++) ok = !strcmp(k, plain[i]);
        if (!ok && !strcmp(k, "begin")) ok = 1;
        for (int i = 0; !ok && i < KS_EV_COUNT; i++) ok = !strcmp(k, handler_names[i]);
        if (!ok) {
            if (lua_isfunction(L, -1)) luaL_error(L, "unknown handler '%s' (handlers: begin, prefill_qkv, prefill_layer_end, prefill_end, decode_qkv, token)", k);
            luaL_error(L, "unknown key '%s' in the policy table (keys: %s; private keys start with '_')", k, allowed_keys);
        }
        lua_pop(L, 1);
    }
    if (lua_getfield(L, idx, "description") > LUA_TNIL && lua_type(L, -1) != LUA_TSTRING)
        luaL_error(L, "description must be a string");
    lua_pop(L, 1);
    if (lua_getfield(L, idx, "pre_rope_keys") != LUA_TNIL) {
        if (!lua_isboolean(L, -1)) luaL_error(L, "pre_rope_keys must be a boolean");
        p->pol.want_pre_rope_keys = lua_toboolean(L, -1);
    }
    lua_pop(L, 1);
    if (lua_getfield(L, idx, "prefill_chunk") != LUA_TNIL) {
        lua_Integer c = lua_tointeger(L, -1);
        if (!lua_isinteger(L, -1) || c < 0 || c > INT32_MAX) luaL_error(L, "prefill_chunk must be a non-negative integer (0 = no chunks)");
        p->pol.prefill_chunk = (int)c;
    }
    lua_pop(L, 1);
    /* handlers */
    for (int i = 0; i < KS_EV_COUNT; i++) {
        int t = lua_getfield(L, idx, handler_names[i]);
        if (t == LUA_TNIL) { lua_pop(L, 1); continue; }
        if (t != LUA_TFUNCTION) luaL_error(L, "%s must be a function, got %s", handler_names[i], luaL_typename(L, -1));
        p->ref_fn[i] = luaL_ref(L, LUA_REGISTRYINDEX);
        p->pol.on[i] = l_trampoline;
    }
    int t = lua_getfield(L, idx, "begin");
    if (t == LUA_TFUNCTION) p->ref_begin = luaL_ref(L, LUA_REGISTRYINDEX);
    else if (t != LUA_TNIL) luaL_error(L, "begin must be a function, got %s", luaL_typename(L, -1));
    else lua_pop(L, 1);
    /* params: a copy of the defaults is the live table handed to handlers */
    lua_newtable(L);
    int live = lua_gettop(L);
    t = lua_getfield(L, idx, "params");
    if (t != LUA_TNIL && t != LUA_TTABLE) luaL_error(L, "params must be a table, got %s", luaL_typename(L, -1));
    if (t == LUA_TTABLE) {
        int pt = lua_gettop(L);
        int n = 0;
        lua_pushnil(L);
        while (lua_next(L, pt)) { n++; lua_pop(L, 1); }
        p->params = calloc(n ? n : 1, sizeof *p->params);
        if (!p->params) luaL_error(L, "out of memory");
        lua_pushnil(L);
        while (lua_next(L, pt)) {
            if (lua_type(L, -2) != LUA_TSTRING) luaL_error(L, "params keys must be strings");
            const char *k = lua_tostring(L, -2);
            if (k[0] == '_') luaL_error(L, "parameter names starting with '_' are reserved (%s)", k);
            int vt = lua_type(L, -1);
            if (vt != LUA_TNUMBER && vt != LUA_TBOOLEAN && vt != LUA_TSTRING && vt != LUA_TTABLE)
                luaL_error(L, "parameter %s has a %s default (number, boolean, string or table)", k, luaL_typename(L, -1));
            lparam *pp = &p->params[p->n_params];
            pp->name = xstrdup(k);
            if (!pp->name) luaL_error(L, "out of memory");
            pp->type = vt;
            pp->is_int = vt == LUA_TNUMBER && lua_isinteger(L, -1);
            p->n_params++;
            lua_pushvalue(L, -2);
            lua_insert(L, -2);
            lua_settable(L, live);
        }
        qsort(p->params, p->n_params, sizeof *p->params, cmp_param);
    }
    lua_pop(L, 1);
    p->ref_params = luaL_ref(L, LUA_REGISTRYINDEX);
}

typedef struct load_args {
    ks_lpol *p;
    const char *src;
    size_t len;
    const char *chunkname;
} load_args;

static int l_load_chunk(lua_State *L) {
    load_args *a = lua_touserdata(L, 1);
    int r = luaL_loadbufferx(L, a->src, a->len, a->chunkname, "t");
    if (r != LUA_OK) return lua_error(L);
    lua_call(L, 0, 1);
    if (!lua_istable(L, -1))
        return luaL_error(L, "the file must return a table of handlers and params, got %s", luaL_typename(L, -1));
    take_policy_table(L, -1, a->p);
    return 0;
}

void ks_lpol_free_(void *ud) {
    ks_lpol *p = ud;
    if (!p) return;
    if (p->L && p->own_state) {
        /* finalizers run under a budget so a hostile __gc cannot hang the close */
        p->ctx.budget_active = 1;
        p->ctx.instr_count = 0;
        p->ctx.instr_limit = p->ctx.instr_limit > 0 && p->ctx.instr_limit < 10000000 ? p->ctx.instr_limit : 10000000;
        p->ctx.seconds = 2;
        p->ctx.deadline = ks_now() + 2;
        lua_close(p->L);
    } else if (p->L) {
        for (int i = 0; i < KS_EV_COUNT; i++) luaL_unref(p->L, LUA_REGISTRYINDEX, p->ref_fn[i]);
        luaL_unref(p->L, LUA_REGISTRYINDEX, p->ref_begin);
        luaL_unref(p->L, LUA_REGISTRYINDEX, p->ref_params);
    }
    report_clear(p);
    free(p->report);
    params_free(p);
    free(p->name);
    free(p->chunk);
    free(p);
}

static ks_lpol *lpol_new(const char *chunk) {
    ks_lpol *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->chunk = xstrdup(chunk);
    /* default name: the file name without folders and .lua */
    const char *b = strrchr(chunk, '/');
    b = b ? b + 1 : chunk;
    p->name = xstrdup(b);
    if (!p->chunk || !p->name) { free(p->chunk); free(p->name); free(p); return NULL; }
    size_t nl = strlen(p->name);
    if (nl > 4 && !strcmp(p->name + nl - 4, ".lua")) p->name[nl - 4] = 0;
    for (int i = 0; i < KS_EV_COUNT; i++) p->ref_fn[i] = LUA_NOREF;
    p->ref_begin = p->ref_params = p->ref_module = LUA_NOREF;
    p->dev_mode = DEV_AUTO;
    p->dev_limit = (size_t)DEFAULT_DEVICE_MB << 20;
    p->pol.ud = p;
    p->pol.free = ks_lpol_free_;
    p->pol.begin = l_begin;
    return p;
}

ks_status ks_policy_load_string(ks_model *m, const char *chunkname, const char *source, ks_policy **out) {
    *out = NULL;
    if (!source) return ks_errorf(KS_ERR_ARG, "ks_policy_load_string: no source");
    if (!chunkname) chunkname = "policy";
    ks_lpol *p = lpol_new(chunkname);
    if (!p) return ks_errorf(KS_ERR_OOM, "out of memory loading policy %s", chunkname);
    p->model = m;
    p->own_state = 1;
    p->ctx.sandboxed = 1;
    p->ctx.name = p->name;
    p->ctx.mem_limit = (size_t)DEFAULT_MEMORY_MB << 20;
    p->ctx.instr_limit = DEFAULT_INSTRUCTIONS;
    p->ctx.seconds = DEFAULT_SECONDS;
    p->ctx.layer = -1;
    p->L = lua_newstate(l_alloc, &p->ctx);
    if (!p->L) { ks_lpol_free_(p); return ks_errorf(KS_ERR_OOM, "policy %s: cannot create a Lua state", chunkname); }
    ks_lua_set_ctx(p->L, &p->ctx);
    p->run_L = p->L;
    lua_sethook(p->L, ks_lua_count_hook, LUA_MASKCOUNT, HOOK_EVERY);
    p->ctx.interrupt = ks_lua_get_interrupt();
    ks_status st = lpol_protected(p, p->L, l_open_sandbox, p, "setup", -1);
    if (!st) {
        char cn[1024];
        snprintf(cn, sizeof cn, "@%s", chunkname);
        load_args a = {p, source, strlen(source), cn};
        st = lpol_protected(p, p->L, l_load_chunk, &a, "load", -1);
    }
    if (st) {
        /* a load failure is not a runtime failure of the policy: do not keep counts */
        ks_lpol_free_(p);
        return st;
    }
    memset(p->fail_count, 0, sizeof p->fail_count);
    p->fail_logged = 0;
    p->pol.name = p->name;
    *out = &p->pol;
    return KS_OK;
}

/* ---------------------------------------------------------------- finding a policy file */

static int file_exists(const char *path) { return access(path, R_OK) == 0; }

static int is_path(const char *s) {
    size_t n = strlen(s);
    return strchr(s, '/') || (n > 4 && !strcmp(s + n - 4, ".lua"));
}

ks_status ks_policy_load(ks_model *m, const char *name_or_path, ks_policy **out) {
    return ks_policy_load_path(m, name_or_path, NULL, out);
}

ks_status ks_policy_load_path(ks_model *m, const char *name_or_path, const char *search_path, ks_policy **out) {
    *out = NULL;
    if (!name_or_path || !*name_or_path) return ks_errorf(KS_ERR_ARG, "ks_policy_load: no policy name");
    char path[4096] = "", searched[2048] = "";
    if (is_path(name_or_path)) {
        snprintf(path, sizeof path, "%s", name_or_path);
        if (!file_exists(path)) return ks_errorf(KS_ERR_IO, "policy file %s: %s", path, strerror(errno));
    } else {
        const char *dirs[64];
        int nd = 0;
        char envbuf[2048] = "", exedir[2048] = "";
        if (search_path) {
            snprintf(envbuf, sizeof envbuf, "%s", search_path);
            for (char *s = envbuf, *tok; nd < 60 && (tok = strsep(&s, ":")) != NULL;)
                if (*tok) dirs[nd++] = tok;
        }
        dirs[nd++] = "policies";
        ssize_t r = readlink("/proc/self/exe", exedir, sizeof exedir - 16);
        if (r > 0) {
            exedir[r] = 0;
            char *sl = strrchr(exedir, '/');
            if (sl) {
                strcpy(sl, "/../policies");
                dirs[nd++] = exedir;
            }
        }
        for (int i = 0; i < nd && !path[0]; i++) {
            char cand[4096];
            snprintf(cand, sizeof cand, "%s/%s.lua", dirs[i], name_or_path);
            if (file_exists(cand)) snprintf(path, sizeof path, "%s", cand);
            else {
                size_t sl = strlen(searched);
                snprintf(searched + sl, sizeof searched - sl, "%s%s", sl ? ", " : "", dirs[i]);
            }
        }
        if (!path[0])
            return ks_errorf(KS_ERR_IO, "no policy named \"%s\" (looked for %s.lua in: %s; give a search path or a file path)",
                             name_or_path, name_or_path, searched);
    }
    char *src;
    size_t len;
    ks_status st = ks_read_file(path, &src, &len);
    if (st) return st;
    if (strlen(src) != len) { free(src); return ks_errorf(KS_ERR_FORMAT, "policy file %s: contains a NUL byte", path); }
    st = ks_policy_load_string(m, path, src, out);
    free(src);
    return st;
}

/* ---------------------------------------------------------------- inline policies */

ks_policy *ks_lpol_inline_new(lua_State *L) {
    ks_lpol *p = lpol_new("inline");
    if (!p) return NULL;
    lua_rawgeti(L, LUA_REGISTRYINDEX, LUA_RIDX_MAINTHREAD);
    p->L = lua_tothread(L, -1);
    lua_pop(L, 1);
    p->run_L = L;
    p->own_state = 0;
    p->pol.name = p->name;
    return &p->pol;
}

static int l_inline_take(lua_State *L) {
    ks_lpol *p = lua_touserdata(L, 2);
    take_policy_table(L, 1, p);
    return 0;
}

void ks_lpol_inline_take(lua_State *L, int idx, ks_policy *pol) {
    ks_lpol *p = ks_lpol_of(pol);
    idx = lua_absindex(L, idx);
    lua_pushcfunction(L, l_inline_take);
    lua_pushvalue(L, idx);
    lua_pushlightuserdata(L, p);
    if (lua_pcall(L, 2, 0, 0) != LUA_OK) {
        const char *m = lua_tostring(L, -1);
        luaL_error(L, "policy %s: %s", p->name, m ? m : "invalid policy table");
    }
    p->pol.name = p->name;
}

/* ================================================================ parameters */

static ks_lpol *need_lpol(const ks_policy *pol, const char *fn) {
    ks_lpol *p = ks_lpol_of((ks_policy *)pol);
    if (!p) ks_errorf(KS_ERR_ARG, "%s: policy %s is a C policy (no parameters)", fn, pol && pol->name ? pol->name : "?");
    return p;
}

static const lparam *find_param(const ks_lpol *p, const char *key) {
    for (int i = 0; i < p->n_params; i++)
        if (!strcmp(p->params[i].name, key)) return &p->params[i];
    return NULL;
}

static ks_status unknown_param(const ks_lpol *p, const char *key) {
    char list[1024] = "";
    for (int i = 0; i < p->n_params; i++) {
        size_t l = strlen(list);
        snprintf(list + l, sizeof list - l, "%s%s", i ? ", " : "", p->params[i].name);
    }
    return ks_errorf(KS_ERR_ARG, "policy %s: unknown parameter '%s' (parameters: %s%s_memory_mb, _instructions, _seconds, _device, _device_mb)",
                     p->name, key, list, p->n_params ? "; limits: " : "limits: ");
}

static int parse_bool(const char *v, int *out) {
    static const char *const t[] = {"true", "1", "yes", "on"}, *const f[] = {"false", "0", "no", "off"};
    for (int i = 0; i < 4; i++) {
        if (!strcasecmp(v, t[i])) { *out = 1; return 1; }
        if (!strcasecmp(v, f[i])) { *out = 0; return 1; }
    }
    return 0;
}

typedef struct set_args {
    ks_lpol *p;
    const char *key;
    int type;          /* what to push */
    long long i;
    double d;
    int b;
    const char *s;
    char *out;         /* get: destination */
    size_t n;
} set_args;

static int l_set_param(lua_State *L) {
    set_args *a = lua_touserdata(L, 1);
    lua_rawgeti(L, LUA_REGISTRYINDEX, a->p->ref_params);
    if (a->type == 'i') lua_pushinteger(L, a->i);
    else if (a->type == 'd') lua_pushnumber(L, a->d);
    else if (a->type == 'b') lua_pushboolean(L, a->b);
    else lua_pushstring(L, a->s);
    lua_setfield(L, -2, a->key);
    return 0;
}

/* A reserved limit's value: a finite number in [0, max] (a cast of anything larger to an
 * integer type is undefined: `_instructions=1e300` used to turn the budget off). */
static ks_status parse_limit(const ks_lpol *p, const char *key, const char *value, double max, double *out) {
    char *end;
    errno = 0;
    double v = strtod(value, &end);
    if (end == value || *end || errno || !(v >= 0) || !isfinite(v))
        return ks_errorf(KS_ERR_ARG, "policy %s: %s expects a non-negative number, got \"%s\"", p->name, key, value);
    if (v > max) return ks_errorf(KS_ERR_ARG, "policy %s: %s = %s is out of range (at most %.17g; 0 = unlimited)", p->name, key, value, max);
    *out = v;
    return KS_OK;
}

#define MAX_LIMIT_MB 1e12         /* _memory_mb, _device_mb: 1e12 MB * 2^20 < 2^63 bytes */
#define MAX_INSTRUCTIONS 1e18     /* < LLONG_MAX */
#define MAX_SECONDS 1e9

ks_status ks_policy_set(ks_policy *pol, const char *key, const char *value) {
    ks_lpol *p = need_lpol(pol, "ks_policy_set");
    if (!p) return KS_ERR_ARG;
    if (!key || !value) return ks_errorf(KS_ERR_ARG, "ks_policy_set: NULL key or value");
    char *end;
    if (!strcmp(key, "_device")) {
        int m = dev_mode_parse(value);
        if (m < 0) return ks_errorf(KS_ERR_ARG, "policy %s: _device expects auto, host or emulate, got \"%s\"", p->name, value);
        if (p->busy) return ks_errorf(KS_ERR_ARG, "policy %s: cannot set parameters while it runs", p->name);
        p->dev_mode = m;
        return KS_OK;
    }
    if (!strcmp(key, "_device_mb")) {
        double v;
        ks_status st = parse_limit(p, key, value, MAX_LIMIT_MB, &v);
        if (st) return st;
        p->dev_limit = (size_t)(v * 1048576.0);
        return KS_OK;
    }
    if (key[0] == '_') {
        if (!p->own_state) return ks_errorf(KS_ERR_ARG, "policy %s: limits apply only to sandboxed policies (loaded from a file)", p->name);
        double v;
        int known = !strcmp(key, "_memory_mb") || !strcmp(key, "_instructions") || !strcmp(key, "_seconds");
        if (!known) return unknown_param(p, key);
        ks_status st = parse_limit(p, key, value, !strcmp(key, "_memory_mb") ? MAX_LIMIT_MB : !strcmp(key, "_instructions") ? MAX_INSTRUCTIONS : MAX_SECONDS, &v);
        if (st) return st;
        if (!strcmp(key, "_memory_mb")) {
            if (v > 0 && v * 1048576.0 < (double)p->ctx.mem_used)
                return ks_errorf(KS_ERR_ARG, "policy %s: _memory_mb = %g is below what the policy uses now (%.1f MB)", p->name, v,
                                 p->ctx.mem_used / 1048576.0);
            p->ctx.mem_limit = (size_t)(v * 1048576.0);
        } else if (!strcmp(key, "_instructions")) p->ctx.instr_limit = (long long)v;
        else if (!strcmp(key, "_seconds")) p->ctx.seconds = v;
        else return unknown_param(p, key);
        return KS_OK;
    }
    const lparam *pp = find_param(p, key);
    if (!pp) return unknown_param(p, key);
    set_args a = {.p = p, .key = pp->name};
    switch (pp->type) {
    case LUA_TNUMBER:
        errno = 0;
        if (pp->is_int) {
            long long v = strtoll(value, &end, 10);
            if (end != value && !*end && !errno) { a.type = 'i'; a.i = v; break; }
            errno = 0;
            double d = strtod(value, &end); /* "1e3" is an integer too: when it is one, in range */
            if (end != value && !*end && !errno && d >= -0x1p63 && d < 0x1p63 && d == (double)(long long)d) {
                a.type = 'i';
                a.i = (long long)d;
                break;
            }
            if (end != value && !*end && d == d && (errno == ERANGE || !(d >= -0x1p63 && d < 0x1p63)))
                return ks_errorf(KS_ERR_ARG, "policy %s: parameter %s = %s is out of the integer range", p->name, key, value);
            return ks_errorf(KS_ERR_ARG, "policy %s: parameter %s expects an integer, got \"%s\"", p->name, key, value);
        }
        a.d = strtod(value, &end);
        if (end == value || *end || errno) return ks_errorf(KS_ERR_ARG, "policy %s: parameter %s expects a number, got \"%s\"", p->name, key, value);
        a.type = 'd';
        break;
    case LUA_TBOOLEAN:
        if (!parse_bool(value, &a.b))
            return ks_errorf(KS_ERR_ARG, "policy %s: parameter %s expects true or false, got \"%s\"", p->name, key, value);
        a.type = 'b';
        break;
    case LUA_TSTRING: a.type = 's'; a.s = value; break;
    default: return ks_errorf(KS_ERR_ARG, "policy %s: parameter %s is a table; set it from Lua (p.%s = ...)", p->name, key, key);
    }
    if (p->busy) return ks_errorf(KS_ERR_ARG, "policy %s: cannot set parameters while it runs", p->name);
    return lpol_protected(p, p->own_state ? p->L : p->run_L, l_set_param, &a, "set", -1);
}

static int l_get_param(lua_State *L) {
    set_args *a = lua_touserdata(L, 1);
    lua_rawgeti(L, LUA_REGISTRYINDEX, a->p->ref_params);
    int t = lua_getfield(L, -1, a->key);
    if (t == LUA_TNUMBER && lua_isinteger(L, -1)) snprintf(a->out, a->n, "%lld", (long long)lua_tointeger(L, -1));
    else if (t == LUA_TNUMBER) snprintf(a->out, a->n, "%.17g", lua_tonumber(L, -1));
    else if (t == LUA_TBOOLEAN) snprintf(a->out, a->n, "%s", lua_toboolean(L, -1) ? "true" : "false");
    else if (t == LUA_TSTRING) snprintf(a->out, a->n, "%s", lua_tostring(L, -1));
    else if (t == LUA_TNIL) snprintf(a->out, a->n, "nil");
    else snprintf(a->out, a->n, "(%s)", luaL_typename(L, -1));
    return 0;
}

ks_status ks_policy_get(const ks_policy *pol, const char *key, char *buf, size_t n) {
    ks_lpol *p = need_lpol(pol, "ks_policy_get");
    if (!p) return KS_ERR_ARG;
    if (!buf || n == 0) return ks_errorf(KS_ERR_ARG, "ks_policy_get: no buffer");
    buf[0] = 0;
    if (key && !strcmp(key, "_device")) {
        snprintf(buf, n, "%s", dev_mode_names[p->dev_mode]);
        return KS_OK;
    }
    if (key && !strcmp(key, "_device_mb")) {
        snprintf(buf, n, "%.17g", p->dev_limit / 1048576.0);
        return KS_OK;
    }
    if (key && key[0] == '_' && p->own_state) {
        if (!strcmp(key, "_memory_mb")) snprintf(buf, n, "%.17g", p->ctx.mem_limit / 1048576.0);
        else if (!strcmp(key, "_instructions")) snprintf(buf, n, "%lld", p->ctx.instr_limit);
        else if (!strcmp(key, "_seconds")) snprintf(buf, n, "%.17g", p->ctx.seconds);
        else return unknown_param(p, key);
        return KS_OK;
    }
    const lparam *pp = key ? find_param(p, key) : NULL;
    if (!pp) return unknown_param(p, key ? key : "(null)");
    if (p->busy) return ks_errorf(KS_ERR_ARG, "policy %s: cannot read parameters while it runs", p->name);
    set_args a = {.p = p, .key = pp->name, .out = buf, .n = n};
    return lpol_protected(p, p->own_state ? p->L : p->run_L, l_get_param, &a, "get", -1);
}

int ks_policy_n_params(const ks_policy *pol) {
    ks_lpol *p = ks_lpol_of((ks_policy *)pol);
    return p ? p->n_params : 0;
}

const char *ks_policy_param_name(const ks_policy *pol, int i) {
    ks_lpol *p = ks_lpol_of((ks_policy *)pol);
    return p && i >= 0 && i < p->n_params ? p->params[i].name : NULL;
}

const char *ks_policy_name(const ks_policy *pol) { return pol && pol->name ? pol->name : ""; }

const char *ks_policy_report(const ks_policy *pol, const char *key) {
    ks_lpol *p = ks_lpol_of((ks_policy *)pol);
    if (!p || !key) return NULL;
    for (int i = 0; i < p->n_report; i++)
        if (!strcmp(p->report[i].key, key)) return p->report[i].val;
    return NULL;
}

int ks_policy_n_reports(const ks_policy *pol) {
    ks_lpol *p = ks_lpol_of((ks_policy *)pol);
    return p ? p->n_report : 0;
}

const char *ks_policy_report_key(const ks_policy *pol, int i) {
    ks_lpol *p = ks_lpol_of((ks_policy *)pol);
    return p && i >= 0 && i < p->n_report ? p->report[i].key : NULL;
}

/* ks_policy_free (any kind of policy) is in core/api.c */

/* ================================================================ for the module (host states) */

void ks_lpol_push_report(lua_State *L, const ks_policy *pol) {
    ks_lpol *p = ks_lpol_of((ks_policy *)pol);
    lua_newtable(L);
    if (!p) return;
    for (int i = 0; i < p->n_report; i++) {
        const lreport *r = &p->report[i];
        if (r->type == LUA_TNUMBER) {
            char *end;
            long long v = strtoll(r->val, &end, 10);
            if (!*end) lua_pushinteger(L, v);
            else lua_pushnumber(L, strtod(r->val, NULL));
        } else if (r->type == LUA_TBOOLEAN) lua_pushboolean(L, !strcmp(r->val, "true"));
        else lua_pushstring(L, r->val);
        lua_setfield(L, -2, r->key);
    }
}

void ks_lpol_push_params(lua_State *L, ks_policy *pol) {
    ks_lpol *p = ks_lpol_of(pol);
    lua_newtable(L);
    if (!p) return;
    for (int i = 0; i < p->n_params; i++) {
        char buf[1024];
        if (p->params[i].type == LUA_TTABLE) {
            lua_pushliteral(L, "(table)");
        } else {
            if (ks_policy_get(pol, p->params[i].name, buf, sizeof buf)) luaL_error(L, "%s", ks_last_error());
            if (p->params[i].type == LUA_TNUMBER) {
                char *end;
                long long v = strtoll(buf, &end, 10);
                if (!*end && p->params[i].is_int) lua_pushinteger(L, v);
                else lua_pushnumber(L, strtod(buf, NULL));
            } else if (p->params[i].type == LUA_TBOOLEAN) lua_pushboolean(L, !strcmp(buf, "true"));
            else lua_pushstring(L, buf);
        }
        lua_setfield(L, -2, p->params[i].name);
    }
}

void ks_lpol_push_failures(lua_State *L, const ks_policy *pol) {
    ks_lpol *p = ks_lpol_of((ks_policy *)pol);
    lua_newtable(L);
    if (!p) return;
    for (int k = 1; k < KS_FAIL_COUNT; k++) {
        lua_pushinteger(L, p->fail_count[k]);
        lua_setfield(L, -2, ks_fail_kind_name((ks_fail_kind)k));
    }
}

int ks_lpol_param_type(const ks_policy *pol, const char *key) {
    ks_lpol *p = ks_lpol_of((ks_policy *)pol);
    const lparam *pp = p ? find_param(p, key) : NULL;
    return pp ? pp->type : LUA_TNONE;
}

void ks_lpol_dev_stats(const ks_policy *pol, ks_lpol_devstats *out) {
    memset(out, 0, sizeof *out);
    ks_lpol *p = ks_lpol_of((ks_policy *)pol);
    out->mode = dev_mode_names[p ? p->dev_mode : DEV_AUTO];
    if (!p || !p->L) return;
    const ks_lctx *c = p->own_state ? &p->ctx : ks_lua_ctx(p->L);
    if (!c) return;
    out->allocs = c->dev_allocs;
    out->downloads = c->dev_downloads;
    out->used = c->dev_used;
    out->peak = c->dev_peak;
    out->limit = p->dev_limit;
}

int ks_lpol_busy(const ks_policy *pol) {
    ks_lpol *p = ks_lpol_of((ks_policy *)pol);
    return p && p->busy;
}

long ks_lpol_failures(const ks_policy *pol, ks_fail_kind k) {
    ks_lpol *p = ks_lpol_of((ks_policy *)pol);
    return p && (unsigned)k < KS_FAIL_COUNT ? p->fail_count[k] : 0;
}
