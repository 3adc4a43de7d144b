/* sample.c — the sampler (engine.h: ks_sampler): greedy, or temperature with top_k / top_p /
 * min_p and a seeded PRNG; and the repetition penalty on logits. */
#include "engine.h"

#include <math.h>
#include <stdlib.h>

static uint64_t rng_next(uint64_t *s) { /* splitmix64 */
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void ks_sampler_init(ks_sampler *s, float temperature, float top_p, uint64_t seed) {
    s->temperature = temperature;
    s->top_p = top_p <= 0 || top_p > 1 ? 1 : top_p;
    s->seed = seed;
    s->state = seed;
    s->top_k = 0;
    s->min_p = 0;
}

typedef struct { float p; int32_t id; } prob_id;
static int cmp_prob(const void *a, const void *b) {
    const prob_id *x = a, *y = b;
    if (x->p != y->p) return x->p < y->p ? 1 : -1;
    return (x->id > y->id) - (x->id < y->id);
}

/* The lowest index of the largest logit; NaNs never win except at index 0, which then stays (the
 * scalar rule `if (l[i] > l[best]) best = i`). The maximum comes from 8 independent lanes, which
 * the compiler vectorises; the plain loop's compare against a reloaded l[best] ran at ~3.7 ns per
 * element (0.47 ms for a 128K vocabulary, paid between every two decode steps). */
static int32_t argmax_f32(const float *l, int n) {
    if (n < 1 || l[0] != l[0]) return 0;
    float m[8];
    for (int j = 0; j < 8; j++) m[j] = -INFINITY;
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) m[j] = l[i + j] > m[j] ? l[i + j] : m[j];
    float mx = m[0];
    for (int j = 1; j < 8; j++) mx = m[j] > mx ? m[j] : mx;
    for (; i < n; i++) mx = l[i] > mx ? l[i] : mx;
    for (i = 0; i < n; i++)
        if (l[i] == mx) return i;
    return 0; /* not reached: mx is l[0] or larger and is some element */
}

int32_t ks_sample(ks_sampler *s, const float *logits, int vocab) {
    int32_t best = argmax_f32(logits, vocab);
    if (s->temperature <= 0) return best;
    prob_id *pi = malloc(sizeof(prob_id) * vocab);
    if (!pi) return best;
    double sum = 0, mx = logits[best];
    for (int i = 0; i < vocab; i++) {
        pi[i].p = (float)exp((logits[i] - mx) / s->temperature);
        pi[i].id = i;
        sum += pi[i].p;
    }
    qsort(pi, vocab, sizeof *pi, cmp_prob);
    /* top_k: the k first; top_p then counts shares of their mass (top_k off: of the whole sum,
     * summed in id order as always, so the draws stay bit-identical) */
    int keep = vocab;
    if (s->top_k > 0 && s->top_k < vocab) {
        keep = s->top_k;
        sum = 0;
        for (int i = 0; i < keep; i++) sum += pi[i].p;
    }
    double cum = 0;
    for (int i = 0; i < keep; i++) {
        cum += pi[i].p / sum;
        if (cum >= s->top_p) { keep = i + 1; break; }
    }
    /* min_p: relative to the most likely token, pi[0]; the first always stays */
    if (s->min_p > 0) {
        double floor_p = (double)s->min_p * pi[0].p;
        int k = 1;
        while (k < keep && pi[k].p >= floor_p) k++;
        keep = k;
    }
    double mass = 0;
    for (int i = 0; i < keep; i++) mass += pi[i].p;
    double r = (double)(rng_next(&s->state) >> 11) * (1.0 / 9007199254740992.0) * mass;
    int32_t out = pi[keep - 1].id;
    for (int i = 0; i < keep; i++) {
        r -= pi[i].p;
        if (r < 0) { out = pi[i].id; break; }
    }
    free(pi);
    return out;
}

void ks_repeat_penalty(float *logits, const unsigned char *seen, int vocab, float penalty) {
    for (int i = 0; i < vocab; i++)
        if (seen[i]) logits[i] = logits[i] > 0 ? logits[i] / penalty : logits[i] * penalty;
}
