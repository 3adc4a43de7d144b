/* prims_scores.c — ks_cpu_scores (prims.h): attention scores of chosen query rows against the
 * keys, reduced over rows and heads, without an (m, n) matrix. Work is split by query head over
 * up to 16 threads started per call (fixed-order sums: the result does not depend on them);
 * query rows are scored in tiles so each key row is read once per tile. */
#include "prims_int.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SCORES_TILE 8 /* query rows scored together, so each key row is read once per tile */

ks_scores_opts ks_scores_opts_default(void) {
    ks_scores_opts o;
    memset(&o, 0, sizeof o);
    o.scale_mode = KS_SCALE_RSQRT_D;
    o.scale = 1.0f;
    o.k_begin = 0;
    o.k_end = KS_END;
    o.out_begin = 0;
    o.out_end = KS_END;
    o.heads = KS_HEADS_NONE;
    o.gqa = KS_GQA_DIV;
    return o;
}

/* Resolve one [begin, end) range against n (KS_END -> n) or fail naming it. */
static ks_status resolve_range(const char *name, int64_t b, int64_t e, int64_t n, int64_t *rb, int64_t *re) {
    if (e == KS_END) e = n;
    if (b < 0 || e < 0 || b > e || e > n)
        return ks_errorf(KS_ERR_ARG, "scores: %s range [%lld, %lld) is not within [0, %lld]", name, (long long)b,
                         (long long)e, (long long)n);
    *rb = b;
    *re = e;
    return KS_OK;
}

/* Everything ks_cpu_scores validates that does not involve data pointers. */
static ks_status scores_check(const ks_scores_opts *o, int64_t hq, int64_t hkv, int64_t n, int64_t *kb, int64_t *ke,
                              int64_t *ob, int64_t *oe, int64_t *rows) {
    if (hq < 1) return ks_errorf(KS_ERR_ARG, "scores: n_q_heads = %lld must be >= 1", (long long)hq);
    if (hkv < 1) return ks_errorf(KS_ERR_ARG, "scores: n_kv_heads = %lld must be >= 1", (long long)hkv);
    if (hq % hkv)
        return ks_errorf(KS_ERR_ARG, "scores: n_q_heads = %lld is not a multiple of n_kv_heads = %lld", (long long)hq,
                         (long long)hkv);
    NEED_NONNEG("scores", "n", n);
    NEED_IDX_RANGE("scores", "n", n);
    if ((unsigned)o->scale_mode > KS_SCALE_CUSTOM)
        return ks_errorf(KS_ERR_ARG, "scores: unknown scale_mode %d", (int)o->scale_mode);
    if (o->scale_mode == KS_SCALE_CUSTOM && !isfinite(o->scale))
        return ks_errorf(KS_ERR_ARG, "scores: custom scale %g is not finite", (double)o->scale);
    if ((unsigned)o->heads > KS_HEADS_MEAN) return ks_errorf(KS_ERR_ARG, "scores: unknown heads reduction %d", (int)o->heads);
    if ((unsigned)o->gqa > KS_GQA_MOD) return ks_errorf(KS_ERR_ARG, "scores: unknown gqa mapping %d", (int)o->gqa);
    if (o->q_head_stride < 0 || o->q_row_stride < 0 || o->k_head_stride < 0 || o->k_row_stride < 0)
        return ks_errorf(KS_ERR_ARG, "scores: negative stride (q %lld/%lld, k %lld/%lld)", (long long)o->q_head_stride,
                         (long long)o->q_row_stride, (long long)o->k_head_stride, (long long)o->k_row_stride);
    if (o->n_threads < 0) return ks_errorf(KS_ERR_ARG, "scores: n_threads = %d is negative", o->n_threads);
    if (o->q_rope_inv && (o->q_rope_pos < 0 || !isfinite(o->q_rope_af)))
        return ks_errorf(KS_ERR_ARG, "scores: query rotation at position %d with factor %g (a position >= 0 and a finite factor)",
                         (int)o->q_rope_pos, (double)o->q_rope_af);
    ks_status st = resolve_range("key domain", o->k_begin, o->k_end, n, kb, ke);
    if (st) return st;
    st = resolve_range("output", o->out_begin, o->out_end, n, ob, oe);
    if (st) return st;
    *rows = o->heads == KS_HEADS_NONE ? hq : o->heads == KS_HEADS_GROUP_SUM ? hkv : 1;
    return KS_OK;
}

