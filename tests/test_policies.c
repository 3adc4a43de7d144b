/* test_policies.c — every policies/NAME.test.lua (the tests beside each policy) is its own
 * test, policy_NAME, registered at startup by scanning policies/ (run from the repository
 * root). Each runs in a fresh host Lua state with the kvsieve module and tests/lua/ on
 * package.path (polfix.lua, json.lua).
 *
 * A script fails by raising an error (its text, with a traceback, is the reason). It skips:
 *   - wholly, by raising polfix.skip(reason): an error object { ks_skip = reason };
 *   - in part, by polfix.skip_part(reason) (e.g. the cases of an absent ../shared model) and
 *     then running to the end: the reasons gathered in the global table KS_TEST_SKIPS make it
 *     count as skipped, not passed, unless it fails.
 * A script whose first lines hold "ktest: slow" belongs to the slow tier (KT_SLOW_TEST). */
#include "ks_lua.h"
#include "ktest.h"
#include "testutil.h"

#include <dirent.h>
#include <lauxlib.h>
#include <lualib.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SCRIPTS 128
typedef struct { char name[96], path[300]; } script;
static script g_scripts[MAX_SCRIPTS];
static int g_nscripts = -1; /* -1: policies/ could not be opened */

static int ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

static int cmp_script(const void *a, const void *b) { return strcmp(((const script *)a)->name, ((const script *)b)->name); }

/* "ktest: slow" within the script's first 1 KB (its header comment) */
static int is_slow(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    char buf[1025];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    return strstr(buf, "ktest: slow") != NULL;
}

static void run_script(kt_ctx *kt_);

KT_GENERATOR(policy_scripts) {
    DIR *d = opendir("policies");
    if (!d) return; /* policy_scripts_found fails */
    g_nscripts = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!ends_with(e->d_name, ".test.lua") || strlen(e->d_name) >= 64) continue;
        if (g_nscripts == MAX_SCRIPTS) { g_nscripts = MAX_SCRIPTS + 1; break; } /* reported below */
        script *s = &g_scripts[g_nscripts++];
        snprintf(s->path, sizeof s->path, "policies/%s", e->d_name);
        snprintf(s->name, sizeof s->name, "policy_%.*s", (int)(strlen(e->d_name) - strlen(".test.lua")), e->d_name);
    }
    closedir(d);
    int n = g_nscripts > MAX_SCRIPTS ? MAX_SCRIPTS : g_nscripts;
    qsort(g_scripts, (size_t)n, sizeof *g_scripts, cmp_script); /* readdir order is arbitrary */
    for (int i = 0; i < n; i++)
        kt_register_ex(g_scripts[i].name, __FILE__, run_script, is_slow(g_scripts[i].path) ? KT_FLAG_SLOW : 0, &g_scripts[i]);
}

/* the scan itself: run from the repository root, some scripts found, none dropped */
KT_TEST(policy_scripts_found) {
    KT_CHECK(g_nscripts >= 0, "policies/ not found (run from the repository root)");
    KT_CHECK(g_nscripts > 0, "no policies/*.test.lua found");
    KT_CHECK(g_nscripts <= MAX_SCRIPTS, "more than %d policy test scripts (raise MAX_SCRIPTS)", MAX_SCRIPTS);
}

/* message handler: a traceback for a string error; a skip object (a table) is kept as it is */
static int msgh(lua_State *L) {
    if (lua_type(L, 1) == LUA_TTABLE) return 1;
    const char *msg = lua_tostring(L, 1);
    if (!msg) msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
    luaL_traceback(L, L, msg, 1);
    return 1;
}

/* The reasons of KS_TEST_SKIPS joined with "; " into out ("" when there are none). */
static void part_skips(lua_State *L, char *out, size_t cap) {
    out[0] = 0;
    if (lua_getglobal(L, "KS_TEST_SKIPS") == LUA_TTABLE) {
        size_t len = 0;
        lua_Integer n = luaL_len(L, -1);
        for (lua_Integer i = 1; i <= n && len + 1 < cap; i++) {
            lua_geti(L, -1, i);
            const char *r = luaL_tolstring(L, -1, NULL);
            len += (size_t)snprintf(out + len, cap - len, "%s%s", i > 1 ? "; " : "", r);
            lua_pop(L, 2);
            if (len >= cap) len = cap - 1;
        }
    }
    lua_pop(L, 1);
}

