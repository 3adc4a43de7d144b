/* cmd_bench.c — `kvsieve bench`: prefill / decode speed per context length, the linear
 * layers' GFLOP/s next to what the backend's GEMM alone reaches on the same shapes, the peak
 * of the backend's own memory per row (ks_backend.mem_stats), and with --profile (or
 * KS_PROFILE=1) a per-phase table per row after the rows. --json FILE writes every figure of
 * every row, with the spread over the --repeat runs (min / median / max of TTFT, prefill
 * tokens/s, TPOT and decode tokens/s); the table shows the best run, as before. */
#include "cli.h"
#include "cpu_gemm.h"
#include "engine.h"
#include "env_opts.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* GFLOP/s of the CPU backend's GEMM alone (core/cpu_gemm.h, on a pool of all online cores) over
 * the model's linear shapes with n rows: the ceiling the linear layers are measured against. */
static double sgemm_ceiling(const ks_config *c, int n) {
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

/* Provided by the Lua layer. */
ks_status ks_policy_load(ks_model *m, const char *name_or_path, ks_policy **out);
ks_status ks_policy_set(ks_policy *p, const char *key, const char *value);
void ks_policy_free(ks_policy *p);

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
    spread ttft, prefill_tps, tpot_ms, decode_tps; /* over the repeats */
    double lin_gf, sgemm_gf;
    ks_profile prof;
    ks_mem_stats mem;
    double pf_flop;   /* matmul FLOPs of the timed prefills */
    size_t kv_rows;   /* KV rows over all layers and KV heads after the last decode */
} bench_row;

/* Per row, the rates of the main phases next to the measured ceilings: prefill linear and
 * (full attention only: causal FLOPs are known) attention TFLOP/s; decode weight and KV
 * streaming GB/s. */
static void print_rates(const bench_row *r, const ks_config *c, size_t n_params, int elem_bytes, double gemm_tf,
                        double copy_gbs) {
    const double *ps = r->prof.sec[0], *ds = r->prof.sec[1];
    long nf = r->prof.forwards[0], nd = r->prof.forwards[1];
    if (nf <= 0) return;
    double lin_s = ps[KS_PH_QKV] + ps[KS_PH_OPROJ] + ps[KS_PH_MLP] + ps[KS_PH_LM_HEAD];
    printf("rates: %s, %d tokens:", r->policy, r->tokens);
    if (lin_s > 0) printf(" prefill linear %.3g TFLOP/s", r->pf_flop / lin_s / 1e12);
    if (!strcmp(r->policy, "none") && ps[KS_PH_ATTENTION] > 0) {
        double n = r->tokens, fl = 2.0 * n * n * c->head_dim * c->n_heads * c->n_layers * nf; /* causal */
        printf(", prefill attention %.3g TFLOP/s", fl / ps[KS_PH_ATTENTION] / 1e12);
    }
    if (nd > 0) {
        double dl = (ds[KS_PH_QKV] + ds[KS_PH_OPROJ] + ds[KS_PH_MLP] + ds[KS_PH_LM_HEAD]) / nd;
        double kvb = (double)r->kv_rows * c->head_dim * 2 * elem_bytes, da = ds[KS_PH_ATTENTION] / nd;
        if (dl > 0) printf(", decode weights %.3g GB/s", (double)n_params * elem_bytes / dl / 1e9);
        if (da > 0) printf(", decode attention %.3g GB/s (%.3g GB of KV)", kvb / da / 1e9, kvb / 1e9);
    }
    if (gemm_tf > 0) printf(" | ceilings: GEMM %.0f TFLOP/s, copy %.0f GB/s", gemm_tf, copy_gbs);
    printf("\n");
}

