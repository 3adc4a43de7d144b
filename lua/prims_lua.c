/* prims_lua.c — the native primitives of the `kvsieve` module (over core/prims.h, or a
 * backend's ks_backend_prims for device tensors), and the emulated device.
 *
 * Each function checks its arguments (tensors that are alive, dtypes, shapes, option names)
 * and names itself — and the running event, if any — in every error. Outputs are new owned
 * tensors allocated before the core call, so a core failure leaves nothing to clean up but
 * Lua garbage; the status is turned into a Lua error afterwards. Index lists are 0-based.
 * Placement (see place()): a primitive with a device input runs on that device and returns
 * device tensors; what the host needs to know to shape a result (unique / union counts, a
 * gather's bad index, a reduction to one number) is downloaded, nothing else waits for the
 * device. ks.arange always makes a host tensor (it is uploaded where it meets device data).
 *
 *   ks.scores(q, k [, opts])       attention scores, see l_scores
 *   ks.pool1d(x, kernel [, mode])  mode "avg" (default) | "max"; x (n) or (rows, n)
 *   ks.topk(x, k [, opts])         -> idx (i32), vals (f32); opts.sorted = "index" (default) | "value"
 *   ks.sort(x [, opts]) / ks.argsort(x [, opts])   opts.descending
 *   ks.rank(x)                     1 = highest, ties to the lower index
 *   ks.unique(x) ks.union(a, b) ks.concat(a, b, ...) ks.arange([start,] stop [, step])
 *   ks.gather(x, idx)              rows of x
 *   ks.softmax(x) ks.sum(x [, axis]) ks.mean(x [, axis]) ks.var(x [, axis [, {ddof=0}]])
 *   ks.cosine(a, b)                (d) -> number, (rows, d) -> (rows)
 */
#include "ks_lua.h"

#include "prims.h"
#include "backend.h"
#include "common.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ================================================================ option tables */

/* Check that every key of the options table at idx is one of `allowed` (NULL-terminated). */
static void check_opts(lua_State *L, int idx, const char *fn, const char *const *allowed) {
    if (lua_isnoneornil(L, idx)) return;
    if (!lua_istable(L, idx)) ks_lua_errorf(L, fn, "options must be a table, got %s", luaL_typename(L, idx));
    idx = lua_absindex(L, idx);
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        lua_pop(L, 1);
        const char *k = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : NULL;
        int ok = 0;
        for (int i = 0; k && allowed[i]; i++)
            if (!strcmp(k, allowed[i])) ok = 1;
        if (!ok) {
            char list[256] = "";
            for (int i = 0; allowed[i]; i++) {
                strncat(list, i ? ", " : "", sizeof list - strlen(list) - 1);
                strncat(list, allowed[i], sizeof list - strlen(list) - 1);
            }
            ks_lua_errorf(L, fn, "unknown option '%s' (options: %s)", k ? k : luaL_typename(L, -1), list);
        }
    }
}

/* opts[key] pushed (nil when opts is absent). */
static int opt_get(lua_State *L, int idx, const char *key) {
    if (!lua_istable(L, idx)) { lua_pushnil(L); return LUA_TNIL; }
    return lua_getfield(L, idx, key);
}

static int opt_bool(lua_State *L, int idx, const char *key, int def, const char *fn) {
    int t = opt_get(L, idx, key);
    int v = def;
    if (t == LUA_TBOOLEAN) v = lua_toboolean(L, -1);
    else if (t != LUA_TNIL) ks_lua_errorf(L, fn, "option %s must be a boolean, got %s", key, luaL_typename(L, -1));
    lua_pop(L, 1);
    return v;
}

static const char *opt_str(lua_State *L, int idx, const char *key, const char *def, const char *fn) {
    int t = opt_get(L, idx, key);
    const char *v = def;
    if (t == LUA_TSTRING) v = lua_tostring(L, -1); /* stays alive: it is in the options table */
    else if (t != LUA_TNIL) ks_lua_errorf(L, fn, "option %s must be a string, got %s", key, luaL_typename(L, -1));
    lua_pop(L, 1);
    return v;
}

/* A {begin, end} pair, 0-based half-open; negative values count from n. */
static int opt_range(lua_State *L, int idx, const char *key, int64_t n, int64_t *b, int64_t *e, const char *fn) {
    int t = opt_get(L, idx, key);
    if (t == LUA_TNIL) { lua_pop(L, 1); return 0; }
    if (t != LUA_TTABLE || lua_rawlen(L, -1) != 2) ks_lua_errorf(L, fn, "option %s must be {begin, end}", key);
    lua_rawgeti(L, -1, 1);
    lua_rawgeti(L, -2, 2);
    if (!lua_isinteger(L, -2) || !lua_isinteger(L, -1)) ks_lua_errorf(L, fn, "option %s must hold two integers", key);
    *b = lua_tointeger(L, -2);
    *e = lua_tointeger(L, -1);
    if (*b < 0) *b += n;
    if (*e < 0) *e += n;
    lua_pop(L, 3);
    if (*b < 0 || *e > n || *b > *e)
        ks_lua_errorf(L, fn, "option %s = {%lld, %lld} is not within [0, %lld]", key, (long long)*b, (long long)*e, (long long)n);
    return 1;
}

/* ================================================================ placement (host or device)

 * A primitive runs where its tensor inputs are: on the backend of its device inputs when
 * there are any (host inputs are uploaded), else on the host. When the host inputs outweigh
 * the device ones, the device ones are downloaded instead ("move the small one"). Outputs are
 * new owned tensors on the same side. */
static ks_backend *place(ks_tensor *const *ts, int n) {
    ks_backend *be = NULL;
    size_t dev = 0, host = 0;
    for (int i = 0; i < n; i++)
        if (ts[i] && ts[i]->be && !be) be = ts[i]->be;
    if (!be || !be->prims) return NULL;
    for (int i = 0; i < n; i++) {
        if (!ts[i]) continue;
        size_t b = (size_t)ts[i]->numel * 4;
        if (ts[i]->be == be) dev += b;
        else host += b;
    }
    return host > dev ? NULL : be;
}

/* The tensor argument at arg as dtype dt (tables and numbers converted): pushed, its stack
 * slot in *slot. */
static ks_tensor *targ(lua_State *L, int arg, ks_tdtype dt, const char *fn, int *slot) {
    ks_tensor *t = ks_lt_arg(L, arg, dt, fn);
    *slot = lua_gettop(L);
    return t;
}

/* Contiguous data of the tensor at slot on be (NULL = host); a copy stays on the stack. */
static const void *dat(lua_State *L, int slot, ks_tensor *t, ks_backend *be) {
    int pushed;
    return ks_lt_on(L, slot, t, be, &pushed);
}

