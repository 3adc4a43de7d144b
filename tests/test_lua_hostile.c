/* test_lua_hostile.c — hostile policies and scripts (issue 12, "policies cannot crash, hang or
 * outgrow the process"): each reproducer found by fuzzing gives its named one-line error (or,
 * where the operation is well defined, its result) instead of a crash, a hang or unbounded
 * memory. One test per reproducer. None asserts on time: a budget is proven by its named error.
 * Run from the repository root. */
#include "engine.h"
#include "ks_lua.h"
#include "ktest.h"
#include "policy_lua.h"
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ================================================================ fixtures */

static const int32_t prompt8[] = {1, 5, 9, 12, 3, 7, 22, 40};

typedef struct fixture {
    char dir[256];
    ks_model *m;
    ks_session *s;
} fixture;

/* A tiny random model with n_kv_heads KV heads (0 = the default config). */
static int fx_open(fixture *f, int n_kv_heads) {
    memset(f, 0, sizeof *f);
    if (kt_tmpdir(f->dir, sizeof f->dir)) return -1;
    kt_tiny_cfg c = kt_tiny_default();
    if (n_kv_heads) {
        c.n_heads = c.n_kv_heads = n_kv_heads;
        c.dim = 2 * n_kv_heads; /* head_dim 2 */
    }
    if (kt_write_tiny_model(f->dir, &c)) return -1;
    if (ks_model_open(f->dir, "cpu", &f->m)) return -1;
    return ks_session_create(f->m, &f->s) ? -1 : 0;
}

static void fx_close(fixture *f) {
    if (f->s) ks_session_free(f->s);
    if (f->m) ks_model_close(f->m);
    kt_rmdir(f->dir);
}

typedef struct run_out {
    ks_status st;
    char err[4096];
    char report[256]; /* the value of the report key asked for, or "" */
    long failures;    /* of the kind asked for */
} run_out;

/* Load src as a sandboxed policy, apply the "key=value" settings in sets (NULL-terminated;
 * may be NULL), generate max_new tokens from prompt8 and collect the outcome. */
static ks_status run_policy(fixture *f, const char *src, const char *const *sets, int max_new, const char *report_key,
                            ks_fail_kind kind, run_out *o) {
    memset(o, 0, sizeof *o);
    ks_policy *p;
    ks_status st = ks_policy_load_string(f->m, "hostile.lua", src, &p);
    if (st) {
        snprintf(o->err, sizeof o->err, "load: %s", ks_last_error());
        return o->st = st;
    }
    for (int i = 0; sets && sets[i]; i++) {
        char key[64];
        const char *eq = strchr(sets[i], '=');
        snprintf(key, sizeof key, "%.*s", (int)(eq - sets[i]), sets[i]);
        if ((st = ks_policy_set(p, key, eq + 1))) {
            snprintf(o->err, sizeof o->err, "set %s: %s", sets[i], ks_last_error());
            ks_policy_free(p);
            return o->st = st;
        }
    }
    ks_session_set_policy(f->s, p);
    ks_generate_opts opts;
    ks_generate_opts_default(&opts);
    opts.max_new_tokens = max_new;
    o->st = ks_generate_ids(f->s, prompt8, 8, &opts, NULL, NULL);
    snprintf(o->err, sizeof o->err, "%s", o->st ? ks_last_error() : "");
    ks_session_set_policy(f->s, NULL);
    const char *r = report_key ? ks_policy_report(p, report_key) : NULL;
    snprintf(o->report, sizeof o->report, "%s", r ? r : "");
    o->failures = ks_lpol_failures(p, kind);
    ks_policy_free(p); /* lua_close: any finalizer would run here */
    return o->st;
}

/* Run a chunk in a fresh host state (the REPL's / a script's); its error ("" on success). */
static const char *run_lua(const char *code) {
    static char err[4096];
    err[0] = 0;
    lua_State *L = ks_lua_host_state();
    if (!L) return "no state";
    if (luaL_dostring(L, code) != LUA_OK) snprintf(err, sizeof err, "%s", lua_tostring(L, -1));
    ks_lua_host_close(L);
    return err;
}

