/* module.c — the `kvsieve` Lua module for scripts (`kvsieve run`) and the REPL.
 *
 *   local ks = require "kvsieve"
 *   m = ks.load(dir [, {backend = "cpu", threads = N}])
 *   m.config                      n_layers, n_heads, n_kv_heads, head_dim, dim, vocab, max_pos, arch, ...
 *   m:encode(text [, {special = true}]) -> {ids}     m:token_str(id)
 *   m:decode(ids [, {special = false}]) -> text      (special = true keeps special tokens)
 *   s = m:session()
 *   r = s:generate(prompt_text_or_ids, {n = 32, temp = 0, top_p = 1, seed = 0, special = true,
 *                  top_k = 0, min_p = 0, repeat_penalty = 1, stop = "text" | {"a", "b"} (up to 16),
 *                  policy = "name" | "path.lua" | policy object | {inline handlers},
 *                  set = {k = 64}, fallback = false, stream = function(piece, id) end})
 *   r.text r.ids r.prompt_tokens r.prefill_s r.decode_s r.tps r.kv_rows r.active_rows
 *   r.restart r.report r.selection_layer r.policy r.policy_error r.fallback r.stopped_at
 *   r.kept(layer, head) -> {positions}
 *   pol = ks.policy(name_or_path_or_table [, {k = 64}])   (m:policy(...) also exposes m.config)
 *   pol.name pol.params pol.report pol.failures pol:set(k, v) pol:get(k) pol:close()
 *   ks.tensor / ks.zeros / ks.stack and the primitives (prims_lua.c)
 *
 * This file: the module table, models, the option and buffer helpers, host states; policy
 * objects are lua/module_policy.c, sessions and results lua/module_session.c (module_impl.h).
 * Objects own C resources through boxes with __gc (and :close()), so an error anywhere
 * leaks nothing: C memory is only held across calls that cannot raise, or sits in a box.
 * A model is reference-counted by its sessions: m:close() with live sessions defers the
 * free to the last session's close. Policies given by name or as a table are loaded for
 * one generate and freed with their box; a policy object's `set` overrides are restored
 * after the generate. */
#include "module_impl.h"

#include <lualib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CTX_KEY "kvsieve.ctx"

static volatile sig_atomic_t *g_interrupt;

void ks_lua_set_interrupt(volatile sig_atomic_t *flag) { g_interrupt = flag; }
volatile sig_atomic_t *ks_lua_get_interrupt(void) { return g_interrupt; }

/* ================================================================ context */

/* Make sure L (and the main thread) point at the state's ks_lctx, creating it once. */
ks_lctx *ks_lm_ensure_ctx(lua_State *L) {
    ks_lctx *c;
    if (lua_getfield(L, LUA_REGISTRYINDEX, CTX_KEY) == LUA_TUSERDATA) c = lua_touserdata(L, -1);
    else {
        c = lua_newuserdatauv(L, sizeof *c, 0);
        memset(c, 0, sizeof *c);
        c->layer = -1;
        lua_setfield(L, LUA_REGISTRYINDEX, CTX_KEY);
    }
    lua_pop(L, 1);
    ks_lua_set_ctx(L, c);
    lua_rawgeti(L, LUA_REGISTRYINDEX, LUA_RIDX_MAINTHREAD);
    ks_lua_set_ctx(lua_tothread(L, -1), c);
    lua_pop(L, 1);
    return c;
}

/* ================================================================ C buffers */

static int l_cbuf_gc(lua_State *L) {
    cbuf *b = luaL_checkudata(L, 1, CBUF_MT);
    free(b->p);
    b->p = NULL;
    return 0;
}

/* A box for a malloc'd pointer, freed by the GC (push it before calling the allocating API). */
cbuf *ks_lm_push_cbuf(lua_State *L) {
    cbuf *b = lua_newuserdatauv(L, sizeof *b, 0);
    b->p = NULL;
    luaL_setmetatable(L, CBUF_MT);
    return b;
}

/* ================================================================ options */

