/* bench_batch.c — kvsieve.h's batched bench row (ks_bench_batch_run): aggregate decode tokens/s
 * of B sessions stepped together, and the time to first token of one more prompt prefilled in
 * pieces while they decode. `kvsieve bench --batch B,...` (repl/cmd_bench.c) prints it.
 *
 * One row, as it runs:
 *   sessions s[0..B) (+ s[B], the newcomer, with ttft_under_load), each created here
 *   prefill   s[i] <- prompt i (ids row i), one after another            prefill_s
 *   warmup    `warmup` batched steps, untimed (first-use allocations, workspaces)
 *   timed     `gen` batched steps: ks_sessions_decode_greedy(s, tok, B) -> next ids
 *             (decode_batch.c: dense ops once over the B rows, attention per session or in one
 *             batched call where the backend has one, the B argmaxes where the logits are, B ids
 *             back)                                                      step_s[], decode_tok_s
 *             host_argmax (A/B): argmax of each s[i]'s logits on the host (sample_s) ->
 *             ks_sessions_decode(s, tok, B), which downloads every session's logits
 *   alone     s[B] <- prompt B in pieces of prefill_chunk rows, nobody decoding; then reset
 *   loaded    the same pieces, one per round, each round followed by one batched step of the
 *             B others (serve's order: repl/serve_sched.c steps 4 and 5)  ttft_s, ttft_step_s
 * Greedy argmax with EOS ignored, so every step has B rows (random weights would otherwise end
 * sequences at random). The ids are what B separate greedy runs give: on the CPU bit for bit,
 * on CUDA to bf16 rounding (decode_batch.c); tests/test_bench_batch.c checks the CPU case. */
#include "common.h"
#include "decode_batch.h"
#include "engine.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void ks_bench_batch_opts_default(ks_bench_batch_opts *o) {
    if (!o) return;
    memset(o, 0, sizeof *o);
    o->gen = 16;
    o->warmup = 2;
    o->prefill_chunk = 256;
}

void ks_bench_batch_result_free(ks_bench_batch_result *r) {
    if (!r) return;
    free(r->step_s);
    free(r->ids);
    memset(r, 0, sizeof *r);
}

