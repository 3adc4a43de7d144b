/* module_session.c — sessions of the `kvsieve` module ("kvsieve.session") and what a generate
 * returns:
 *
 *   s = m:session()   s:generate(prompt_text_or_ids, opts) -> r   s:kept(layer, head)   s:reset()   s:close()
 *   r.text r.ids r.prompt_tokens r.prefill_s r.decode_s r.tps r.kv_rows r.active_rows
 *   r.restart r.report r.selection_layer r.policy r.policy_error r.fallback r.stopped_at
 *   r.kept(layer, head) -> {positions}   (a compact copy, "kvsieve.kept")
 *
 * generate's options are listed in lua/module.c's header. A session holds a reference on its
 * model (lua/module.c); the policy of a generate is resolved by lua/module_policy.c and a policy
 * object's `set` overrides are restored afterwards. The stream callback runs under a protected
 * call: its error ends the generate with that message. */
#include "module_impl.h"

#include "session_api.h" /* ks_session_reset, ks_session_kv_rows */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int l_session_close(lua_State *L) {
    session_box *b = luaL_checkudata(L, 1, SESSION_MT);
    if (b->busy) return luaL_error(L, "session: cannot close it while it generates");
    if (b->s) ks_session_free(b->s);
    b->s = NULL;
    ks_lm_model_release(b->lm);
    b->lm = NULL;
    return 0;
}

static session_box *check_session(lua_State *L, int arg) {
    session_box *b = luaL_checkudata(L, arg, SESSION_MT);
    if (!b->s) luaL_error(L, "session used after it was closed");
    return b;
}

int ks_lm_model_session(lua_State *L) {
    model_box *mb = ks_lm_check_model(L, 1);
    session_box *b = lua_newuserdatauv(L, sizeof *b, 0);
    memset(b, 0, sizeof *b);
    luaL_setmetatable(L, SESSION_MT);
    if (ks_session_create(mb->lm->m, &b->s)) return luaL_error(L, "session: %s", ks_last_error());
    b->lm = mb->lm;
    b->lm->refs++;
    return 1;
}

/* ---------------------------------------------------------------- kept positions */

/* A compact copy of every (layer, KV head) list of resident positions: a range (start, n),
 * or n explicit values at an offset into data. Identical neighbouring heads share. */
typedef struct kept_entry { int32_t range, n, a; } kept_entry;
typedef struct kept_box {
    int n_layers, n_heads;
    kept_entry *e;   /* (n_layers, n_heads) */
    int32_t *data;
} kept_box;

static void push_kept(lua_State *L, const ks_session *s) {
    const ks_config *c = ks_model_config(ks_session_model(s));
    int NL = c->n_layers, H = c->n_kv_heads;
    size_t nexp = 0;
    for (int l = 0; l < NL; l++) {
        const int32_t *prev = NULL;
        int nprev = -1;
        for (int h = 0; h < H; h++) {
            const int32_t *p;
            int n = ks_result_kept(s, l, h, &p);
            int range = 1;
            for (int i = 1; i < n && range; i++) range = p[i] == p[0] + i;
            if (!range && !(n == nprev && !memcmp(p, prev, sizeof(int32_t) * n))) nexp += n;
            prev = p;
            nprev = n;
        }
    }
    size_t esz = sizeof(kept_entry) * (size_t)NL * H;
    kept_box *k = lua_newuserdatauv(L, sizeof *k + esz + sizeof(int32_t) * nexp, 0);
    k->n_layers = NL;
    k->n_heads = H;
    k->e = (kept_entry *)(k + 1);
    k->data = (int32_t *)((char *)k->e + esz);
    luaL_setmetatable(L, KEPT_MT);
    size_t at = 0;
    for (int l = 0; l < NL; l++) {
        const int32_t *prev = NULL;
        int nprev = -1;
        for (int h = 0; h < H; h++) {
            kept_entry *e = &k->e[l * H + h];
            const int32_t *p;
            int n = ks_result_kept(s, l, h, &p);
            int range = 1;
            for (int i = 1; i < n && range; i++) range = p[i] == p[0] + i;
            if (range) *e = (kept_entry){1, n, n ? p[0] : 0};
            else if (n == nprev && !memcmp(p, prev, sizeof(int32_t) * n)) *e = e[-1];
            else {
                memcpy(k->data + at, p, sizeof(int32_t) * n);
                *e = (kept_entry){0, n, (int32_t)at};
                at += n;
            }
            prev = p;
            nprev = n;
        }
    }
}

