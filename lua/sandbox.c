/* sandbox.c — the sandbox of a Lua policy's own state (lua/lpol.h): the allocator that holds
 * the memory limit, the instruction hook that holds the instruction and wall-clock budgets
 * (and Ctrl-C), the protected-call choke point, the allow-listed standard library with its
 * C loops wrapped, and the restricted kvsieve module a policy gets from require.
 *
 * Shape of the code
 *   - One choke point, ks_lpol_protected(), runs every piece of Lua work on a policy's state:
 *     a C function under lua_pcall with a traceback handler, instruction / wall-clock budgets
 *     armed for the call, the failure classified and counted, and the message formatted as
 *     "policy NAME: WHAT: FILE:LINE: ... traceback". Nothing that can raise a Lua error runs
 *     on a policy state outside it, so no error ever longjmps across an engine frame.
 *   - The first failure of each kind is logged through ks_logf (the host's log, KS_LOG_WARN)
 *     unless ks_lua_quiet is set; every failure is counted (ks_lpol_failures).
 *   - The standard library is an allow-list (policy_lua.h): what is left out raises a
 *     "forbidden" error naming the call; load, collectgarbage, setmetatable, require and
 *     print are replaced by restricted versions; string matching and the table library are
 *     wrapped so that no C loop runs out of the budgets' reach. */
#include "lpol.h"

#include <lualib.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int ks_lua_quiet = 0; /* non-zero: log_failure logs nothing (ks_lua.h) */

const char *ks_fail_kind_name(ks_fail_kind k) {
    static const char *n[] = {"none", "error", "memory", "instructions", "timeout", "return", "stale", "forbidden", "interrupted"};
    return (unsigned)k < KS_FAIL_COUNT ? n[k] : "?";
}

/* ================================================================ the sandbox allocator and hook */

void *ks_lpol_alloc(void *ud, void *ptr, size_t osize, size_t nsize) {
    ks_lctx *c = ud;
    size_t old = ptr ? osize : 0;
    if (nsize == 0) {
        free(ptr);
        c->mem_used -= old;
        return NULL;
    }
    if (nsize <= old) { /* shrinking never fails */
        void *p = realloc(ptr, nsize);
        if (!p) return ptr;
        c->mem_used -= old - nsize;
        return p;
    }
    if (c->mem_limit && c->mem_used + (nsize - old) > c->mem_limit) {
        c->mem_exceeded = 1;
        return NULL;
    }
    void *p = realloc(ptr, nsize);
    if (!p) return NULL;
    c->mem_used += nsize - old;
    return p;
}

static void hook_raise(lua_State *L, ks_lctx *c, ks_fail_kind kind, const char *fmt, ...) {
    char msg[256], where[300] = "";
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    c->fail_kind = kind;
    /* fire on every instruction from now on, so a pcall in the policy cannot swallow this
     * for long: the next instruction outside it raises again */
    lua_sethook(L, NULL, 0, 0);
    extern void ks_lua_count_hook(lua_State *, lua_Debug *);
    lua_sethook(L, ks_lua_count_hook, LUA_MASKCOUNT, 1);
    lua_Debug ar;
    if (lua_getstack(L, 0, &ar) && lua_getinfo(L, "Sl", &ar) && ar.currentline > 0)
        snprintf(where, sizeof where, "%s:%d: ", ar.short_src, ar.currentline);
    lua_pushfstring(L, "%s%s", where, msg);
    lua_error(L);
}

void ks_lua_count_hook(lua_State *L, lua_Debug *ar) {
    (void)ar;
    ks_lctx *c = ks_lua_ctx(L);
    if (c->interrupt && *c->interrupt) hook_raise(L, c, KS_FAIL_INTERRUPTED, "interrupted");
    if (!c->budget_active) return;
    c->instr_count += HOOK_EVERY;
    if (c->instr_limit > 0 && c->instr_count > c->instr_limit)
        hook_raise(L, c, KS_FAIL_INSTRUCTIONS, "instruction budget exceeded (%lld instructions per call; parameter _instructions)",
                   c->instr_limit);
    if (c->seconds > 0) {
        double now = ks_now();
        if (c->deadline == 0) c->deadline = now + c->seconds; /* the call's first tick */
        else if (now > c->deadline)
            hook_raise(L, c, KS_FAIL_TIMEOUT, "wall-clock budget exceeded (%.3g s per call; parameter _seconds)", c->seconds);
    }
}

