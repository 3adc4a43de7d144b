/* test_prims.c — the CPU policy primitives (core/prims.c) against plain reference loops
 * written differently: dense matrices in double for scores, direct windows for pooling,
 * full stable sorts for top-k / rank, and so on. Random inputs are never zero. */
#include "common.h"
#include "config.h"
#include "ktest.h"
#include "prims.h"

#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- helpers */

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static void rng_seed(uint64_t s) { g_rng = s * 0x9e3779b97f4a7c15ull + 1; }
static uint64_t rng_u64(void) { /* xorshift64* */
    g_rng ^= g_rng >> 12;
    g_rng ^= g_rng << 25;
    g_rng ^= g_rng >> 27;
    return g_rng * 0x2545f4914f6cdd1dull;
}
static int64_t rng_int(int64_t lo, int64_t hi) { return lo + (int64_t)(rng_u64() % (uint64_t)(hi - lo + 1)); }
static double rng_unit(void) { return (double)(rng_u64() >> 11) / 9007199254740992.0; }
/* uniform magnitude in [0.05, 1] with a random sign: never zero */
static float rng_val(void) { float v = (float)(0.05 + 0.95 * rng_unit()); return (rng_u64() & 1) ? v : -v; }
static void fill(float *x, int64_t n, float amp) { for (int64_t i = 0; i < n; i++) x[i] = amp * rng_val(); }

static int err_has(const char *s) { return strstr(ks_last_error(), s) != NULL; }

/* a < b in the primitives' float order: NaN lowest, -0 == +0 */
static int ref_less(float a, float b) {
    if (isnan(a)) return !isnan(b);
    if (isnan(b)) return 0;
    return a < b;
}

static const float *g_cmp_x;
static int cmp_desc(const void *pa, const void *pb) { /* value descending, index ascending */
    int32_t a = *(const int32_t *)pa, b = *(const int32_t *)pb;
    if (ref_less(g_cmp_x[b], g_cmp_x[a])) return -1;
    if (ref_less(g_cmp_x[a], g_cmp_x[b])) return 1;
    return (a > b) - (a < b);
}
static int cmp_asc(const void *pa, const void *pb) { /* value ascending, index ascending */
    int32_t a = *(const int32_t *)pa, b = *(const int32_t *)pb;
    if (ref_less(g_cmp_x[a], g_cmp_x[b])) return -1;
    if (ref_less(g_cmp_x[b], g_cmp_x[a])) return 1;
    return (a > b) - (a < b);
}
static int cmp_i32(const void *pa, const void *pb) {
    int32_t a = *(const int32_t *)pa, b = *(const int32_t *)pb;
    return (a > b) - (a < b);
}
/* the stable order of x as an index permutation (qsort with an index tie-break) */
static void ref_order(const float *x, int64_t n, int desc, int32_t *idx) {
    for (int64_t i = 0; i < n; i++) idx[i] = (int32_t)i;
    g_cmp_x = x;
    qsort(idx, (size_t)n, sizeof *idx, desc ? cmp_desc : cmp_asc);
}

static int same_bits(float a, float b) { return memcmp(&a, &b, sizeof a) == 0; }

/* ---------------------------------------------------------------- scores */

typedef struct {
    int64_t hq, hkv, m, n, d;
    int layout_q, layout_k; /* 0 contiguous, 1 token-major, 2 padded rows (k: a capacity) */
    int explicit_kpos, explicit_qpos;
} scores_case;

/* Dense reference: materialise s[h][i][j] in double, then reduce. ref_abs gets, per output,
 * the sum of |terms| (a scale for the tolerance). */
static void scores_ref(const scores_case *sc, const float *q, int64_t qhs, int64_t qrs, const int32_t *qpos,
                       const float *k, int64_t khs, int64_t krs, const int32_t *kpos, const ks_scores_opts *o,
                       double *ref, double *ref_abs, int64_t *rows_out, int64_t *cols_out) {
    int64_t hq = sc->hq, hkv = sc->hkv, m = sc->m, n = sc->n, d = sc->d, g = hq / hkv;
    int64_t kb = o->k_begin, ke = o->k_end == KS_END ? n : o->k_end;
    int64_t ob = o->out_begin, oe = o->out_end == KS_END ? n : o->out_end, nc = oe - ob;
    double scale = o->scale_mode == KS_SCALE_RSQRT_D ? 1.0 / sqrt((double)d) : o->scale_mode == KS_SCALE_ONE ? 1.0 : o->scale;
    double *s = calloc((size_t)(hq * m * n), sizeof *s), *sa = calloc((size_t)(hq * m * n), sizeof *sa);
    unsigned char *vis = calloc((size_t)(m * n), 1);
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            int64_t kp = kpos ? kpos[j] : j;
            int64_t qp = qpos ? qpos[i] : (kpos ? kpos[n - m + i] : n - m + i);
            vis[i * n + j] = j >= kb && j < ke && (!o->causal || kp <= qp);
        }
    for (int64_t h = 0; h < hq; h++) {
        int64_t kv = o->gqa == KS_GQA_DIV ? h / g : h % hkv;
        for (int64_t i = 0; i < m; i++) {
            double *row = s + (h * m + i) * n, *arow = sa + (h * m + i) * n;
            double mx = -INFINITY;
            for (int64_t j = 0; j < n; j++) {
                if (!vis[i * n + j]) continue;
                double dot = 0, adot = 0;
                for (int64_t e = 0; e < d; e++) {
                    double t = (double)q[h * qhs + i * qrs + e] * (double)k[kv * khs + j * krs + e];
                    dot += t;
                    adot += fabs(t);
                }
                row[j] = dot * scale;
                arow[j] = adot * fabs(scale);
                if (row[j] > mx) mx = row[j];
            }
            if (!o->softmax) continue;
            double z = 0;
            for (int64_t j = 0; j < n; j++)
                if (vis[i * n + j]) z += exp(row[j] - mx);
            for (int64_t j = 0; j < n; j++) {
                row[j] = vis[i * n + j] ? exp(row[j] - mx) / z : 0.0;
                arow[j] = row[j] * (1.0 + arow[j]); /* logit error scales the probability */
            }
        }
    }
    int64_t rows = o->heads == KS_HEADS_NONE ? hq : o->heads == KS_HEADS_GROUP_SUM ? hkv : 1;
    memset(ref, 0, (size_t)(rows * nc) * sizeof *ref);
    memset(ref_abs, 0, (size_t)(rows * nc) * sizeof *ref_abs);
    for (int64_t h = 0; h < hq; h++) {
        int64_t kv = o->gqa == KS_GQA_DIV ? h / g : h % hkv;
        int64_t r = o->heads == KS_HEADS_NONE ? h : o->heads == KS_HEADS_GROUP_SUM ? kv : 0;
        double f = o->heads == KS_HEADS_MEAN ? 1.0 / (double)hq : 1.0;
        for (int64_t i = 0; i < m; i++)
            for (int64_t c = 0; c < nc; c++) {
                ref[r * nc + c] += f * s[(h * m + i) * n + ob + c];
                ref_abs[r * nc + c] += f * sa[(h * m + i) * n + ob + c];
            }
    }
    *rows_out = rows;
    *cols_out = nc;
    free(s);
    free(sa);
    free(vis);
}

/* One random scores case (shape + random options) against the dense reference, for two
 * thread counts that must agree bit for bit. Returns 0 on success, prints on failure. */
static int scores_one(const scores_case *sc, int verbose_id) {
    int64_t hq = sc->hq, hkv = sc->hkv, m = sc->m, n = sc->n, d = sc->d;
    ks_scores_opts o = ks_scores_opts_default();
    o.causal = (int)rng_int(0, 1);
    o.softmax = (int)rng_int(0, 1);
    o.scale_mode = (ks_scale_mode)rng_int(0, 2);
    o.scale = 0.3f;
    o.heads = (ks_head_reduce)rng_int(0, 3);
    o.gqa = (ks_gqa_map)rng_int(0, 1);
    if (rng_int(0, 2) == 0) { o.k_begin = rng_int(0, n); o.k_end = rng_int(o.k_begin, n); }
    if (rng_int(0, 2) == 0) { o.out_begin = rng_int(0, n); o.out_end = rng_int(o.out_begin, n); }
    /* layouts: q buffer always allocated token-major-sized with padding; strides select */
    int64_t qpad = sc->layout_q == 2 ? 5 : 0, kcap = sc->layout_k == 2 ? n + 3 : n;
    int64_t qhs = m * (d + qpad), qrs = d + qpad;
    if (sc->layout_q == 1) { qhs = d; qrs = hq * d; }
    int64_t khs = kcap * d, krs = d;
    if (sc->layout_k == 1) { khs = d; krs = hkv * d; }
    if (sc->layout_q) { o.q_head_stride = qhs; o.q_row_stride = qrs; }
    if (sc->layout_k) { o.k_head_stride = khs; o.k_row_stride = krs; }
    int64_t qlen = hq * m * (d + qpad), klen = hkv * kcap * d;
    float *q = malloc((size_t)qlen * sizeof *q), *k = malloc((size_t)klen * sizeof *k);
    fill(q, qlen, 1.0f);
    fill(k, klen, 1.0f);
    int32_t *kpos = NULL, *qpos = NULL;
    if (sc->explicit_kpos) { /* increasing with gaps */
        kpos = malloc((size_t)n * sizeof *kpos);
        int32_t p = (int32_t)rng_int(0, 3);
        for (int64_t j = 0; j < n; j++) { kpos[j] = p; p += (int32_t)rng_int(1, 3); }
    }
    if (sc->explicit_qpos) {
        qpos = malloc((size_t)m * sizeof *qpos);
        int32_t top = kpos ? kpos[n - 1] : (int32_t)n - 1;
        for (int64_t i = 0; i < m; i++) qpos[i] = (int32_t)rng_int(-1, top + 1);
    }
    int64_t rows = 0, cols = 0;
    ks_status st = ks_scores_out_shape(&o, hq, hkv, n, &rows, &cols);
    double *ref = malloc((size_t)(hq * (cols + 1)) * sizeof *ref), *rabs = malloc((size_t)(hq * (cols + 1)) * sizeof *rabs);
    float *out1 = malloc((size_t)(rows * cols + 1) * sizeof *out1), *out2 = malloc((size_t)(rows * cols + 1) * sizeof *out2);
    int bad = 0;
    if (st) { fprintf(stderr, "shape: %s\n", ks_last_error()); bad = 1; goto done; }
    int64_t rr, cc;
    scores_ref(sc, q, qhs, qrs, qpos, k, khs, krs, kpos, &o, ref, rabs, &rr, &cc);
    if (rr != rows || cc != cols) { fprintf(stderr, "shape %lld x %lld\n", (long long)rows, (long long)cols); bad = 1; goto done; }
    o.n_threads = 1;
    st = ks_cpu_scores(q, qpos, hq, m, k, kpos, hkv, n, d, &o, out1);
    o.n_threads = 3;
    if (!st) st = ks_cpu_scores(q, qpos, hq, m, k, kpos, hkv, n, d, &o, out2);
    if (st) { fprintf(stderr, "scores: %s\n", ks_last_error()); bad = 1; goto done; }
    if (rows * cols > 0 && memcmp(out1, out2, (size_t)(rows * cols) * sizeof *out1)) {
        fprintf(stderr, "case %d: result depends on n_threads\n", verbose_id);
        bad = 1;
        goto done;
    }
    for (int64_t x = 0; x < rows * cols; x++) {
        double tol = 2e-5 * rabs[x] + 1e-6;
        if (!(fabs((double)out1[x] - ref[x]) <= tol)) {
            fprintf(stderr,
                    "case %d: H=%lld Hkv=%lld m=%lld n=%lld d=%lld causal=%d softmax=%d scale=%d heads=%d gqa=%d "
                    "dom=[%lld,%lld) out=[%lld,%lld) lq=%d lk=%d kpos=%d qpos=%d: out[%lld] = %.9g, ref %.9g\n",
                    verbose_id, (long long)hq, (long long)hkv, (long long)m, (long long)n, (long long)d, o.causal,
                    o.softmax, o.scale_mode, o.heads, o.gqa, (long long)o.k_begin, (long long)o.k_end,
                    (long long)o.out_begin, (long long)o.out_end, sc->layout_q, sc->layout_k, sc->explicit_kpos,
                    sc->explicit_qpos, (long long)x, (double)out1[x], ref[x]);
            bad = 1;
            goto done;
        }
    }
done:
    free(q); free(k); free(kpos); free(qpos); free(ref); free(rabs); free(out1); free(out2);
    return bad;
}