void ks_lm_check_keys(lua_State *L, int idx, const char *fn, const char *const *allowed) {
    if (lua_isnoneornil(L, idx)) return;
    luaL_checktype(L, idx, LUA_TTABLE);
    idx = lua_absindex(L, idx);
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        lua_pop(L, 1);
        int ok = 0;
        if (lua_type(L, -1) == LUA_TSTRING)
            for (int i = 0; allowed[i]; i++)
                if (!strcmp(lua_tostring(L, -1), allowed[i])) ok = 1;
        if (!ok) {
            char list[512] = "";
            for (int i = 0; allowed[i]; i++) {
                size_t l = strlen(list);
                snprintf(list + l, sizeof list - l, "%s%s", i ? ", " : "", allowed[i]);
            }
            luaL_error(L, "%s: unknown option '%s' (options: %s)", fn, luaL_tolstring(L, -1, NULL), list);
        }
    }
}

lua_Integer ks_lm_opt_int(lua_State *L, int idx, const char *k, lua_Integer def) {
    if (!lua_istable(L, idx)) return def;
    lua_getfield(L, idx, k);
    lua_Integer v = def;
    if (!lua_isnil(L, -1)) {
        int ok;
        v = lua_tointegerx(L, -1, &ok);
        if (!ok) luaL_error(L, "option %s must be an integer, got %s", k, luaL_tolstring(L, -1, NULL));
    }
    lua_pop(L, 1);
    return v;
}

lua_Number ks_lm_opt_num(lua_State *L, int idx, const char *k, lua_Number def) {
    if (!lua_istable(L, idx)) return def;
    lua_getfield(L, idx, k);
    lua_Number v = def;
    if (!lua_isnil(L, -1)) {
        int ok;
        v = lua_tonumberx(L, -1, &ok);
        if (!ok) luaL_error(L, "option %s must be a number", k);
    }
    lua_pop(L, 1);
    return v;
}

int ks_lm_opt_bool(lua_State *L, int idx, const char *k, int def) {
    if (!lua_istable(L, idx)) return def;
    lua_getfield(L, idx, k);
    int v = lua_isnil(L, -1) ? def : lua_toboolean(L, -1);
    lua_pop(L, 1);
    return v;
}

/* ================================================================ models */

void ks_lm_model_release(lmodel *lm) {
    if (lm && --lm->refs == 0) {
        ks_model_close(lm->m);
        free(lm);
    }
}

model_box *ks_lm_check_model(lua_State *L, int arg) {
    model_box *b = luaL_checkudata(L, arg, MODEL_MT);
    if (!b->lm) luaL_error(L, "model used after it was closed");
    return b;
}

/* ks.load(dir [, {backend = "cpu" | "cuda", threads = N}]) */
static int l_load(lua_State *L) {
    lua_settop(L, 2);
    const char *dir = luaL_checkstring(L, 1);
    static const char *const allowed[] = {"backend", "threads", NULL};
    ks_lm_check_keys(L, 2, "load", allowed);
    const char *backend = "cpu";
    if (lua_istable(L, 2)) {
        lua_getfield(L, 2, "backend");
        if (!lua_isnil(L, -1)) backend = luaL_checkstring(L, -1);
        lua_pop(L, 1); /* the string stays referenced by the options table */
    }
    ks_model_opts mo;
    ks_model_opts_default(&mo);
    mo.backend = backend;
    mo.threads = (int)ks_lm_opt_int(L, 2, "threads", 0);
    model_box *b = lua_newuserdatauv(L, sizeof *b, 0);
    b->lm = NULL;
    luaL_setmetatable(L, MODEL_MT);
    lmodel *lm = calloc(1, sizeof *lm);
    if (!lm) return luaL_error(L, "load: out of memory");
    if (ks_model_open_ex(dir, &mo, &lm->m)) {
        free(lm);
        return luaL_error(L, "load %s: %s", dir, ks_last_error());
    }
    lm->refs = 1;
    b->lm = lm;
    return 1;
}