static void budget_start(ks_lctx *c) {
    c->fail_kind = KS_FAIL_NONE;
    c->mem_exceeded = 0;
    if (!c->sandboxed) return;
    c->instr_count = 0;
    c->deadline = 0;
    c->budget_active = 1;
}

static void budget_stop(lua_State *L, ks_lctx *c) {
    if (!c->sandboxed) return;
    c->budget_active = 0;
    lua_sethook(L, ks_lua_count_hook, LUA_MASKCOUNT, HOOK_EVERY);
}

/* ================================================================ the protected-call choke point */

static int l_msgh(lua_State *L) {
    const char *msg = lua_tostring(L, 1);
    if (!msg) {
        if (luaL_callmeta(L, 1, "__tostring") && lua_type(L, -1) == LUA_TSTRING) msg = lua_tostring(L, -1);
        else msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
    }
    luaL_traceback(L, L, msg, 1);
    return 1;
}

static void log_failure(ks_lpol *p, ks_fail_kind k, const char *msg) {
    if ((unsigned)k >= KS_FAIL_COUNT) k = KS_FAIL_ERROR;
    p->fail_count[k]++;
    if (ks_lua_quiet || (p->fail_logged & (1u << k))) return;
    p->fail_logged |= 1u << k;
    const char *nl = strchr(msg, '\n');
    ks_logf(KS_LOG_WARN, "policy %s: first failure of kind '%s' (later ones are only counted): %.*s", p->name,
            ks_fail_kind_name(k), nl ? (int)(nl - msg) : (int)strlen(msg), msg);
}

/* Drop the "[C]: in ?" frame of the pcall'd trampoline from a traceback, in place. */
static void trim_traceback(char *s) {
    char *t;
    while ((t = strstr(s, "\n\t[C]: in ?")) != NULL) memmove(t, t + 11, strlen(t + 11) + 1);
    size_t n = strlen(s), k = strlen("\nstack traceback:");
    if (n >= k && !strcmp(s + n - k, "\nstack traceback:")) s[n - k] = 0;
}

/* Run fn(ud) on L under lua_pcall with the traceback handler and the budgets. what (and
 * layer >= 0) describe the call in messages ("prefill_qkv (layer 3)", "load", "begin"); they
 * are only formatted on failure. Returns KS_OK, or KS_ERR_POLICY / KS_ERR_INTERRUPTED with
 * "policy NAME: WHAT: MESSAGE" recorded. */
ks_status ks_lpol_protected(ks_lpol *p, lua_State *L, lua_CFunction fn, void *ud, const char *what, int layer) {
    if (!lua_checkstack(L, 4)) return ks_errorf(KS_ERR_POLICY, "policy %s: %s: Lua stack overflow", p->name, what);
    ks_lctx *c = ks_lua_ctx(L);
    int base = lua_gettop(L);
    lua_pushcfunction(L, l_msgh);
    lua_pushcfunction(L, fn);
    lua_pushlightuserdata(L, ud);
    budget_start(c);
    int r = lua_pcall(L, 1, 0, base + 1);
    budget_stop(L, c);
    if (r == LUA_OK) {
        lua_settop(L, base);
        return KS_OK;
    }
    ks_fail_kind kind = c->fail_kind ? c->fail_kind : KS_FAIL_ERROR;
    char msg[1800];
    if (r == LUA_ERRMEM || (c->mem_exceeded && r == LUA_ERRERR)) {
        kind = c->mem_exceeded ? KS_FAIL_MEMORY : KS_FAIL_ERROR;
        if (c->mem_exceeded)
            snprintf(msg, sizeof msg, "memory limit of %.4g MB exceeded (parameter _memory_mb)", c->mem_limit / 1048576.0);
        else snprintf(msg, sizeof msg, "out of memory");
    } else if (lua_type(L, -1) == LUA_TSTRING) {
        snprintf(msg, sizeof msg, "%s", lua_tostring(L, -1));
        trim_traceback(msg);
    } else snprintf(msg, sizeof msg, "error in the error handler");
    lua_settop(L, base);
    if (c->mem_exceeded && kind == KS_FAIL_ERROR) kind = KS_FAIL_MEMORY;
    /* reclaim what the failed call left behind (a policy cannot define finalizers) */
    if (c->sandboxed) {
        budget_start(c);
        lua_gc(L, LUA_GCCOLLECT);
        budget_stop(L, c);
    }
    c->fail_kind = KS_FAIL_NONE;
    if (p->pol.name) log_failure(p, kind, msg); /* not while loading */
    char wl[32] = "";
    if (layer >= 0) snprintf(wl, sizeof wl, " (layer %d)", layer);
    return ks_errorf(kind == KS_FAIL_INTERRUPTED ? KS_ERR_INTERRUPTED : KS_ERR_POLICY, "policy %s: %s%s: %s", p->name, what, wl, msg);
}

