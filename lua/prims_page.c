/* prims_page.c — the page primitives of the `kvsieve` module (core/prims_page.h; docs/lua.md,
 * "Page primitives"):
 *
 *   ks.page_reduce(x, page, op [, opts])   x (n, d) or (n, h, d) -> per-page min / max / mean, or
 *                                          packed bf16 boxes (op "box": one i32 word a channel)
 *   ks.bound_scores(q, lo, hi [, opts])    upper bounds of q.k over boxes, per head or group
 *   ks.bound_scores(q, box [, opts])       the same over packed boxes
 *   ks.page_rows(pages, page, n [, opts])  page ids -> ascending row lists (+ fixed ranges)
 *
 * Placement (lua/prims_impl.h): one dispatch, as for every primitive: a call runs where
 * ks_lp_where puts it, through that backend's table (the CPU backend's for the host, which runs
 * core/prims_page.c; the CUDA backend's; the emulated device's). page_reduce
 * reads a strided or bf16 view (ev:kv_keys(): the KV cache itself) in place on either side, so
 * summarising a layer's keys costs one read of them and no copy. Errors name the primitive and
 * the event, as everywhere in the module. */
#include "prims_page_lua.h"

#include "ks_lua.h"
#include "prims_impl.h"
#include "tensor_impl.h"

#include "backend.h"
#include "prims_page.h"

#include <lauxlib.h>
#include <stdint.h>
#include <string.h>

/* A {begin, end} option at opts[key]; negative values count from n; checked within [0, n]. */
static int range_opt(lua_State *L, int opts, const char *key, int64_t n, int64_t *b, int64_t *e, const char *fn) {
    if (!lua_istable(L, opts)) return 0;
    int t = lua_getfield(L, opts, key);
    if (t == LUA_TNIL) { lua_pop(L, 1); return 0; }
    if (t != LUA_TTABLE || lua_rawlen(L, -1) != 2) return ks_lua_errorf(L, fn, "option %s must be {begin, end}", key);
    lua_rawgeti(L, -1, 1);
    lua_rawgeti(L, -2, 2);
    if (!lua_isinteger(L, -2) || !lua_isinteger(L, -1)) return ks_lua_errorf(L, fn, "option %s must hold two integers", key);
    *b = lua_tointeger(L, -2);
    *e = lua_tointeger(L, -1);
    lua_pop(L, 3);
    if (*b < 0) *b += n;
    if (*e < 0) *e += n;
    if (*b < 0 || *e > n || *b > *e)
        return ks_lua_errorf(L, fn, "option %s = {%lld, %lld} is not within [0, %lld]", key, (long long)*b, (long long)*e,
                             (long long)n);
    return 1;
}

/* Raise unless every key of the options table at idx is in allowed (NULL-terminated). */
static void only_opts(lua_State *L, int idx, const char *fn, const char *const *allowed, const char *list) {
    if (lua_isnoneornil(L, idx)) return;
    if (!lua_istable(L, idx)) ks_lua_errorf(L, fn, "options must be a table, got %s", luaL_typename(L, idx));
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        lua_pop(L, 1);
        int ok = 0;
        if (lua_type(L, -1) == LUA_TSTRING)
            for (int i = 0; allowed[i]; i++)
                if (!strcmp(lua_tostring(L, -1), allowed[i])) ok = 1;
        if (!ok)
            ks_lua_errorf(L, fn, "unknown option '%s' (options: %s)",
                          lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : luaL_typename(L, -1), list);
    }
}

#define CORE(fn, call)                                                                                               \
    do {                                                                                                             \
        ks_status st_ = (call);                                                                                      \
        if (st_) return ks_lua_core_error(L, fn, st_);                                                               \
    } while (0)

/* ================================================================ page_reduce */

/* ks.page_reduce(x, page, op [, {pages = {b, e}}]): x f32 (n, d) or (n, h, d); op "min", "max",
 * "mean" or "minmax" (two results: min, max, from one read), or "box" (one i32 result: each
 * channel's min rounded down and max rounded up to bf16, packed min | max << 16; exact for a
 * bf16 view such as the CUDA KV cache; core/prims_page.h, ks_cpu_page_box). Results
 * (p1 - p0, [h,] d). */
