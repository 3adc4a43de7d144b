/* env_opts.h — the CLI's environment variables as options (repl/env_opts.c). Nothing below
 * repl/ reads the environment; the commands open models and policies through these, which map
 * the variables onto the public option structs of kvsieve.h (ks_model_tuning). */
#ifndef KS_ENV_OPTS_H
#define KS_ENV_OPTS_H

#include "kvsieve.h"

/* The environment's choices on top of t (ks_model_tuning):
 *   KS_CUDA_NEW=0      decode_kernels off (cuBLAS one-row matmuls, float32 split-KV attention)
 *   KS_CUDA_FUSED=0    fused off          KS_CUDA_MLP=0    mlp off
 *   KS_CUDA_GRAPH=0    graphs off         KS_CUDA_PDL=1    pdl on
 *   KS_CUDA_WGMMA=0    prefill_attn_mma on (other values: the planner)
 *   KS_CUDA_TC_SPLITS=N  decode_splits N (N <= 0: automatic)
 *   KS_PROFILE=1 / sync  profile 1 / 2    KS_DEBUG (set)   verbose 1
 * A value that is no integer counts as unset. */
void ks_cli_model_tuning(ks_model_tuning *t);

/* ks_model_open_tuned / ks_model_open_random with the environment's tuning (mo NULL: the
 * default ks_model_opts). */
ks_status ks_cli_model_open(const char *dir, const ks_model_opts *mo, ks_model **out);
ks_status ks_cli_model_open_random(const char *config, const ks_model_opts *mo, uint64_t seed, ks_model **out);

/* ks_policy_load_path with $KVSIEVE_POLICY_PATH, then _device set to $KVSIEVE_LUA_DEVICE
 * (auto, host, emulate) when that is set. */
ks_status ks_cli_policy_load(ks_model *m, const char *name_or_path, ks_policy **out);

/* The Lua module's policy_path from $KVSIEVE_POLICY_PATH when that is set (module: the stack
 * index of the kvsieve module table). */
struct lua_State;
void ks_cli_lua_env(struct lua_State *L, int module);

#endif