/* A new owned output on be (NULL = host). */
static ks_tensor *newt(lua_State *L, ks_backend *be, ks_tdtype dt, int ndim, const int64_t *shape) {
    return be ? ks_lt_dnew(L, be, dt, ndim, shape) : ks_lt_new(L, dt, ndim, shape, 0);
}

/* Read a float / an int64 the device wrote. */
static float dev_f32(lua_State *L, ks_backend *be, const void *p) {
    float v;
    ks_lt_download(L, be, &v, p, sizeof v);
    return v;
}
static int64_t dev_i64(lua_State *L, ks_backend *be, const void *p) {
    int64_t v;
    ks_lt_download(L, be, &v, p, sizeof v);
    return v;
}

#define CORE(fn, call)                                                                                               \
    do {                                                                                                             \
        ks_status st_ = (call);                                                                                      \
        if (st_) return ks_lua_core_error(L, fn, st_);                                                               \
    } while (0)

/* the host call or the backend's primitive, by where the work runs */
#define RUN(fn, be, dev_call, cpu_call) CORE(fn, (be) ? (be)->prims->dev_call : (cpu_call))

/* ================================================================ scores */

/* ks.scores(q, k [, opts]) -> attention scores, never an (m, n) matrix.
 *   q     (m, H, d) queries, token-major as the engine holds them (ev.q); (H, d) = one query
 *   k     (n, Hkv, d) keys (ev.k, or ev:kv_keys() in decode)
 * opts:
 *   rows    which query rows: "last" | w (the last w) | {begin, end}; default all of q
 *   qpos    i32 (m) query positions (causal); default: rows of k's sequence (see prims.h)
 *   kpos    i32 (n) key positions; default 0..n-1
 *   scale   "sqrt_d" (default: 1/sqrt(d)) | "none" | a number
 *   causal  false (default) | true
 *   softmax false (default) | true   (probabilities over the visible keys of key_range)
 *   key_range {b, e}  the key domain (softmax normalises over it); default all
 *   out       {b, e}  the key columns reported (not renormalised); default all
 *   reduce  "none" (H, n_out) | "group" (Hkv, n_out) | "sum" (n_out) | "mean" (n_out)
 *   gqa     "div" (model mapping, default) | "mod" (TokenSelect's released kernel)
 *   threads 0 = automatic */
