/* prims_lua.c — the native primitives of the `kvsieve` module, and their registry.
 *
 * Each function checks its arguments (tensors that are alive, dtypes, shapes, option names)
 * and names itself — and the running event, if any — in every error. Outputs are new owned
 * tensors allocated before the core call, so a core failure leaves nothing to clean up but
 * Lua garbage; the status is turned into a Lua error afterwards. Index lists are 0-based.
 * Placement and dispatch (prims_impl.h): a primitive runs where its inputs are and calls one
 * entry of one ks_backend_prims table, the device backend's or the CPU backend's; what the host
 * needs to shape a result (unique / union counts, a gather's bad index, a reduction to one
 * number) is read back, nothing else waits for a device. ks.arange always makes a host tensor
 * (it is uploaded where it meets device data).
 *
 *   ks.scores(q, k [, opts])       attention scores (lua/prims_scores.c)
 *   ks.pool1d(x, kernel [, mode])  mode "avg" (default) | "max"; x (n) or (rows, n)
 *   ks.topk(x, k [, opts])         -> idx (i32), vals (f32); opts.sorted = "index" (default) | "value",
 *                                     opts.values = false: idx only (no values computed), opts.base = b:
 *                                     b added to every index (the rows of a slice starting at row b),
 *                                     opts.skip = mask (one value, ks.ge's): nonzero -> the top k of
 *                                     zeros (base .. base + k - 1, values 0), x unread
 *   ks.sort(x [, opts]) / ks.argsort(x [, opts])   opts.descending
 *   ks.rank(x)                     1 = highest, ties to the lower index
 *   ks.unique(x) ks.union(a, b) ks.concat(a, b, ...) ks.arange([start,] stop [, step])
 *   ks.gather(x, idx)              rows of x
 *   ks.softmax(x) ks.sum(x [, axis]) ks.mean(x [, axis]) ks.var(x [, axis [, {ddof=0}]])
 *   ks.cosine(a, b)                (d) -> number, (rows, d) -> (rows)
 *   ks.ge(x, v)                    f32 mask: 1 where x >= v, else 0 (made where x is)
 *   ks.where(mask, a, b [, opts])  a where the mask is nonzero, else b (one mask value or one each);
 *                                  opts.into = t: written into t (owned, one dtype and size), in place
 *   ks.add(a, b [, opts])          a + b of f32 tensors (opts.into as where's)
 *   ks._upload(t)                  a device copy on the running event's device (tests)
 */
#include "prims_impl.h"
#include "prims_page_lua.h"
#include "tensor_impl.h"

#include "common.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ================================================================ option tables */