static int l_model_close(lua_State *L) {
    model_box *b = luaL_checkudata(L, 1, MODEL_MT);
    ks_lm_model_release(b->lm);
    b->lm = NULL;
    return 0;
}

static int l_model_encode(lua_State *L) {
    lua_settop(L, 3);
    model_box *b = ks_lm_check_model(L, 1);
    const char *text = luaL_checkstring(L, 2);
    static const char *const allowed[] = {"special", NULL};
    ks_lm_check_keys(L, 3, "encode", allowed);
    int special = ks_lm_opt_bool(L, 3, "special", 1);
    cbuf *buf = ks_lm_push_cbuf(L);
    int32_t *ids;
    int n;
    ks_status st = ks_tokenize(b->lm->m, text, special, &ids, &n);
    if (st) return luaL_error(L, "encode: %s", ks_last_error());
    buf->p = ids;
    lua_createtable(L, n, 0);
    for (int i = 0; i < n; i++) {
        lua_pushinteger(L, ids[i]);
        lua_rawseti(L, -2, i + 1);
    }
    return 1;
}

static int l_model_decode(lua_State *L) {
    /* m:decode(ids [, {special = true}]): special keeps special tokens (HF's
     * skip_special_tokens=False), so that m:decode(m:encode(x, {special = false}), {special =
     * true}) == x; the options are read first and dropped (the ids' conversion pushes on top) */
    lua_settop(L, 3);
    static const char *const allowed[] = {"special", NULL};
    ks_lm_check_keys(L, 3, "decode", allowed);
    unsigned flags = ks_lm_opt_bool(L, 3, "special", 0) ? KS_DECODE_SPECIAL : 0;
    lua_settop(L, 2);
    model_box *b = ks_lm_check_model(L, 1);
    ks_tensor *t = ks_lt_arg(L, 2, KS_T_I32, "decode");
    if (t->ndim != 1) return luaL_error(L, "decode: ids must be a 1-d list");
    int pushed;
    const int32_t *ids = ks_lt_contig(L, lua_gettop(L), t, &pushed);
    cbuf *buf = ks_lm_push_cbuf(L);
    char *text;
    ks_status st = ks_detokenize_ex(b->lm->m, ids, (int)t->numel, flags, &text);
    if (st) return luaL_error(L, "decode: %s", ks_last_error());
    buf->p = text;
    lua_pushstring(L, text);
    return 1;
}

static int l_model_token_str(lua_State *L) {
    lua_settop(L, 2);
    model_box *b = ks_lm_check_model(L, 1);
    lua_Integer id = luaL_checkinteger(L, 2);
    const ks_tokenizer *tok = ks_model_tokenizer(b->lm->m);
    const char *s = tok && id >= 0 && id <= INT32_MAX ? ks_tokenizer_token_str(tok, (int32_t)id) : NULL;
    if (s) lua_pushstring(L, s);
    else lua_pushnil(L);
    return 1;
}

static int l_model_index(lua_State *L) {
    if (lua_getfield(L, lua_upvalueindex(1), luaL_checkstring(L, 2)) != LUA_TNIL) return 1;
    lua_pop(L, 1);
    const char *k = lua_tostring(L, 2);
    model_box *b = ks_lm_check_model(L, 1);
    if (!strcmp(k, "config")) ks_lua_push_config(L, b->lm->m);
    else if (!strcmp(k, "dir")) lua_pushstring(L, ks_model_dir(b->lm->m));
    else if (!strcmp(k, "has_tokenizer")) lua_pushboolean(L, ks_model_tokenizer(b->lm->m) != NULL);
    else return luaL_error(L, "model: no field or method '%s'", k);
    return 1;
}

static int l_model_tostring(lua_State *L) {
    model_box *b = luaL_checkudata(L, 1, MODEL_MT);
    if (!b->lm) lua_pushliteral(L, "model(closed)");
    else {
        const ks_config *c = ks_model_config(b->lm->m);
        lua_pushfstring(L, "model(%s, %s: %d layers, %d heads, %d kv heads, dim %d)", ks_model_dir(b->lm->m), c->model_type, c->n_layers,
                        c->n_heads, c->n_kv_heads, c->dim);
    }
    return 1;
}