KT_TEST(prims_scores_vs_dense) {
    rng_seed(1);
    static const int64_t heads[][2] = {{1, 1}, {4, 1}, {8, 1}, {8, 2}, {4, 4}, {16, 2}, {32, 8}};
    static const int64_t dims[] = {8, 64, 128, 3, 13};
    static const int64_t ns[] = {1, 2, 7, 33, 130};
    int id = 0;
    for (size_t hi = 0; hi < sizeof heads / sizeof heads[0]; hi++)
        for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++)
            for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++)
                for (int rep = 0; rep < 3; rep++) {
                    scores_case sc = {heads[hi][0], heads[hi][1], 0, ns[ni], dims[di], 0, 0, 0, 0};
                    sc.explicit_qpos = (int)rng_int(0, 1);
                    int64_t mmax = sc.explicit_qpos ? 20 : sc.n; /* implicit causal positions need m <= n */
                    sc.m = rng_int(1, KS_MIN(mmax, (int64_t)20));
                    if (rep == 0) sc.m = KS_MIN(mmax, (int64_t)9); /* more than one query tile */
                    sc.layout_q = (int)rng_int(0, 2);
                    sc.layout_k = (int)rng_int(0, 2);
                    sc.explicit_kpos = (int)rng_int(0, 1);
                    KT_CHECK(scores_one(&sc, id) == 0, "scores case %d", id);
                    id++;
                }
}

/* The recipes of prims.h, each against its own literal reference. */
KT_TEST(prims_scores_snapkv_recipe) {
    rng_seed(2);
    const int64_t H = 8, Hkv = 2, n = 61, w = 8, d = 16, g = H / Hkv;
    float *q = malloc(H * w * d * sizeof *q), *k = malloc(Hkv * n * d * sizeof *k);
    fill(q, H * w * d, 1.0f);
    fill(k, Hkv * n * d, 1.0f);
    ks_scores_opts o = ks_scores_opts_default();
    o.causal = 1;
    o.softmax = 1;
    o.out_end = n - w;
    o.heads = KS_HEADS_GROUP_SUM;
    float out[2 * 61], outh[8 * 61];
    KT_CHECK(ks_cpu_scores(q, NULL, H, w, k, NULL, Hkv, n, d, &o, out) == KS_OK, "%s", ks_last_error());
    o.heads = KS_HEADS_NONE;
    KT_CHECK(ks_cpu_scores(q, NULL, H, w, k, NULL, Hkv, n, d, &o, outh) == KS_OK, "%s", ks_last_error());
    /* SnapKV's code: attn = softmax(q_win K^T / sqrt(d) + window causal mask) over all n keys,
     * then attn[..., :-w].sum(window), summed over each group of g query heads. */
    for (int64_t kv = 0; kv < Hkv; kv++)
        for (int64_t j = 0; j < n - w; j++) {
            double grp = 0;
            for (int64_t hh = 0; hh < g; hh++) {
                int64_t h = kv * g + hh;
                double col = 0;
                for (int64_t i = 0; i < w; i++) {
                    double lg[61], mx = -1e300, z = 0;
                    for (int64_t jj = 0; jj < n; jj++) {
                        double t = 0;
                        for (int64_t e = 0; e < d; e++) t += (double)q[(h * w + i) * d + e] * k[(kv * n + jj) * d + e];
                        lg[jj] = jj > n - w + i ? -INFINITY : t / sqrt((double)d);
                        if (lg[jj] > mx) mx = lg[jj];
                    }
                    for (int64_t jj = 0; jj < n; jj++) z += exp(lg[jj] - mx);
                    col += exp(lg[j] - mx) / z;
                }
                KT_CHECK(KT_NEAR(outh[h * (n - w) + j], col, 1e-5), "per-head h=%lld j=%lld %g vs %g", (long long)h,
                         (long long)j, (double)outh[h * (n - w) + j], col);
                grp += col;
            }
            KT_CHECK(KT_NEAR(out[kv * (n - w) + j], grp, 1e-5), "group kv=%lld j=%lld %g vs %g", (long long)kv,
                     (long long)j, (double)out[kv * (n - w) + j], grp);
        }
    free(q);
    free(k);
}

KT_TEST(prims_scores_gemfilter_tokenselect_recipes) {
    rng_seed(3);
    const int64_t H = 8, Hkv = 2, n = 50, d = 32, g = H / Hkv, n_init = 4, n_local = 10;
    float q[8 * 32], k[2 * 50 * 32], gem[50], ts[50], tsmod[50];
    fill(q, H * d, 1.0f);
    fill(k, Hkv * n * d, 1.0f);
    ks_scores_opts o = ks_scores_opts_default();
    o.scale_mode = KS_SCALE_ONE;
    o.heads = KS_HEADS_SUM;
    KT_CHECK(ks_cpu_scores(q, NULL, H, 1, k, NULL, Hkv, n, d, &o, gem) == KS_OK, "%s", ks_last_error());
    for (int64_t j = 0; j < n; j++) { /* GemFilter: sum_h q_last[h] . K[h/g][j], raw */
        double s = 0;
        for (int64_t h = 0; h < H; h++)
            for (int64_t e = 0; e < d; e++) s += (double)q[h * d + e] * k[((h / g) * n + j) * d + e];
        KT_CHECK(KT_NEAR(gem[j], s, 1e-4), "gemfilter j=%lld %g vs %g", (long long)j, (double)gem[j], s);
    }
    o.softmax = 1;
    o.k_begin = o.out_begin = n_init;
    o.k_end = o.out_end = n - n_local;
    KT_CHECK(ks_cpu_scores(q, NULL, H, 1, k, NULL, Hkv, n, d, &o, ts) == KS_OK, "%s", ks_last_error());
    o.gqa = KS_GQA_MOD;
    KT_CHECK(ks_cpu_scores(q, NULL, H, 1, k, NULL, Hkv, n, d, &o, tsmod) == KS_OK, "%s", ks_last_error());
    const int64_t nc = n - n_local - n_init;
    for (int mode = 0; mode < 2; mode++) { /* TokenSelect: per-head softmax over candidates, head vote */
        double acc[50] = {0}, total = 0;
        for (int64_t h = 0; h < H; h++) {
            int64_t kv = mode ? h % Hkv : h / g;
            double lg[50], mx = -1e300, z = 0;
            for (int64_t c = 0; c < nc; c++) {
                double t = 0;
                for (int64_t e = 0; e < d; e++) t += (double)q[h * d + e] * k[(kv * n + n_init + c) * d + e];
                lg[c] = t;
                if (t > mx) mx = t;
            }
            for (int64_t c = 0; c < nc; c++) z += exp(lg[c] - mx);
            for (int64_t c = 0; c < nc; c++) acc[c] += exp(lg[c] - mx) / z;
        }
        for (int64_t c = 0; c < nc; c++) {
            float got = mode ? tsmod[c] : ts[c];
            KT_CHECK(KT_NEAR(got, acc[c], 1e-5), "tokenselect mode %d c=%lld %g vs %g", mode, (long long)c, (double)got,
                     acc[c]);
            total += got;
        }
        KT_CHECK(KT_NEAR(total, (double)H, 1e-4), "head vote sums to H: %g", total);
    }
    int differ = 0;
    for (int64_t c = 0; c < nc; c++) differ |= ts[c] != tsmod[c];
    KT_CHECK(differ, "the h %% Hkv mapping should change the scores");
}

/* skip (a device decision's branch): a nonzero mask gives zeros and reads no query or key (NaN
 * inputs leave no trace), a zero mask gives the bits of no mask, the arguments are checked either
 * way; the NaN mask counts as nonzero */
KT_TEST(prims_scores_skip) {
    rng_seed(5);
    const int64_t H = 4, Hkv = 2, n = 40, d = 16;
    float q[4 * 16], k[2 * 40 * 16], ref[40], got[40], nanq[4 * 16];
    fill(q, H * d, 1.0f);
    fill(k, Hkv * n * d, 1.0f);
    for (int i = 0; i < H * d; i++) nanq[i] = NAN;
    ks_scores_opts o = ks_scores_opts_default();
    o.scale_mode = KS_SCALE_ONE;
    o.softmax = 1;
    o.heads = KS_HEADS_SUM;
    o.k_begin = o.out_begin = 4;
    o.k_end = o.out_end = 30;
    KT_CHECK(ks_cpu_scores(q, NULL, H, 1, k, NULL, Hkv, n, d, &o, ref) == KS_OK, "%s", ks_last_error());
    float zero = 0.0f, one = 1.0f, nan = NAN;
    o.skip = &zero;
    KT_CHECK(ks_cpu_scores(q, NULL, H, 1, k, NULL, Hkv, n, d, &o, got) == KS_OK && !memcmp(got, ref, sizeof(float) * 26),
             "a zero mask changed the scores");
    const float *masks[2] = {&one, &nan};
    for (int i = 0; i < 2; i++) {
        for (int j = 0; j < 40; j++) got[j] = 7.0f;
        o.skip = masks[i];
        KT_CHECK(ks_cpu_scores(nanq, NULL, H, 1, k, NULL, Hkv, n, d, &o, got) == KS_OK, "%s", ks_last_error());
        int zeros = 1;
        for (int j = 0; j < 26; j++) zeros &= got[j] == 0.0f && !signbit(got[j]);
        KT_CHECK(zeros && got[26] == 7.0f, "mask %d: skipped scores are not 26 zeros", i);
    }
    o.skip = &one;
    o.k_end = 41;
    KT_CHECK(ks_cpu_scores(q, NULL, H, 1, k, NULL, Hkv, n, d, &o, got) == KS_ERR_ARG, "a bad domain passed under skip");
}