void ks_lp_check_opts(lua_State *L, int idx, const char *fn, const char *const *allowed) {
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

int ks_lp_opt_get(lua_State *L, int idx, const char *key) {
    if (!lua_istable(L, idx)) { lua_pushnil(L); return LUA_TNIL; }
    return lua_getfield(L, idx, key);
}

int ks_lp_opt_bool(lua_State *L, int idx, const char *key, int def, const char *fn) {
    int t = ks_lp_opt_get(L, idx, key);
    int v = def;
    if (t == LUA_TBOOLEAN) v = lua_toboolean(L, -1);
    else if (t != LUA_TNIL) ks_lua_errorf(L, fn, "option %s must be a boolean, got %s", key, luaL_typename(L, -1));
    lua_pop(L, 1);
    return v;
}

const char *ks_lp_opt_str(lua_State *L, int idx, const char *key, const char *def, const char *fn) {
    int t = ks_lp_opt_get(L, idx, key);
    const char *v = def;
    if (t == LUA_TSTRING) v = lua_tostring(L, -1); /* stays alive: it is in the options table */
    else if (t != LUA_TNIL) ks_lua_errorf(L, fn, "option %s must be a string, got %s", key, luaL_typename(L, -1));
    lua_pop(L, 1);
    return v;
}

int ks_lp_opt_range(lua_State *L, int idx, const char *key, int64_t n, int64_t *b, int64_t *e, const char *fn) {
    int rel;
    return ks_lp_opt_range_rel(L, idx, key, n, b, e, &rel, fn);
}

int ks_lp_opt_range_rel(lua_State *L, int idx, const char *key, int64_t n, int64_t *b, int64_t *e, int *rel,
                        const char *fn) {
    *rel = 0;
    int t = ks_lp_opt_get(L, idx, key);
    if (t == LUA_TNIL) { lua_pop(L, 1); return 0; }
    if (t != LUA_TTABLE || lua_rawlen(L, -1) != 2) ks_lua_errorf(L, fn, "option %s must be {begin, end}", key);
    lua_rawgeti(L, -1, 1);
    lua_rawgeti(L, -2, 2);
    if (!lua_isinteger(L, -2) || !lua_isinteger(L, -1)) ks_lua_errorf(L, fn, "option %s must hold two integers", key);
    *b = lua_tointeger(L, -2);
    *e = lua_tointeger(L, -1);
    *rel = (*b < 0) | (*e < 0) << 1;
    if (*b < 0) *b += n;
    if (*e < 0) *e += n;
    lua_pop(L, 3);
    if (*b < 0 || *e > n || *b > *e)
        ks_lua_errorf(L, fn, "option %s = {%lld, %lld} is not within [0, %lld]", key, (long long)*b, (long long)*e, (long long)n);
    return 1;
}

/* ================================================================ placement (host or device) */

ks_backend *ks_lp_where(ks_tensor *const *ts, int n) {
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

ks_tensor *ks_lp_arg(lua_State *L, int arg, ks_tdtype dt, const char *fn, int *slot) {
    ks_tensor *t = ks_lt_arg(L, arg, dt, fn);
    *slot = lua_gettop(L);
    return t;
}

const void *ks_lp_data(lua_State *L, int slot, ks_tensor *t, ks_backend *be) {
    int pushed;
    return ks_lt_on(L, slot, t, be, &pushed);
}

ks_tensor *ks_lp_out(lua_State *L, ks_backend *be, ks_tdtype dt, int ndim, const int64_t *shape) {
    return be ? ks_lt_dnew(L, be, dt, ndim, shape) : ks_lt_new(L, dt, ndim, shape, 0);
}

ks_tensor *ks_lp_out_grow(lua_State *L, ks_backend *be, ks_tdtype dt, int ndim, const int64_t *shape, int64_t grow) {
    if (grow <= 0 || !be || ndim < 1) return ks_lp_out(L, be, dt, ndim, shape);
    int64_t big[KS_TENSOR_MAXDIM];
    memcpy(big, shape, sizeof(int64_t) * (size_t)ndim);
    big[ndim - 1] += grow; /* (rows, cols + grow): a replay's (rows, cols + delta) fits */
    ks_tensor *t = ks_lt_dnew(L, be, dt, ndim, big);
    int64_t st = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        t->shape[i] = shape[i];
        t->stride[i] = st;
        st *= shape[i] ? shape[i] : 1;
    }
    t->numel = 1;
    for (int i = 0; i < ndim; i++) t->numel *= shape[i];
    t->grow = grow;
    return t;
}

void *ks_lp_word(lua_State *L, ks_backend *be, void *host, int set) {
    if (!be) return host;
    int64_t two = 2;
    ks_tensor *w = ks_lt_dnew(L, be, KS_T_F32, 1, &two); /* 8 bytes */
    if (set) {
        ks_status st = be->upload(be, w->data, host, 8);
        if (st) ks_lua_core_error(L, "upload", st);
    }
    return w->data;
}

void ks_lp_get(lua_State *L, ks_backend *be, void *dst, const void *src, size_t n) {
    if (be) ks_lt_download(L, be, dst, src, n);
    else if (n) memcpy(dst, src, n);
}

static float get_f32(lua_State *L, ks_backend *be, const void *p) {
    float v;
    ks_lp_get(L, be, &v, p, sizeof v);
    return v;
}
static int64_t get_i64(lua_State *L, ks_backend *be, const void *p) {
    int64_t v;
    ks_lp_get(L, be, &v, p, sizeof v);
    return v;
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
    ks_tensor *t = ks_lp_arg(L, 1, KS_T_F32, fn, &sx);
    lua_Integer kernel = luaL_checkinteger(L, 2);
    const char *mode = luaL_optstring(L, 3, "avg");
    ks_pool_mode pm;
    if (!strcmp(mode, "avg")) pm = KS_POOL_AVG;
    else if (!strcmp(mode, "max")) pm = KS_POOL_MAX;
    else return ks_lua_errorf(L, fn, "mode must be \"avg\" or \"max\", got \"%s\"", mode);
    int64_t rows = 0, n = 0;
    rows_cols(L, t, &rows, &n, fn);
    ks_backend *be = ks_lp_where(&t, 1);
    const float *x = ks_lp_data(L, sx, t, be);
    ks_tensor *o = ks_lp_out(L, be, KS_T_F32, t->ndim, t->shape);
    KS_LP_PRIM(fn, be, pool1d, x, rows, n, kernel, pm, o->data);
    return 1;
}

static int l_topk(lua_State *L) {
    lua_settop(L, 3);
    const char *fn = "topk";
    static const char *const allowed[] = {"sorted", "values", "base", "skip", NULL};
    int sx, values = 1;
    const float *skip = NULL;
    lua_Integer base = 0;
    ks_tensor *t = ks_lp_arg(L, 1, KS_T_F32, fn, &sx);
    lua_Integer k = luaL_checkinteger(L, 2);
    ks_topk_order order = KS_TOPK_BY_INDEX;
    const char *s = NULL;
    if (lua_type(L, 3) == LUA_TSTRING) s = lua_tostring(L, 3);
    else {
        ks_lp_check_opts(L, 3, fn, allowed);
        s = ks_lp_opt_str(L, 3, "sorted", "index", fn);
        values = ks_lp_opt_bool(L, 3, "values", 1, fn);
        int bt = ks_lp_opt_get(L, 3, "base");
        if (bt != LUA_TNIL && !lua_isinteger(L, -1))
            return ks_lua_errorf(L, fn, "option base must be an integer, got %s", luaL_typename(L, -1));
        if (bt != LUA_TNIL) base = lua_tointeger(L, -1);
        lua_pop(L, 1);
    }
    if (!strcmp(s, "value")) order = KS_TOPK_BY_VALUE;
    else if (strcmp(s, "index")) return ks_lua_errorf(L, fn, "sorted must be \"index\" or \"value\", got \"%s\"", s);
    int64_t rows = 0, n = 0;
    rows_cols(L, t, &rows, &n, fn);
    if (k < 0 || k > n) return ks_lua_errorf(L, fn, "k = %lld > n = %lld", (long long)k, (long long)n);
    if (base < 0 || base > (lua_Integer)INT32_MAX + 1 - n)
        return ks_lua_errorf(L, fn, "base %lld + n %lld leaves the int32 index range", (long long)base, (long long)n);
    ks_backend *be = ks_lp_where(&t, 1);
    const float *x = ks_lp_data(L, sx, t, be);
    if (lua_istable(L, 3) && ks_lp_opt_get(L, 3, "skip") != LUA_TNIL) { /* stays on the stack until we return */
        int ms;
        ks_tensor *tm = ks_lp_arg(L, lua_gettop(L), KS_T_F32, fn, &ms);
        if (tm->numel != 1)
            return ks_lua_errorf(L, fn, "option skip: a mask of one value (ks.ge's), got %lld values", (long long)tm->numel);
        skip = ks_lp_data(L, ms, tm, be);
    }
    if (t->grow && (be != t->be || rows != 1 || !ks_lt_is_contig(t)))
        return ks_lua_errorf(L, fn, "a row that follows the layer's rows (a recorded handler's) must be one contiguous "
                             "row where it is");
    int64_t sh[2] = {rows, k};
    ks_tensor *idx = t->ndim == 1 ? ks_lp_out(L, be, KS_T_I32, 1, &sh[1]) : ks_lp_out(L, be, KS_T_I32, 2, sh);
    ks_tensor *val = !values ? NULL : t->ndim == 1 ? ks_lp_out(L, be, KS_T_F32, 1, &sh[1]) : ks_lp_out(L, be, KS_T_F32, 2, sh);
    KS_LP_PRIM(fn, be, topk, x, rows, n, k, base, order, idx->data, val ? val->data : NULL, skip, t->grow);
    if (order == KS_TOPK_BY_INDEX) /* each row ascending, unique, in [base, base + n) (skipped: base ..) */
        ks_lt_mark_sorted(L, values ? -2 : -1, base, base + n);
    return values ? 2 : 1;
}

static int one_d(lua_State *L, const ks_tensor *t, const char *fn) {
    if (t->ndim != 1) return ks_lua_errorf(L, fn, "x must be 1-d, got %d dimensions", t->ndim);
    return 0;
}

static int opt_descending(lua_State *L, int idx, const char *fn) {
    static const char *const allowed[] = {"descending", NULL};
    ks_lp_check_opts(L, idx, fn, allowed);
    return ks_lp_opt_bool(L, idx, "descending", 0, fn);
}

static int l_sort(lua_State *L) {
    lua_settop(L, 2);
    const char *fn = "sort";
    int desc = opt_descending(L, 2, fn);
    ks_tensor *t0 = ks_lt_arg(L, 1, KS_T_ANY, fn); /* a table of integers sorts as integers */
    lua_replace(L, 1);
    int sx;
    if (t0->dtype == KS_T_I32) {
        ks_tensor *t = ks_lp_arg(L, 1, KS_T_I32, fn, &sx);
        one_d(L, t, fn);
        ks_backend *be = ks_lp_where(&t, 1);
        const int32_t *x = ks_lp_data(L, sx, t, be);
        ks_tensor *o = ks_lp_out(L, be, KS_T_I32, 1, t->shape);
        KS_LP_PRIM(fn, be, sort_i32, x, t->numel, o->data);
        if (desc) { /* reversed where it is: a gather with n-1, ..., 0 */
            int64_t n = t->numel;
            ks_tensor *rev = ks_lp_out(L, be, KS_T_I32, 1, &n);
            ks_tensor *r = ks_lp_out(L, be, KS_T_I32, 1, &n);
            KS_LP_PRIM(fn, be, arange, n - 1, -1, -1, rev->data);
            KS_LP_PRIM(fn, be, gather_i32, o->data, n, rev->data, n, r->data, NULL);
        }
        return 1;
    }
    ks_tensor *t = ks_lp_arg(L, 1, KS_T_F32, fn, &sx);
    one_d(L, t, fn);
    ks_backend *be = ks_lp_where(&t, 1);
    const float *x = ks_lp_data(L, sx, t, be);
    ks_tensor *o = ks_lp_out(L, be, KS_T_F32, 1, t->shape);
    KS_LP_PRIM(fn, be, sort_f32, x, t->numel, desc, o->data);
    return 1;
}

static int l_argsort(lua_State *L) {
    lua_settop(L, 2);
    const char *fn = "argsort";
    int desc = opt_descending(L, 2, fn);
    int sx;
    ks_tensor *t = ks_lp_arg(L, 1, KS_T_F32, fn, &sx);
    one_d(L, t, fn);
    ks_backend *be = ks_lp_where(&t, 1);
    const float *x = ks_lp_data(L, sx, t, be);
    ks_tensor *o = ks_lp_out(L, be, KS_T_I32, 1, t->shape);
    KS_LP_PRIM(fn, be, argsort, x, t->numel, desc, o->data);
    return 1;
}

static int l_rank(lua_State *L) {
    lua_settop(L, 1);
    const char *fn = "rank";
    int sx;
    ks_tensor *t = ks_lp_arg(L, 1, KS_T_F32, fn, &sx);
    one_d(L, t, fn);
    ks_backend *be = ks_lp_where(&t, 1);
    const float *x = ks_lp_data(L, sx, t, be);
    ks_tensor *o = ks_lp_out(L, be, KS_T_I32, 1, t->shape);
    KS_LP_PRIM(fn, be, rank, x, t->numel, o->data);
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
    ks_tensor *t = ks_lp_arg(L, 1, KS_T_I32, fn, &sx);
    one_d(L, t, fn);
    ks_backend *be = ks_lp_where(&t, 1);
    const int32_t *x = ks_lp_data(L, sx, t, be);
    ks_tensor *o = ks_lp_out(L, be, KS_T_I32, 1, t->shape);
    int oslot = lua_gettop(L);
    int64_t n = 0, *cnt = ks_lp_word(L, be, &n, 0);
    KS_LP_PRIM(fn, be, unique, x, t->numel, o->data, cnt);
    n = get_i64(L, be, cnt);
    lua_settop(L, oslot);
    shrink_1d(L, o, n);
    return 1;
}

/* union(a, b): the sorted set of values in a or b (inputs in any order). */
static int l_union(lua_State *L) {
    lua_settop(L, 2);
    const char *fn = "union";
    int sa, sb;
    ks_tensor *ta = ks_lp_arg(L, 1, KS_T_I32, fn, &sa);
    ks_tensor *tb = ks_lp_arg(L, 2, KS_T_I32, fn, &sb);
    one_d(L, ta, fn);
    one_d(L, tb, fn);
    ks_tensor *ts[2] = {ta, tb};
    ks_backend *be = ks_lp_where(ts, 2);
    const int32_t *a = ks_lp_data(L, sa, ta, be);
    const int32_t *b = ks_lp_data(L, sb, tb, be);
    int64_t sh[1] = {ta->numel + tb->numel};
    ks_tensor *o = ks_lp_out(L, be, KS_T_I32, 1, sh);
    int oslot = lua_gettop(L);
    int64_t n = 0, *cnt = ks_lp_word(L, be, &n, 0);
    KS_LP_PRIM(fn, be, union_, a, ta->numel, b, tb->numel, o->data, cnt); /* any order, on every backend */
    n = get_i64(L, be, cnt);
    lua_settop(L, oslot);
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
    /* on the device when any piece is there: a host piece goes up without waiting, a device
     * piece would come down with a sync (TokenSelect: arange ++ device top-k ++ arange) */
    ks_backend *be = ks_lp_where(ts, nargs);
    for (int i = 0; !be && i < nargs; i++)
        if (ts[i]->be && ts[i]->be->prims && !ts[i]->bf16) be = ts[i]->be;
    ks_tensor *o = ks_lp_out(L, be, dt, 1, &total);
    int oslot = lua_gettop(L);
    int64_t at = 0;
    for (int i = 1; i <= nargs; i++) {
        ks_tensor *t = ts[i - 1];
        if (t->numel == 0) continue; /* nothing to copy, and its data may be NULL */
        int64_t alo, ahi;
        if (be && !t->be && ks_lt_sorted(L, i, &alo, &ahi) && ahi - alo == t->numel) {
            /* a host arange (marked, as many entries as its range): made on the device, no upload
             * (the backend's upload waits for the stream) */
            ks_status st = be->prims->arange(be, alo, ahi, 1, (int32_t *)((char *)o->data + at * 4));
            if (st) return ks_lua_core_error(L, fn, st);
            at += t->numel;
            continue;
        }
        const void *d = ks_lp_data(L, nargs + i, t, be);
        if (be) {
            ks_status st = be->copy(be, (char *)o->data + at * 4, d, (size_t)t->numel * 4);
            if (st) return ks_lua_core_error(L, fn, st);
        } else memcpy((char *)o->data + at * 4, d, (size_t)t->numel * 4);
        lua_settop(L, oslot);
        at += t->numel;
    }
    /* marked pieces in increasing, disjoint ranges make a marked whole (arange ++ topk ++ arange) */
    int64_t lo = 0, hi = 0, plo, phi;
    int ok = dt == KS_T_I32, any = 0;
    for (int i = 1; ok && i <= nargs; i++) {
        if (ts[i - 1]->numel == 0) continue;
        ok = ks_lt_sorted(L, i, &plo, &phi) && ts[i - 1]->ndim == 1 && (!any || hi <= plo);
        if (!any) lo = plo;
        hi = phi;
        any = 1;
    }
    if (ok && any) ks_lt_mark_sorted(L, oslot, lo, hi);
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
    KS_LP_PRIM(fn, NULL, arange, a, b, s, o->data);
    if (s > 0 && n > 0) ks_lt_mark_sorted(L, -1, a, a + (n - 1) * s + 1);
    return 1;
}

/* gather(x, idx): rows idx of x (n, ...) -> (k, ...); indices may repeat. */
static int l_gather(lua_State *L) {
    lua_settop(L, 2);
    const char *fn = "gather";
    ks_tensor *x = ks_lt_check(L, 1, fn);
    int si;
    ks_tensor *ti = ks_lp_arg(L, 2, KS_T_I32, fn, &si);
    if (ti->ndim != 1) return ks_lua_errorf(L, fn, "idx must be 1-d");
    if (x->ndim < 1) return ks_lua_errorf(L, fn, "x must have at least one dimension");
    ks_tensor *ts[2] = {x, ti};
    ks_backend *be = ks_lp_where(ts, 2);
    const void *xd = ks_lp_data(L, 1, x, be);
    const int32_t *idx = ks_lp_data(L, si, ti, be);
    int64_t n = x->shape[0], d = n ? x->numel / n : 0;
    int64_t shape[KS_TENSOR_MAXDIM];
    memcpy(shape, x->shape, sizeof shape);
    shape[0] = ti->numel;
    ks_tensor *o = ks_lp_out(L, be, x->dtype, x->ndim, shape);
    int oslot = lua_gettop(L);
    /* rows of 32-bit words: the f32 gather moves i32 rows bit for bit; a bad index is reported
     * through the error word (set to -1 first) */
    int64_t bad = -1, *err = ks_lp_word(L, be, &bad, 1);
    if (x->dtype == KS_T_I32 && d == 1) KS_LP_PRIM(fn, be, gather_i32, xd, n, idx, ti->numel, o->data, err);
    else KS_LP_PRIM(fn, be, gather, xd, n, d, idx, ti->numel, o->data, err);
    bad = get_i64(L, be, err);
    if (bad >= 0) {
        int32_t v;
        ks_lp_get(L, be, &v, idx + bad, sizeof v);
        return ks_lua_errorf(L, fn, "index %d at position %lld out of range [0, %lld)", v, (long long)bad, (long long)n);
    }
    lua_settop(L, oslot);
    return 1;
}

/* ================================================================ small numerics */

static int l_softmax(lua_State *L) {
    lua_settop(L, 1);
    const char *fn = "softmax";
    int sx;
    ks_tensor *t = ks_lp_arg(L, 1, KS_T_F32, fn, &sx);
    if (t->ndim < 1) return ks_lua_errorf(L, fn, "x must have at least one dimension");
    int64_t n = t->shape[t->ndim - 1], rows = n ? t->numel / n : 0;
    ks_backend *be = ks_lp_where(&t, 1);
    const float *x = ks_lp_data(L, sx, t, be);
    ks_tensor *o = ks_lp_out(L, be, KS_T_F32, t->ndim, t->shape);
    KS_LP_PRIM(fn, be, softmax, x, rows, n, o->data);
    return 1;
}

typedef enum { R_SUM, R_MEAN, R_VAR } red_kind;

static ks_status red_call(ks_backend *be, red_kind kind, const float *x, int64_t rows, int64_t cols, int axis, int64_t ddof,
                          float *out) {
    const ks_backend_prims *P = ks_lp_prims(be);
    if (kind == R_SUM) return P->sum(be, x, rows, cols, axis, out);
    if (kind == R_MEAN) return P->mean(be, x, rows, cols, axis, out);
    return P->var(be, x, rows, cols, axis, ddof, out);
}

/* sum/mean/var over one axis (0-based, negative from the end) or over everything. A
 * 0-d result is returned as a number. */
static int reduce(lua_State *L, red_kind kind, const char *fn) {
    lua_settop(L, 3);
    int sx;
    ks_tensor *t = ks_lp_arg(L, 1, KS_T_F32, fn, &sx);
    int64_t ddof = 0;
    if (kind == R_VAR) {
        static const char *const allowed[] = {"ddof", NULL};
        ks_lp_check_opts(L, 3, fn, allowed);
        if (ks_lp_opt_get(L, 3, "ddof") != LUA_TNIL) ddof = luaL_checkinteger(L, -1);
        lua_pop(L, 1);
    }
    ks_backend *be = ks_lp_where(&t, 1);
    if (lua_isnoneornil(L, 2) || t->ndim <= 1) {
        if (!lua_isnoneornil(L, 2)) {
            lua_Integer a = luaL_checkinteger(L, 2);
            if (a != 0 && a != -1) return ks_lua_errorf(L, fn, "axis %lld out of range for a %d-d tensor", (long long)a, t->ndim);
        }
        const float *x = ks_lp_data(L, sx, t, be);
        float r = 0, *o = ks_lp_word(L, be, &r, 0);
        KS_LP_CORE(fn, red_call(be, kind, x, 1, t->numel, 1, ddof, o));
        lua_pushnumber(L, get_f32(L, be, o));
        return 1;
    }
    lua_Integer a = luaL_checkinteger(L, 2);
    if (a < 0) a += t->ndim;
    if (a < 0 || a >= t->ndim) return ks_lua_errorf(L, fn, "axis %lld out of range for a %d-d tensor", (long long)lua_tointeger(L, 2), t->ndim);
    const float *x = ks_lp_data(L, sx, t, be);
    int64_t outer = 1, inner = 1, mid = t->shape[a];
    for (int i = 0; i < a; i++) outer *= t->shape[i];
    for (int i = (int)a + 1; i < t->ndim; i++) inner *= t->shape[i];
    int64_t shape[KS_TENSOR_MAXDIM];
    int nd = 0;
    for (int i = 0; i < t->ndim; i++)
        if (i != a) shape[nd++] = t->shape[i];
    ks_tensor *o = ks_lp_out(L, be, KS_T_F32, nd, shape);
    /* one (mid, inner) block per outer index (device: pointer offsets, one launch each) */
    for (int64_t i = 0; i < outer; i++) {
        /* an empty tensor's data may be NULL: no offset from it (UBSan, found by fuzz_lua_prims) */
        const float *xi = x ? x + i * mid * inner : x;
        float *oi = o->data ? (float *)o->data + i * inner : (float *)o->data;
        KS_LP_CORE(fn, red_call(be, kind, xi, mid, inner, 0, ddof, oi));
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
    ks_tensor *ta = ks_lp_arg(L, 1, KS_T_F32, fn, &sa);
    ks_tensor *tb = ks_lp_arg(L, 2, KS_T_F32, fn, &sb);
    if (ta->ndim != tb->ndim || memcmp(ta->shape, tb->shape, sizeof(int64_t) * ta->ndim))
        return ks_lua_errorf(L, fn, "a and b differ in shape");
    if (ta->ndim > 2) return ks_lua_errorf(L, fn, "a and b must be (d) or (rows, d)");
    ks_tensor *ts[2] = {ta, tb};
    ks_backend *be = ks_lp_where(ts, 2);
    const float *a = ks_lp_data(L, sa, ta, be);
    const float *b = ks_lp_data(L, sb, tb, be);
    if (ta->ndim <= 1) {
        float r = 0, *o = ks_lp_word(L, be, &r, 0);
        KS_LP_PRIM(fn, be, cosine, a, b, ta->numel, o);
        lua_pushnumber(L, get_f32(L, be, o));
        return 1;
    }
    ks_tensor *o = ks_lp_out(L, be, KS_T_F32, 1, ta->shape);
    KS_LP_PRIM(fn, be, cosine_rows, a, b, ta->shape[0], ta->shape[1], o->data);
    return 1;
}

/* ks.ge(x, v): the f32 mask of x's shape, 1 where x >= v (the float widened to double: the
 * comparison Lua makes of the same value), else 0, made where x is (a device decision stays
 * there: no sync). */
static int l_ge(lua_State *L) {
    lua_settop(L, 2);
    const char *fn = "ge";
    int sx;
    ks_tensor *t = ks_lp_arg(L, 1, KS_T_F32, fn, &sx);
    if (lua_type(L, 2) != LUA_TNUMBER) return ks_lua_errorf(L, fn, "v must be a number, got %s", luaL_typename(L, 2));
    const double v = lua_tonumber(L, 2);
    ks_backend *be = ks_lp_where(&t, 1);
    const float *x = ks_lp_data(L, sx, t, be);
    ks_tensor *o = ks_lp_out(L, be, KS_T_F32, t->ndim, t->shape);
    KS_LP_PRIM(fn, be, ge, x, t->numel, v, o->data);
    return 1;
}

/* opts.into of the options table at idx (nil or absent: NULL): the tensor a result of dtype dt and
 * n elements is written into instead of a new one, in place. It must own its memory (not a
 * view: an engine buffer is never written), hold dtype dt and n elements, and the work runs
 * where it is; it is then written in place for good (ks_tensor.mut), its mark dropped. Pushed,
 * its stack slot in *slot. */
static ks_tensor *opt_into(lua_State *L, int idx, ks_tdtype dt, int64_t n, const char *fn, int *slot) {
    if (lua_isnoneornil(L, idx)) return NULL;
    if (ks_lp_opt_get(L, idx, "into") == LUA_TNIL) { lua_pop(L, 1); return NULL; }
    ks_tensor *t = ks_lt_test(L, -1);
    if (!t) {
        ks_lua_errorf(L, fn, "option into must be a tensor, got %s", luaL_typename(L, -1));
        return NULL;
    }
    *slot = lua_gettop(L);
    if (t->closed) ks_lua_errorf(L, fn, "option into: tensor used after it was closed");
    if (t->lost) ks_lua_errorf(L, fn, "option into: device tensor lost: the handler that made it failed");
    if (t->grow) ks_lua_errorf(L, fn, "option into follows the layer's rows in a recorded handler: only ks.scores and ks.topk write it");
    if (!ks_lt_owned(t))
        ks_lua_errorf(L, fn, "option into must own its memory (a result of a primitive, ks.tensor or :clone()), not a view");
    if (t->dtype != dt || t->numel != n)
        ks_lua_errorf(L, fn, "option into holds %lld %s elements; the result is %lld %s elements", (long long)t->numel,
                      t->dtype == KS_T_I32 ? "i32" : "f32", (long long)n, dt == KS_T_I32 ? "i32" : "f32");
    return t;
}

/* Before a write into the tensor at slot: written in place for good (even if the write fails
 * half way), its mark dropped. */
static void into_written(lua_State *L, int slot, ks_tensor *t) {
    t->mut = 1;
    ks_lt_unmark(L, slot);
}

/* ks.where(mask, a, b [, {into = t}]): a where the mask is nonzero, else b; a and b tensors of
 * one dtype (i32 or f32) and shape, the mask f32 with one value (the whole of a or of b) or one
 * per element. Runs where the data is (where `into` is, when given: the result is written there
 * and `into` returned; it may be a or b). With one mask value and both lists valid by
 * construction (topk, arange, ...), the result is too, over both ranges. */
static int l_where(lua_State *L) {
    lua_settop(L, 4);
    const char *fn = "where";
    static const char *const allowed[] = {"into", NULL};
    ks_lp_check_opts(L, 4, fn, allowed);
    int sm, si = 0;
    ks_tensor *tm = ks_lp_arg(L, 1, KS_T_F32, fn, &sm);
    ks_tensor *ta = ks_lt_check(L, 2, fn), *tb = ks_lt_check(L, 3, fn);
    if (ta->dtype != tb->dtype || (ta->dtype != KS_T_F32 && ta->dtype != KS_T_I32))
        return ks_lua_errorf(L, fn, "a and b must be two f32 or two i32 tensors");
    if (ta->bf16 || tb->bf16) return ks_lua_errorf(L, fn, "a and b cannot be bf16 views");
    if (ta->ndim != tb->ndim || memcmp(ta->shape, tb->shape, sizeof(int64_t) * ta->ndim))
        return ks_lua_errorf(L, fn, "a and b differ in shape");
    if (tm->numel != 1 && tm->numel != ta->numel)
        return ks_lua_errorf(L, fn, "the mask has %lld values for %lld elements (want 1 or %lld)", (long long)tm->numel,
                             (long long)ta->numel, (long long)ta->numel);
    ks_tensor *into = opt_into(L, 4, ta->dtype, ta->numel, fn, &si);
    int64_t alo, ahi, blo, bhi;
    const int marked = tm->numel == 1 && ks_lt_sorted(L, 2, &alo, &ahi) && ks_lt_sorted(L, 3, &blo, &bhi);
    ks_tensor *ts[3] = {tm, ta, tb};
    ks_backend *be = into ? into->be : ks_lp_where(ts, 3);
    const float *m = ks_lp_data(L, sm, tm, be);
    const void *a = ks_lp_data(L, 2, ta, be);
    const void *b = ks_lp_data(L, 3, tb, be);
    ks_tensor *o = into;
    if (into) {
        lua_pushvalue(L, si);
        into_written(L, -1, into);
    } else o = ks_lp_out(L, be, ta->dtype, ta->ndim, ta->shape);
    KS_LP_PRIM(fn, be, where, m, tm->numel, a, b, ta->numel, o->data);
    if (marked) ks_lt_mark_sorted(L, -1, KS_MIN(alo, blo), KS_MAX(ahi, bhi));
    return 1;
}

/* ks.add(a, b [, {into = t}]): a + b of two f32 tensors of one shape, each element rounded once
 * from the double sum (the float `a + b` gives); with `into`, written there where it is (it may
 * be a or b) and returned. On a device: the column sums of [a; b] (concat, then sum over axis 0
 * in double: the same float), nothing read back. */
static int l_add(lua_State *L) {
    lua_settop(L, 3);
    const char *fn = "add";
    static const char *const allowed[] = {"into", NULL};
    ks_lp_check_opts(L, 3, fn, allowed);
    int sa, sb, si = 0;
    ks_tensor *ta = ks_lp_arg(L, 1, KS_T_F32, fn, &sa), *tb = ks_lp_arg(L, 2, KS_T_F32, fn, &sb);
    if (ta->ndim != tb->ndim || memcmp(ta->shape, tb->shape, sizeof(int64_t) * ta->ndim))
        return ks_lua_errorf(L, fn, "a and b differ in shape");
    ks_tensor *into = opt_into(L, 3, KS_T_F32, ta->numel, fn, &si);
    ks_tensor *ts[2] = {ta, tb};
    ks_backend *be = into ? into->be : ks_lp_where(ts, 2);
    const float *a = ks_lp_data(L, sa, ta, be);
    const float *b = ks_lp_data(L, sb, tb, be);
    const int64_t two = 2 * ta->numel;
    float *tmp = NULL;
    if (be) tmp = ks_lt_dnew(L, be, KS_T_F32, 1, &two)->data;
    ks_tensor *o = into;
    if (into) {
        lua_pushvalue(L, si);
        into_written(L, -1, into);
    } else o = ks_lp_out(L, be, KS_T_F32, ta->ndim, ta->shape);
    if (be) {
        KS_LP_CORE(fn, be->prims->concat_f32(be, a, ta->numel, b, tb->numel, tmp));
        KS_LP_CORE(fn, be->prims->sum(be, tmp, 2, ta->numel, 0, o->data));
    } else {
        float *y = o->data;
        for (int64_t i = 0; i < ta->numel; i++) y[i] = (float)((double)a[i] + (double)b[i]);
    }
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
        KS_LP_CORE("_upload", be->copy(be, o->data, d, (size_t)t->numel * 4));
    }
    return 1;
}

/* ================================================================ the registry */

/* primitive registry */
/* Every native primitive of the module, by its Lua name: ks_prims_open adds them to the module
 * table (the `kvsieve` module and every policy sandbox). A new primitive is one line here. */
static const luaL_Reg prims_registry[] = {
    {"scores", ks_lp_scores},
    {"pool1d", l_pool1d},
    {"topk", l_topk},
    {"sort", l_sort},
    {"argsort", l_argsort},
    {"rank", l_rank},
    {"unique", l_unique},
    {"union", l_union},
    {"concat", l_concat},
    {"arange", l_arange},
    {"gather", l_gather},
    {"softmax", l_softmax},
    {"sum", l_sum},
    {"mean", l_mean},
    {"var", l_var},
    {"cosine", l_cosine},
    {"ge", l_ge},
    {"where", l_where},
    {"add", l_add},
    {"page_reduce", ks_lp_page_reduce}, /* lua/prims_page.c */
    {"bound_scores", ks_lp_bound_scores},
    {"page_rows", ks_lp_page_rows},
    {"rope", ks_lp_rope},
    {"_upload", l_upload},
    {NULL, NULL},
};

void ks_prims_open(lua_State *L) { luaL_setfuncs(L, prims_registry, 0); }