static int l_scores(lua_State *L) {
    lua_settop(L, 3);
    static const char *const allowed[] = {"rows", "qpos", "kpos", "scale", "causal", "softmax", "key_range",
                                          "out", "reduce", "gqa", "threads", NULL};
    const char *fn = "scores";
    ks_tensor *q = ks_lt_check(L, 1, fn), *k = ks_lt_check(L, 2, fn);
    check_opts(L, 3, fn, allowed);
    if (q->dtype != KS_T_F32 || k->dtype != KS_T_F32) return ks_lua_errorf(L, fn, "q and k must be f32 tensors");
    if (q->bf16) return ks_lua_errorf(L, fn, "q cannot be a bf16 view (only keys can)");
    if (k->ndim != 3) return ks_lua_errorf(L, fn, "k must be (n, n_kv_heads, head_dim), got %d dimensions", k->ndim);
    int64_t m, H, d, qs0, qs1;
    if (q->ndim != 2 && q->ndim != 3)
        return ks_lua_errorf(L, fn, "q must be (m, n_heads, head_dim) or (n_heads, head_dim), got %d dimensions", q->ndim);
    if (q->stride[q->ndim - 1] != 1 || k->stride[2] != 1) return ks_lua_errorf(L, fn, "the last dimension of q and k must be contiguous");
    /* where it runs; an input on the other side is copied (contiguous) and read through that copy */
    ks_tensor *both[2] = {q, k};
    ks_backend *be = place(both, 2);
    ks_tensor qh = *q, kh = *k;
    if (be ? q->be != be : q->be != NULL) {
        qh.data = (void *)dat(L, 1, q, be);
        int64_t st = 1;
        for (int i = q->ndim - 1; i >= 0; i--) { qh.stride[i] = st; st *= q->shape[i] ? q->shape[i] : 1; }
        qh.be = be;
    }
    if (be ? k->be != be : k->be != NULL) {
        kh.data = (void *)dat(L, 2, k, be);
        int64_t st = 1;
        for (int i = 2; i >= 0; i--) { kh.stride[i] = st; st *= k->shape[i] ? k->shape[i] : 1; }
        kh.be = be;
        kh.bf16 = 0;
    }
    q = &qh;
    k = &kh;
    const float *qd = q->data;
    if (q->ndim == 3) { m = q->shape[0]; H = q->shape[1]; d = q->shape[2]; qs0 = q->stride[0]; qs1 = q->stride[1]; }
    else if (q->ndim == 2) { m = 1; H = q->shape[0]; d = q->shape[1]; qs0 = H * d; qs1 = q->stride[0]; }
    else return ks_lua_errorf(L, fn, "q must be (m, n_heads, head_dim) or (n_heads, head_dim), got %d dimensions", q->ndim);
    int64_t n = k->shape[0], Hkv = k->shape[1];
    if (k->shape[2] != d) return ks_lua_errorf(L, fn, "head_dim of q (%lld) and k (%lld) differ", (long long)d, (long long)k->shape[2]);

    ks_scores_opts o = ks_scores_opts_default();
    /* rows */
    int64_t r0 = 0, r1 = m;
    int rows_given = 0;
    int t = opt_get(L, 3, "rows");
    if (t == LUA_TSTRING) {
        if (strcmp(lua_tostring(L, -1), "last")) return ks_lua_errorf(L, fn, "option rows: \"last\", a count or {begin, end}");
        r0 = m - 1;
        rows_given = 1;
    } else if (t == LUA_TNUMBER) {
        lua_Integer w = lua_tointeger(L, -1);
        if (w < 1 || w > m) return ks_lua_errorf(L, fn, "option rows = %lld: must be in [1, %lld]", (long long)w, (long long)m);
        r0 = m - w;
        rows_given = 1;
    } else if (t != LUA_TNIL) {
        lua_pop(L, 1);
        opt_range(L, 3, "rows", m, &r0, &r1, fn);
        rows_given = 1;
        lua_pushnil(L);
    }
    lua_pop(L, 1);
    if (rows_given && r1 - r0 < 1) return ks_lua_errorf(L, fn, "option rows selects no query row");
    if (r0) qd += r0 * qs0; /* a device address too: never dereferenced here (and NULL for an empty q: no offset) */
    int64_t mq = r1 - r0;
    o.q_row_stride = qs0;
    o.q_head_stride = qs1;
    o.k_row_stride = k->stride[0];
    o.k_head_stride = k->stride[1];
    /* positions */
    const int32_t *kpos = NULL, *qpos = NULL;
    ks_tensor *tk = NULL, *tq = NULL;
    const int32_t *kpos_host = NULL;
    int slot;
    if (opt_get(L, 3, "kpos") != LUA_TNIL) {
        tk = targ(L, lua_gettop(L), KS_T_I32, fn, &slot);
        if (tk->numel != n) return ks_lua_errorf(L, fn, "kpos has %lld entries for %lld keys", (long long)tk->numel, (long long)n);
        kpos = dat(L, slot, tk, be);
        kpos_host = be ? NULL : kpos;
    } /* the pushed values stay on the stack until we return */
    if (opt_get(L, 3, "qpos") != LUA_TNIL) {
        tq = targ(L, lua_gettop(L), KS_T_I32, fn, &slot);
        if (tq->numel != mq) return ks_lua_errorf(L, fn, "qpos has %lld entries for %lld query rows", (long long)tq->numel, (long long)mq);
        qpos = dat(L, slot, tq, be);
    }
    o.causal = opt_bool(L, 3, "causal", 0, fn);
    o.softmax = opt_bool(L, 3, "softmax", 0, fn);
    if (o.causal && !qpos && rows_given && r1 != m) {
        /* explicit rows that are not the last ones: their positions are those of the same
         * rows of k (q and k come from the same event) */
        if (m != n) return ks_lua_errorf(L, fn, "causal rows {%lld, %lld} need qpos (q has %lld rows, k %lld)", (long long)r0,
                                         (long long)r1, (long long)m, (long long)n);
        int64_t sh[1] = {mq};
        if (tk && !kpos_host) kpos_host = ks_lt_host(L, tk);
        ks_tensor *p = ks_lt_new(L, KS_T_I32, 1, sh, 0);
        for (int64_t i = 0; i < mq; i++) ((int32_t *)p->data)[i] = kpos_host ? kpos_host[r0 + i] : (int32_t)(r0 + i);
        qpos = dat(L, lua_gettop(L), p, be);
    } else if (o.causal && !qpos && mq > n)
        return ks_lua_errorf(L, fn, "causal scores of %lld query rows over %lld keys need qpos", (long long)mq, (long long)n);
    /* scale */
    t = opt_get(L, 3, "scale");
    if (t == LUA_TNUMBER) { o.scale_mode = KS_SCALE_CUSTOM; o.scale = (float)lua_tonumber(L, -1); }
    else if (t == LUA_TSTRING) {
        const char *s = lua_tostring(L, -1);
        if (!strcmp(s, "sqrt_d") || !strcmp(s, "rsqrt_d")) o.scale_mode = KS_SCALE_RSQRT_D;
        else if (!strcmp(s, "none")) o.scale_mode = KS_SCALE_ONE;
        else return ks_lua_errorf(L, fn, "option scale: \"sqrt_d\", \"none\" or a number, got \"%s\"", s);
    } else if (t != LUA_TNIL) return ks_lua_errorf(L, fn, "option scale: \"sqrt_d\", \"none\" or a number");
    lua_pop(L, 1);
    int64_t b, e;
    if (opt_range(L, 3, "key_range", n, &b, &e, fn)) { o.k_begin = b; o.k_end = e; }
    if (opt_range(L, 3, "out", n, &b, &e, fn)) { o.out_begin = b; o.out_end = e; }
    const char *red = opt_str(L, 3, "reduce", "none", fn);
    if (!strcmp(red, "none")) o.heads = KS_HEADS_NONE;
    else if (!strcmp(red, "group")) o.heads = KS_HEADS_GROUP_SUM;
    else if (!strcmp(red, "sum")) o.heads = KS_HEADS_SUM;
    else if (!strcmp(red, "mean")) o.heads = KS_HEADS_MEAN;
    else return ks_lua_errorf(L, fn, "option reduce: \"none\", \"group\", \"sum\" or \"mean\", got \"%s\"", red);
    const char *gqa = opt_str(L, 3, "gqa", "div", fn);
    if (!strcmp(gqa, "div")) o.gqa = KS_GQA_DIV;
    else if (!strcmp(gqa, "mod")) o.gqa = KS_GQA_MOD;
    else return ks_lua_errorf(L, fn, "option gqa: \"div\" or \"mod\", got \"%s\"", gqa);
    if (opt_get(L, 3, "threads") != LUA_TNIL) {
        lua_Integer nt = luaL_checkinteger(L, -1);
        if (nt < 0 || nt > 256) return ks_lua_errorf(L, fn, "option threads = %lld: must be in [0, 256] (0 = automatic)", (long long)nt);
        o.n_threads = (int)nt;
    }
    lua_pop(L, 1);

    int64_t rows, cols;
    CORE(fn, ks_scores_out_shape(&o, H, Hkv, n, &rows, &cols));
    int64_t shape[2] = {rows, cols};
    int reduce_all = o.heads == KS_HEADS_SUM || o.heads == KS_HEADS_MEAN;
    ks_tensor *out = reduce_all ? newt(L, be, KS_T_F32, 1, &cols) : newt(L, be, KS_T_F32, 2, shape);
    /* A sandboxed call's _seconds budget reaches the host scores' own loop, which no Lua hook
     * sees: it stops between tiles of query rows once the call's deadline has passed. */
    ks_lctx *lc = ks_lua_ctx(L);
    if (lc->sandboxed && lc->budget_active && lc->seconds > 0)
        o.deadline = lc->deadline > 0 ? lc->deadline : ks_now() + lc->seconds;
    ks_status sst = be ? be->prims->scores(be, qd, qpos, H, mq, k->data, k->bf16, kpos, Hkv, n, d, &o, out->data)
                       : ks_cpu_scores(qd, qpos, H, mq, k->data, kpos, Hkv, n, d, &o, out->data);
    if (sst == KS_ERR_INTERRUPTED && o.deadline > 0) {
        lc->fail_kind = KS_FAIL_TIMEOUT;
        return ks_lua_errorf(L, fn, "wall-clock budget exceeded (%.3g s per call; parameter _seconds)", lc->seconds);
    }
    CORE(fn, sst);
    return 1;
}

/* ================================================================ pooling and ordering */

