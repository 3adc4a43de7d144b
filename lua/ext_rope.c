/* ext_rope.c — ks.rope(x, positions [, opts]): rotary position embedding as a policy primitive.
 *
 * TokenSelect keeps keys before RoPE and scores a query "fingerprint" made of the chunk's
 * queries rotated at chosen positions; this rotates them exactly as the engine does (the
 * model's ks_rope: default, linear, llama3 or longrope frequencies, longrope's attn_factor;
 * rotate-half pairing (x[k], x[k + d/2]); float32 angles pos * inv_freq[k] as HF and
 * core/cpu_backend.c compute them).
 *
 *   ks.rope(x, positions [, opts]) -> a new f32 tensor of x's shape (x is never modified)
 *     x          f32 (m, H, d) rows of heads, or (H, d) one row (ev.q, ev.k, ev:kv_keys(), ...)
 *     positions  an integer (every row at that position) or m integers (i32 tensor or table)
 *     opts.max_pos    the largest position of the forward pass, which picks longrope's long or
 *                     short factors (HF: long when max_pos + 1 > original_max_position_embeddings);
 *                     default: inside an event the largest position of the event's rows (what
 *                     the engine's own rotation of this forward uses), else max(positions)
 *     opts.theta      rotate with a plain RoPE of this base instead of the model's (the only
 *                     way outside an event handler, where no model is running; tests)
 *
 * The model's RoPE is the one of the session whose event is running (the rope of
 * ks_model_config(ks_session_model(ev->sess))), so a policy needs nothing else; outside an
 * event handler, without opts.theta, it is an error. Cost O(m * H * d) plus O(m * d / 2)
 * cos/sin. A device tensor x (ks_lua.h) is rotated on its device by the backend's RoPE (the
 * engine's own rotation) into a new device tensor.
 *
 * Registered with the other primitives (lua/prims_lua.c, the primitive registry). */
#include "ks_lua.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define ROPE_MAX_HALF 512

