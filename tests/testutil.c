/* testutil.c — see testutil.h. */
#include "testutil.h"
#include "common.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

int kt_tmpdir(char *out, size_t n) {
    snprintf(out, n, "/tmp/kstest-XXXXXX");
    return mkdtemp(out) ? 0 : -1;
}

int kt_rmdir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    struct dirent *e;
    char p[1024];
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        unlink(p);
    }
    closedir(d);
    return rmdir(dir);
}

int kt_write_file(const char *dir, const char *name, const char *text) {
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    if (!f) return -1;
    fputs(text, f);
    return fclose(f);
}

int kt_truncate(const char *dir, const char *name, long size) {
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return truncate(p, size);
}

int kt_poke_u64(const char *dir, const char *name, long offset, uint64_t value) {
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "r+b");
    if (!f) return -1;
    fseek(f, offset, SEEK_SET);
    unsigned char b[8];
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(value >> (8 * i));
    fwrite(b, 1, 8, f);
    return fclose(f);
}

static size_t esize(const char *dt) { return !strcmp(dt, "F32") || !strcmp(dt, "I32") ? 4 : 2; }

int kt_write_safetensors(const char *path, const kt_tensor *t, int n) {
    size_t hcap = 256 + (size_t)n * 256, off = 0;
    char *h = malloc(hcap);
    if (!h) return -1;
    size_t hl = 0;
    hl += snprintf(h + hl, hcap - hl, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = 0; i < n; i++) {
        size_t cnt = 1;
        for (int d = 0; d < t[i].ndim; d++) cnt *= (size_t)t[i].shape[d];
        size_t bytes = cnt * esize(t[i].dtype);
        hl += snprintf(h + hl, hcap - hl, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", t[i].name, t[i].dtype);
        for (int d = 0; d < t[i].ndim; d++) hl += snprintf(h + hl, hcap - hl, "%s%lld", d ? "," : "", (long long)t[i].shape[d]);
        hl += snprintf(h + hl, hcap - hl, "],\"data_offsets\":[%zu,%zu]}", off, off + bytes);
        off += bytes;
    }
    hl += snprintf(h + hl, hcap - hl, "}");
    while (hl % 8) h[hl++] = ' ';
    FILE *f = fopen(path, "wb");
    if (!f) { free(h); return -1; }
    unsigned char lb[8];
    for (int i = 0; i < 8; i++) lb[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    fwrite(lb, 1, 8, f);
    fwrite(h, 1, hl, f);
    free(h);
    for (int i = 0; i < n; i++) {
        size_t cnt = 1;
        for (int d = 0; d < t[i].ndim; d++) cnt *= (size_t)t[i].shape[d];
        for (size_t j = 0; j < cnt; j++) {
            float v = t[i].data[j];
            if (!strcmp(t[i].dtype, "F32")) fwrite(&v, 4, 1, f);
            else if (!strcmp(t[i].dtype, "I32")) { int32_t x = (int32_t)v; fwrite(&x, 4, 1, f); }
            else { uint16_t b = ks_f32_to_bf16(v); fwrite(&b, 2, 1, f); } /* BF16 (F16 unsupported here) */
        }
    }
    return fclose(f);
}

kt_tiny_cfg kt_tiny_default(void) {
    kt_tiny_cfg c = {.model_type = "llama", .dim = 32, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2, .ffn = 48,
                     .vocab = 64, .max_pos = 256, .tied = 0, .seed = 7};
    return c;
}

static float *rnd(size_t n, unsigned *seed, float scale, float offset) {
    float *v = malloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) {
        *seed = *seed * 1103515245u + 12345u;
        float u = ((*seed >> 8) & 0xffff) / 65536.0f - 0.5f;
        v[i] = offset + scale * (u == 0 ? 0.01f : u);
    }
    return v;
}

int kt_write_tiny_model(const char *dir, const kt_tiny_cfg *c) {
    char cfg[1024];
    snprintf(cfg, sizeof cfg,
             "{\"model_type\": \"%s\", \"hidden_size\": %d, \"num_hidden_layers\": %d, \"num_attention_heads\": %d,"
             " \"num_key_value_heads\": %d, \"intermediate_size\": %d, \"vocab_size\": %d,"
             " \"max_position_embeddings\": %d, \"rms_norm_eps\": 1e-5, \"rope_theta\": 10000.0,"
             " \"tie_word_embeddings\": %s, \"hidden_act\": \"silu\", \"bos_token_id\": 1, \"eos_token_id\": 2}",
             c->model_type, c->dim, c->n_layers, c->n_heads, c->n_kv_heads, c->ffn, c->vocab, c->max_pos,
             c->tied ? "true" : "false");
    if (kt_write_file(dir, "config.json", cfg)) return -1;
    int hd = c->dim / c->n_heads, QD = c->n_heads * hd, KD = c->n_kv_heads * hd;
    kt_tensor t[64];
    char names[64][96];
    float *bufs[64];
    int n = 0;
    unsigned seed = c->seed;
#define ADD(nm, d0, d1, sc, off)                                                                  \
    do {                                                                                          \
        snprintf(names[n], sizeof names[n], "%s", nm);                                            \
        bufs[n] = rnd((size_t)(d0) * ((d1) ? (d1) : 1), &seed, sc, off);                          \
        t[n] = (kt_tensor){names[n], "F32", (d1) ? 2 : 1, {(d0), (d1)}, bufs[n]};                 \
        n++;                                                                                      \
    } while (0)
    ADD("model.embed_tokens.weight", c->vocab, c->dim, 2.0f, 0);
    ADD("model.norm.weight", c->dim, 0, 0.4f, 1.0f);
    if (!c->tied) ADD("lm_head.weight", c->vocab, c->dim, 0.5f, 0);
    for (int l = 0; l < c->n_layers; l++) {
        char p[96];
#define L(s) (snprintf(p, sizeof p, "model.layers.%d.%s", l, s), p)
        ADD(L("input_layernorm.weight"), c->dim, 0, 0.4f, 1.0f);
        ADD(L("post_attention_layernorm.weight"), c->dim, 0, 0.4f, 1.0f);
        ADD(L("self_attn.q_proj.weight"), QD, c->dim, 1.0f, 0);
        ADD(L("self_attn.k_proj.weight"), KD, c->dim, 1.0f, 0);
        ADD(L("self_attn.v_proj.weight"), KD, c->dim, 0.5f, 0);
        ADD(L("self_attn.o_proj.weight"), c->dim, QD, 0.5f, 0);
        ADD(L("mlp.gate_proj.weight"), c->ffn, c->dim, 0.5f, 0);
        ADD(L("mlp.up_proj.weight"), c->ffn, c->dim, 0.5f, 0);
        ADD(L("mlp.down_proj.weight"), c->dim, c->ffn, 0.5f, 0);
#undef L
    }
#undef ADD
    if (c->bad_shape) t[3].shape[0] += 1; /* a q_proj or layernorm with a wrong first dim */
    if (c->bad_shape) { free(bufs[3]); bufs[3] = rnd((size_t)t[3].shape[0] * (t[3].ndim == 2 ? t[3].shape[1] : 1), &seed, 1, 0); t[3].data = bufs[3]; }
    if (c->bad_dtype) t[n - 1].dtype = "I32";
    int nw = c->drop_tensor ? n - 1 : n;
    char path[1024];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    int rc = kt_write_safetensors(path, t, nw);
    for (int i = 0; i < n; i++) free(bufs[i]);
    return rc;
}

int kt_sh(const char *cmd, char *out, size_t cap) {
    size_t n = strlen(cmd) + 8;
    char *full = malloc(n);
    if (!full) return -1;
    snprintf(full, n, "%s 2>&1", cmd);
    FILE *p = popen(full, "r");
    free(full);
    if (!p) return -1;
    size_t k = fread(out, 1, cap - 1, p);
    out[k] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : WIFSIGNALED(st) ? 128 + WTERMSIG(st) : -1;
}

const char *kt_bin(void) {
    const char *b = getenv("KS_BIN");
    return b && *b ? b : NULL;
}

char *kt_slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    long sz = -1;
    if (fseek(f, 0, SEEK_END) == 0) sz = ftell(f);
    if (sz < 0 || fseek(f, 0, SEEK_SET) != 0) { fclose(f); return NULL; }
    char *b = malloc((size_t)sz + 1);
    if (b && fread(b, 1, (size_t)sz, f) != (size_t)sz) { free(b); b = NULL; }
    if (b) b[sz] = 0;
    fclose(f);
    if (b && n) *n = (size_t)sz;
    return b;
}
