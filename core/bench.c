/* bench.c — kvsieve.h's speed measurements: a model's shape (ks_model_get_info), its backend's
 * memory and ceilings, a session's profile switch, and one bench row (ks_bench_run: warm-up,
 * timed prefills and decode steps, matmul counters, memory peak, profile, the CPU GEMM ceiling).
 * `kvsieve bench` (repl/cmd_bench.c) prints what this measures. */
#include "common.h"
#include "cpu_gemm.h"
#include "engine.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

ks_status ks_model_get_info(const ks_model *m, ks_model_info *out) {
    if (!m || !out) return ks_errorf(KS_ERR_ARG, "model info: NULL %s", m ? "output" : "model");
    const ks_config *c = &m->cfg;
    memset(out, 0, sizeof *out);
    out->arch = ks_arch_name(c->arch);
    out->backend = m->be->name;
    out->n_layers = c->n_layers;
    out->dim = c->dim;
    out->n_heads = c->n_heads;
    out->n_kv_heads = c->n_kv_heads;
    out->head_dim = c->head_dim;
    out->ffn = c->ffn;
    out->vocab = c->vocab;
    out->max_context = c->max_pos;
    out->n_params = m->n_params;
    out->elem_bytes = m->be->host_memory ? 4 : 2; /* float32 weights and KV on the CPU, bf16 on the GPU */
    return KS_OK;
}

ks_status ks_model_memory_stats(ks_model *m, int reset_peak, ks_model_memory *out) {
    if (!m || !out) return ks_errorf(KS_ERR_ARG, "memory stats: NULL %s", m ? "output" : "model");
    memset(out, 0, sizeof *out);
    if (!m->be->mem_stats) return ks_errorf(KS_ERR_UNSUPPORTED, "the %s backend keeps no memory counts", m->be->name);
    ks_mem_stats ms = {0};
    m->be->mem_stats(m->be, &ms, reset_peak != 0);
    out->cur = ms.cur;
    out->peak = ms.peak;
    out->peak_fixed = ms.peak_fixed;
    out->peak_scratch = ms.peak_scratch;
    out->pool_used_high = ms.pool_used_high;
    out->pool_reserved_high = ms.pool_reserved_high;
    return KS_OK;
}

ks_status ks_model_ceilings(ks_model *m, double *gemm_tflops, double *copy_gbs) {
    if (!m || !gemm_tflops || !copy_gbs) return ks_errorf(KS_ERR_ARG, "ceilings: NULL argument");
    *gemm_tflops = *copy_gbs = 0;
    if (!m->be->ceilings) return ks_errorf(KS_ERR_UNSUPPORTED, "the %s backend measures no ceilings", m->be->name);
    return m->be->ceilings(m->be, gemm_tflops, copy_gbs);
}

void ks_session_set_profile(ks_session *s, int on) {
    if (s) ks_profile_enable(s, on);
}

int ks_session_profiling(const ks_session *s) { return s && s->prof.on; }

void ks_bench_opts_default(ks_bench_opts *o) {
    if (!o) return;
    memset(o, 0, sizeof *o);
    o->gen = 16;
    o->repeat = 3;
}

void ks_bench_result_free(ks_bench_result *r) {
    if (!r) return;
    free(r->prefill_s);
    free(r->decode_s);
    free(r->step_p50_s);
    free(r->profile_text);
    memset(r, 0, sizeof *r);
}

/* GFLOP/s of the CPU GEMM alone (core/cpu_gemm.h, on a pool of all online cores) over the
 * model's linear shapes with n rows: the ceiling the linear layers are measured against. 0 when
 * its buffers cannot be had. */
