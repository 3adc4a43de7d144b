/* test_fuzz_regress.c — regression tests for what the fuzz harnesses of tests/fuzz/ found: each
 * crash, hang, leak or sanitizer report becomes a named test here, feeding the input that
 * triggered it through the normal code path (a policy run by the engine on a tiny model, a file
 * given to the loader, ...) and checking the named error (or the correct result). The inputs
 * themselves are also in the harness's seed corpus (tests/fuzz/corpus/NAME/regress-*), so
 * `make fuzz` replays them too. Under `make test SANITIZE=1` these tests are what shows that
 * the sanitizer report is gone. */
#include "engine.h"
#include "ks_lua.h"
#include "ktest.h"
#include "policy_lua.h"
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ================================================================ helpers */

static const int32_t prompt8[] = {1, 5, 9, 12, 3, 7, 22, 40};

/* Load `src` as a policy on a fresh tiny model, generate 2 tokens from prompt8 and return the
 * status; the error message (or "") goes to err, and the policy's reports "a" and "b" (or "-")
 * to rep_a / rep_b (when not NULL, 256 bytes each). */
static char rep_a[256], rep_b[256];
static ks_status run_policy(const char *src, char *err, size_t n) {
    char dir[256];
    err[0] = 0;
    ks_lua_quiet = 1;
    if (kt_tmpdir(dir, sizeof dir)) { snprintf(err, n, "tmpdir"); return KS_ERR_IO; }
    kt_tiny_cfg c = kt_tiny_default();
    ks_status st = KS_ERR_IO;
    ks_model *m = NULL;
    ks_session *s = NULL;
    ks_policy *p = NULL;
    if (kt_write_tiny_model(dir, &c)) { snprintf(err, n, "tiny model"); goto out; }
    if ((st = ks_model_open(dir, "cpu", &m)) || (st = ks_session_create(m, &s))) { snprintf(err, n, "%s", ks_last_error()); goto out; }
    if ((st = ks_policy_load_string(m, "regress.lua", src, &p))) { snprintf(err, n, "%s", ks_last_error()); goto out; }
    ks_session_set_policy(s, p);
    ks_generate_opts o;
    ks_generate_opts_default(&o);
    o.max_new_tokens = 2;
    st = ks_generate_ids(s, prompt8, (int)(sizeof prompt8 / sizeof *prompt8), &o, NULL, NULL);
    if (st) snprintf(err, n, "%s", ks_last_error());
    const char *ra = ks_policy_report(p, "a"), *rb = ks_policy_report(p, "b");
    snprintf(rep_a, sizeof rep_a, "%s", ra ? ra : "-");
    snprintf(rep_b, sizeof rep_b, "%s", rb ? rb : "-");
    ks_session_set_policy(s, NULL);
out:
    ks_policy_free(p);
    ks_session_free(s);
    ks_model_close(m);
    kt_rmdir(dir);
    return st;
}

/* ================================================================ lua_prims */

/* fuzz_lua_prims: ks.scores with a query of zero rows (the layer-0 KV view in prefill_qkv is
 * empty: its data pointer is NULL) offset that NULL pointer (ks.scores, now lua/prims_scores.c, UBSan "applying
 * zero offset to null pointer"), then core/prims.c did the same with empty keys. An empty
 * query or key set now gives an empty result. */
KT_TEST(fuzz_regress_scores_empty_rows) {
    char err[2048];
    ks_status st = run_policy("local ks = require 'kvsieve'\n"
                              "return { prefill_qkv = function(ev)\n"
                              "  if ev.layer ~= 0 then return end\n"
                              "  local empty = ev:kv_keys()               -- (0, n_kv_heads, head_dim), no data\n"
                              "  assert(empty:size(0) == 0)\n"
                              "  local ok, e = pcall(ks.scores, empty, ev.k)  -- no query rows\n"
                              "  ev:report('a', ok and 'ok' or e)\n"
                              "  ok, e = pcall(ks.scores, ev.q, empty)       -- no keys\n"
                              "  ev:report('b', ok and 'ok' or e)\n"
                              "end }\n",
                              err, sizeof err);
    KT_CHECK(st == KS_OK, "%s", err);
    KT_CHECK(!strcmp(rep_a, "ok") && !strcmp(rep_b, "ok"), "empty query: %s; no keys: %s", rep_a, rep_b);
}

/* fuzz_lua_prims (found by CI's 30 s run): ks.mean / ks.sum along an axis of a tensor with no
 * elements offset its NULL data pointer (the reduce of lua/prims_lua.c, UBSan "applying zero offset to
 * null pointer"); ks.concat of empty pieces did the same at its output. Now a sum over an empty
 * axis is 0, a mean over one is the named error "axis 0 is empty", an empty output stays empty. */
