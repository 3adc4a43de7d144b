/* test_lua.c — the Lua binding: the module and primitives (the scripts in tests/lua), the policy C API
 * (load by name / path / string, parameters, reports), the sandbox (each forbidden call, an
 * infinite loop, memory bombs, a timeout, handler errors, invalid return values, stale views:
 * each gives its named error and the process is fine afterwards), fallback, interrupts, a C
 * policy and the same policy in Lua giving identical results, and the CLI (`kvsieve run`,
 * `kvsieve repl` on piped stdin, `generate --policy --set`) when KS_BIN names the binary.
 * Run from the repository root (policies/, tests/policies/ and tests/lua/ are found relative to it). */
#include "engine.h"
#include "ks_lua.h"
#include "ktest.h"
#include "policy_lua.h"
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

/* ================================================================ helpers */

static int make_tiny(char *dir, size_t n) {
    if (kt_tmpdir(dir, n)) return -1;
    kt_tiny_cfg c = kt_tiny_default();
    return kt_write_tiny_model(dir, &c);
}

/* Run a Lua file in a fresh host state with `arg1` as its argument; 0 on success, else the
 * error (with traceback) in err. */
static int run_lua_file(const char *path, const char *arg1, char *err, size_t n) {
    err[0] = 0;
    lua_State *L = ks_lua_host_state();
    if (!L) { snprintf(err, n, "no state"); return -1; }
    int rc = 0;
    lua_getglobal(L, "debug");
    lua_getfield(L, -1, "traceback");
    lua_remove(L, -2);
    if (luaL_loadfile(L, path) != LUA_OK) rc = -1;
    else {
        int nargs = 0;
        if (arg1) { lua_pushstring(L, arg1); nargs = 1; }
        if (lua_pcall(L, nargs, 0, 1) != LUA_OK) rc = -1;
    }
    if (rc) snprintf(err, n, "%s", lua_tostring(L, -1) ? lua_tostring(L, -1) : "?");
    ks_lua_host_close(L);
    return rc;
}

/* Run a Lua chunk in a fresh host state; returns its error message ("" on success). */
static const char *run_lua(const char *code) {
    static char err[4096];
    err[0] = 0;
    lua_State *L = ks_lua_host_state();
    if (luaL_dostring(L, code) != LUA_OK) snprintf(err, sizeof err, "%s", lua_tostring(L, -1));
    ks_lua_host_close(L);
    return err;
}

typedef struct gen_out {
    int32_t ids[64];
    int n;
    ks_status st;
    char err[2048];
} gen_out;

static void generate(ks_session *s, ks_policy *p, const int32_t *prompt, int n, int max_new, gen_out *o) {
    ks_session_set_policy(s, p);
    ks_generate_opts opts;
    ks_generate_opts_default(&opts);
    opts.max_new_tokens = max_new;
    o->st = ks_generate_ids(s, prompt, n, &opts, NULL, NULL);
    snprintf(o->err, sizeof o->err, "%s", o->st ? ks_last_error() : "");
    const int32_t *ids = ks_result_ids(s, &o->n);
    if (o->n > 64) o->n = 64;
    if (ids) memcpy(o->ids, ids, sizeof(int32_t) * o->n);
    ks_session_set_policy(s, NULL);
}

static int same_ids(const gen_out *a, const gen_out *b) {
    return a->n == b->n && !memcmp(a->ids, b->ids, sizeof(int32_t) * a->n);
}

static const int32_t prompt14[] = {1, 5, 9, 12, 3, 7, 22, 40, 17, 33, 8, 50, 11, 2};

/* ================================================================ scripts */

KT_TEST(lua_prims_binding) {
    ks_lua_quiet = 1;
    char err[8192];
    KT_CHECK(run_lua_file("tests/lua/test_prims.lua", NULL, err, sizeof err) == 0, "%s", err);
}

KT_TEST(lua_module_and_actions) {
    ks_lua_quiet = 1;
    char dir[256], err[8192];
    KT_CHECK(make_tiny(dir, sizeof dir) == 0, "tiny model");
    int rc = run_lua_file("tests/lua/test_module.lua", dir, err, sizeof err);
    kt_rmdir(dir);
    KT_CHECK(rc == 0, "%s", err);
}

KT_TEST(lua_host_state_basics) {
    KT_CHECK(!*run_lua("local ks = require 'kvsieve'; assert(ks.version and ks.scores and ks.show_kept)"), "%s", run_lua(""));
    const char *e = run_lua("local ks = require 'kvsieve'; ks.topk(ks.tensor({1.0, 2.0}), 3)");
    KT_CHECK(strstr(e, "topk: k = 3 > n = 2"), "%s", e);
    e = run_lua("local ks = require 'kvsieve'; ks.load('no/such/dir')");
    KT_CHECK(strstr(e, "no/such/dir"), "%s", e);
}

/* ================================================================ the policy C API */

KT_TEST(lua_policy_c_api) {
    ks_lua_quiet = 1;
    char dir[256];
    KT_CHECK(make_tiny(dir, sizeof dir) == 0, "tiny model");
    ks_model *m;
    KT_CHECK(ks_model_open(dir, "cpu", &m) == KS_OK, "%s", ks_last_error());
    ks_session *s;
    KT_CHECK(ks_session_create(m, &s) == KS_OK, "%s", ks_last_error());

    /* by path (tests/policies/), parameters of each type */
    ks_policy *p;
    KT_CHECK(ks_policy_load(m, "tests/policies/test_params.lua", &p) == KS_OK, "%s", ks_last_error());
    KT_CHECK(!strcmp(ks_policy_name(p), "test_params"), "%s", ks_policy_name(p));
    KT_CHECK(ks_policy_n_params(p) == 5, "%d params", ks_policy_n_params(p));
    KT_CHECK(!strcmp(ks_policy_param_name(p, 0), "k") && !strcmp(ks_policy_param_name(p, 4), "ratio"), "sorted names");
    char buf[256];
    KT_CHECK(ks_policy_get(p, "ratio", buf, sizeof buf) == KS_OK && !strcmp(buf, "0.5"), "%s", buf);
    KT_CHECK(ks_policy_set(p, "k", "12") == KS_OK, "%s", ks_last_error());
    KT_CHECK(ks_policy_set(p, "ratio", "0.125") == KS_OK, "%s", ks_last_error());
    KT_CHECK(ks_policy_set(p, "on", "off") == KS_OK, "%s", ks_last_error());
    KT_CHECK(ks_policy_set(p, "mode", "max") == KS_OK, "%s", ks_last_error());
    KT_CHECK(ks_policy_set(p, "kk", "1") == KS_ERR_ARG, "unknown key accepted");
    KT_CHECK(strstr(ks_last_error(), "unknown parameter 'kk' (parameters: k, list, mode, on, ratio"), "%s", ks_last_error());
    KT_CHECK(ks_policy_set(p, "k", "abc") == KS_ERR_ARG && strstr(ks_last_error(), "expects an integer"), "%s", ks_last_error());
    KT_CHECK(ks_policy_set(p, "ratio", "x1") == KS_ERR_ARG && strstr(ks_last_error(), "expects a number"), "%s", ks_last_error());
    KT_CHECK(ks_policy_set(p, "_memory_mb", "-1") == KS_ERR_ARG, "negative limit");
    KT_CHECK(ks_policy_get(p, "k", buf, sizeof buf) == KS_OK && !strcmp(buf, "12"), "%s", buf);
    gen_out o;
    generate(s, p, prompt14, 14, 3, &o);
    KT_CHECK(o.st == KS_OK, "%s", o.err);
    KT_CHECK(ks_policy_report(p, "k") && !strcmp(ks_policy_report(p, "k"), "12"), "report k");
    KT_CHECK(!strcmp(ks_policy_report(p, "ratio"), "0.125") && !strcmp(ks_policy_report(p, "ratio_type"), "float"), "ratio");
    KT_CHECK(!strcmp(ks_policy_report(p, "on"), "false") && !strcmp(ks_policy_report(p, "mode"), "max"), "on/mode");
    KT_CHECK(ks_policy_report(p, "nope") == NULL, "absent report");
    KT_CHECK(ks_policy_n_reports(p) == 9 && ks_policy_report_key(p, 0), "%d reports", ks_policy_n_reports(p));
    ks_policy_free(p);

    /* from a string; the chunk name is the default policy name */
    KT_CHECK(ks_policy_load_string(m, "mine.lua", "return { params = {w = 2}, prefill_end = function(ev, p) ev:report('w', p.w * 2) end }", &p) == KS_OK,
             "%s", ks_last_error());
    KT_CHECK(!strcmp(ks_policy_name(p), "mine"), "%s", ks_policy_name(p));
    generate(s, p, prompt14, 14, 1, &o);
    KT_CHECK(o.st == KS_OK && !strcmp(ks_policy_report(p, "w"), "4"), "%s", o.err);
    ks_policy_free(p);
    /* ks.unhook from begin: the handler is off for that request only; elsewhere an error */
    static const char *unhook_src =
        "local ks = require 'kvsieve'\n"
        "return { params = {off = true, bad = 0},\n"
        "  begin = function(p) if p.off then ks.unhook('decode_qkv') end\n"
        "    if p.bad == 1 then ks.unhook('decode') end end,\n"
        "  decode_qkv = function(ev, p) ev:report('decode_seen', true)\n"
        "    if p.bad == 2 then ks.unhook('token') end end }";
    KT_CHECK(ks_policy_load_string(m, "unhook.lua", unhook_src, &p) == KS_OK, "%s", ks_last_error());
    const char *want_seen[] = {NULL, "true", NULL};
    for (int r = 0; r < 3; r++) {
        KT_CHECK(ks_policy_set(p, "off", r == 1 ? "false" : "true") == KS_OK, "%s", ks_last_error());
        generate(s, p, prompt14, 14, 3, &o);
        KT_CHECK(o.st == KS_OK, "run %d: %s", r, o.err);
        const char *seen = ks_policy_report(p, "decode_seen");
        KT_CHECK(want_seen[r] ? seen && !strcmp(seen, want_seen[r]) : !seen, "run %d: decode_qkv %s", r,
                 seen ? "ran" : "did not run");
    }
    KT_CHECK(ks_policy_set(p, "bad", "1") == KS_OK, "%s", ks_last_error());
    generate(s, p, prompt14, 14, 2, &o);
    KT_CHECK(o.st == KS_ERR_POLICY && strstr(o.err, "unknown event 'decode'"), "%s", o.err);
    KT_CHECK(ks_policy_set(p, "bad", "2") == KS_OK && ks_policy_set(p, "off", "false") == KS_OK, "%s", ks_last_error());
    generate(s, p, prompt14, 14, 2, &o);
    KT_CHECK(o.st == KS_ERR_POLICY && strstr(o.err, "only inside a policy's begin"), "%s", o.err);
    ks_policy_free(p);
    /* load errors: syntax, not a table, bad keys */
    KT_CHECK(ks_policy_load_string(m, "syn.lua", "return {\n prefill_qkv = function(ev) ev:retain( end }", &p) == KS_ERR_POLICY && !p, "syntax");
    KT_CHECK(strstr(ks_last_error(), "syn.lua:2:"), "%s", ks_last_error());
    KT_CHECK(ks_policy_load_string(m, "num.lua", "return 42", &p) == KS_ERR_POLICY, "number");
    KT_CHECK(strstr(ks_last_error(), "must return a table"), "%s", ks_last_error());
    KT_CHECK(ks_policy_load_string(m, "typo.lua", "return { prefil_qkv = function() end }", &p) == KS_ERR_POLICY, "typo");
    KT_CHECK(strstr(ks_last_error(), "policy typo: load: unknown handler 'prefil_qkv'"), "%s", ks_last_error());
    KT_CHECK(ks_policy_load_string(m, "pk.lua", "return { params = { _x = 1 } }", &p) == KS_ERR_POLICY, "reserved");
    KT_CHECK(ks_policy_load_string(m, "hk.lua", "return { decode_qkv = 3 }", &p) == KS_ERR_POLICY, "handler type");
    KT_CHECK(strstr(ks_last_error(), "decode_qkv must be a function"), "%s", ks_last_error());
    KT_CHECK(ks_policy_load_string(m, "top.lua", "os.exit(1)", &p) == KS_ERR_POLICY, "top-level forbidden");
    KT_CHECK(strstr(ks_last_error(), "os.exit is not allowed"), "%s", ks_last_error());

    ks_session_free(s);
    ks_model_close(m);
    kt_rmdir(dir);
}