/* ================================================================ the sandboxed standard library */

static int l_forbidden(lua_State *L) {
    ks_lctx *c = ks_lua_ctx(L);
    if (c) c->fail_kind = KS_FAIL_FORBIDDEN;
    return luaL_error(L, "%s is not allowed in a policy (sandbox)", lua_tostring(L, lua_upvalueindex(1)));
}

/* __index of the restricted library tables: any missing field is a forbidden call */
static int l_forbidden_index(lua_State *L) {
    ks_lctx *c = ks_lua_ctx(L);
    if (c) c->fail_kind = KS_FAIL_FORBIDDEN;
    return luaL_error(L, "%s.%s is not allowed in a policy (sandbox)", lua_tostring(L, lua_upvalueindex(1)), luaL_tolstring(L, 2, NULL));
}

static void set_forbidden(lua_State *L, int tbl, const char *qualified, const char *field) {
    lua_pushstring(L, qualified);
    lua_pushcclosure(L, l_forbidden, 1);
    lua_setfield(L, tbl, field);
}

/* A fresh table named `lib` whose missing fields raise; fields listed in keep are copied
 * from the table at src (0 = none). Leaves it on the stack. */
static void restricted_lib(lua_State *L, const char *lib, int src, const char *const *keep) {
    lua_newtable(L);
    int t = lua_gettop(L);
    for (int i = 0; keep && keep[i]; i++) {
        lua_getfield(L, src, keep[i]);
        lua_setfield(L, t, keep[i]);
    }
    lua_newtable(L);
    lua_pushstring(L, lib);
    lua_pushcclosure(L, l_forbidden_index, 1);
    lua_setfield(L, -2, "__index");
    lua_pushstring(L, lib);
    lua_setfield(L, -2, "__metatable");
    lua_setmetatable(L, t);
}

static int l_print(lua_State *L) {
    ks_lctx *c = ks_lua_ctx(L);
    int n = lua_gettop(L);
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    for (int i = 1; i <= n; i++) {
        if (i > 1) luaL_addchar(&b, '\t');
        luaL_tolstring(L, i, NULL);
        luaL_addvalue(&b);
    }
    luaL_pushresult(&b);
    ks_logf(KS_LOG_INFO, "[policy %s] %s", c && c->name ? c->name : "?", lua_tostring(L, -1)); /* host's log */
    return 0;
}

/* load(chunk [, chunkname [, mode [, env]]]) restricted to text chunks */
static int l_safe_load(lua_State *L) {
    int n = lua_gettop(L);
    if (n >= 3 && !lua_isnil(L, 3)) {
        const char *mode = luaL_checkstring(L, 3);
        if (strcmp(mode, "t")) {
            ks_lua_ctx(L)->fail_kind = KS_FAIL_FORBIDDEN;
            return luaL_error(L, "load: only text chunks (mode \"t\") are allowed in a policy (sandbox)");
        }
    }
    if (lua_type(L, 1) == LUA_TSTRING && lua_tostring(L, 1)[0] == LUA_SIGNATURE[0]) {
        ks_lua_ctx(L)->fail_kind = KS_FAIL_FORBIDDEN;
        return luaL_error(L, "load: binary chunks are not allowed in a policy (sandbox)");
    }
    lua_pushvalue(L, lua_upvalueindex(1)); /* the real load */
    lua_pushvalue(L, 1);
    lua_pushvalue(L, 2);
    lua_pushliteral(L, "t");
    int nargs = 3;
    if (n >= 4) { lua_pushvalue(L, 4); nargs = 4; }
    lua_call(L, nargs, LUA_MULTRET);
    return lua_gettop(L) - n;
}

