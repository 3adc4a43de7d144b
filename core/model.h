/* model.h — a loaded model: config, tokenizer, and weights resident on a backend.
 *
 * ks_model_load reads DIR/config.json, DIR/tokenizer.json and the safetensors weights
 * (single file or sharded), checks every tensor's presence, shape and dtype against the
 * config, and creates backend weights. Nothing is computed here. */
#ifndef KS_MODEL_H
#define KS_MODEL_H

#include "backend.h"
#include "config.h"
#include "tokenizer.h"

typedef struct ks_layer_w {
    ks_weight *attn_norm;          /* (dim) */
    ks_weight *wq, *wk, *wv, *wo;  /* (H*hd, dim), (Hkv*hd, dim), (Hkv*hd, dim), (dim, H*hd) */
    ks_weight *bq, *bk, *bv, *bo;  /* biases or NULL */
    ks_weight *ffn_norm;           /* (dim) */
    ks_weight *w_gate, *w_up;      /* (ffn, dim) */
    ks_weight *w_down;             /* (dim, ffn) */
} ks_layer_w;

typedef struct ks_model {
    char *dir;
    ks_config cfg;
    ks_tokenizer *tok;        /* NULL when the folder has no tokenizer.json (ids-only use) */
    ks_backend *be;           /* not owned */
    ks_safetensors *st;       /* kept open: CPU weights may point into the mapping */
    ks_weight *embed;         /* (vocab, dim) */
    ks_weight *final_norm;    /* (dim) */
    ks_weight *lm_head;       /* (vocab, dim); == embed when tied */
    ks_layer_w *layers;       /* (n_layers) */
    size_t n_params;
} ks_model;

/* Load a model folder onto backend `be`. require_tokenizer: fail if tokenizer.json is absent. */
ks_status ks_model_load(const char *dir, ks_backend *be, int require_tokenizer, ks_model **out);
void ks_model_free(ks_model *m);
/* A model with seeded random weights (never zero; norms near 1) from a config.json path or a
 * folder holding one: for speed benchmarks at any shape without a checkpoint. No tokenizer. */
ks_status ks_model_random(const char *config, ks_backend *be, uint64_t seed, ks_model **out);

#endif