KT_TEST(lua_policy_search_path) {
    ks_lua_quiet = 1;
    char dir[256];
    KT_CHECK(kt_tmpdir(dir, sizeof dir) == 0, "tmpdir");
    KT_CHECK(kt_write_file(dir, "zz_mine.lua", "return { name = 'zz', params = { a = 1 } }") == 0, "write");
    ks_policy *p;
    KT_CHECK(ks_policy_load(NULL, "zz_mine", &p) == KS_ERR_IO, "found without the path");
    KT_CHECK(strstr(ks_last_error(), "no policy named \"zz_mine\"") && strstr(ks_last_error(), "policies"), "%s", ks_last_error());
    char sp[600];
    snprintf(sp, sizeof sp, "/nonexistent:%s", dir);
    ks_status st = ks_policy_load_path(NULL, "zz_mine", sp, &p);
    KT_CHECK(st == KS_OK, "%s", ks_last_error());
    KT_CHECK(!strcmp(ks_policy_name(p), "zz"), "%s", ks_policy_name(p));
    ks_policy_free(p);
    char path[600];
    snprintf(path, sizeof path, "%s/zz_mine.lua", dir);
    KT_CHECK(ks_policy_load(NULL, path, &p) == KS_OK, "%s", ks_last_error());
    ks_policy_free(p);
    KT_CHECK(ks_policy_load(NULL, "no/such/file.lua", &p) == KS_ERR_IO && strstr(ks_last_error(), "no/such/file.lua"), "%s", ks_last_error());
    kt_rmdir(dir);
}

/* ================================================================ the sandbox */

typedef struct bad_case {
    const char *src;      /* the policy (one file) */
    const char *set;      /* "key=value" or NULL */
    const char *expect;   /* in the error message */
    ks_fail_kind kind;
} bad_case;

#define H(body) "return { prefill_qkv = function(ev, p)\n" body "\nend }"

static const bad_case bad_cases[] = {
    {H("os.execute('true')"), NULL, "bad.lua:2: os.execute is not allowed in a policy (sandbox)", KS_FAIL_FORBIDDEN},
    {H("os.exit(3)"), NULL, "os.exit is not allowed", KS_FAIL_FORBIDDEN},
    {H("os.remove('x')"), NULL, "os.remove is not allowed", KS_FAIL_FORBIDDEN},
    {H("os.getenv('HOME')"), NULL, "os.getenv is not allowed", KS_FAIL_FORBIDDEN},
    {H("io.open('/tmp/kvsieve_sandbox_probe', 'w')"), NULL, "io.open is not allowed", KS_FAIL_FORBIDDEN},
    {H("io.popen('ls')"), NULL, "io.popen is not allowed", KS_FAIL_FORBIDDEN},
    {H("io.write('x')"), NULL, "io.write is not allowed", KS_FAIL_FORBIDDEN},
    {H("package.loadlib('libc.so.6', 'puts')"), NULL, "package.loadlib is not allowed", KS_FAIL_FORBIDDEN},
    {H("dofile('/etc/passwd')"), NULL, "dofile is not allowed", KS_FAIL_FORBIDDEN},
    {H("loadfile('/etc/passwd')"), NULL, "loadfile is not allowed", KS_FAIL_FORBIDDEN},
    {H("load('\\27Lua')"), NULL, "binary chunks are not allowed", KS_FAIL_FORBIDDEN},
    {H("load('return 1', 'x', 'b')"), NULL, "only text chunks", KS_FAIL_FORBIDDEN},
    {H("require('io')"), NULL, "require \"io\": only \"kvsieve\" is available", KS_FAIL_FORBIDDEN},
    {H("string.dump(function() end)"), NULL, "string.dump is not allowed", KS_FAIL_FORBIDDEN},
    {H("debug.sethook()"), NULL, "debug.sethook is not allowed", KS_FAIL_FORBIDDEN},
    {H("collectgarbage('stop')"), NULL, "collectgarbage(\"stop\") is not allowed", KS_FAIL_FORBIDDEN},
    {H("setmetatable({}, {__gc = function() while true do end end})"), NULL, "__gc metamethods are not allowed", KS_FAIL_FORBIDDEN},
    {H("while true do end"), "_instructions=1000000", "bad.lua:2: instruction budget exceeded (1000000 instructions per call", KS_FAIL_INSTRUCTIONS},
    {H("while true do pcall(function() while true do end end) end"), "_instructions=200000", "instruction budget exceeded", KS_FAIL_INSTRUCTIONS},
    {H("local co = coroutine.wrap(function() while true do end end) co()"), "_instructions=200000", "instruction budget exceeded", KS_FAIL_INSTRUCTIONS},
    {H("while true do end"), "_seconds=0.05", "wall-clock budget exceeded (0.05 s per call", KS_FAIL_TIMEOUT},
    {H("local t = {} for i = 1, 1e9 do t[i] = i end"), "_memory_mb=8", "memory limit of 8 MB exceeded", KS_FAIL_MEMORY},
    {H("local ks = require 'kvsieve' local t = {} for i = 1, 100 do t[i] = ks.zeros({1024, 1024}) end"), NULL, "memory limit of 64 MB exceeded", KS_FAIL_MEMORY},
    {H("local s = ('x'):rep(1 << 30)"), NULL, "memory limit", KS_FAIL_MEMORY},
    {"local function deep(x)\n  error('boom ' .. x)\nend\nreturn { prefill_qkv = function(ev, p)\n  deep(ev.layer)\nend }", NULL,
     "bad.lua:2: boom 0\nstack traceback:", KS_FAIL_ERROR},
    {H("error({code = 7})"), NULL, "(error object is a table value)", KS_FAIL_ERROR},
    {H("return ev.n"), NULL, "invalid return value: the prefill_qkv handler returned a number", KS_FAIL_RETURN},
    {"local saved\nreturn { prefill_qkv = function(ev, p)\n  if ev.layer == 0 then saved = ev.k else return saved:tolist() end\nend }", NULL,
     "bad.lua:3: tolist: tensor view used after its event ended (it came from prefill_qkv, layer 0", KS_FAIL_STALE},
    {"local saved\nreturn { prefill_qkv = function(ev, p)\n  if ev.layer == 0 then saved = ev else saved:stop() end\nend }", NULL,
     "stop: event object used after its event ended (it was prefill_qkv, layer 0)", KS_FAIL_STALE},
    {"local ks = require 'kvsieve'\nlocal saved\nreturn { prefill_qkv = function(ev, p)\n  if ev.layer == 0 then saved = ev.pos else ks.topk(ks.tensor({1.0}), 1) ks.gather(ev.q, saved) end\nend }", NULL,
     "gather: tensor view used after its event ended", KS_FAIL_STALE},
    {H("ev:retain({0, 0})"), NULL, "retain in prefill_qkv (layer 0): duplicate index 0", KS_FAIL_ERROR},
};

