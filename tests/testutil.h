/* testutil.h — helpers for tests: temp folders, files, a safetensors writer and a tiny
 * random-weight Llama model writer (with knobs to corrupt it). */
#ifndef KS_TESTUTIL_H
#define KS_TESTUTIL_H
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "config.h"

int kt_tmpdir(char *out, size_t n);                       /* mkdtemp under /tmp */
int kt_rmdir(const char *dir);                            /* rm -r (files one level deep) */
int kt_write_file(const char *dir, const char *name, const char *text);
/* Run a shell command with stderr joined to stdout; its output (up to cap - 1 bytes) goes to out.
 * Returns the exit status, 128 + the signal if it was killed, -1 if it could not start. */
int kt_sh(const char *cmd, char *out, size_t cap);
const char *kt_bin(void);                                 /* $KS_BIN (the CLI under test), or NULL */
char *kt_slurp(const char *path, size_t *n);              /* a whole file, NUL-terminated (malloc), or NULL */
int kt_truncate(const char *dir, const char *name, long size);
int kt_poke_u64(const char *dir, const char *name, long offset, uint64_t value);

/* One tensor to write. dtype "F32", "BF16", "F16" or "I32"; data is float32 (converted). */
typedef struct kt_tensor { const char *name, *dtype; int ndim; int64_t shape[4]; const float *data; } kt_tensor;
int kt_write_safetensors(const char *path, const kt_tensor *t, int n);

typedef struct kt_tiny_cfg {
    const char *model_type;   /* "llama" */
    int dim, n_layers, n_heads, n_kv_heads, ffn, vocab, max_pos;
    int tied;
    unsigned seed;
    int bad_shape, bad_dtype, drop_tensor; /* corruptions */
} kt_tiny_cfg;
kt_tiny_cfg kt_tiny_default(void);
/* Write config.json + model.safetensors (random weights, never zero) into dir. */
int kt_write_tiny_model(const char *dir, const kt_tiny_cfg *c);

/* The Llama-3.1-8B RoPE (llama3 scaling: theta 500000, factor 8, low / high frequency factors 1
 * and 4, original context 8192) over head_dim dimensions: the tests' model-shaped rotation. */
static inline ks_rope kt_rope_llama3(int head_dim) {
    ks_rope r;
    memset(&r, 0, sizeof r);
    r.type = KS_ROPE_LLAMA3;
    r.head_dim = head_dim;
    r.theta = 500000.0;
    r.factor = 8.0;
    r.low_freq_factor = 1.0;
    r.high_freq_factor = 4.0;
    r.orig_max_pos = 8192;
    r.attn_factor = 1.0;
    return r;
}

#endif
