/* test_docs.c — docs/lua.md, the Lua API reference, against the code it describes.
 *
 *   docs_lua_examples_run        every ```lua block of the reference runs without error in a
 *                                fresh host state (the `kvsieve` module, from the repository
 *                                root, on the bundled models/kvsieve-tiny). A block whose first
 *                                line is "-- policy file: NAME.lua" is a policy file: it is
 *                                written to a temporary folder as NAME.lua and a short request
 *                                runs with it (it must not fail or fall back).
 *   docs_lua_every_export_documented   every function the module exports has a heading: the
 *                                `kvsieve` module table (in scripts and in the policy sandbox),
 *                                the methods of models, sessions, policy objects, tensors and
 *                                events (the method tables their metatables' __index reads) and
 *                                the functions of a result table. Names starting with '_' are
 *                                internal and skipped.
 *   docs_lua_every_heading_exists      every function a heading names exists.
 *
 * A heading documents a function by a backtick span that starts with PREFIX.NAME( or
 * PREFIX:NAME(, PREFIX one of ks (the module), m (a model), s (a session), r (a result),
 * pol (a policy object), t (a tensor), ev (an event): "### `t:slice(dim, start [, stop])`". */
#include "ktest.h"
#include "testutil.h"

#include "ks_lua.h"

#include <lualib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define DOC "docs/lua.md"
#define MODEL "models/kvsieve-tiny"

/* ================================================================ reading the reference */

/* The whole file, NUL-terminated (malloc'd), or NULL. */
static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    size_t k;
    while (buf && (k = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += k;
        if (n + 1 == cap) {
            char *b = realloc(buf, cap *= 2);
            if (!b) { free(buf); buf = NULL; }
            else buf = b;
        }
    }
    fclose(f);
    if (buf) buf[n] = 0;
    return buf;
}

typedef struct example {
    const char *code; /* points into the document copy (NUL-terminated there) */
    int line;         /* line of the opening fence, for messages */
} example;

/* Cut the ```lua blocks out of doc (modified in place: each block is NUL-terminated). */
static int examples(char *doc, example *out, int cap) {
    int n = 0, line = 1;
    char *p = doc;
    while (*p) {
        char *eol = strchr(p, '\n');
        if (!eol) break;
        if (eol - p == 6 && !strncmp(p, "```lua", 6)) {
            int at = line;
            char *code = eol + 1, *q = code;
            line++;
            /* the closing fence: a line that is exactly ``` */
            for (;;) {
                char *e = strchr(q, '\n');
                if (!e) return -1; /* unterminated block */
                line++;
                if (e - q == 3 && !strncmp(q, "```", 3)) {
                    *q = 0;
                    p = e + 1;
                    break;
                }
                q = e + 1;
            }
            if (n < cap) out[n++] = (example){code, at};
            continue;
        }
        line++;
        p = eol + 1;
    }
    return n;
}

/* The documented function names ("ks.load", "t:slice", ...) of the heading lines, appended
 * to a Lua-style list in buf as "\nNAME\n" entries (so a lookup is strstr of "\nNAME\n"). */
static void documented(const char *doc, char *buf, size_t cap) {
    static const char *const prefixes[] = {"ks", "m", "s", "r", "pol", "t", "ev", NULL};
    size_t used = strlen(buf);
    for (const char *p = doc; *p;) {
        const char *eol = strchr(p, '\n');
        if (!eol) eol = p + strlen(p);
        if (*p == '#') {
            for (const char *q = p; q < eol; q++) {
                if (*q != '`') continue;
                const char *span = q + 1, *end = memchr(span, '`', (size_t)(eol - span));
                if (!end) break;
                for (int i = 0; prefixes[i]; i++) {
                    size_t l = strlen(prefixes[i]);
                    if (strncmp(span, prefixes[i], l) || (span[l] != '.' && span[l] != ':')) continue;
                    const char *id = span + l + 1, *e = id;
                    while (e < end && (e[0] == '_' || (e[0] >= 'a' && e[0] <= 'z') || (e[0] >= 'A' && e[0] <= 'Z') ||
                                       (e[0] >= '0' && e[0] <= '9')))
                        e++;
                    if (e > id && e < end && *e == '(' && used + (size_t)(e - span) + 3 < cap) {
                        used += (size_t)snprintf(buf + used, cap - used, "%.*s\n", (int)(e - span), span);
                    }
                }
                q = end;
            }
        }
        p = *eol ? eol + 1 : eol;
    }
}

/* ================================================================ running Lua */

/* Run code in a fresh host state with `arg` as its one argument (may be NULL); print is
 * captured (examples print for people). Returns "" or the error with a traceback (static). */
