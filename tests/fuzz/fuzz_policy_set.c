/* fuzz_policy_set.c — libFuzzer harness for policy parameter values, the `--set key=value`
 * overrides (ks_policy_set / ks_policy_get in lua/policy_lua.c): integers, numbers, booleans
 * and strings by the type of each default, the table parameter that cannot be set, unknown keys,
 * and the reserved sandbox limits _memory_mb, _instructions, _seconds, _device, _device_mb.
 *
 * At init one sandboxed policy is loaded with parameters of every type and a begin handler that
 * uses them (loops bounded by the integer, allocations by the number, string operations) under
 * the limits. Input: byte 0 < 0xf0 picks a key from the list below and the rest is its value;
 * byte 0 >= 0xf0 means the rest is a whole "key=value" as on the command line (split at the
 * first '='). The value is NUL-terminated here (the API takes C strings). After the set, every
 * parameter is read back with ks_policy_get (into a buffer whose size the input picks, down to
 * one byte), the begin handler runs under the limits just set, and the limits and parameters
 * are restored for the next input. Seeds: tests/fuzz/corpus/policy_set (the --set values of
 * the project's policies, tests and README). */
#include "fuzz_util.h"
#include "policy.h"
#include "policy_lua.h"
#include "ks_lua.h"

static const char SRC[] =
    "local ks = require 'kvsieve'\n"
    "return { params = { k = 8, ratio = 0.5, on = true, mode = 'max', list = {1, 2}, layer = 13, w = -1 },\n"
    "  begin = function(p)\n"
    "    local t = {}\n"
    "    for i = 1, math.min(p.k, 64) do t[i] = i * p.ratio end\n"
    "    if p.on then t[#t + 1] = p.mode:rep(math.min(math.max(p.layer, 0), 8)) end\n"
    "    if p.k > 0 and p.k < 1000 then local z = ks.zeros(p.k) end\n"
    "    ks.report('k', p.k); ks.report('ratio', p.ratio); ks.report('mode', p.mode)\n"
    "  end }\n";

static const char *kKeys[] = {"k", "ratio", "on", "mode", "list", "layer", "w", "_memory_mb", "_instructions",
                              "_seconds", "_device", "_device_mb", "kk", "", "_x", "_memory", "K"};
static ks_policy *g_p;

static void restore(void) {
    ks_policy_set(g_p, "_memory_mb", "64");
    ks_policy_set(g_p, "_instructions", "1e7");
    ks_policy_set(g_p, "_seconds", "5");
    ks_policy_set(g_p, "_device", "auto");
    ks_policy_set(g_p, "_device_mb", "1024");
    ks_policy_set(g_p, "k", "8");
    ks_policy_set(g_p, "ratio", "0.5");
    ks_policy_set(g_p, "on", "true");
    ks_policy_set(g_p, "mode", "max");
    ks_policy_set(g_p, "layer", "13");
    ks_policy_set(g_p, "w", "-1");
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc; (void)argv;
    ks_lua_quiet = 1;
    if (ks_policy_load_string(NULL, "setfuzz.lua", SRC, &g_p) != KS_OK) {
        fprintf(stderr, "fuzz_policy_set: %s\n", ks_last_error());
        abort();
    }
    restore();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2 || size > 4096) return 0;
    char *buf = malloc(size + 1);
    memcpy(buf, data + 1, size - 1);
    buf[size - 1] = 0;
    const char *key, *val;
    if (data[0] >= 0xf0) { /* "key=value", as --set gives it */
        char *eq = strchr(buf, '=');
        if (!eq) { free(buf); return 0; }
        *eq = 0;
        key = buf;
        val = eq + 1;
    } else {
        key = kKeys[data[0] % (sizeof kKeys / sizeof *kKeys)];
        val = buf;
    }
    ks_policy_set(g_p, key, val);
    size_t cap = 1 + data[0] % 40;
    char *out = malloc(cap);
    for (int i = 0; i < ks_policy_n_params(g_p); i++) {
        const char *nm = ks_policy_param_name(g_p, i);
        if (!nm) __builtin_trap();
        if (ks_policy_get(g_p, nm, out, cap) == KS_OK && !memchr(out, 0, cap)) __builtin_trap();
    }
    ks_policy_get(g_p, key, out, cap);
    free(out);
    if (g_p->begin) g_p->begin(g_p->ud, NULL);
    for (int i = 0; i < ks_policy_n_reports(g_p); i++) (void)ks_policy_report(g_p, ks_policy_report_key(g_p, i));
    restore();
    free(buf);
    ks_clear_error();
    return 0;
}