KT_TEST(lua_sandbox_named_errors) {
    ks_lua_quiet = 1;
    char dir[256];
    KT_CHECK(make_tiny(dir, sizeof dir) == 0, "tiny model");
    ks_model *m;
    KT_CHECK(ks_model_open(dir, "cpu", &m) == KS_OK, "%s", ks_last_error());
    ks_session *s;
    KT_CHECK(ks_session_create(m, &s) == KS_OK, "%s", ks_last_error());
    gen_out before, after, o;
    generate(s, NULL, prompt14, 14, 6, &before);
    KT_CHECK(before.st == KS_OK, "%s", before.err);
    for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; i++) {
        const bad_case *c = &bad_cases[i];
        ks_policy *p;
        KT_CHECK(ks_policy_load_string(m, "bad.lua", c->src, &p) == KS_OK, "case %zu: %s", i, ks_last_error());
        if (c->set) {
            char key[64];
            const char *eq = strchr(c->set, '=');
            snprintf(key, sizeof key, "%.*s", (int)(eq - c->set), c->set);
            if (!strcmp(key, "_seconds")) KT_CHECK(ks_policy_set(p, "_instructions", "0") == KS_OK, "%s", ks_last_error());
            KT_CHECK(ks_policy_set(p, key, eq + 1) == KS_OK, "%s", ks_last_error());
        }
        /* no timing assertion here (it flakes under a sanitizer on a busy machine): the named
         * error below is what proves the budget stopped the policy */
        generate(s, p, prompt14, 14, 4, &o);
        long nk = ks_lpol_failures(p, c->kind);
        ks_policy_free(p);
        KT_CHECK(o.st == KS_ERR_POLICY, "case %zu: status %d (%s)", i, o.st, o.err);
        KT_CHECK(strstr(o.err, c->expect), "case %zu: message\n%s\nlacks\n%s", i, o.err, c->expect);
        KT_CHECK(strstr(o.err, "policy bad: prefill_qkv (layer "), "case %zu: %s", i, o.err);
        KT_CHECK(nk == 1, "case %zu: %ld failures of kind %s", i, nk, ks_fail_kind_name(c->kind));
    }
    /* the process is fine afterwards: same answer as before, and a good policy works */
    generate(s, NULL, prompt14, 14, 6, &after);
    KT_CHECK(after.st == KS_OK && same_ids(&before, &after), "%s", after.err);
    ks_policy *p;
    KT_CHECK(ks_policy_load(m, "tests/policies/test_events.lua", &p) == KS_OK, "%s", ks_last_error());
    generate(s, p, prompt14, 14, 6, &o);
    KT_CHECK(o.st == KS_OK && same_ids(&before, &o), "%s", o.err);
    KT_CHECK(!strcmp(ks_policy_report(p, "token"), "6"), "events");
    ks_policy_free(p);
    ks_session_free(s);
    ks_model_close(m);
    kt_rmdir(dir);
}

KT_TEST(lua_sandbox_state_survives_failures) {
    /* a policy that fails once keeps working (its state is collected and reusable) */
    ks_lua_quiet = 1;
    char dir[256];
    KT_CHECK(make_tiny(dir, sizeof dir) == 0, "tiny model");
    ks_model *m;
    KT_CHECK(ks_model_open(dir, "cpu", &m) == KS_OK, "%s", ks_last_error());
    ks_session *s;
    KT_CHECK(ks_session_create(m, &s) == KS_OK, "%s", ks_last_error());
    const char *src =
        "local calls = 0\n"
        "return { params = { bomb = true }, prefill_end = function(ev, p)\n"
        "  calls = calls + 1\n"
        "  if p.bomb then local t = {} for i = 1, 1e9 do t[i] = {} end end\n"
        "  ev:report('calls', calls)\n"
        "end }";
    ks_policy *p;
    KT_CHECK(ks_policy_load_string(m, "survive.lua", src, &p) == KS_OK, "%s", ks_last_error());
    KT_CHECK(ks_policy_set(p, "_memory_mb", "4") == KS_OK, "%s", ks_last_error());
    gen_out o;
    generate(s, p, prompt14, 14, 2, &o);
    KT_CHECK(o.st == KS_ERR_POLICY && strstr(o.err, "memory limit of 4 MB exceeded"), "%s", o.err);
    KT_CHECK(ks_policy_set(p, "bomb", "false") == KS_OK, "%s", ks_last_error());
    generate(s, p, prompt14, 14, 2, &o);
    KT_CHECK(o.st == KS_OK, "%s", o.err);
    KT_CHECK(!strcmp(ks_policy_report(p, "calls"), "2"), "calls %s", ks_policy_report(p, "calls"));
    ks_policy_free(p);
    ks_session_free(s);
    ks_model_close(m);
    kt_rmdir(dir);
}

/* ================================================================ fallback and interrupts */

KT_TEST(lua_fallback_to_full_attention) {
    ks_lua_quiet = 1;
    char dir[256];
    KT_CHECK(make_tiny(dir, sizeof dir) == 0, "tiny model");
    ks_model *m;
    KT_CHECK(ks_model_open(dir, "cpu", &m) == KS_OK, "%s", ks_last_error());
    ks_session *s;
    KT_CHECK(ks_session_create(m, &s) == KS_OK, "%s", ks_last_error());
    gen_out full, o;
    generate(s, NULL, prompt14, 14, 6, &full);
    ks_policy *p;
    KT_CHECK(ks_policy_load_string(m, "fb.lua", "return { decode_qkv = function(ev) if ev.pos:item() == 16 then error('boom') end end }", &p) == KS_OK,
             "%s", ks_last_error());
    generate(s, p, prompt14, 14, 6, &o);
    KT_CHECK(o.st == KS_ERR_POLICY && strstr(o.err, "fb.lua:1: boom"), "%s", o.err);
    KT_CHECK(!*ks_result_policy_error(s), "no fallback asked");
    ks_session_set_fallback(s, 1);
    generate(s, p, prompt14, 14, 6, &o);
    KT_CHECK(o.st == KS_OK && same_ids(&full, &o), "%s", o.err);
    KT_CHECK(strstr(ks_result_policy_error(s), "policy fb: decode_qkv (layer 0): fb.lua:1: boom"), "%s", ks_result_policy_error(s));
    ks_policy_free(p);
    ks_session_free(s);
    ks_model_close(m);
    kt_rmdir(dir);
}

KT_TEST(lua_interrupt) {
    ks_lua_quiet = 1;
    char dir[256];
    KT_CHECK(make_tiny(dir, sizeof dir) == 0, "tiny model");
    volatile sig_atomic_t flag = 1;
    ks_lua_set_interrupt(&flag);
    /* the module's generate */
    char code[1024];
    snprintf(code, sizeof code,
             "local ks = require 'kvsieve'; local s = ks.load('%s'):session()\n"
             "local ok, e = pcall(s.generate, s, {1, 2, 3}, {n = 4}); assert(not ok and e:find('interrupted'), e)\n", dir);
    const char *e = run_lua(code);
    ks_lua_set_interrupt(NULL);
    KT_CHECK(!*e, "%s", e);
    /* a policy stuck in Lua is stopped by its instruction hook */
    ks_model *m;
    KT_CHECK(ks_model_open(dir, "cpu", &m) == KS_OK, "%s", ks_last_error());
    ks_session *s;
    KT_CHECK(ks_session_create(m, &s) == KS_OK, "%s", ks_last_error());
    ks_policy *p;
    KT_CHECK(ks_policy_load_string(m, "stuck.lua", "return { begin = function() while true do end end, token = function() end }", &p) == KS_OK,
             "%s", ks_last_error());
    KT_CHECK(ks_policy_set(p, "_instructions", "0") == KS_OK && ks_policy_set(p, "_seconds", "0") == KS_OK, "%s", ks_last_error());
    s->interrupt = &flag;
    gen_out o;
    generate(s, p, prompt14, 14, 2, &o);
    KT_CHECK(o.st == KS_ERR_INTERRUPTED && strstr(o.err, "interrupted"), "%d %s", o.st, o.err);
    KT_CHECK(ks_lpol_failures(p, KS_FAIL_INTERRUPTED) == 1, "counted");
    flag = 0;
    ks_policy_free(p);
    ks_session_free(s);
    ks_model_close(m);
    kt_rmdir(dir);
}