static const char *run(const char *code, const char *chunkname, const char *arg, char *result, size_t rcap) {
    static char err[8192];
    err[0] = 0;
    if (result) result[0] = 0;
    lua_State *L = ks_lua_host_state();
    if (!L) return "no Lua state";
    /* print -> a table nobody reads */
    if (luaL_dostring(L, "local sink = {} print = function(...) sink[#sink + 1] = select('#', ...) end") != LUA_OK) {
        snprintf(err, sizeof err, "%s", lua_tostring(L, -1));
        ks_lua_host_close(L);
        return err;
    }
    lua_getglobal(L, "debug");
    lua_getfield(L, -1, "traceback");
    lua_remove(L, -2);
    int h = lua_gettop(L);
    if (luaL_loadbufferx(L, code, strlen(code), chunkname, "t") != LUA_OK) snprintf(err, sizeof err, "%s", lua_tostring(L, -1));
    else {
        int nargs = 0;
        if (arg) { lua_pushstring(L, arg); nargs = 1; }
        if (lua_pcall(L, nargs, 1, h) != LUA_OK)
            snprintf(err, sizeof err, "%s", lua_tostring(L, -1) ? lua_tostring(L, -1) : "(error object is not a string)");
        else if (result && lua_type(L, -1) == LUA_TSTRING) snprintf(result, rcap, "%s", lua_tostring(L, -1));
    }
    ks_lua_host_close(L);
    return err;
}

/* A short request with the policy file at path (argument 1). */
static const char policy_driver[] =
    "local ks = require 'kvsieve'\n"
    "local m = ks.load('" MODEL "')\n"
    "local r = m:session():generate('The grass is green. The sky is blue. The sun is yellow.', {n = 3, policy = ...})\n"
    "assert(r.policy and not r.fallback, 'the policy did not run')\n";

/* The exported function names, "\nNAME\n..." sorted: the module (scripts), the methods of the
 * binding's objects, a result's functions, and the sandbox module (a policy reports it). */
static const char exports_lua[] =
    "local ks = require 'kvsieve'\n"
    "local dir = ...\n"
    "local seen, out = {}, {}\n"
    "local function add(name) if not seen[name] then seen[name] = true; out[#out + 1] = name end end\n"
    "local function public(k, v) return type(k) == 'string' and k:sub(1, 1) ~= '_' and type(v) == 'function' end\n"
    "for k, v in pairs(ks) do if public(k, v) then add('ks.' .. k) end end\n"
    "local reg = debug.getregistry()\n"
    "for mt, prefix in pairs({['kvsieve.model'] = 'm:', ['kvsieve.session'] = 's:', ['kvsieve.policy'] = 'pol:',\n"
    "                         ['kvsieve.tensor'] = 't:', ['kvsieve.event'] = 'ev:'}) do\n"
    "  local idx = assert(reg[mt], mt .. ' is not registered').__index\n"
    "  if type(idx) == 'function' then local _, up = debug.getupvalue(idx, 1); idx = up end\n"
    "  assert(type(idx) == 'table', mt .. ': no method table')\n"
    "  local n = 0\n"
    "  for k, v in pairs(idx) do if public(k, v) then add(prefix .. k); n = n + 1 end end\n"
    "  assert(n > 0, mt .. ': no methods found')\n"
    "end\n"
    "local f = assert(io.open(dir .. '/exports.lua', 'w'))\n"
    "f:write([[local ks = require 'kvsieve'\n"
    "return { prefill_end = function(ev)\n"
    "  local t = {}\n"
    "  for k, v in pairs(ks) do if type(v) == 'function' and k:sub(1, 1) ~= '_' then t[#t + 1] = k end end\n"
    "  table.sort(t)\n"
    "  ev:report('names', table.concat(t, ' '))\n"
    "end }]])\n"
    "f:close()\n"
    "local m = ks.load('" MODEL "')\n"
    "local r = m:session():generate('The sky', {n = 1, policy = dir .. '/exports.lua'})\n"
    "for k, v in pairs(r) do if public(k, v) then add('r.' .. k) end end\n"
    "local n = 0\n"
    "for name in r.report.names:gmatch('%S+') do add('ks.' .. name); n = n + 1 end\n"
    "assert(n > 10, 'the sandbox module reported ' .. n .. ' functions')\n"
    "table.sort(out)\n"
    "return '\\n' .. table.concat(out, '\\n') .. '\\n'\n";

