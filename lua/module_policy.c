/* module_policy.c — policy objects of the `kvsieve` module ("kvsieve.policy"):
 *
 *   pol = ks.policy(name_or_path_or_table [, {k = 64}])   m:policy(...) (the policy sees m.config)
 *   pol.name pol.params pol.report pol.failures pol:set(k, v) pol:get(k) pol:close()
 *
 * A box owns its ks_policy (freed by close / __gc, refused while it runs). Names are looked up
 * on the module's policy_path first; a table of handlers becomes an inline policy of this
 * state. Parameter values are numbers, booleans or strings, passed as ks_policy_set's text. */
#include "module_impl.h"

#include <stdio.h>
#include <string.h>

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
void ks_lm_restore_params(lua_State *L, ks_policy *p, int saved) {
    lua_pushnil(L);
    while (lua_next(L, saved)) {
        ks_policy_set(p, lua_tostring(L, -2), lua_tostring(L, -1));
        lua_pop(L, 1);
    }
}

/* apply_sets, restoring the saved values (if saved != 0) before raising an error. */
void ks_lm_apply_sets_restoring(lua_State *L, ks_policy *p, int idx, int saved) {
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
            if (saved) ks_lm_restore_params(L, p, saved);
            lua_error(L);
        }
        lua_pop(L, 1);
    }
}

/* Resolve a policy argument (name/path string, policy object, inline table) to a box on
 * the stack; m may be NULL. Returns the box. */
policy_box *ks_lm_resolve_policy(lua_State *L, int arg, ks_model *m) {
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
int ks_lm_policy(lua_State *L) {
    lua_settop(L, 2);
    policy_box *b = ks_lm_resolve_policy(L, 1, NULL);
    if (!lua_isnoneornil(L, 2)) {
        luaL_checktype(L, 2, LUA_TTABLE);
        apply_sets(L, b->p, 2);
    }
    return 1;
}

/* m:policy(name_or_path [, sets]): the policy sees m.config as require("kvsieve").config */
int ks_lm_model_policy(lua_State *L) {
    lua_settop(L, 3);
    model_box *mb = ks_lm_check_model(L, 1);
    policy_box *b = ks_lm_resolve_policy(L, 2, mb->lm->m);
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

void ks_lm_policy_open(lua_State *L) {
    static const luaL_Reg policy_m[] = {{"set", l_policy_set}, {"get", l_policy_get}, {"close", l_policy_gc}, {NULL, NULL}};
    ks_lm_new_class(L, POLICY_MT, policy_m, l_policy_index, l_policy_gc, l_policy_tostring);
}
