/* env_opts.c — see env_opts.h: the one place where the environment becomes options. */
#include "env_opts.h"

#include <lua.h>
#include <stdlib.h>
#include <string.h>

/* 1 when variable `name` is set to an integer v (*v receives it); a value that is no integer
 * counts as unset, as before (the variables were read with atoi) */
static int env_int(const char *name, int *v) {
    const char *e = getenv(name);
    if (!e || !*e) return 0;
    char *end;
    long x = strtol(e, &end, 10);
    if (end == e) return 0;
    *v = (int)(x < -1000000 ? -1000000 : x > 1000000 ? 1000000 : x);
    return 1;
}

void ks_cli_model_tuning(ks_model_tuning *t) {
    int v;
    if (env_int("KS_CUDA_NEW", &v)) t->decode_kernels = v ? KS_ON : KS_OFF;
    if (env_int("KS_CUDA_FUSED", &v)) t->fused = v ? KS_ON : KS_OFF;
    if (env_int("KS_CUDA_MLP", &v)) t->mlp = v ? KS_ON : KS_OFF;
    if (env_int("KS_CUDA_GRAPH", &v)) t->graphs = v ? KS_ON : KS_OFF;
    if (env_int("KS_CUDA_PDL", &v)) t->pdl = v ? KS_ON : KS_OFF;
    if (env_int("KS_CUDA_WGMMA", &v)) t->prefill_attn_mma = v == 0 ? KS_ON : KS_OFF;
    if (env_int("KS_CUDA_TC_SPLITS", &v)) t->decode_splits = v > 0 ? v : 0;
    const char *pe = getenv("KS_PROFILE");
    if (pe && *pe && strcmp(pe, "0")) t->profile = strcmp(pe, "sync") ? 1 : 2;
    const char *dbg = getenv("KS_DEBUG");
    t->verbose = dbg && *dbg;
}

ks_status ks_cli_model_open(const char *dir, const ks_model_opts *mo, ks_model **out) {
    ks_model_tuning t;
    ks_model_tuning_default(&t);
    ks_cli_model_tuning(&t);
    return ks_model_open_tuned(dir, mo, &t, out);
}

ks_status ks_cli_model_open_random(const char *config, const ks_model_opts *mo, uint64_t seed, ks_model **out) {
    ks_model_tuning t;
    ks_model_tuning_default(&t);
    ks_cli_model_tuning(&t);
    return ks_model_open_random(config, mo, &t, seed, out);
}

ks_status ks_cli_policy_load(ks_model *m, const char *name_or_path, ks_policy **out) {
    ks_status st = ks_policy_load_path(m, name_or_path, getenv("KVSIEVE_POLICY_PATH"), out);
    const char *dev = getenv("KVSIEVE_LUA_DEVICE");
    if (!st && dev && *dev && (st = ks_policy_set(*out, "_device", dev))) {
        ks_policy_free(*out);
        *out = NULL;
    }
    return st;
}

void ks_cli_lua_env(lua_State *L, int module) {
    const char *sp = getenv("KVSIEVE_POLICY_PATH");
    if (!sp || !*sp) return;
    module = lua_absindex(L, module);
    lua_pushstring(L, sp);
    lua_setfield(L, module, "policy_path");
}