/* ge and where: ge compares the float widened to double (0.1f >= 0.1 but not >= 0.10000001, where
 * a float comparison would say yes), NaN is 0; where copies bits (a NaN payload, -0.0) by one mask
 * value or one each, may write over a, and refuses a mask of another length */
KT_TEST(prims_ge_where_masks) {
    float x[6] = {0.1f, -1.0f, NAN, INFINITY, 2.0f, -0.0f}, m[6];
    KT_CHECK(ks_cpu_ge(x, 6, 0.1, m) == KS_OK, "%s", ks_last_error());
    const float want[6] = {1, 0, 0, 1, 1, 0};
    KT_CHECK(!memcmp(m, want, sizeof want), "ge 0.1: %g %g %g %g %g %g", m[0], m[1], m[2], m[3], m[4], m[5]);
    KT_CHECK(ks_cpu_ge(x, 6, 0.10000001, m) == KS_OK && m[0] == 0.0f && m[4] == 1.0f, "ge in double");
    KT_CHECK(ks_cpu_ge(x, 6, -INFINITY, m) == KS_OK && m[2] == 0.0f && m[1] == 1.0f, "NaN is never >=");
    KT_CHECK(ks_cpu_ge(x, 6, NAN, m) == KS_OK && m[0] == 0.0f && m[3] == 0.0f, "nothing is >= NaN");
    uint32_t a[4] = {1, 0x7fc00123u, 0x80000000u, 4}, b[4] = {5, 6, 7, 8}, o[4];
    float one = 1.0f, zero = 0.0f, per[4] = {0.0f, 1.0f, NAN, -0.0f};
    KT_CHECK(ks_cpu_where(&one, 1, a, b, 4, o) == KS_OK && !memcmp(o, a, sizeof a), "where 1 -> a");
    KT_CHECK(ks_cpu_where(&zero, 1, a, b, 4, o) == KS_OK && !memcmp(o, b, sizeof b), "where 0 -> b");
    KT_CHECK(ks_cpu_where(per, 4, a, b, 4, o) == KS_OK && o[0] == 5 && o[1] == 0x7fc00123u && o[2] == 0x80000000u && o[3] == 8,
             "where per element: %u %u %u %u", o[0], o[1], o[2], o[3]);
    KT_CHECK(ks_cpu_where(&zero, 1, a, b, 4, a) == KS_OK && !memcmp(a, b, sizeof b), "where into a");
    KT_CHECK(ks_cpu_where(per, 3, a, b, 4, o) == KS_ERR_ARG && strstr(ks_last_error(), "where: the mask has 3 entries for 4"),
             "%s", ks_last_error());
    KT_CHECK(ks_cpu_where(&one, 1, NULL, b, 4, o) == KS_ERR_ARG && strstr(ks_last_error(), "where: a is NULL"), "%s", ks_last_error());
    KT_CHECK(ks_cpu_ge(x, -1, 0.0, m) == KS_ERR_ARG && strstr(ks_last_error(), "ge: n = -1"), "%s", ks_last_error());
    KT_CHECK(ks_cpu_where(&one, 1, a, b, 0, o) == KS_OK, "empty where");
    /* topk under a mask: the top k of zeros (base .. base + k - 1, values 0) without reading x
     * (NaN rows here), checked arguments, and ks_cpu_topk's bits under a zero mask */
    float xs[2 * 5] = {NAN, NAN, NAN, NAN, NAN, 1, 5, 2, 4, 3}, v[6], vr[6];
    int32_t ix[6], ir[6];
    KT_CHECK(ks_cpu_topk_masked(&one, xs, 2, 5, 3, 10, KS_TOPK_BY_VALUE, ix, v) == KS_OK, "%s", ks_last_error());
    KT_CHECK(ix[0] == 10 && ix[2] == 12 && ix[3] == 10 && ix[5] == 12 && v[0] == 0 && v[5] == 0, "skipped topk: %d %d %d", ix[0],
             ix[2], ix[5]);
    KT_CHECK(ks_cpu_topk_masked(&zero, xs, 2, 5, 3, 10, KS_TOPK_BY_INDEX, ix, v) == KS_OK &&
                 ks_cpu_topk(xs, 2, 5, 3, 10, KS_TOPK_BY_INDEX, ir, vr) == KS_OK && !memcmp(ix, ir, sizeof ix) &&
                 !memcmp(v, vr, sizeof v),
             "a zero mask changed topk");
    KT_CHECK(ks_cpu_topk_masked(&one, xs, 2, 5, 6, 0, KS_TOPK_BY_INDEX, ix, NULL) == KS_ERR_ARG &&
                 strstr(ks_last_error(), "topk: k = 6 > n = 5"),
             "%s", ks_last_error());
}

/* q_rope_inv: the queries rotated first (rotate-half pairs, float32 angle pos * inv[k], cos and
 * sin times af, each product rounded; written out here from that definition) give the same bits
 * as scores of queries rotated by hand; token-major strided queries, two query rows; the bad
 * rotations are refused */
KT_TEST(prims_scores_query_rope_rotates_first) {
    rng_seed(12);
    const int64_t H = 8, Hkv = 2, m = 2, n = 300, d = 64, half = d / 2;
    float *q = malloc(m * H * d * sizeof *q), *qr = malloc(H * m * d * sizeof *qr), *k = malloc(Hkv * n * d * sizeof *k);
    float inv[32], a[250], b[250];
    fill(q, m * H * d, 1.0f);
    fill(k, Hkv * n * d, 1.0f);
    ks_rope r = {.type = KS_ROPE_DEFAULT, .head_dim = (int)d, .theta = 500000.0, .factor = 1, .attn_factor = 1};
    ks_rope_inv_freq(&r, 4096, inv);
    const float afs[2] = {1.0f, 0.83f};
    const int32_t poss[2] = {512, 3};
    for (int t = 0; t < 2; t++) {
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < m; i++)
                for (int64_t e = 0; e < half; e++) {
                    float ang = (float)poss[t] * inv[e], c = cosf(ang) * afs[t], sn = sinf(ang) * afs[t];
                    float x0 = q[(i * H + h) * d + e], x1 = q[(i * H + h) * d + e + half];
                    qr[(h * m + i) * d + e] = x0 * c - x1 * sn;
                    qr[(h * m + i) * d + e + half] = x1 * c + x0 * sn;
                }
        ks_scores_opts o = ks_scores_opts_default();
        o.scale_mode = KS_SCALE_ONE;
        o.softmax = 1;
        o.heads = KS_HEADS_SUM;
        o.k_begin = o.out_begin = 20;
        o.k_end = o.out_end = 270;
        KT_CHECK(ks_cpu_scores(qr, NULL, H, m, k, NULL, Hkv, n, d, &o, a) == KS_OK, "%s", ks_last_error());
        o.q_head_stride = d;
        o.q_row_stride = H * d;
        o.q_rope_inv = inv;
        o.q_rope_af = afs[t];
        o.q_rope_pos = poss[t];
        KT_CHECK(ks_cpu_scores(q, NULL, H, m, k, NULL, Hkv, n, d, &o, b) == KS_OK, "%s", ks_last_error());
        int same = 1;
        for (int j = 0; j < 250; j++) same &= same_bits(a[j], b[j]);
        KT_CHECK(same, "position %d factor %g: scores with the rotation differ from scores of rotated queries", poss[t],
                 (double)afs[t]);
    }
    ks_scores_opts o = ks_scores_opts_default();
    o.q_rope_inv = inv;
    o.q_rope_af = 1;
    KT_CHECK(ks_cpu_scores(q, NULL, H, 1, k, NULL, Hkv, n / 2, d - 1, &o, a) == KS_ERR_ARG, "an odd d is refused");
    KT_CHECK(strstr(ks_last_error(), "even d") != NULL, "%s", ks_last_error());
    o.q_rope_pos = -1;
    KT_CHECK(ks_cpu_scores(q, NULL, H, 1, k, NULL, Hkv, n, d, &o, a) == KS_ERR_ARG, "a negative position is refused");
    o.q_rope_pos = 0;
    o.q_rope_af = NAN;
    KT_CHECK(ks_cpu_scores(q, NULL, H, 1, k, NULL, Hkv, n, d, &o, a) == KS_ERR_ARG, "a NaN factor is refused");
    free(q); free(qr); free(k);
}

KT_TEST(prims_scores_threads_large) {
    rng_seed(4);
    const int64_t H = 8, Hkv = 2, n = 3001, w = 32, d = 64;
    float *q = malloc(H * w * d * sizeof *q), *k = malloc(Hkv * n * d * sizeof *k);
    float *a = malloc(Hkv * n * sizeof *a), *b = malloc(Hkv * n * sizeof *b);
    fill(q, H * w * d, 1.0f);
    fill(k, Hkv * n * d, 1.0f);
    ks_scores_opts o = ks_scores_opts_default();
    o.causal = o.softmax = 1;
    o.heads = KS_HEADS_GROUP_SUM;
    o.n_threads = 1;
    double t0 = ks_now();
    KT_CHECK(ks_cpu_scores(q, NULL, H, w, k, NULL, Hkv, n, d, &o, a) == KS_OK, "%s", ks_last_error());
    double t1 = ks_now();
    o.n_threads = 0; /* automatic */
    KT_CHECK(ks_cpu_scores(q, NULL, H, w, k, NULL, Hkv, n, d, &o, b) == KS_OK, "%s", ks_last_error());
    double t2 = ks_now();
    KT_CHECK(memcmp(a, b, Hkv * n * sizeof *a) == 0, "thread count changed the result");
    /* every query row's probabilities sum to 1, so the whole output sums to H * w */
    double s = 0;
    for (int64_t x = 0; x < Hkv * n; x++) s += a[x];
    KT_CHECK(KT_NEAR(s, (double)(H * w), 1e-3), "mass %g", s);
    fprintf(stderr, "[scores H=8 w=32 n=3001 d=64: 1 thread %.1f ms, auto %.1f ms] ", 1e3 * (t1 - t0), 1e3 * (t2 - t1));
    free(q); free(k); free(a); free(b);
}