/* r.kept(layer [, head]) — upvalue 1 is the kept box. Without head: the positions of head 0
 * if every head holds the same ones, else an error. */
static int l_kept(lua_State *L) {
    kept_box *k = luaL_checkudata(L, lua_upvalueindex(1), KEPT_MT);
    int a = lua_istable(L, 1) ? 2 : 1; /* r:kept(...) or r.kept(...) */
    lua_Integer l = luaL_checkinteger(L, a);
    if (l < 0 || l >= k->n_layers) return luaL_error(L, "kept: layer %I out of range [0, %d)", (lua_Integer)l, k->n_layers);
    lua_Integer h = 0;
    if (lua_isnoneornil(L, a + 1)) {
        const kept_entry *e0 = &k->e[l * k->n_heads];
        for (int j = 1; j < k->n_heads; j++) {
            const kept_entry *e = &k->e[l * k->n_heads + j];
            int same = e->n == e0->n && e->range == e0->range &&
                       (e->range ? e->a == e0->a || e->n == 0 : !memcmp(k->data + e->a, k->data + e0->a, sizeof(int32_t) * e->n));
            if (!same) return luaL_error(L, "kept: the KV heads of layer %I hold different positions; give a head (0..%d)", (lua_Integer)l, k->n_heads - 1);
        }
    } else {
        h = luaL_checkinteger(L, a + 1);
        if (h < 0 || h >= k->n_heads) return luaL_error(L, "kept: KV head %I out of range [0, %d)", (lua_Integer)h, k->n_heads);
    }
    const kept_entry *e = &k->e[l * k->n_heads + h];
    lua_createtable(L, e->n, 0);
    for (int i = 0; i < e->n; i++) {
        lua_pushinteger(L, e->range ? e->a + i : k->data[e->a + i]);
        lua_rawseti(L, -2, i + 1);
    }
    return 1;
}

/* ---------------------------------------------------------------- generate */

typedef struct stream_ctx {
    lua_State *L;
    int fn;          /* index of the stream function in generate's frame, 0 = none */
    char *err;       /* malloc'd message of a failed callback */
    int32_t id;
    const char *piece;
    int stop;
} stream_ctx;

static int l_stream_call(lua_State *L) {
    stream_ctx *c = lua_touserdata(L, 1);
    lua_pushvalue(L, 2); /* the stream function */
    lua_pushstring(L, c->piece);
    lua_pushinteger(L, c->id);
    lua_call(L, 2, 1);
    c->stop = lua_toboolean(L, -1);
    return 0;
}

static int l_traceback_msgh(lua_State *L) {
    const char *msg = lua_tostring(L, 1);
    luaL_traceback(L, L, msg ? msg : "(error object is not a string)", 1);
    return 1;
}

/* Called by the engine for each token: run the Lua stream function, protected (we are below
 * engine frames here: nothing may longjmp out). */
static int stream_cb(void *ud, int32_t id, const char *piece) {
    stream_ctx *c = ud;
    lua_State *L = c->L;
    if (!lua_checkstack(L, 5)) return 1;
    c->id = id;
    c->piece = piece;
    c->stop = 0;
    int base = lua_gettop(L);
    lua_pushcfunction(L, l_traceback_msgh);
    lua_pushcfunction(L, l_stream_call);
    lua_pushlightuserdata(L, c);
    lua_pushvalue(L, c->fn); /* fn is an index of generate's frame, the current one here */
    int r = lua_pcall(L, 2, 0, base + 1);
    if (r != LUA_OK) {
        const char *m = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : "out of memory";
        free(c->err);
        c->err = malloc(strlen(m) + 1);
        if (c->err) strcpy(c->err, m);
        lua_settop(L, base);
        return 1;
    }
    lua_settop(L, base);
    return c->stop;
}

static void set_int(lua_State *L, const char *k, lua_Integer v) {
    lua_pushinteger(L, v);
    lua_setfield(L, -2, k);
}
static void set_num(lua_State *L, const char *k, lua_Number v) {
    lua_pushnumber(L, v);
    lua_setfield(L, -2, k);
}

