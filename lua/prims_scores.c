/* prims_scores.c — ks.scores(q, k [, opts]): attention scores over the keys, never an (m, n)
 * matrix (core/prims.h ks_cpu_scores for the meaning; prims_impl.h for placement and the one
 * dispatch). Its options map onto ks_scores_opts; q and k are read where they are, strided by
 * rows and heads, and an input on the other side from the work is copied first. A sandboxed
 * call's _seconds budget reaches the host loop through ks_scores_opts.deadline. */
#include "prims_impl.h"

#include "common.h"

#include <string.h>

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
 *   rope    p: every query row first rotated with the model's RoPE at position p, as ks.rope(q, p)
 *           rotates it (inside an event handler; ks_scores_opts.q_rope_inv): on a GPU in the
 *           kernel that reads the queries, so one launch instead of a copy, a rope and the scores
 *   threads 0 = automatic
 *   skip    a mask of one value (ks.ge's): nonzero -> no query or key is read and the result is
 *           zeros (a branch on a decision made where the data is, with no sync)
 * Keys that follow the layer's rows (ev:kv_keys() while the engine records the handler:
 * ks_tensor.grow) take the ends of key_range and out from the end (negative, or absent) and no
 * kpos, qpos or causal; the result then follows them too (ks_scores_opts.grow). */
