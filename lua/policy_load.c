/* policy_load.c — making and freeing a Lua policy (lua/lpol.h): a policy file, found by name
 * on a search path or given as a path, or a source string, loaded into its own sandboxed
 * state (sandbox.c); or an inline table of handlers in a host state (the REPL, scripts: not
 * sandboxed). Both go through take_policy_table, which checks the policy table (known keys
 * only, typo protection), takes its name, options, parameter defaults and handlers, and
 * points the ks_policy's on[] slots at the trampoline (events.c) for exactly the handlers it
 * defines. A ks_lpol embeds the ks_policy the engine sees (pol.ud == the ks_lpol). */
#include "lpol.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ================================================================ the ks_lpol of a ks_policy */

ks_lpol *ks_lpol_of(ks_policy *p) {
    extern void ks_lpol_free(void *ud);
    return p && p->free == ks_lpol_free ? (ks_lpol *)p->ud : NULL;
}

void ks_lpol_set_thread(ks_lpol *lp, lua_State *L) {
    if (lp && !lp->own_state) lp->run_L = L;
}

/* ================================================================ loading */

static int cmp_param(const void *a, const void *b) { return strcmp(((const lparam *)a)->name, ((const lparam *)b)->name); }

static void params_free(ks_lpol *p) {
    for (int i = 0; i < p->n_params; i++) free(p->params[i].name);
    free(p->params);
    p->params = NULL;
    p->n_params = 0;
}

static const char *allowed_keys =
    "name, description, paper, params, pre_rope_keys, begin, prefill_qkv, prefill_layer_end, prefill_end, decode_qkv, token";

/* Validate the policy table at idx and take what the engine needs: handlers, params, name.
 * Raises on errors (runs under pcall). */