/* rows x n view of a 1-D or 2-D tensor */
static void rows_cols(lua_State *L, const ks_tensor *t, int64_t *rows, int64_t *n, const char *fn) {
    if (t->ndim == 1) { *rows = 1; *n = t->shape[0]; }
    else if (t->ndim == 2) { *rows = t->shape[0]; *n = t->shape[1]; }
    else ks_lua_errorf(L, fn, "x must be 1-d or 2-d, got %d dimensions", t->ndim);
}

static int l_pool1d(lua_State *L) {
    lua_settop(L, 3);
    const char *fn = "pool1d";
    int sx;
    ks_tensor *t = targ(L, 1, KS_T_F32, fn, &sx);
    lua_Integer kernel = luaL_checkinteger(L, 2);
    const char *mode = luaL_optstring(L, 3, "avg");
    ks_pool_mode pm;
    if (!strcmp(mode, "avg")) pm = KS_POOL_AVG;
    else if (!strcmp(mode, "max")) pm = KS_POOL_MAX;
    else return ks_lua_errorf(L, fn, "mode must be \"avg\" or \"max\", got \"%s\"", mode);
    int64_t rows = 0, n = 0;
    rows_cols(L, t, &rows, &n, fn);
    ks_backend *be = place(&t, 1);
    const float *x = dat(L, sx, t, be);
    ks_tensor *o = newt(L, be, KS_T_F32, t->ndim, t->shape);
    RUN(fn, be, pool1d(be, x, rows, n, kernel, pm, o->data), ks_cpu_pool1d(x, rows, n, kernel, pm, o->data));
    return 1;
}

static int l_topk(lua_State *L) {
    lua_settop(L, 3);
    const char *fn = "topk";
    static const char *const allowed[] = {"sorted", NULL};
    int sx;
    ks_tensor *t = targ(L, 1, KS_T_F32, fn, &sx);
    lua_Integer k = luaL_checkinteger(L, 2);
    ks_topk_order order = KS_TOPK_BY_INDEX;
    const char *s = NULL;
    if (lua_type(L, 3) == LUA_TSTRING) s = lua_tostring(L, 3);
    else {
        check_opts(L, 3, fn, allowed);
        s = opt_str(L, 3, "sorted", "index", fn);
    }
    if (!strcmp(s, "value")) order = KS_TOPK_BY_VALUE;
    else if (strcmp(s, "index")) return ks_lua_errorf(L, fn, "sorted must be \"index\" or \"value\", got \"%s\"", s);
    int64_t rows = 0, n = 0;
    rows_cols(L, t, &rows, &n, fn);
    if (k < 0 || k > n) return ks_lua_errorf(L, fn, "k = %lld > n = %lld", (long long)k, (long long)n);
    ks_backend *be = place(&t, 1);
    const float *x = dat(L, sx, t, be);
    int64_t sh[2] = {rows, k};
    ks_tensor *idx = t->ndim == 1 ? newt(L, be, KS_T_I32, 1, &sh[1]) : newt(L, be, KS_T_I32, 2, sh);
    ks_tensor *val = t->ndim == 1 ? newt(L, be, KS_T_F32, 1, &sh[1]) : newt(L, be, KS_T_F32, 2, sh);
    RUN(fn, be, topk(be, x, rows, n, k, order, idx->data, val->data), ks_cpu_topk(x, rows, n, k, order, idx->data, val->data));
    return 2;
}

static int one_d(lua_State *L, const ks_tensor *t, const char *fn) {
    if (t->ndim != 1) return ks_lua_errorf(L, fn, "x must be 1-d, got %d dimensions", t->ndim);
    return 0;
}

static int opt_descending(lua_State *L, int idx, const char *fn) {
    static const char *const allowed[] = {"descending", NULL};
    check_opts(L, idx, fn, allowed);
    return opt_bool(L, idx, "descending", 0, fn);
}

static int l_sort(lua_State *L) {
    lua_settop(L, 2);
    const char *fn = "sort";
    int desc = opt_descending(L, 2, fn);
    ks_tensor *t0 = ks_lt_arg(L, 1, KS_T_ANY, fn); /* a table of integers sorts as integers */
    lua_replace(L, 1);
    int sx;
    if (t0->dtype == KS_T_I32) {
        ks_tensor *t = targ(L, 1, KS_T_I32, fn, &sx);
        one_d(L, t, fn);
        ks_backend *be = place(&t, 1);
        const int32_t *x = dat(L, sx, t, be);
        ks_tensor *o = newt(L, be, KS_T_I32, 1, t->shape);
        RUN(fn, be, sort_i32(be, x, t->numel, o->data), ks_cpu_sort_i32(x, t->numel, o->data));
        if (desc && be) { /* reversed on the device: a gather with n-1, ..., 0 */
            int64_t n = t->numel;
            ks_tensor *rev = newt(L, be, KS_T_I32, 1, &n);
            ks_tensor *r = newt(L, be, KS_T_I32, 1, &n);
            RUN(fn, be, arange(be, n - 1, -1, -1, rev->data), KS_OK);
            RUN(fn, be, gather_i32(be, o->data, n, rev->data, n, r->data, NULL), KS_OK);
        } else if (desc)
            for (int64_t i = 0, j = t->numel - 1; i < j; i++, j--) {
                int32_t *v = o->data, tmp = v[i];
                v[i] = v[j];
                v[j] = tmp;
            }
        return 1;
    }
    ks_tensor *t = targ(L, 1, KS_T_F32, fn, &sx);
    one_d(L, t, fn);
    ks_backend *be = place(&t, 1);
    const float *x = dat(L, sx, t, be);
    ks_tensor *o = newt(L, be, KS_T_F32, 1, t->shape);
    RUN(fn, be, sort_f32(be, x, t->numel, desc, o->data), ks_cpu_sort_f32(x, t->numel, desc, o->data));
    return 1;
}

static int l_argsort(lua_State *L) {
    lua_settop(L, 2);
    const char *fn = "argsort";
    int desc = opt_descending(L, 2, fn);
    int sx;
    ks_tensor *t = targ(L, 1, KS_T_F32, fn, &sx);
    one_d(L, t, fn);
    ks_backend *be = place(&t, 1);
    const float *x = dat(L, sx, t, be);
    ks_tensor *o = newt(L, be, KS_T_I32, 1, t->shape);
    RUN(fn, be, argsort(be, x, t->numel, desc, o->data), ks_cpu_argsort(x, t->numel, desc, o->data));
    return 1;
}

static int l_rank(lua_State *L) {
    lua_settop(L, 1);
    const char *fn = "rank";
    int sx;
    ks_tensor *t = targ(L, 1, KS_T_F32, fn, &sx);
    one_d(L, t, fn);
    ks_backend *be = place(&t, 1);
    const float *x = dat(L, sx, t, be);
    ks_tensor *o = newt(L, be, KS_T_I32, 1, t->shape);
    RUN(fn, be, rank(be, x, t->numel, o->data), ks_cpu_rank(x, t->numel, o->data));
    return 1;
}

