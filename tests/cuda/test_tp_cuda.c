/* test_tp_cuda.c — tensor parallelism on GPU ranks (core/tp_backend.h "device ranks",
 * kernels/tp_nccl.cu), end to end through the public API, greedy requests of several policies:
 *
 *   one_rank   the composite over ONE CUDA rank with NCCL (ks_tp_backend_create_dev(1, ...)) against
 *              the plain CUDA backend, both without decode graphs (the composite records none):
 *              the same kernels on the same inputs, so full attention must give bit-identical
 *              logits and ids; with a policy, ids and kept sets identical.
 *   two_ranks, four_ranks  `tp = 2` (GPUs 0, 1) and `tp = 4` (GPUs 0-3; each skipped, and counted,
 *              with fewer GPUs or KV heads that do not split) against one GPU: the
 *              generated ids identical, every kept set (as sets) identical or a near tie (same
 *              size, >= 95% overlap, counted and printed: a score that moved by rounding can
 *              swap two rows of equal rank, as tests/cuda/test_cuda_policies.c allows between
 *              device and host primitives), logits within
 *              1e-2 * (1 + max|logit|). Why that bound: the split changes the float32 summation
 *              order of the o-projection and the down projection (two partial products summed
 *              by the all-reduce instead of one GEMM's sum, and cuBLAS picks its kernels for the
 *              halved inner dimension), ~1e-6 relative; but every GEMM rounds its input rows to
 *              bf16 first, so a residual that moved by one float32 ulp can cross a bf16 rounding
 *              boundary (2^-8 relative) in a few elements, and those flips carry through the
 *              layers. The measured difference is printed.
 * Every policy case runs twice on both sides: primitives on host copies ("_device" = "host")
 * and on the device ("auto": the composite's table is rank 0's, on its whole copies).
 *
 * Models: models/kvsieve-tiny (8 layers, 8 heads / 2 KV heads) and stories260K (--stories DIR,
 * KS_STORIES, or .data/stories260K; skipped and counted when absent). Run from the repository
 * root with NCCL_NVLS_ENABLE=0 in the environment: build-cuda/test_tp_cuda [--only TEXT].
 * Prints one line per case and "N passed, N failed, N skipped"; exits 1 on a failure. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cuda_runtime_api.h>

#include "engine.h"
#include "ks_lua.h"
#include "kvsieve.h"
#include "model.h"
#include "tp_backend.h"

#define MAXL 16
#define MAXH 8
#define TOL2 1e-2

static int g_pass, g_fail, g_skip;
static const char *g_only;

static void result(int ok, const char *name, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void result(int ok, const char *name, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("  %s %s: ", ok ? "ok  " : "FAIL", name);
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    ok ? g_pass++ : g_fail++;
    fflush(stdout);
}

typedef struct run {
    ks_status st;
    char err[1024];
    int32_t ids[64];
    int n_ids;
    float *logits;
    int vocab, n_layers, n_kv;
    int kept_n[MAXL][MAXH];
    int32_t *kept[MAXL][MAXH];
} run;

static void run_free(run *r) {
    free(r->logits);
    for (int l = 0; l < MAXL; l++)
        for (int h = 0; h < MAXH; h++) free(r->kept[l][h]);
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* One greedy request of policy `name` ("full": none) with params "k=v,..." on m. */
static void run_policy(ks_model *m, const char *name, const char *params, const char *mode, const int32_t *prompt, int n,
                       int max_new, run *r) {
    memset(r, 0, sizeof *r);
    ks_policy *p = NULL;
    ks_session *s = NULL;
    if (strcmp(name, "full")) {
        r->st = ks_policy_load(m, name, &p);
        char kv[512];
        snprintf(kv, sizeof kv, "%s", params);
        for (char *save = NULL, *tok = strtok_r(kv, ",", &save); !r->st && tok; tok = strtok_r(NULL, ",", &save)) {
            char *eq = strchr(tok, '=');
            if (!eq) continue;
            *eq = 0;
            r->st = ks_policy_set(p, tok, eq + 1);
        }
        if (!r->st) r->st = ks_policy_set(p, "_device", mode);
    }
    if (!r->st) r->st = ks_session_create(m, &s);
    if (!r->st) {
        if (p) ks_session_set_policy(s, p);
        ks_generate_opts o;
        ks_generate_opts_default(&o);
        o.max_new_tokens = max_new;
        r->st = ks_generate_ids(s, prompt, n, &o, NULL, NULL);
    }
    if (r->st) snprintf(r->err, sizeof r->err, "%s", ks_last_error());
    if (!r->st) {
        const int32_t *ids = ks_result_ids(s, &r->n_ids);
        if (r->n_ids > 64) r->n_ids = 64;
        memcpy(r->ids, ids, sizeof(int32_t) * r->n_ids);
        const float *lg;
        ks_session_logits(s, &lg, &r->vocab);
        r->logits = malloc(sizeof(float) * r->vocab);
        memcpy(r->logits, lg, sizeof(float) * r->vocab);
        r->n_layers = KS_MIN(m->cfg.n_layers, MAXL);
        r->n_kv = KS_MIN(m->cfg.n_kv_heads, MAXH);
        for (int l = 0; l < r->n_layers; l++)
            for (int h = 0; h < r->n_kv; h++) {
                const int32_t *pos;
                int k = ks_result_kept(s, l, h, &pos);
                r->kept_n[l][h] = k;
                r->kept[l][h] = malloc(sizeof(int32_t) * (k + 1));
                if (k) memcpy(r->kept[l][h], pos, sizeof(int32_t) * k);
                qsort(r->kept[l][h], k, sizeof(int32_t), cmp_i32);
            }
    }
    ks_session_free(s);
    ks_policy_free(p);
}

