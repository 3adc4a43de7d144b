/* fuzz_config.c — libFuzzer harness for config.json (core/config.c).
 *
 * Drives ks_config_parse on the raw input as a config.json text; on success it checks the
 * invariants the rest of the engine relies on (positive dimensions, heads dividing, head_dim
 * even for RoPE, EOS count in range), computes the RoPE inverse frequencies for a few context
 * lengths with ks_rope_inv_freq (longrope's short/long factor tables included) and frees the
 * config. Seeds: tests/fuzz/corpus/config (every real config.json of tests/fixtures/hf and
 * models/kvsieve-tiny, in both transformers spellings). */
#include "config.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ks_config cfg;
    memset(&cfg, 0, sizeof cfg);
    if (ks_config_parse((const char *)data, size, "fuzz/config.json", &cfg) != KS_OK) return 0;
    /* what a successful parse promises (the model loader sizes tensors from these) */
    if (cfg.dim <= 0 || cfg.n_layers <= 0 || cfg.n_heads <= 0 || cfg.n_kv_heads <= 0 || cfg.head_dim <= 0 ||
        cfg.ffn <= 0 || cfg.vocab <= 0 || cfg.n_heads % cfg.n_kv_heads || cfg.n_eos < 0 || cfg.n_eos > KS_MAX_EOS)
        __builtin_trap();
    if (cfg.rope.head_dim > 0 && cfg.rope.head_dim <= (1 << 16)) {
        float *inv = malloc(sizeof(float) * (size_t)(cfg.rope.head_dim / 2 + 1));
        if (inv) {
            int lens[3] = {0, cfg.rope.orig_max_pos, cfg.max_pos > 0 ? cfg.max_pos : 1};
            for (int i = 0; i < 3; i++) ks_rope_inv_freq(&cfg.rope, lens[i] > 0 ? lens[i] : 1, inv);
            free(inv);
        }
    }
    ks_config_free(&cfg);
    return 0;
}