/* ================================================================ C policy == Lua policy */

/* The C twin of tests/policies/test_retain.lua. */
typedef struct twin { int layer, prop_layer; int calls; } twin;

static ks_status twin_layer_end(void *ud, ks_event *ev) {
    twin *t = ud;
    t->calls++;
    if (ev->layer != t->prop_layer || ev->pass != 0) return KS_OK;
    int32_t idx[256];
    int k = 0;
    for (int i = 0; i < ev->n; i += 2) idx[k++] = i;
    if ((ev->n - 1) % 2 == 1) idx[k++] = ev->n - 1;
    return ks_action_propagate(ev, idx, k);
}

static ks_status twin_qkv(void *ud, ks_event *ev) {
    twin *t = ud;
    t->calls++;
    if (ev->layer != t->layer) return KS_OK;
    int32_t lists[8][4];
    const int32_t *ptr[8];
    int cnt[8];
    for (int h = 0; h < ev->n_kv_heads; h++) {
        int cand[4] = {0, KS_MIN(2 + h, ev->n - 1), KS_MIN(5, ev->n - 1), ev->n - 1};
        cnt[h] = 0;
        for (int i = 0; i < 4; i++) {
            int dup = 0;
            for (int j = 0; j < cnt[h]; j++) dup |= lists[h][j] == cand[i];
            if (!dup) lists[h][cnt[h]++] = cand[i];
        }
        ptr[h] = lists[h];
    }
    return ks_action_retain_heads(ev, ptr, cnt);
}

static ks_status twin_decode(void *ud, ks_event *ev) {
    twin *t = ud;
    t->calls++;
    static int32_t lists[8][512];
    const int32_t *ptr[8];
    int cnt[8];
    for (int h = 0; h < ev->n_kv_heads; h++) {
        cnt[h] = 0;
        for (int r = 0; r < ev->kv->n[h]; r++)
            if (r != 1 + h) lists[h][cnt[h]++] = r;
        ptr[h] = lists[h];
    }
    return ks_action_attend_heads(ev, ptr, cnt, 0);
}

typedef struct kept_copy { int n[4][4]; int32_t pos[4][4][64]; int cap[4]; } kept_copy;

static void copy_kept(const ks_session *s, kept_copy *k) {
    memset(k, 0, sizeof *k);
    for (int l = 0; l < 2; l++) {
        for (int h = 0; h < 2; h++) {
            const int32_t *p;
            k->n[l][h] = ks_result_kept(s, l, h, &p);
            memcpy(k->pos[l][h], p, sizeof(int32_t) * KS_MIN(k->n[l][h], 64));
        }
        k->cap[l] = s->kv[l].capacity;
    }
}

KT_TEST(lua_c_policy_equals_lua_policy) {
    ks_lua_quiet = 1;
    char dir[256];
    KT_CHECK(make_tiny(dir, sizeof dir) == 0, "tiny model");
    ks_model *m;
    KT_CHECK(ks_model_open(dir, "cpu", &m) == KS_OK, "%s", ks_last_error());
    ks_session *s;
    KT_CHECK(ks_session_create(m, &s) == KS_OK, "%s", ks_last_error());

    twin tw = {.layer = 1, .prop_layer = 0};
    ks_policy cp = {.name = "test_retain_c", .ud = &tw};
    cp.on[KS_EV_PREFILL_QKV] = twin_qkv;
    cp.on[KS_EV_PREFILL_LAYER_END] = twin_layer_end;
    cp.on[KS_EV_DECODE_QKV] = twin_decode;
    gen_out oc, ol, full;
    kept_copy kc, kl;
    generate(s, &cp, prompt14, 14, 8, &oc);
    KT_CHECK(oc.st == KS_OK, "%s", oc.err);
    copy_kept(s, &kc);
    KT_CHECK(tw.calls > 0, "C handlers ran");

    ks_policy *lp;
    KT_CHECK(ks_policy_load(m, "tests/policies/test_retain.lua", &lp) == KS_OK, "%s", ks_last_error());
    generate(s, lp, prompt14, 14, 8, &ol);
    KT_CHECK(ol.st == KS_OK, "%s", ol.err);
    copy_kept(s, &kl);
    KT_CHECK(same_ids(&oc, &ol), "generated ids differ between the C and the Lua policy");
    for (int l = 0; l < 2; l++)
        for (int h = 0; h < 2; h++) {
            KT_CHECK(kc.n[l][h] == kl.n[l][h], "layer %d head %d: %d vs %d rows", l, h, kc.n[l][h], kl.n[l][h]);
            KT_CHECK(!memcmp(kc.pos[l][h], kl.pos[l][h], sizeof(int32_t) * kc.n[l][h]), "layer %d head %d positions differ", l, h);
        }
    /* what the policy asked for: layer 1 got rows {0,2,4,6,8,10,12,13} (propagated), and
     * KV head h kept rows {0, 2 + h, 5, 7} of them, then the 7 decoded positions */
    static const int32_t want0[] = {0, 4, 10, 13, 14, 15, 16, 17, 18, 19, 20};
    static const int32_t want1[] = {0, 6, 10, 13, 14, 15, 16, 17, 18, 19, 20};
    KT_CHECK(kl.n[1][0] == 11 && !memcmp(kl.pos[1][0], want0, sizeof want0), "layer 1 head 0");
    KT_CHECK(kl.n[1][1] == 11 && !memcmp(kl.pos[1][1], want1, sizeof want1), "layer 1 head 1");
    KT_CHECK(kl.n[0][0] == 21, "layer 0 keeps everything (%d)", kl.n[0][0]);
    /* dropped rows are freed: layer 1's KV storage is smaller than layer 0's */
    KT_CHECK(kl.cap[1] < kl.cap[0], "capacity layer 1 %d, layer 0 %d", kl.cap[1], kl.cap[0]);
    /* the policy does change the output relative to full attention (so the test means something) */
    generate(s, NULL, prompt14, 14, 8, &full);
    KT_CHECK(!same_ids(&full, &ol) || kl.n[1][0] != 21, "no effect");
    ks_policy_free(lp);
    ks_session_free(s);
    ks_model_close(m);
    kt_rmdir(dir);
}

/* ================================================================ overhead (not timed here) */

KT_TEST(lua_noop_policy_is_transparent) {
    /* handlers that do nothing leave the output bit-identical (the timing of this is in the
     * report, not a unit test) */
    ks_lua_quiet = 1;
    char dir[256];
    KT_CHECK(make_tiny(dir, sizeof dir) == 0, "tiny model");
    ks_model *m;
    KT_CHECK(ks_model_open(dir, "cpu", &m) == KS_OK, "%s", ks_last_error());
    ks_session *s;
    KT_CHECK(ks_session_create(m, &s) == KS_OK, "%s", ks_last_error());
    ks_policy *p;
    KT_CHECK(ks_policy_load_string(m, "noop.lua",
                                   "return { begin = function() end, prefill_qkv = function() end, prefill_layer_end = function() end,"
                                   " prefill_end = function() end, decode_qkv = function() end, token = function() end }",
                                   &p) == KS_OK,
             "%s", ks_last_error());
    for (int e = 0; e < KS_EV_COUNT; e++) KT_CHECK(p->on[e] != NULL, "handler %d bound", e);
    ks_policy *q;
    KT_CHECK(ks_policy_load_string(m, "one.lua", "return { token = function() end }", &q) == KS_OK, "%s", ks_last_error());
    KT_CHECK(!q->on[KS_EV_PREFILL_QKV] && !q->on[KS_EV_DECODE_QKV] && q->on[KS_EV_TOKEN], "absent handlers stay NULL");
    gen_out a, b;
    generate(s, NULL, prompt14, 14, 10, &a);
    generate(s, p, prompt14, 14, 10, &b);
    KT_CHECK(a.st == KS_OK && b.st == KS_OK && same_ids(&a, &b), "%s %s", a.err, b.err);
    ks_policy_free(p);
    ks_policy_free(q);
    ks_session_free(s);
    ks_model_close(m);
    kt_rmdir(dir);
}

/* ================================================================ stories260K (real tokenizer) */