static int l_safe_collectgarbage(lua_State *L) {
    static const char *const ok[] = {"collect", "count", "step", "isrunning", NULL};
    const char *opt = luaL_optstring(L, 1, "collect");
    for (int i = 0; ok[i]; i++)
        if (!strcmp(opt, ok[i])) {
            lua_pushvalue(L, lua_upvalueindex(1));
            lua_insert(L, 1);
            lua_call(L, lua_gettop(L) - 1, LUA_MULTRET);
            return lua_gettop(L);
        }
    ks_lua_ctx(L)->fail_kind = KS_FAIL_FORBIDDEN;
    return luaL_error(L, "collectgarbage(\"%s\") is not allowed in a policy (sandbox)", opt);
}

/* setmetatable without __gc: Lua runs finalizers with hooks disabled, so a finalizer could
 * loop forever out of the budget's reach (tables are the only objects a policy can give a
 * metatable; a __gc added to the metatable later never marks the object). The field is read
 * raw, as Lua's own check reads it: a plain read would run an __index of the metatable's own
 * metatable, which could add a raw __gc after answering nil. No policy code runs between
 * this check and the real setmetatable. The binding's own metatables (tensors, events,
 * restricted libraries) are protected by __metatable, so getmetatable cannot hand them out
 * to be given a __gc either; so no finalizer of a policy ever runs, also not at lua_close. */
static int l_safe_setmetatable(lua_State *L) {
    lua_settop(L, 2);
    if (lua_istable(L, 2) && (lua_pushliteral(L, "__gc"), lua_rawget(L, 2)) != LUA_TNIL) {
        ks_lua_ctx(L)->fail_kind = KS_FAIL_FORBIDDEN;
        return luaL_error(L, "setmetatable: __gc metamethods are not allowed in a policy (sandbox)");
    }
    lua_settop(L, 2);
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 1);
    lua_call(L, 2, 1);
    return 1;
}

static int l_safe_require(lua_State *L) {
    const char *name = luaL_checkstring(L, 1);
    if (!strcmp(name, "kvsieve")) {
        lua_pushvalue(L, lua_upvalueindex(1));
        return 1;
    }
    ks_lua_ctx(L)->fail_kind = KS_FAIL_FORBIDDEN;
    return luaL_error(L, "require \"%s\": only \"kvsieve\" is available to a policy (sandbox)", name);
}

static int l_traceback(lua_State *L) {
    const char *msg = luaL_optstring(L, 1, NULL);
    luaL_traceback(L, L, msg, 1);
    return 1;
}

/* The model's config as a table (require("kvsieve").config; the module's m.config). */
void ks_lua_push_config(lua_State *L, const ks_model *m) {
    const ks_config *c = ks_model_config(m);
    lua_createtable(L, 0, 12);
#define F(k, v) (lua_pushinteger(L, (v)), lua_setfield(L, -2, k))
    F("n_layers", c->n_layers);
    F("n_heads", c->n_heads);
    F("n_kv_heads", c->n_kv_heads);
    F("head_dim", c->head_dim);
    F("dim", c->dim);
    F("ffn", c->ffn);
    F("vocab", c->vocab);
    F("max_pos", c->max_pos);
    F("sliding_window", c->sliding_window);
    F("bos", c->bos);
#undef F
    lua_pushnumber(L, c->rope.theta);
    lua_setfield(L, -2, "rope_theta");
    lua_pushstring(L, c->model_type);
    lua_setfield(L, -2, "arch");
}