int ks_lp_scores(lua_State *L) {
    lua_settop(L, 3);
    static const char *const allowed[] = {"rows", "qpos", "kpos", "scale", "causal", "softmax", "key_range",
                                          "out", "reduce", "gqa", "rope", "threads", "skip", NULL};
    const char *fn = "scores";
    ks_tensor *q = ks_lt_check(L, 1, fn), *k = ks_lt_check(L, 2, fn);
    ks_lp_check_opts(L, 3, fn, allowed);
    if (q->dtype != KS_T_F32 || k->dtype != KS_T_F32) return ks_lua_errorf(L, fn, "q and k must be f32 tensors");
    if (q->bf16) return ks_lua_errorf(L, fn, "q cannot be a bf16 view (only keys can)");
    if (k->ndim != 3) return ks_lua_errorf(L, fn, "k must be (n, n_kv_heads, head_dim), got %d dimensions", k->ndim);
    int64_t m, H, d, qs0, qs1;
    if (q->ndim != 2 && q->ndim != 3)
        return ks_lua_errorf(L, fn, "q must be (m, n_heads, head_dim) or (n_heads, head_dim), got %d dimensions", q->ndim);
    if (q->stride[q->ndim - 1] != 1 || k->stride[2] != 1) return ks_lua_errorf(L, fn, "the last dimension of q and k must be contiguous");
    /* where it runs; an input on the other side is copied (contiguous) and read through that copy */
    ks_tensor *both[2] = {q, k};
    ks_backend *be = ks_lp_where(both, 2);
    const int64_t k0grow = k->grow;
    if (k0grow && (k->be != be || q->be != be))
        return ks_lua_errorf(L, fn, "in a recorded handler the keys and queries must both be on the device");
    ks_tensor qh = *q, kh = *k;
    if (be ? q->be != be : q->be != NULL) {
        qh.data = (void *)ks_lp_data(L, 1, q, be);
        int64_t st = 1;
        for (int i = q->ndim - 1; i >= 0; i--) { qh.stride[i] = st; st *= q->shape[i] ? q->shape[i] : 1; }
        qh.be = be;
    }
    if (be ? k->be != be : k->be != NULL) {
        kh.data = (void *)ks_lp_data(L, 2, k, be);
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
    int t = ks_lp_opt_get(L, 3, "rows");
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
        ks_lp_opt_range(L, 3, "rows", m, &r0, &r1, fn);
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
    if (ks_lp_opt_get(L, 3, "kpos") != LUA_TNIL) {
        tk = ks_lp_arg(L, lua_gettop(L), KS_T_I32, fn, &slot);
        if (tk->numel != n) return ks_lua_errorf(L, fn, "kpos has %lld entries for %lld keys", (long long)tk->numel, (long long)n);
        kpos = ks_lp_data(L, slot, tk, be);
        kpos_host = be ? NULL : kpos;
    } /* the pushed values stay on the stack until we return */
    if (ks_lp_opt_get(L, 3, "qpos") != LUA_TNIL) {
        tq = ks_lp_arg(L, lua_gettop(L), KS_T_I32, fn, &slot);
        if (tq->numel != mq) return ks_lua_errorf(L, fn, "qpos has %lld entries for %lld query rows", (long long)tq->numel, (long long)mq);
        qpos = ks_lp_data(L, slot, tq, be);
    }
    o.causal = ks_lp_opt_bool(L, 3, "causal", 0, fn);
    o.softmax = ks_lp_opt_bool(L, 3, "softmax", 0, fn);
    if (o.causal && !qpos && rows_given && r1 != m) {
        /* explicit rows that are not the last ones: their positions are those of the same
         * rows of k (q and k come from the same event) */
        if (m != n) return ks_lua_errorf(L, fn, "causal rows {%lld, %lld} need qpos (q has %lld rows, k %lld)", (long long)r0,
                                         (long long)r1, (long long)m, (long long)n);
        int64_t sh[1] = {mq};
        if (tk && !kpos_host) kpos_host = ks_lt_host(L, tk);
        ks_tensor *p = ks_lt_new(L, KS_T_I32, 1, sh, 0);
        for (int64_t i = 0; i < mq; i++) ((int32_t *)p->data)[i] = kpos_host ? kpos_host[r0 + i] : (int32_t)(r0 + i);
        qpos = ks_lp_data(L, lua_gettop(L), p, be);
    } else if (o.causal && !qpos && mq > n)
        return ks_lua_errorf(L, fn, "causal scores of %lld query rows over %lld keys need qpos", (long long)mq, (long long)n);
    /* scale */
    t = ks_lp_opt_get(L, 3, "scale");
    if (t == LUA_TNUMBER) { o.scale_mode = KS_SCALE_CUSTOM; o.scale = (float)lua_tonumber(L, -1); }
    else if (t == LUA_TSTRING) {
        const char *s = lua_tostring(L, -1);
        if (!strcmp(s, "sqrt_d") || !strcmp(s, "rsqrt_d")) o.scale_mode = KS_SCALE_RSQRT_D;
        else if (!strcmp(s, "none")) o.scale_mode = KS_SCALE_ONE;
        else return ks_lua_errorf(L, fn, "option scale: \"sqrt_d\", \"none\" or a number, got \"%s\"", s);
    } else if (t != LUA_TNIL) return ks_lua_errorf(L, fn, "option scale: \"sqrt_d\", \"none\" or a number");
    lua_pop(L, 1);
    int64_t b, e;
    int krel = 2, orel = 2; /* absent: the end is n, which follows the rows */
    if (ks_lp_opt_range_rel(L, 3, "key_range", n, &b, &e, &krel, fn)) { o.k_begin = b; o.k_end = e; }
    if (ks_lp_opt_range_rel(L, 3, "out", n, &b, &e, &orel, fn)) { o.out_begin = b; o.out_end = e; }
    if (k0grow) {
        /* keys whose rows follow the layer's in a recorded handler: every number that follows them
         * must say so (ends given from the end, begins fixed), and nothing else may depend on n */
        if (krel != 2 || orel != 2)
            return ks_lua_errorf(L, fn, "in a recorded handler the ends of key_range and out follow the layer's rows: give "
                                 "them from the end (negative) and their begins from the start");
        if (tk || tq || o.causal)
            return ks_lua_errorf(L, fn, "in a recorded handler kpos, qpos and causal cannot follow the layer's rows");
        o.grow = k0grow;
    }
    const char *red = ks_lp_opt_str(L, 3, "reduce", "none", fn);
    if (!strcmp(red, "none")) o.heads = KS_HEADS_NONE;
    else if (!strcmp(red, "group")) o.heads = KS_HEADS_GROUP_SUM;
    else if (!strcmp(red, "sum")) o.heads = KS_HEADS_SUM;
    else if (!strcmp(red, "mean")) o.heads = KS_HEADS_MEAN;
    else return ks_lua_errorf(L, fn, "option reduce: \"none\", \"group\", \"sum\" or \"mean\", got \"%s\"", red);
    const char *gqa = ks_lp_opt_str(L, 3, "gqa", "div", fn);
    if (!strcmp(gqa, "div")) o.gqa = KS_GQA_DIV;
    else if (!strcmp(gqa, "mod")) o.gqa = KS_GQA_MOD;
    else return ks_lua_errorf(L, fn, "option gqa: \"div\" or \"mod\", got \"%s\"", gqa);
    float rinv[512];
    if (ks_lp_opt_get(L, 3, "rope") != LUA_TNIL) {
        if (!lua_isinteger(L, -1) || lua_tointeger(L, -1) < 0 || lua_tointeger(L, -1) > INT32_MAX)
            return ks_lua_errorf(L, fn, "option rope: a position (an integer >= 0)");
        o.q_rope_pos = (int32_t)lua_tointeger(L, -1);
        ks_lua_event_rope(L, fn, d, rinv, &o.q_rope_af);
        o.q_rope_inv = rinv;
    }
    lua_pop(L, 1);
    if (ks_lp_opt_get(L, 3, "threads") != LUA_TNIL) {
        lua_Integer nt = luaL_checkinteger(L, -1);
        if (nt < 0 || nt > 256) return ks_lua_errorf(L, fn, "option threads = %lld: must be in [0, 256] (0 = automatic)", (long long)nt);
        o.n_threads = (int)nt;
    }
    lua_pop(L, 1);
    if (ks_lp_opt_get(L, 3, "skip") != LUA_TNIL) { /* stays on the stack until we return */
        int ms;
        ks_tensor *tm = ks_lp_arg(L, lua_gettop(L), KS_T_F32, fn, &ms);
        if (tm->numel != 1)
            return ks_lua_errorf(L, fn, "option skip: a mask of one value (ks.ge's), got %lld values", (long long)tm->numel);
        o.skip = ks_lp_data(L, ms, tm, be);
    }

    int64_t rows, cols;
    KS_LP_CORE(fn, ks_scores_out_shape(&o, H, Hkv, n, &rows, &cols));
    int64_t shape[2] = {rows, cols};
    int reduce_all = o.heads == KS_HEADS_SUM || o.heads == KS_HEADS_MEAN;
    ks_tensor *out = reduce_all ? ks_lp_out_grow(L, be, KS_T_F32, 1, &cols, o.grow)
                                : ks_lp_out_grow(L, be, KS_T_F32, 2, shape, o.grow);
    /* A sandboxed call's _seconds budget reaches the host scores' own loop, which no Lua hook
     * sees: it stops between tiles of query rows once the call's deadline has passed. */
    ks_lctx *lc = ks_lua_ctx(L);
    if (lc->sandboxed && lc->budget_active && lc->seconds > 0)
        o.deadline = lc->deadline > 0 ? lc->deadline : ks_now() + lc->seconds;
    ks_status sst = ks_lp_prims(be)->scores(be, qd, qpos, H, mq, k->data, k->bf16, kpos, Hkv, n, d, &o, out->data);
    if (sst == KS_ERR_INTERRUPTED && o.deadline > 0) {
        lc->fail_kind = KS_FAIL_TIMEOUT;
        return ks_lua_errorf(L, fn, "wall-clock budget exceeded (%.3g s per call; parameter _seconds)", lc->seconds);
    }
    KS_LP_CORE(fn, sst);
    return 1;
}