/* A policy whose prefill_qkv handler (layer 0 only) runs body; ks is the module. */
#define AT_L0(body)                                                                                          \
    "local ks = require 'kvsieve'\nreturn { prefill_qkv = function(ev, p)\nif ev.layer ~= 0 then return end\n" body \
    "\nend }"

/* Expect the policy to fail with kind and a message containing want. */
#define EXPECT_FAIL(f, src, sets, kind, want)                                                                     \
    do {                                                                                                          \
        run_out o_;                                                                                               \
        run_policy((f), (src), (sets), 2, NULL, (kind), &o_);                                                     \
        KT_CHECK(o_.st == KS_ERR_POLICY, "status %d: %s", o_.st, o_.err);                                          \
        KT_CHECK(strstr(o_.err, (want)), "message\n%s\nlacks\n%s", o_.err, (want));                                \
        KT_CHECK(o_.failures == 1, "%ld failures of kind %s: %s", o_.failures, ks_fail_kind_name(kind), o_.err);   \
    } while (0)

/* ================================================================ tensors */

KT_TEST(hostile_scalar_plus_empty_tensor_is_empty) {
    /* was: division by zero in flat_off (SIGFPE) */
    const char *e = run_lua("local ks = require 'kvsieve'\n"
                            "local r = ks.tensor({1}) + ks.zeros(0)\n"
                            "assert(r:numel() == 0 and #r:size() == 1, tostring(r))\n"
                            "r = ks.zeros(0) - ks.tensor({2})\n"
                            "assert(r:numel() == 0, tostring(r))\n"
                            "r = ks.zeros({3, 0}) * 2\n"
                            "assert(r:numel() == 0 and r:size(0) == 3, tostring(r))\n"
                            "local ok, err = pcall(function() return ks.zeros(0) + ks.tensor({1, 2}) end)\n"
                            "assert(not ok and err:find('shapes differ'), err)\n");
    KT_CHECK(!*e, "%s", e);
}

KT_TEST(hostile_tensor_from_table_with_string_row) {
    /* was: lua_rawgeti on a string (SIGSEGV) */
    const char *e = run_lua("local ks = require 'kvsieve'\n"
                            "local ok, err = pcall(ks.tensor, {{1, 2}, 'ab'})\n"
                            "assert(not ok and err:find('tensor: ragged table: entry 2 at depth 1 is a string, expected a nested table', 1, true), err)\n"
                            "ok, err = pcall(ks.tensor, {{1, 2}, 'ab'}, 'f32')\n"
                            "assert(not ok and err:find('is a string, expected a nested table', 1, true), err)\n"
                            "ok, err = pcall(ks.tensor, {{}, 'ab'})\n"
                            "assert(not ok and err:find('is a string, expected a nested table', 1, true), err)\n");
    KT_CHECK(!*e, "%s", e);
}

KT_TEST(hostile_tensor_from_table_with_tensor_row) {
    /* was: lua_rawgeti on a userdata (its byte size taken as a length) */
    const char *e = run_lua("local ks = require 'kvsieve'\n"
                            "local ok, err = pcall(ks.tensor, {{1}, ks.zeros(1)})\n"
                            "assert(not ok and err:find('entry 2 at depth 1 is a userdata, expected a nested table', 1, true), err)\n");
    KT_CHECK(!*e, "%s", e);
}