/* |a & b| / max(|a|, |b|) of two ascending lists (1 when both are empty) */
static double overlap(const int32_t *a, int na, const int32_t *b, int nb) {
    if (na == 0 && nb == 0) return 1;
    int i = 0, j = 0, c = 0;
    while (i < na && j < nb) {
        if (a[i] == b[j]) { c++; i++; j++; }
        else if (a[i] < b[j]) i++;
        else j++;
    }
    return (double)c / (na > nb ? na : nb);
}

/* "" when ids and kept sets agree, else what differs; *maxd, *maxl: largest logit difference
 * and largest |logit|; *near: sets that differ (same size) with the smallest overlap >= 0.95 in
 * *minov (a near tie decided by a last-bit difference of a score: near_ok lets them pass). */
static int near_ok;
static const char *diff(const run *a, const run *b, double *maxd, double *maxl, int *near, double *minov) {
    static char why[256];
    *maxd = *maxl = 0;
    *near = 0;
    *minov = 1;
    for (int i = 0; i < a->vocab && a->vocab == b->vocab; i++) {
        *maxl = fmax(*maxl, fabsf(a->logits[i]));
        double d = fabsf(a->logits[i] - b->logits[i]);
        *maxd = d > *maxd || isnan(d) ? d : *maxd;
    }
    if (a->n_ids != b->n_ids || memcmp(a->ids, b->ids, sizeof(int32_t) * a->n_ids)) return "generated ids";
    for (int l = 0; l < a->n_layers; l++)
        for (int h = 0; h < a->n_kv; h++)
            if (a->kept_n[l][h] != b->kept_n[l][h] ||
                memcmp(a->kept[l][h], b->kept[l][h], sizeof(int32_t) * a->kept_n[l][h])) {
                double o = overlap(a->kept[l][h], a->kept_n[l][h], b->kept[l][h], b->kept_n[l][h]);
                *minov = fmin(*minov, o);
                if (near_ok && a->kept_n[l][h] == b->kept_n[l][h] && o >= 0.95) { (*near)++; continue; }
                snprintf(why, sizeof why, "kept set at layer %d head %d (%d vs %d rows, overlap %.3f)", l, h,
                         a->kept_n[l][h], b->kept_n[l][h], o);
                return why;
            }
    return "";
}