KT_TEST(lua_stories260k_views) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/models/stories260K", kt_shared_dir());
    struct stat st;
    if (stat(dir, &st)) KT_SKIP("%s absent", dir);
    char code[4096];
    snprintf(code, sizeof code,
             "local ks = require 'kvsieve'\n"
             "local m = ks.load('%s')\n"
             "local ids = m:encode('Once upon a time, there was a little girl named Lily.')\n"
             "assert(ids[1] == 1 and m:decode(ids) == 'Once upon a time, there was a little girl named Lily.', m:decode(ids))\n"
             "local s = m:session()\n"
             "local r = s:generate('Once upon a time', {n = 16})\n"
             "assert(r.text:find('^, there was'), r.text)\n"
             "local out = {}\n"
             "local old = print; print = function(...) out[#out + 1] = table.concat({...}, ' ') end\n"
             "local r2 = s:generate('Once upon a time, there was a little girl named Lily.', {n = 4, policy = {\n"
             "  prefill_qkv = function(ev) if ev.layer == 2 then ev:retain({0, 3, 5}) end end }})\n"
             "ks.show_kept(r2, m, {layer = 2, color = false})\n"
             "ks.kept_table(r2); ks.occupancy(r2); ks.timings(r2)\n"
             "print = old\n"
             "assert(out[1]:find('kept 3 of', 1, true), out[1])\n"
             "assert(out[2]:find('[<s>] Once upon[ a] time[,] there', 1, true), out[2])\n"
             "assert(#ks.sparkline({1, 5, 2, 8, 3}) > 0 and ks.sparkline({0, 1}) == '\u2581\u2588')\n"
             "local toks = ks.pieces(m, ids); assert(toks[2] == ' Once' or toks[2] == 'Once', toks[2])\n",
             dir);
    const char *e = run_lua(code);
    KT_CHECK(!*e, "%s", e);
}

/* ================================================================ the CLI */

KT_TEST(lua_cli_run_repl_generate) {
    const char *bin = getenv("KS_BIN");
    if (!bin) KT_SKIP("KS_BIN not set (make test sets it)");
    char dir[256], cmd[2048], out[8192];
    KT_CHECK(make_tiny(dir, sizeof dir) == 0, "tiny model");
    /* kvsieve run SCRIPT args */
    snprintf(cmd, sizeof cmd, "%s run tests/lua/test_module.lua %s 2>&1", bin, dir);
    int rc = kt_sh(cmd, out, sizeof out);
    KT_CHECK(rc == 0, "run: rc %d\n%s", rc, out);
    snprintf(cmd, sizeof cmd, "printf 'error(\"x\" .. arg[1])' | %s run - A1 2>&1", bin);
    rc = kt_sh(cmd, out, sizeof out);
    KT_CHECK(rc == 1 && strstr(out, "xA1") && strstr(out, "stack traceback"), "rc %d: %s", rc, out);
    /* the REPL on piped stdin: expression echo, statements, continuation, errors, no prompts */
    snprintf(cmd, sizeof cmd,
             "printf '1 + 1\\nx = 20\\nx + 1\\nfunction f(a)\\n  return a * 3\\nend\\nf(5)\\n#s:generate({1, 2, 3}, {n = 2}).ids\\n"
             "error(\"bad\")\\n/help\\n\"after\"\\n' | %s repl -m %s 2>&1",
             bin, dir);
    rc = kt_sh(cmd, out, sizeof out);
    KT_CHECK(rc == 1, "repl: rc %d (an input failed)\n%s", rc, out);
    KT_CHECK(strstr(out, "2\n21\n15\n2\n"), "repl output:\n%s", out);
    KT_CHECK(strstr(out, "bad") && strstr(out, "after") && !strstr(out, "> "), "repl output:\n%s", out);
    /* generate --policy --set */
    snprintf(cmd, sizeof cmd, "%s generate -m %s --ids -p 1,5,9,12 -n 3 --policy tests/policies/test_retain.lua --set layer=0 -q 2>&1", bin, dir);
    rc = kt_sh(cmd, out, sizeof out);
    KT_CHECK(rc == 0, "generate: rc %d\n%s", rc, out);
    snprintf(cmd, sizeof cmd, "%s generate -m %s --ids -p 1,5,9,12 -n 3 --policy tests/policies/test_retain.lua --set lyer=0 -q 2>&1", bin, dir);
    rc = kt_sh(cmd, out, sizeof out);
    KT_CHECK(rc != 0 && strstr(out, "unknown parameter 'lyer' (parameters: layer, prop_layer"), "rc %d: %s", rc, out);
    /* the test policies live in tests/policies/: they are not policy names */
    snprintf(cmd, sizeof cmd, "%s generate -m %s --ids -p 1,5,9,12 -n 3 --policy test_retain -q 2>&1", bin, dir);
    rc = kt_sh(cmd, out, sizeof out);
    KT_CHECK(rc != 0 && strstr(out, "no policy named \"test_retain\""), "rc %d: %s", rc, out);
    snprintf(cmd, sizeof cmd, "%s eval 2>&1", bin);
    rc = kt_sh(cmd, out, sizeof out);
    KT_CHECK(rc == 2 && strstr(out, "--model DIR is required"), "eval: %d %s", rc, out);
    kt_rmdir(dir);
}

/* ================================================================ device tensors (the emulated device)
 *
 * _device = "emulate" (the CLI: KVSIEVE_LUA_DEVICE=emulate) runs a policy's primitives through the
 * device-tensor path on the CPU backend: views are device views of the emulated device
 * (lua/emu_device.c), primitives dispatch to its ks_backend_prims table (the CPU table behind
 * tagged addresses), element access and actions download. Every policy must keep exactly what
 * it keeps on the plain host path (the CPU backend's table on host tensors). */

typedef struct dev_run {
    ks_status st;
    char err[2048];
    int32_t ids[64];
    int n_ids;
    int n_layers, n_kv;
    int kept_n[16][8];
    int32_t *kept[16][8];
    int prop[16];
    int n_restart;
    int32_t restart[4096];
    char reports[8192];
    ks_lpol_devstats ds;
} dev_run;

static void dev_run_free(dev_run *r) {
    for (int l = 0; l < 16; l++)
        for (int h = 0; h < 8; h++) free(r->kept[l][h]);
}

/* One request of policy `name` (params "k=v,k=v") in device mode `mode`. */
static void dev_run_policy(ks_model *m, const char *name, const char *params, const char *mode, const int32_t *prompt, int n,
                           int max_new, dev_run *r) {
    memset(r, 0, sizeof *r);
    ks_policy *p = NULL;
    ks_session *s = NULL;
    r->st = ks_policy_load(m, name, &p);
    char kv[512];
    snprintf(kv, sizeof kv, "%s", params);
    for (char *save = NULL, *tok = strtok_r(kv, ",", &save); !r->st && tok; tok = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(tok, '=');
        if (!eq) continue;
        *eq = 0;
        r->st = ks_policy_set(p, tok, eq + 1);
    }
    if (!r->st) r->st = ks_policy_set(p, "_device", mode);
    if (!r->st) r->st = ks_session_create(m, &s);
    if (!r->st) {
        ks_session_set_policy(s, p);
        ks_generate_opts o;
        ks_generate_opts_default(&o);
        o.max_new_tokens = max_new;
        r->st = ks_generate_ids(s, prompt, n, &o, NULL, NULL);
    }
    if (r->st) snprintf(r->err, sizeof r->err, "%s", ks_last_error());
    if (!r->st) {
        const int32_t *ids = ks_result_ids(s, &r->n_ids);
        if (r->n_ids > 64) r->n_ids = 64;
        memcpy(r->ids, ids, sizeof(int32_t) * r->n_ids);
        r->n_layers = KS_MIN(m->cfg.n_layers, 16);
        r->n_kv = KS_MIN(m->cfg.n_kv_heads, 8);
        for (int l = 0; l < r->n_layers; l++) {
            for (int h = 0; h < r->n_kv; h++) {
                const int32_t *pos;
                r->kept_n[l][h] = ks_result_kept(s, l, h, &pos);
                r->kept[l][h] = malloc(sizeof(int32_t) * (r->kept_n[l][h] + 1));
                memcpy(r->kept[l][h], pos, sizeof(int32_t) * r->kept_n[l][h]);
            }
            r->prop[l] = s->prop_layer_n ? s->prop_layer_n[l] : -1;
        }
        const int32_t *ri;
        r->n_restart = ks_result_restart(s, &ri);
        if (r->n_restart > 4096) r->n_restart = 4096;
        if (r->n_restart > 0) memcpy(r->restart, ri, sizeof(int32_t) * r->n_restart);
        for (int i = 0; i < ks_policy_n_reports(p); i++) {
            size_t at = strlen(r->reports);
            const char *k = ks_policy_report_key(p, i);
            snprintf(r->reports + at, sizeof r->reports - at, "%s=%s;", k, ks_policy_report(p, k));
        }
    }
    if (p) ks_lpol_dev_stats(p, &r->ds);
    ks_session_free(s);
    ks_policy_free(p);
}

/* "" when a and b kept, generated and reported the same, else what differs */
static const char *dev_run_diff(const dev_run *a, const dev_run *b) {
    static char why[256];
    if (a->n_ids != b->n_ids || memcmp(a->ids, b->ids, sizeof(int32_t) * a->n_ids)) return "generated ids";
    for (int l = 0; l < a->n_layers; l++) {
        if (a->prop[l] != b->prop[l]) { snprintf(why, sizeof why, "rows after layer %d: %d vs %d", l, a->prop[l], b->prop[l]); return why; }
        for (int h = 0; h < a->n_kv; h++)
            if (a->kept_n[l][h] != b->kept_n[l][h] || memcmp(a->kept[l][h], b->kept[l][h], sizeof(int32_t) * a->kept_n[l][h])) {
                snprintf(why, sizeof why, "kept positions of layer %d head %d (%d vs %d rows)", l, h, a->kept_n[l][h], b->kept_n[l][h]);
                return why;
            }
    }
    if (a->n_restart != b->n_restart || memcmp(a->restart, b->restart, sizeof(int32_t) * KS_MAX(a->n_restart, 0))) return "restart indices";
    if (strcmp(a->reports, b->reports)) return "reports";
    return "";
}