KT_TEST(hostile_i32_plus_maxinteger_is_named) {
    /* was: an out-of-range double cast to int64 (undefined) */
    const char *e = run_lua("local ks = require 'kvsieve'\n"
                            "local ok, err = pcall(function() return ks.tensor({1}) + math.maxinteger end)\n"
                            "assert(not ok and err:find('add: i32 result 9.22', 1, true) and err:find('is outside int32'), err)\n"
                            "ok, err = pcall(function() return ks.tensor({2147483647}) + 1 end)\n"
                            "assert(not ok and err:find('outside int32'), err)\n"
                            "ok, err = pcall(function() return ks.tensor({-32768}) * 65536 end)\n"
                            "assert(ok and err:item(0) == -2147483648, tostring(err))\n"
                            "ok, err = pcall(ks.tensor, 3000000000)\n"
                            "assert(not ok and err:find('3000000000 is outside int32', 1, true), err)\n"
                            "assert((ks.tensor({1}) + 2^40).dtype == 'f32')\n");
    KT_CHECK(!*e, "%s", e);
}

KT_TEST(hostile_reshape_product_overflow_is_named) {
    /* was: a signed overflow in the product of the dimensions */
    const char *e = run_lua("local ks = require 'kvsieve'\n"
                            "local ok, err = pcall(function() return ks.zeros(4):reshape(1 << 32, 1 << 32) end)\n"
                            "assert(not ok and err:find('reshape: shape too large', 1, true), err)\n"
                            "ok, err = pcall(function() return ks.zeros(4):reshape({1 << 32, 1 << 32, -1}) end)\n"
                            "assert(not ok and err:find('reshape: shape too large', 1, true), err)\n"
                            "ok, err = pcall(function() return ks.zeros(4):reshape({2, 'x'}) end)\n"
                            "assert(not ok and err:find('shape entry 2 is not an integer', 1, true), err)\n"
                            "assert(ks.zeros(4):reshape({2.0, 2}):size(1) == 2)\n");
    KT_CHECK(!*e, "%s", e);
}

KT_TEST(hostile_zero_size_tensors) {
    /* empty tensors through every copying path (memcpy from an empty view must not see NULL) */
    const char *e = run_lua("local ks = require 'kvsieve'\n"
                            "local z = ks.zeros(0)\n"
                            "assert(z:clone():numel() == 0 and #z:tolist() == 0)\n"
                            "assert(ks.zeros({0, 3}):slice(1, 1, 2):clone():numel() == 0)\n"
                            "assert(ks.zeros({2, 0}):reshape(0, 5):numel() == 0)\n"
                            "assert(ks.stack({z, z}):numel() == 0)\n"
                            "assert(ks.concat(z:int(), {}):numel() == 0)\n"
                            "assert(ks.tensor(z):numel() == 0 and z:int():float():numel() == 0)\n"
                            "assert(ks.tensor({}):numel() == 0)\n"
                            "assert(ks.tensor({{}, {}}):numel() == 0)\n");
    KT_CHECK(!*e, "%s", e);
}

KT_TEST(hostile_empty_kv_pos_clone_at_layer0) {
    /* was: memcpy from NULL (ev:kv_pos(0) of a head with no rows yet) */
    fixture f;
    KT_CHECK(fx_open(&f, 0) == 0, "model: %s", ks_last_error());
    run_out o;
    run_policy(&f,
               AT_L0("local t = ev:kv_pos(0)\n"
                     "local c = t:clone()\n"
                     "local k = ev:kv_keys(0):clone()\n"
                     "ev:report('rows', c:numel() .. ',' .. k:numel() .. ',' .. #c:tolist() .. ',' .. ks.concat(c, c):numel())"),
               NULL, 1, "rows", KS_FAIL_ERROR, &o);
    fx_close(&f);
    KT_CHECK(o.st == KS_OK, "%s", o.err);
    KT_CHECK(!strcmp(o.report, "0,0,0,0"), "report rows = \"%s\"", o.report);
}

/* ================================================================ the Lua stack */