KT_TEST(fuzz_regress_reduce_and_concat_of_empty) {
    char err[2048];
    ks_status st = run_policy("local ks = require 'kvsieve'\n"
                              "return { prefill_qkv = function(ev)\n"
                              "  if ev.layer ~= 0 then return end\n"
                              "  local empty = ev:kv_keys()               -- (0, n_kv_heads, head_dim), no data\n"
                              "  local r = {}\n"
                              "  for _, f in ipairs({ks.sum, ks.mean}) do\n"
                              "    for axis = 0, 2 do\n"
                              "      local ok, e = pcall(f, empty, axis)\n"
                              "      r[#r + 1] = ok and 'ok' or (tostring(e):find('is empty') and 'empty') or e\n"
                              "    end\n"
                              "  end\n"
                              "  ev:report('a', table.concat(r, ','))\n"
                              "  local ok, e = pcall(ks.concat, ks.zeros(0), ks.zeros(0))\n"
                              "  ev:report('b', ok and ('ok ' .. e:size(0)) or e)\n"
                              "end }\n",
                              err, sizeof err);
    KT_CHECK(st == KS_OK, "%s", err);
    KT_CHECK(!strcmp(rep_a, "ok,ok,ok,empty,ok,ok"), "sum/mean of an empty tensor along each axis: %s", rep_a);
    KT_CHECK(!strcmp(rep_b, "ok 0"), "concat of empty pieces: %s", rep_b);
}

/* fuzz_lua_prims (a 120 s run with CI's seed): t:slice of a tensor with no elements (and indexing
 * one with a zero-length trailing dimension) offset its NULL data pointer (lua/tensor.c, UBSan
 * "applying zero offset to null pointer"). Now the view of nothing is an empty view. */
KT_TEST(fuzz_regress_slice_of_empty) {
    char err[2048];
    ks_status st = run_policy("local ks = require 'kvsieve'\n"
                              "return { prefill_qkv = function(ev)\n"
                              "  if ev.layer ~= 0 then return end\n"
                              "  local empty = ev:kv_keys()               -- (0, n_kv_heads, head_dim), no data\n"
                              "  local r = {}\n"
                              "  for d = 0, 2 do\n"
                              "    local ok, e = pcall(function() return empty:slice(d, 0, 0):numel() end)\n"
                              "    r[#r + 1] = ok and tostring(e) or e\n"
                              "  end\n"
                              "  ev:report('a', table.concat(r, ','))\n"
                              "  local ok, e = pcall(function() return ks.zeros(0):reshape(3, 0):row(1):numel() end)\n"
                              "  ev:report('b', ok and tostring(e) or e)\n"
                              "end }\n",
                              err, sizeof err);
    KT_CHECK(st == KS_OK, "%s", err);
    KT_CHECK(!strcmp(rep_a, "0,0,0"), "slices of an empty tensor: %s", rep_a);
    KT_CHECK(!strcmp(rep_b, "0") || strstr(rep_b, "reshape") || strstr(rep_b, "index"), "row of a (3, 0) tensor: %s", rep_b);
}

/* fuzz_lua_prims (CI's 30 s run, stop 22): ks.zeros{8, math.maxinteger, 0} has no elements, so
 * its element count passed, but the contiguous strides multiplied the other dimensions and
 * overflowed int64 (lua/tensor.c, UBSan "signed integer overflow"). Now every shape is checked
 * with zeros counted as ones before a stride is computed: the named error "too many elements". */
KT_TEST(fuzz_regress_empty_tensor_huge_dims) {
    char err[2048];
    ks_status st = run_policy("local ks = require 'kvsieve'\n"
                              "return { prefill_qkv = function(ev)\n"
                              "  if ev.layer ~= 0 then return end\n"
                              "  local r = {}\n"
                              "  for _, s in ipairs({{8, math.maxinteger, 0}, {0, math.maxinteger, 8}, {0, 1 << 31, 1 << 31}}) do\n"
                              "    local ok, e = pcall(ks.zeros, s)\n"
                              "    r[#r + 1] = ok and 'ok' or (tostring(e):find('too many elements') and 'big') or e\n"
                              "  end\n"
                              "  local z = ks.zeros({0, 1000, 8})\n"
                              "  r[#r + 1] = tostring(z:numel())\n"
                              "  local ok, e = pcall(function() return z:reshape(0, math.maxinteger, 2) end)\n"
                              "  r[#r + 1] = ok and 'ok' or (tostring(e):find('too many elements') and 'big') or e\n"
                              "  ev:report('a', table.concat(r, ','))\n"
                              "end }\n",
                              err, sizeof err);
    KT_CHECK(st == KS_OK, "%s", err);
    KT_CHECK(!strcmp(rep_a, "big,big,big,0,big"), "empty shapes with huge dimensions: %s", rep_a);
}
