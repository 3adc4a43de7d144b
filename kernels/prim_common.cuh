/* prim_common.cuh — helpers shared by the primitive kernels (prim_*.cu). Internal. */
#ifndef KS_CUDA_PRIM_COMMON_CUH
#define KS_CUDA_PRIM_COMMON_CUH

#include "common.cuh"
#include "ks_cuda_prims.h"

#include <math.h>

#define IDX_MAX ((int64_t)INT32_MAX)

/* Argument checks with the CPU reference's messages; return KS_ERR_ARG from the caller. */
#define P_NONNEG(prim, name, v)                                                                    \
    do {                                                                                           \
        if ((v) < 0) return ks_errorf(KS_ERR_ARG, "%s: %s = %lld is negative", prim, name, (long long)(v)); \
    } while (0)
#define P_PTR(prim, name, p, count)                                                                \
    do {                                                                                           \
        if (!(p) && (count) > 0) return ks_errorf(KS_ERR_ARG, "%s: %s is NULL", prim, name);       \
    } while (0)
#define P_IDX_RANGE(prim, name, v)                                                                 \
    do {                                                                                           \
        if ((v) > IDX_MAX)                                                                         \
            return ks_errorf(KS_ERR_ARG, "%s: %s = %lld exceeds the int32 index range", prim, name, (long long)(v)); \
    } while (0)

static inline ks_status p_mul_size(const char *prim, int64_t a, int64_t b, int64_t *out) {
    if (__builtin_mul_overflow(a, b, out) || *out > (int64_t)(SIZE_MAX / 8))
        return ks_errorf(KS_ERR_ARG, "%s: size %lld x %lld is too large", prim, (long long)a, (long long)b);
    return KS_OK;
}

/* The order-preserving key of core/prims.c: unsigned order == float order, NaN -> 0 (below
 * -inf), -0.0 -> +0.0. */
static __device__ __forceinline__ uint32_t f32_key(float f) {
    uint32_t u = __float_as_uint(f);
    uint32_t key = u ^ ((uint32_t) - (int32_t)(u >> 31) | 0x80000000u);
    uint32_t mag = u & 0x7fffffffu;
    key = mag == 0 ? 0x80000000u : key;
    return mag > 0x7f800000u ? 0u : key;
}

/* NaN-propagating max, as the CPU's max_nan. */
static __device__ __forceinline__ float max_nan(float a, float b) { return (a > b || isnan(a)) ? a : b; }

/* What both scores kernels (prim_scores.cu, prim_scores1.cu) take from ks_scores_opts for m query
 * rows of n keys of d dims: the strides (elements), the scale, the key domain [kb, ke), the output
 * columns [ob, oe), the keys whose logits are computed [cb, ce) (the whole domain with a softmax,
 * whose normaliser needs every key; else only the reported ones) and the computed keys that are
 * reported [lo, hi). */
struct sc_plan {
    int64_t qhs, qrs, khs, krs, kb, ke, ob, oe, cb, ce, lo, hi;
    float scale;
    int causal, softmax, gqa_mod, heads;
    const float *rinv; /* NULL, or the queries' rotation (ks_scores_opts.q_rope_inv: d / 2 host floats) */
    const float *skip; /* NULL, or ks_scores_opts.skip (one device float: nonzero = zeros out, nothing read) */
    float raf;
    int32_t rpos;
    const int32_t *gd; /* NULL, or a recorded handler's growth (ks_cuda_scores_grow): the step slot's delta, */
    int32_t goff;      /* less goff, is the rows added since the recording (<= grow): ke, oe, ce and hi */
    int64_t grow;      /* follow them (prim_scores1.cu only) */
};
static inline sc_plan sc_plan_of(const ks_scores_opts *o, int64_t m, int64_t n, int64_t d) {
    sc_plan p;
    p.qhs = o->q_head_stride ? o->q_head_stride : m * d;
    p.qrs = o->q_row_stride ? o->q_row_stride : d;
    p.khs = o->k_head_stride ? o->k_head_stride : n * d;
    p.krs = o->k_row_stride ? o->k_row_stride : d;
    p.kb = o->k_begin;
    p.ke = o->k_end == KS_END ? n : o->k_end;
    p.ob = o->out_begin;
    p.oe = o->out_end == KS_END ? n : o->out_end;
    p.scale = o->scale_mode == KS_SCALE_RSQRT_D ? (float)(1.0 / sqrt((double)d))
            : o->scale_mode == KS_SCALE_ONE     ? 1.0f
                                                : o->scale;
    p.causal = o->causal != 0;
    p.softmax = o->softmax != 0;
    p.gqa_mod = o->gqa == KS_GQA_MOD;
    p.heads = (int)o->heads;
    p.rinv = o->q_rope_inv;
    p.skip = o->skip;
    p.raf = o->q_rope_af;
    p.rpos = o->q_rope_pos;
    p.gd = NULL;
    p.goff = 0;
    p.grow = 0;
    p.cb = p.softmax ? p.kb : KS_MAX(p.kb, p.ob);
    p.ce = p.softmax ? p.ke : KS_MIN(p.ke, p.oe);
    if (p.ce < p.cb) p.ce = p.cb;
    p.lo = KS_MAX(p.cb, p.ob);
    p.hi = KS_MIN(p.ce, p.oe);
    return p;
}

/* prim_scores1.cu: ks_cuda_scores for m = 1 (one query row per head). fits: whether the shapes
 * suit it (bf16 keys, g = H / Hkv <= 8, d % 16 == 0, d <= 128, 16-byte aligned keys and strides);
 * ks_cuda_scores1 expects ks_cuda_scores' argument checks done and rows * ncols > 0; it returns
 * KS_ERR_UNSUPPORTED, with nothing queued and no error recorded, when the KV heads outnumber the
 * blocks the device can hold at once (its launch is cooperative), and the caller takes the
 * general kernel. */
extern "C" int ks_cuda_scores1_fits(int64_t n_q_heads, int64_t n_kv_heads, int64_t m, const void *k, int k_bf16,
                                    int64_t d, const sc_plan &p);
ks_status ks_cuda_scores1(cudaStream_t s, const ks_cuda_scratch *sc, const float *q, const int32_t *qpos,
                          int64_t n_q_heads, const void *k, const int32_t *kpos, int64_t n_kv_heads, int64_t n,
                          int64_t d, const sc_plan &p, int64_t ncols, float *out);

/* Scratch allocations released when the holder goes out of scope (after the launches). */
struct scratch_set {
    const ks_cuda_scratch *sc;
    void *p[8];
    int n;
    explicit scratch_set(const ks_cuda_scratch *s) : sc(s), n(0) {}
    ~scratch_set() {
        for (int i = 0; i < n; i++)
            if (p[i]) sc->free(sc->ud, p[i]);
    }
    /* 256-byte aligned block of `bytes` (at least 16); NULL + KS_ERR_OOM recorded on failure */
    void *get(size_t bytes) {
        if (n == 8) { ks_errorf(KS_ERR_INTERNAL, "scratch: too many allocations"); return NULL; }
        void *q = sc->alloc(sc->ud, bytes ? bytes : 16);
        p[n++] = q;
        return q;
    }
};

#define P_SCRATCH(ptr, set, bytes, what)                                                           \
    do {                                                                                           \
        if (!((ptr) = (decltype(ptr))(set).get(bytes)))                                            \
            return ks_error_prefix(KS_ERR_OOM, "%s", what);                                        \
    } while (0)

#endif