KT_TEST(hostile_retain_per_head_tables_many_kv_heads) {
    /* was: head_lists pushed two values per head without growing the stack (SIGSEGV at 16,
     * 32 and 128 KV heads) */
    static const int heads[] = {16, 32, 128};
    for (size_t i = 0; i < sizeof heads / sizeof heads[0]; i++) {
        fixture f;
        KT_CHECK(fx_open(&f, heads[i]) == 0, "model with %d KV heads: %s", heads[i], ks_last_error());
        run_out o;
        run_policy(&f,
                   AT_L0("local all = {}\n"
                         "for i = 1, ev.n do all[i] = i - 1 end\n"
                         "local lists = {}\n"
                         "for h = 1, ev.n_kv_heads do lists[h] = all end\n"
                         "ev:retain(lists)\n"
                         "local ok, err = pcall(ev.retain, ev, {all})\n"
                         "ev:report('short', ok and 'accepted' or err)\n"
                         "ev:report('heads', ev.n_kv_heads)"),
                   NULL, 1, "heads", KS_FAIL_ERROR, &o);
        char want[32];
        snprintf(want, sizeof want, "%d", heads[i]);
        fx_close(&f);
        KT_CHECK(o.st == KS_OK, "%d KV heads: %s", heads[i], o.err);
        KT_CHECK(!strcmp(o.report, want), "%d KV heads: report heads = %s", heads[i], o.report);
    }
}

KT_TEST(hostile_attend_per_head_tables_many_kv_heads) {
    fixture f;
    KT_CHECK(fx_open(&f, 128) == 0, "model: %s", ks_last_error());
    run_out o;
    run_policy(&f,
               AT_L0("local lists = {}\n"
                     "for h = 1, ev.n_kv_heads do lists[h] = {0} end\n"
                     "local ok, err = pcall(ev.attend, ev, lists)\n"
                     "ev:report('attend', ok and 'ok' or err)"),
               NULL, 1, "attend", KS_FAIL_ERROR, &o);
    fx_close(&f);
    KT_CHECK(o.st == KS_OK, "%s", o.err);
    KT_CHECK(*o.report, "no report");
}

KT_TEST(hostile_concat_many_table_arguments) {
    /* was: ks.concat converted up to 64 arguments onto the stack without growing it */
    const char *e = run_lua("local ks = require 'kvsieve'\n"
                            "local args = {}\n"
                            "for i = 1, 64 do args[i] = {i} end\n"
                            "local r = ks.concat(table.unpack(args))\n"
                            "assert(r:numel() == 64 and r:item(63) == 64)\n"
                            "args[65] = {65}\n"
                            "local ok, err = pcall(ks.concat, table.unpack(args))\n"
                            "assert(not ok and err:find('concat: at most 64 arguments', 1, true), err)\n");
    KT_CHECK(!*e, "%s", e);
}

/* ================================================================ parameters */

KT_TEST(hostile_set_integer_param_1e308_is_named) {
    /* was: (long long)1e308, undefined */
    fixture f;
    KT_CHECK(fx_open(&f, 0) == 0, "model: %s", ks_last_error());
    ks_policy *p;
    KT_CHECK(ks_policy_load_string(f.m, "par.lua", "return { params = { k = 4 }, token = function() end }", &p) == KS_OK, "%s", ks_last_error());
    ks_status st = ks_policy_set(p, "k", "1e308");
    char err[512], v[64];
    snprintf(err, sizeof err, "%s", ks_last_error());
    ks_policy_get(p, "k", v, sizeof v);
    ks_status st2 = ks_policy_set(p, "k", "-1e19");
    ks_status st3 = ks_policy_set(p, "k", "1e18");
    char v3[64];
    ks_policy_get(p, "k", v3, sizeof v3);
    ks_policy_free(p);
    fx_close(&f);
    KT_CHECK(st == KS_ERR_ARG && strstr(err, "policy par: parameter k = 1e308 is out of the integer range"), "%d %s", st, err);
    KT_CHECK(!strcmp(v, "4"), "k changed to %s", v);
    KT_CHECK(st2 == KS_ERR_ARG, "-1e19 accepted");
    KT_CHECK(st3 == KS_OK && !strcmp(v3, "1000000000000000000"), "1e18: %d %s", st3, v3);
}