typedef struct pcase {
    const char *name, *params;
    int n; /* prompt tokens */
} pcase;

/* Every case on `tp` against `ref`, the policy's primitives where `mode` says ("host": host
 * copies, "auto": the device); exact: the same bits and sets are required (one rank). */
static void run_cases(const char *label, ks_model *tp, ks_model *ref, const pcase *cs, int n_cs, const int32_t *prompt,
                      int exact, const char *mode) {
    for (int c = 0; c < n_cs; c++) {
        char title[256];
        if (!strcmp(cs[c].name, "full") && strcmp(mode, "host")) continue; /* no primitives: once is enough */
        snprintf(title, sizeof title, "%s %s n=%d %s %s", label, mode, cs[c].n, cs[c].name, cs[c].params);
        if (g_only && !strstr(title, g_only)) continue;
        run a, b;
        run_policy(tp, cs[c].name, cs[c].params, mode, prompt, cs[c].n, 8, &a);
        run_policy(ref, cs[c].name, cs[c].params, mode, prompt, cs[c].n, 8, &b);
        if (a.st || b.st) {
            result(0, title, "tp: %s | reference: %s", a.st ? a.err : "ok", b.st ? b.err : "ok");
        } else {
            double maxd, maxl, minov;
            int near;
            near_ok = !exact;
            const char *why = diff(&a, &b, &maxd, &maxl, &near, &minov);
            int bits = a.vocab == b.vocab && !memcmp(a.logits, b.logits, sizeof(float) * a.vocab);
            int ok = !*why && (exact && !strcmp(cs[c].name, "full") ? bits : maxd <= TOL2 * (1 + maxl));
            char nr[96] = "";
            if (near) snprintf(nr, sizeof nr, " (%d near-tie sets, min overlap %.3f)", near, minov);
            result(ok, title, "%s%s%s; logits %s, max |d| %.3g (max |logit| %.3g)",
                   *why ? "differ: " : "ids and kept sets equal", why, nr, bits ? "bit-identical" : "differ", maxd, maxl);
        }
        run_free(&a);
        run_free(&b);
    }
}

static void make_prompt(int32_t *p, int n, int vocab, int bos, uint64_t seed) {
    uint64_t x = seed;
    p[0] = bos;
    for (int i = 1; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        p[i] = 3 + (int32_t)(x % (uint64_t)(vocab - 3));
    }
}

static ks_status open_plain(const char *dir, int tp, ks_model **out) {
    ks_model_opts o;
    ks_model_opts_default(&o);
    o.backend = "cuda";
    ks_model_tuning t;
    ks_model_tuning_default(&t);
    t.graphs = KS_OFF;
    t.tp = tp;
    return ks_model_open_tuned(dir, &o, &t, out);
}

/* The composite over one CUDA rank (no public switch makes one: tp 1 is the plain backend). */
static ks_status open_one_rank(const char *dir, ks_model **out) {
    ks_backend_opts bo = ks_backend_opts_default();
    bo.graphs = 0;
    ks_backend *be = NULL;
    ks_status st = ks_tp_backend_create_dev(1, &bo, ks_tp_nccl_ops(), &be);
    if (!st) st = ks_model_load(dir, be, 0, out);
    if (!st && (st = ks_tp_shard_model(be, *out))) { ks_model_free(*out); *out = NULL; }
    if (st) ks_backend_free(be);
    return st;
}