/* ---------------------------------------------------------------- C loops of the standard library
 *
 * The instruction hook only fires between VM instructions, so a standard-library function
 * implemented in C runs out of the budgets' reach for as long as its own loop lasts. Those
 * whose loop is bounded by memory the allocator already refused (string.format, table.pack,
 * utf8, string.byte: the stack) are left as they are; the others are wrapped:
 *   - string.rep of an empty string and an empty separator loops n times making nothing:
 *     answered at once;
 *   - pattern matching (string.find, match, gmatch, gsub) backtracks: a subject of n bytes
 *     costs up to about (n+1)^(quantifiers + 1) steps. The worst case of the pattern on that
 *     subject is bounded first (pattern_cost) and a call that could exceed MATCH_STEPS is
 *     refused with a named error;
 *   - table.insert, remove, move, concat, unpack and sort loop over lengths that __len, or a
 *     raw table's border (#t of {[1]=1, [2]=1, [4]=1, ..., [2^40]=1} is 2^40), makes as
 *     large as it likes, with __index / __newindex possibly C functions (no hook there
 *     either): they are replaced by Lua versions (sandbox_table_lua) whose loops tick the
 *     hook; concat, unpack and sort finish in the C originals on a raw copy whose length is
 *     known, and sort's comparisons run through a Lua function. */

#define MATCH_STEPS 1e9 /* worst-case matcher steps of one call (about a second of CPU) */

/* The end of the character class [...] starting at p[i] == '[' (the index after ']'), or 0
 * when it does not close (the real function then raises its own error). */
static size_t class_end(const char *p, size_t pl, size_t i) {
    i++;
    if (i < pl && p[i] == '^') i++;
    do { /* the first character after [ or [^ is always part of the set (so "[]]" works) */
        if (i >= pl) return 0;
        if (p[i++] == '%') {
            if (i >= pl) return 0;
            i++;
        }
    } while (i >= pl || p[i] != ']');
    return i + 1;
}

/* Worst-case steps of matching pattern p against a subject of n bytes, over every start
 * position: along the pattern, `mult` counts the ways the items so far can match (each *, +,
 * - multiplies it by n+1, each ? by 2) and every item costs mult times its own work (n+1 for
 * a quantified item's expansion, %b and a back-reference, 1 otherwise). Returns 0 for a
 * malformed pattern (the real function reports it). */
static double pattern_cost(const char *p, size_t pl, size_t n) {
    double N = (double)n + 1, mult = 1, per = 0;
    size_t i = 0;
    int anchored = pl > 0 && p[0] == '^';
    if (anchored) i = 1;
    while (i < pl) {
        char c = p[i];
        size_t end;
        if (c == '(' || c == ')') { per += mult; i++; continue; }
        if (c == '$' && i + 1 == pl) { per += mult; i++; continue; }
        if (c == '%') {
            if (i + 1 >= pl) return 0;
            char d = p[i + 1];
            if (d == 'b') { per += mult * N; i += 4; continue; }
            if (d == 'f') {
                if (i + 2 >= pl || p[i + 2] != '[' || !(i = class_end(p, pl, i + 2))) return 0;
                per += mult;
                continue;
            }
            if (d >= '0' && d <= '9') { per += mult * N; i += 2; continue; }
            end = i + 2;
        } else if (c == '[') {
            if (!(end = class_end(p, pl, i))) return 0;
        } else end = i + 1;
        char q = end < pl ? p[end] : 0;
        if (q == '*' || q == '+' || q == '-') { per += mult * N; mult *= N; i = end + 1; }
        else if (q == '?') { per += mult; mult *= 2; i = end + 1; }
        else { per += mult; i = end; }
        if (per > 1e300 || mult > 1e300) return 1e300;
    }
    return per * (anchored ? 1 : N);
}

/* string.find / match / gmatch / gsub: the real function (upvalue 1, its name upvalue 2) when
 * the pattern's worst case on this subject is affordable. */