static void take_policy_table(lua_State *L, int idx, ks_lpol *p) {
    idx = lua_absindex(L, idx);
    /* name first, so later messages can use it */
    if (lua_getfield(L, idx, "name") != LUA_TNIL) {
        if (!lua_isstring(L, -1) || lua_type(L, -1) != LUA_TSTRING) luaL_error(L, "name must be a string");
        char *nm = xstrdup(lua_tostring(L, -1));
        if (!nm) luaL_error(L, "out of memory");
        free(p->name);
        p->name = nm;
        if (p->own_state) p->ctx.name = p->name;
    }
    lua_pop(L, 1);
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        if (lua_type(L, -2) != LUA_TSTRING) luaL_error(L, "the policy table has a non-string key (%s)", luaL_typename(L, -2));
        const char *k = lua_tostring(L, -2);
        int ok = k[0] == '_';
        static const char *const plain[] = {"name", "description", "paper", "params", "pre_rope_keys", "prefill_chunk", NULL};
        for (int i = 0; !ok && plain[i]; i++) ok = !strcmp(k, plain[i]);
        if (!ok && !strcmp(k, "begin")) ok = 1;
        for (int i = 0; !ok && i < KS_EV_COUNT; i++) ok = !strcmp(k, ks_lpol_handler_names[i]);
        if (!ok) {
            if (lua_isfunction(L, -1)) luaL_error(L, "unknown handler '%s' (handlers: begin, prefill_qkv, prefill_layer_end, prefill_end, decode_qkv, token)", k);
            luaL_error(L, "unknown key '%s' in the policy table (keys: %s; private keys start with '_')", k, allowed_keys);
        }
        lua_pop(L, 1);
    }
    if (lua_getfield(L, idx, "description") > LUA_TNIL && lua_type(L, -1) != LUA_TSTRING)
        luaL_error(L, "description must be a string");
    lua_pop(L, 1);
    if (lua_getfield(L, idx, "pre_rope_keys") != LUA_TNIL) {
        if (!lua_isboolean(L, -1)) luaL_error(L, "pre_rope_keys must be a boolean");
        p->pol.want_pre_rope_keys = lua_toboolean(L, -1);
    }
    lua_pop(L, 1);
    if (lua_getfield(L, idx, "prefill_chunk") != LUA_TNIL) {
        lua_Integer c = lua_tointeger(L, -1);
        if (!lua_isinteger(L, -1) || c < 0 || c > INT32_MAX) luaL_error(L, "prefill_chunk must be a non-negative integer (0 = no chunks)");
        p->pol.prefill_chunk = (int)c;
    }
    lua_pop(L, 1);
    /* handlers */
    for (int i = 0; i < KS_EV_COUNT; i++) {
        int t = lua_getfield(L, idx, ks_lpol_handler_names[i]);
        if (t == LUA_TNIL) { lua_pop(L, 1); continue; }
        if (t != LUA_TFUNCTION) luaL_error(L, "%s must be a function, got %s", ks_lpol_handler_names[i], luaL_typename(L, -1));
        p->ref_fn[i] = luaL_ref(L, LUA_REGISTRYINDEX);
        p->pol.on[i] = ks_lpol_trampoline;
    }
    int t = lua_getfield(L, idx, "begin");
    if (t == LUA_TFUNCTION) p->ref_begin = luaL_ref(L, LUA_REGISTRYINDEX);
    else if (t != LUA_TNIL) luaL_error(L, "begin must be a function, got %s", luaL_typename(L, -1));
    else lua_pop(L, 1);
    /* params: a copy of the defaults is the live table handed to handlers */
    lua_newtable(L);
    int live = lua_gettop(L);
    t = lua_getfield(L, idx, "params");
    if (t != LUA_TNIL && t != LUA_TTABLE) luaL_error(L, "params must be a table, got %s", luaL_typename(L, -1));
    if (t == LUA_TTABLE) {
        int pt = lua_gettop(L);
        int n = 0;
        lua_pushnil(L);
        while (lua_next(L, pt)) { n++; lua_pop(L, 1); }
        p->params = calloc(n ? n : 1, sizeof *p->params);
        if (!p->params) luaL_error(L, "out of memory");
        lua_pushnil(L);
        while (lua_next(L, pt)) {
            if (lua_type(L, -2) != LUA_TSTRING) luaL_error(L, "params keys must be strings");
            const char *k = lua_tostring(L, -2);
            if (k[0] == '_') luaL_error(L, "parameter names starting with '_' are reserved (%s)", k);
            int vt = lua_type(L, -1);
            if (vt != LUA_TNUMBER && vt != LUA_TBOOLEAN && vt != LUA_TSTRING && vt != LUA_TTABLE)
                luaL_error(L, "parameter %s has a %s default (number, boolean, string or table)", k, luaL_typename(L, -1));
            lparam *pp = &p->params[p->n_params];
            pp->name = xstrdup(k);
            if (!pp->name) luaL_error(L, "out of memory");
            pp->type = vt;
            pp->is_int = vt == LUA_TNUMBER && lua_isinteger(L, -1);
            p->n_params++;
            lua_pushvalue(L, -2);
            lua_insert(L, -2);
            lua_settable(L, live);
        }
        qsort(p->params, p->n_params, sizeof *p->params, cmp_param);
    }
    lua_pop(L, 1);
    p->ref_params = luaL_ref(L, LUA_REGISTRYINDEX);
}

typedef struct load_args {
    ks_lpol *p;
    const char *src;
    size_t len;
    const char *chunkname;
} load_args;

static int l_load_chunk(lua_State *L) {
    load_args *a = lua_touserdata(L, 1);
    int r = luaL_loadbufferx(L, a->src, a->len, a->chunkname, "t");
    if (r != LUA_OK) return lua_error(L);
    lua_call(L, 0, 1);
    if (!lua_istable(L, -1))
        return luaL_error(L, "the file must return a table of handlers and params, got %s", luaL_typename(L, -1));
    take_policy_table(L, -1, a->p);
    return 0;
}