/* ================================================================ index lists */

/* Shrink a fresh 1-D output to its first n entries (a view of it: no copy). */
static void shrink_1d(lua_State *L, ks_tensor *o, int64_t n) {
    int64_t sh[1] = {n};
    if (o->be) ks_lt_dview(L, o->be, o->dtype, 0, 1, sh, NULL, o->data, 0, -1);
    else ks_lt_view(L, o->dtype, 1, sh, NULL, o->data, 0, -1);
}

static int l_unique(lua_State *L) {
    lua_settop(L, 1);
    const char *fn = "unique";
    int sx;
    ks_tensor *t = targ(L, 1, KS_T_I32, fn, &sx);
    one_d(L, t, fn);
    ks_backend *be = place(&t, 1);
    const int32_t *x = dat(L, sx, t, be);
    ks_tensor *o = newt(L, be, KS_T_I32, 1, t->shape);
    int64_t n, two = 2;
    if (be) {
        ks_tensor *cnt = ks_lt_dnew(L, be, KS_T_F32, 1, &two); /* 8 bytes: the int64 count */
        RUN(fn, be, unique(be, x, t->numel, o->data, cnt->data), KS_OK);
        n = dev_i64(L, be, cnt->data);
        lua_pop(L, 1);
    } else CORE(fn, ks_cpu_unique(x, t->numel, o->data, &n));
    shrink_1d(L, o, n);
    return 1;
}

static int strictly_ascending(const int32_t *x, int64_t n) {
    for (int64_t i = 1; i < n; i++)
        if (x[i] <= x[i - 1]) return 0;
    return 1;
}

/* union(a, b): the sorted set of values in a or b (inputs in any order). */
static int l_union(lua_State *L) {
    lua_settop(L, 2);
    const char *fn = "union";
    int sa, sb;
    ks_tensor *ta = targ(L, 1, KS_T_I32, fn, &sa);
    ks_tensor *tb = targ(L, 2, KS_T_I32, fn, &sb);
    one_d(L, ta, fn);
    one_d(L, tb, fn);
    ks_tensor *ts[2] = {ta, tb};
    ks_backend *be = place(ts, 2);
    const int32_t *a = dat(L, sa, ta, be);
    const int32_t *b = dat(L, sb, tb, be);
    int64_t sh[1] = {ta->numel + tb->numel}, n, two = 2;
    ks_tensor *o = newt(L, be, KS_T_I32, 1, sh);
    int oslot = lua_gettop(L);
    if (be) { /* the device union takes inputs in any order (sorted distinct values of both) */
        ks_tensor *cnt = ks_lt_dnew(L, be, KS_T_F32, 1, &two);
        RUN(fn, be, union_(be, a, ta->numel, b, tb->numel, o->data, cnt->data), KS_OK);
        n = dev_i64(L, be, cnt->data);
        lua_settop(L, oslot);
    } else if (strictly_ascending(a, ta->numel) && strictly_ascending(b, tb->numel)) {
        CORE(fn, ks_cpu_union(a, ta->numel, b, tb->numel, o->data, &n));
    } else {
        CORE(fn, ks_cpu_concat_i32(a, ta->numel, b, tb->numel, o->data));
        CORE(fn, ks_cpu_unique(o->data, sh[0], o->data, &n));
    }
    shrink_1d(L, o, n);
    return 1;
}

/* concat(a, b, ...) of 1-d tensors or tables; f32 if any input is f32. */
static int l_concat(lua_State *L) {
    const char *fn = "concat";
    int nargs = lua_gettop(L);
    if (nargs < 1) return ks_lua_errorf(L, fn, "needs at least one argument");
    if (nargs > 64) return ks_lua_errorf(L, fn, "at most 64 arguments");
    /* one converted value per argument, the output and a copy at a time: more than the
     * LUA_MINSTACK slots a C function is guaranteed */
    luaL_checkstack(L, nargs + 8, "concat: too many arguments");
    ks_tdtype dt = KS_T_I32;
    for (int i = 1; i <= nargs; i++) {
        ks_tensor *t = ks_lt_test(L, i);
        if (t && t->dtype == KS_T_F32) dt = KS_T_F32;
        if (!t && !lua_istable(L, i)) return ks_lua_errorf(L, fn, "argument %d: tensor or table expected, got %s", i, luaL_typename(L, i));
    }
    int64_t total = 0;
    ks_tensor *ts[64];
    for (int i = 1; i <= nargs; i++) {
        ks_tensor *t = ks_lt_arg(L, i, dt, fn); /* pushed at nargs + i */
        if (t->ndim != 1) return ks_lua_errorf(L, fn, "argument %d is %d-d (1-d expected)", i, t->ndim);
        total += t->numel;
        ts[i - 1] = t;
    }
    ks_backend *be = place(ts, nargs);
    ks_tensor *o = newt(L, be, dt, 1, &total);
    int oslot = lua_gettop(L);
    int64_t at = 0;
    for (int i = 1; i <= nargs; i++) {
        ks_tensor *t = ts[i - 1];
        if (t->numel == 0) continue; /* nothing to copy, and its data may be NULL */
        const void *d = dat(L, nargs + i, t, be);
        if (be) {
            ks_status st = be->copy(be, (char *)o->data + at * 4, d, (size_t)t->numel * 4);
            if (st) return ks_lua_core_error(L, fn, st);
        } else memcpy((char *)o->data + at * 4, d, (size_t)t->numel * 4);
        lua_settop(L, oslot);
        at += t->numel;
    }
    return 1;
}

static int l_arange(lua_State *L) {
    const char *fn = "arange";
    lua_Integer a = 0, b, s = 1;
    if (lua_isnoneornil(L, 2)) b = luaL_checkinteger(L, 1);
    else { a = luaL_checkinteger(L, 1); b = luaL_checkinteger(L, 2); s = luaL_optinteger(L, 3, 1); }
    int64_t n = ks_arange_len(a, b, s);
    if (n < 0) return ks_lua_errorf(L, fn, "step must not be 0");
    ks_tensor *o = ks_lt_new(L, KS_T_I32, 1, &n, 0);
    CORE(fn, ks_cpu_arange(a, b, s, o->data));
    return 1;
}