/* Build the result table of the last generate of s (copies everything it needs). */
static void push_result(lua_State *L, ks_session *s, ks_policy *pol) {
    const ks_config *c = ks_model_config(ks_session_model(s));
    lua_createtable(L, 0, 24);
    int r = lua_gettop(L);
    lua_pushstring(L, ks_result_text(s));
    lua_setfield(L, r, "text");
    int ng;
    const int32_t *ids = ks_result_ids(s, &ng);
    lua_createtable(L, ng, 0);
    for (int i = 0; i < ng; i++) {
        lua_pushinteger(L, ids[i]);
        lua_rawseti(L, -2, i + 1);
    }
    lua_setfield(L, r, "ids");
    set_int(L, "n_generated", ng);
    set_int(L, "prompt_tokens", ks_result_prompt_tokens(s));
    int np;
    const int32_t *prompt = ks_session_prompt_ids(s, &np);
    lua_createtable(L, np, 0);
    for (int i = 0; i < np; i++) {
        lua_pushinteger(L, prompt[i]);
        lua_rawseti(L, -2, i + 1);
    }
    lua_setfield(L, r, "prompt_ids");
    double tp = ks_result_prefill_seconds(s), td = ks_result_decode_seconds(s);
    set_num(L, "prefill_s", tp);
    set_num(L, "decode_s", td);
    set_num(L, "tps", (ng > 1 && td > 0) ? (ng - 1) / td : 0);
    set_num(L, "prefill_tps", tp > 0 ? ks_result_prompt_tokens(s) / tp : 0);
    set_int(L, "n_layers", c->n_layers);
    set_int(L, "n_kv_heads", c->n_kv_heads);
    /* KV rows resident per layer (summed over heads), and rows going on after each layer */
    lua_createtable(L, c->n_layers, 0);
    for (int l = 0; l < c->n_layers; l++) {
        lua_pushinteger(L, (lua_Integer)ks_session_kv_rows(s, l));
        lua_rawseti(L, -2, l + 1);
    }
    lua_setfield(L, r, "kv_rows");
    lua_createtable(L, c->n_layers, 0);
    for (int l = 0; l < c->n_layers; l++) {
        lua_pushinteger(L, ks_session_active_rows(s, l));
        lua_rawseti(L, -2, l + 1);
    }
    lua_setfield(L, r, "active_rows");
    const int32_t *ri;
    int nr = ks_result_restart(s, &ri);
    if (nr > 0) {
        lua_createtable(L, nr, 0);
        for (int i = 0; i < nr; i++) {
            lua_pushinteger(L, ri[i]);
            lua_rawseti(L, -2, i + 1);
        }
        lua_setfield(L, r, "restart");
    }
    if (ks_session_stopped_at(s) >= 0) set_int(L, "stopped_at", ks_session_stopped_at(s));
    const char *pe = ks_result_policy_error(s);
    if (pe && *pe) {
        lua_pushstring(L, pe);
        lua_setfield(L, r, "policy_error");
        lua_pushboolean(L, 1);
        lua_setfield(L, r, "fallback");
    }
    if (pol) {
        lua_pushstring(L, ks_policy_name(pol));
        lua_setfield(L, r, "policy");
        ks_lpol_push_report(L, pol);
        lua_getfield(L, -1, "selection_layer");
        lua_setfield(L, r, "selection_layer");
        lua_setfield(L, r, "report");
    } else {
        lua_newtable(L);
        lua_setfield(L, r, "report");
    }
    push_kept(L, s);
    lua_pushcclosure(L, l_kept, 1);
    lua_setfield(L, r, "kept");
    luaL_setmetatable(L, "kvsieve.result");
}

