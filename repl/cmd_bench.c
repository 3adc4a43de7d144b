/* cmd_bench.c — `kvsieve bench`: prefill / decode speed per context length, the linear
 * layers' GFLOP/s next to what the backend's GEMM alone reaches on the same shapes, the peak
 * of the backend's own memory per row (ks_model_memory_stats), and with --profile (or
 * KS_PROFILE=1) a per-phase table per row after the rows. --json FILE writes every figure of
 * every row, with the spread over the --repeat runs (min / median / max of TTFT, prefill
 * tokens/s, TPOT, decode tokens/s and the median decode step); the table shows the best run, as
 * before. TPOT is a run's decode time over its steps, so it includes the first steps' one-time
 * work (a plain step, a graph's recording); step_ms, the median step, is the steady state. The measuring
 * is the library's (kvsieve.h: ks_bench_run, core/bench.c); this file chooses and prints. */
#include "cli.h"
#include "env_opts.h"
#include "kvsieve.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GIB(x) ((double)(x) / 1073741824.0)

/* min / median / max of n values (sorted in place) */
typedef struct spread { double min, med, max; } spread;
static int cmp_dbl(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}
static spread spread_of(double *v, int n) {
    spread r = {NAN, NAN, NAN};
    if (n <= 0) return r;
    qsort(v, (size_t)n, sizeof *v, cmp_dbl);
    r.min = v[0];
    r.max = v[n - 1];
    r.med = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
    return r;
}

/* v formatted with fmt (one conversion), or "-" right-aligned to the same width when v is not a
 * number (not measured) */
static void fmt_or_dash(char *buf, size_t n, const char *fmt, double v) {
    if (!isnan(v) && !isinf(v)) { snprintf(buf, n, fmt, v); return; }
    char tmp[32];
    int w = snprintf(tmp, sizeof tmp, fmt, 0.0);
    snprintf(buf, n, "%*s", w > 0 ? w : 1, "-");
}

static void json_num(FILE *f, double v) {
    if (isfinite(v)) fprintf(f, "%.6g", v);
    else fputs("null", f);
}
static void json_spread(FILE *f, const char *key, spread s) {
    fprintf(f, "\"%s\": {\"min\": ", key);
    json_num(f, s.min);
    fputs(", \"median\": ", f);
    json_num(f, s.med);
    fputs(", \"max\": ", f);
    json_num(f, s.max);
    fputc('}', f);
}

typedef struct bench_row {
    char policy[64];
    int tokens;
    spread ttft, prefill_tps, tpot_ms, decode_tps, step_ms; /* over the repeats (step_ms: each run's median step) */
    ks_bench_result r;  /* the library's measurements (owned: ks_bench_result_free) */
} bench_row;

/* Per row, the rates of the main phases next to the measured ceilings: prefill linear and
 * (full attention only: causal FLOPs are known) attention TFLOP/s; decode weight and KV
 * streaming GB/s. */
static void print_rates(const bench_row *br, const ks_model_info *c, double gemm_tf, double copy_gbs) {
    const ks_bench_result *r = &br->r;
    long nf = r->prefill_forwards, nd = r->decode_steps;
    if (nf <= 0) return;
    double lin_s = r->prefill_linear_s;
    printf("rates: %s, %d tokens:", br->policy, br->tokens);
    if (lin_s > 0) printf(" prefill linear %.3g TFLOP/s", r->prefill_flop / lin_s / 1e12);
    if (!strcmp(br->policy, "none") && r->prefill_attention_s > 0) {
        double n = br->tokens, fl = 2.0 * n * n * c->head_dim * c->n_heads * c->n_layers * nf; /* causal */
        printf(", prefill attention %.3g TFLOP/s", fl / r->prefill_attention_s / 1e12);
    }
    if (nd > 0) {
        double dl = r->decode_linear_s / nd;
        double kvb = (double)r->kv_rows * c->head_dim * 2 * c->elem_bytes, da = r->decode_attention_s / nd;
        if (dl > 0) printf(", decode weights %.3g GB/s", (double)c->n_params * c->elem_bytes / dl / 1e9);
        if (da > 0) printf(", decode attention %.3g GB/s (%.3g GB of KV)", kvb / da / 1e9, kvb / 1e9);
    }
    if (gemm_tf > 0) printf(" | ceilings: GEMM %.0f TFLOP/s, copy %.0f GB/s", gemm_tf, copy_gbs);
    printf("\n");
}