static int cmp_dbl(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

/* What one row needs besides the result. */
typedef struct brun {
    ks_model *m;
    ks_session **s;      /* (batch + 1) */
    int32_t *tok;        /* (batch) this step's ids */
    ks_status *st;       /* (batch) */
    char **msg;          /* (batch) */
    int batch;
    ks_sampler smp;      /* greedy */
    int host;            /* host_argmax: the A/B path */
    int32_t *next;       /* (batch) the ids the last step gave (device path); have_next: valid */
    int have_next;
} brun;

/* One batched step of s[0..batch): each session's argmax id (kept in row ids[i * stride + at]
 * when ids), then one batched decode. The ids come from the last step's device argmax
 * (ks_sessions_decode_greedy) or, on the first step after the prefills and with host_argmax,
 * from each session's logits on the host (those seconds added to *sample_s when given). A
 * session's own failure is returned with its index and message. */
static ks_status bstep(brun *b, int32_t *ids, int stride, int at, double *sample_s) {
    int vocab = b->m->cfg.vocab;
    double t0 = ks_now();
    for (int i = 0; i < b->batch; i++) {
        b->tok[i] = b->have_next ? b->next[i] : ks_sample(&b->smp, b->s[i]->logits, vocab);
        if (ids) ids[(size_t)i * stride + at] = b->tok[i];
    }
    if (sample_s && !b->have_next) *sample_s += ks_now() - t0;
    ks_status st = b->host ? ks_sessions_decode(b->s, b->tok, b->batch, b->st, b->msg)
                           : ks_sessions_decode_greedy(b->s, b->tok, b->batch, NULL, b->next, b->st, b->msg);
    b->have_next = !st && !b->host;
    if (st) return st;
    for (int i = 0; i < b->batch; i++)
        if (b->st[i]) {
            st = ks_errorf(b->st[i], "bench: batched step, session %d: %s", i, b->msg[i] ? b->msg[i] : "failed");
            break;
        }
    for (int i = 0; i < b->batch; i++) { free(b->msg[i]); b->msg[i] = NULL; }
    return st;
}

/* Prefill ids[0..n) on s in pieces of `chunk`: one piece (the next one from *done). */
static ks_status piece(ks_session *s, const int32_t *ids, int n, int chunk, int *done) {
    int k = KS_MIN(chunk, n - *done);
    ks_status st = ks_session_prefill(s, ids + *done, k);
    if (!st) *done += k;
    return st;
}

static ks_status run_row(brun *b, const int32_t *ids, int n, const ks_bench_batch_opts *o, ks_bench_batch_result *out) {
    ks_model *m = b->m;
    ks_backend *be = m->be;
    const ks_config *c = &m->cfg;
    int B = b->batch, steps = o->warmup + o->gen;
    ks_status st = KS_OK;
    double t0 = ks_now();
    for (int i = 0; i < B && !st; i++) st = ks_session_prefill(b->s[i], ids + (size_t)i * n, n);
    out->prefill_s = ks_now() - t0;
    int32_t *kid = o->keep_ids ? out->ids : NULL;
    for (int g = 0; g < o->warmup && !st; g++) st = bstep(b, kid, steps, g, NULL);
    double total = 0;
    for (int g = 0; g < o->gen && !st; g++) {
        double t1 = ks_now();
        st = bstep(b, kid, steps, o->warmup + g, &out->sample_s);
        out->step_s[g] = ks_now() - t1;
        total += out->step_s[g];
    }
    if (st) return st;
    double *sorted = ks_malloc(sizeof(double) * (size_t)o->gen);
    if (!sorted) return KS_ERR_OOM;
    memcpy(sorted, out->step_s, sizeof(double) * (size_t)o->gen);
    qsort(sorted, (size_t)o->gen, sizeof(double), cmp_dbl);
    int g = o->gen;
    out->step_median_s = g % 2 ? sorted[g / 2] : 0.5 * (sorted[g / 2 - 1] + sorted[g / 2]);
    free(sorted);
    out->decode_tok_s = total > 0 ? (double)B * o->gen / total : NAN;
    size_t rows = 0;
    for (int i = 0; i < B; i++)
        for (int l = 0; l < c->n_layers; l++) rows += ks_session_kv_rows(b->s[i], l);
    out->kv_bytes = (double)rows * c->head_dim * 2 * (be->host_memory ? 4 : 2);
    if (!o->ttft_under_load) return KS_OK;
    /* the newcomer: alone, then while the B decode */
    ks_session *nw = b->s[B];
    const int32_t *nid = ids + (size_t)B * n;
    int done = 0;
    t0 = ks_now();
    while (done < n && !st) st = piece(nw, nid, n, o->prefill_chunk, &done);
    out->ttft_alone_s = ks_now() - t0;
    ks_session_reset(nw);
    done = 0;
    double steps_s = 0;
    int rounds = 0;
    t0 = ks_now();
    while (!st && done < n) {
        st = piece(nw, nid, n, o->prefill_chunk, &done);
        if (st) break;
        rounds++;
        if (done == n) out->ttft_s = ks_now() - t0; /* its first token can be sampled now */
        double t1 = ks_now();
        st = bstep(b, NULL, 0, 0, NULL);
        steps_s += ks_now() - t1;
    }
    out->ttft_rounds = rounds;
    out->ttft_step_s = rounds ? steps_s / rounds : 0;
    return st;
}

ks_status ks_bench_batch_run(ks_model *m, const int32_t *ids, int n, int batch, const ks_bench_batch_opts *o,
                             ks_bench_batch_result *out) {
    if (!out) return ks_errorf(KS_ERR_ARG, "bench batch: NULL result");
    memset(out, 0, sizeof *out);
    ks_bench_batch_opts def;
    if (!o) { ks_bench_batch_opts_default(&def); o = &def; }
    if (!m || !ids) return ks_errorf(KS_ERR_ARG, "bench batch: NULL %s", m ? "prompts" : "model");
    if (batch < 1 || n < 1 || o->gen < 1 || o->warmup < 0 || o->prefill_chunk < 1)
        return ks_errorf(KS_ERR_ARG, "bench batch: batch %d, %d tokens, gen %d, warmup %d, prefill chunk %d "
                         "(want >= 1, >= 1, >= 1, >= 0, >= 1)", batch, n, o->gen, o->warmup, o->prefill_chunk);
    const ks_config *c = &m->cfg;
    int rounds = o->ttft_under_load ? (n + o->prefill_chunk - 1) / o->prefill_chunk : 0;
    long long need = (long long)n + o->warmup + o->gen + rounds; /* in 64 bits: gen may be up to INT_MAX */
    if (need > c->max_pos)
        return ks_errorf(KS_ERR_ARG, "bench batch: %d tokens + %d steps%s exceed the model's context %d", n,
                         o->warmup + o->gen, rounds ? " + the newcomer's rounds" : "", c->max_pos);
    int np = batch + (o->ttft_under_load ? 1 : 0);
    for (size_t i = 0; i < (size_t)np * n; i++)
        if (ids[i] < 0 || ids[i] >= c->vocab)
            return ks_errorf(KS_ERR_ARG, "bench batch: id %d of prompt %zu at %zu is outside the vocabulary", ids[i],
                             i / n, i % n);
    out->batch = batch;
    out->tokens = n;
    out->gen = o->gen;
    int steps = o->warmup + o->gen;
    brun b = {.m = m, .batch = batch, .host = o->host_argmax};
    ks_sampler_init(&b.smp, 0, 1, 0);
    b.s = ks_calloc((size_t)np, sizeof *b.s);
    b.tok = ks_calloc((size_t)batch * 2, sizeof *b.tok);
    b.next = b.tok ? b.tok + batch : NULL;
    b.st = ks_calloc((size_t)batch, sizeof *b.st);
    b.msg = ks_calloc((size_t)batch, sizeof *b.msg);
    out->step_s = ks_calloc((size_t)o->gen, sizeof *out->step_s);
    if (o->keep_ids) {
        out->ids = ks_calloc((size_t)batch * steps, sizeof *out->ids);
        out->n_ids = steps;
    }
    ks_status st = (!b.s || !b.tok || !b.st || !b.msg || !out->step_s || (o->keep_ids && !out->ids)) ? KS_ERR_OOM : KS_OK;
    for (int i = 0; i < np && !st; i++) st = ks_session_create(m, &b.s[i]);
    ks_backend *be = m->be;
    /* the A/B switch: the engine sees no batched attention for this row (restored below) */
    ks_status (*batched)(ks_backend *, int, ks_kv_layer *const *, const float *const *, const float *const *,
                         const float *const *, const int32_t *, int, float, int, float *const *, void *) = be->attn_decode_batch;
    if (o->per_session_attention) be->attn_decode_batch = NULL;
    ks_mem_stats ms = {0};
    if (!st && be->mem_stats) be->mem_stats(be, &ms, 1);
    if (!st) st = run_row(&b, ids, n, o, out);
    if (!st && be->mem_stats) {
        be->mem_stats(be, &ms, 0);
        out->has_memory = 1;
        out->memory.cur = ms.cur;
        out->memory.peak = ms.peak;
        out->memory.peak_fixed = ms.peak_fixed;
        out->memory.peak_scratch = ms.peak_scratch;
        out->memory.pool_used_high = ms.pool_used_high;
        out->memory.pool_reserved_high = ms.pool_reserved_high;
    }
    be->attn_decode_batch = batched;
    for (int i = 0; b.s && i < np; i++) ks_session_free(b.s[i]);
    for (int i = 0; b.msg && i < batch; i++) free(b.msg[i]);
    free(b.s);
    free(b.tok);
    free(b.st);
    free(b.msg);
    return st;
}