/* s:generate(prompt, opts) */
static int l_session_generate(lua_State *L) {
    static const char *const allowed[] = {"n", "temp", "top_p", "seed", "special", "policy", "set", "fallback", "stream",
                                          "top_k", "min_p", "repeat_penalty", "stop", NULL};
    session_box *sb = check_session(L, 1);
    if (sb->busy) return luaL_error(L, "generate: the session is busy (called from its own policy or stream callback?)");
    ks_lm_check_keys(L, 3, "generate", allowed);
    lua_settop(L, 3);
    if (lua_isnil(L, 3)) {
        lua_newtable(L);
        lua_replace(L, 3);
    }
    ks_lm_ensure_ctx(L);
    ks_session *s = sb->s;
    ks_model *m = ks_session_model(s);
    ks_generate_opts o;
    ks_generate_opts_default(&o);
    o.max_new_tokens = (int)ks_lm_opt_int(L, 3, "n", 64);
    o.temperature = (float)ks_lm_opt_num(L, 3, "temp", 0);
    o.top_p = (float)ks_lm_opt_num(L, 3, "top_p", 1);
    o.seed = (uint64_t)ks_lm_opt_int(L, 3, "seed", 0);
    o.add_special = ks_lm_opt_bool(L, 3, "special", 1);
    int fallback = ks_lm_opt_bool(L, 3, "fallback", 0);
    if (o.max_new_tokens < 0) return luaL_error(L, "generate: n must be >= 0");
    /* sampling filters (ranges checked by ks_generate_ids) and stop strings: checked here, held
     * in slot 9 below */
    lua_Integer top_k = ks_lm_opt_int(L, 3, "top_k", 0);
    if (top_k < 0 || top_k > INT_MAX) return luaL_error(L, "generate: top_k must be in [0, %d]", INT_MAX);
    o.top_k = (int)top_k;
    o.min_p = (float)ks_lm_opt_num(L, 3, "min_p", 0);
    o.repeat_penalty = (float)ks_lm_opt_num(L, 3, "repeat_penalty", 1);
    lua_getfield(L, 3, "stop");
    int n_stop = lua_isnil(L, -1) ? 0 : lua_type(L, -1) == LUA_TSTRING ? 1 : lua_istable(L, -1) ? (int)KS_MIN(lua_rawlen(L, -1), 17) : -1;
    if (n_stop < 0 || n_stop > 16) return luaL_error(L, "generate: stop must be a string or a list of at most 16 strings");
    for (int i = 1; i <= n_stop; i++) {
        if (lua_istable(L, -1)) lua_rawgeti(L, -1, i);
        else lua_pushvalue(L, -1);
        size_t k;
        const char *str = lua_type(L, -1) == LUA_TSTRING ? lua_tolstring(L, -1, &k) : NULL;
        if (!str || k == 0 || strlen(str) != k) return luaL_error(L, "generate: stop strings must be non-empty strings without NUL");
        lua_pop(L, 1);
    }
    lua_pop(L, 1);
    /* prompt -> ids held in Lua memory (stack slot 4) */
    const int32_t *ids;
    int n;
    if (lua_type(L, 2) == LUA_TSTRING) {
        cbuf *buf = ks_lm_push_cbuf(L);
        int32_t *t;
        if (ks_tokenize(m, lua_tostring(L, 2), o.add_special, &t, &n)) return luaL_error(L, "generate: %s", ks_last_error());
        buf->p = t;
        ids = t;
    } else {
        ks_tensor *t = ks_lt_arg(L, 2, KS_T_I32, "generate");
        if (t->ndim != 1) return luaL_error(L, "generate: the prompt must be text or a list of token ids");
        int pushed;
        ids = ks_lt_contig(L, 4, t, &pushed);
        if (pushed) lua_replace(L, 4); /* keep the contiguous copy alive in slot 4 */
        n = (int)t->numel;
    }
    if (n == 0) return luaL_error(L, "generate: the prompt is empty");
    lua_settop(L, 4);
    /* policy (slot 5) and overrides; a policy object's previous values are saved in slot 6 */
    ks_policy *pol = NULL;
    policy_box *pbox = NULL; /* held in slot 5 while generate runs */
    int user_obj = 0;
    lua_getfield(L, 3, "policy");
    if (!lua_isnil(L, -1)) {
        user_obj = luaL_testudata(L, -1, POLICY_MT) != NULL;
        policy_box *pb = ks_lm_resolve_policy(L, -1, m);
        lua_replace(L, 5);
        lua_settop(L, 5);
        pol = pb->p;
        pbox = pb;
    }
    lua_settop(L, 5);
    lua_newtable(L); /* 6: saved values */
    lua_getfield(L, 3, "set"); /* 7 */
    if (!lua_isnil(L, 7)) {
        luaL_checktype(L, 7, LUA_TTABLE);
        if (!pol) return luaL_error(L, "generate: option set needs a policy");
        if (user_obj) {
            lua_pushnil(L);
            while (lua_next(L, 7)) {
                lua_pop(L, 1);
                char buf[4096];
                if (lua_type(L, -1) == LUA_TSTRING && ks_policy_get(pol, lua_tostring(L, -1), buf, sizeof buf) == KS_OK) {
                    lua_pushvalue(L, -1);
                    lua_pushstring(L, buf);
                    lua_settable(L, 6);
                }
            }
        }
        ks_lm_apply_sets_restoring(L, pol, 7, user_obj ? 6 : 0);
    }
    lua_settop(L, 7);
    lua_getfield(L, 3, "stream"); /* 8 */
    stream_ctx sc = {.L = L, .fn = 0};
    if (!lua_isnil(L, 8)) {
        luaL_checktype(L, 8, LUA_TFUNCTION);
        sc.fn = 8;
    }
    /* 9: the stop strings' pointers, the strings kept alive by the box's user value (a copy
     * of the list), so the stream callback cannot free them by editing the options */
    lua_settop(L, 8);
    const char **stops = lua_newuserdatauv(L, sizeof(const char *) * 16, 1);
    lua_createtable(L, n_stop, 0);
    lua_getfield(L, 3, "stop");
    for (int i = 1; i <= n_stop; i++) {
        if (lua_istable(L, -1)) lua_rawgeti(L, -1, i);
        else lua_pushvalue(L, -1);
        stops[i - 1] = lua_tostring(L, -1);
        lua_rawseti(L, -3, i);
    }
    lua_pop(L, 1);
    lua_setiuservalue(L, 9, 1);
    o.stop = stops;
    o.n_stop = n_stop;
    /* run (nothing below raises until the session is restored) */
    ks_lpol_set_thread(ks_lpol_of(pol), L);
    ks_session_set_policy(s, pol);
    ks_session_set_fallback(s, fallback);
    ks_session_set_interrupt(s, ks_lua_get_interrupt());
    sb->busy = 1;
    if (pbox) pbox->busy++;
    ks_clear_error();
    ks_status st = ks_generate_ids(s, ids, n, &o, sc.fn ? stream_cb : NULL, &sc);
    if (pbox) pbox->busy--;
    sb->busy = 0;
    ks_session_set_policy(s, NULL);
    char err[2048];
    snprintf(err, sizeof err, "%s", ks_last_error());
    /* restore a policy object's overridden values */
    if (user_obj) ks_lm_restore_params(L, pol, 6);
    if (sc.err) {
        lua_pushfstring(L, "stream callback: %s", sc.err);
        free(sc.err);
        return lua_error(L);
    }
    if (st) {
        if (st == KS_ERR_INTERRUPTED) return luaL_error(L, "interrupted");
        return luaL_error(L, "generate: %s", err[0] ? err : ks_status_name(st));
    }
    push_result(L, s, pol);
    return 1;
}