void ks_rope_rows_f32(float *out, int64_t ohs, int64_t ors, const float *x, int64_t xhs, int64_t xrs, int64_t H, int64_t m,
                      int64_t d, const int32_t *pos, int32_t one, const float *inv, float af) {
    int64_t half = d / 2;
    float cs[512], sn[512]; /* half <= 512: the callers check d <= 1024 */
    for (int64_t i = 0; i < m; i++) {
        int32_t p = pos ? pos[i] : one;
        for (int64_t k = 0; k < half; k++) {
            float a = (float)p * inv[k]; /* float32 angle, as HF and the CPU backend compute it */
            cs[k] = cosf(a) * af;
            sn[k] = sinf(a) * af;
        }
        for (int64_t h = 0; h < H; h++) {
            const float *v = x + h * xhs + i * xrs;
            float *w = out + h * ohs + i * ors;
            for (int64_t k = 0; k < half; k++) {
                float x0 = v[k], x1 = v[k + half];
                w[k] = x0 * cs[k] - x1 * sn[k];
                w[k + half] = x1 * cs[k] + x0 * sn[k];
            }
        }
    }
}

ks_status ks_scores_out_shape(const ks_scores_opts *opts, int64_t n_q_heads, int64_t n_kv_heads, int64_t n,
                              int64_t *rows, int64_t *cols) {
    ks_scores_opts def = ks_scores_opts_default();
    const ks_scores_opts *o = opts ? opts : &def;
    int64_t kb, ke, ob, oe, r;
    ks_status st = scores_check(o, n_q_heads, n_kv_heads, n, &kb, &ke, &ob, &oe, &r);
    if (st) return st;
    if (rows) *rows = r;
    if (cols) *cols = oe - ob;
    return KS_OK;
}

typedef struct scores_ctx {
    const float *q, *k;
    const int32_t *kpos;  /* (n) or NULL */
    const int64_t *qp;    /* (m) resolved query positions (causal only) */
    int64_t hq, hkv, g, m, d;
    int64_t qhs, qrs, khs, krs;
    int64_t kb, ke;       /* key domain */
    int64_t ob, oe;       /* reported columns */
    int64_t cb, ce;       /* keys whose logits are computed */
    float scale;
    int causal, softmax;
    ks_gqa_map gqa;
    float *acc;           /* (hq, oe - ob) per-head window sums */
    float *lbuf;          /* (nt, SCORES_TILE, ce - cb) logits */
    double *rbuf;         /* (nt, oe - ob) double window sums */
    int nt;
    double deadline;      /* opts->deadline */
    atomic_int *stopped;  /* set by the first thread that finds the deadline passed */
} scores_ctx;

static inline float dotf(const float *a, const float *b, int64_t d) {
    float s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0, s6 = 0, s7 = 0, r = 0;
    int64_t i = 0;
    for (; i + 8 <= d; i += 8) {
        s0 += a[i] * b[i];         s1 += a[i + 1] * b[i + 1];
        s2 += a[i + 2] * b[i + 2]; s3 += a[i + 3] * b[i + 3];
        s4 += a[i + 4] * b[i + 4]; s5 += a[i + 5] * b[i + 5];
        s6 += a[i + 6] * b[i + 6]; s7 += a[i + 7] * b[i + 7];
    }
    for (; i < d; i++) r += a[i] * b[i];
    return ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7)) + r;
}

/* Window sum of query head h into c->acc[h]; L, R: this thread's scratch. */
static void scores_head(const scores_ctx *c, int64_t h, float *L, double *R) {
    int64_t ncols = c->oe - c->ob, w = c->ce - c->cb;
    int64_t lo = KS_MAX(c->cb, c->ob), hi = KS_MIN(c->ce, c->oe); /* computed keys that are reported */
    for (int64_t x = 0; x < ncols; x++) R[x] = 0;
    int64_t kv = c->gqa == KS_GQA_DIV ? h / c->g : h % c->hkv;
    const float *kh = c->k ? c->k + kv * c->khs : NULL; /* NULL: no keys (n = 0), never read */
    for (int64_t i0 = 0; w > 0 && i0 < c->m; i0 += SCORES_TILE) {
        if (c->deadline > 0 && (atomic_load_explicit(c->stopped, memory_order_relaxed) || ks_now() > c->deadline)) {
            atomic_store_explicit(c->stopped, 1, memory_order_relaxed);
            return;
        }
        int tn = (int)KS_MIN((int64_t)SCORES_TILE, c->m - i0);
        const float *qr[SCORES_TILE];
        int64_t lim[SCORES_TILE]; /* key j is visible to tile row t iff kpos[j] <= lim[t] */
        for (int t = 0; t < tn; t++) {
            qr[t] = c->q + h * c->qhs + (i0 + t) * c->qrs;
            lim[t] = c->causal ? c->qp[i0 + t] : INT64_MAX;
        }
        for (int64_t j = c->cb; j < c->ce; j++) {
            const float *kr = kh + j * c->krs;
            int64_t pj = c->kpos ? c->kpos[j] : j;
            for (int t = 0; t < tn; t++) L[t * w + (j - c->cb)] = pj <= lim[t] ? c->scale * dotf(qr[t], kr, c->d) : 0.0f;
        }
        for (int t = 0; t < tn; t++) {
            float *l = L + t * w - c->cb; /* l[j] for j in [cb, ce) */
#define VISIBLE(j) ((c->kpos ? (int64_t)c->kpos[j] : (j)) <= lim[t])
            if (!c->softmax) {
                for (int64_t j = lo; j < hi; j++)
                    if (VISIBLE(j)) R[j - c->ob] += l[j];
                continue;
            }
            float mx = 0;
            int any = 0;
            for (int64_t j = c->cb; j < c->ce; j++)
                if (VISIBLE(j) && (!any || l[j] > mx || isnan(l[j]))) { mx = l[j]; any = 1; }
            if (!any) continue; /* the row sees nothing: adds 0 */
            double z = 0;
            for (int64_t j = c->cb; j < c->ce; j++)
                if (VISIBLE(j)) { l[j] = expf(l[j] - mx); z += l[j]; }
            double inv = 1.0 / z;
            for (int64_t j = lo; j < hi; j++)
                if (VISIBLE(j)) R[j - c->ob] += (double)l[j] * inv;
#undef VISIBLE
        }
    }
    float *acc = c->acc + h * ncols;
    for (int64_t x = 0; x < ncols; x++) acc[x] = (float)R[x];
}