static int l_safe_match(lua_State *L) {
    size_t n, pl;
    luaL_checklstring(L, 1, &n);
    const char *p = luaL_checklstring(L, 2, &pl);
    const char *name = lua_tostring(L, lua_upvalueindex(2));
    int plain = !strcmp(name, "find") && lua_toboolean(L, 4);
    double cost = plain ? ((double)n + 1) * ((double)pl + 1) : pattern_cost(p, pl, n);
    if (cost > MATCH_STEPS) {
        char msg[400];
        snprintf(msg, sizeof msg, "string.%s: the pattern \"%.40s%s\" could take up to %.3g steps on a %zu-byte subject (at most %.3g "
                                  "in a policy; sandbox): use a simpler pattern or a shorter subject",
                 name, p, pl > 40 ? "..." : "", cost, n, MATCH_STEPS);
        ks_lua_ctx(L)->fail_kind = KS_FAIL_FORBIDDEN;
        return luaL_error(L, "%s", msg);
    }
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 1);
    lua_call(L, lua_gettop(L) - 1, LUA_MULTRET);
    return lua_gettop(L);
}

/* string.rep: an empty string repeated with an empty separator is "" (the real loop would
 * spin n times making nothing); any other result is allocated before its loop runs, so the
 * memory limit bounds it. */
static int l_safe_rep(lua_State *L) {
    size_t l, ls = 0;
    luaL_checklstring(L, 1, &l);
    lua_Integer n = luaL_checkinteger(L, 2);
    if (!lua_isnoneornil(L, 3)) luaL_checklstring(L, 3, &ls);
    if (n <= 0 || l + ls == 0) {
        lua_pushliteral(L, "");
        return 1;
    }
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 1);
    lua_call(L, lua_gettop(L) - 1, 1);
    return 1;
}

/* The table library of a policy (see above): called with the C originals of concat, unpack
 * and sort; returns the replacements. */
static const char sandbox_table_lua[] =
    "local rawconcat, rawunpack, rawsort = ...\n"
    "local type, select, error, mtype, tointeger, fmt = type, select, error, math.type, math.tointeger, string.format\n"
    "local maxint = math.maxinteger\n"
    "local function tab(t, fn)\n"
    "  if type(t) ~= 'table' then error(fmt(\"bad argument #1 to '%s' (table expected, got %s)\", fn, type(t)), 3) end\n"
    "end\n"
    "local function int(v, i, fn)\n"
    "  local n = mtype(v) and tointeger(v)\n"
    "  if not n then error(fmt(\"bad argument #%d to '%s' (number has no integer representation)\", i, fn), 3) end\n"
    "  return n\n"
    "end\n"
    "local function len(t, fn)\n"
    "  local n = #t\n"
    "  if mtype(n) ~= 'integer' then error(fmt(\"object length is not an integer (in '%s')\", fn), 3) end\n"
    "  return n\n"
    "end\n"
    "local T = {}\n"
    "function T.insert(t, ...)\n"
    "  tab(t, 'insert')\n"
    "  local na, e = select('#', ...), len(t, 'insert') + 1\n"
    "  if na == 1 then t[e] = ... return end\n"
    "  if na ~= 2 then error(\"wrong number of arguments to 'insert'\", 2) end\n"
    "  local pos, v = ...\n"
    "  pos = int(pos, 2, 'insert')\n"
    "  if pos < 1 or pos > e then error(\"bad argument #2 to 'insert' (position out of bounds)\", 2) end\n"
    "  for i = e, pos + 1, -1 do t[i] = t[i - 1] end\n"
    "  t[pos] = v\n"
    "end\n"
    "function T.remove(t, pos)\n"
    "  tab(t, 'remove')\n"
    "  local size = len(t, 'remove')\n"
    "  if pos == nil then pos = size else pos = int(pos, 2, 'remove') end\n"
    "  if pos ~= size and (pos < 1 or pos > size + 1) then error(\"bad argument #2 to 'remove' (position out of bounds)\", 2) end\n"
    "  local v = t[pos]\n"
    "  while pos < size do t[pos] = t[pos + 1]; pos = pos + 1 end\n"
    "  t[pos] = nil\n"
    "  return v\n"
    "end\n"
    "function T.move(a1, f, e, t, a2)\n"
    "  tab(a1, 'move')\n"
    "  if a2 == nil then a2 = a1 else tab(a2, 'move') end\n"
    "  f, e, t = int(f, 2, 'move'), int(e, 3, 'move'), int(t, 4, 'move')\n"
    "  if e >= f then\n"
    "    if not (f > 0 or e < maxint + f) then error(\"bad argument #3 to 'move' (too many elements to move)\", 2) end\n"
    "    local n = e - f\n"
    "    if t > maxint - n then error(\"bad argument #4 to 'move' (destination wrap around)\", 2) end\n"
    "    if t > e or t <= f or a1 ~= a2 then\n"
    "      for i = 0, n do a2[t + i] = a1[f + i] end\n"
    "    else\n"
    "      for i = n, 0, -1 do a2[t + i] = a1[f + i] end\n"
    "    end\n"
    "  end\n"
    "  return a2\n"
    "end\n"
    "function T.concat(t, sep, i, j)\n"
    "  tab(t, 'concat')\n"
    "  if sep == nil then sep = '' end\n"
    "  i = i == nil and 1 or int(i, 3, 'concat')\n"
    "  j = j == nil and len(t, 'concat') or int(j, 4, 'concat')\n"
    "  local c, n = {}, 0\n"
    "  for k = i, j do\n"
    "    local v = t[k]\n"
    "    local tv = type(v)\n"
    "    if tv ~= 'string' and tv ~= 'number' then\n"
    "      error(fmt(\"invalid value (at index %d) in table for 'concat'\", k), 2)\n"
    "    end\n"
    "    n = n + 1\n"
    "    c[n] = v\n"
    "  end\n"
    "  return rawconcat(c, sep, 1, n)\n"
    "end\n"
    "function T.unpack(t, i, j)\n"
    "  i = i == nil and 1 or int(i, 2, 'unpack')\n"
    "  j = j == nil and len(t, 'unpack') or int(j, 3, 'unpack')\n"
    "  if i > j then return end\n"
    "  local n = j - i\n"
    "  if n < 0 or n >= 1000000 then error('too many results to unpack', 2) end\n"
    "  local c = {}\n"
    "  for k = 0, n do c[k + 1] = t[i + k] end\n"
    "  return rawunpack(c, 1, n + 1)\n"
    "end\n"
    "function T.sort(t, lt)\n"
    "  tab(t, 'sort')\n"
    "  local n = len(t, 'sort')\n"
    "  if n <= 1 then return end\n"
    "  if n >= 2147483647 then error(\"bad argument #1 to 'sort' (array too big)\", 2) end\n"
    "  if lt ~= nil and type(lt) ~= 'function' then\n"
    "    error(fmt(\"bad argument #2 to 'sort' (function expected, got %s)\", type(lt)), 2)\n"
    "  end\n"
    "  local c = {}\n"
    "  for k = 1, n do c[k] = t[k] end\n"
    "  local cmp = lt and function(a, b) return lt(a, b) end or function(a, b) return a < b end\n"
    "  rawsort(c, cmp)\n"
    "  for k = 1, n do t[k] = c[k] end\n"
    "end\n"
    "return T\n";