static void model_cases(const char *label, const char *dir, const pcase *cs, int n_cs, int gpus) {
    ks_model *plain = NULL, *one = NULL, *two = NULL;
    if (open_plain(dir, 0, &plain)) { result(0, label, "plain cuda: %s", ks_last_error()); return; }
    int32_t *prompt = malloc(sizeof(int32_t) * 2048);
    make_prompt(prompt, 2048, plain->cfg.vocab, plain->cfg.bos, 88172645463325252ull);
    char l1[128];
    snprintf(l1, sizeof l1, "one_rank %s", label);
    if (open_one_rank(dir, &one)) result(0, l1, "open: %s", ks_last_error());
    else {
        run_cases(l1, one, plain, cs, n_cs, prompt, 1, "host");
        run_cases(l1, one, plain, cs, n_cs, prompt, 1, "auto");
        ks_model_close(one);
    }
    for (int tp = 2; tp <= 4; tp += 2) { /* 2 and 4 ranks: GPUs 0 .. tp - 1 */
        char lt[128];
        snprintf(lt, sizeof lt, "%s_ranks %s", tp == 2 ? "two" : "four", label);
        if (gpus < tp) {
            printf("  skip %s: %d GPU(s)\n", lt, gpus);
            g_skip++;
            continue;
        }
        if (plain->cfg.n_kv_heads % tp) {
            printf("  skip %s: %d KV heads do not split over %d ranks\n", lt, plain->cfg.n_kv_heads, tp);
            g_skip++;
            continue;
        }
        if (open_plain(dir, tp, &two)) {
            result(0, lt, "open: %s", ks_last_error());
            continue;
        }
        run_cases(lt, two, plain, cs, n_cs, prompt, 0, "host");
        run_cases(lt, two, plain, cs, n_cs, prompt, 0, "auto");
        for (int r = 0; r < ks_model_tp_ranks(two); r++) {
            ks_model_memory mm;
            if (!ks_model_rank_memory_stats(two, r, 0, &mm))
                printf("    rank %d: %.2f MB now, peak %.2f MB\n", r, mm.cur / 1e6, mm.peak / 1e6);
        }
        ks_model_close(two);
        two = NULL;
    }
    free(prompt);
    ks_model_close(plain);
}

static int is_dir(const char *p) {
    struct stat s;
    return !stat(p, &s) && S_ISDIR(s.st_mode);
}

int main(int argc, char **argv) {
    const char *stories = getenv("KS_STORIES");
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--only") && i + 1 < argc) g_only = argv[++i];
        else if (!strcmp(argv[i], "--stories") && i + 1 < argc) stories = argv[++i];
        else { fprintf(stderr, "usage: %s [--only TEXT] [--stories DIR]\n", argv[0]); return 2; }
    }
    if (!stories && is_dir(".data/stories260K")) stories = ".data/stories260K";
    int gpus = 0;
    if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus < 1) { fprintf(stderr, "test_tp_cuda: no GPU\n"); return 2; }
    ks_lua_quiet = 1;
    static const pcase tiny[] = {
        {"full", "", 300},
        {"snapkv", "budget=64,window=8,kernel=7,pool=max", 300},
        {"gemfilter", "layer=2,k=100", 300},
        {"tokenselect", "n_init=16,n_local=480,k=64,cache_theta=0.9", 1100},
        {"full", "", 1100},
    };
    model_cases("kvsieve-tiny", "models/kvsieve-tiny", tiny, (int)(sizeof tiny / sizeof *tiny), gpus);
    static const pcase st[] = {
        {"full", "", 400},
        {"snapkv", "budget=48,window=8,kernel=7,pool=max", 400},
        {"gemfilter", "layer=1,k=64", 400},
        {"tokenselect", "n_init=8,n_local=350,k=32", 380},
    };
    if (!stories) {
        printf("  skip stories260K: no folder (--stories DIR or KS_STORIES)\n");
        g_skip++;
    } else {
        model_cases("stories260K", stories, st, (int)(sizeof st / sizeof *st), gpus);
    }
    printf("%d passed, %d failed, %d skipped\n", g_pass, g_fail, g_skip);
    return g_fail ? 1 : 0;
}