int ks_lp_rope(lua_State *L) {
    const char *fn = "rope";
    lua_settop(L, 3);
    ks_tensor *x = ks_lt_check(L, 1, fn);
    if (x->dtype != KS_T_F32) return ks_lua_errorf(L, fn, "x must be an f32 tensor");
    int64_t m, H, d;
    if (x->ndim == 3) { m = x->shape[0]; H = x->shape[1]; d = x->shape[2]; }
    else if (x->ndim == 2) { m = 1; H = x->shape[0]; d = x->shape[1]; }
    else return ks_lua_errorf(L, fn, "x must be (m, n_heads, head_dim) or (n_heads, head_dim), got %d dimensions", x->ndim);
    if (d < 2 || d % 2) return ks_lua_errorf(L, fn, "head_dim must be even, got %lld", (long long)d);
    if (d / 2 > ROPE_MAX_HALF) return ks_lua_errorf(L, fn, "head_dim %lld too large (at most %d)", (long long)d, 2 * ROPE_MAX_HALF);

    /* options */
    double theta = 0;
    int64_t max_pos = -1;
    if (!lua_isnoneornil(L, 3)) {
        luaL_checktype(L, 3, LUA_TTABLE);
        lua_pushnil(L);
        while (lua_next(L, 3)) {
            lua_pop(L, 1);
            const char *k = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : NULL;
            if (!k || (strcmp(k, "theta") && strcmp(k, "max_pos")))
                return ks_lua_errorf(L, fn, "unknown option '%s' (options: theta, max_pos)", k ? k : luaL_typename(L, -1));
        }
        if (lua_getfield(L, 3, "theta") != LUA_TNIL) {
            if (!lua_isnumber(L, -1) || !(lua_tonumber(L, -1) > 0))
                return ks_lua_errorf(L, fn, "option theta must be a positive number");
            theta = lua_tonumber(L, -1);
        }
        lua_pop(L, 1);
        if (lua_getfield(L, 3, "max_pos") != LUA_TNIL) {
            if (!lua_isinteger(L, -1) || lua_tointeger(L, -1) < 0)
                return ks_lua_errorf(L, fn, "option max_pos must be a non-negative integer");
            max_pos = lua_tointeger(L, -1);
        }
        lua_pop(L, 1);
    }

    /* positions: stack slot 4 holds the i32 tensor when a list is given */
    int32_t one = 0;
    const int32_t *pos = NULL;
    int64_t npos = 0;
    if (lua_type(L, 2) == LUA_TNUMBER) {
        if (!lua_isinteger(L, 2)) return ks_lua_errorf(L, fn, "positions must be integers");
        lua_Integer p = lua_tointeger(L, 2);
        if (p < 0 || p > INT32_MAX) return ks_lua_errorf(L, fn, "position %lld out of range", (long long)p);
        one = (int32_t)p;
        lua_pushnil(L);
    } else {
        if (lua_isnoneornil(L, 2)) return ks_lua_errorf(L, fn, "positions expected (an integer or a list of integers)");
        ks_tensor *tp = ks_lt_arg(L, 2, KS_T_I32, fn); /* pushes the tensor to use (slot 4) */
        if (tp->ndim > 1) return ks_lua_errorf(L, fn, "positions must be 1-d");
        int pushed;
        pos = ks_lt_contig(L, 4, tp, &pushed);
        if (pushed) lua_replace(L, 4);
        npos = tp->numel;
        if (npos != m) return ks_lua_errorf(L, fn, "%lld positions for %lld rows", (long long)npos, (long long)m);
        for (int64_t i = 0; i < npos; i++)
            if (pos[i] < 0) return ks_lua_errorf(L, fn, "negative position %d at index %lld", pos[i], (long long)i);
    }

    /* the RoPE parameters: opts.theta, else the model of the running event */
    ks_rope plain;
    const ks_rope *r = NULL;
    ks_lctx *c = ks_lua_ctx(L);
    const ks_event *ev = c && c->in_event ? c->ev : NULL;
    if (theta > 0) {
        memset(&plain, 0, sizeof plain);
        plain.type = KS_ROPE_DEFAULT;
        plain.head_dim = (int)d;
        plain.theta = theta;
        plain.factor = 1;
        plain.attn_factor = 1;
        r = &plain;
    } else {
        if (!ev || !ev->sess || !ks_session_model(ev->sess))
            return ks_lua_errorf(L, fn, "the model's RoPE is known only inside an event handler (outside one, pass {theta = ...})");
        r = &ks_model_config(ks_session_model(ev->sess))->rope;
        if (r->head_dim != d)
            return ks_lua_errorf(L, fn, "x has head_dim %lld but the model rotates %d dims", (long long)d, r->head_dim);
    }
    if (max_pos < 0) {
        if (ev && ev->pos && ev->n > 0 && theta <= 0) {
            max_pos = ev->pos[0];
            for (int i = 1; i < ev->n; i++)
                if (ev->pos[i] > max_pos) max_pos = ev->pos[i];
        } else {
            max_pos = pos ? 0 : one;
            for (int64_t i = 0; pos && i < npos; i++)
                if (pos[i] > max_pos) max_pos = pos[i];
        }
    }
    if (max_pos > INT32_MAX) max_pos = INT32_MAX;

    if (max_pos > INT32_MAX) max_pos = INT32_MAX;
    if (x->be && x->be->rope) {
        /* a device tensor: the backend's own RoPE (the engine's rotation) on a device copy */
        ks_backend *be = x->be;
        int pushed;
        const float *xd = ks_lt_on(L, 1, x, be, &pushed);
        ks_tensor *o = ks_lt_dnew(L, be, KS_T_F32, x->ndim, x->shape);
        ks_status st = be->copy(be, o->data, xd, (size_t)x->numel * 4);
        int32_t *pa = NULL;
        if (!st && !pos && m > 0) { /* one position for every row: the backend wants one per row */
            pa = malloc(sizeof(int32_t) * (size_t)m);
            if (!pa) return ks_lua_errorf(L, fn, "out of memory");
            for (int64_t i = 0; i < m; i++) pa[i] = one;
        }
        ks_rope rr = *r;
        rr.head_dim = (int)d;
        if (!st && m > 0) st = be->rope(be, o->data, (int)m, (int)H, pos ? pos : pa, &rr, (int)max_pos);
        free(pa);
        if (st) return ks_lua_core_error(L, fn, st);
        return 1;
    }

    /* the input as contiguous (m, H, d) data; the output is a new tensor of x's shape */
    int pushed;
    const float *xd = ks_lt_contig(L, 1, x, &pushed); /* pushed: slot 5 keeps the copy alive */
    ks_tensor *o = ks_lt_new(L, KS_T_F32, x->ndim, x->shape, 0);
    ks_lua_rope_rows(o->data, xd, m, H, d, pos, one, r, max_pos);
    return 1;
}

void ks_lua_rope_rows(float *out, const float *x, int64_t m, int64_t H, int64_t d, const int32_t *pos, int32_t one,
                      const ks_rope *r, int64_t max_pos) {
    float inv[ROPE_MAX_HALF];
    ks_rope_inv_freq(r, (int)max_pos, inv);
    ks_rope_rows_f32(out, d, H * d, x, d, H * d, H, m, d, pos, one, inv, (float)r->attn_factor);
}

void ks_lua_event_rope(lua_State *L, const char *fn, int64_t d, float *inv, float *af) {
    ks_lctx *c = ks_lua_ctx(L);
    const ks_event *ev = c && c->in_event ? c->ev : NULL;
    if (!ev || !ev->sess || !ks_session_model(ev->sess))
        ks_lua_errorf(L, fn, "the model's RoPE is known only inside an event handler");
    const ks_rope *r = &ks_model_config(ks_session_model(ev->sess))->rope;
    if (r->head_dim != d || d % 2 || d / 2 > ROPE_MAX_HALF)
        ks_lua_errorf(L, fn, "the queries have head_dim %lld but the model rotates %d dims", (long long)d, r->head_dim);
    int64_t max_pos = 0;
    for (int i = 0; ev->pos && i < ev->n; i++)
        if (ev->pos[i] > max_pos) max_pos = ev->pos[i];
    ks_rope_inv_freq(r, (int)max_pos, inv);
    *af = (float)r->attn_factor;
}