/* exports into buf; "" or an error */
static const char *exports(char *buf, size_t cap) {
    char dir[256];
    if (kt_tmpdir(dir, sizeof dir)) return "cannot make a temporary folder";
    const char *e = run(exports_lua, "=exports", dir, buf, cap);
    kt_rmdir(dir);
    return e;
}

/* ================================================================ tests */

KT_TEST(docs_lua_examples_run) {
    char *doc = slurp(DOC);
    KT_CHECK(doc, "cannot read %s (run from the repository root)", DOC);
    example ex[128];
    int n = examples(doc, ex, 128);
    if (n < 20) free(doc);
    KT_CHECK(n >= 20, "%s has %d ```lua examples (an unterminated block, or the extraction broke)", DOC, n);
    char dir[256];
    if (kt_tmpdir(dir, sizeof dir)) { free(doc); KT_CHECK(0, "cannot make a temporary folder"); }
    int saved_quiet = ks_lua_quiet;
    ks_lua_quiet = 1; /* the sandbox example fails on purpose */
    char failed[8192] = "";
    int n_failed = 0, n_policies = 0;
    for (int i = 0; i < n; i++) {
        char chunk[64], name[128];
        snprintf(chunk, sizeof chunk, "=docs/lua.md:%d", ex[i].line);
        const char *e;
        if (sscanf(ex[i].code, "-- policy file: %100[A-Za-z0-9_].lua", name) == 1) {
            char path[512];
            snprintf(path, sizeof path, "%s/%s.lua", dir, name);
            n_policies++;
            e = kt_write_file(dir, strrchr(path, '/') + 1, ex[i].code) ? "cannot write the policy file"
                                                                         : run(policy_driver, chunk, path, NULL, 0);
        } else e = run(ex[i].code, chunk, NULL, NULL, 0);
        if (*e) {
            n_failed++;
            size_t l = strlen(failed);
            snprintf(failed + l, sizeof failed - l, "\n  example at line %d: %.600s", ex[i].line, e);
        }
    }
    ks_lua_quiet = saved_quiet;
    kt_rmdir(dir);
    free(doc);
    KT_CHECK(n_policies >= 1, "no policy-file example ran");
    KT_CHECK(n_failed == 0, "%d of %d examples of %s failed:%s", n_failed, n, DOC, failed);
}

KT_TEST(docs_lua_every_export_documented) {
    char *doc = slurp(DOC);
    KT_CHECK(doc, "cannot read %s (run from the repository root)", DOC);
    static char names[16384], doc_names[16384];
    doc_names[0] = '\n';
    doc_names[1] = 0;
    documented(doc, doc_names, sizeof doc_names);
    free(doc);
    const char *e = exports(names, sizeof names);
    KT_CHECK(!*e, "listing the exports failed: %s", e);
    char missing[4096] = "";
    int n = 0, n_missing = 0;
    for (char *p = names + 1, *q; (q = strchr(p, '\n')); p = q + 1) {
        char key[128];
        snprintf(key, sizeof key, "\n%.*s\n", (int)(q - p), p);
        n++;
        if (!strstr(doc_names, key)) {
            n_missing++;
            size_t l = strlen(missing);
            snprintf(missing + l, sizeof missing - l, " %.*s", (int)(q - p), p);
        }
    }
    KT_CHECK(n > 60, "only %d exported functions found (the walk of the module broke?)", n);
    KT_CHECK(n_missing == 0, "%d of %d exported functions have no heading in %s:%s", n_missing, n, DOC, missing);
}

KT_TEST(docs_lua_every_heading_exists) {
    char *doc = slurp(DOC);
    KT_CHECK(doc, "cannot read %s (run from the repository root)", DOC);
    static char names[16384], doc_names[16384];
    doc_names[0] = '\n';
    doc_names[1] = 0;
    documented(doc, doc_names, sizeof doc_names);
    free(doc);
    const char *e = exports(names, sizeof names);
    KT_CHECK(!*e, "listing the exports failed: %s", e);
    char unknown[4096] = "";
    int n = 0, n_unknown = 0;
    for (char *p = doc_names + 1, *q; (q = strchr(p, '\n')); p = q + 1) {
        char key[128];
        snprintf(key, sizeof key, "\n%.*s\n", (int)(q - p), p);
        n++;
        if (!strstr(names, key)) {
            n_unknown++;
            size_t l = strlen(unknown);
            snprintf(unknown + l, sizeof unknown - l, " %.*s", (int)(q - p), p);
        }
    }
    KT_CHECK(n > 60, "only %d function headings found in %s", n, DOC);
    KT_CHECK(n_unknown == 0, "%d headings of %s name functions that do not exist:%s", n_unknown, DOC, unknown);
}