/* Runs one script in a fresh host state: 0 passed, 1 skipped, 2 failed (why: the reason). */
static int run_one(const char *path, char *why, size_t cap) {
    lua_State *L = ks_lua_host_state();
    if (!L) { snprintf(why, cap, "%s: cannot create a Lua state", path); return 2; }
    int out = 0;
    why[0] = 0;
    lua_pushcfunction(L, msgh);
    if (luaL_dostring(L, "package.path = 'tests/lua/?.lua;' .. package.path") != LUA_OK) {
        out = 2;
        snprintf(why, cap, "package.path: %s", lua_tostring(L, -1));
    } else if (luaL_loadfile(L, path) != LUA_OK || lua_pcall(L, 0, 0, 1) != LUA_OK) {
        if (lua_type(L, -1) == LUA_TTABLE && lua_getfield(L, -1, "ks_skip") != LUA_TNIL) {
            out = 1; /* polfix.skip(reason) */
            snprintf(why, cap, "%s", luaL_tolstring(L, -1, NULL));
        } else {
            out = 2;
            lua_settop(L, 2);
            snprintf(why, cap, "%s", luaL_tolstring(L, 2, NULL));
        }
    } else {
        part_skips(L, why, cap);
        out = why[0] != 0;
    }
    ks_lua_host_close(L);
    return out;
}

static void run_script(kt_ctx *kt_) {
    const script *s = KT_ARG;
    char why[4096];
    int r = run_one(s->path, why, sizeof why);
    KT_CHECK(r != 2, "%s", why); /* the message and traceback; the summary keeps its first line */
    if (r == 1) KT_SKIP("%s", why);
}

/* The runner's own outcomes, on scripts written to a temporary folder: a pass, a failure with
 * its message, a whole skip (polfix.skip) and a partial one (polfix.skip_part, then the end of
 * the script: skipped, not passed; reasons said once, joined). */
KT_TEST(policy_runner_counts_skips_and_failures) {
    char dir[256], path[400], why[4096];
    KT_CHECK(kt_tmpdir(dir, sizeof dir) == 0, "mkdtemp");
    static const struct { const char *name, *src; int want; const char *why; } cases[] = {
        {"pass.lua", "local polfix = require 'polfix'\nassert(polfix.SHARED ~= '')\n", 0, ""},
        {"fail.lua", "error('boom 42')\n", 2, "boom 42"},
        {"skip.lua", "local polfix = require 'polfix'\npolfix.skip('no model here')\nerror('not reached')\n", 1, "no model here"},
        {"part.lua", "local polfix = require 'polfix'\npolfix.skip_part('a absent')\npolfix.skip_part('b absent')\n"
                     "polfix.skip_part('a absent')\n", 1, "a absent; b absent"},
        {"partfail.lua", "local polfix = require 'polfix'\npolfix.skip_part('a absent')\nerror('then broken')\n", 2, "then broken"},
    };
    int bad = -1;
    for (size_t i = 0; i < sizeof cases / sizeof *cases && bad < 0; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, cases[i].name);
        if (kt_write_file(dir, cases[i].name, cases[i].src)) { bad = (int)i; snprintf(why, sizeof why, "cannot write"); break; }
        int r = run_one(path, why, sizeof why);
        if (r != cases[i].want || !strstr(why, cases[i].why)) bad = (int)i;
        else if (cases[i].want == 1 && strcmp(why, cases[i].why)) bad = (int)i; /* exactly the reasons */
    }
    kt_rmdir(dir);
    KT_CHECK(bad < 0, "%s: outcome or reason wrong: '%s'", cases[bad].name, why);
}