static double gemm_ceiling(const ks_config *c, int n) {
    int QD = c->n_heads * c->head_dim, KD = c->n_kv_heads * c->head_dim;
    int shapes[][2] = {{c->dim, QD}, {c->dim, KD}, {c->dim, KD}, {QD, c->dim}, {c->dim, c->ffn}, {c->dim, c->ffn}, {c->ffn, c->dim}};
    size_t maxw = 0;
    for (int i = 0; i < 7; i++) maxw = KS_MAX(maxw, (size_t)shapes[i][0] * shapes[i][1]);
    size_t maxin = (size_t)n * KS_MAX(KS_MAX(c->dim, QD), c->ffn);
    float *W = malloc(sizeof(float) * maxw), *x = malloc(sizeof(float) * maxin), *y = malloc(sizeof(float) * maxin);
    ks_pool *pool = NULL;
    if (!W || !x || !y || ks_pool_create(0, &pool)) { free(W); free(x); free(y); return 0; }
    uint64_t r = 12345;
    for (size_t i = 0; i < maxw; i++) { r = r * 6364136223846793005ull + 1; W[i] = ((r >> 40) / 16777216.0f - 0.5f) * 0.1f; }
    for (size_t i = 0; i < maxin; i++) { r = r * 6364136223846793005ull + 1; x[i] = (r >> 40) / 16777216.0f - 0.5f; }
    double flop = 0, t = 1e30;
    for (int rep = 0; rep < 4; rep++) { /* best of 3 after a warm-up */
        flop = 0;
        double t0 = ks_now();
        for (int i = 0; i < 7; i++) {
            int in = shapes[i][0], out = shapes[i][1];
            ks_gemm_nt(pool, y, x, W, n, in, out);
            flop += 2.0 * n * in * out;
        }
        if (rep > 0) t = fmin(t, ks_now() - t0);
    }
    ks_pool_free(pool);
    free(W); free(x); free(y);
    return flop / t / 1e9;
}

/* The profile's table as text (NULL when nothing was profiled or there is no memory for it). */
static char *profile_text(const ks_profile *p, const char *title) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return NULL;
    ks_profile_print(p, f, title);
    if (fclose(f) || !len) { free(buf); return NULL; }
    return buf;
}