KT_TEST(lua_device_emulated_policies_match_host) {
    ks_lua_quiet = 1;
    ks_model *m;
    KT_CHECK(ks_model_open("models/kvsieve-tiny", "cpu", &m) == KS_OK, "%s", ks_last_error());
    /* every policy with budgets that bite at these lengths (8 layers, 2 KV heads) */
    static const struct { const char *name, *params; int n; } cases[] = {
        {"full", "", 300},
        {"streamingllm", "budget=64,sinks=4,rolling=true", 300},
        {"snapkv", "budget=64,window=8,kernel=7,pool=max", 300},
        {"snapkv", "budget=48,window=8,kernel=5,pool=avg,per_query_head=true", 300},
        {"gemfilter", "layer=2,k=100", 300},
        {"fastkv", "tsp_layer=3,tsp_rate=0.3,retain_rate=0.2,trace=true", 300},
        {"fastkv", "mode=absolute,tsp_layer=2,tsp_len=128,capacity=64,w=8", 300},
        {"asl", "L_min=3,L_obs=3,tau=0.9,k=100,w=8,kv_budget=64,trace=true", 300},
        {"asl", "L_min=2,L_obs=3,tau=0.5,k=80,w=8,two_pass=true,fallback_layer=5", 300},
        {"tokenselect", "n_init=16,n_local=480,k=64,cache_theta=0.9,trace=true", 1100},
        {"tokenselect", "n_init=8,n_local=500,k=40,pool_kernel=3,gqa=mod", 1100},
    };
    int32_t prompt[1100];
    uint64_t x = 88172645463325252ull;
    prompt[0] = m->cfg.bos;
    for (int i = 1; i < 1100; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        prompt[i] = 3 + (int32_t)(x % (uint64_t)(m->cfg.vocab - 3));
    }
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        dev_run host, emu;
        double t0 = ks_now();
        dev_run_policy(m, cases[c].name, cases[c].params, "host", prompt, cases[c].n, 6, &host);
        double t1 = ks_now();
        dev_run_policy(m, cases[c].name, cases[c].params, "emulate", prompt, cases[c].n, 6, &emu);
        double t2 = ks_now();
        KT_CHECK(host.st == KS_OK, "%s host: %s", cases[c].name, host.err);
        KT_CHECK(emu.st == KS_OK, "%s emulate: %s", cases[c].name, emu.err);
        const char *d = dev_run_diff(&host, &emu);
        KT_CHECK(!*d, "%s (%s): host and emulated device differ in %s", cases[c].name, cases[c].params, d);
        /* the device path really ran (full has no handler: nothing to run) */
        int has_handlers = strcmp(cases[c].name, "full") && strcmp(cases[c].name, "streamingllm"); /* those make no tensor */
        KT_CHECK(!has_handlers || emu.ds.allocs > 0, "%s: no device tensor was made", cases[c].name);
        KT_CHECK(host.ds.allocs == 0, "%s: the host mode made device tensors", cases[c].name);
        /* garbage device tensors are freed at each event's end; what outlives the request is what
         * the policy's state still holds: nothing, but for ASL's per-layer scores and
         * TokenSelect's selection cache */
        int keeps = !strcmp(cases[c].name, "asl") || strstr(cases[c].params, "cache_theta");
        KT_CHECK(keeps ? emu.ds.used > 0 : emu.ds.used == 0, "%s: %zu device bytes outlived the events", cases[c].name,
                 emu.ds.used);
        if (getenv("KS_TEST_VERBOSE")) fprintf(stderr, "\n      reports: %.300s; restart %d; rows after the last layer %d", emu.reports, emu.n_restart, emu.prop[emu.n_layers - 1]);
        fprintf(stderr, "\n    %-12s %-62s host %.2f s, emulated %.2f s: %ld device tensors, %ld downloads, peak %.1f KB",
                cases[c].name, cases[c].params, t1 - t0, t2 - t1, emu.ds.allocs, emu.ds.downloads, emu.ds.peak / 1024.0);
        dev_run_free(&host);
        dev_run_free(&emu);
    }
    fprintf(stderr, "\n  ");
    ks_model_close(m);
}

/* Every primitive and tensor method on device tensors (views of ev.q / ev.k / the KV cache,
 * uploads, strided slices, mixed host/device inputs) against the same call on host copies:
 * identical results, device outputs on the device; results kept past an event stay on the
 * device with their values; stale views, bad indices and an out-of-range gather give their
 * named errors. */