/* --batch: per length and batch size, the aggregate decode tokens/s of B sessions stepped
 * together (ks_bench_batch_run), the step time (median) and the host argmax's share of it (mean;
 * 0 unless --host-argmax: the step's own argmax where the logits are is inside step_ms),
 * its multiple of B = 1's rate when B = 1 ran,
 * the KV the step reads, and with --ttft-under-load a newcomer's TTFT while the B decode. */
static int bench_batch_rows(ks_model *m, const ks_model_info *c, const char *model, const int *lens, int n_lens,
                            const int *bs, int n_bs, const ks_bench_batch_opts *bo, const char *json_path) {
    printf("kvsieve bench: %s (%s, %d layers, dim %d, %zu M params) on %s, batched decode, %d warm-up + %d timed "
           "steps%s%s\n", model, c->arch, c->n_layers, c->dim, c->n_params / 1000000, c->backend, bo->warmup, bo->gen,
           bo->per_session_attention ? ", attention per session (A/B)" : "",
           bo->host_argmax ? ", argmax on the host (A/B)" : "");
    printf("%-8s %6s %12s %11s %10s %12s %7s %9s %9s", "tokens", "B", "prefill_s", "step_ms", "sample_ms", "decode_t/s",
           "xB=1", "KV_GB", "peak_GiB");
    if (bo->ttft_under_load) printf(" %10s %10s %7s %12s", "TTFT_s", "alone_s", "rounds", "load_step_ms");
    printf("\n");
    FILE *jf = json_path ? fopen(json_path, "w") : NULL;
    if (json_path && !jf) { fprintf(stderr, "kvsieve: bench: --json %s: cannot write: %s\n", json_path, strerror(errno)); return 1; }
    if (jf) fprintf(jf, "{\"backend\": \"%s\", \"gen\": %d, \"warmup\": %d, \"per_session_attention\": %d, "
                    "\"host_argmax\": %d, \"rows\": [", c->backend, bo->gen, bo->warmup, bo->per_session_attention,
                    bo->host_argmax);
    int rc = 0, nj = 0;
    for (int li = 0; li < n_lens && !rc; li++) {
        double base = NAN; /* B = 1's tokens/s at this length */
        for (int bi = 0; bi < n_bs && !rc; bi++) {
            int L = lens[li], B = bs[bi], np = B + (bo->ttft_under_load ? 1 : 0);
            int32_t *ids = malloc(sizeof(int32_t) * (size_t)np * L);
            if (!ids) { rc = ks_cli_fail("bench: out of memory"); break; }
            uint64_t r = 99; /* distinct prompts: one stream of ids cut into rows */
            for (size_t i = 0; i < (size_t)np * L; i++) {
                r = r * 6364136223846793005ull + 1442695040888963407ull;
                ids[i] = (int32_t)((r >> 33) % c->vocab);
            }
            ks_bench_batch_result res;
            ks_status st = ks_bench_batch_run(m, ids, L, B, bo, &res);
            free(ids);
            if (st) { ks_bench_batch_result_free(&res); rc = ks_cli_fail("bench --batch"); break; }
            if (B == 1) base = res.decode_tok_s;
            char f_x[32], f_peak[32];
            fmt_or_dash(f_x, sizeof f_x, "%7.2f", res.decode_tok_s / base);
            fmt_or_dash(f_peak, sizeof f_peak, "%9.2f", res.has_memory ? GIB(res.memory.peak) : NAN);
            printf("%-8d %6d %12.3f %11.3f %10.3f %12.1f %7s %9.3f %9s", L, B, res.prefill_s, 1e3 * res.step_median_s,
                   1e3 * res.sample_s / res.gen, res.decode_tok_s, f_x, res.kv_bytes / 1e9, f_peak);
            if (bo->ttft_under_load)
                printf(" %10.3f %10.3f %7d %12.3f", res.ttft_s, res.ttft_alone_s, res.ttft_rounds, 1e3 * res.ttft_step_s);
            printf("\n");
            fflush(stdout);
            if (jf) {
                fprintf(jf, "%s\n    {\"tokens\": %d, \"batch\": %d, \"prefill_s\": ", nj++ ? "," : "", L, B);
                json_num(jf, res.prefill_s);
                fputs(", \"step_median_ms\": ", jf);
                json_num(jf, 1e3 * res.step_median_s);
                fputs(", \"decode_tok_s\": ", jf);
                json_num(jf, res.decode_tok_s);
                fputs(", \"sample_ms\": ", jf);
                json_num(jf, 1e3 * res.sample_s / res.gen);
                fputs(", \"kv_gb\": ", jf);
                json_num(jf, res.kv_bytes / 1e9);
                if (bo->ttft_under_load) {
                    fputs(", \"ttft_s\": ", jf);
                    json_num(jf, res.ttft_s);
                    fputs(", \"ttft_alone_s\": ", jf);
                    json_num(jf, res.ttft_alone_s);
                    fprintf(jf, ", \"ttft_rounds\": %d, \"ttft_step_ms\": ", res.ttft_rounds);
                    json_num(jf, 1e3 * res.ttft_step_s);
                }
                fputs(", \"step_ms\": [", jf);
                for (int g = 0; g < res.gen; g++) {
                    if (g) fputs(", ", jf);
                    json_num(jf, 1e3 * res.step_s[g]);
                }
                fputs("]}", jf);
            }
            ks_bench_batch_result_free(&res);
        }
    }
    if (jf) {
        fprintf(jf, "%s], \"complete\": %s}\n", nj ? "\n  " : "", rc ? "false" : "true");
        if (fclose(jf)) { fprintf(stderr, "kvsieve: bench: --json %s: write failed\n", json_path); rc = rc ? rc : 1; }
        else printf("results: %s\n", json_path);
    }
    return rc;
}