KT_TEST(hostile_set_limits_out_of_range_are_named) {
    /* was: _instructions=1e300 cast to a negative count, which turned the budget off */
    fixture f;
    KT_CHECK(fx_open(&f, 0) == 0, "model: %s", ks_last_error());
    ks_policy *p;
    KT_CHECK(ks_policy_load_string(f.m, "lim.lua", "return { token = function() end }", &p) == KS_OK, "%s", ks_last_error());
    static const char *const bad[][2] = {{"_instructions", "1e300"}, {"_instructions", "inf"}, {"_memory_mb", "1e300"},
                                         {"_memory_mb", "nan"},      {"_seconds", "inf"},      {"_device_mb", "1e300"},
                                         {"_seconds", "-1"}};
    char msg[sizeof bad / sizeof bad[0]][512];
    ks_status st[sizeof bad / sizeof bad[0]];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        st[i] = ks_policy_set(p, bad[i][0], bad[i][1]);
        snprintf(msg[i], sizeof msg[i], "%s", ks_last_error());
    }
    char v[64];
    ks_policy_get(p, "_instructions", v, sizeof v);
    ks_policy_free(p);
    fx_close(&f);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        KT_CHECK(st[i] == KS_ERR_ARG, "%s=%s accepted", bad[i][0], bad[i][1]);
        KT_CHECK(strstr(msg[i], bad[i][0]) && (strstr(msg[i], "out of range") || strstr(msg[i], "expects a non-negative number")),
                 "%s=%s: %s", bad[i][0], bad[i][1], msg[i]);
    }
    KT_CHECK(!strcmp(v, "100000000"), "the instruction budget changed to %s", v);
}

/* ================================================================ budgets over C loops */

KT_TEST(hostile_string_rep_of_nothing_returns_at_once) {
    /* was: string.rep('', huge) spun in C, out of the hooks' reach */
    fixture f;
    KT_CHECK(fx_open(&f, 0) == 0, "model: %s", ks_last_error());
    run_out o;
    static const char *const sets[] = {"_seconds=5", NULL};
    run_policy(&f,
               AT_L0("local a = string.rep('', math.maxinteger)\n"
                     "local b = (''):rep(1 << 60, '')\n"
                     "ev:report('len', #a + #b .. ',' .. ('ab'):rep(3, '-'))"),
               sets, 1, "len", KS_FAIL_ERROR, &o);
    fx_close(&f);
    KT_CHECK(o.st == KS_OK, "%s", o.err);
    KT_CHECK(!strcmp(o.report, "0,ab-ab-ab"), "report %s", o.report);
}

KT_TEST(hostile_string_rep_huge_is_a_memory_error) {
    fixture f;
    KT_CHECK(fx_open(&f, 0) == 0, "model: %s", ks_last_error());
    EXPECT_FAIL(&f, AT_L0("local s = ('x'):rep(1 << 28, ',')"), NULL, KS_FAIL_MEMORY, "memory limit of 64 MB exceeded");
    EXPECT_FAIL(&f, AT_L0("local s = ('x'):rep(1 << 40, ',')"), NULL, KS_FAIL_ERROR, "resulting string too large");
    fx_close(&f);
}