int ks_lp_page_reduce(lua_State *L) {
    const char *fn = "page_reduce";
    lua_settop(L, 4);
    ks_tensor *x = ks_lt_check(L, 1, fn);
    lua_Integer page = luaL_checkinteger(L, 2);
    const char *op = luaL_checkstring(L, 3);
    static const char *const allowed[] = {"pages", NULL};
    only_opts(L, 4, fn, allowed, "pages");
    int want_min = 0, want_max = 0, want_mean = 0, want_box = 0;
    if (!strcmp(op, "box")) want_box = 1;
    else if (!strcmp(op, "min")) want_min = 1;
    else if (!strcmp(op, "max")) want_max = 1;
    else if (!strcmp(op, "mean")) want_mean = 1;
    else if (!strcmp(op, "minmax")) want_min = want_max = 1;
    else return ks_lua_errorf(L, fn, "op must be \"min\", \"max\", \"mean\", \"minmax\" or \"box\", got \"%s\"", op);
    if (x->dtype != KS_T_F32) return ks_lua_errorf(L, fn, "x must be an f32 tensor");
    if (x->ndim != 2 && x->ndim != 3)
        return ks_lua_errorf(L, fn, "x must be (n, d) or (n, heads, d), got %d dimensions", x->ndim);
    if (page < 1) return ks_lua_errorf(L, fn, "page = %lld must be >= 1", (long long)page);
    int64_t n = x->shape[0], h = x->ndim == 3 ? x->shape[1] : 1, d = x->shape[x->ndim - 1];
    int64_t np = ks_page_count(n, page), p0 = 0, p1 = np;
    range_opt(L, 4, "pages", np, &p0, &p1, fn);

    ks_backend *be = ks_lp_where(&x, 1);
    const ks_backend_prims *tab = ks_lp_prims(be);
    const void *data = x->data;
    int bf16 = x->bf16;
    int64_t rs = x->stride[0], hs = x->ndim == 3 ? x->stride[1] : 0;
    /* in place on its own side when the channels are contiguous; else a contiguous copy there */
    if ((be ? x->be != be : x->be != NULL) || (d > 1 && x->stride[x->ndim - 1] != 1)) {
        int pushed;
        data = ks_lt_on(L, 1, x, be, &pushed);
        bf16 = 0;
        rs = h * d;
        hs = d;
    }
    int64_t shape[3] = {p1 - p0, h, d};
    if (x->ndim == 2) shape[1] = d;
    ks_tensor *omin = want_min ? ks_lp_out(L, be, KS_T_F32, x->ndim, shape) : NULL;
    ks_tensor *omax = want_max ? ks_lp_out(L, be, KS_T_F32, x->ndim, shape) : NULL;
    ks_tensor *omean = want_mean ? ks_lp_out(L, be, KS_T_F32, x->ndim, shape) : NULL;
    ks_tensor *obox = want_box ? ks_lp_out(L, be, KS_T_I32, x->ndim, shape) : NULL;
    float *a = omin ? omin->data : NULL, *b = omax ? omax->data : NULL, *c = omean ? omean->data : NULL;
    CORE(fn, tab->page_reduce(be, data, bf16, n, h, d, rs, hs, page, p0, p1, a, b, c, obox ? obox->data : NULL));
    return want_min && want_max ? 2 : 1;
}

/* ================================================================ bound_scores */

/* ks.bound_scores(q, lo, hi [, {reduce = "none" | "group_max" | "group_sum"}]): q f32 (H, d) or
 * (1, H, d); lo, hi f32 (n, Hkv, d). ks.bound_scores(q, box [, opts]): box i32 (n, Hkv, d),
 * packed boxes of page_reduce(x, page, "box"). Result (H, n) or (Hkv, n). */