int ks_cli_bench(int argc, char **argv) {
    const char *model = NULL, *random_cfg = NULL, *lengths = "128,512,1024", *backend = NULL, *policies = "none";
    const char *sets[64];
    const char *json_path = NULL;
    const char *batches = NULL;
    int n_sets = 0, gen = 16, reps = 3, profile = 0, tp = 0, ttft_load = 0, chunk = 256, per_session = 0, host_am = 0;
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (ks_cli_is_help(argv[i])) return ks_cli_help("bench"), 0;
        else if (ks_cli_is_verbose(argv[i])) ks_cli_set_verbose();
        else if (!strcmp(argv[i], "-m") && v) { model = v; i++; }
        else if (!strcmp(argv[i], "--json") && v) { json_path = v; i++; }
        else if (!strcmp(argv[i], "--random-weights") && v) { random_cfg = v; i++; }
        else if (!strcmp(argv[i], "--lengths") && v) { lengths = v; i++; }
        else if (!strcmp(argv[i], "--gen") && v) { if (ks_arg_int("--gen", v, 0, INT_MAX, &gen)) return 2; i++; }
        else if (!strcmp(argv[i], "--backend") && v) { backend = v; i++; }
        else if (!strcmp(argv[i], "--tp") && v) { if (ks_arg_int("--tp", v, 1, 8, &tp)) return 2; i++; }
        else if (!strcmp(argv[i], "--repeat") && v) { if (ks_arg_int("--repeat", v, 1, 1000000, &reps)) return 2; i++; }
        else if (!strcmp(argv[i], "--policy") && v) { policies = v; i++; }
        else if (!strcmp(argv[i], "--set") && v) { if (n_sets < 64) sets[n_sets++] = v; i++; }
        else if (!strcmp(argv[i], "--profile")) profile = 1;
        else if (!strcmp(argv[i], "--batch") && v) { batches = v; i++; }
        else if (!strcmp(argv[i], "--ttft-under-load")) ttft_load = 1;
        else if (!strcmp(argv[i], "--prefill-chunk") && v) { if (ks_arg_int("--prefill-chunk", v, 1, INT_MAX, &chunk)) return 2; i++; }
        else if (!strcmp(argv[i], "--attn-per-session")) per_session = 1;
        else if (!strcmp(argv[i], "--host-argmax")) host_am = 1;
        else { fprintf(stderr, "kvsieve: bench: unknown or incomplete option %s\n", argv[i]); return 2; }
    }
    if (!model && !random_cfg) { fprintf(stderr, "kvsieve: bench needs -m DIR or --random-weights CONFIG\n"); return 2; }
    /* the lengths are checked before the model loads (a typo costs no loading time); each one
     * against the model's context below */
    int lens[64], n_lens;
    if (ks_arg_int_list("--lengths", lengths, 1, INT_MAX, 1, lens, 64, &n_lens)) return 2;
    /* the JSON file must be writable before any work (written at the end) */
    if (json_path && ks_cli_check_writable("bench: --json", json_path)) return 2;
    int bs[16], n_bs = 0;
    if (batches && ks_arg_int_list("--batch", batches, 1, 4096, 0, bs, 16, &n_bs)) return 2;
    if (!batches && (ttft_load || per_session || host_am)) {
        fprintf(stderr, "kvsieve: bench: --ttft-under-load, --attn-per-session and --host-argmax need --batch\n");
        return 2;
    }
    ks_model *m;
    ks_model_opts mo;
    ks_model_opts_default(&mo);
    mo.backend = backend;
    ks_model_tuning tu; /* the environment's tuning, and --tp */
    ks_model_tuning_default(&tu);
    ks_cli_model_tuning(&tu);
    tu.tp = tp;
    if (random_cfg) {
        if (ks_model_open_random(random_cfg, &mo, &tu, 1, &m)) return ks_cli_fail("cannot build random model");
        model = random_cfg;
    } else if (ks_model_open_tuned(model, &mo, &tu, &m)) return ks_cli_fail("cannot load model");
    ks_model_info c;
    ks_model_get_info(m, &c);
    if (batches) { /* the batched rows (bench_batch_rows) instead of the batch-1 table */
        ks_bench_batch_opts bo;
        ks_bench_batch_opts_default(&bo);
        bo.gen = gen > 0 ? gen : 1;
        bo.ttft_under_load = ttft_load;
        bo.prefill_chunk = chunk;
        bo.per_session_attention = per_session;
        bo.host_argmax = host_am;
        int rc = bench_batch_rows(m, &c, model, lens, n_lens, bs, n_bs, &bo, json_path);
        ks_model_close(m);
        return rc;
    }
    ks_session *s;
    if (ks_session_create(m, &s)) { ks_model_close(m); return ks_cli_fail("session"); }
    /* --profile, or KS_PROFILE in the environment (already on: =sync keeps the host clock) */
    if (profile && !ks_session_profiling(s)) ks_session_set_profile(s, 1);
    profile = ks_session_profiling(s);
    ks_model_memory ms0;
    int has_mem = ks_model_memory_stats(m, 1, &ms0) == KS_OK;
    printf("kvsieve bench: %s (%s, %d layers, dim %d, %zu M params) on %s, batch 1, best of %d\n", model, c.arch,
           c.n_layers, c.dim, c.n_params / 1000000, c.backend, reps);
    if (has_mem) printf("backend memory after loading: %.2f GiB (weights and workspaces)\n", GIB(ms0.cur));
    if (profile)
        printf("profiling on: linear_GF/s from the profile's matmul phases, TTFT/TPOT include the profiler's marks\n");
    printf("%-12s %8s %10s %12s %12s %11s %8s %10s %9s %9s %7s %8s\n", "policy", "tokens", "TTFT_s", "prefill_t/s",
           "linear_GF/s", "sgemm_GF/s", "linear%", "TPOT_ms", "KV_rows", "peak_GiB", "graph%", "step_ms");
    int rc = 0, n_rows = 0, cap_rows = 0;
    bench_row *rows = NULL;
    char *plist = strdup(policies);
    char *psave = NULL;
    ks_bench_opts bo;
    ks_bench_opts_default(&bo);
    bo.gen = gen;
    bo.repeat = reps;
    bo.gemm_ceiling = 1;
    for (char *pn = strtok_r(plist, ",", &psave); pn && !rc; pn = strtok_r(NULL, ",", &psave)) {
        ks_policy *pol = NULL;
        if (strcmp(pn, "none")) {
            if (ks_cli_policy_load(m, pn, &pol)) { rc = ks_cli_fail("policy"); break; }
            /* --set NAME.key=value applies to policy NAME; --set key=value to every policy that has key */
            for (int i = 0; i < n_sets && !rc; i++) {
                char key[256];
                const char *eq = strchr(sets[i], '='), *kk = sets[i], *dot = strchr(sets[i], '.');
                if (!eq || (size_t)(eq - kk) >= sizeof key) { fprintf(stderr, "kvsieve: --set expects key=value\n"); rc = 2; break; }
                if (dot && dot < eq) {
                    if ((size_t)(dot - kk) != strlen(pn) || strncmp(kk, pn, dot - kk)) continue;
                    kk = dot + 1;
                }
                memcpy(key, kk, eq - kk);
                key[eq - kk] = 0;
                if (ks_policy_set(pol, key, eq + 1) && dot && dot < eq) rc = ks_cli_fail("--set");
            }
            /* the parameters against the model (a layer it does not have is an error) */
            if (!rc && ks_cli_check_policy(m, pol, "bench")) rc = 2;
            if (rc) { ks_policy_free(pol); break; }
        }
        ks_session_set_policy(s, pol);
        for (int li = 0; li < n_lens; li++) {
            int L = lens[li];
            if ((long long)L + gen > c.max_context) { /* in 64 bits: --gen may be up to INT_MAX */
                fprintf(stderr, "kvsieve: bench: length %d (+%d generated) exceeds the model's context %d\n", L, gen,
                        c.max_context);
                rc = 2;
                break;
            }
            if (n_rows == cap_rows) {
                int nc = cap_rows ? 2 * cap_rows : 8;
                bench_row *nr = realloc(rows, sizeof *nr * nc);
                if (!nr) { rc = ks_cli_fail("bench: out of memory"); break; }
                rows = nr;
                cap_rows = nc;
            }
            int32_t *ids = malloc(sizeof(int32_t) * L);
            if (!ids) { rc = ks_cli_fail("bench: out of memory"); break; }
            uint64_t r = 99;
            for (int i = 0; i < L; i++) { r = r * 6364136223846793005ull + 1442695040888963407ull; ids[i] = (int32_t)((r >> 33) % c.vocab); }
            bench_row *br = &rows[n_rows];
            memset(br, 0, sizeof *br);
            snprintf(br->policy, sizeof br->policy, "%s", pn);
            br->tokens = L;
            char title[128];
            snprintf(title, sizeof title, "%s, %d tokens", pn, L);
            /* warm-up, then the timed runs (best of `reps`: timings here are noisy) */
            ks_status st = ks_bench_run(s, ids, L, &bo, title, &br->r);
            free(ids);
            if (st) { ks_bench_result_free(&br->r); rc = ks_cli_fail("bench"); break; }
            n_rows++;
            const ks_bench_result *res = &br->r;
            int n_rep = res->runs;
            /* the spread over the repeats: TTFT and TPOT directly, the rates from each run's time */
            double *rate = calloc((size_t)n_rep + 1, sizeof *rate), *tpot = calloc((size_t)n_rep + 1, sizeof *tpot),
                   *drate = calloc((size_t)n_rep + 1, sizeof *drate), *tps = calloc((size_t)n_rep + 1, sizeof *tps),
                   *stp = calloc((size_t)n_rep + 1, sizeof *stp);
            spread s_ttft = {NAN, NAN, NAN}, s_rate = s_ttft, s_tpot = s_ttft, s_drate = s_ttft, s_step = s_ttft;
            if (rate && tpot && drate && tps && stp) {
                for (int k = 0; k < n_rep; k++) {
                    const double *tds = res->decode_s;
                    tps[k] = res->prefill_s[k];
                    rate[k] = L / res->prefill_s[k];
                    tpot[k] = gen > 0 ? 1e3 * tds[k] / gen : NAN;
                    drate[k] = gen > 0 && tds[k] > 0 ? gen / tds[k] : NAN;
                    stp[k] = 1e3 * res->step_p50_s[k];
                }
                s_rate = spread_of(rate, n_rep);
                if (gen > 0) {
                    s_tpot = spread_of(tpot, n_rep);
                    s_drate = spread_of(drate, n_rep);
                    s_step = spread_of(stp, n_rep);
                }
                s_ttft = spread_of(tps, n_rep);
            }
            free(rate); free(tpot); free(drate); free(tps); free(stp);
            double tp = res->best_prefill_s, td = res->best_decode_s, lin_gf = res->linear_gflops, ceil = res->gemm_gflops;
            /* a figure the backend did not measure (the CUDA matmul rates without --profile, the
             * CPU GEMM ceiling on CUDA) prints as "-", not nan */
            char f_lin[32], f_ceil[32], f_pct[32], f_peak[32], f_graph[32], f_step[32];
            fmt_or_dash(f_lin, sizeof f_lin, "%12.1f", lin_gf);
            fmt_or_dash(f_ceil, sizeof f_ceil, "%11.1f", ceil);
            fmt_or_dash(f_pct, sizeof f_pct, "%7.0f%%", 100 * lin_gf / ceil);
            fmt_or_dash(f_peak, sizeof f_peak, "%9.2f", has_mem ? GIB(res->memory.peak) : NAN);
            /* the timed decode steps that replayed a recorded graph ("-": no decode steps) */
            fmt_or_dash(f_graph, sizeof f_graph, "%6.0f%%", res->timed_steps > 0 ? 100.0 * res->graph_steps / res->timed_steps : NAN);
            /* the steady state: the median decode step of the best run (TPOT spreads the first
             * steps' one-time work over the run) */
            fmt_or_dash(f_step, sizeof f_step, "%8.2f", gen > 0 ? 1e3 * res->best_step_p50_s : NAN);
            printf("%-12s %8d %10.3f %12.1f %12s %11s %8s %10.2f %9zu %9s %7s %8s\n", pn, L, tp, L / tp, f_lin, f_ceil, f_pct,
                   gen > 0 ? 1e3 * td / gen : 0.0, res->kv_rows / ((size_t)c.n_layers * c.n_kv_heads), f_peak, f_graph,
                   f_step);
            fflush(stdout);
            br->ttft = s_ttft;
            br->prefill_tps = s_rate;
            br->tpot_ms = s_tpot;
            br->decode_tps = s_drate;
            br->step_ms = s_step;
        }
        ks_session_set_policy(s, NULL);
        ks_policy_free(pol);
    }
    free(plist);
    printf("peak host memory %.1f MiB\n", ks_cli_peak_rss() / 1048576.0);
    /* per row: what the peak was made of; the CUDA pool's own high-water marks (driver) */
    for (int i = 0; i < n_rows && has_mem; i++) {
        const ks_model_memory *q = &rows[i].r.memory;
        printf("memory %-12s %8d: peak %.2f GiB = fixed %.2f (weights, KV) + scratch %.2f", rows[i].policy,
               rows[i].tokens, GIB(q->peak), GIB(q->peak_fixed), GIB(q->peak_scratch));
        if (q->pool_reserved_high) printf("; pool used high %.2f, reserved high %.2f", GIB(q->pool_used_high), GIB(q->pool_reserved_high));
        printf("\n");
    }
    for (int r = 0; r < ks_model_tp_ranks(m); r++) { /* --tp: each rank's bytes, the last row's peak */
        ks_model_memory q;
        if (ks_model_rank_memory_stats(m, r, 0, &q)) break;
        printf("memory rank %d (last row): peak %.3f GiB = fixed %.3f (its weight shards, its KV heads) + scratch %.3f\n", r,
               GIB(q.peak), GIB(q.peak_fixed), GIB(q.peak_scratch));
    }
    for (int i = 0; i < n_rows && profile; i++)
        if (rows[i].r.profile_text) fputs(rows[i].r.profile_text, stdout);
    if (profile && n_rows) {
        /* the ceilings are measured after the rows, so that their allocations miss the peaks */
        double gemm_tf = 0, copy_gbs = 0;
        ks_status cst = ks_model_ceilings(m, &gemm_tf, &copy_gbs);
        if (cst && cst != KS_ERR_UNSUPPORTED) fprintf(stderr, "kvsieve: bench: ceilings not measured: %s\n", ks_last_error());
        for (int i = 0; i < n_rows; i++) print_rates(&rows[i], &c, gemm_tf, copy_gbs);
    }
    FILE *jf = json_path ? fopen(json_path, "w") : NULL;
    if (json_path && !jf) {
        fprintf(stderr, "kvsieve: bench: --json %s: cannot write: %s\n", json_path, strerror(errno));
        rc = rc ? rc : 1;
    }
    if (jf) {
        /* every figure of every row; spreads over the repeats; null where not measured */
        fprintf(jf, "{\n  \"model\": \"");
        for (const char *c2 = model; *c2; c2++) {
            if (*c2 == '"' || *c2 == '\\') fputc('\\', jf);
            if ((unsigned char)*c2 >= 0x20) fputc(*c2, jf);
        }
        fprintf(jf, "\",\n  \"arch\": \"%s\", \"n_layers\": %d, \"dim\": %d, \"n_params\": %zu,\n", c.arch, c.n_layers, c.dim,
                c.n_params);
        fprintf(jf, "  \"backend\": \"%s\", \"batch\": 1, \"repeat\": %d, \"gen\": %d, \"complete\": %s,\n", c.backend, reps,
                gen, rc ? "false" : "true");
        fprintf(jf, "  \"peak_host_mib\": %.1f,\n  \"rows\": [", ks_cli_peak_rss() / 1048576.0);
        for (int i = 0; i < n_rows; i++) {
            const bench_row *r = &rows[i];
            fprintf(jf, "%s\n    {\"policy\": \"%s\", \"tokens\": %d, ", i ? "," : "", r->policy, r->tokens);
            json_spread(jf, "ttft_s", r->ttft);
            fputs(", ", jf);
            json_spread(jf, "prefill_tok_s", r->prefill_tps);
            fputs(", ", jf);
            json_spread(jf, "tpot_ms", r->tpot_ms);
            fputs(", ", jf);
            json_spread(jf, "decode_tok_s", r->decode_tps);
            fputs(", ", jf);
            json_spread(jf, "step_p50_ms", r->step_ms);
            fputs(", \"linear_gflops\": ", jf);
            json_num(jf, r->r.linear_gflops);
            fputs(", \"sgemm_gflops\": ", jf);
            json_num(jf, r->r.gemm_gflops);
            fprintf(jf, ", \"kv_rows_per_head\": %zu, \"decode_steps\": %ld, \"graph_steps\": %ld, \"replayed_layer_steps\": %ld",
                    r->r.kv_rows / ((size_t)c.n_layers * c.n_kv_heads), r->r.timed_steps, r->r.graph_steps,
                    r->r.replayed_steps);
            if (has_mem) {
                fputs(", \"peak_gib\": ", jf);
                json_num(jf, GIB(r->r.memory.peak));
                fputs(", \"peak_fixed_gib\": ", jf);
                json_num(jf, GIB(r->r.memory.peak_fixed));
                fputs(", \"peak_scratch_gib\": ", jf);
                json_num(jf, GIB(r->r.memory.peak_scratch));
            }
            fputc('}', jf);
        }
        fprintf(jf, "%s]\n}\n", n_rows ? "\n  " : "");
        int bad = ferror(jf);
        bad |= fclose(jf);
        if (bad) { fprintf(stderr, "kvsieve: bench: --json %s: write failed\n", json_path); rc = rc ? rc : 1; }
        else printf("results: %s\n", json_path);
    }
    for (int i = 0; i < n_rows; i++) ks_bench_result_free(&rows[i].r);
    free(rows);
    ks_session_free(s);
    ks_model_close(m);
    return rc;
}