/* ================================================================ the module */

static int l_isatty(lua_State *L) {
    lua_pushboolean(L, isatty((int)luaL_optinteger(L, 1, 1)));
    return 1;
}

void ks_lm_new_class(lua_State *L, const char *mt, const luaL_Reg *methods, lua_CFunction index, lua_CFunction gc,
                      lua_CFunction tostring) {
    luaL_newmetatable(L, mt);
    lua_newtable(L);
    luaL_setfuncs(L, methods, 0);
    if (index) {
        lua_pushcclosure(L, index, 1);
        lua_setfield(L, -2, "__index");
    } else lua_setfield(L, -2, "__index");
    if (gc) {
        lua_pushcfunction(L, gc);
        lua_setfield(L, -2, "__gc");
        lua_pushcfunction(L, gc);
        lua_setfield(L, -2, "__close");
    }
    if (tostring) {
        lua_pushcfunction(L, tostring);
        lua_setfield(L, -2, "__tostring");
    }
    lua_pushstring(L, mt);
    lua_setfield(L, -2, "__name");
    lua_pushstring(L, mt);
    lua_setfield(L, -2, "__metatable");
    lua_pop(L, 1);
}

int luaopen_kvsieve(lua_State *L) {
    ks_lm_ensure_ctx(L);
    static const luaL_Reg model_m[] = {{"encode", l_model_encode}, {"decode", l_model_decode}, {"token_str", l_model_token_str},
                                       {"session", ks_lm_model_session}, {"policy", ks_lm_model_policy}, {"close", l_model_close},
                                       {NULL, NULL}};
    ks_lm_new_class(L, MODEL_MT, model_m, l_model_index, l_model_close, l_model_tostring);
    ks_lm_session_open(L);
    ks_lm_policy_open(L);
    luaL_newmetatable(L, CBUF_MT);
    lua_pushcfunction(L, l_cbuf_gc);
    lua_setfield(L, -2, "__gc");
    lua_pop(L, 1);

    lua_newtable(L);
    int mod = lua_gettop(L);
    ks_lt_open(L);
    ks_prims_open(L);
    ks_policy_module_open(L, 0);
    static const luaL_Reg fns[] = {{"load", l_load}, {"policy", ks_lm_policy}, {"_isatty", l_isatty}, {NULL, NULL}};
    luaL_setfuncs(L, fns, 0);
    lua_pushliteral(L, "0.1");
    lua_setfield(L, mod, "version");
    /* the prelude adds the Lua-side helpers (show_kept, kept_table, sparkline, ...) */
    if (luaL_loadbufferx(L, ks_prelude_lua, strlen(ks_prelude_lua), "=[kvsieve prelude]", "t") != LUA_OK) return lua_error(L);
    lua_pushvalue(L, mod);
    luaL_getmetatable(L, "kvsieve.result");
    lua_call(L, 2, 0);
    lua_settop(L, mod);
    return 1;
}

/* ================================================================ host states */

static int l_host_setup(lua_State *L) {
    luaL_openlibs(L);
    luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_PRELOAD_TABLE);
    lua_pushcfunction(L, luaopen_kvsieve);
    lua_setfield(L, -2, "kvsieve");
    lua_pop(L, 1);
    ks_lm_ensure_ctx(L);
    return 0;
}

lua_State *ks_lua_host_state(void) {
    lua_State *L = luaL_newstate();
    if (!L) return NULL;
    ks_lua_set_ctx(L, NULL);
    lua_pushcfunction(L, l_host_setup);
    if (lua_pcall(L, 0, 0, 0) != LUA_OK) {
        lua_close(L);
        return NULL;
    }
    return L;
}

void ks_lua_host_close(lua_State *L) {
    if (L) lua_close(L);
}
