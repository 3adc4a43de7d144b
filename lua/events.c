/* events.c — the event object a policy's handler receives, and the trampolines through which
 * the engine calls the handlers (lua/lpol.h).
 *
 *   - The event object (userdata "kvsieve.event"): its fields (ev.layer, ev.q, ...: views of
 *     engine buffers, on the device or the host, policy_lua.h), ev:kv_pos / kv_keys /
 *     kv_values, and the actions (ev:restart, propagate, retain, attend, stop, discard_kv),
 *     which check their index lists and hand them to the engine's ks_action_* calls;
 *     ev:report and ks.report (stored by report.c), ks.unhook, ks.kv_ring.
 *   - The trampolines: a ks_lpol's on[] slots point at ks_lpol_trampoline for exactly the
 *     handlers its table defines (the others stay NULL and cost nothing); begin
 *     (ks_lpol_begin) clears the report, re-arms the handlers and calls the Lua begin. Each
 *     event sets the context (ks_lctx) of the state: views handed out carry its serial and
 *     become stale when the event ends; primitives and actions name the event. The handler
 *     runs through the sandbox's choke point (ks_lpol_protected). */
#include "lpol.h"
#include "tensor_impl.h"

#include <stdlib.h>
#include <string.h>

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

static int is_cpu(const ks_event *ev) { return !ev->be || ev->be->host_memory; }

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
    } else if (!strcmp(k, "held_steps")) {
        lua_pushinteger(L, ev->sess ? (lua_Integer)ks_session_held_steps(ev->sess) : 0);
    } else if (!strcmp(k, "replayed_steps")) {
        lua_pushinteger(L, ev->sess ? (lua_Integer)ks_session_replayed_steps(ev->sess) : 0);
    } else if (!strcmp(k, "recording")) {
        lua_pushboolean(L, ev->grow > 0);
    } else return ks_lua_errorf(L, "event", "no field or method '%s' (fields: event, layer, pass, n, n_prompt, n_heads, "
                                            "n_kv_heads, head_dim, dim, n_layers, q, k, v, k_pre, hidden, pos, ids, orig, "
                                            "kv_rows, token, held_steps, replayed_steps, recording)", k);
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

/* An i32 tensor at arg on the event's device (or the emulated one on the CPU backend) as a
 * device list (policy.h): 1-d, or 2-d (rows, k) when heads; *out filled, its data valid while
 * the value pushed (one, always) is on the stack; marked lists (ks_lt_sorted) go as checked.
 * 0: not a device list (the host path takes it, and reports what is wrong with it). */
static int dev_list_arg(lua_State *L, int arg, const l_event *e, const char *fn, int heads, ks_dev_list *out) {
    ks_tensor *t = ks_lt_test(L, arg);
    if (!t || !t->be) return 0;
    ks_lt_check(L, arg, fn);
    const ks_event *ev = e->ev;
    ks_backend *emu = ks_lua_emu_backend();
    if (!(t->be == ev->be || (t->be == emu && is_cpu(ev))) || t->bf16 || t->dtype != KS_T_I32) return 0;
    if (t->ndim != 1 && !(heads && t->ndim == 2)) return 0;
    if (t->numel > INT32_MAX) ks_lua_errorf(L, fn, "an index list of %lld entries is too long", (long long)t->numel);
    int pushed;
    const int32_t *d = ks_lt_on(L, arg, t, t->be, &pushed); /* contiguous, on the same device */
    if (!pushed) lua_pushvalue(L, arg);
    memset(out, 0, sizeof *out);
    out->data = t->be == emu ? ks_lua_emu_untag(d) : d;
    out->rows = t->ndim == 2 ? (int)t->shape[0] : 1;
    out->k = t->ndim == 2 ? (int)t->shape[1] : (int)t->numel;
    out->checked = ks_lt_sorted(L, arg, &out->lo, &out->hi);
    /* an owned tensor read where it is: its contents are known by its id (read-only data); one
     * written in place gets a new id each time, so the engine never takes it for a list it kept */
    if (!pushed && t->dev_owned && d == t->dev_owned && ks_lt_mut(t)) t->id = ++ks_lua_ctx(L)->next_id;
    out->serial = !pushed && t->dev_owned && d == t->dev_owned ? t->id : 0;
    out->lend = out->serial ? ks_lt_lend(t) : NULL;
    return 1;
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
    ks_dev_list dl;
    if (dev_list_arg(L, 2, e, "propagate", 0, &dl)) {
        ACT("propagate", ks_action_propagate_dev(e->ev, &dl));
        return 0;
    }
    int k;
    const int32_t *idx = index_list(L, 2, "propagate", &k);
    ACT("propagate", ks_action_propagate(e->ev, idx, k));
    return 0;
}