static int l_session_kept(lua_State *L) {
    lua_settop(L, 3);
    session_box *b = check_session(L, 1);
    const ks_config *c = ks_model_config(ks_session_model(b->s));
    lua_Integer l = luaL_checkinteger(L, 2), h = luaL_optinteger(L, 3, 0);
    if (l < 0 || l >= c->n_layers || h < 0 || h >= c->n_kv_heads) return luaL_error(L, "kept: layer or head out of range");
    const int32_t *p;
    int n = ks_result_kept(b->s, (int)l, (int)h, &p);
    lua_createtable(L, n, 0);
    for (int i = 0; i < n; i++) {
        lua_pushinteger(L, p[i]);
        lua_rawseti(L, -2, i + 1);
    }
    return 1;
}

static int l_session_reset(lua_State *L) {
    session_box *b = check_session(L, 1);
    if (b->busy) return luaL_error(L, "reset: the session is busy");
    ks_session_reset(b->s);
    return 0;
}

static int l_session_tostring(lua_State *L) {
    session_box *b = luaL_checkudata(L, 1, SESSION_MT);
    if (!b->s) lua_pushliteral(L, "session(closed)");
    else lua_pushfstring(L, "session(%d tokens)", ks_session_n_tokens(b->s));
    return 1;
}

void ks_lm_session_open(lua_State *L) {
    static const luaL_Reg session_m[] = {{"generate", l_session_generate}, {"kept", l_session_kept}, {"reset", l_session_reset},
                                         {"close", l_session_close}, {NULL, NULL}};
    ks_lm_new_class(L, SESSION_MT, session_m, NULL, l_session_close, l_session_tostring);
    luaL_newmetatable(L, KEPT_MT);
    lua_pop(L, 1);
    luaL_newmetatable(L, "kvsieve.result"); /* methods are added by the prelude */
    lua_pop(L, 1);
}
