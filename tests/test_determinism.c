/* test_determinism.c — the CPU backend gives the same bits for the same input rows, whatever
 * their position, the thread count or the CPU (issue 12: an exact score tie between two
 * occurrences of one token broke differently on a Haswell-kernel OpenBLAS, and CI went red).
 *
 * The CPU backend links no BLAS: its products follow the one element rule of core/cpu_gemm.h, so
 * OPENBLAS_CORETYPE or a library's kernel choice cannot reach them. What these tests prove:
 *   - every element of ks_gemm_nt is the element rule, computed here by plain scalar code, for
 *     awkward sizes and pools of 1, 2 and 3 threads (so AVX2 or SSE, tile, block and thread
 *     change no bit);
 *   - a row copied to several positions of x gives the same output bits at every position, and a
 *     one-row product (decode) equals the same row inside a prefill-sized product;
 *   - end to end on the bundled model, two occurrences of a token have bit-identical layer-0
 *     pre-RoPE keys and values, and the logits are bit-identical under 1, 2 and 3 threads. */
#include "backend.h"
#include "cpu_gemm.h"
#include "engine.h"
#include "ktest.h"
#include "model.h"

#include <stdlib.h>
#include <string.h>

static uint64_t g_rng = 0x243f6a8885a308d3ull;
static float frand(void) {
    g_rng ^= g_rng << 13; g_rng ^= g_rng >> 7; g_rng ^= g_rng << 17;
    return (float)((g_rng >> 40) & 0xffffff) / 16777216.0f - 0.5f;
}

/* The element rule of cpu_gemm.h, written out in scalar code. */
static float rule(const float *a, const float *b, int64_t k) {
    float s[8] = {0};
    int64_t k8 = k & ~(int64_t)7;
    for (int64_t p = 0; p < k8; p += 8)
        for (int l = 0; l < 8; l++) {
            float prod = a[p + l] * b[p + l];
            s[l] = s[l] + prod;
        }
    float r = ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
    for (int64_t p = k8; p < k; p++) {
        float prod = a[p] * b[p];
        r = r + prod;
    }
    return r;
}

KT_TEST(determinism_gemm_is_the_element_rule_on_any_thread_count) {
    static const int shapes[][3] = {{1, 291, 77}, {3, 8, 5}, {300, 291, 77}, {67, 1024, 130}, {2, 7, 4}, {130, 64, 1500}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        int n = shapes[si][0], in = shapes[si][1], out = shapes[si][2];
        float *x = malloc(sizeof(float) * n * in), *W = malloc(sizeof(float) * out * in);
        float *y = malloc(sizeof(float) * n * out), *ref = malloc(sizeof(float) * n * out);
        KT_CHECK(x && W && y && ref, "out of memory");
        for (int i = 0; i < n * in; i++) x[i] = frand();
        for (int i = 0; i < out * in; i++) W[i] = frand() * 0.1f;
        for (int i = 0; i < n; i++)
            for (int j = 0; j < out; j++) ref[(size_t)i * out + j] = rule(x + (size_t)i * in, W + (size_t)j * in, in);
        for (int th = 1; th <= 3; th++) {
            ks_pool *p = NULL;
            KT_CHECK(ks_pool_create(th, &p) == KS_OK, "pool of %d: %s", th, ks_last_error());
            memset(y, 0xff, sizeof(float) * n * out);
            ks_gemm_nt(p, y, x, W, n, in, out);
            ks_pool_free(p);
            int bad = -1;
            for (int i = 0; i < n * out && bad < 0; i++)
                if (memcmp(&y[i], &ref[i], sizeof(float))) bad = i;
            KT_CHECK(bad < 0, "(%d, %d, %d) on %d threads: element %d is %.9g, the rule gives %.9g", n, in, out, th, bad,
                     y[bad], ref[bad]);
        }
        for (int j = 0; j < out; j++) {
            float d = ks_dot(x, W + (size_t)j * in, in);
            KT_CHECK(!memcmp(&d, &ref[j], sizeof d), "ks_dot differs from the rule at column %d", j);
        }
        free(x); free(W); free(y); free(ref);
    }
}