KT_TEST(prims_scores_edges) {
    rng_seed(5);
    float q[4 * 8], k[2 * 8], out[16];
    fill(q, 32, 1.0f);
    fill(k, 16, 1.0f);
    ks_scores_opts o = ks_scores_opts_default();
    /* m = 0: all zeros */
    for (int i = 0; i < 16; i++) out[i] = 7;
    KT_CHECK(ks_cpu_scores(q, NULL, 1, 0, k, NULL, 1, 2, 8, &o, out) == KS_OK, "%s", ks_last_error());
    KT_CHECK(out[0] == 0 && out[1] == 0, "m = 0 gives zeros");
    /* empty domain: zeros, no NaN, softmax too */
    o.softmax = 1;
    o.k_begin = o.k_end = 1;
    KT_CHECK(ks_cpu_scores(q, NULL, 1, 1, k, NULL, 1, 2, 8, &o, out) == KS_OK, "%s", ks_last_error());
    KT_CHECK(out[0] == 0 && out[1] == 0, "empty domain gives zeros");
    /* a query that sees no key (qpos before every key) adds nothing */
    o = ks_scores_opts_default();
    o.softmax = o.causal = 1;
    int32_t qp = -1;
    KT_CHECK(ks_cpu_scores(q, &qp, 1, 1, k, NULL, 1, 2, 8, &o, out) == KS_OK, "%s", ks_last_error());
    KT_CHECK(out[0] == 0 && out[1] == 0, "blind query gives zeros");
    /* n = 0 with an empty output */
    KT_CHECK(ks_cpu_scores(q, NULL, 1, 1, NULL, NULL, 1, 0, 8, NULL, NULL) == KS_OK, "%s", ks_last_error());
    int64_t r, c;
    o = ks_scores_opts_default();
    o.heads = KS_HEADS_GROUP_SUM;
    o.out_begin = 3;
    KT_CHECK(ks_scores_out_shape(&o, 8, 2, 10, &r, &c) == KS_OK && r == 2 && c == 7, "shape %lld x %lld", (long long)r,
             (long long)c);
}

/* ---------------------------------------------------------------- pool1d */

static void pool_ref(const float *x, int64_t n, int64_t kernel, ks_pool_mode mode, double *y) {
    int64_t r = kernel / 2;
    for (int64_t i = 0; i < n; i++) {
        double s = 0, mx = -INFINITY;
        int nan = 0;
        for (int64_t t = i - r; t <= i + r; t++) {
            double v = (t < 0 || t >= n) ? (mode == KS_POOL_AVG ? 0.0 : -INFINITY) : (double)x[t];
            if (isnan(v)) nan = 1;
            s += v;
            if (v > mx) mx = v;
        }
        y[i] = nan ? NAN : mode == KS_POOL_AVG ? s / (double)kernel : mx;
    }
}

KT_TEST(prims_pool1d_vs_direct) {
    rng_seed(6);
    static const int64_t ns[] = {1, 2, 3, 4, 5, 6, 7, 8, 11, 20, 64, 257};
    static const int64_t ks[] = {1, 3, 5, 7, 9, 13, 21, 41};
    float x[3 * 257], y[3 * 257], yi[3 * 257];
    double ref[257];
    for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++)
        for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++)
            for (int mode = 0; mode < 2; mode++)
                for (int quant = 0; quant < 2; quant++) {
                    int64_t n = ns[ni], kn = ks[ki], rows = 3;
                    fill(x, rows * n, 2.0f);
                    if (quant) /* plateaus, as in max-pooled scores */
                        for (int64_t i = 0; i < rows * n; i++) x[i] = (float)floor(x[i] * 2) + 0.5f;
                    memcpy(yi, x, rows * n * sizeof *x);
                    KT_CHECK(ks_cpu_pool1d(x, rows, n, kn, (ks_pool_mode)mode, y) == KS_OK, "%s", ks_last_error());
                    KT_CHECK(ks_cpu_pool1d(yi, rows, n, kn, (ks_pool_mode)mode, yi) == KS_OK, "in place: %s", ks_last_error());
                    for (int64_t r = 0; r < rows; r++) {
                        pool_ref(x + r * n, n, kn, (ks_pool_mode)mode, ref);
                        for (int64_t i = 0; i < n; i++) {
                            KT_CHECK(KT_NEAR(y[r * n + i], ref[i], 1e-6), "n=%lld k=%lld mode=%d i=%lld: %.9g vs %.9g",
                                     (long long)n, (long long)kn, mode, (long long)i, (double)y[r * n + i], ref[i]);
                            KT_CHECK(same_bits(y[r * n + i], yi[r * n + i]), "in-place result differs at %lld", (long long)i);
                        }
                    }
                }
}

KT_TEST(prims_pool1d_special_values) {
    /* the torch semantics spelled out: avg divides edges by the kernel, max ignores padding */
    float x[5] = {1, 2, 3, 4, 5}, y[5];
    KT_CHECK(ks_cpu_pool1d(x, 1, 5, 5, KS_POOL_AVG, y) == KS_OK, "%s", ks_last_error());
    KT_CHECK(KT_NEAR(y[0], 6.0 / 5, 1e-7) && KT_NEAR(y[2], 3.0, 1e-7) && KT_NEAR(y[4], 12.0 / 5, 1e-7), "avg %g %g %g",
             (double)y[0], (double)y[2], (double)y[4]);
    float neg[3] = {-1, -2, -3};
    KT_CHECK(ks_cpu_pool1d(neg, 1, 3, 3, KS_POOL_MAX, y) == KS_OK, "%s", ks_last_error());
    KT_CHECK(y[0] == -1 && y[1] == -1 && y[2] == -2, "max ignores padding: %g %g %g", (double)y[0], (double)y[1], (double)y[2]);
    /* n = 1, kernel much larger than n */
    float one = 3.0f;
    KT_CHECK(ks_cpu_pool1d(&one, 1, 1, 7, KS_POOL_AVG, y) == KS_OK && KT_NEAR(y[0], 3.0 / 7, 1e-7), "n=1 avg %g", (double)y[0]);
    KT_CHECK(ks_cpu_pool1d(&one, 1, 1, 7, KS_POOL_MAX, y) == KS_OK && y[0] == 3.0f, "n=1 max %g", (double)y[0]);
    /* inf and NaN stay within their windows */
    float s[9] = {1, 2, INFINITY, 4, 5, 6, NAN, 8, 9};
    double ref[9];
    for (int mode = 0; mode < 2; mode++) {
        float z[9];
        KT_CHECK(ks_cpu_pool1d(s, 1, 9, 3, (ks_pool_mode)mode, z) == KS_OK, "%s", ks_last_error());
        pool_ref(s, 9, 3, (ks_pool_mode)mode, ref);
        for (int i = 0; i < 9; i++)
            KT_CHECK((isnan(z[i]) && isnan(ref[i])) || z[i] == (float)ref[i], "mode %d i=%d %g vs %g", mode, i,
                     (double)z[i], ref[i]);
    }
    /* a huge kernel on a short row costs nothing extra */
    KT_CHECK(ks_cpu_pool1d(x, 1, 5, 2000000001, KS_POOL_MAX, y) == KS_OK && y[0] == 5 && y[4] == 5, "huge kernel");
}

/* ---------------------------------------------------------------- top-k and ordering */

/* Compare ks_cpu_topk on x (rows, n) with the first k of the stable descending order. */
static int topk_check(const float *x, int64_t rows, int64_t n, int64_t k, const char *label) {
    int32_t *idx = malloc((size_t)(rows * k + 1) * sizeof *idx), *idx2 = malloc((size_t)(rows * k + 1) * sizeof *idx2);
    float *val = malloc((size_t)(rows * k + 1) * sizeof *val);
    int32_t *ref = malloc((size_t)(n + 1) * sizeof *ref);
    int bad = 0;
    if (ks_cpu_topk(x, rows, n, k, 0, KS_TOPK_BY_VALUE, idx, val) ||
        ks_cpu_topk(x, rows, n, k, 0, KS_TOPK_BY_INDEX, idx2, NULL)) {
        fprintf(stderr, "%s: %s\n", label, ks_last_error());
        bad = 1;
    }
    for (int64_t r = 0; r < rows && !bad; r++) {
        const float *xr = x + r * n;
        ref_order(xr, n, 1, ref);
        for (int64_t t = 0; t < k && !bad; t++)
            if (idx[r * k + t] != ref[t] || !same_bits(val[r * k + t], xr[ref[t]])) {
                fprintf(stderr, "%s: row %lld n=%lld k=%lld slot %lld: got %d, want %d\n", label, (long long)r,
                        (long long)n, (long long)k, (long long)t, idx[r * k + t], ref[t]);
                bad = 1;
            }
        qsort(ref, (size_t)k, sizeof *ref, cmp_i32);
        for (int64_t t = 0; t < k && !bad; t++)
            if (idx2[r * k + t] != ref[t]) {
                fprintf(stderr, "%s: by index, row %lld slot %lld: got %d, want %d\n", label, (long long)r,
                        (long long)t, idx2[r * k + t], ref[t]);
                bad = 1;
            }
    }
    free(idx); free(idx2); free(val); free(ref);
    return bad;
}

KT_TEST(prims_topk_vs_sort) {
    rng_seed(7);
    static const int64_t ns[] = {1, 2, 3, 5, 31, 32, 33, 100, 257, 1000, 4099};
    for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++)
        for (int kind = 0; kind < 4; kind++) {
            int64_t n = ns[ni], rows = 2;
            float *x = malloc(rows * n * sizeof *x);
            fill(x, rows * n, 10.0f);
            if (kind == 1) /* heavy ties: 5 levels */
                for (int64_t i = 0; i < rows * n; i++) x[i] = (float)floor(x[i] / 4);
            if (kind == 2) /* one value everywhere */
                for (int64_t i = 0; i < rows * n; i++) x[i] = 0.25f;
            if (kind == 3) /* specials: NaN, +-inf, +-0 among ties */
                for (int64_t i = 0; i < rows * n; i++) {
                    static const float sp[] = {NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 1.0f, -1.0f};
                    x[i] = sp[rng_u64() % 7];
                }
            int64_t kk[] = {0, 1, n / 3, n / 2, n - 1, n};
            for (size_t j = 0; j < sizeof kk / sizeof kk[0]; j++) {
                if (kk[j] < 0) continue;
                char label[64];
                snprintf(label, sizeof label, "topk kind %d", kind);
                KT_CHECK(topk_check(x, rows, n, kk[j], label) == 0, "n=%lld k=%lld kind=%d", (long long)n,
                         (long long)kk[j], kind);
            }
            free(x);
        }
}