int ks_lp_bound_scores(lua_State *L) {
    const char *fn = "bound_scores";
    lua_settop(L, 4);
    ks_tensor *q = ks_lt_check(L, 1, fn), *lo = ks_lt_check(L, 2, fn), *hi = NULL;
    const int packed = lo->dtype == KS_T_I32, oi = packed ? 3 : 4; /* the options' index */
    if (packed && (!lua_isnoneornil(L, 4) || lua_isuserdata(L, 3)))
        return ks_lua_errorf(L, fn, "packed boxes take (q, box [, opts]): lo and hi are f32, a box is one i32 tensor");
    static const char *const allowed[] = {"reduce", NULL};
    only_opts(L, oi, fn, allowed, "reduce");
    if (!packed) hi = ks_lt_check(L, 3, fn);
    if (q->dtype != KS_T_F32 || (!packed && (lo->dtype != KS_T_F32 || hi->dtype != KS_T_F32)))
        return ks_lua_errorf(L, fn, "q, lo and hi must be f32 tensors (or q f32 and one i32 tensor of packed boxes)");
    int64_t H, d;
    if (q->ndim == 2) { H = q->shape[0]; d = q->shape[1]; }
    else if (q->ndim == 3 && q->shape[0] == 1) { H = q->shape[1]; d = q->shape[2]; }
    else return ks_lua_errorf(L, fn, "q must be (n_heads, head_dim) or (1, n_heads, head_dim)");
    if (packed ? lo->ndim != 3 : lo->ndim != 3 || hi->ndim != 3)
        return ks_lua_errorf(L, fn, packed ? "box must be (n, n_kv_heads, head_dim)" : "lo and hi must be (n, n_kv_heads, head_dim)");
    if (!packed && memcmp(lo->shape, hi->shape, sizeof(int64_t) * 3))
        return ks_lua_errorf(L, fn, "lo (%lld, %lld, %lld) and hi (%lld, %lld, %lld) differ in shape", (long long)lo->shape[0],
                             (long long)lo->shape[1], (long long)lo->shape[2], (long long)hi->shape[0], (long long)hi->shape[1],
                             (long long)hi->shape[2]);
    int64_t n = lo->shape[0], Hkv = lo->shape[1];
    if (lo->shape[2] != d)
        return ks_lua_errorf(L, fn, "head_dim of q (%lld) and of the boxes (%lld) differ", (long long)d, (long long)lo->shape[2]);
    ks_bound_reduce red = KS_BOUND_NONE;
    if (lua_istable(L, oi)) {
        int t = lua_getfield(L, oi, "reduce");
        if (t != LUA_TNIL) {
            const char *r = t == LUA_TSTRING ? lua_tostring(L, -1) : "";
            if (!strcmp(r, "none")) red = KS_BOUND_NONE;
            else if (!strcmp(r, "group_max")) red = KS_BOUND_GROUP_MAX;
            else if (!strcmp(r, "group_sum")) red = KS_BOUND_GROUP_SUM;
            else return ks_lua_errorf(L, fn, "option reduce: \"none\", \"group_max\" or \"group_sum\", got %s", t == LUA_TSTRING ? r : luaL_typename(L, -1));
        }
        lua_pop(L, 1);
    }
    CORE(fn, ks_bound_scores_check_args(H, n, Hkv, d, red));
    ks_tensor *ts[3] = {q, lo, hi};
    ks_backend *be = ks_lp_where(ts, packed ? 2 : 3);
    const ks_backend_prims *tab = ks_lp_prims(be);
    int pushed;
    const float *qd = ks_lt_on(L, 1, q, be, &pushed);
    const void *ld = ks_lt_on(L, 2, lo, be, &pushed);
    const float *hd = packed ? NULL : ks_lt_on(L, 3, hi, be, &pushed);
    int64_t shape[2] = {red == KS_BOUND_NONE ? H : Hkv, n};
    ks_tensor *o = ks_lp_out(L, be, KS_T_F32, 2, shape);
    CORE(fn, tab->bound_scores(be, qd, H, packed ? NULL : ld, hd, packed ? ld : NULL, n, Hkv, d, red, o->data));
    return 1;
}

/* ================================================================ page_rows */

/* ks.page_rows(pages, page, n [, {before = {b, e}, after = {b, e}, check = true}]): pages i32 (k)
 * or (lists, k), each list strictly ascending -> i32 (w) or (lists, w) row ids, marked valid by
 * construction. Pages from ks.topk (marked) that fit the ranges are not checked at all; others
 * are checked on the device through a wait, or not with check = false (the result is then not
 * marked: an action checks it); the host always checks. */