KT_TEST(hostile_backtracking_pattern_is_refused) {
    /* was: string.find with nested quantifiers ran (n+1)^k steps in C */
    fixture f;
    KT_CHECK(fx_open(&f, 0) == 0, "model: %s", ks_last_error());
    EXPECT_FAIL(&f, AT_L0("local s = ('a'):rep(20000)\nlocal i = s:find(('a*'):rep(12) .. 'b')"), NULL, KS_FAIL_FORBIDDEN,
                "string.find: the pattern \"a*a*a*a*");
    EXPECT_FAIL(&f, AT_L0("local s = ('a'):rep(20000)\nfor w in s:gmatch('.-.-.-b') do end"), NULL, KS_FAIL_FORBIDDEN,
                "string.gmatch: the pattern \".-.-.-b\" could take up to");
    EXPECT_FAIL(&f, AT_L0("local s = ('a'):rep(1 << 20)\nlocal i = s:find(('a'):rep(1 << 19) .. 'b', 1, true)"), NULL,
                KS_FAIL_FORBIDDEN, "string.find: the pattern");
    /* ordinary patterns still work, as methods and as string.* */
    run_out o;
    run_policy(&f,
               AT_L0("local t = {}\n"
                     "for w in string.gmatch('a, b,c', '[^,%s]+') do t[#t + 1] = w end\n"
                     "local k, v = ('key=val'):match('^(%w+)=(.*)$')\n"
                     "ev:report('m', table.concat(t, '|') .. ';' .. k .. ';' .. v .. ';' .. ('x.y'):gsub('%.', '-') .. ';' .. "
                     "tostring(('abc'):find('b', 1, true)) .. ';' .. ('f(a(b)c)'):match('%b()'))"),
               NULL, 1, "m", KS_FAIL_ERROR, &o);
    fx_close(&f);
    KT_CHECK(o.st == KS_OK, "%s", o.err);
    KT_CHECK(!strcmp(o.report, "a|b|c;key;val;x-y;2;(a(b)c)"), "report %s", o.report);
}

KT_TEST(hostile_table_move_huge_range_ticks_the_budget) {
    /* was: table.move({}, 1, maxint - 1, 2) moved nils in C forever */
    fixture f;
    KT_CHECK(fx_open(&f, 0) == 0, "model: %s", ks_last_error());
    static const char *const sets[] = {"_instructions=1000000", NULL};
    EXPECT_FAIL(&f, AT_L0("table.move({}, 1, math.maxinteger - 1, 2)"), sets, KS_FAIL_INSTRUCTIONS, "instruction budget exceeded");
    fx_close(&f);
}

/* A table whose length, from a C function (os.time of its own date fields), is about 1.9e9. */
#define HUGE_LEN "local t = setmetatable({year = 2030, month = 1, day = 1}, {__len = os.time})\nassert(#t > 1e9, #t)\n"

KT_TEST(hostile_table_remove_with_a_c_len_ticks_the_budget) {
    /* table.remove(t, 1) shifted #t entries in C, #t from a C __len (no hook anywhere) */
    fixture f;
    KT_CHECK(fx_open(&f, 0) == 0, "model: %s", ks_last_error());
    static const char *const sets[] = {"_instructions=1000000", NULL};
    EXPECT_FAIL(&f, AT_L0(HUGE_LEN "table.remove(t, 1)"), sets, KS_FAIL_INSTRUCTIONS, "instruction budget exceeded");
    EXPECT_FAIL(&f, AT_L0(HUGE_LEN "table.insert(t, 1, 0)"), sets, KS_FAIL_INSTRUCTIONS, "instruction budget exceeded");
    fx_close(&f);
}

