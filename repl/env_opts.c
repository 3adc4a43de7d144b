/* env_opts.c — see env_opts.h: the one place where the environment becomes options. */
#include "env_opts.h"
#include "model.h"
#include "policy_lua.h"

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

void ks_cli_backend_opts(ks_backend_opts *o) {
    *o = ks_backend_opts_default();
    int v;
    if (env_int("KS_CUDA_NEW", &v)) o->decode_kernels = v != 0;
    if (env_int("KS_CUDA_FUSED", &v)) o->fused = v != 0;
    if (env_int("KS_CUDA_MLP", &v)) o->mlp = v != 0;
    if (env_int("KS_CUDA_GRAPH", &v)) o->graphs = v != 0;
    if (env_int("KS_CUDA_PDL", &v)) o->pdl = v != 0;
    if (env_int("KS_CUDA_WGMMA", &v)) o->prefill_attn = v == 0 ? KS_PREFILL_ATTN_MMA : KS_PREFILL_ATTN_AUTO;
    if (env_int("KS_CUDA_TC_SPLITS", &v)) o->decode_splits = v > 0 ? v : 0;
    const char *pe = getenv("KS_PROFILE");
    if (pe && *pe && strcmp(pe, "0")) o->profile = strcmp(pe, "sync") ? 1 : 2;
    const char *dbg = getenv("KS_DEBUG");
    o->verbose = dbg && *dbg;
}

ks_status ks_cli_backend_create(const char *name, ks_backend **out) {
    ks_backend_opts o;
    ks_cli_backend_opts(&o);
    return ks_backend_create_opts(name, &o, out);
}

ks_status ks_cli_model_open(const char *dir, const ks_model_opts *mo, ks_model **out) {
    *out = NULL;
    ks_model_opts def;
    if (!mo) { ks_model_opts_default(&def); mo = &def; }
    if (!dir) return ks_errorf(KS_ERR_ARG, "no model folder given");
    if (mo->threads < 0 || mo->device < 0)
        return ks_errorf(KS_ERR_ARG, "threads and device must be >= 0, got %d and %d", mo->threads, mo->device);
    ks_backend_opts o;
    ks_cli_backend_opts(&o);
    o.n_threads = mo->threads;
    o.device = mo->device;
    ks_backend *be = NULL;
    ks_status st = ks_backend_create_opts(mo->backend, &o, &be);
    if (st) return st;
    if ((st = ks_model_load(dir, be, 0, out))) ks_backend_free(be);
    return st;
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