/* Install the wrappers above into the string and table libraries of a sandboxed state. */
static void sandbox_c_loops(lua_State *L) {
    lua_getglobal(L, LUA_STRLIBNAME);
    int s = lua_gettop(L);
    static const char *const match_fns[] = {"find", "match", "gmatch", "gsub", NULL};
    for (int i = 0; match_fns[i]; i++) {
        lua_getfield(L, s, match_fns[i]);
        lua_pushstring(L, match_fns[i]);
        lua_pushcclosure(L, l_safe_match, 2);
        lua_setfield(L, s, match_fns[i]);
    }
    lua_getfield(L, s, "rep");
    lua_pushcclosure(L, l_safe_rep, 1);
    lua_setfield(L, s, "rep");
    lua_pop(L, 1);
    lua_getglobal(L, LUA_TABLIBNAME);
    int t = lua_gettop(L);
    if (luaL_loadbufferx(L, sandbox_table_lua, sizeof sandbox_table_lua - 1, "=[sandbox table library]", "t") != LUA_OK) lua_error(L);
    lua_getfield(L, t, "concat");
    lua_getfield(L, t, "unpack");
    lua_getfield(L, t, "sort");
    lua_call(L, 3, 1);
    static const char *const table_fns[] = {"insert", "remove", "move", "concat", "unpack", "sort", NULL};
    for (int i = 0; table_fns[i]; i++) {
        lua_getfield(L, -1, table_fns[i]);
        lua_setfield(L, t, table_fns[i]);
    }
    lua_pop(L, 2);
}