KT_TEST(hostile_table_sort_with_c_comparator_ticks_the_budget) {
    /* __len from a C function and a C comparator (math.type: always false): every step was
     * C, no hook ever fired */
    fixture f;
    KT_CHECK(fx_open(&f, 0) == 0, "model: %s", ks_last_error());
    static const char *const sets[] = {"_instructions=1000000", NULL};
    EXPECT_FAIL(&f, AT_L0(HUGE_LEN "table.sort(t, math.type)"), sets, KS_FAIL_INSTRUCTIONS, "instruction budget exceeded");
    EXPECT_FAIL(&f, AT_L0(HUGE_LEN "getmetatable(t).__index = tostring\ntable.concat(t)"), sets, KS_FAIL_INSTRUCTIONS,
                "instruction budget exceeded");
    /* and the table library still does its job */
    run_out o;
    run_policy(&f,
               AT_L0("local t = {5, 3, 9, 1}\n"
                     "table.sort(t)\n"
                     "local d = {5, 3, 9, 1}\n"
                     "table.sort(d, function(a, b) return a > b end)\n"
                     "table.insert(t, 1, 0) table.insert(t, 10) local r = table.remove(t, 2)\n"
                     "local m = table.move({1, 2, 3}, 1, 3, 2)\n"
                     "ev:report('t', table.concat(t, ',') .. ';' .. table.concat(d, ',') .. ';' .. r .. ';' .. table.concat(m, ',') .. "
                     "';' .. select('#', table.unpack({1, 2, 3})) .. ';' .. table.concat({}, ','))"),
               NULL, 1, "t", KS_FAIL_ERROR, &o);
    fx_close(&f);
    KT_CHECK(o.st == KS_OK, "%s", o.err);
    KT_CHECK(!strcmp(o.report, "0,3,5,9,10;9,5,3,1;1;1,1,2,3;3;"), "report %s", o.report);
}

KT_TEST(hostile_gc_metatable_added_by_index_does_not_escape) {
    /* setmetatable read __gc through __index of the metatable's own metatable, which could
     * add a raw __gc after answering nil: the object was then finalized with hooks off */
    fixture f;
    KT_CHECK(fx_open(&f, 0) == 0, "model: %s", ks_last_error());
    run_out o;
    run_policy(&f,
               AT_L0("local called, ran = false, false\n"
                     "local mt = setmetatable({}, {__index = function(t, k)\n"
                     "  called = true\n"
                     "  rawset(t, '__gc', function() ran = true end)\n"
                     "end})\n"
                     "setmetatable({}, mt)\n"
                     "collectgarbage() collectgarbage()\n"
                     "ev:report('gc', tostring(called) .. ',' .. tostring(ran))"),
               NULL, 1, "gc", KS_FAIL_ERROR, &o);
    KT_CHECK(o.st == KS_OK, "%s", o.err);
    KT_CHECK(!strcmp(o.report, "false,false"), "the finalizer escaped: __index called, finalizer ran = %s", o.report);
    /* a __gc given directly is still refused */
    EXPECT_FAIL(&f, AT_L0("setmetatable({}, {__gc = false})"), NULL, KS_FAIL_FORBIDDEN, "__gc metamethods are not allowed");
    /* and the binding's own metatables cannot be reached to be given one */
    run_policy(&f,
               AT_L0("ev:report('mt', tostring(getmetatable(ks.zeros(1))) .. ',' .. tostring(getmetatable(ev)) .. ',' .. "
                     "tostring(getmetatable(os)))"),
               NULL, 1, "mt", KS_FAIL_ERROR, &o);
    fx_close(&f);
    KT_CHECK(o.st == KS_OK, "%s", o.err);
    KT_CHECK(!strcmp(o.report, "kvsieve.tensor,kvsieve.event,os"), "report %s", o.report);
}

/* ================================================================ memory */

KT_TEST(hostile_report_values_count_against_memory_limit) {
    /* was: ks.report copied values with malloc, outside the limit (40 x 25 MB under 64 MB) */
    fixture f;
    KT_CHECK(fx_open(&f, 0) == 0, "model: %s", ks_last_error());
    EXPECT_FAIL(&f, AT_L0("for i = 1, 40 do ks.report('k' .. i, ('x'):rep(25 << 20)) end"), NULL, KS_FAIL_MEMORY,
                "memory limit of 64 MB exceeded");
    static const char *const sets[] = {"_memory_mb=8", NULL};
    EXPECT_FAIL(&f, AT_L0("local v = ('x'):rep(3 << 20)\nfor i = 1, 4 do ev:report('k' .. i, v) end"), sets, KS_FAIL_MEMORY,
                "report: memory limit of 8 MB exceeded by a 3145732-byte report entry");
    /* replacing a value charges only the growth, and reports are released at the next request */
    run_out o;
    run_policy(&f,
               AT_L0("local v = ('x'):rep(3 << 20)\nfor i = 1, 10 do ev:report('same', v) end\n"
                     "ev:report('same', 'small')"),
               sets, 2, "same", KS_FAIL_MEMORY, &o);
    fx_close(&f);
    KT_CHECK(o.st == KS_OK, "%s", o.err);
    KT_CHECK(!strcmp(o.report, "small"), "report %s", o.report);
}

