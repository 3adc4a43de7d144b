/* env_opts.h — the CLI's environment variables as options (repl/env_opts.c). Nothing below
 * repl/ reads the environment; the commands open backends, models and policies through these. */
#ifndef KS_ENV_OPTS_H
#define KS_ENV_OPTS_H

#include "backend.h"
#include "kvsieve.h"

/* The defaults with the environment's choices on top:
 *   KS_CUDA_NEW=0      decode_kernels 0 (cuBLAS one-row matmuls, float32 split-KV decode attention)
 *   KS_CUDA_FUSED=0    fused 0            KS_CUDA_MLP=0    mlp 0
 *   KS_CUDA_GRAPH=0    graphs 0           KS_CUDA_PDL=1    pdl 1
 *   KS_CUDA_WGMMA=0    prefill_attn KS_PREFILL_ATTN_MMA (other values: the planner)
 *   KS_CUDA_TC_SPLITS=N  decode_splits N
 *   KS_PROFILE=1 / sync  profile 1 / 2    KS_DEBUG (set)   verbose 1 */
void ks_cli_backend_opts(ks_backend_opts *o);

/* ks_backend_create_opts / ks_model_open_ex with the environment's backend options (mo NULL:
 * the defaults; its backend, threads and device are kept). */
ks_status ks_cli_backend_create(const char *name, ks_backend **out);
ks_status ks_cli_model_open(const char *dir, const ks_model_opts *mo, ks_model **out);

/* ks_policy_load_path with $KVSIEVE_POLICY_PATH, then _device set to $KVSIEVE_LUA_DEVICE
 * (auto, host, emulate) when that is set. */
ks_status ks_cli_policy_load(ks_model *m, const char *name_or_path, ks_policy **out);

/* The Lua module's policy_path from $KVSIEVE_POLICY_PATH when that is set (module: the stack
 * index of the kvsieve module table). */
struct lua_State;
void ks_cli_lua_env(struct lua_State *L, int module);

#endif