typedef struct { const scores_ctx *c; int tid; } scores_arg;

static void *scores_worker(void *p) {
    const scores_arg *a = p;
    const scores_ctx *c = a->c;
    float *L = c->lbuf + (int64_t)a->tid * SCORES_TILE * (c->ce - c->cb);
    double *R = c->rbuf + (int64_t)a->tid * (c->oe - c->ob);
    for (int64_t h = a->tid; h < c->hq; h += c->nt) scores_head(c, h, L, R);
    return NULL;
}

static int scores_auto_threads(int64_t hq, int64_t work) {
    if (work < (1 << 22)) return 1;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int64_t nt = cpus > 0 ? cpus : 1;
    return (int)KS_MIN(KS_MIN(nt, (int64_t)16), hq);
}

ks_status ks_cpu_scores(const float *q, const int32_t *qpos, int64_t n_q_heads, int64_t m, const float *k,
                        const int32_t *kpos, int64_t n_kv_heads, int64_t n, int64_t d, const ks_scores_opts *opts,
                        float *out) {
    ks_scores_opts def = ks_scores_opts_default();
    const ks_scores_opts *o = opts ? opts : &def;
    scores_ctx c;
    memset(&c, 0, sizeof c);
    int64_t rows, tmp;
    ks_status st = scores_check(o, n_q_heads, n_kv_heads, n, &c.kb, &c.ke, &c.ob, &c.oe, &rows);
    if (st) return st;
    NEED_NONNEG("scores", "m", m);
    NEED_IDX_RANGE("scores", "m", m);
    if (d < 1) return ks_errorf(KS_ERR_ARG, "scores: d = %lld must be >= 1", (long long)d);
    if (o->q_rope_inv && (d % 2 || d > 1024))
        return ks_errorf(KS_ERR_ARG, "scores: a query rotation needs an even d <= 1024, got %lld", (long long)d);
    int64_t ncols = c.oe - c.ob;
    if ((st = mul_size("scores", rows, ncols, &tmp)) || (st = mul_size("scores", n_q_heads, ncols, &tmp)) ||
        (st = mul_size("scores", m, d, &tmp)) || (st = mul_size("scores", n, d, &tmp)))
        return st;
    NEED_PTR("scores", "out", out, rows * ncols);
    NEED_PTR("scores", "q", q, m);
    NEED_PTR("scores", "k", k, n);
    if (o->causal && !qpos && m > n)
        return ks_errorf(KS_ERR_ARG,
                         "scores: causal with implicit query positions needs m <= n (m = %lld, n = %lld); pass qpos",
                         (long long)m, (long long)n);
    if (o->skip && *o->skip != 0.0f) { /* skipped (a device decision's CPU twin): zeros, nothing read */
        if (rows > 0 && ncols > 0) memset(out, 0, sizeof(float) * (size_t)(rows * ncols));
        return KS_OK;
    }

    c.q = q;
    c.k = k;
    c.kpos = kpos;
    c.hq = n_q_heads;
    c.hkv = n_kv_heads;
    c.g = n_q_heads / n_kv_heads;
    c.m = m;
    c.d = d;
    c.qhs = o->q_head_stride ? o->q_head_stride : m * d;
    c.qrs = o->q_row_stride ? o->q_row_stride : d;
    c.khs = o->k_head_stride ? o->k_head_stride : n * d;
    c.krs = o->k_row_stride ? o->k_row_stride : d;
    c.scale = o->scale_mode == KS_SCALE_RSQRT_D ? (float)(1.0 / sqrt((double)d))
            : o->scale_mode == KS_SCALE_ONE     ? 1.0f
                                                : o->scale;
    c.causal = o->causal != 0;
    c.softmax = o->softmax != 0;
    c.gqa = o->gqa;
    /* The softmax needs every domain key for its normaliser; raw logits only the reported ones. */
    c.cb = c.softmax ? c.kb : KS_MAX(c.kb, c.ob);
    c.ce = c.softmax ? c.ke : KS_MIN(c.ke, c.oe);
    if (c.ce < c.cb) c.ce = c.cb;
    int64_t w = c.ce - c.cb;

    int64_t work = 0;
    if (__builtin_mul_overflow(n_q_heads * m, w, &work) || __builtin_mul_overflow(work, d, &work)) work = INT64_MAX;
    int nt = o->n_threads ? o->n_threads : scores_auto_threads(n_q_heads, work);
    nt = (int)KS_MIN(KS_MIN((int64_t)nt, n_q_heads), (int64_t)16);
    c.nt = nt;
    atomic_int stopped;
    atomic_init(&stopped, 0);
    c.deadline = o->deadline;
    c.stopped = &stopped;

    int64_t *qp = NULL;
    float *acc = NULL, *lbuf = NULL, *qrot = NULL;
    double *rbuf = NULL;
    st = KS_ERR_OOM;
    if (o->q_rope_inv && m > 0) { /* the rotated queries, (H, m, d) contiguous */
        if (!(qrot = ks_malloc((size_t)(n_q_heads * m * d) * sizeof *qrot))) goto done;
        ks_rope_rows_f32(qrot, m * d, d, q, c.qhs, c.qrs, n_q_heads, m, d, NULL, o->q_rope_pos, o->q_rope_inv, o->q_rope_af);
        c.q = qrot;
        c.qhs = m * d;
        c.qrs = d;
    }
    if (c.causal && m > 0) {
        if (!(qp = ks_malloc((size_t)m * sizeof *qp))) goto done;
        for (int64_t i = 0; i < m; i++)
            qp[i] = qpos ? qpos[i] : kpos ? kpos[n - m + i] : n - m + i;
    }
    c.qp = qp;
    if (o->heads == KS_HEADS_NONE) c.acc = out; /* per-head rows are the output */
    else if (!(acc = ks_malloc((size_t)(n_q_heads * ncols) * sizeof *acc))) goto done;
    else c.acc = acc;
    if (!(lbuf = ks_malloc((size_t)nt * SCORES_TILE * (size_t)w * sizeof *lbuf))) goto done;
    if (!(rbuf = ks_malloc((size_t)nt * (size_t)ncols * sizeof *rbuf))) goto done;
    c.lbuf = lbuf;
    c.rbuf = rbuf;

    /* Heads are split statically over threads; each head's row is computed by one thread,
     * so the result does not depend on the thread count. */
    scores_arg args[16];
    pthread_t th[16];
    int started = 0;
    for (int t = 1; t < nt; t++) {
        args[t] = (scores_arg){&c, t};
        if (pthread_create(&th[t], NULL, scores_worker, &args[t]) != 0) break;
        started = t;
    }
    if (started + 1 < nt) { /* thread creation failed: the caller's thread takes the rest */
        for (int t = 1; t <= started; t++) pthread_join(th[t], NULL);
        c.nt = 1;
        started = 0;
    }
    args[0] = (scores_arg){&c, 0};
    scores_worker(&args[0]);
    for (int t = 1; t <= started; t++) pthread_join(th[t], NULL);
    if (atomic_load(&stopped)) {
        st = ks_errorf(KS_ERR_INTERRUPTED, "scores: stopped at the caller's deadline");
        goto done;
    }

    /* Head reduction, in double, in ascending head order. */
    if (o->heads == KS_HEADS_GROUP_SUM) {
        for (int64_t r = 0; r < n_kv_heads; r++)
            for (int64_t x = 0; x < ncols; x++) {
                double s = 0;
                for (int64_t h = 0; h < n_q_heads; h++) {
                    int64_t kv = c.gqa == KS_GQA_DIV ? h / c.g : h % n_kv_heads;
                    if (kv == r) s += acc[h * ncols + x];
                }
                out[r * ncols + x] = (float)s;
            }
    } else if (o->heads == KS_HEADS_SUM || o->heads == KS_HEADS_MEAN) {
        for (int64_t x = 0; x < ncols; x++) {
            double s = 0;
            for (int64_t h = 0; h < n_q_heads; h++) s += acc[h * ncols + x];
            out[x] = (float)(o->heads == KS_HEADS_MEAN ? s / (double)n_q_heads : s);
        }
    }
    st = KS_OK;
done:
    free(qp);
    free(acc);
    free(lbuf);
    free(rbuf);
    free(qrot);
    return st;
}
