/* config.h — a model's architecture read from a Hugging Face config.json.
 *
 * Supported: model_type llama (Llama 2/3/3.1/3.2, Yi; rope "llama3" and "linear"), mistral
 * (explicit head_dim; sliding_window honoured in attention), qwen2 (q/k/v biases), phi3
 * (fused qkv_proj / gate_up_proj; rope "longrope" with short/long factors). Both the
 * transformers 4.x spelling (rope_theta + rope_scaling) and the 5.x one (rope_parameters)
 * are read. Anything else is refused with KS_ERR_UNSUPPORTED naming the field. */
#ifndef KS_CONFIG_H
#define KS_CONFIG_H

#include "common.h"

typedef enum ks_arch { KS_ARCH_LLAMA, KS_ARCH_MISTRAL, KS_ARCH_QWEN2, KS_ARCH_PHI3 } ks_arch;
typedef enum ks_rope_type { KS_ROPE_DEFAULT, KS_ROPE_LINEAR, KS_ROPE_LLAMA3, KS_ROPE_LONGROPE } ks_rope_type;

#define KS_MAX_EOS 8

/* Rotary embedding parameters. inv_freq tables are derived from these by ks_rope_inv_freq. */
typedef struct ks_rope {
    ks_rope_type type;
    int head_dim;            /* rotated dims (= head_dim; partial rotary is refused) */
    double theta;            /* base */
    double factor;           /* linear / llama3 / longrope scaling factor */
    double low_freq_factor;  /* llama3 */
    double high_freq_factor; /* llama3 */
    int orig_max_pos;        /* llama3 / longrope: original_max_position_embeddings */
    double attn_factor;      /* longrope: cos/sin multiplier ("mscale"); 1 otherwise */
    float *short_factor;     /* longrope: (head_dim/2) */
    float *long_factor;      /* longrope: (head_dim/2) */
} ks_rope;

typedef struct ks_config {
    ks_arch arch;
    char model_type[32];
    int dim;            /* hidden_size */
    int n_layers;
    int n_heads;        /* query heads */
    int n_kv_heads;
    int head_dim;
    int ffn;            /* intermediate_size */
    int vocab;
    int max_pos;        /* max_position_embeddings */
    int sliding_window; /* 0 = none */
    float eps;          /* rms_norm_eps */
    int tied;           /* tie_word_embeddings */
    int qkv_bias;       /* q/k/v projections have biases (qwen2, or attention_bias) */
    int o_bias;         /* o_proj has a bias (llama attention_bias) */
    int mlp_bias;
    int bos;            /* -1 if none */
    int eos[KS_MAX_EOS];
    int n_eos;
    ks_rope rope;
} ks_config;

/* Parse dir/config.json. On success the caller owns cfg (free with ks_config_free). */
ks_status ks_config_load(const char *dir, ks_config *cfg);
/* Parse from a JSON text (used by tests); `what` names the source in messages. */
ks_status ks_config_parse(const char *json, size_t len, const char *what, ks_config *cfg);
void ks_config_free(ks_config *cfg);
const char *ks_arch_name(ks_arch a);

/* Inverse frequencies (head_dim/2) for a forward pass whose largest position is max_pos:
 * longrope picks long_factor when max_pos + 1 > orig_max_pos (as HF does), else short. */
void ks_rope_inv_freq(const ks_rope *r, int max_pos, float *inv_freq);

#endif