int ks_cli_bench(int argc, char **argv) {
    const char *model = NULL, *random_cfg = NULL, *lengths = "128,512,1024", *backend = NULL, *policies = "none";
    const char *sets[64];
    const char *json_path = NULL;
    int n_sets = 0, gen = 16, reps = 3, profile = 0;
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
        else if (!strcmp(argv[i], "--repeat") && v) { if (ks_arg_int("--repeat", v, 1, 1000000, &reps)) return 2; i++; }
        else if (!strcmp(argv[i], "--policy") && v) { policies = v; i++; }
        else if (!strcmp(argv[i], "--set") && v) { if (n_sets < 64) sets[n_sets++] = v; i++; }
        else if (!strcmp(argv[i], "--profile")) profile = 1;
        else { fprintf(stderr, "kvsieve: bench: unknown or incomplete option %s\n", argv[i]); return 2; }
    }
    if (!model && !random_cfg) { fprintf(stderr, "kvsieve: bench needs -m DIR or --random-weights CONFIG\n"); return 2; }
    /* the lengths are checked before the model loads (a typo costs no loading time); each one
     * against the model's context below */
    int lens[64], n_lens;
    if (ks_arg_int_list("--lengths", lengths, 1, INT_MAX, 1, lens, 64, &n_lens)) return 2;
    /* the JSON file must be writable before any work (written at the end) */
    if (json_path && ks_cli_check_writable("bench: --json", json_path)) return 2;
    ks_model *m;
    if (random_cfg) {
        ks_backend *be;
        if (ks_cli_backend_create(backend, &be)) return ks_cli_fail("backend");
        if (ks_model_random(random_cfg, be, 1, &m)) { ks_backend_free(be); return ks_cli_fail("cannot build random model"); }
        model = random_cfg;
    } else if (ks_cli_model_open(model, &(ks_model_opts){.backend = backend}, &m)) return ks_cli_fail("cannot load model");
    const ks_config *c = &m->cfg;
    ks_session *s;
    if (ks_session_create(m, &s)) { ks_model_close(m); return ks_cli_fail("session"); }
    /* --profile, or KS_PROFILE in the environment (already on: =sync keeps the host clock) */
    if (profile && !s->prof.on) ks_profile_enable(s, 1);
    profile = s->prof.on;
    ks_backend *be = m->be;
    ks_mem_stats ms0 = {0};
    if (be->mem_stats) be->mem_stats(be, &ms0, 1);
    printf("kvsieve bench: %s (%s, %d layers, dim %d, %zu M params) on %s, batch 1, best of %d\n", model,
           ks_arch_name(c->arch), c->n_layers, c->dim, m->n_params / 1000000, be->name, reps);
    if (be->mem_stats) printf("backend memory after loading: %.2f GiB (weights and workspaces)\n", GIB(ms0.cur));
    if (profile)
        printf("profiling on: linear_GF/s from the profile's matmul phases, TTFT/TPOT include the profiler's marks\n");
    printf("%-12s %8s %10s %12s %12s %11s %8s %10s %9s %9s\n", "policy", "tokens", "TTFT_s", "prefill_t/s", "linear_GF/s",
           "sgemm_GF/s", "linear%", "TPOT_ms", "KV_rows", "peak_GiB");
    int rc = 0, n_rows = 0, cap_rows = 0;
    bench_row *rows = NULL;
    char *plist = strdup(policies);
    char *psave = NULL;
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
        s->policy = pol;
        for (int li = 0; li < n_lens; li++) {
            int L = lens[li];
            if ((long long)L + gen > c->max_pos) { /* in 64 bits: --gen may be up to INT_MAX */
                fprintf(stderr, "kvsieve: bench: length %d (+%d generated) exceeds the model's context %d\n", L, gen, c->max_pos);
                rc = 2;
                break;
            }
            int32_t *ids = malloc(sizeof(int32_t) * L);
            uint64_t r = 99;
            for (int i = 0; i < L; i++) { r = r * 6364136223846793005ull + 1442695040888963407ull; ids[i] = (int32_t)((r >> 33) % c->vocab); }
            /* warm-up on a short prompt, then the timed runs (best of `reps`: timings here are noisy);
             * the memory peak and the profile cover the timed runs */
            ks_session_reset(s);
            ks_session_prefill(s, ids, KS_MIN(L, 16));
            ks_session_reset(s);
            ks_mem_stats ms = {0};
            if (be->mem_stats) be->mem_stats(be, &ms, 1);
            ks_profile_reset(s);
            double tp = 1e30, td = 1e30, lin_gf = 0, pf_flop = 0;
            double *tps = calloc((size_t)reps, sizeof *tps), *tds = calloc((size_t)reps, sizeof *tds);
            int n_rep = 0;
            if (!tps || !tds) { free(tps); free(tds); free(ids); rc = ks_cli_fail("bench: out of memory"); break; }
            size_t kv_rows = 0;
            ks_status st = KS_OK;
            for (int rep = 0; rep < reps && !st; rep++) {
                ks_session_reset(s);
                be->stat_matmul_s = be->stat_matmul_flop = 0;
                /* the CPU backend times its matmuls for the linear_GF/s column; a GPU backend would have
                 * to synchronise around each one (TTFT would include those stalls): there the column
                 * comes from --profile */
                be->count_stats = !profile && !strcmp(be->name, "cpu");
                double t0 = ks_now();
                st = ks_session_prefill(s, ids, L);
                double t = ks_now() - t0;
                be->count_stats = 0;
                pf_flop += be->stat_matmul_flop;
                if (st) break;
                if (t < tp) { tp = t; lin_gf = be->stat_matmul_s > 0 ? be->stat_matmul_flop / be->stat_matmul_s / 1e9 : NAN; }
                ks_sampler smp;
                ks_sampler_init(&smp, 0, 1, 0);
                double t1 = ks_now();
                for (int g = 0; g < gen && !st; g++) st = ks_session_decode(s, ks_sample(&smp, s->logits, c->vocab));
                double tdr = ks_now() - t1;
                td = fmin(td, tdr);
                if (!st) { tps[n_rep] = t; tds[n_rep] = tdr; n_rep++; }
                kv_rows = 0;
                for (int l = 0; l < c->n_layers; l++) kv_rows += ks_session_kv_rows(s, l);
            }
            free(ids);
            if (st) { free(tps); free(tds); rc = ks_cli_fail("bench"); break; }
            /* the spread over the repeats: TTFT and TPOT directly, the rates from each run's time */
            double *rate = calloc((size_t)n_rep + 1, sizeof *rate), *tpot = calloc((size_t)n_rep + 1, sizeof *tpot),
                   *drate = calloc((size_t)n_rep + 1, sizeof *drate);
            spread s_ttft = {NAN, NAN, NAN}, s_rate = s_ttft, s_tpot = s_ttft, s_drate = s_ttft;
            if (rate && tpot && drate) {
                for (int k = 0; k < n_rep; k++) {
                    rate[k] = L / tps[k];
                    tpot[k] = gen > 0 ? 1e3 * tds[k] / gen : NAN;
                    drate[k] = gen > 0 && tds[k] > 0 ? gen / tds[k] : NAN;
                }
                s_rate = spread_of(rate, n_rep);
                if (gen > 0) { s_tpot = spread_of(tpot, n_rep); s_drate = spread_of(drate, n_rep); }
                s_ttft = spread_of(tps, n_rep);
            }
            free(rate); free(tpot); free(drate); free(tps); free(tds);
            if (be->mem_stats) be->mem_stats(be, &ms, 0);
            if (profile) { /* linear rate from the matmul phases of all timed prefills */
                const double *ps = s->prof.sec[0];
                double lin_s = ps[KS_PH_QKV] + ps[KS_PH_OPROJ] + ps[KS_PH_MLP] + ps[KS_PH_LM_HEAD];
                lin_gf = lin_s > 0 ? pf_flop / lin_s / 1e9 : 0;
            }
            /* the CPU's sgemm ceiling only means something next to the CPU backend */
            double ceil = strcmp(be->name, "cpu") ? NAN : sgemm_ceiling(c, L);
            printf("%-12s %8d %10.3f %12.1f %12.1f %11.1f %7.0f%% %10.2f %9zu %9.2f\n", pn, L, tp, L / tp, lin_gf, ceil,
                   100 * lin_gf / ceil, gen > 0 ? 1e3 * td / gen : 0.0, kv_rows / ((size_t)c->n_layers * c->n_kv_heads),
                   be->mem_stats ? GIB(ms.peak) : NAN);
            fflush(stdout);
            if (n_rows == cap_rows) {
                int nc = cap_rows ? 2 * cap_rows : 8;
                bench_row *nr = realloc(rows, sizeof *nr * nc);
                if (!nr) { rc = ks_cli_fail("bench: out of memory"); break; }
                rows = nr;
                cap_rows = nc;
            }
            bench_row *br = &rows[n_rows++];
            snprintf(br->policy, sizeof br->policy, "%s", pn);
            br->tokens = L;
            br->prof = s->prof;
            br->mem = ms;
            br->pf_flop = pf_flop;
            br->kv_rows = kv_rows;
            br->ttft = s_ttft;
            br->prefill_tps = s_rate;
            br->tpot_ms = s_tpot;
            br->decode_tps = s_drate;
            br->lin_gf = lin_gf;
            br->sgemm_gf = ceil;
            ks_profile_reset(s);
        }
        s->policy = NULL;
        ks_policy_free(pol);
    }
    free(plist);
    printf("peak host memory %.1f MiB\n", ks_peak_rss() / 1048576.0);
    /* per row: what the peak was made of; the CUDA pool's own high-water marks (driver) */
    for (int i = 0; i < n_rows && be->mem_stats; i++) {
        const ks_mem_stats *q = &rows[i].mem;
        printf("memory %-12s %8d: peak %.2f GiB = fixed %.2f (weights, KV) + scratch %.2f", rows[i].policy,
               rows[i].tokens, GIB(q->peak), GIB(q->peak_fixed), GIB(q->peak_scratch));
        if (q->pool_reserved_high) printf("; pool used high %.2f, reserved high %.2f", GIB(q->pool_used_high), GIB(q->pool_reserved_high));
        printf("\n");
    }
    for (int i = 0; i < n_rows && profile; i++) {
        char title[128];
        snprintf(title, sizeof title, "%s, %d tokens", rows[i].policy, rows[i].tokens);
        ks_profile_print(&rows[i].prof, stdout, title);
    }
    if (profile && n_rows) {
        /* the ceilings are measured after the rows, so that their allocations miss the peaks */
        double gemm_tf = 0, copy_gbs = 0;
        if (be->ceilings && be->ceilings(be, &gemm_tf, &copy_gbs))
            fprintf(stderr, "kvsieve: bench: ceilings not measured: %s\n", ks_last_error());
        int elem = strcmp(be->name, "cpu") ? 2 : 4; /* bf16 weights and KV on the GPU, float32 on the CPU */
        for (int i = 0; i < n_rows; i++) print_rates(&rows[i], c, m->n_params, elem, gemm_tf, copy_gbs);
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
        fprintf(jf, "\",\n  \"arch\": \"%s\", \"n_layers\": %d, \"dim\": %d, \"n_params\": %zu,\n", ks_arch_name(c->arch),
                c->n_layers, c->dim, m->n_params);
        fprintf(jf, "  \"backend\": \"%s\", \"batch\": 1, \"repeat\": %d, \"gen\": %d, \"complete\": %s,\n", be->name, reps,
                gen, rc ? "false" : "true");
        fprintf(jf, "  \"peak_host_mib\": %.1f,\n  \"rows\": [", ks_peak_rss() / 1048576.0);
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
            fputs(", \"linear_gflops\": ", jf);
            json_num(jf, r->lin_gf);
            fputs(", \"sgemm_gflops\": ", jf);
            json_num(jf, r->sgemm_gf);
            fprintf(jf, ", \"kv_rows_per_head\": %zu", r->kv_rows / ((size_t)c->n_layers * c->n_kv_heads));
            if (be->mem_stats) {
                fputs(", \"peak_gib\": ", jf);
                json_num(jf, GIB(r->mem.peak));
                fputs(", \"peak_fixed_gib\": ", jf);
                json_num(jf, GIB(r->mem.peak_fixed));
                fputs(", \"peak_scratch_gib\": ", jf);
                json_num(jf, GIB(r->mem.peak_scratch));
            }
            fputc('}', jf);
        }
        fprintf(jf, "%s]\n}\n", n_rows ? "\n  " : "");
        int bad = ferror(jf);
        bad |= fclose(jf);
        if (bad) { fprintf(stderr, "kvsieve: bench: --json %s: write failed\n", json_path); rc = rc ? rc : 1; }
        else printf("results: %s\n", json_path);
    }
    free(rows);
    ks_session_free(s);
    ks_model_close(m);
    return rc;
}