static const char *dev_prims_lua =
    "local ks = require 'kvsieve'\n"
    "local m = ks.load('models/kvsieve-tiny')\n"
    "local s = m:session()\n"
    "local ids = {} for i = 1, 40 do ids[i] = (i * 37) % 4000 + 3 end\n"
    "local function eq(a, b, what)\n"
    "  if type(a) == 'userdata' then a = a:tolist() end\n"
    "  if type(b) == 'userdata' then b = b:tolist() end\n"
    "  if type(a) == 'table' then\n"
    "    assert(type(b) == 'table' and #a == #b, what .. ': shapes differ')\n"
    "    for i = 1, #a do eq(a[i], b[i], what .. '[' .. i .. ']') end\n"
    "  else assert(a == b or (a ~= a and b ~= b), string.format('%s: %s vs %s', what, tostring(a), tostring(b))) end\n"
    "end\n"
    "local function on_dev(t, what) assert(tostring(t):find(' on emu', 1, true), what .. ': not on the device: ' .. tostring(t)) end\n"
    "local n_cmp = 0\n"
    "-- f(true) on device inputs, f(false) on host copies: the same values; device results stay there\n"
    "local function cmp(what, f)\n"
    "  local a, b = table.pack(f(true)), table.pack(f(false))\n"
    "  assert(a.n == b.n, what)\n"
    "  for i = 1, a.n do\n"
    "    if type(a[i]) == 'userdata' then on_dev(a[i], what); assert(not tostring(b[i]):find(' on emu', 1, true), what) end\n"
    "    eq(a[i], b[i], what)\n"
    "  end\n"
    "  n_cmp = n_cmp + 1\n"
    "end\n"
    "local kept, saved, later = nil, nil, {}\n"
    "do local ok, e = pcall(ks.scores, ks.tensor({{1, 0}, {0, 1}}, 'f32'), ks.tensor({{{1, 0}}}, 'f32'), {rope = 1})\n"
    "  assert(not ok and e:find(\"the model's RoPE is known only inside an event handler\", 1, true), e) end\n"
    "local r = s:generate(ids, {n = 3, set = {_device = 'emulate'}, policy = {\n"
    "  prefill_qkv = function(ev)\n"
    "    if ev.layer == 1 then\n"
    "      -- what layer 0 kept: still on the device with its values; its view of ev.q is stale\n"
    "      on_dev(kept, 'kept at layer 1'); eq(kept, later.kept, 'kept')\n"
    "      assert(kept.device == 'cpu')\n"
    "      local ok, e = pcall(function() return saved:tolist() end)\n"
    "      assert(not ok and e:find('tensor view used after its event ended', 1, true), e)\n"
    "      later.done = true\n"
    "    end\n"
    "    if ev.layer ~= 0 then return end\n"
    "    local q, k, n = ev.q, ev.k, ev.n\n"
    "    on_dev(q, 'ev.q'); on_dev(k, 'ev.k'); assert(q.device == 'cpu' and q.is_view)\n"
    "    local hq, hk = ks.tensor(q:tolist()), ks.tensor(k:tolist())\n"
    "    local function Q(D) return D and q or hq end\n"
    "    local function K(D) return D and k or hk end\n"
    "    -- scores with every kind of option, strided head slices, host q against device keys\n"
    "    local sopts = { {}, {rows = 'last', scale = 'none', reduce = 'sum'},\n"
    "      {rows = 8, causal = true, softmax = true, out = {0, n - 8}}, {rows = 8, causal = true, softmax = true, out = {0, n - 8}, reduce = 'group'},\n"
    "      {rows = {3, 10}, causal = true, reduce = 'mean'}, {scale = 0.5, softmax = true, key_range = {4, 30}, out = {4, 30}, reduce = 'sum', gqa = 'mod'},\n"
    "      {rows = 4, causal = true, softmax = true, kpos = ks.arange(0, n), qpos = {36, 37, 38, 39}} }\n"
    "    for i, o in ipairs(sopts) do cmp('scores ' .. i, function(D) return ks.scores(Q(D), K(D), o) end) end\n"
    "    cmp('scores of slices', function(D) return ks.scores(Q(D):slice(1, 4, 8), K(D):slice(1, 1, 2), {rows = 8, causal = true, softmax = true, out = {0, n - 8}}) end)\n"
    "    local fp = ks.tensor(q:row(39):tolist())\n"
    "    cmp('scores host q, device k', function(D) return ks.scores(fp, K(D), {scale = 'none', softmax = true, reduce = 'sum'}) end)\n"
    "    cmp('rope', function(D) return ks.rope(Q(D), ks.arange(0, n)) end)\n"
    "    cmp('rope one row', function(D) return ks.rope(Q(D):row(3), 5, {theta = 10000}) end)\n"
    "    -- scores' rope option: the query rotated as ks.rope rotates it, then scored\n"
    "    local ro = {scale = 'none', softmax = true, key_range = {2, 30}, out = {2, 30}, reduce = 'sum', gqa = 'mod'}\n"
    "    local rr = {scale = 'none', softmax = true, key_range = {2, 30}, out = {2, 30}, reduce = 'sum', gqa = 'mod', rope = 7}\n"
    "    cmp('scores rope option', function(D) return ks.scores(Q(D):row(39), K(D), rr) end)\n"
    "    eq(ks.scores(hq:row(39), hk, rr), ks.scores(ks.rope(hq:row(39), 7), hk, ro), 'scores rope option == ks.rope then scores')\n"
    "    local ok, e = pcall(ks.scores, hq:row(39), hk, {rope = -1})\n"
    "    assert(not ok and e:find('option rope: a position (an integer >= 0)', 1, true), e)\n"
    "    local S = ks.scores(q, k, {rows = 8, causal = true, softmax = true, out = {0, n - 8}}) -- (8, 32) on the device\n"
    "    local hS = ks.tensor(S:tolist())\n"
    "    local vals = {} for i = 1, 50 do vals[i] = (i * 7) % 11 - 5 end -- ties\n"
    "    local hv = ks.tensor(vals, 'f32'); local dv = ks._upload(hv); on_dev(dv, 'upload')\n"
    "    local hi = ks.tensor({5, 3, 9, 3, 1, 12, 0}); local di = ks._upload(hi)\n"
    "    local hm = ks.tensor({{1, 2}, {3, 4}, {5, 6}}); local dm = ks._upload(hm)\n"
    "    local function X(D) return D and S or hS end\n"
    "    local function V(D) return D and dv or hv end\n"
    "    local function I(D) return D and di or hi end\n"
    "    cmp('pool1d max', function(D) return ks.pool1d(X(D), 5, 'max') end)\n"
    "    cmp('pool1d avg', function(D) return ks.pool1d(V(D), 3, 'avg') end)\n"
    "    cmp('topk', function(D) return ks.topk(X(D), 5) end)\n"
    "    cmp('topk by value', function(D) return ks.topk(V(D), 7, {sorted = 'value'}) end)\n"
    "    cmp('sort', function(D) return ks.sort(V(D)), ks.sort(V(D), {descending = true}) end)\n"
    "    cmp('sort i32', function(D) return ks.sort(I(D)), ks.sort(I(D), {descending = true}) end)\n"
    "    cmp('argsort rank', function(D) return ks.argsort(V(D)), ks.argsort(V(D), {descending = true}), ks.rank(V(D)) end)\n"
    "    cmp('unique', function(D) return ks.unique(I(D)) end)\n"
    "    cmp('union', function(D) return ks.union(I(D), ks.tensor({2, 40, 2})), ks.union(ks.sort(ks.unique(I(D))), ks.arange(0, 4)) end)\n"
    "    cmp('concat', function(D) return ks.concat(V(D), hv), ks.concat(I(D), {1, 2}, I(D)) end)\n"
    "    cmp('gather', function(D) return ks.gather(X(D), {0, 7, 3, 3}), ks.gather(I(D), ks.tensor({4, 0})), ks.gather(D and dm or hm, {2, 0}) end)\n"
    "    cmp('softmax', function(D) return ks.softmax(X(D)) end)\n"
    "    cmp('reductions', function(D) return ks.sum(X(D), 0), ks.mean(X(D), 1), ks.var(X(D), 0), ks.var(X(D), -1, {ddof = 1}), ks.sum(V(D)), ks.mean(X(D)), ks.var(V(D)) end)\n"
    "    cmp('group sum', function(D) return ks.sum(X(D):reshape(2, 4, n - 8), 1) end)\n"
    "    cmp('cosine', function(D) return ks.cosine(V(D), ks.sort(V(D))), ks.cosine(X(D), ks.softmax(X(D))) end)\n"
    "    cmp('masks', function(D) local g = ks.ge(X(D), 0.05); local c = ks.ge(ks.cosine(X(D):slice(0, 0, 1), X(D):slice(0, 1, 2)), 0.3)\n"
    "      return g, ks.where(g, X(D), ks.softmax(X(D))), c, ks.where(c, I(D), ks.sort(I(D))), ks.where(ks.ge(V(D):slice(0, 0, 1), 9), I(D), ks.sort(I(D))) end)\n"
    "    cmp('scores skip', function(D) local o = {scale = 'none', softmax = true, reduce = 'sum', key_range = {2, 20}, out = {2, 20}}\n"
    "      local one, zero = ks.ge(V(D):slice(0, 0, 1), -100), ks.ge(V(D):slice(0, 0, 1), 100)\n"
    "      local s0 = ks.scores(Q(D):row(5), K(D), o); o.skip = zero; local s1 = ks.scores(Q(D):row(5), K(D), o)\n"
    "      o.skip = one; return s0, s1, ks.scores(Q(D):row(5), K(D), o), ks.topk(s0, 4, {base = 2, skip = one}), ks.topk(s0, 4, {base = 2, skip = zero}) end)\n"
    "    cmp('views', function(D) return X(D):slice(1, 2, 10), X(D):row(3), X(D):reshape(-1), Q(D):slice(1, 0, 2):reshape(-1), X(D):clone() end)\n"
    "    cmp('add', function(D) return X(D) + X(D), V(D) + hv, ks.add(X(D), hS) end)\n"
    "    cmp('where into', function(D) local t = X(D):clone(); assert(ks.where(ks.ge(X(D), 0.05), t, ks.softmax(X(D)), {into = t}) == t); return t end)\n"
    "    cmp('add into', function(D) local t = X(D):clone(); ks.add(t, X(D), {into = t}); return t end)\n"
    "    -- a device tensor read (its host copy kept), then written in place: read again\n"
    "    local w = dv:clone(); assert(w:item(1) == hv:item(1) and w:tolist()[2] == hv:item(1))\n"
    "    ks.add(w, dv, {into = w}); assert(w:item(1) == 2 * hv:item(1) and w:tolist()[2] == 2 * hv:item(1), 'read again')\n"
    "    local ok, e = pcall(ks.add, ev.q, ev.q, {into = ev.q})\n"
    "    assert(not ok and e:find('add: option into must own its memory', 1, true), e)\n"
    "    cmp('stack', function(D) return ks.stack({X(D), hS}), ks.tensor(X(D)) end)\n"
    "    -- host-only operations download: the same values as on the host copies\n"
    "    eq((S - S) * 2, (hS - hS) * 2, 'arith'); eq(-S, -hS, 'unm'); eq(di:float(), hi:float(), 'float'); eq(S:int(), hS:int(), 'int')\n"
    "    eq(q:item(39, 7, 63), hq:item(39, 7, 63), 'item of a large tensor'); eq(S:item(2, 3), hS:item(2, 3), 'item')\n"
    "    assert(#S == 8 and S:numel() == 8 * (n - 8) and S.shape[2] == n - 8)\n"
    "    assert(tostring(S):find('tensor(f32, [8, 32]) on emu [', 1, true), tostring(S))\n"
    "    -- a gather with a bad index on the device: the CPU's message\n"
    "    local ok, e = pcall(ks.gather, S, {0, 99})\n"
    "    assert(not ok and e:find('gather: index 99 at position 1 out of range [0, 8)', 1, true), e)\n"
    "    -- actions take device index tensors\n"
    "    ev:retain(ks.concat(ks.topk(ks.sum(S, 0), 10), ks.arange(n - 8, n)))\n"
    "    kept = ks.topk(dv, 3); later.kept = ks.topk(hv, 3); on_dev(kept, 'kept')\n"
    "    saved = q:slice(0, 0, 2)\n"
    "    later.n_cmp = n_cmp\n"
    "  end,\n"
    "  decode_qkv = function(ev)\n"
    "    if later.dec then return end\n"
    "    later.dec = true\n"
    "    local K, K1 = ev:kv_keys(), ev:kv_values(1)\n"
    "    on_dev(K, 'kv_keys'); assert(K.shape[1] == ev.kv_rows[1] and K.shape[2] == 2)\n"
    "    local hK = ks.tensor(K:tolist())\n"
    "    eq(K1, ks.tensor(K1:tolist()), 'kv_values(1)')\n"
    "    local hq = ks.tensor(ev.q:tolist())\n"
    "    local o = {scale = 'none', softmax = true, key_range = {2, 15}, out = {2, 15}, reduce = 'sum'}\n"
    "    eq(ks.scores(ev.q, K, o), ks.scores(hq, hK, o), 'scores over the cache')\n"
    "    eq(K:reshape(-1), hK:reshape(-1), 'reshape of the cache view')\n"
    "  end }})\n"
    "assert(later.done and later.dec and later.n_cmp >= 25, 'handlers ran: ' .. tostring(later.n_cmp))\n"
    "assert(#r.ids == 3)\n";