void ks_lpol_free(void *ud) {
    ks_lpol *p = ud;
    if (!p) return;
    if (p->L && p->own_state) {
        /* finalizers run under a budget so a hostile __gc cannot hang the close */
        p->ctx.budget_active = 1;
        p->ctx.instr_count = 0;
        p->ctx.instr_limit = p->ctx.instr_limit > 0 && p->ctx.instr_limit < 10000000 ? p->ctx.instr_limit : 10000000;
        p->ctx.seconds = 2;
        p->ctx.deadline = ks_now() + 2;
        lua_close(p->L);
    } else if (p->L) {
        for (int i = 0; i < KS_EV_COUNT; i++) luaL_unref(p->L, LUA_REGISTRYINDEX, p->ref_fn[i]);
        luaL_unref(p->L, LUA_REGISTRYINDEX, p->ref_begin);
        luaL_unref(p->L, LUA_REGISTRYINDEX, p->ref_params);
    }
    ks_lpol_report_clear(p);
    free(p->report);
    params_free(p);
    free(p->name);
    free(p->chunk);
    free(p);
}

static ks_lpol *lpol_new(const char *chunk) {
    ks_lpol *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->chunk = xstrdup(chunk);
    /* default name: the file name without folders and .lua */
    const char *b = strrchr(chunk, '/');
    b = b ? b + 1 : chunk;
    p->name = xstrdup(b);
    if (!p->chunk || !p->name) { free(p->chunk); free(p->name); free(p); return NULL; }
    size_t nl = strlen(p->name);
    if (nl > 4 && !strcmp(p->name + nl - 4, ".lua")) p->name[nl - 4] = 0;
    for (int i = 0; i < KS_EV_COUNT; i++) p->ref_fn[i] = LUA_NOREF;
    p->ref_begin = p->ref_params = p->ref_module = LUA_NOREF;
    p->dev_mode = DEV_AUTO;
    p->dev_limit = (size_t)DEFAULT_DEVICE_MB << 20;
    p->pol.ud = p;
    p->pol.free = ks_lpol_free;
    p->pol.begin = ks_lpol_begin;
    return p;
}

ks_status ks_policy_load_string(ks_model *m, const char *chunkname, const char *source, ks_policy **out) {
    *out = NULL;
    if (!source) return ks_errorf(KS_ERR_ARG, "ks_policy_load_string: no source");
    if (!chunkname) chunkname = "policy";
    ks_lpol *p = lpol_new(chunkname);
    if (!p) return ks_errorf(KS_ERR_OOM, "out of memory loading policy %s", chunkname);
    p->model = m;
    p->own_state = 1;
    p->ctx.sandboxed = 1;
    p->ctx.name = p->name;
    p->ctx.mem_limit = (size_t)DEFAULT_MEMORY_MB << 20;
    p->ctx.instr_limit = DEFAULT_INSTRUCTIONS;
    p->ctx.seconds = DEFAULT_SECONDS;
    p->ctx.layer = -1;
    p->L = lua_newstate(ks_lpol_alloc, &p->ctx);
    if (!p->L) { ks_lpol_free(p); return ks_errorf(KS_ERR_OOM, "policy %s: cannot create a Lua state", chunkname); }
    ks_lua_set_ctx(p->L, &p->ctx);
    p->run_L = p->L;
    lua_sethook(p->L, ks_lua_count_hook, LUA_MASKCOUNT, HOOK_EVERY);
    p->ctx.interrupt = ks_lua_get_interrupt();
    ks_status st = ks_lpol_protected(p, p->L, ks_lpol_open_sandbox, p, "setup", -1);
    if (!st) {
        char cn[1024];
        snprintf(cn, sizeof cn, "@%s", chunkname);
        load_args a = {p, source, strlen(source), cn};
        st = ks_lpol_protected(p, p->L, l_load_chunk, &a, "load", -1);
    }
    if (st) {
        /* a load failure is not a runtime failure of the policy: do not keep counts */
        ks_lpol_free(p);
        return st;
    }
    memset(p->fail_count, 0, sizeof p->fail_count);
    p->fail_logged = 0;
    p->pol.name = p->name;
    *out = &p->pol;
    return KS_OK;
}

/* ---------------------------------------------------------------- finding a policy file */