int ks_lp_page_rows(lua_State *L) {
    const char *fn = "page_rows";
    lua_settop(L, 4);
    static const char *const allowed[] = {"before", "after", "check", NULL};
    only_opts(L, 4, fn, allowed, "before, after, check");
    ks_tensor *p = ks_lt_arg(L, 1, KS_T_I32, fn); /* pushed at 5 */
    lua_Integer page = luaL_checkinteger(L, 2), n = luaL_checkinteger(L, 3);
    if (p->ndim != 1 && p->ndim != 2) return ks_lua_errorf(L, fn, "pages must be (k) or (lists, k), got %d dimensions", p->ndim);
    if (page < 1) return ks_lua_errorf(L, fn, "page = %lld must be >= 1", (long long)page);
    if (n < 0) return ks_lua_errorf(L, fn, "n = %lld is negative", (long long)n);
    int64_t lists = p->ndim == 2 ? p->shape[0] : 1, k = p->shape[p->ndim - 1];
    int64_t bb = 0, be_ = 0, ab = 0, ae = 0;
    range_opt(L, 4, "before", n, &bb, &be_, fn);
    range_opt(L, 4, "after", n, &ab, &ae, fn);
    int check = 1;
    if (lua_istable(L, 4)) {
        int t = lua_getfield(L, 4, "check");
        if (t == LUA_TBOOLEAN) check = lua_toboolean(L, -1);
        else if (t != LUA_TNIL) return ks_lua_errorf(L, fn, "option check must be a boolean");
        lua_pop(L, 1);
    }
    int64_t w;
    CORE(fn, ks_page_rows_check_args(lists, k, page, n, bb, be_, ab, ae, &w));
    ks_backend *be = ks_lp_where(&p, 1);
    const ks_backend_prims *tab = ks_lp_prims(be);
    int pushed;
    const int32_t *pd = ks_lt_on(L, 5, p, be, &pushed);
    int64_t shape[2] = {lists, w};
    ks_tensor *o = p->ndim == 2 ? ks_lp_out(L, be, KS_T_I32, 2, shape) : ks_lp_out(L, be, KS_T_I32, 1, &shape[1]);
    int oslot = lua_gettop(L);
    /* Pages marked valid by construction (ks.topk's index result: rows ascending, in [plo, phi))
     * whose bounds keep every page inside [lo_row, hi_row) need no check. Else a device checks
     * them through an error word (one download) unless check = false, and the host reference
     * always checks. A checked or valid result is marked valid by construction in [0, n), so
     * ev:attend takes it on the device without a check of its own. */
    int64_t plo, phi, lo_row = be_ > bb ? be_ : 0, hi_row = ae > ab ? ab : n;
    int valid = k == 0 || (ks_lt_sorted(L, 5, &plo, &phi) && plo >= 0 && phi <= n && plo * page >= lo_row &&
                           phi * page <= hi_row);
    /* on the host (be NULL) the CPU table checks every entry itself (no error word) */
    int64_t m1 = -1, *err = be && check && !valid ? ks_lp_word(L, be, &m1, 1) : NULL;
    CORE(fn, tab->page_rows(be, pd, lists, k, page, n, bb, be_, ab, ae, o->data, err));
    if (err) {
        int64_t bad;
        ks_lp_get(L, be, &bad, err, sizeof bad);
        if (bad >= 0) {
            /* the CPU's message for the same lists (it stops at the same, lowest, bad entry) */
            const int32_t *hp = ks_lt_host(L, p);
            ks_tensor *tmp = ks_lt_new(L, KS_T_I32, p->ndim, p->ndim == 2 ? shape : &shape[1], 0);
            ks_status st = ks_cpu_page_rows(hp, lists, k, page, n, bb, be_, ab, ae, tmp->data);
            if (st) return ks_lua_core_error(L, fn, st);
            return ks_lua_errorf(L, fn, "page at (list %lld, position %lld) is invalid", (long long)(bad / (k ? k : 1)),
                                 (long long)(bad % (k ? k : 1)));
        }
    }
    int marked = !be || valid || check;
    lua_settop(L, oslot);
    if (marked && lists * w > 0) ks_lt_mark_sorted(L, oslot, 0, n);
    return 1;
}

void ks_prims_page_open(lua_State *L) {
    static const luaL_Reg fns[] = {
        {"page_reduce", ks_lp_page_reduce}, {"bound_scores", ks_lp_bound_scores}, {"page_rows", ks_lp_page_rows}, {NULL, NULL}};
    luaL_setfuncs(L, fns, 0);
}