static int cmp_dbl(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}
/* The median of v[0 .. n) (sorted in place); NaN for n == 0 */
static double median(double *v, int n) {
    if (n <= 0) return NAN;
    qsort(v, (size_t)n, sizeof *v, cmp_dbl);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

ks_status ks_bench_run(ks_session *s, const int32_t *ids, int n, const ks_bench_opts *o, const char *title,
                       ks_bench_result *out) {
    if (!out) return ks_errorf(KS_ERR_ARG, "bench: NULL result");
    memset(out, 0, sizeof *out);
    out->linear_gflops = out->gemm_gflops = NAN;
    ks_bench_opts def;
    if (!o) { ks_bench_opts_default(&def); o = &def; }
    if (!s || !ids) return ks_errorf(KS_ERR_ARG, "bench: NULL %s", s ? "prompt" : "session");
    if (n < 1 || o->gen < 0 || o->repeat < 1)
        return ks_errorf(KS_ERR_ARG, "bench: %d tokens, gen %d, repeat %d (want >= 1, >= 0, >= 1)", n, o->gen, o->repeat);
    const ks_config *c = &s->m->cfg;
    if ((long long)n + o->gen > c->max_pos) /* in 64 bits: gen may be up to INT_MAX */
        return ks_errorf(KS_ERR_ARG, "bench: length %d (+%d generated) exceeds the model's context %d", n, o->gen, c->max_pos);
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= c->vocab) return ks_errorf(KS_ERR_ARG, "bench: id %d at %d is outside the vocabulary", ids[i], i);
    out->prefill_s = ks_calloc((size_t)o->repeat, sizeof *out->prefill_s);
    out->decode_s = ks_calloc((size_t)o->repeat, sizeof *out->decode_s);
    out->step_p50_s = ks_calloc((size_t)o->repeat, sizeof *out->step_p50_s);
    double *step = ks_calloc((size_t)KS_MAX(o->gen, 1), sizeof *step); /* (gen) one run's step times */
    if (!out->prefill_s || !out->decode_s || !out->step_p50_s || !step) {
        free(step);
        ks_bench_result_free(out);
        return KS_ERR_OOM;
    }
    ks_backend *be = s->m->be;
    int profile = s->prof.on;
    /* warm-up on a short prompt and, where the row decodes, three decode steps (a plain one, the
     * recording, a replay: the process's first launches load their kernels, which would otherwise
     * land in the first row's timed steps), then the timed runs; the memory peak and the profile
     * cover the timed runs */
    ks_session_reset(s);
    if (!ks_session_prefill(s, ids, KS_MIN(n, 16)) && o->gen > 0) {
        ks_sampler wsm;
        ks_sampler_init(&wsm, 0, 1, 0);
        int32_t wid = ks_sample(&wsm, s->logits, c->vocab);
        for (int g = 0; g < 3 && !ks_session_decode_greedy(s, wid, &wid); g++) {}
    }
    ks_session_reset(s);
    ks_clear_error();
    ks_mem_stats ms = {0};
    if (be->mem_stats) be->mem_stats(be, &ms, 1);
    ks_profile_reset(s);
    double tp = 1e30, td = 1e30, lin_gf = NAN, pf_flop = 0;
    size_t kv_rows = 0;
    ks_status st = KS_OK;
    for (int rep = 0; rep < o->repeat && !st; rep++) {
        ks_session_reset(s);
        be->stat_matmul_s = be->stat_matmul_flop = 0;
        /* the CPU backend times its matmuls for linear_gflops; a GPU backend would have to
         * synchronise around each one (the prefill time would include those stalls): there the
         * rate comes from the profile */
        be->count_stats = !profile && be->host_memory;
        double t0 = ks_now();
        st = ks_session_prefill(s, ids, n);
        double t = ks_now() - t0;
        be->count_stats = 0;
        pf_flop += be->stat_matmul_flop;
        if (st) break;
        if (t < tp) { tp = t; lin_gf = be->stat_matmul_s > 0 ? be->stat_matmul_flop / be->stat_matmul_s / 1e9 : NAN; }
        ks_sampler smp;
        ks_sampler_init(&smp, 0, 1, 0);
        double t1 = ks_now();
        int graph0 = s->graph_steps;
        long long rep0 = ks_session_replayed_steps(s);
        /* greedy: the argmax on the device where the backend has one (ks_session_decode_greedy) */
        int32_t next = ks_sample(&smp, s->logits, c->vocab);
        double ts = t1;
        for (int g = 0; g < o->gen && !st; g++) {
            st = ks_session_decode_greedy(s, next, &next);
            double te = ks_now();
            step[g] = te - ts;
            ts = te;
        }
        double tdr = ks_now() - t1;
        if (!st) {
            out->timed_steps += o->gen;
            out->graph_steps += s->graph_steps - graph0;
            out->replayed_steps += (long)(ks_session_replayed_steps(s) - rep0);
        }
        td = fmin(td, tdr);
        if (!st) {
            out->prefill_s[out->runs] = t;
            out->decode_s[out->runs] = tdr;
            out->step_p50_s[out->runs] = median(step, o->gen);
            out->runs++;
        }
        kv_rows = 0;
        for (int l = 0; l < c->n_layers; l++) kv_rows += ks_session_kv_rows(s, l);
    }
    free(step);
    out->best_prefill_s = tp;
    out->best_decode_s = td;
    out->best_step_p50_s = NAN;
    for (int r = 0; r < out->runs; r++)
        if (isnan(out->best_step_p50_s) || out->step_p50_s[r] < out->best_step_p50_s) out->best_step_p50_s = out->step_p50_s[r];
    out->prefill_flop = pf_flop;
    out->kv_rows = kv_rows;
    if (st) { ks_profile_reset(s); return st; }
    if (be->mem_stats) {
        be->mem_stats(be, &ms, 0);
        out->has_memory = 1;
        out->memory.cur = ms.cur;
        out->memory.peak = ms.peak;
        out->memory.peak_fixed = ms.peak_fixed;
        out->memory.peak_scratch = ms.peak_scratch;
        out->memory.pool_used_high = ms.pool_used_high;
        out->memory.pool_reserved_high = ms.pool_reserved_high;
    }
    if (profile) {
        const double *ps = s->prof.sec[0], *ds = s->prof.sec[1];
        double lin_s = ps[KS_PH_QKV] + ps[KS_PH_OPROJ] + ps[KS_PH_MLP] + ps[KS_PH_LM_HEAD];
        lin_gf = lin_s > 0 ? pf_flop / lin_s / 1e9 : 0; /* from the matmul phases of all timed prefills */
        out->profiled = 1;
        out->prefill_forwards = s->prof.forwards[0];
        out->decode_steps = s->prof.forwards[1];
        out->prefill_linear_s = lin_s;
        out->prefill_attention_s = ps[KS_PH_ATTENTION];
        out->decode_linear_s = ds[KS_PH_QKV] + ds[KS_PH_OPROJ] + ds[KS_PH_MLP] + ds[KS_PH_LM_HEAD];
        out->decode_attention_s = ds[KS_PH_ATTENTION];
        out->profile_text = profile_text(&s->prof, title);
    }
    out->linear_gflops = lin_gf;
    /* the CPU's GEMM ceiling only means something next to the CPU backend */
    if (o->gemm_ceiling && be->host_memory) out->gemm_gflops = gemm_ceiling(c, n);
    ks_profile_reset(s);
    return KS_OK;
}