/* base shifts every index and nothing else: the same sets and values as base 0 plus base, in both
 * orders, up to the last index the int32 range allows; a base past it is refused */
KT_TEST(prims_topk_base_shifts_indices) {
    rng_seed(11);
    const int64_t rows = 3, n = 1000, k = 77;
    float *x = malloc(rows * n * sizeof *x), *v0 = malloc(rows * k * sizeof *v0), *v1 = malloc(rows * k * sizeof *v1);
    int32_t *i0 = malloc(rows * k * sizeof *i0), *i1 = malloc(rows * k * sizeof *i1);
    fill(x, rows * n, 10.0f);
    for (int i = 0; i < 40; i++) x[rng_u64() % (rows * n)] = 1.5f; /* ties */
    const int64_t bases[] = {1, 12345, (int64_t)INT32_MAX + 1 - n};
    for (int ord = 0; ord < 2; ord++)
        for (size_t b = 0; b < sizeof bases / sizeof bases[0]; b++) {
            KT_CHECK(ks_cpu_topk(x, rows, n, k, 0, (ks_topk_order)ord, i0, v0) == KS_OK, "%s", ks_last_error());
            KT_CHECK(ks_cpu_topk(x, rows, n, k, bases[b], (ks_topk_order)ord, i1, v1) == KS_OK, "%s", ks_last_error());
            int same = 1;
            for (int64_t t = 0; t < rows * k; t++) same &= i1[t] == i0[t] + bases[b] && same_bits(v1[t], v0[t]);
            KT_CHECK(same, "order %d base %lld: indices or values differ from base 0 shifted", ord, (long long)bases[b]);
        }
    KT_CHECK(ks_cpu_topk(x, rows, n, k, -1, KS_TOPK_BY_INDEX, i1, NULL) == KS_ERR_ARG, "a negative base is refused");
    KT_CHECK(strstr(ks_last_error(), "topk: base -1 + n 1000 leaves the int32 index range") != NULL, "%s", ks_last_error());
    KT_CHECK(ks_cpu_topk(x, rows, n, k, (int64_t)INT32_MAX + 2 - n, KS_TOPK_BY_INDEX, i1, NULL) == KS_ERR_ARG,
             "a base whose last index passes INT32_MAX is refused");
    free(x); free(v0); free(v1); free(i0); free(i1);
}

KT_TEST(prims_topk_nan_and_zero_rules) {
    float x[6] = {NAN, -INFINITY, -0.0f, 0.0f, NAN, -1.0f};
    int32_t idx[6];
    KT_CHECK(ks_cpu_topk(x, 1, 6, 6, 0, KS_TOPK_BY_VALUE, idx, NULL) == KS_OK, "%s", ks_last_error());
    /* -0 == +0 (index order), then -1, -inf, and the NaNs last in index order */
    int32_t want[6] = {2, 3, 5, 1, 0, 4};
    for (int i = 0; i < 6; i++) KT_CHECK(idx[i] == want[i], "slot %d: %d vs %d", i, idx[i], want[i]);
}

KT_TEST(prims_topk_1m) {
    rng_seed(8);
    const int64_t n = 1 << 20;
    float *x = malloc(n * sizeof *x);
    fill(x, n, 1.0f);
    for (int64_t i = 0; i < n; i += 3) x[i] = (float)floor(x[i] * 64) / 64; /* plenty of ties */
    int32_t *idx = malloc(n * sizeof *idx);
    double t0 = ks_now();
    KT_CHECK(ks_cpu_topk(x, 1, n, 2048, 0, KS_TOPK_BY_VALUE, idx, NULL) == KS_OK, "%s", ks_last_error());
    double t1 = ks_now();
    KT_CHECK(ks_cpu_topk(x, 1, n, n / 2, 0, KS_TOPK_BY_VALUE, idx, NULL) == KS_OK, "%s", ks_last_error());
    double t2 = ks_now();
    fprintf(stderr, "[topk n=2^20: k=2048 %.1f ms, k=n/2 %.1f ms] ", 1e3 * (t1 - t0), 1e3 * (t2 - t1));
    KT_CHECK(topk_check(x, 1, n, 2048, "topk 1M") == 0, "k=2048");
    KT_CHECK(topk_check(x, 1, n, n / 2, "topk 1M") == 0, "k=n/2");
    free(x);
    free(idx);
}

KT_TEST(prims_argsort_sort_rank) {
    rng_seed(9);
    static const int64_t ns[] = {0, 1, 2, 17, 32, 33, 500, 3001};
    for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++)
        for (int kind = 0; kind < 3; kind++) {
            int64_t n = ns[ni];
            float *x = malloc((n + 1) * sizeof *x), *s = malloc((n + 1) * sizeof *s);
            int32_t *idx = malloc((n + 1) * sizeof *idx), *ref = malloc((n + 1) * sizeof *ref);
            fill(x, n, 5.0f);
            if (kind == 1) for (int64_t i = 0; i < n; i++) x[i] = (float)floor(x[i]);
            if (kind == 2) for (int64_t i = 0; i < n; i += 4) x[i] = (i & 8) ? NAN : -0.0f;
            for (int desc = 0; desc < 2; desc++) {
                KT_CHECK(ks_cpu_argsort(x, n, desc, idx) == KS_OK, "%s", ks_last_error());
                ref_order(x, n, desc, ref);
                for (int64_t i = 0; i < n; i++) KT_CHECK(idx[i] == ref[i], "argsort n=%lld desc=%d at %lld", (long long)n, desc, (long long)i);
                memcpy(s, x, n * sizeof *x);
                KT_CHECK(ks_cpu_sort_f32(s, n, desc, s) == KS_OK, "%s", ks_last_error());
                for (int64_t i = 0; i < n; i++) KT_CHECK(same_bits(s[i], x[ref[i]]), "sort_f32 at %lld", (long long)i);
            }
            KT_CHECK(ks_cpu_rank(x, n, idx) == KS_OK, "%s", ks_last_error());
            ref_order(x, n, 1, ref);
            for (int64_t p = 0; p < n; p++) KT_CHECK(idx[ref[p]] == p + 1, "rank of %d", ref[p]);
            /* rank spelled out on ties: the lower index gets the better rank */
            free(x); free(s); free(idx); free(ref);
        }
    float t[5] = {0.5f, 2.0f, 0.5f, 2.0f, 1.0f};
    int32_t rk[5], want[5] = {4, 1, 5, 2, 3};
    KT_CHECK(ks_cpu_rank(t, 5, rk) == KS_OK, "%s", ks_last_error());
    for (int i = 0; i < 5; i++) KT_CHECK(rk[i] == want[i], "rank[%d] = %d, want %d", i, rk[i], want[i]);
}

KT_TEST(prims_sort_unique_union_concat) {
    rng_seed(10);
    for (int rep = 0; rep < 40; rep++) {
        int64_t n = rng_int(0, 300), span = rng_int(1, 1000);
        int32_t *x = malloc((n + 1) * sizeof *x), *a = malloc((n + 1) * sizeof *a), *b = malloc((n + 1) * sizeof *b);
        for (int64_t i = 0; i < n; i++) x[i] = (int32_t)rng_int(-span, span);
        if (rep == 0 && n > 2) { x[0] = INT32_MIN; x[1] = INT32_MAX; }
        memcpy(a, x, n * sizeof *x);
        qsort(a, n, sizeof *a, cmp_i32);
        KT_CHECK(ks_cpu_sort_i32(x, n, b) == KS_OK, "%s", ks_last_error());
        KT_CHECK(n == 0 || memcmp(a, b, n * sizeof *a) == 0, "sort_i32 n=%lld", (long long)n);
        int64_t nu = -1, nr = 0;
        KT_CHECK(ks_cpu_unique(x, n, b, &nu) == KS_OK, "%s", ks_last_error());
        for (int64_t i = 0; i < n; i++) if (i == 0 || a[i] != a[i - 1]) a[nr++] = a[i];
        KT_CHECK(nu == nr && (nr == 0 || memcmp(a, b, nr * sizeof *a) == 0), "unique %lld vs %lld", (long long)nu, (long long)nr);
        /* union of two unique lists vs a membership table */
        int64_t na = rng_int(0, 50), nb = rng_int(0, 50);
        int32_t la[50], lb[50], out[100];
        unsigned char mem[201] = {0};
        int64_t ca = 0, cb = 0;
        for (int v = 0; v <= 200; v++) {
            if (ca < na && rng_int(0, 3) == 0) { la[ca++] = v; mem[v] = 1; }
            if (cb < nb && rng_int(0, 3) == 0) { lb[cb++] = v; mem[v] = 1; }
        }
        int64_t no = -1, t = 0;
        KT_CHECK(ks_cpu_union(la, ca, lb, cb, out, &no) == KS_OK, "%s", ks_last_error());
        for (int v = 0; v <= 200; v++)
            if (mem[v]) { KT_CHECK(t < no && out[t] == v, "union misses %d", v); t++; }
        KT_CHECK(t == no, "union has %lld values, want %lld", (long long)no, (long long)t);
        /* concat, including in place */
        int32_t cat[100];
        KT_CHECK(ks_cpu_concat_i32(la, ca, lb, cb, cat) == KS_OK, "%s", ks_last_error());
        for (int64_t i = 0; i < ca + cb; i++) KT_CHECK(cat[i] == (i < ca ? la[i] : lb[i - ca]), "concat at %lld", (long long)i);
        KT_CHECK(ks_cpu_concat_i32(cat, ca, lb, cb, cat) == KS_OK, "%s", ks_last_error());
        for (int64_t i = 0; i < ca + cb; i++) KT_CHECK(cat[i] == (i < ca ? la[i] : lb[i - ca]), "in-place concat at %lld", (long long)i);
        free(x); free(a); free(b);
    }
    float fa[2] = {1.5f, -2}, fb[1] = {3}, fc[3];
    KT_CHECK(ks_cpu_concat_f32(fa, 2, fb, 1, fc) == KS_OK && fc[0] == 1.5f && fc[1] == -2 && fc[2] == 3, "concat_f32");
}

