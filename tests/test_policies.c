/* test_policies.c — runs every policies/NAME.test.lua (the policy tests beside each policy) in a
 * host Lua state with the kvsieve module, from the repository root. A test script fails by
 * raising an error; it prints its own findings. */
#include "ks_lua.h"
#include "ktest.h"

#include <dirent.h>
#include <lualib.h>
#include <stdlib.h>
#include <string.h>

static int ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

static int cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

KT_TEST(policy_lua_tests) {
    DIR *d = opendir("policies");
    KT_CHECK(d, "policies/ not found (run from the repository root)");
    char *names[256];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < 256)
        if (ends_with(e->d_name, ".test.lua")) names[n++] = strdup(e->d_name);
    closedir(d);
    qsort(names, n, sizeof *names, cmp);
    int failed = 0;
    for (int i = 0; i < n; i++) {
        char path[512];
        snprintf(path, sizeof path, "policies/%s", names[i]);
        lua_State *L = ks_lua_host_state();
        if (!L) { fprintf(stderr, "\n    %s: cannot create a Lua state", names[i]); failed++; continue; }
        /* tests/lua on the module path for helpers (json.lua) */
        luaL_dostring(L, "package.path = 'tests/lua/?.lua;' .. package.path");
        fprintf(stderr, "\n    %-28s ", names[i]);
        double t0 = ks_now();
        if (luaL_dofile(L, path) != LUA_OK) {
            fprintf(stderr, "FAIL (%.1f s)\n%s\n", ks_now() - t0, lua_tostring(L, -1));
            failed++;
        } else fprintf(stderr, "ok (%.1f s)", ks_now() - t0);
        ks_lua_host_close(L);
        free(names[i]);
    }
    fprintf(stderr, "\n  ");
    KT_CHECK(n > 0, "no policies/*.test.lua found");
    KT_CHECK(failed == 0, "%d of %d policy test scripts failed", failed, n);
}