/* ================================================================ closing a running policy */

KT_TEST(hostile_close_policy_from_stream_callback) {
    /* was: heap-use-after-free (the engine kept calling the freed policy) */
    fixture f;
    KT_CHECK(fx_open(&f, 0) == 0, "model: %s", ks_last_error());
    char code[2048];
    snprintf(code, sizeof code,
             "local ks = require 'kvsieve'\n"
             "local m = ks.load('%s')\n"
             "local s = m:session()\n"
             "local p = ks.policy({ token = function(ev) end })\n"
             "local ok, err = pcall(s.generate, s, {1, 2, 3}, {n = 3, policy = p, stream = function() p:close() end})\n"
             "assert(not ok and err:find('cannot close it while it runs', 1, true), err)\n"
             "local q = m:policy('policies/noop.lua')\n"
             "ok, err = pcall(s.generate, s, {1, 2, 3}, {n = 3, policy = q, stream = function() q:close() end})\n"
             "assert(not ok and err:find('cannot close it while it runs', 1, true), err)\n"
             "local r = s:generate({1, 2, 3}, {n = 2, policy = p})\n"
             "assert(r.n_generated == 2)\n"
             "p:close() q:close()\n"
             "ok, err = pcall(s.generate, s, {1, 2, 3}, {n = 2, policy = p})\n"
             "assert(not ok and err:find('policy used after it was closed', 1, true), err)\n",
             f.dir);
    const char *e = run_lua(code);
    fx_close(&f);
    KT_CHECK(!*e, "%s", e);
}

KT_TEST(hostile_close_policy_from_its_own_handler) {
    /* was: heap-use-after-free in the trampoline after the handler returned */
    fixture f;
    KT_CHECK(fx_open(&f, 0) == 0, "model: %s", ks_last_error());
    char code[2048];
    snprintf(code, sizeof code,
             "local ks = require 'kvsieve'\n"
             "local s = ks.load('%s'):session()\n"
             "local p\n"
             "p = ks.policy({ token = function(ev) p:close() end, prefill_qkv = function(ev) if ev.layer == 0 then p:close() end end })\n"
             "local ok, err = pcall(s.generate, s, {1, 2, 3}, {n = 2, policy = p})\n"
             "assert(not ok and err:find('cannot close it while it runs', 1, true), err)\n"
             "p:close()\n"
             "assert(tostring(p) == 'policy(closed)')\n",
             f.dir);
    const char *e = run_lua(code);
    fx_close(&f);
    KT_CHECK(!*e, "%s", e);
}

KT_TEST(hostile_scores_stops_at_the_seconds_budget) {
    /* was: ks.scores ran its whole C loop (here 8.6e9 multiply-adds, seconds of work) past
     * _seconds, since no Lua hook fires inside it; now the call's deadline reaches the loop */
    fixture f;
    KT_CHECK(fx_open(&f, 0) == 0, "model: %s", ks_last_error());
    static const char *const sets[] = {"_seconds=0.05", NULL};
    EXPECT_FAIL(&f,
                AT_L0("local q = ks.zeros(4096 * 8 * 64):reshape(4096, 8, 64)\n"
                      "local k = ks.zeros(4096 * 64):reshape(4096, 1, 64)\n"
                      "ks.scores(q, k, {threads = 1})"),
                sets, KS_FAIL_TIMEOUT, "wall-clock budget exceeded");
    fx_close(&f);
}