/* gather(x, idx): rows idx of x (n, ...) -> (k, ...); indices may repeat. */
static int l_gather(lua_State *L) {
    lua_settop(L, 2);
    const char *fn = "gather";
    ks_tensor *x = ks_lt_check(L, 1, fn);
    int si;
    ks_tensor *ti = targ(L, 2, KS_T_I32, fn, &si);
    if (ti->ndim != 1) return ks_lua_errorf(L, fn, "idx must be 1-d");
    if (x->ndim < 1) return ks_lua_errorf(L, fn, "x must have at least one dimension");
    ks_tensor *ts[2] = {x, ti};
    ks_backend *be = place(ts, 2);
    const void *xd = dat(L, 1, x, be);
    const int32_t *idx = dat(L, si, ti, be);
    int64_t n = x->shape[0], d = n ? x->numel / n : 0, one = 2;
    int64_t shape[KS_TENSOR_MAXDIM];
    memcpy(shape, x->shape, sizeof shape);
    shape[0] = ti->numel;
    ks_tensor *o = newt(L, be, x->dtype, x->ndim, shape);
    if (be) {
        /* rows of 32-bit words: the f32 gather moves i32 rows bit for bit; a bad index is
         * reported through a device word (set to -1 first) */
        ks_tensor *err = ks_lt_dnew(L, be, KS_T_F32, 1, &one);
        int64_t m1 = -1;
        CORE(fn, be->upload(be, err->data, &m1, sizeof m1));
        if (x->dtype == KS_T_I32 && d == 1) RUN(fn, be, gather_i32(be, xd, n, idx, ti->numel, o->data, err->data), KS_OK);
        else RUN(fn, be, gather(be, xd, n, d, idx, ti->numel, o->data, err->data), KS_OK);
        int64_t bad = dev_i64(L, be, err->data);
        if (bad >= 0) {
            int32_t v;
            ks_lt_download(L, be, &v, idx + bad, sizeof v);
            return ks_lua_errorf(L, fn, "index %d at position %lld out of range [0, %lld)", v, (long long)bad, (long long)n);
        }
        lua_pop(L, 1);
        return 1;
    }
    if (x->dtype == KS_T_F32) CORE(fn, ks_cpu_gather(xd, n, d, idx, ti->numel, o->data));
    else if (d == 1) CORE(fn, ks_cpu_gather_i32(xd, n, idx, ti->numel, o->data));
    else {
        for (int64_t i = 0; i < ti->numel; i++)
            if (idx[i] < 0 || idx[i] >= n)
                return ks_lua_errorf(L, fn, "index %d at position %lld out of range [0, %lld)", idx[i], (long long)i, (long long)n);
        for (int64_t i = 0; d > 0 && i < ti->numel; i++)
            memcpy((int32_t *)o->data + i * d, (const int32_t *)xd + (int64_t)idx[i] * d, sizeof(int32_t) * d);
    }
    return 1;
}

/* ================================================================ small numerics */

static int l_softmax(lua_State *L) {
    lua_settop(L, 1);
    const char *fn = "softmax";
    int sx;
    ks_tensor *t = targ(L, 1, KS_T_F32, fn, &sx);
    if (t->ndim < 1) return ks_lua_errorf(L, fn, "x must have at least one dimension");
    int64_t n = t->shape[t->ndim - 1], rows = n ? t->numel / n : 0;
    ks_backend *be = place(&t, 1);
    const float *x = dat(L, sx, t, be);
    ks_tensor *o = newt(L, be, KS_T_F32, t->ndim, t->shape);
    RUN(fn, be, softmax(be, x, rows, n, o->data), ks_cpu_softmax(x, rows, n, o->data));
    return 1;
}

typedef enum { R_SUM, R_MEAN, R_VAR } red_kind;

static ks_status red_call(ks_backend *be, red_kind kind, const float *x, int64_t rows, int64_t cols, int axis, int64_t ddof,
                          float *out) {
    if (be) {
        if (kind == R_SUM) return be->prims->sum(be, x, rows, cols, axis, out);
        if (kind == R_MEAN) return be->prims->mean(be, x, rows, cols, axis, out);
        return be->prims->var(be, x, rows, cols, axis, ddof, out);
    }
    if (kind == R_SUM) return ks_cpu_sum(x, rows, cols, axis, out);
    if (kind == R_MEAN) return ks_cpu_mean(x, rows, cols, axis, out);
    return ks_cpu_var(x, rows, cols, axis, ddof, out);
}

/* sum/mean/var over one axis (0-based, negative from the end) or over everything. A
 * 0-d result is returned as a number. */
static int reduce(lua_State *L, red_kind kind, const char *fn) {
    lua_settop(L, 3);
    int sx;
    ks_tensor *t = targ(L, 1, KS_T_F32, fn, &sx);
    int64_t ddof = 0;
    if (kind == R_VAR) {
        static const char *const allowed[] = {"ddof", NULL};
        check_opts(L, 3, fn, allowed);
        if (opt_get(L, 3, "ddof") != LUA_TNIL) ddof = luaL_checkinteger(L, -1);
        lua_pop(L, 1);
    }
    ks_backend *be = place(&t, 1);
    if (lua_isnoneornil(L, 2) || t->ndim <= 1) {
        if (!lua_isnoneornil(L, 2)) {
            lua_Integer a = luaL_checkinteger(L, 2);
            if (a != 0 && a != -1) return ks_lua_errorf(L, fn, "axis %lld out of range for a %d-d tensor", (long long)a, t->ndim);
        }
        const float *x = dat(L, sx, t, be);
        float r;
        if (be) {
            int64_t one = 1;
            ks_tensor *o = ks_lt_dnew(L, be, KS_T_F32, 1, &one);
            CORE(fn, red_call(be, kind, x, 1, t->numel, 1, ddof, o->data));
            r = dev_f32(L, be, o->data);
        } else CORE(fn, red_call(NULL, kind, x, 1, t->numel, 1, ddof, &r));
        lua_pushnumber(L, r);
        return 1;
    }
    lua_Integer a = luaL_checkinteger(L, 2);
    if (a < 0) a += t->ndim;
    if (a < 0 || a >= t->ndim) return ks_lua_errorf(L, fn, "axis %lld out of range for a %d-d tensor", (long long)lua_tointeger(L, 2), t->ndim);
    const float *x = dat(L, sx, t, be);
    int64_t outer = 1, inner = 1, mid = t->shape[a];
    for (int i = 0; i < a; i++) outer *= t->shape[i];
    for (int i = (int)a + 1; i < t->ndim; i++) inner *= t->shape[i];
    int64_t shape[KS_TENSOR_MAXDIM];
    int nd = 0;
    for (int i = 0; i < t->ndim; i++)
        if (i != a) shape[nd++] = t->shape[i];
    ks_tensor *o = newt(L, be, KS_T_F32, nd, shape);
    /* one (mid, inner) block per outer index (device: pointer offsets, one launch each) */
    for (int64_t i = 0; i < outer; i++) {
        /* an empty tensor's data may be NULL: no offset from it (UBSan, found by fuzz_lua_prims) */
        const float *xi = x ? x + i * mid * inner : x;
        float *oi = o->data ? (float *)o->data + i * inner : (float *)o->data;
        CORE(fn, red_call(be, kind, xi, mid, inner, 0, ddof, oi));
    }
    return 1;
}
static int l_sum(lua_State *L) { return reduce(L, R_SUM, "sum"); }
static int l_mean(lua_State *L) { return reduce(L, R_MEAN, "mean"); }
static int l_var(lua_State *L) { return reduce(L, R_VAR, "var"); }