KT_TEST(determinism_gemm_same_row_same_bits_at_any_position) {
    int n = 300, in = 288, out = 96;
    float *x = malloc(sizeof(float) * n * in), *W = malloc(sizeof(float) * out * in), *y = malloc(sizeof(float) * n * out);
    float y1[96];
    KT_CHECK(x && W && y, "out of memory");
    for (int i = 0; i < n * in; i++) x[i] = frand();
    for (int i = 0; i < out * in; i++) W[i] = frand() * 0.1f;
    static const int copies[] = {0, 9, 169, 170, 255, 299}; /* even and odd rows, block edges */
    for (size_t c = 1; c < sizeof copies / sizeof copies[0]; c++) memcpy(x + (size_t)copies[c] * in, x, sizeof(float) * in);
    ks_pool *p = NULL;
    KT_CHECK(ks_pool_create(2, &p) == KS_OK, "%s", ks_last_error());
    ks_gemm_nt(p, y, x, W, n, in, out);
    ks_gemm_nt(p, y1, x, W, 1, in, out); /* the decode shape */
    ks_pool_free(p);
    for (size_t c = 0; c < sizeof copies / sizeof copies[0]; c++)
        KT_CHECK(!memcmp(y + (size_t)copies[c] * out, y1, sizeof y1), "row %d differs from the same row computed alone",
                 copies[c]);
    free(x); free(W); free(y);
}

/* ---------------------------------------------------------------- end to end */

typedef struct capture {
    int n, kvd;
    float *k_pre, *v;   /* (n, n_kv_heads * head_dim) layer 0 */
} capture;

static ks_status cap_qkv(void *ud, ks_event *ev) {
    capture *c = ud;
    if (ev->layer != 0) return KS_OK;
    c->n = ev->n;
    c->kvd = ev->n_kv_heads * ev->head_dim;
    size_t bytes = sizeof(float) * (size_t)ev->n * c->kvd;
    c->k_pre = malloc(bytes);
    c->v = malloc(bytes);
    if (!c->k_pre || !c->v) return ks_errorf(KS_ERR_OOM, "capture: out of memory");
    ks_status st = ev->be->download((ks_backend *)ev->be, c->k_pre, ev->k_pre, bytes);
    return st ? st : ev->be->download((ks_backend *)ev->be, c->v, ev->v, bytes);
}

KT_TEST(determinism_model_repeated_tokens_and_thread_counts) {
    const char *dir = "models/kvsieve-tiny";
    enum { N = 320, PERIOD = 160 };
    int32_t ids[N];
    for (int i = 0; i < N; i++) ids[i] = 5 + (int32_t)((i % PERIOD) * 37 % 4000); /* token at i == token at i + 160 */
    float *logits[3] = {0};
    int vocab = 0;
    for (int th = 1; th <= 3; th++) {
        ks_backend *be = NULL;
        ks_model *m = NULL;
        ks_session *s = NULL;
        ks_backend_opts bo = ks_backend_opts_default();
        bo.n_threads = th;
        KT_CHECK(ks_cpu_backend_create(&bo, &be) == KS_OK, "%s", ks_last_error());
        KT_CHECK(ks_model_load(dir, be, 0, &m) == KS_OK, "%s: %s", dir, ks_last_error());
        KT_CHECK(ks_session_create(m, &s) == KS_OK, "%s", ks_last_error());
        capture cap = {0};
        ks_policy pol = {0};
        pol.name = "capture";
        pol.ud = &cap;
        pol.on[KS_EV_PREFILL_QKV] = cap_qkv;
        pol.want_pre_rope_keys = 1;
        s->policy = &pol;
        ks_status st = ks_session_prefill(s, ids, N);
        KT_CHECK(st == KS_OK, "prefill on %d threads: %s", th, ks_last_error());
        KT_CHECK(cap.n == N && cap.k_pre && cap.v, "layer 0 was not captured (%d rows)", cap.n);
        int pairs = 0;
        for (int i = 0; i + PERIOD < N; i++) {
            int j = i + PERIOD;
            KT_CHECK(ids[i] == ids[j], "prompt construction");
            KT_CHECK(!memcmp(cap.k_pre + (size_t)i * cap.kvd, cap.k_pre + (size_t)j * cap.kvd, sizeof(float) * cap.kvd),
                     "%d threads: layer-0 pre-RoPE keys of rows %d and %d (token %d) differ", th, i, j, ids[i]);
            KT_CHECK(!memcmp(cap.v + (size_t)i * cap.kvd, cap.v + (size_t)j * cap.kvd, sizeof(float) * cap.kvd),
                     "%d threads: layer-0 values of rows %d and %d (token %d) differ", th, i, j, ids[i]);
            pairs++;
        }
        KT_CHECK(pairs == N - PERIOD, "pairs");
        vocab = m->cfg.vocab;
        logits[th - 1] = malloc(sizeof(float) * vocab);
        KT_CHECK(logits[th - 1], "out of memory");
        memcpy(logits[th - 1], s->logits, sizeof(float) * vocab);
        free(cap.k_pre);
        free(cap.v);
        s->policy = NULL;
        ks_session_free(s);
        ks_model_close(m);
    }
    for (int th = 2; th <= 3; th++)
        KT_CHECK(!memcmp(logits[0], logits[th - 1], sizeof(float) * vocab), "logits on %d threads differ from 1 thread",
                 th);
    for (int th = 0; th < 3; th++) free(logits[th]);
}