/* Under pcall on a fresh sandboxed state: the allowed libraries, the restricted module. */
int ks_lpol_open_sandbox(lua_State *L) {
    ks_lpol *p = lua_touserdata(L, 1);
    luaL_requiref(L, LUA_GNAME, luaopen_base, 1);
    luaL_requiref(L, LUA_STRLIBNAME, luaopen_string, 1);
    luaL_requiref(L, LUA_TABLIBNAME, luaopen_table, 1);
    luaL_requiref(L, LUA_MATHLIBNAME, luaopen_math, 1);
    luaL_requiref(L, LUA_UTF8LIBNAME, luaopen_utf8, 1);
    luaL_requiref(L, LUA_COLIBNAME, luaopen_coroutine, 1);
    luaL_requiref(L, LUA_OSLIBNAME, luaopen_os, 0);
    int os_full = lua_gettop(L);
    lua_settop(L, os_full);
    lua_pushglobaltable(L);
    int g = lua_gettop(L);
    /* os: clock, time, date, difftime */
    static const char *const os_keep[] = {"clock", "time", "date", "difftime", NULL};
    restricted_lib(L, "os", os_full, os_keep);
    lua_setfield(L, g, "os");
    restricted_lib(L, "io", 0, NULL);
    lua_setfield(L, g, "io");
    restricted_lib(L, "package", 0, NULL);
    int pk = lua_gettop(L);
    set_forbidden(L, pk, "package.loadlib", "loadlib");
    lua_setfield(L, g, "package");
    restricted_lib(L, "debug", 0, NULL);
    lua_pushcfunction(L, l_traceback);
    lua_setfield(L, -2, "traceback");
    lua_setfield(L, g, "debug");
    set_forbidden(L, g, "dofile", "dofile");
    set_forbidden(L, g, "loadfile", "loadfile");
    lua_getglobal(L, LUA_STRLIBNAME);
    set_forbidden(L, lua_gettop(L), "string.dump", "dump");
    lua_pop(L, 1);
    lua_getfield(L, g, "load");
    lua_pushcclosure(L, l_safe_load, 1);
    lua_setfield(L, g, "load");
    lua_getfield(L, g, "collectgarbage");
    lua_pushcclosure(L, l_safe_collectgarbage, 1);
    lua_setfield(L, g, "collectgarbage");
    lua_getfield(L, g, "setmetatable");
    lua_pushcclosure(L, l_safe_setmetatable, 1);
    lua_setfield(L, g, "setmetatable");
    lua_pushcfunction(L, l_print);
    lua_setfield(L, g, "print");
    sandbox_c_loops(L);
    /* the restricted kvsieve module: tensors, primitives, report, config */
    lua_newtable(L);
    int mod = lua_gettop(L);
    ks_lt_open(L);
    ks_prims_open(L);
    ks_policy_module_open(L, 1);
    if (p->model) {
        ks_lua_push_config(L, p->model);
        lua_setfield(L, mod, "config");
    }
    lua_pushliteral(L, "kvsieve (policy sandbox)");
    lua_setfield(L, mod, "_NAME");
    lua_pushvalue(L, mod);
    p->ref_module = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_pushvalue(L, mod);
    lua_pushcclosure(L, l_safe_require, 1);
    lua_setfield(L, g, "require");
    return 0;
}

/* ---------------------------------------------------------------- failure counts (for the module) */

void ks_lpol_push_failures(lua_State *L, const ks_policy *pol) {
    ks_lpol *p = ks_lpol_of((ks_policy *)pol);
    lua_newtable(L);
    if (!p) return;
    for (int k = 1; k < KS_FAIL_COUNT; k++) {
        lua_pushinteger(L, p->fail_count[k]);
        lua_setfield(L, -2, ks_fail_kind_name((ks_fail_kind)k));
    }
}

long ks_lpol_failures(const ks_policy *pol, ks_fail_kind k) {
    ks_lpol *p = ks_lpol_of((ks_policy *)pol);
    return p && (unsigned)k < KS_FAIL_COUNT ? p->fail_count[k] : 0;
}