KT_TEST(lua_device_emulated_prims_match_host) {
    ks_lua_quiet = 1;
    const char *e = run_lua(dev_prims_lua);
    KT_CHECK(!*e, "%s", e);
}

/* A device tensor a handler keeps (an attend list reused at the next decode step) stays on the
 * device: the next step attends it in place, with no download and no copy; the generated ids
 * equal the host path's; after the request the device holds exactly the kept list (8 int32),
 * and a second request on the same policy (begin drops the old list) holds the same bytes, not
 * twice as many: the old one was collected. */
KT_TEST(lua_device_kept_tensors_stay_on_device) {
    ks_lua_quiet = 1;
    ks_model *m;
    KT_CHECK(ks_model_open("models/kvsieve-tiny", "cpu", &m) == KS_OK, "%s", ks_last_error());
    ks_session *s;
    KT_CHECK(ks_session_create(m, &s) == KS_OK, "%s", ks_last_error());
    int32_t prompt[200];
    uint64_t x = 88172645463325252ull;
    prompt[0] = m->cfg.bos;
    for (int i = 1; i < 200; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        prompt[i] = 3 + (int32_t)(x % (uint64_t)(m->cfg.vocab - 3));
    }
    static const char *src =
        "local ks = require 'kvsieve'\n"
        "local sel\n"
        "return { params = { },\n"
        "  begin = function() sel = nil end,\n"
        "  decode_qkv = function(ev)\n"
        "    if ev.layer ~= 0 then return end\n"
        "    -- the previous step's 8 best rows, and this step's own row\n"
        "    local n = ev.kv_rows[1]\n"
        "    if sel then ev:attend(ks.concat(sel, ks.arange(n - 1, n))) end\n"
        "    local sc = ks.scores(ev.q, ev:kv_keys(), {scale = 'none', reduce = 'sum'})\n"
        "    sel = ks.topk(sc, 8) -- on the device: ascending rows of [0, n)\n"
        "  end }\n";
    gen_out o[3];
    ks_lpol_devstats ds[3];
    for (int r = 0; r < 3; r++) { /* host path, then twice on the emulated device */
        ks_policy *p;
        KT_CHECK(ks_policy_load_string(m, "keep.lua", src, &p) == KS_OK, "%s", ks_last_error());
        KT_CHECK(ks_policy_set(p, "_device", r ? "emulate" : "host") == KS_OK, "%s", ks_last_error());
        generate(s, p, prompt, 200, 6, &o[r]);
        ks_lpol_dev_stats(p, &ds[r]);
        KT_CHECK(o[r].st == KS_OK, "run %d: %s", r, o[r].err);
        if (r == 2) { /* the same policy again: its first request's list is garbage now */
            generate(s, p, prompt, 200, 6, &o[r]);
            KT_CHECK(o[r].st == KS_OK, "second request: %s", o[r].err);
            ks_lpol_dev_stats(p, &ds[r]);
        }
        ks_policy_free(p);
    }
    KT_CHECK(o[0].n == 6 && same_ids(&o[0], &o[1]) && same_ids(&o[0], &o[2]), "the kept list changed the ids");
    KT_CHECK(ds[1].allocs > 0 && ds[1].downloads == 0, "emulated device: %ld tensors, %ld downloads", ds[1].allocs,
             ds[1].downloads);
    KT_CHECK(ds[1].used == 8 * sizeof(int32_t), "after the request %zu device bytes (the kept list is 32)", ds[1].used);
    KT_CHECK(ds[2].used == 8 * sizeof(int32_t), "after a second request %zu device bytes (32: the old list collected)",
             ds[2].used);
    ks_session_free(s);
    ks_model_close(m);
}

/* Failures on the device path: an injected device allocation failure, the _device_mb limit,
 * a device tensor kept by a handler that then failed ("lost"); each a named error, nothing
 * leaks (ASan, and the emulated device's count of live blocks), and the policy works again
 * afterwards. */
KT_TEST(lua_device_emulated_errors) {
    ks_lua_quiet = 1;
    const long live0 = ks_lua_emu_live();
    ks_model *m;
    KT_CHECK(ks_model_open("models/kvsieve-tiny", "cpu", &m) == KS_OK, "%s", ks_last_error());
    ks_session *s;
    KT_CHECK(ks_session_create(m, &s) == KS_OK, "%s", ks_last_error());
    int32_t prompt[40];
    for (int i = 0; i < 40; i++) prompt[i] = (i * 37) % 4000 + 3;
    ks_policy *p;
    KT_CHECK(ks_policy_load_string(m, "dev_errors.lua",
                                   "local ks = require 'kvsieve'\n"
                                   "return { params = { fail = false, use = false },\n"
                                   "  prefill_qkv = function(ev, p)\n"
                                   "    if ev.layer ~= 0 then return end\n"
                                   "    if p.use then ev:report('kept', tostring(G)); return G:tolist() end\n"
                                   "    local sc = ks.scores(ev.q, ev.k, {rows = 4, causal = true, softmax = true, reduce = 'sum'})\n"
                                   "    G = ks.topk(ks.pool1d(sc, 3, 'max'), 5)\n"
                                   "    if p.fail then error('boom') end\n"
                                   "    ev:report('top', table.concat(G:tolist(), ','))\n"
                                   "  end }\n",
                                   &p) == KS_OK,
             "%s", ks_last_error());
    KT_CHECK(ks_policy_set(p, "_device", "emulate") == KS_OK, "%s", ks_last_error());
    char buf[64];
    KT_CHECK(ks_policy_get(p, "_device", buf, sizeof buf) == KS_OK && !strcmp(buf, "emulate"), "%s", buf);
    KT_CHECK(ks_policy_set(p, "_device", "gpu") == KS_ERR_ARG && strstr(ks_last_error(), "auto, host or emulate"), "%s", ks_last_error());
    gen_out ok1, o;
    generate(s, p, prompt, 40, 2, &ok1);
    KT_CHECK(ok1.st == KS_OK, "%s", ok1.err);
    const char *top = ks_policy_report(p, "top");
    KT_CHECK(top && strlen(top) > 4, "report top: %s", top ? top : "(none)");
    char top1[256];
    snprintf(top1, sizeof top1, "%s", top);
    /* an injected allocation failure of the device */
    ks_lua_emu_fail_in = 3;
    generate(s, p, prompt, 40, 2, &o);
    ks_lua_emu_fail_in = 0;
    KT_CHECK(o.st == KS_ERR_POLICY && strstr(o.err, "injected failure") && strstr(o.err, "prefill_qkv (layer 0)"), "%d %s", o.st, o.err);
    /* the device limit */
    KT_CHECK(ks_policy_set(p, "_device_mb", "0.0001") == KS_OK, "%s", ks_last_error());
    long mem0 = ks_lpol_failures(p, KS_FAIL_MEMORY);
    generate(s, p, prompt, 40, 2, &o);
    KT_CHECK(o.st == KS_ERR_POLICY && strstr(o.err, "device memory limit of") && strstr(o.err, "_device_mb"), "%d %s", o.st, o.err);
    KT_CHECK(ks_lpol_failures(p, KS_FAIL_MEMORY) == mem0 + 1, "classified as memory");
    KT_CHECK(ks_policy_set(p, "_device_mb", "64") == KS_OK, "%s", ks_last_error());
    /* a handler that fails with a device tensor in a global: it is lost, and says so */
    KT_CHECK(ks_policy_set(p, "fail", "true") == KS_OK, "%s", ks_last_error());
    generate(s, p, prompt, 40, 2, &o);
    KT_CHECK(o.st == KS_ERR_POLICY && strstr(o.err, "boom"), "%s", o.err);
    KT_CHECK(ks_policy_set(p, "fail", "false") == KS_OK && ks_policy_set(p, "use", "true") == KS_OK, "%s", ks_last_error());
    generate(s, p, prompt, 40, 2, &o);
    KT_CHECK(o.st == KS_ERR_POLICY && strstr(o.err, "device tensor lost"), "%s", o.err);
    /* and the policy is fine afterwards, with the same result as before */
    KT_CHECK(ks_policy_set(p, "use", "false") == KS_OK, "%s", ks_last_error());
    generate(s, p, prompt, 40, 2, &o);
    KT_CHECK(o.st == KS_OK && same_ids(&o, &ok1), "%s", o.err);
    top = ks_policy_report(p, "top");
    KT_CHECK(top && !strcmp(top, top1), "top %s vs %s", top ? top : "-", top1);
    ks_lpol_devstats ds;
    ks_lpol_dev_stats(p, &ds);
    /* the global G keeps its 5 indices on the device, and nothing else is left there */
    KT_CHECK(ds.used == 5 * sizeof(int32_t) && ds.allocs > 0 && !strcmp(ds.mode, "emulate"), "used %zu allocs %ld mode %s",
             ds.used, ds.allocs, ds.mode);
    KT_CHECK(ks_lua_emu_live() > live0, "the global G holds a block of the emulated device");
    ks_policy_free(p);
    /* freeing the policy frees every block it still held (G's): none is left behind */
    KT_CHECK(ks_lua_emu_live() == live0, "%ld blocks of the emulated device live after the policy was freed (%ld before)",
             ks_lua_emu_live(), live0);
    ks_session_free(s);
    ks_model_close(m);
}