KT_TEST(prims_arange_gather) {
    static const int64_t cases[][3] = {{0, 10, 1}, {3, 10, 3}, {10, 0, -2}, {5, 5, 1}, {5, 0, 1}, {-4, 4, 3}, {7, -8, -5}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int64_t s = cases[c][0], e = cases[c][1], st = cases[c][2], len = ks_arange_len(s, e, st), cnt = 0;
        int32_t out[32];
        KT_CHECK(ks_cpu_arange(s, e, st, out) == KS_OK, "%s", ks_last_error());
        for (int64_t v = s; st > 0 ? v < e : v > e; v += st) { KT_CHECK(cnt < len && out[cnt] == v, "arange %zu", c); cnt++; }
        KT_CHECK(cnt == len, "arange len %lld vs %lld", (long long)len, (long long)cnt);
    }
    KT_CHECK(ks_arange_len(0, 10, 0) == -1, "step 0");
    KT_CHECK(ks_arange_len(INT64_MIN, INT64_MAX, 1) == INT64_MAX, "clamped length");
    KT_CHECK(ks_arange_len(INT64_MAX, INT64_MIN, INT64_MIN) == 2, "extreme negative step");
    KT_CHECK(ks_cpu_arange(INT64_MIN, INT64_MAX, 1, NULL) == KS_ERR_ARG, "int32 range");
    rng_seed(11);
    const int64_t n = 37, d = 13, k = 50;
    float x[37 * 13], y[50 * 13];
    int32_t idx[50], xi[37], yi[50];
    fill(x, n * d, 1.0f);
    for (int64_t i = 0; i < n; i++) xi[i] = (int32_t)(1000 + i);
    for (int64_t i = 0; i < k; i++) idx[i] = (int32_t)rng_int(0, n - 1);
    KT_CHECK(ks_cpu_gather(x, n, d, idx, k, y) == KS_OK, "%s", ks_last_error());
    KT_CHECK(ks_cpu_gather_i32(xi, n, idx, k, yi) == KS_OK, "%s", ks_last_error());
    for (int64_t i = 0; i < k; i++) {
        KT_CHECK(yi[i] == 1000 + idx[i], "gather_i32 at %lld", (long long)i);
        for (int64_t e = 0; e < d; e++) KT_CHECK(same_bits(y[i * d + e], x[idx[i] * d + e]), "gather (%lld, %lld)", (long long)i, (long long)e);
    }
    idx[3] = 37;
    KT_CHECK(ks_cpu_gather(x, n, d, idx, k, y) == KS_ERR_ARG && err_has("gather: index 37 at position 3 out of range [0, 37)"),
             "%s", ks_last_error());
    idx[3] = -1;
    KT_CHECK(ks_cpu_gather_i32(xi, n, idx, k, yi) == KS_ERR_ARG && err_has("index -1"), "%s", ks_last_error());
}

KT_TEST(prims_check_indices) {
    int32_t ok[4] = {0, 3, 7, 11}, unsorted[4] = {7, 0, 11, 3};
    KT_CHECK(ks_check_indices(ok, 4, 12, 1, "retain") == KS_OK, "%s", ks_last_error());
    KT_CHECK(ks_check_indices(unsorted, 4, 12, 0, "attend") == KS_OK, "%s", ks_last_error());
    KT_CHECK(ks_check_indices(NULL, 0, 0, 1, "retain") == KS_OK, "empty list");
    KT_CHECK(ks_check_indices(unsorted, 4, 12, 1, "retain") == KS_ERR_ARG &&
             err_has("retain: index 0 at position 1 follows 7 (not ascending)"), "%s", ks_last_error());
    int32_t oor[3] = {1, 17, 2};
    KT_CHECK(ks_check_indices(oor, 3, 12, 0, "retain") == KS_ERR_ARG &&
             err_has("retain: index 17 at position 1 out of range [0, 12)"), "%s", ks_last_error());
    int32_t dup[5] = {9, 5, 2, 8, 5};
    KT_CHECK(ks_check_indices(dup, 5, 12, 0, "propagate") == KS_ERR_ARG &&
             err_has("propagate: duplicate index 5 (positions 1 and 4)"), "%s", ks_last_error());
    int32_t dups[3] = {1, 5, 5};
    KT_CHECK(ks_check_indices(dups, 3, 12, 1, NULL) == KS_ERR_ARG && err_has("indices: duplicate index 5"), "%s", ks_last_error());
    int32_t many[4] = {0, 1, 2, 3};
    KT_CHECK(ks_check_indices(many, 4, 3, 1, "restart") == KS_ERR_ARG && err_has("restart: 4 indices for 3 rows"), "%s",
             ks_last_error());
    int32_t neg[2] = {-3, 1};
    KT_CHECK(ks_check_indices(neg, 2, 3, 0, "attend") == KS_ERR_ARG && err_has("index -3"), "%s", ks_last_error());
}

/* ---------------------------------------------------------------- small numerics */

KT_TEST(prims_softmax_sum_mean_var_cosine) {
    rng_seed(12);
    static const int64_t shapes[][2] = {{1, 1}, {1, 7}, {5, 1}, {3, 33}, {17, 9}, {4, 200}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int64_t R = shapes[s][0], C = shapes[s][1];
        float *x = malloc(R * C * sizeof *x), *y = malloc(R * C * sizeof *y), *o = malloc((R + C) * sizeof *o);
        fill(x, R * C, 3.0f);
        KT_CHECK(ks_cpu_softmax(x, R, C, y) == KS_OK, "%s", ks_last_error());
        for (int64_t r = 0; r < R; r++) {
            double z = 0;
            for (int64_t c = 0; c < C; c++) z += exp((double)x[r * C + c]);
            for (int64_t c = 0; c < C; c++)
                KT_CHECK(KT_NEAR(y[r * C + c], exp((double)x[r * C + c]) / z, 1e-6), "softmax (%lld, %lld)", (long long)r, (long long)c);
        }
        for (int axis = 0; axis < 2; axis++) {
            int64_t nout = axis ? R : C, cnt = axis ? C : R;
            for (int what = 0; what < 4; what++) {
                ks_status st = what == 0 ? ks_cpu_sum(x, R, C, axis, o)
                             : what == 1 ? ks_cpu_mean(x, R, C, axis, o)
                             : ks_cpu_var(x, R, C, axis, what - 2, o);
                if (what == 3 && cnt == 1) { KT_CHECK(st == KS_ERR_ARG, "var ddof 1 of one value"); continue; }
                KT_CHECK(st == KS_OK, "%s", ks_last_error());
                for (int64_t a = 0; a < nout; a++) {
                    double s1 = 0, s2 = 0;
                    for (int64_t b = 0; b < cnt; b++) s1 += axis ? x[a * C + b] : x[b * C + a];
                    double mu = s1 / cnt;
                    for (int64_t b = 0; b < cnt; b++) { double e = (axis ? x[a * C + b] : x[b * C + a]) - mu; s2 += e * e; }
                    double want = what == 0 ? s1 : what == 1 ? mu : s2 / (double)(cnt - (what - 2));
                    KT_CHECK(KT_NEAR(o[a], want, 1e-5 * (1 + fabs(want))), "op %d axis %d out[%lld] %g vs %g", what, axis,
                             (long long)a, (double)o[a], want);
                }
            }
        }
        float *b = malloc(R * C * sizeof *b);
        fill(b, R * C, 1.0f);
        KT_CHECK(ks_cpu_cosine_rows(x, b, R, C, o) == KS_OK, "%s", ks_last_error());
        for (int64_t r = 0; r < R; r++) {
            double ab = 0, aa = 0, bb = 0;
            for (int64_t c = 0; c < C; c++) {
                ab += x[r * C + c] * (double)b[r * C + c];
                aa += x[r * C + c] * (double)x[r * C + c];
                bb += b[r * C + c] * (double)b[r * C + c];
            }
            KT_CHECK(KT_NEAR(o[r], ab / sqrt(aa * bb), 1e-6), "cosine row %lld", (long long)r);
        }
        float c1;
        KT_CHECK(ks_cpu_cosine(x, x, C, &c1) == KS_OK && KT_NEAR(c1, 1.0, 1e-6), "self cosine %g", (double)c1);
        free(x); free(y); free(o); free(b);
    }
    /* softmax special rows: -inf entries, all -inf, NaN */
    float sp[9] = {0, -INFINITY, 0, -INFINITY, -INFINITY, -INFINITY, 1, NAN, 2}, so[9];
    KT_CHECK(ks_cpu_softmax(sp, 3, 3, so) == KS_OK, "%s", ks_last_error());
    KT_CHECK(so[0] == 0.5f && so[1] == 0 && so[2] == 0.5f, "-inf entries");
    KT_CHECK(so[3] == 0 && so[4] == 0 && so[5] == 0, "all -inf row gives zeros");
    KT_CHECK(isnan(so[6]) && isnan(so[8]), "NaN row");
    /* zero vector cosine is 0; population variance by hand */
    float z[3] = {0, 0, 0}, v[3] = {1, 2, 6}, r;
    KT_CHECK(ks_cpu_cosine(z, v, 3, &r) == KS_OK && r == 0, "zero cosine");
    KT_CHECK(ks_cpu_var(v, 1, 3, 1, 0, &r) == KS_OK && KT_NEAR(r, 14.0 / 3, 1e-6), "var %g", (double)r);
}

/* ---------------------------------------------------------------- bad arguments */

