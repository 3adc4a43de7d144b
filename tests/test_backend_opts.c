/* test_backend_opts.c — backends take options, and two backends of one process keep their own
 * (issue 13). Two CPU backends live at once with 1 and 2 threads: each reports its own thread
 * count, and the bundled model gives bit-identical logits on both (core/cpu_gemm.h makes the
 * products thread-independent), run in turns A, B, A so that neither could be steering the
 * other. The options of ks_model_open_ex reach the backend, and a profile option is one
 * backend's alone. */
#include "backend.h"
#include "engine.h"
#include "ktest.h"
#include "model.h"

#include <stdlib.h>
#include <string.h>

#define MODEL "models/kvsieve-tiny"

/* prefill of n ids then `steps` greedy-free decode steps fed fixed ids; the last logits into out */
static ks_status run(ks_model *m, const int32_t *ids, int n, int steps, float *out, int *profiled) {
    ks_session *s = NULL;
    ks_status st = ks_session_create(m, &s);
    if (st) return st;
    *profiled = s->prof.on;
    st = ks_session_prefill(s, ids, n);
    for (int t = 0; !st && t < steps; t++) st = ks_session_decode(s, ids[(5 * t + 1) % n]);
    if (!st) memcpy(out, s->logits, sizeof(float) * m->cfg.vocab);
    ks_session_free(s);
    return st;
}

KT_TEST(backend_opts_defaults) {
    ks_backend_opts o = ks_backend_opts_default();
    KT_CHECK(o.n_threads == 0 && o.device == 0 && o.prefill_attn == KS_PREFILL_ATTN_AUTO, "threads, device, prefill");
    KT_CHECK(o.decode_kernels == 1 && o.fused == 1 && o.mlp == 1 && o.graphs == 1, "kernels on by default");
    KT_CHECK(o.pdl == 0 && o.decode_splits == 0 && o.profile == 0 && o.verbose == 0, "off by default");
    ks_backend *be = NULL;
    KT_CHECK(ks_cpu_backend_create(NULL, &be) == KS_OK, "%s", ks_last_error());
    KT_CHECK(be->opts.n_threads >= 1, "NULL options: the pool's real thread count, got %d", be->opts.n_threads);
    KT_CHECK(be->opts.graphs == 1 && be->opts.profile == 0, "NULL options are the defaults");
    ks_backend_free(be);
}

KT_TEST(backend_opts_two_cpu_backends_keep_their_own) {
    ks_backend_opts oa = ks_backend_opts_default(), ob = ks_backend_opts_default();
    oa.n_threads = 1;
    ob.n_threads = 2;
    ob.profile = 2; /* host-clock profile: B's sessions only */
    ks_backend *ba = NULL, *bb = NULL;
    KT_CHECK(ks_cpu_backend_create(&oa, &ba) == KS_OK, "%s", ks_last_error());
    KT_CHECK(ks_cpu_backend_create(&ob, &bb) == KS_OK, "%s", ks_last_error());
    KT_CHECK(ba->opts.n_threads == 1 && bb->opts.n_threads == 2, "thread counts %d and %d, want 1 and 2",
             ba->opts.n_threads, bb->opts.n_threads);
    ks_model *ma = NULL, *mb = NULL;
    KT_CHECK(ks_model_load(MODEL, ba, 0, &ma) == KS_OK, "%s", ks_last_error());
    KT_CHECK(ks_model_load(MODEL, bb, 0, &mb) == KS_OK, "%s", ks_last_error());
    enum { N = 96, STEPS = 3 };
    int32_t ids[N];
    for (int i = 0; i < N; i++) ids[i] = 7 + (int32_t)(i * 53 % 3900);
    int V = ma->cfg.vocab, pa = -1, pb = -1, pa2 = -1;
    float *la = malloc(sizeof(float) * V), *lb = malloc(sizeof(float) * V), *la2 = malloc(sizeof(float) * V);
    KT_CHECK(la && lb && la2, "out of memory");
    KT_CHECK(run(ma, ids, N, STEPS, la, &pa) == KS_OK, "A: %s", ks_last_error());
    KT_CHECK(run(mb, ids, N, STEPS, lb, &pb) == KS_OK, "B: %s", ks_last_error());
    KT_CHECK(run(ma, ids, N, STEPS, la2, &pa2) == KS_OK, "A again: %s", ks_last_error());
    KT_CHECK(!memcmp(la, lb, sizeof(float) * V), "logits on 1 and 2 threads differ");
    KT_CHECK(!memcmp(la, la2, sizeof(float) * V), "A's logits changed after B ran");
    KT_CHECK(pa == 0 && pa2 == 0 && pb != 0, "profiling: A %d and %d (want 0), B %d (want on)", pa, pa2, pb);
    KT_CHECK(ba->opts.n_threads == 1 && bb->opts.n_threads == 2, "thread counts changed to %d and %d",
             ba->opts.n_threads, bb->opts.n_threads);
    free(la);
    free(lb);
    free(la2);
    ks_model_close(ma);
    ks_model_close(mb);
}

KT_TEST(backend_opts_model_open_ex_threads_reach_the_backend) {
    ks_model_opts mo;
    ks_model_opts_default(&mo);
    mo.threads = 2;
    ks_model *m = NULL;
    KT_CHECK(ks_model_open_ex(MODEL, &mo, &m) == KS_OK, "%s", ks_last_error());
    KT_CHECK(m->be->opts.n_threads == 2, "ks_model_opts.threads 2 gave a backend of %d threads", m->be->opts.n_threads);
    ks_model_close(m);
}