static int file_exists(const char *path) { return access(path, R_OK) == 0; }

static int is_path(const char *s) {
    size_t n = strlen(s);
    return strchr(s, '/') || (n > 4 && !strcmp(s + n - 4, ".lua"));
}

ks_status ks_policy_load(ks_model *m, const char *name_or_path, ks_policy **out) {
    return ks_policy_load_path(m, name_or_path, NULL, out);
}

ks_status ks_policy_load_path(ks_model *m, const char *name_or_path, const char *search_path, ks_policy **out) {
    *out = NULL;
    if (!name_or_path || !*name_or_path) return ks_errorf(KS_ERR_ARG, "ks_policy_load: no policy name");
    char path[4096] = "", searched[2048] = "";
    if (is_path(name_or_path)) {
        snprintf(path, sizeof path, "%s", name_or_path);
        if (!file_exists(path)) return ks_errorf(KS_ERR_IO, "policy file %s: %s", path, strerror(errno));
    } else {
        const char *dirs[64];
        int nd = 0;
        char envbuf[2048] = "", exedir[2048] = "";
        if (search_path) {
            snprintf(envbuf, sizeof envbuf, "%s", search_path);
            for (char *s = envbuf, *tok; nd < 60 && (tok = strsep(&s, ":")) != NULL;)
                if (*tok) dirs[nd++] = tok;
        }
        dirs[nd++] = "policies";
        ssize_t r = readlink("/proc/self/exe", exedir, sizeof exedir - 16);
        if (r > 0) {
            exedir[r] = 0;
            char *sl = strrchr(exedir, '/');
            if (sl) {
                strcpy(sl, "/../policies");
                dirs[nd++] = exedir;
            }
        }
        for (int i = 0; i < nd && !path[0]; i++) {
            char cand[4096];
            snprintf(cand, sizeof cand, "%s/%s.lua", dirs[i], name_or_path);
            if (file_exists(cand)) snprintf(path, sizeof path, "%s", cand);
            else {
                size_t sl = strlen(searched);
                snprintf(searched + sl, sizeof searched - sl, "%s%s", sl ? ", " : "", dirs[i]);
            }
        }
        if (!path[0])
            return ks_errorf(KS_ERR_IO, "no policy named \"%s\" (looked for %s.lua in: %s; give a search path or a file path)",
                             name_or_path, name_or_path, searched);
    }
    char *src;
    size_t len;
    ks_status st = ks_read_file(path, &src, &len);
    if (st) return st;
    if (strlen(src) != len) { free(src); return ks_errorf(KS_ERR_FORMAT, "policy file %s: contains a NUL byte", path); }
    st = ks_policy_load_string(m, path, src, out);
    free(src);
    return st;
}

/* ---------------------------------------------------------------- inline policies */

ks_policy *ks_lpol_inline_create(lua_State *L) {
    ks_lpol *p = lpol_new("inline");
    if (!p) return NULL;
    lua_rawgeti(L, LUA_REGISTRYINDEX, LUA_RIDX_MAINTHREAD);
    p->L = lua_tothread(L, -1);
    lua_pop(L, 1);
    p->run_L = L;
    p->own_state = 0;
    p->pol.name = p->name;
    return &p->pol;
}

static int l_inline_take(lua_State *L) {
    ks_lpol *p = lua_touserdata(L, 2);
    take_policy_table(L, 1, p);
    return 0;
}

void ks_lpol_inline_take(lua_State *L, int idx, ks_policy *pol) {
    ks_lpol *p = ks_lpol_of(pol);
    idx = lua_absindex(L, idx);
    lua_pushcfunction(L, l_inline_take);
    lua_pushvalue(L, idx);
    lua_pushlightuserdata(L, p);
    if (lua_pcall(L, 2, 0, 0) != LUA_OK) {
        const char *m = lua_tostring(L, -1);
        luaL_error(L, "policy %s: %s", p->name, m ? m : "invalid policy table");
    }
    p->pol.name = p->name;
}

/* ks_policy_free (any kind of policy) is in core/api.c */