static int l_cosine(lua_State *L) {
    lua_settop(L, 2);
    const char *fn = "cosine";
    int sa, sb;
    ks_tensor *ta = targ(L, 1, KS_T_F32, fn, &sa);
    ks_tensor *tb = targ(L, 2, KS_T_F32, fn, &sb);
    if (ta->ndim != tb->ndim || memcmp(ta->shape, tb->shape, sizeof(int64_t) * ta->ndim))
        return ks_lua_errorf(L, fn, "a and b differ in shape");
    if (ta->ndim > 2) return ks_lua_errorf(L, fn, "a and b must be (d) or (rows, d)");
    ks_tensor *ts[2] = {ta, tb};
    ks_backend *be = place(ts, 2);
    const float *a = dat(L, sa, ta, be);
    const float *b = dat(L, sb, tb, be);
    if (ta->ndim <= 1) {
        float r;
        if (be) {
            int64_t one = 1;
            ks_tensor *o = ks_lt_dnew(L, be, KS_T_F32, 1, &one);
            RUN(fn, be, cosine(be, a, b, ta->numel, o->data), KS_OK);
            r = dev_f32(L, be, o->data);
        } else CORE(fn, ks_cpu_cosine(a, b, ta->numel, &r));
        lua_pushnumber(L, r);
        return 1;
    }
    ks_tensor *o = newt(L, be, KS_T_F32, 1, ta->shape);
    RUN(fn, be, cosine_rows(be, a, b, ta->shape[0], ta->shape[1], o->data),
        ks_cpu_cosine_rows(a, b, ta->shape[0], ta->shape[1], o->data));
    return 1;
}

/* ks._upload(t): a device copy of t on the running event's device (the device the event's
 * views live on), or t itself when there is none. Tests and policies that want a table on
 * the device; an underscore name: not part of the stable API. */
static int l_upload(lua_State *L) {
    ks_tensor *t = ks_lt_check(L, 1, "_upload");
    ks_lctx *c = ks_lua_ctx(L);
    ks_backend *be = c && c->in_event ? c->dev : NULL;
    if (!be || t->be == be) { lua_settop(L, 1); return 1; }
    int pushed;
    const void *d = ks_lt_on(L, 1, t, be, &pushed);
    if (!pushed) {
        ks_tensor *o = ks_lt_dnew(L, be, t->dtype, t->ndim, t->shape);
        CORE("_upload", be->copy(be, o->data, d, (size_t)t->numel * 4));
    }
    return 1;
}

/* ================================================================ the emulated device

 * core/prims.c behind the backend interface, on host memory at tagged addresses: bit 62 is
 * flipped, which makes the address non-canonical on x86-64 (and out of any mapping
 * elsewhere), so code that dereferences a device address without the backend faults at once
 * instead of silently working on the CPU. Every entry point untags and calls the CPU
 * reference; results that a device writes to device memory (counts, cosine) are written
 * there too, and gather reports a bad index through its error word like the CUDA kernel. */

#define EMU_TAG ((uintptr_t)1 << 62)
long ks_lua_emu_fail_in = 0;

void *ks_lua_emu_tag(const void *p) { return p ? (void *)((uintptr_t)p ^ EMU_TAG) : NULL; }
void *ks_lua_emu_untag(const void *p) { return p ? (void *)((uintptr_t)p ^ EMU_TAG) : NULL; }
#define U(p) ks_lua_emu_untag(p)

static void *emu_alloc(ks_backend *b, size_t n) {
    if (ks_lua_emu_fail_in < 0 || (ks_lua_emu_fail_in > 0 && --ks_lua_emu_fail_in == 0)) {
        ks_lua_emu_fail_in = -1; /* from now on, until the test resets it */
        ks_errorf(KS_ERR_OOM, "emu: out of device memory allocating %zu bytes (injected failure)", n);
        return NULL;
    }
    void *p = malloc(n ? n : 1);
    if (!p) {
        ks_errorf(KS_ERR_OOM, "emu: out of memory allocating %zu bytes", n);
        return NULL;
    }
    return ks_lua_emu_tag(p);
}
static void emu_free(ks_backend *b, void *p) { free(U(p)); }
static ks_status emu_upload(ks_backend *b, void *dst, const void *src, size_t n) {
    if (n) memcpy(U(dst), src, n);
    return KS_OK;
}
static ks_status emu_download(ks_backend *b, void *dst, const void *src, size_t n) {
    if (n) memcpy(dst, U(src), n);
    return KS_OK;
}
static ks_status emu_copy(ks_backend *b, void *dst, const void *src, size_t n) {
    if (n) memmove(U(dst), U(src), n);
    return KS_OK;
}
static ks_status emu_sync(ks_backend *b) { return KS_OK; }
static ks_status emu_rope(ks_backend *b, float *x, int n, int n_heads, const int32_t *pos, const ks_rope *r, int max_pos) {
    float *h = U(x);
    ks_lua_rope_rows(h, h, n, n_heads, r->head_dim, pos, 0, r, max_pos);
    return KS_OK;
}