KT_TEST(prims_bad_arguments) {
    float x[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}, y[64];
    int32_t idx[16] = {0}, iy[16];
    int64_t no;
    ks_scores_opts o = ks_scores_opts_default();
#define BAD(call, msg)                                                                                  \
    do {                                                                                                \
        ks_clear_error();                                                                               \
        ks_status st_ = (call);                                                                         \
        KT_CHECK(st_ == KS_ERR_ARG, "%s gave %s", #call, ks_status_name(st_));                          \
        KT_CHECK(err_has(msg), "%s: message \"%s\" lacks \"%s\"", #call, ks_last_error(), msg);         \
    } while (0)
    /* scores */
    BAD(ks_cpu_scores(x, NULL, 3, 1, x, NULL, 2, 2, 4, &o, y), "scores: n_q_heads = 3 is not a multiple of n_kv_heads = 2");
    BAD(ks_cpu_scores(x, NULL, 0, 1, x, NULL, 1, 2, 4, &o, y), "scores: n_q_heads = 0");
    BAD(ks_cpu_scores(x, NULL, 1, -1, x, NULL, 1, 2, 4, &o, y), "scores: m = -1 is negative");
    BAD(ks_cpu_scores(x, NULL, 1, 1, x, NULL, 1, -2, 4, &o, y), "scores: n = -2 is negative");
    BAD(ks_cpu_scores(x, NULL, 1, 1, x, NULL, 1, 2, 0, &o, y), "scores: d = 0");
    BAD(ks_cpu_scores(NULL, NULL, 1, 1, x, NULL, 1, 2, 4, &o, y), "scores: q is NULL");
    BAD(ks_cpu_scores(x, NULL, 1, 1, x, NULL, 1, 2, 4, &o, NULL), "scores: out is NULL");
    o.k_begin = 1; o.k_end = 5;
    BAD(ks_cpu_scores(x, NULL, 1, 1, x, NULL, 1, 2, 4, &o, y), "scores: key domain range [1, 5) is not within [0, 2]");
    o = ks_scores_opts_default(); o.out_begin = -3;
    BAD(ks_cpu_scores(x, NULL, 1, 1, x, NULL, 1, 2, 4, &o, y), "scores: output range [-3");
    o = ks_scores_opts_default(); o.causal = 1;
    BAD(ks_cpu_scores(x, NULL, 1, 3, x, NULL, 1, 2, 4, &o, y), "m <= n (m = 3, n = 2)");
    o = ks_scores_opts_default(); o.scale_mode = KS_SCALE_CUSTOM; o.scale = NAN;
    BAD(ks_cpu_scores(x, NULL, 1, 1, x, NULL, 1, 2, 4, &o, y), "scores: custom scale nan");
    o = ks_scores_opts_default(); o.heads = (ks_head_reduce)9;
    BAD(ks_cpu_scores(x, NULL, 1, 1, x, NULL, 1, 2, 4, &o, y), "scores: unknown heads reduction 9");
    o = ks_scores_opts_default(); o.gqa = (ks_gqa_map)-1;
    BAD(ks_cpu_scores(x, NULL, 1, 1, x, NULL, 1, 2, 4, &o, y), "scores: unknown gqa mapping");
    o = ks_scores_opts_default(); o.k_row_stride = -4;
    BAD(ks_cpu_scores(x, NULL, 1, 1, x, NULL, 1, 2, 4, &o, y), "scores: negative stride");
    o = ks_scores_opts_default(); o.n_threads = -2;
    BAD(ks_cpu_scores(x, NULL, 1, 1, x, NULL, 1, 2, 4, &o, y), "scores: n_threads = -2");
    o = ks_scores_opts_default(); o.scale_mode = (ks_scale_mode)7;
    BAD(ks_scores_out_shape(&o, 1, 1, 2, &no, &no), "scores: unknown scale_mode 7");
    /* pool1d */
    BAD(ks_cpu_pool1d(x, 1, 16, 4, KS_POOL_AVG, y), "pool1d: kernel = 4 is even");
    BAD(ks_cpu_pool1d(x, 1, 16, 0, KS_POOL_AVG, y), "pool1d: kernel = 0 must be >= 1");
    BAD(ks_cpu_pool1d(x, 1, -16, 3, KS_POOL_AVG, y), "pool1d: n = -16 is negative");
    BAD(ks_cpu_pool1d(x, -1, 16, 3, KS_POOL_AVG, y), "pool1d: rows = -1 is negative");
    BAD(ks_cpu_pool1d(x, 1, 16, 3, (ks_pool_mode)5, y), "pool1d: unknown mode 5");
    BAD(ks_cpu_pool1d(NULL, 1, 16, 3, KS_POOL_MAX, y), "pool1d: x is NULL");
    /* topk and ordering */
    BAD(ks_cpu_topk(x, 1, 5, 7, 0, KS_TOPK_BY_VALUE, iy, NULL), "topk: k = 7 > n = 5");
    BAD(ks_cpu_topk(x, 1, 5, -1, 0, KS_TOPK_BY_VALUE, iy, NULL), "topk: k = -1 is negative");
    BAD(ks_cpu_topk(x, 1, -5, 1, 0, KS_TOPK_BY_VALUE, iy, NULL), "topk: n = -5 is negative");
    BAD(ks_cpu_topk(x, 1, 5000000000LL, 1, 0, KS_TOPK_BY_VALUE, iy, NULL), "topk: n = 5000000000 exceeds the int32 index range");
    BAD(ks_cpu_topk(x, 1, 5, 2, 0, (ks_topk_order)3, iy, NULL), "topk: unknown order 3");
    BAD(ks_cpu_topk(x, 1, 5, 2, 0, KS_TOPK_BY_VALUE, NULL, NULL), "topk: out_idx is NULL");
    BAD(ks_cpu_argsort(x, -1, 0, iy), "argsort: n = -1 is negative");
    BAD(ks_cpu_sort_f32(NULL, 3, 0, y), "sort: x is NULL");
    BAD(ks_cpu_sort_i32(idx, -2, iy), "sort: n = -2 is negative");
    BAD(ks_cpu_rank(x, 4, NULL), "rank: out_rank is NULL");
    /* index lists */
    int32_t uns[3] = {1, 3, 2}, asc[3] = {1, 2, 3}, dup[3] = {1, 1, 2};
    BAD(ks_cpu_union(uns, 3, asc, 3, iy, &no), "union: first list is not strictly ascending: 2 at position 2 follows 3");
    BAD(ks_cpu_union(asc, 3, dup, 3, iy, &no), "union: second list is not strictly ascending: 1 at position 1 follows 1");
    BAD(ks_cpu_union(asc, -3, asc, 3, iy, &no), "union: na = -3 is negative");
    BAD(ks_cpu_unique(idx, -1, iy, &no), "unique");
    BAD(ks_cpu_concat_i32(asc, 3, NULL, 2, iy), "concat: b is NULL");
    BAD(ks_cpu_concat_f32(x, -1, x, 2, y), "concat: na = -1 is negative");
    BAD(ks_cpu_arange(0, 10, 0, iy), "arange: step is 0");
    BAD(ks_cpu_arange(0, 5000000000LL, 1, iy), "arange: values of arange(0, 5000000000, 1) leave the int32 range");
    BAD(ks_cpu_gather(x, 4, -4, idx, 1, y), "gather: d = -4 is negative");
    BAD(ks_cpu_gather(x, 4, 4, NULL, 1, y), "gather: idx is NULL");
    BAD(ks_check_indices(asc, -1, 3, 0, "retain"), "retain: index count -1 is negative");
    /* numerics */
    BAD(ks_cpu_softmax(x, 2, -8, y), "softmax: n = -8 is negative");
    BAD(ks_cpu_sum(x, 4, 4, 2, y), "sum: axis = 2 must be 0 or 1");
    BAD(ks_cpu_mean(x, 0, 4, 0, y), "mean: axis 0 is empty");
    BAD(ks_cpu_var(x, 4, 4, 1, -1, y), "var: ddof = -1 is negative");
    BAD(ks_cpu_var(x, 4, 4, 1, 4, y), "var: 4 values with ddof = 4");
    BAD(ks_cpu_cosine(x, NULL, 4, y), "cosine: b is NULL");
    BAD(ks_cpu_cosine_rows(x, x, -2, 4, y), "cosine: rows = -2 is negative");
#undef BAD
}

/* ================================================================ the CPU backend's table (core/cpu_prims.c)
 *
 * What lua/ calls for host tensors (one dispatch): every entry gives core/prims.c's result bit
 * for bit, with the conventions all backends' tables share (backend.h): counts and cosine
 * through the output pointer, union in any order, gather's error word, no bf16 keys. */
#include "backend.h"
#include "ks_lua.h"

KT_TEST(prims_cpu_table) {
    const ks_backend_prims *P = ks_cpu_prims();
    KT_CHECK(P, "the CPU backend has a table");
    ks_backend *cpu = NULL;
    ks_backend_opts o = ks_backend_opts_default();
    o.n_threads = 1;
    KT_CHECK(ks_backend_create_opts("cpu", &o, &cpu) == KS_OK && cpu->prims == P, "the CPU backend carries it");
    ks_backend_free(cpu);
    /* every entry is set (a NULL would crash the binding) */
    const void *const *entry = (const void *const *)P;
    for (size_t i = 0; i < sizeof *P / sizeof(void *); i++) KT_CHECK(entry[i], "entry %zu is NULL", i);
    enum { N = 300, ROWS = 3 };
    float x[ROWS * N], ref[ROWS * N], got[ROWS * N];
    int32_t ri[ROWS * N], gi[ROWS * N];
    for (int i = 0; i < ROWS * N; i++) x[i] = (float)((i * 37) % 101 - 50) * 0.25f + (i % 7 == 0 ? 0.0f : 0.001f * (i % 13));
    KT_CHECK(P->pool1d(NULL, x, ROWS, N, 5, KS_POOL_MAX, got) == KS_OK && ks_cpu_pool1d(x, ROWS, N, 5, KS_POOL_MAX, ref) == KS_OK, "pool");
    KT_CHECK(!memcmp(got, ref, sizeof ref), "pool1d differs");
    KT_CHECK(P->softmax(NULL, x, ROWS, N, got) == KS_OK && ks_cpu_softmax(x, ROWS, N, ref) == KS_OK, "softmax");
    KT_CHECK(!memcmp(got, ref, sizeof ref), "softmax differs");
    KT_CHECK(P->var(NULL, x, ROWS, N, 1, 1, got) == KS_OK && ks_cpu_var(x, ROWS, N, 1, 1, ref) == KS_OK, "var");
    KT_CHECK(!memcmp(got, ref, sizeof(float) * ROWS), "var differs");
    KT_CHECK(P->topk(NULL, x, ROWS, N, 17, 0, KS_TOPK_BY_VALUE, gi, got, NULL, 0) == KS_OK, "topk");
    KT_CHECK(ks_cpu_topk(x, ROWS, N, 17, 0, KS_TOPK_BY_VALUE, ri, ref) == KS_OK, "cpu topk");
    KT_CHECK(!memcmp(gi, ri, sizeof(int32_t) * ROWS * 17) && !memcmp(got, ref, sizeof(float) * ROWS * 17), "topk differs");
    float c = 0, cref = 1;
    KT_CHECK(P->cosine(NULL, x, x + N, N, &c) == KS_OK && ks_cpu_cosine(x, x + N, N, &cref) == KS_OK && c == cref, "cosine %g vs %g", c, cref);
    /* scores: the same floats; bf16 keys refused with a message */
    ks_scores_opts so = ks_scores_opts_default();
    so.heads = KS_HEADS_SUM;
    KT_CHECK(P->scores(NULL, x, NULL, 2, 1, x + 8, 0, NULL, 1, 10, 4, &so, got) == KS_OK, "scores: %s", ks_last_error());
    KT_CHECK(ks_cpu_scores(x, NULL, 2, 1, x + 8, NULL, 1, 10, 4, &so, ref) == KS_OK && !memcmp(got, ref, sizeof(float) * 10), "scores differ");
    KT_CHECK(P->scores(NULL, x, NULL, 2, 1, x + 8, 1, NULL, 1, 10, 4, &so, got) == KS_ERR_UNSUPPORTED && strstr(ks_last_error(), "bf16"),
             "%s", ks_last_error());
    /* union in any order: the sorted distinct values; ascending lists merge */
    int32_t a[] = {9, 2, 5, 2}, b[] = {7, 1, 9}, u[7];
    int64_t nu = 0;
    KT_CHECK(P->union_(NULL, a, 4, b, 3, u, &nu) == KS_OK, "%s", ks_last_error());
    KT_CHECK(nu == 5 && u[0] == 1 && u[1] == 2 && u[2] == 5 && u[3] == 7 && u[4] == 9, "union: %lld values", (long long)nu);
    int32_t sa[] = {1, 4, 8}, sb[] = {2, 4, 9};
    KT_CHECK(P->union_(NULL, sa, 3, sb, 3, u, &nu) == KS_OK && nu == 5 && u[0] == 1 && u[2] == 4 && u[4] == 9, "ascending union");
    KT_CHECK(P->union_(NULL, sa, -1, sb, 3, u, &nu) == KS_ERR_ARG && strstr(ks_last_error(), "union: na = -1"), "%s", ks_last_error());
    /* gather: a bad index leaves its row NaN and its lowest position in the error word */
    int32_t idx[] = {1, 0, 7, 2, -1};
    float big[5 * N];
    int64_t err = -1;
    KT_CHECK(P->gather(NULL, x, ROWS, N, idx, 5, big, &err) == KS_OK, "%s", ks_last_error());
    KT_CHECK(err == 2, "error word %lld", (long long)err);
    KT_CHECK(!memcmp(big, x + N, sizeof(float) * N) && !memcmp(big + 3 * N, x + 2 * N, sizeof(float) * N) && big[2 * N] != big[2 * N] &&
                 big[5 * N - 1] != big[5 * N - 1],
             "gathered rows");
    err = -1;
    KT_CHECK(P->gather(NULL, x, ROWS, N, idx, 2, big, &err) == KS_OK && err == -1, "no bad index: %lld", (long long)err);
    KT_CHECK(P->gather(NULL, x, ROWS, N, idx, 5, big, NULL) == KS_ERR_ARG && strstr(ks_last_error(), "index 7 at position 2"),
             "unchecked: the core's error: %s", ks_last_error());
    int32_t xi[] = {10, 11, 12}, go[5] = {0};
    err = -1;
    KT_CHECK(P->gather_i32(NULL, xi, 3, idx, 5, go, &err) == KS_OK && err == 2 && go[0] == 11 && go[1] == 10 && go[3] == 12 &&
                 go[2] == 0x7fc00000,
             "gather_i32: err %lld", (long long)err);
    KT_CHECK(P->gather(NULL, NULL, ROWS, N, idx, 5, big, &err) == KS_ERR_ARG, "x NULL is an argument error");
}

/* ================================================================ the emulated device (lua/emu_device.c)
 *
 * The device backend that runs lua/'s device-tensor path on the CPU: its entries are reached
 * through tagged addresses (alloc / upload / download) and give the CPU table's results (the
 * device conventions included), and an injected allocation failure fails until reset. */

KT_TEST(prims_emulated_device_table) {
    ks_backend *be = ks_lua_emu_backend();
    KT_CHECK(be && be->prims && !strcmp(be->name, "emu"), "emu backend");
    const ks_backend_prims *P = be->prims;
    enum { N = 300, ROWS = 3 };
    float hx[ROWS * N], ref[ROWS * N], got[5 * N];
    int32_t ri[ROWS * N], gi[ROWS * N];
    for (int i = 0; i < ROWS * N; i++) hx[i] = (float)((i * 37) % 101 - 50) * 0.25f + (i % 7 == 0 ? 0.0f : 0.001f * (i % 13));
    float *dx = be->alloc(be, sizeof hx), *dy = be->alloc(be, sizeof got);
    int32_t *di = be->alloc(be, sizeof ri);
    int64_t *dn = be->alloc(be, 16);
    KT_CHECK(dx && dy && di && dn, "alloc");
    /* a device address is not a host address: the tag is visible */
    KT_CHECK(ks_lua_emu_untag(dx) != (void *)dx && ks_lua_emu_tag(ks_lua_emu_untag(dx)) == (void *)dx, "tagged");
    KT_CHECK(be->upload(be, dx, hx, sizeof hx) == KS_OK, "upload");
    /* pool1d, softmax, sums: the CPU's floats bit for bit */
    KT_CHECK(P->pool1d(be, dx, ROWS, N, 5, KS_POOL_MAX, dy) == KS_OK && ks_cpu_pool1d(hx, ROWS, N, 5, KS_POOL_MAX, ref) == KS_OK, "pool");
    be->download(be, got, dy, sizeof ref);
    KT_CHECK(!memcmp(got, ref, sizeof ref), "pool1d differs");
    KT_CHECK(P->softmax(be, dx, ROWS, N, dy) == KS_OK && ks_cpu_softmax(hx, ROWS, N, ref) == KS_OK, "softmax");
    be->download(be, got, dy, sizeof ref);
    KT_CHECK(!memcmp(got, ref, sizeof ref), "softmax differs");
    KT_CHECK(P->sum(be, dx, ROWS, N, 0, dy) == KS_OK && ks_cpu_sum(hx, ROWS, N, 0, ref) == KS_OK, "sum");
    be->download(be, got, dy, sizeof(float) * N);
    KT_CHECK(!memcmp(got, ref, sizeof(float) * N), "sum differs");
    /* top-k and rank: identical indices */
    KT_CHECK(P->topk(be, dx, ROWS, N, 17, 0, KS_TOPK_BY_VALUE, di, dy, NULL, 0) == KS_OK, "topk");
    KT_CHECK(ks_cpu_topk(hx, ROWS, N, 17, 0, KS_TOPK_BY_VALUE, ri, ref) == KS_OK, "cpu topk");
    be->download(be, gi, di, sizeof(int32_t) * ROWS * 17);
    KT_CHECK(!memcmp(gi, ri, sizeof(int32_t) * ROWS * 17), "topk differs");
    KT_CHECK(P->rank(be, dx, N, di) == KS_OK && ks_cpu_rank(hx, N, ri) == KS_OK, "rank");
    be->download(be, gi, di, sizeof(int32_t) * N);
    KT_CHECK(!memcmp(gi, ri, sizeof(int32_t) * N), "rank differs");
    /* masks: ge and where on device memory, and a scores call skipped by a device mask */
    float mk[2] = {0.0f, 1.0f}, gm[N];
    float *dm = be->alloc(be, sizeof mk);
    be->upload(be, dm, mk, sizeof mk);
    KT_CHECK(P->ge(be, dx, N, 1.5, dy) == KS_OK && ks_cpu_ge(hx, N, 1.5, ref) == KS_OK, "ge");
    be->download(be, gm, dy, sizeof(float) * N);
    KT_CHECK(!memcmp(gm, ref, sizeof(float) * N), "ge differs");
    KT_CHECK(P->where(be, dm + 1, 1, dx, dx + N, N, dy) == KS_OK, "where");
    be->download(be, gm, dy, sizeof(float) * N);
    KT_CHECK(!memcmp(gm, hx, sizeof(float) * N), "where (1) is not a");
    ks_scores_opts so = ks_scores_opts_default();
    so.heads = KS_HEADS_SUM;
    so.skip = dm + 1;
    for (int i = 0; i < 10; i++) gm[i] = 3.0f;
    be->upload(be, dy, gm, sizeof(float) * 10);
    KT_CHECK(P->scores(be, dx, NULL, 2, 1, dx + 8, 0, NULL, 1, 10, 4, &so, dy) == KS_OK, "skipped scores: %s", ks_last_error());
    be->download(be, gm, dy, sizeof(float) * 10);
    KT_CHECK(gm[0] == 0.0f && gm[9] == 0.0f, "skipped scores are not zeros");
    so.skip = dm;
    KT_CHECK(P->scores(be, dx, NULL, 2, 1, dx + 8, 0, NULL, 1, 10, 4, &so, dy) == KS_OK, "scores: %s", ks_last_error());
    so.skip = NULL;
    KT_CHECK(ks_cpu_scores(hx, NULL, 2, 1, hx + 8, NULL, 1, 10, 4, &so, ref) == KS_OK, "cpu scores");
    be->download(be, gm, dy, sizeof(float) * 10);
    KT_CHECK(!memcmp(gm, ref, sizeof(float) * 10), "scores under a zero device mask differ");
    be->free(be, dm);
    /* cosine: the value goes to device memory */
    float c, cref;
    KT_CHECK(P->cosine(be, dx, dx + N, N, dy) == KS_OK && ks_cpu_cosine(hx, hx + N, N, &cref) == KS_OK, "cosine");
    be->download(be, &c, dy, sizeof c);
    KT_CHECK(c == cref, "cosine %g vs %g", c, cref);
    /* union in any order (the CUDA semantics): sorted distinct values; count in device memory */
    int32_t a[] = {9, 2, 5, 2}, b[] = {7, 1, 9}, u[7];
    int32_t *da = be->alloc(be, 8 * sizeof(int32_t)), *db = be->alloc(be, sizeof b); /* da: room for idx below */
    be->upload(be, da, a, sizeof a);
    be->upload(be, db, b, sizeof b);
    KT_CHECK(P->union_(be, da, 4, db, 3, di, dn) == KS_OK, "union");
    int64_t nu = 0;
    be->download(be, &nu, dn, sizeof nu);
    be->download(be, u, di, sizeof(int32_t) * (size_t)nu);
    KT_CHECK(nu == 5 && u[0] == 1 && u[1] == 2 && u[2] == 5 && u[3] == 7 && u[4] == 9, "union: %lld values", (long long)nu);
    /* gather: a bad index leaves its row NaN and its lowest position in the error word */
    int32_t idx[] = {1, 0, 7, 2, -1};
    be->upload(be, da, idx, sizeof idx);
    int64_t m1 = -1, err = 0;
    be->upload(be, dn, &m1, sizeof m1);
    KT_CHECK(P->gather(be, dx, ROWS, N, da, 5, dy, dn) == KS_OK, "gather");
    be->download(be, &err, dn, sizeof err);
    be->download(be, got, dy, sizeof(float) * 5 * N);
    KT_CHECK(err == 2, "error word %lld", (long long)err);
    KT_CHECK(!memcmp(got, hx + N, sizeof(float) * N) && got[2 * N] != got[2 * N], "gathered rows");
    be->upload(be, dn, &m1, sizeof m1);
    KT_CHECK(P->gather(be, dx, ROWS, N, da, 2, dy, dn) == KS_OK, "gather");
    be->download(be, &err, dn, sizeof err);
    KT_CHECK(err == -1, "no bad index: %lld", (long long)err);
    /* an injected allocation failure: NULL with a message, until reset */
    ks_lua_emu_fail_in = 1;
    void *p = be->alloc(be, 64);
    KT_CHECK(!p && strstr(ks_last_error(), "injected"), "%s", ks_last_error());
    KT_CHECK(!be->alloc(be, 8), "still failing");
    ks_lua_emu_fail_in = 0;
    p = be->alloc(be, 64);
    KT_CHECK(p, "allocates again");
    be->free(be, p);
    be->free(be, da);
    be->free(be, db);
    be->free(be, dx);
    be->free(be, dy);
    be->free(be, di);
    be->free(be, dn);
}