static int l_ev_retain(lua_State *L) {
    l_event *e = check_event(L, 1, "retain");
    ks_dev_list dl;
    if (dev_list_arg(L, 2, e, "retain", 1, &dl)) ACT("retain", ks_action_retain_dev(e->ev, &dl));
    else if (per_head(L, 2)) {
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

/* opts[name] = {begin, end} (integers, begin <= end) into r[0..1]; absent: r unchanged */
static void range_opt(lua_State *L, int opts, const char *name, int64_t *r) {
    lua_getfield(L, opts, name);
    if (!lua_isnil(L, -1)) {
        if (!lua_istable(L, -1) || luaL_len(L, -1) != 2)
            ks_lua_errorf(L, "attend", "option %s must be {begin, end}", name);
        for (int i = 0; i < 2; i++) {
            lua_geti(L, -1, i + 1);
            int ok;
            lua_Integer v = lua_tointegerx(L, -1, &ok);
            if (!ok) ks_lua_errorf(L, "attend", "option %s: entry %d is not an integer", name, i + 1);
            r[i] = (int64_t)v;
            lua_pop(L, 1);
        }
        if (r[0] > r[1] || r[0] < 0)
            ks_lua_errorf(L, "attend", "option %s: {%lld, %lld} is not a range of rows", name, (long long)r[0], (long long)r[1]);
    }
    lua_pop(L, 1);
}

/* opts.replay: false / nil 0, true -1 (no limit of the handler's), or an integer n >= 1 (rows) */
static int64_t replay_opt(lua_State *L, int idx, const char *fn) {
    if (lua_isnoneornil(L, idx) || (lua_isboolean(L, idx) && !lua_toboolean(L, idx))) return 0;
    if (lua_isboolean(L, idx)) return -1;
    int ok;
    lua_Integer n = lua_tointegerx(L, idx, &ok);
    if (!ok || n < 1) ks_lua_errorf(L, fn, "replay must be true, false or a number of rows >= 1, got %s", luaL_tolstring(L, idx, NULL));
    return (int64_t)n;
}

static ks_status replay_act(ks_event *ev, int64_t rp) {
    return rp > 0 ? ks_action_replay_within(ev, rp) : ks_action_replay(ev);
}

/* ev:attend(list [, {renumber = bool, before = {b0, b1}, after = {a0, a1}, page = P, hold = bool,
 * replay = bool | rows}]): with before / after, the rows [b0, b1) ++ list ++ [a0, a1), as one
 * list (a device list, one for every KV head or one per head, is read in place around the ranges
 * where the backend can: ks_action_attend_dev_ranges); page: after is the current page of P rows,
 * {(N - 1) // P * P, N}, and stays that page at replayed steps (ks_action_attend_page; a device
 * list); hold: the engine may repeat it at this layer's later decode steps without calling the
 * handler (ks_action_hold; a device list valid by construction); replay: the handler's device
 * work may be recorded and replayed without calling it (ks_action_replay; with a device list: a
 * host list is attended as asked, nothing to record), a number: for at most that many more rows
 * (ks_action_replay_within) */
static int l_ev_attend(lua_State *L) {
    l_event *e = check_event(L, 1, "attend");
    int renumber = 0, hold = 0;
    int64_t replay = 0, page = 0;
    int64_t r[4] = {0, 0, 0, 0};
    if (!lua_isnoneornil(L, 3)) {
        luaL_checktype(L, 3, LUA_TTABLE);
        lua_pushnil(L);
        while (lua_next(L, 3)) {
            lua_pop(L, 1);
            const char *o = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : NULL;
            if (!o || (strcmp(o, "renumber") && strcmp(o, "before") && strcmp(o, "after") && strcmp(o, "hold") &&
                       strcmp(o, "replay") && strcmp(o, "page")))
                return ks_lua_errorf(L, "attend", "unknown option '%s' (options: renumber, before, after, page, hold, replay)",
                                     luaL_tolstring(L, -1, NULL));
        }
        lua_getfield(L, 3, "renumber");
        renumber = lua_toboolean(L, -1);
        lua_getfield(L, 3, "hold");
        hold = lua_toboolean(L, -1);
        lua_getfield(L, 3, "replay");
        replay = replay_opt(L, -1, "attend");
        lua_getfield(L, 3, "page");
        if (!lua_isnil(L, -1)) {
            int ok;
            page = (int64_t)lua_tointegerx(L, -1, &ok);
            if (!ok || page < 1 || page > INT32_MAX)
                return ks_lua_errorf(L, "attend", "option page must be a number of rows >= 1, got %s", luaL_tolstring(L, -1, NULL));
        }
        lua_pop(L, 4);
        range_opt(L, 3, "before", r);
        range_opt(L, 3, "after", r + 2);
    }
    int ranges = r[0] < r[1] || r[2] < r[3];
    if (hold && e->ev->kind != KS_EV_DECODE_QKV) /* before the attend: the event asks nothing */
        return ks_lua_errorf(L, "attend", "hold only in decode_qkv (asked in %s)", e->name);
    if (page && (r[2] == r[3] || hold))
        return ks_lua_errorf(L, "attend", "page needs an after range and no hold (a held range moves with the rows)");
    if (page) { /* after must be the current page (every kind of list; the engine checks a device one again) */
        const ks_kv_layer *kv = e->ev->kind == KS_EV_DECODE_QKV ? e->ev->kv : NULL;
        int64_t N = kv && kv->n ? kv->n[0] : 0, p0 = N > 0 ? (N - 1) / page * page : 0;
        if (!kv) return ks_lua_errorf(L, "attend", "page only in decode_qkv (asked in %s)", e->name);
        if (r[2] != p0 || r[3] != N)
            return ks_lua_errorf(L, "attend", "after = {%lld, %lld} is not the current page of %lld rows {%lld, %lld}",
                                 (long long)r[2], (long long)r[3], (long long)page, (long long)p0, (long long)N);
    }
    ks_dev_list dl;
    if (dev_list_arg(L, 2, e, "attend", 1, &dl)) {
        ACT("attend", ranges ? ks_action_attend_dev_ranges(e->ev, &dl, r, renumber) : ks_action_attend_dev(e->ev, &dl, renumber));
        if (page) ACT("attend", ks_action_attend_page(e->ev, (int)page));
        if (hold) ACT("attend", ks_action_hold(e->ev, &dl, ranges ? r : NULL));
        /* a list built with its ranges (a backend that does not read ranges itself) fixes the
         * trailing range's rows: not replayable, attended as asked */
        if (replay && (!ranges || e->ev->act.attend_seg)) ACT("attend", replay_act(e->ev, replay));
    } else if (ranges && per_head(L, 2)) { /* host lists, one per head: each whole list here */
        if (hold) return ks_lua_errorf(L, "attend", "hold takes one list for every KV head");
        const int32_t **idx;
        int *cnt, Hkv = e->ev->n_kv_heads;
        head_lists(L, 2, "attend", Hkv, &idx, &cnt);
        const int32_t **all = lua_newuserdatauv(L, sizeof(*all) * (size_t)(Hkv ? Hkv : 1), 0);
        int *nall = lua_newuserdatauv(L, sizeof(int) * (size_t)(Hkv ? Hkv : 1), 0);
        for (int h = 0; h < Hkv; h++) {
            int64_t w = (r[1] - r[0]) + cnt[h] + (r[3] - r[2]);
            if (w > INT32_MAX) return ks_lua_errorf(L, "attend", "a list of %lld rows is too long", (long long)w);
            int32_t *hl = lua_newuserdatauv(L, sizeof(int32_t) * (size_t)(w ? w : 1), 0); /* kept on the stack */
            int64_t o = 0;
            for (int64_t j = r[0]; j < r[1]; j++) hl[o++] = (int32_t)j;
            for (int j = 0; j < cnt[h]; j++) hl[o++] = idx[h][j];
            for (int64_t j = r[2]; j < r[3]; j++) hl[o++] = (int32_t)j;
            all[h] = hl;
            nall[h] = (int)w;
        }
        ACT("attend", ks_action_attend_heads(e->ev, all, nall, renumber));
    } else if (ranges) { /* a host list: the whole list here, checked as any list */
        int k;
        const int32_t *idx = index_list(L, 2, "attend", &k);
        int64_t w = (r[1] - r[0]) + k + (r[3] - r[2]);
        if (w > INT32_MAX) return ks_lua_errorf(L, "attend", "a list of %lld rows is too long", (long long)w);
        int32_t *all = lua_newuserdatauv(L, sizeof(int32_t) * (size_t)(w ? w : 1), 0);
        int64_t o = 0;
        for (int64_t j = r[0]; j < r[1]; j++) all[o++] = (int32_t)j;
        for (int j = 0; j < k; j++) all[o++] = idx[j];
        for (int64_t j = r[2]; j < r[3]; j++) all[o++] = (int32_t)j;
        ACT("attend", ks_action_attend(e->ev, all, (int)w, renumber));
        if (hold) ACT("attend", ks_action_hold_host(e->ev, idx, k, r));
    } else if (per_head(L, 2)) {
        if (hold) return ks_lua_errorf(L, "attend", "hold takes one list for every KV head");
        const int32_t **idx;
        int *cnt;
        head_lists(L, 2, "attend", e->ev->n_kv_heads, &idx, &cnt);
        ACT("attend", ks_action_attend_heads(e->ev, idx, cnt, renumber));
    } else {
        int k;
        const int32_t *idx = index_list(L, 2, "attend", &k);
        ACT("attend", ks_action_attend(e->ev, idx, k, renumber));
        if (hold) ACT("attend", ks_action_hold_host(e->ev, idx, k, NULL));
    }
    return 0;
}

/* ev:replay([rows]): a decode handler that asks for nothing (a layer it leaves dense) declares
 * its work replayable as ev:attend's replay option does (ks_action_replay; rows: within that many
 * more rows, ks_action_replay_within) */
static int l_ev_replay(lua_State *L) {
    l_event *e = check_event(L, 1, "replay");
    int64_t rp = lua_isnoneornil(L, 2) ? -1 : replay_opt(L, 2, "replay");
    if (rp) ACT("replay", replay_act(e->ev, rp));
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
    if (e->ev->grow > 0) ks_lt_test(L, -1)->grow = e->ev->grow; /* follows the layer's rows: a recording refuses it */
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
        if (e->ev->grow > 0) ks_lt_test(L, -1)->grow = e->ev->grow; /* its rows follow the layer's */
        return 1;
    }
    for (int h = 1; h < e->ev->n_kv_heads; h++)
        if (kv_n(kv, h) != kv_n(kv, 0))
            return ks_lua_errorf(L, fn, "KV heads hold different row counts (%d and %d): ask per head, ev:%s(h)", kv_n(kv, 0), kv_n(kv, h), fn);
    int64_t shape[3] = {kv_n(kv, 0), e->ev->n_kv_heads, d}, stride[3] = {d, cap * d, 1};
    if (!shape[0]) base = NULL;
    push_view(L, e->ev, KS_T_F32, 3, shape, stride, base, 0, bf16);
    if (e->ev->grow > 0) ks_lt_test(L, -1)->grow = e->ev->grow; /* its rows follow the layer's */
    return 1;
}
static int l_ev_kv_keys(lua_State *L) { return kv_tensor(L, 0); }
static int l_ev_kv_values(lua_State *L) { return kv_tensor(L, 1); }

/* ---------------------------------------------------------------- ev:report, ks.report, ks.unhook */

/* ev:release([layer]): drop the held attend of that layer (nil: of every layer; ks_hold_drop):
 * its decode_qkv handler runs again from the next decode step. */
static int l_ev_release(lua_State *L) {
    l_event *e = check_event(L, 1, "release");
    int layer = -1;
    if (!lua_isnoneornil(L, 2)) {
        lua_Integer v = luaL_checkinteger(L, 2);
        if (v < 0 || v >= e->ev->n_layers)
            return ks_lua_errorf(L, "release", "layer %lld is not in [0, %d)", (long long)v, e->ev->n_layers);
        layer = (int)v;
    }
    if (e->ev->sess) ks_hold_drop(e->ev->sess, layer);
    return 0;
}

static int l_ev_report(lua_State *L) {
    check_event(L, 1, "report");
    ks_lctx *c = ks_lua_ctx(L);
    return ks_lpol_do_report(L, c->pol, 2, "report");
}

/* ks.report(key, value) from begin or a handler. */
static int l_report(lua_State *L) {
    ks_lctx *c = ks_lua_ctx(L);
    if (!c || !c->pol) return ks_lua_errorf(L, "report", "only inside a policy's begin or event handler");
    return ks_lpol_do_report(L, c->pol, 1, "report");
}

const char *const ks_lpol_handler_names[KS_EV_COUNT] = {"prefill_qkv", "prefill_layer_end", "prefill_end", "decode_qkv", "token"};

/* ks.unhook(name) from begin: this request runs without the handler `name` (the engine then
 * sees no handler for that event; ks_lpol_begin re-arms every handler at the next request). */
static int l_unhook(lua_State *L) {
    ks_lctx *c = ks_lua_ctx(L);
    if (!c || !c->pol || c->in_event) return ks_lua_errorf(L, "unhook", "only inside a policy's begin");
    const char *nm = luaL_checkstring(L, 1);
    for (int i = 0; i < KS_EV_COUNT; i++)
        if (!strcmp(nm, ks_lpol_handler_names[i])) {
            c->pol->pol.on[i] = NULL;
            return 0;
        }
    return ks_lua_errorf(L, "unhook", "unknown event '%s' (events: prefill_qkv, prefill_layer_end, prefill_end, "
                                      "decode_qkv, token)", nm);
}

/* ks.kv_ring{sinks = S, budget = B} from begin: this request's KV layers are rings of B rows
 * whose first S stay (core/policy.h, ks_policy.ring_*). Integers, 0 <= S < B. Lasts one request
 * (ks_lpol_begin clears it). */
static int ring_field(lua_State *L, const char *k, lua_Integer *out) {
    lua_getfield(L, 1, k);
    int ok = lua_isinteger(L, -1);
    if (ok) *out = lua_tointeger(L, -1);
    else if (!lua_isnil(L, -1) && lua_type(L, -1) == LUA_TNUMBER) {
        lua_Number v = lua_tonumber(L, -1);
        lua_pop(L, 1);
        return ks_lua_errorf(L, "kv_ring", "%s must be an integer, got %g", k, v);
    } else {
        const char *tn = luaL_typename(L, -1);
        lua_pop(L, 1);
        return ks_lua_errorf(L, "kv_ring", "%s must be an integer, got %s", k, tn);
    }
    lua_pop(L, 1);
    return 0;
}

static int l_kv_ring(lua_State *L) {
    ks_lctx *c = ks_lua_ctx(L);
    if (!c || !c->pol || c->in_event) return ks_lua_errorf(L, "kv_ring", "only inside a policy's begin");
    if (!lua_istable(L, 1)) return ks_lua_errorf(L, "kv_ring", "expects a table {sinks = S, budget = B}, got %s", luaL_typename(L, 1));
    lua_Integer sk = 0, bu = 0;
    ring_field(L, "sinks", &sk);
    ring_field(L, "budget", &bu);
    if (sk < 0) return ks_lua_errorf(L, "kv_ring", "sinks = %lld must be >= 0", (long long)sk);
    if (bu <= sk) return ks_lua_errorf(L, "kv_ring", "budget = %lld must exceed sinks = %lld", (long long)bu, (long long)sk);
    if (bu > INT32_MAX / 2) return ks_lua_errorf(L, "kv_ring", "budget = %lld is too large", (long long)bu);
    lua_pushnil(L);
    while (lua_next(L, 1)) { /* no other keys: a misspelt one would be silently ignored */
        const char *k = lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : NULL;
        if (!k || (strcmp(k, "sinks") && strcmp(k, "budget")))
            return ks_lua_errorf(L, "kv_ring", "unknown key %s (keys: sinks, budget)", k ? k : luaL_typename(L, -2));
        lua_pop(L, 1);
    }
    c->pol->pol.ring_sinks = (int)sk;
    c->pol->pol.ring_budget = (int)bu;
    return 0;
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
    ks_lt_dev_settle(L); /* garbage freed; what the policy still references stays on the device */
    return 0;
}

ks_status ks_lpol_trampoline(void *ud, ks_event *ev) {
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
    if (ev->sess && ks_session_interrupt(ev->sess)) c->interrupt = ks_session_interrupt(ev->sess);
    /* where the views live: host memory on the CPU backend (or the emulated device), else on
     * the engine's device when it has primitives */
    c->dev = NULL;
    if (ev->be && p->dev_mode != DEV_HOST) {
        if (is_cpu(ev)) c->dev = p->dev_mode == DEV_EMULATE ? ks_lua_emu_backend() : NULL;
        else if (ev->be->prims) c->dev = (ks_backend *)ev->be;
    }
    c->dev_limit = p->dev_limit;
    call_args a = {p, ev, p->ref_fn[ev->kind]};
    p->busy = 1;
    ks_status st = ks_lpol_protected(p, L, l_dispatch, &a, name, ev->layer);
    p->busy = 0;
    ks_lt_dev_drop(L); /* after a failure: what this event made is freed (kept ones stay) */
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

ks_status ks_lpol_begin(void *ud, ks_session *s) {
    ks_lpol *p = ud;
    ks_lpol_report_clear(p);
    for (int i = 0; i < KS_EV_COUNT; i++) /* every handler on again (ks.unhook lasts one request) */
        p->pol.on[i] = p->ref_fn[i] != LUA_NOREF ? ks_lpol_trampoline : NULL;
    p->pol.ring_sinks = p->pol.ring_budget = 0; /* ks.kv_ring lasts one request too */
    if (p->ref_begin == LUA_NOREF) return KS_OK;
    if (p->busy) return ks_errorf(KS_ERR_POLICY, "policy %s: begin: the policy is already running (re-entered)", p->name);
    lua_State *L = p->run_L;
    ks_lctx *c = ks_lua_ctx(L);
    struct ks_lpol *saved_pol = c->pol;
    volatile sig_atomic_t *saved_int = c->interrupt;
    c->pol = p;
    if (s && ks_session_interrupt(s)) c->interrupt = ks_session_interrupt(s);
    call_args a = {p, NULL, p->ref_begin};
    p->busy = 1;
    ks_status st = ks_lpol_protected(p, L, l_begin_call, &a, "begin", -1);
    p->busy = 0;
    c->pol = saved_pol;
    c->interrupt = saved_int;
    return st;
}

/* ================================================================ the module's policy functions */

static void event_mt(lua_State *L);

void ks_policy_module_open(lua_State *L, int sandboxed) {
    (void)sandboxed;
    lua_pushcfunction(L, l_report);
    lua_setfield(L, -2, "report");
    lua_pushcfunction(L, l_unhook);
    lua_setfield(L, -2, "unhook");
    lua_pushcfunction(L, l_kv_ring);
    lua_setfield(L, -2, "kv_ring");
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
                                           {"attend", l_ev_attend},   {"stop", l_ev_stop},           {"discard_kv", l_ev_discard_kv},
                                           {"report", l_ev_report},   {"release", l_ev_release},     {"replay", l_ev_replay},
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

int ks_lpol_busy(const ks_policy *pol) {
    ks_lpol *p = ks_lpol_of((ks_policy *)pol);
    return p && p->busy;
}