static ks_status e_scores(ks_backend *b, const float *q, const int32_t *qpos, int64_t hq, int64_t m, const void *k, int k_bf16,
                          const int32_t *kpos, int64_t hkv, int64_t n, int64_t d, const ks_scores_opts *o, float *out) {
    if (k_bf16) return ks_errorf(KS_ERR_UNSUPPORTED, "scores: the emulated device has no bf16 keys");
    return ks_cpu_scores(U(q), U(qpos), hq, m, U(k), U(kpos), hkv, n, d, o, U(out));
}
static ks_status e_pool1d(ks_backend *b, const float *x, int64_t rows, int64_t n, int64_t kernel, ks_pool_mode mode, float *out) {
    return ks_cpu_pool1d(U(x), rows, n, kernel, mode, U(out));
}
static ks_status e_topk(ks_backend *b, const float *x, int64_t rows, int64_t n, int64_t k, ks_topk_order order, int32_t *oi,
                        float *ov) {
    return ks_cpu_topk(U(x), rows, n, k, order, U(oi), U(ov));
}
static ks_status e_argsort(ks_backend *b, const float *x, int64_t n, int desc, int32_t *oi) {
    return ks_cpu_argsort(U(x), n, desc, U(oi));
}
static ks_status e_sort_f32(ks_backend *b, const float *x, int64_t n, int desc, float *out) {
    return ks_cpu_sort_f32(U(x), n, desc, U(out));
}
static ks_status e_sort_i32(ks_backend *b, const int32_t *x, int64_t n, int32_t *out) { return ks_cpu_sort_i32(U(x), n, U(out)); }
static ks_status e_rank(ks_backend *b, const float *x, int64_t n, int32_t *out) { return ks_cpu_rank(U(x), n, U(out)); }
static ks_status e_unique(ks_backend *b, const int32_t *x, int64_t n, int32_t *out, int64_t *n_out) {
    return ks_cpu_unique(U(x), n, U(out), U(n_out));
}
/* like the CUDA union: the sorted distinct values of both lists, in any order */
static ks_status e_union(ks_backend *b, const int32_t *a, int64_t na, const int32_t *bb, int64_t nb, int32_t *out, int64_t *n_out) {
    ks_status st = ks_cpu_concat_i32(U(a), na, U(bb), nb, U(out));
    return st ? st : ks_cpu_unique(U(out), na + nb, U(out), U(n_out));
}
static ks_status e_concat_i32(ks_backend *b, const int32_t *a, int64_t na, const int32_t *bb, int64_t nb, int32_t *out) {
    return ks_cpu_concat_i32(U(a), na, U(bb), nb, U(out));
}
static ks_status e_concat_f32(ks_backend *b, const float *a, int64_t na, const float *bb, int64_t nb, float *out) {
    return ks_cpu_concat_f32(U(a), na, U(bb), nb, U(out));
}
static ks_status e_arange(ks_backend *b, int64_t start, int64_t stop, int64_t step, int32_t *out) {
    return ks_cpu_arange(start, stop, step, U(out));
}
/* rows of d 32-bit words; a bad index leaves a NaN row and its position in *err (lowest) */
static ks_status e_gather_words(const uint32_t *x, int64_t n, int64_t d, const int32_t *idx, int64_t k, uint32_t *out,
                                int64_t *err) {
    int64_t bad = -1;
    for (int64_t i = 0; i < k; i++) {
        if (idx[i] < 0 || idx[i] >= n) {
            if (bad < 0) bad = i;
            for (int64_t j = 0; j < d; j++) out[i * d + j] = 0x7fc00000u;
        } else memcpy(out + i * d, x + (int64_t)idx[i] * d, (size_t)d * 4);
    }
    if (err && bad >= 0) *err = bad;
    return KS_OK;
}
static ks_status e_gather(ks_backend *b, const float *x, int64_t n, int64_t d, const int32_t *idx, int64_t k, float *out,
                          int64_t *err) {
    if (n < 0 || d < 0 || k < 0) return ks_errorf(KS_ERR_ARG, "gather: negative size");
    return e_gather_words(U(x), n, d, U(idx), k, U(out), U(err));
}
static ks_status e_gather_i32(ks_backend *b, const int32_t *x, int64_t n, const int32_t *idx, int64_t k, int32_t *out,
                              int64_t *err) {
    if (n < 0 || k < 0) return ks_errorf(KS_ERR_ARG, "gather: negative size");
    return e_gather_words(U(x), n, 1, U(idx), k, U(out), U(err));
}
static ks_status e_softmax(ks_backend *b, const float *x, int64_t rows, int64_t n, float *out) {
    return ks_cpu_softmax(U(x), rows, n, U(out));
}
static ks_status e_sum(ks_backend *b, const float *x, int64_t rows, int64_t cols, int axis, float *out) {
    return ks_cpu_sum(U(x), rows, cols, axis, U(out));
}
static ks_status e_mean(ks_backend *b, const float *x, int64_t rows, int64_t cols, int axis, float *out) {
    return ks_cpu_mean(U(x), rows, cols, axis, U(out));
}
static ks_status e_var(ks_backend *b, const float *x, int64_t rows, int64_t cols, int axis, int64_t ddof, float *out) {
    return ks_cpu_var(U(x), rows, cols, axis, ddof, U(out));
}
static ks_status e_cosine(ks_backend *b, const float *a, const float *bb, int64_t n, float *out) {
    return ks_cpu_cosine(U(a), U(bb), n, U(out));
}
static ks_status e_cosine_rows(ks_backend *b, const float *a, const float *bb, int64_t rows, int64_t d, float *out) {
    return ks_cpu_cosine_rows(U(a), U(bb), rows, d, U(out));
}

static const ks_backend_prims emu_prims = {
    .scores = e_scores, .pool1d = e_pool1d, .topk = e_topk, .argsort = e_argsort, .sort_f32 = e_sort_f32,
    .sort_i32 = e_sort_i32, .rank = e_rank, .unique = e_unique, .union_ = e_union, .concat_i32 = e_concat_i32,
    .concat_f32 = e_concat_f32, .arange = e_arange, .gather = e_gather, .gather_i32 = e_gather_i32,
    .softmax = e_softmax, .sum = e_sum, .mean = e_mean, .var = e_var, .cosine = e_cosine, .cosine_rows = e_cosine_rows,
};

static ks_backend emu_backend = {
    .name = "emu", .alloc = emu_alloc, .free = emu_free, .upload = emu_upload, .download = emu_download,
    .copy = emu_copy, .sync = emu_sync, .rope = emu_rope, .prims = &emu_prims,
};

ks_backend *ks_lua_emu_backend(void) { return &emu_backend; }

void ks_prims_open(lua_State *L) {
    static const luaL_Reg fns[] = {
        {"scores", l_scores}, {"pool1d", l_pool1d}, {"topk", l_topk},       {"sort", l_sort},     {"argsort", l_argsort},
        {"rank", l_rank},     {"unique", l_unique}, {"union", l_union},     {"concat", l_concat}, {"arange", l_arange},
        {"gather", l_gather}, {"softmax", l_softmax}, {"sum", l_sum},       {"mean", l_mean},     {"var", l_var},
        {"cosine", l_cosine}, {"_upload", l_upload}, {NULL, NULL}};
    luaL_setfuncs(L, fns, 0);
}
