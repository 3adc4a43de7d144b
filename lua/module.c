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
 * Objects own C resources through boxes with __gc (and :close()), so an error anywhere
 * leaks nothing: C memory is only held across calls that cannot raise, or sits in a box.
 * A model is reference-counted by its sessions: m:close() with live sessions defers the
 * free to the last session's close. Policies given by name or as a table are loaded for
 * one generate and freed with their box; a policy object's `set` overrides are restored
 * after the generate. */
#include "ks_lua.h"
#include "policy_lua.h"

#include <lualib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MODEL_MT "kvsieve.model"
#define SESSION_MT "kvsieve.session"
#define POLICY_MT "kvsieve.policy"
#define CBUF_MT "kvsieve.cbuf"
#define KEPT_MT "kvsieve.kept"
#define CTX_KEY "kvsieve.ctx"

static volatile sig_atomic_t *g_interrupt;

void ks_lua_set_interrupt(volatile sig_atomic_t *flag) { g_interrupt = flag; }
volatile sig_atomic_t *ks_lua_get_interrupt(void) { return g_interrupt; }

/* ================================================================ context */

/* Make sure L (and the main thread) point at the state's ks_lctx, creating it once. */
static ks_lctx *ensure_ctx(lua_State *L) {
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

typedef struct cbuf { void *p; } cbuf;

static int l_cbuf_gc(lua_State *L) {
    cbuf *b = luaL_checkudata(L, 1, CBUF_MT);
    free(b->p);
    b->p = NULL;
    return 0;
}

/* A box for a malloc'd pointer, freed by the GC (push it before calling the allocating API). */
static cbuf *push_cbuf(lua_State *L) {
    cbuf *b = lua_newuserdatauv(L, sizeof *b, 0);
    b->p = NULL;
    luaL_setmetatable(L, CBUF_MT);
    return b;
}

/* ================================================================ options */

static void check_keys(lua_State *L, int idx, const char *fn, const char *const *allowed) {
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

static lua_Integer opt_int(lua_State *L, int idx, const char *k, lua_Integer def) {
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

static lua_Number opt_num(lua_State *L, int idx, const char *k, lua_Number def) {
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

static int opt_boolean(lua_State *L, int idx, const char *k, int def) {
    if (!lua_istable(L, idx)) return def;
    lua_getfield(L, idx, k);
    int v = lua_isnil(L, -1) ? def : lua_toboolean(L, -1);
    lua_pop(L, 1);
    return v;
}

/* ================================================================ models */

typedef struct lmodel {
    ks_model *m;
    int refs;       /* the model box + each session */
} lmodel;

typedef struct model_box { lmodel *lm; } model_box;

static void lmodel_release(lmodel *lm) {
    if (lm && --lm->refs == 0) {
        ks_model_close(lm->m);
        free(lm);
    }
}

static model_box *check_model(lua_State *L, int arg) {
    model_box *b = luaL_checkudata(L, arg, MODEL_MT);
    if (!b->lm) luaL_error(L, "model used after it was closed");
    return b;
}

/* ks.load(dir [, {backend = "cpu" | "cuda", threads = N}]) */
static int l_load(lua_State *L) {
    lua_settop(L, 2);
    const char *dir = luaL_checkstring(L, 1);
    static const char *const allowed[] = {"backend", "threads", NULL};
    check_keys(L, 2, "load", allowed);
    const char *backend = "cpu";
    if (lua_istable(L, 2)) {
        lua_getfield(L, 2, "backend");
        if (!lua_isnil(L, -1)) backend = luaL_checkstring(L, -1);
        lua_pop(L, 1); /* the string stays referenced by the options table */
    }
    int threads = (int)opt_int(L, 2, "threads", 0);
    model_box *b = lua_newuserdatauv(L, sizeof *b, 0);
    b->lm = NULL;
    luaL_setmetatable(L, MODEL_MT);
    lmodel *lm = calloc(1, sizeof *lm);
    if (!lm) return luaL_error(L, "load: out of memory");
    ks_status st;
    if (threads > 0 && !strcmp(backend, "cpu")) {
        ks_backend *be;
        ks_backend_opts bo = ks_backend_opts_default();
        bo.n_threads = threads;
        st = ks_cpu_backend_create(&bo, &be);
        if (!st) {
            st = ks_model_load(dir, be, 0, &lm->m);
            if (st) ks_backend_free(be);
        }
    } else st = ks_model_open(dir, backend, &lm->m);
    if (st) {
        free(lm);
        return luaL_error(L, "load %s: %s", dir, ks_last_error());
    }
    lm->refs = 1;
    b->lm = lm;
    return 1;
}

static int l_model_close(lua_State *L) {
    model_box *b = luaL_checkudata(L, 1, MODEL_MT);
    lmodel_release(b->lm);
    b->lm = NULL;
    return 0;
}

static int l_model_encode(lua_State *L) {
    lua_settop(L, 3);
    model_box *b = check_model(L, 1);
    const char *text = luaL_checkstring(L, 2);
    static const char *const allowed[] = {"special", NULL};
    check_keys(L, 3, "encode", allowed);
    int special = opt_boolean(L, 3, "special", 1);
    cbuf *buf = push_cbuf(L);
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
    check_keys(L, 3, "decode", allowed);
    unsigned flags = opt_boolean(L, 3, "special", 0) ? KS_DECODE_SPECIAL : 0;
    lua_settop(L, 2);
    model_box *b = check_model(L, 1);
    ks_tensor *t = ks_lt_arg(L, 2, KS_T_I32, "decode");
    if (t->ndim != 1) return luaL_error(L, "decode: ids must be a 1-d list");
    int pushed;
    const int32_t *ids = ks_lt_contig(L, lua_gettop(L), t, &pushed);
    cbuf *buf = push_cbuf(L);
    char *text;
    ks_status st = ks_detokenize_ex(b->lm->m, ids, (int)t->numel, flags, &text);
    if (st) return luaL_error(L, "decode: %s", ks_last_error());
    buf->p = text;
    lua_pushstring(L, text);
    return 1;
}

static int l_model_token_str(lua_State *L) {
    lua_settop(L, 2);
    model_box *b = check_model(L, 1);
    lua_Integer id = luaL_checkinteger(L, 2);
    const ks_tokenizer *tok = ks_model_tokenizer(b->lm->m);
    const char *s = tok && id >= 0 && id <= INT32_MAX ? ks_tokenizer_token_str(tok, (int32_t)id) : NULL;
    if (s) lua_pushstring(L, s);
    else lua_pushnil(L);
    return 1;
}

static int l_model_session(lua_State *L);
static int l_model_policy(lua_State *L);

static int l_model_index(lua_State *L) {
    if (lua_getfield(L, lua_upvalueindex(1), luaL_checkstring(L, 2)) != LUA_TNIL) return 1;
    lua_pop(L, 1);
    const char *k = lua_tostring(L, 2);
    model_box *b = check_model(L, 1);
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

/* ================================================================ policies */

typedef struct policy_box {
    ks_policy *p;
    int busy; /* a generate runs with it */
} policy_box;

/* p:close() and __gc. Freeing a policy while a generate uses it (from the stream callback) or
 * while its own handler runs (an inline policy's handler can reach its box) would leave the
 * engine and the trampoline on freed memory: refused with a named error instead (the box
 * is on generate's stack meanwhile, so __gc cannot come then). */
static int l_policy_gc(lua_State *L) {
    policy_box *b = luaL_checkudata(L, 1, POLICY_MT);
    if (b->p && (b->busy || ks_lpol_busy(b->p)))
        return luaL_error(L, "policy %s: cannot close it while it runs (from its own handler or from the stream callback of a "
                             "generate that uses it): close it after generate returns", ks_policy_name(b->p));
    if (b->p) ks_policy_free(b->p);
    b->p = NULL;
    return 0;
}

static policy_box *check_policy(lua_State *L, int arg) {
    policy_box *b = luaL_checkudata(L, arg, POLICY_MT);
    if (!b->p) luaL_error(L, "policy used after it was closed");
    ks_lpol_set_thread(ks_lpol_of(b->p), L);
    return b;
}

static policy_box *push_policy_box(lua_State *L) {
    policy_box *b = lua_newuserdatauv(L, sizeof *b, 0);
    b->p = NULL;
    b->busy = 0;
    luaL_setmetatable(L, POLICY_MT);
    return b;
}

/* A Lua value as the text ks_policy_set parses. */
static const char *value_text(lua_State *L, int idx, char *buf, size_t n) {
    switch (lua_type(L, idx)) {
    case LUA_TNUMBER:
        if (lua_isinteger(L, idx)) snprintf(buf, n, "%lld", (long long)lua_tointeger(L, idx));
        else snprintf(buf, n, "%.17g", lua_tonumber(L, idx));
        return buf;
    case LUA_TBOOLEAN: return lua_toboolean(L, idx) ? "true" : "false";
    case LUA_TSTRING: return lua_tostring(L, idx);
    default: luaL_error(L, "policy parameters take numbers, booleans or strings, got %s", luaL_typename(L, idx)); return NULL;
    }
}

static void set_param(lua_State *L, ks_policy *p, int kidx, int vidx) {
    if (lua_type(L, kidx) != LUA_TSTRING) luaL_error(L, "set: parameter names are strings, got %s", luaL_typename(L, kidx));
    char buf[64];
    const char *v = value_text(L, vidx, buf, sizeof buf);
    if (ks_policy_set(p, lua_tostring(L, kidx), v)) luaL_error(L, "%s", ks_last_error());
}

/* Apply the table of overrides at idx. */
static void apply_sets(lua_State *L, ks_policy *p, int idx) {
    idx = lua_absindex(L, idx);
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        set_param(L, p, -2, -1);
        lua_pop(L, 1);
    }
}

/* Restore the saved values (table at saved: name -> text) of a policy object. */
static void restore_params(lua_State *L, ks_policy *p, int saved) {
    lua_pushnil(L);
    while (lua_next(L, saved)) {
        ks_policy_set(p, lua_tostring(L, -2), lua_tostring(L, -1));
        lua_pop(L, 1);
    }
}

/* apply_sets, restoring the saved values (if saved != 0) before raising an error. */
static void apply_sets_restoring(lua_State *L, ks_policy *p, int idx, int saved) {
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        char buf[64];
        if (lua_type(L, -2) != LUA_TSTRING) luaL_error(L, "set: parameter names are strings, got %s", luaL_typename(L, -2));
        int vt = lua_type(L, -1);
        if (vt != LUA_TNUMBER && vt != LUA_TBOOLEAN && vt != LUA_TSTRING)
            luaL_error(L, "set %s: policy parameters take numbers, booleans or strings, got %s", lua_tostring(L, -2), luaL_typename(L, -1));
        const char *v = value_text(L, -1, buf, sizeof buf);
        if (ks_policy_set(p, lua_tostring(L, -2), v)) {
            lua_pushstring(L, ks_last_error());
            if (saved) restore_params(L, p, saved);
            lua_error(L);
        }
        lua_pop(L, 1);
    }
}

/* Resolve a policy argument (name/path string, policy object, inline table) to a box on
 * the stack; m may be NULL. Returns the box. */
static policy_box *resolve_policy(lua_State *L, int arg, ks_model *m) {
    arg = lua_absindex(L, arg);
    if (luaL_testudata(L, arg, POLICY_MT)) {
        lua_pushvalue(L, arg);
        return check_policy(L, -1);
    }
    policy_box *b = push_policy_box(L);
    if (lua_type(L, arg) == LUA_TSTRING) {
        /* names are looked up first on the module's policy_path (a colon-separated string; the
         * CLI sets it from $KVSIEVE_POLICY_PATH), which stays on the stack during the load */
        int top = lua_gettop(L);
        const char *sp = NULL;
        lua_getfield(L, LUA_REGISTRYINDEX, LUA_LOADED_TABLE);
        if (lua_getfield(L, -1, "kvsieve") == LUA_TTABLE && lua_getfield(L, -1, "policy_path") == LUA_TSTRING)
            sp = lua_tostring(L, -1);
        ks_status st = ks_policy_load_path(m, lua_tostring(L, arg), sp, &b->p);
        lua_settop(L, top);
        if (st) luaL_error(L, "%s", ks_last_error());
        return b;
    }
    if (lua_istable(L, arg)) {
        b->p = ks_lpol_inline_create(L);
        if (!b->p) luaL_error(L, "policy: out of memory");
        ks_lpol_inline_take(L, arg, b->p);
        return b;
    }
    luaL_error(L, "policy: a name, a path, a policy object or a table of handlers expected, got %s", luaL_typename(L, arg));
    return NULL;
}

/* ks.policy(name_or_path_or_table [, sets]) */
static int l_policy(lua_State *L) {
    lua_settop(L, 2);
    policy_box *b = resolve_policy(L, 1, NULL);
    if (!lua_isnoneornil(L, 2)) {
        luaL_checktype(L, 2, LUA_TTABLE);
        apply_sets(L, b->p, 2);
    }
    return 1;
}

/* m:policy(name_or_path [, sets]): the policy sees m.config as require("kvsieve").config */
static int l_model_policy(lua_State *L) {
    lua_settop(L, 3);
    model_box *mb = check_model(L, 1);
    policy_box *b = resolve_policy(L, 2, mb->lm->m);
    if (!lua_isnoneornil(L, 3)) {
        luaL_checktype(L, 3, LUA_TTABLE);
        apply_sets(L, b->p, 3);
    }
    return 1;
}

static int l_policy_set(lua_State *L) {
    lua_settop(L, 3);
    policy_box *b = check_policy(L, 1);
    if (lua_istable(L, 2)) apply_sets(L, b->p, 2);
    else set_param(L, b->p, 2, 3);
    lua_settop(L, 1);
    return 1;
}

static int l_policy_get(lua_State *L) {
    lua_settop(L, 2);
    policy_box *b = check_policy(L, 1);
    const char *k = luaL_checkstring(L, 2);
    char buf[4096];
    if (ks_policy_get(b->p, k, buf, sizeof buf)) return luaL_error(L, "%s", ks_last_error());
    int t = ks_lpol_param_type(b->p, k);
    if ((t == LUA_TNUMBER || k[0] == '_') && lua_stringtonumber(L, buf)) {
        /* pushed by lua_stringtonumber */
    } else if (t == LUA_TBOOLEAN) lua_pushboolean(L, !strcmp(buf, "true"));
    else lua_pushstring(L, buf);
    return 1;
}

static int l_policy_index(lua_State *L) {
    if (lua_getfield(L, lua_upvalueindex(1), luaL_checkstring(L, 2)) != LUA_TNIL) return 1;
    lua_pop(L, 1);
    const char *k = lua_tostring(L, 2);
    policy_box *b = check_policy(L, 1);
    if (!strcmp(k, "name")) lua_pushstring(L, ks_policy_name(b->p));
    else if (!strcmp(k, "params")) ks_lpol_push_params(L, b->p);
    else if (!strcmp(k, "report")) ks_lpol_push_report(L, b->p);
    else if (!strcmp(k, "failures")) ks_lpol_push_failures(L, b->p);
    else return luaL_error(L, "policy: no field or method '%s' (name, params, report, failures, set, get, close)", k);
    return 1;
}

static int l_policy_tostring(lua_State *L) {
    policy_box *b = luaL_checkudata(L, 1, POLICY_MT);
    if (!b->p) lua_pushliteral(L, "policy(closed)");
    else lua_pushfstring(L, "policy(%s)", ks_policy_name(b->p));
    return 1;
}

/* ================================================================ sessions */

typedef struct session_box {
    ks_session *s;
    lmodel *lm;
    int busy;
} session_box;

static int l_session_close(lua_State *L) {
    session_box *b = luaL_checkudata(L, 1, SESSION_MT);
    if (b->busy) return luaL_error(L, "session: cannot close it while it generates");
    if (b->s) ks_session_free(b->s);
    b->s = NULL;
    lmodel_release(b->lm);
    b->lm = NULL;
    return 0;
}

static session_box *check_session(lua_State *L, int arg) {
    session_box *b = luaL_checkudata(L, arg, SESSION_MT);
    if (!b->s) luaL_error(L, "session used after it was closed");
    return b;
}

static int l_model_session(lua_State *L) {
    model_box *mb = check_model(L, 1);
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
    check_keys(L, 3, "generate", allowed);
    lua_settop(L, 3);
    if (lua_isnil(L, 3)) {
        lua_newtable(L);
        lua_replace(L, 3);
    }
    ensure_ctx(L);
    ks_session *s = sb->s;
    ks_model *m = ks_session_model(s);
    ks_generate_opts o;
    ks_generate_opts_default(&o);
    o.max_new_tokens = (int)opt_int(L, 3, "n", 64);
    o.temperature = (float)opt_num(L, 3, "temp", 0);
    o.top_p = (float)opt_num(L, 3, "top_p", 1);
    o.seed = (uint64_t)opt_int(L, 3, "seed", 0);
    o.add_special = opt_boolean(L, 3, "special", 1);
    int fallback = opt_boolean(L, 3, "fallback", 0);
    if (o.max_new_tokens < 0) return luaL_error(L, "generate: n must be >= 0");
    /* sampling filters (ranges checked by ks_generate_ids) and stop strings: checked here, held
     * in slot 9 below */
    lua_Integer top_k = opt_int(L, 3, "top_k", 0);
    if (top_k < 0 || top_k > INT_MAX) return luaL_error(L, "generate: top_k must be in [0, %d]", INT_MAX);
    o.top_k = (int)top_k;
    o.min_p = (float)opt_num(L, 3, "min_p", 0);
    o.repeat_penalty = (float)opt_num(L, 3, "repeat_penalty", 1);
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
        cbuf *buf = push_cbuf(L);
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
        policy_box *pb = resolve_policy(L, -1, m);
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
        apply_sets_restoring(L, pol, 7, user_obj ? 6 : 0);
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
    ks_session_set_interrupt(s, g_interrupt);
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
    if (user_obj) restore_params(L, pol, 6);
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

/* ================================================================ the module */

static int l_isatty(lua_State *L) {
    lua_pushboolean(L, isatty((int)luaL_optinteger(L, 1, 1)));
    return 1;
}

static void new_class(lua_State *L, const char *mt, const luaL_Reg *methods, lua_CFunction index, lua_CFunction gc,
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
    ensure_ctx(L);
    static const luaL_Reg model_m[] = {{"encode", l_model_encode}, {"decode", l_model_decode}, {"token_str", l_model_token_str},
                                       {"session", l_model_session}, {"policy", l_model_policy}, {"close", l_model_close},
                                       {NULL, NULL}};
    new_class(L, MODEL_MT, model_m, l_model_index, l_model_close, l_model_tostring);
    static const luaL_Reg session_m[] = {{"generate", l_session_generate}, {"kept", l_session_kept}, {"reset", l_session_reset},
                                         {"close", l_session_close}, {NULL, NULL}};
    new_class(L, SESSION_MT, session_m, NULL, l_session_close, l_session_tostring);
    static const luaL_Reg policy_m[] = {{"set", l_policy_set}, {"get", l_policy_get}, {"close", l_policy_gc}, {NULL, NULL}};
    new_class(L, POLICY_MT, policy_m, l_policy_index, l_policy_gc, l_policy_tostring);
    luaL_newmetatable(L, CBUF_MT);
    lua_pushcfunction(L, l_cbuf_gc);
    lua_setfield(L, -2, "__gc");
    lua_pop(L, 1);
    luaL_newmetatable(L, KEPT_MT);
    lua_pop(L, 1);
    luaL_newmetatable(L, "kvsieve.result"); /* methods are added by the prelude */
    lua_pop(L, 1);

    lua_newtable(L);
    int mod = lua_gettop(L);
    ks_lt_open(L);
    ks_prims_open(L);
    ks_policy_module_open(L, 0);
    static const luaL_Reg fns[] = {{"load", l_load}, {"policy", l_policy}, {"_isatty", l_isatty}, {NULL, NULL}};
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
    ensure_ctx(L);
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
