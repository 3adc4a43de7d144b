/* cuda_backend.cu — the CUDA implementation of core/backend.h (see ks_cuda.h).
 *
 * Storage: weights bf16 (vectors float32), KV cache bf16 + int32 positions, activations float32.
 * Host arrays handed to an operation (token ids, positions, index lists) are copied through a
 * pinned staging ring into stream-ordered device buffers, so no operation waits for the GPU
 * except download/sync (and a wrap of the ring). GEMMs: cuBLAS bf16 x bf16 -> float32 with
 * float32 compute, the float32 activations converted to bf16 in a scratch buffer first. */
#include "common.cuh"
#include "ks_cuda.h"
#include "attn_prep.cuh"
#include "gemv.cuh"
#include "ceilings.cuh"

#include <cublas_v2.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "backend.h"
#include "config.h"
}

/* ================================================================ context */

struct ks_weight {
    void *data;            /* (rows, cols) bf16, or float32 for vectors (cols == 1) */
    int64_t rows, cols;
    int type;              /* KS_CUDA_BF16 or KS_CUDA_F32 */
};

#define ROPE_CACHE 4 /* rope configurations whose inv_freq stays on the device */

typedef struct cuda_ctx {
    int device, n_sm;
    cudaStream_t stream;
    cublasHandle_t blas;
    void *blas_ws;
    cudaMemPool_t pool;
    unsigned char *pin;    /* pinned staging ring for small host -> device copies */
    size_t pin_cap, pin_off;
    int sm_major;          /* compute capability (major): the prefill planner's architecture family */
    ks_backend_opts o;     /* this backend's options (kernel choices, PDL, splits; ks_backend.opts too) */
    ks_cuda_attn_path attn_path; /* tests: ks_cuda_backend_set_attn_path */
    long prefill_calls[3]; /* prefill attention launches per ks_cuda_prefill_kernel (tests) */
    ks_memtrack *mem;      /* sizes of our device allocations (mem_stats) */
    /* profiling marks (prof_mark / prof_collect): events recorded on the stream, resolved in
     * batches; pacc holds the seconds of intervals already resolved, per tag */
    cudaEvent_t *pev;      /* (pcap) */
    int *ptag;             /* (pcap) tag of the interval ending at each event */
    int pn, pcap;
    double pacc[KS_PROF_TAGS];
    /* inv_freq tables on the device, one per rope configuration seen (rope_inv_dev) */
    struct rope_cache {
        struct rope_key {
            int type, head_dim, orig_max_pos, use_long;
            double theta, factor, low, high, attn_factor;
            const float *short_factor, *long_factor;
        } key;
        float *dev; /* (head_dim/2) */
    } rc[ROPE_CACHE];
    int rc_next;
    unsigned rc_gen;       /* bumped when a table is replaced (graphs that read the old one are stale) */
    /* decode-step graphs (graph_begin .. graph_end): while `rec`, calls record instead of run */
    int rec, rec_failed;
    int32_t *h_step;       /* pinned {id, pos, delta, 0}: written by graph_run, copied by the graph's first node */
    int32_t *d_step;       /* device copy the recorded kernels read */
    void *gws;             /* attention split workspace of recorded steps (GRAPH_WS bytes) */
} cuda_ctx;

struct ks_graph {
    cudaGraphExec_t exec;
    int32_t pos0;          /* position at graph_begin */
    unsigned rc_gen;
};

#define PIN_CAP ((size_t)16 << 20)
#define BLAS_WS ((size_t)32 << 20)
#define MM_CONV_BYTES ((size_t)64 << 20) /* bf16 copy of a matmul's input: converted in row chunks of this size */
#define PROF_CAP 4096                    /* profiling events in flight before a batch is resolved */
#define GRAPH_WS ((size_t)8 << 20)       /* split-KV workspace of a recorded decode step */

static cuda_ctx *CTX(ks_backend *b) { return (cuda_ctx *)b->ctx; }

/* While a decode step is being recorded (graph_begin): a call or path that cannot be replayed
 * (it would bake per-token values into the graph, allocate, or wait) fails the recording. */
static ks_status rec_fail(cuda_ctx *c, const char *what) {
    c->rec_failed = 1;
    return ks_errorf(KS_ERR_UNSUPPORTED, "cuda: %s cannot be recorded in a decode graph", what);
}

static ks_status blas_status(cublasStatus_t s, const char *what) {
    if (s == CUBLAS_STATUS_SUCCESS) return KS_OK;
    return ks_errorf(s == CUBLAS_STATUS_ALLOC_FAILED ? KS_ERR_OOM : KS_ERR_DEVICE, "cuda: %s: cuBLAS status %d", what,
                     (int)s);
}

static ks_status oom(size_t bytes, const char *what) {
    size_t fr = 0, tot = 0;
    cudaMemGetInfo(&fr, &tot);
    return ks_errorf(KS_ERR_OOM, "cuda: out of device memory allocating %zu bytes for %s (%zu of %zu MiB free)", bytes,
                     what, fr >> 20, tot >> 20);
}

/* Stream-ordered scratch from the pool; on exhaustion the pool's cached memory is released
 * and the allocation retried once. */
static ks_status dev_alloc(cuda_ctx *c, size_t bytes, const char *what, void **out) {
    *out = NULL;
    if (c->rec) return rec_fail(c, what);
    if (!bytes) bytes = 16;
    cudaError_t e = cudaMallocFromPoolAsync(out, bytes, c->pool, c->stream);
    if (e == cudaErrorMemoryAllocation) {
        cudaGetLastError();
        cudaStreamSynchronize(c->stream);
        cudaMemPoolTrimTo(c->pool, 0);
        e = cudaMallocFromPoolAsync(out, bytes, c->pool, c->stream);
    }
    if (e == cudaErrorMemoryAllocation) { cudaGetLastError(); *out = NULL; return oom(bytes, what); }
    if (e != cudaSuccess) { *out = NULL; return ks_cuda_status(e, what); }
    ks_status st = ks_memtrack_add(c->mem, *out, bytes, 1);
    if (st) { cudaFreeAsync(*out, c->stream); *out = NULL; }
    return st;
}
static void dev_free(cuda_ctx *c, void *p) {
    if (!p) return;
    ks_memtrack_remove(c->mem, p);
    cudaFreeAsync(p, c->stream);
}

/* Long-lived memory (weights, KV cache): plain cudaMalloc, so cudaFree really returns it. */
static ks_status raw_alloc(cuda_ctx *c, size_t bytes, const char *what, void **out) {
    *out = NULL;
    if (c->rec) return rec_fail(c, what);
    if (!bytes) bytes = 16;
    cudaError_t e = cudaMalloc(out, bytes);
    if (e == cudaErrorMemoryAllocation) {
        cudaGetLastError();
        cudaStreamSynchronize(c->stream);
        cudaMemPoolTrimTo(c->pool, 0);
        e = cudaMalloc(out, bytes);
    }
    if (e == cudaErrorMemoryAllocation) { cudaGetLastError(); *out = NULL; return oom(bytes, what); }
    if (e != cudaSuccess) { *out = NULL; return ks_cuda_status(e, what); }
    ks_status st = ks_memtrack_add(c->mem, *out, bytes, 0);
    if (st) { cudaFree(*out); *out = NULL; }
    return st;
}
static void raw_free(cuda_ctx *c, void *p) {
    if (!p) return;
    ks_memtrack_remove(c->mem, p);
    cudaFree(p);
}

/* Queue a host -> device copy of a host array the caller may reuse as soon as this returns. */
static ks_status stage_h2d(cuda_ctx *c, void *dst, const void *src, size_t bytes, const char *what) {
    if (!bytes) return KS_OK;
    if (c->rec) return rec_fail(c, what);
    if (bytes <= KS_CUDA_PUT_MAX) return ks_cuda_put(c->stream, dst, src, bytes, c->o.pdl); /* as a kernel argument */
    if (bytes > c->pin_cap / 4) { /* large: copy straight from pageable memory and wait */
        KS_CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->stream), what);
        KS_CU(cudaStreamSynchronize(c->stream), what);
        return KS_OK;
    }
    size_t need = (bytes + 255) & ~(size_t)255;
    if (c->pin_off + need > c->pin_cap) { /* wrap: earlier copies out of the ring must be done */
        KS_CU(cudaStreamSynchronize(c->stream), what);
        c->pin_off = 0;
    }
    memcpy(c->pin + c->pin_off, src, bytes);
    KS_CU(cudaMemcpyAsync(dst, c->pin + c->pin_off, bytes, cudaMemcpyHostToDevice, c->stream), what);
    c->pin_off += need;
    return KS_OK;
}

/* A device copy of a host array; free with dev_free after the kernels that read it are queued. */
static ks_status upload_tmp(cuda_ctx *c, const void *src, size_t bytes, const char *what, void **out) {
    ks_status st = dev_alloc(c, bytes, what, out);
    if (st) return st;
    st = stage_h2d(c, *out, src, bytes, what);
    if (st) { dev_free(c, *out); *out = NULL; }
    return st;
}

/* ================================================================ memory */

static void *cu_alloc(ks_backend *b, size_t bytes) {
    void *p;
    if (dev_alloc(CTX(b), bytes, "alloc", &p)) return NULL;
    return p;
}
static void cu_free(ks_backend *b, void *p) { dev_free(CTX(b), p); }

static ks_status cu_upload(ks_backend *b, void *dst, const void *src, size_t n) {
    cuda_ctx *c = CTX(b);
    if (c->rec) return rec_fail(c, "upload");
    if (!n) return KS_OK;
    KS_CU(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, c->stream), "upload");
    KS_CU(cudaStreamSynchronize(c->stream), "upload");
    return KS_OK;
}
static ks_status cu_download(ks_backend *b, void *dst, const void *src, size_t n) {
    cuda_ctx *c = CTX(b);
    if (c->rec) return rec_fail(c, "download");
    if (!n) return KS_OK;
    KS_CU(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, c->stream), "download");
    KS_CU(cudaStreamSynchronize(c->stream), "download (or an earlier kernel)");
    return KS_OK;
}
static ks_status cu_copy(ks_backend *b, void *dst, const void *src, size_t n) {
    cuda_ctx *c = CTX(b);
    if (!n || dst == src) return KS_OK;
    const char *d = (const char *)dst, *s = (const char *)src;
    if (d < s + n && s < d + n) { /* overlap: memmove through a temporary */
        void *t;
        ks_status st = dev_alloc(c, n, "copy", &t);
        if (st) return st;
        cudaError_t e = cudaMemcpyAsync(t, src, n, cudaMemcpyDeviceToDevice, c->stream);
        if (!e) e = cudaMemcpyAsync(dst, t, n, cudaMemcpyDeviceToDevice, c->stream);
        dev_free(c, t);
        return ks_cuda_status(e, "copy");
    }
    KS_CU(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, c->stream), "copy");
    return KS_OK;
}
static ks_status cu_sync(ks_backend *b) {
    if (CTX(b)->rec) return rec_fail(CTX(b), "sync");
    KS_CU(cudaStreamSynchronize(CTX(b)->stream), "sync (an earlier kernel failed)");
    return KS_OK;
}

/* ================================================================ weights */

static int st_type(ks_dtype dt) {
    return dt == KS_DT_F32 ? KS_CUDA_F32 : dt == KS_DT_F16 ? KS_CUDA_F16 : dt == KS_DT_BF16 ? KS_CUDA_BF16 : -1;
}

static ks_status cu_weight_create(ks_backend *b, const ks_st_tensor *t, int64_t row0, int64_t rows, ks_weight **out) {
    cuda_ctx *c = CTX(b);
    *out = NULL;
    if (t->ndim < 1 || t->ndim > 2) return ks_errorf(KS_ERR_SHAPE, "tensor %s: expected 1 or 2 dims, has %d", t->name, t->ndim);
    int64_t cols = t->ndim == 1 ? 1 : t->shape[1], trows = t->shape[0];
    if (row0 < 0 || rows < 0 || row0 + rows > trows)
        return ks_errorf(KS_ERR_SHAPE, "tensor %s: rows [%lld, %lld) out of its %lld rows", t->name, (long long)row0,
                         (long long)(row0 + rows), (long long)trows);
    int src = st_type(t->dtype);
    if (src < 0)
        return ks_errorf(KS_ERR_DTYPE, "tensor %s: dtype %s is not a float type (F32, F16 or BF16)", t->name,
                         ks_dtype_name(t->dtype));
    ks_weight *w = (ks_weight *)ks_calloc(1, sizeof *w);
    if (!w) return KS_ERR_OOM;
    w->rows = rows;
    w->cols = cols;
    w->type = cols == 1 ? KS_CUDA_F32 : KS_CUDA_BF16;
    size_t n = (size_t)rows * cols, esz = ks_dtype_size(t->dtype), osz = w->type == KS_CUDA_F32 ? 4 : 2;
    const unsigned char *sp = (const unsigned char *)t->data + (size_t)row0 * cols * esz;
    ks_status st = raw_alloc(c, n * osz, t->name, &w->data);
    if (st) { free(w); return st; }
    if (src == w->type) {
        cudaError_t e = cudaMemcpyAsync(w->data, sp, n * esz, cudaMemcpyHostToDevice, c->stream);
        if (!e) e = cudaStreamSynchronize(c->stream);
        if (e) st = ks_cuda_status(e, "weight upload");
    } else {
        /* convert on the device, in chunks of up to 64 MiB of source */
        size_t chunk = ((size_t)64 << 20) / esz;
        void *tmp = NULL;
        st = dev_alloc(c, KS_MIN(chunk, n) * esz, "weight conversion", &tmp);
        for (size_t i = 0; !st && i < n; i += chunk) {
            size_t m = KS_MIN(chunk, n - i);
            cudaError_t e = cudaMemcpyAsync(tmp, sp + i * esz, m * esz, cudaMemcpyHostToDevice, c->stream);
            if (e) { st = ks_cuda_status(e, "weight upload"); break; }
            st = ks_cuda_convert(c->stream, (unsigned char *)w->data + i * osz, w->type, tmp, src, m);
            if (!st) st = ks_cuda_status(cudaStreamSynchronize(c->stream), "weight conversion");
        }
        dev_free(c, tmp);
    }
    if (st) { raw_free(c, w->data); free(w); return ks_error_prefix(st, "tensor %s", t->name); }
    *out = w;
    return KS_OK;
}

static ks_status cu_weight_random(ks_backend *b, int64_t rows, int64_t cols, uint64_t seed, float scale, float offset,
                                  ks_weight **out) {
    cuda_ctx *c = CTX(b);
    *out = NULL;
    if (rows < 0 || cols < 1) return ks_errorf(KS_ERR_SHAPE, "weight_random: bad shape (%lld, %lld)", (long long)rows, (long long)cols);
    ks_weight *w = (ks_weight *)ks_calloc(1, sizeof *w);
    if (!w) return KS_ERR_OOM;
    w->rows = rows;
    w->cols = cols;
    w->type = cols == 1 ? KS_CUDA_F32 : KS_CUDA_BF16;
    size_t n = (size_t)rows * cols;
    ks_status st = raw_alloc(c, n * (w->type == KS_CUDA_F32 ? 4 : 2), "random weight", &w->data);
    if (!st) st = ks_cuda_random(c->stream, w->data, w->type, rows, cols, seed, scale, offset);
    if (!st) st = ks_cuda_status(cudaStreamSynchronize(c->stream), "random weight");
    if (st) { raw_free(c, w->data); free(w); return st; }
    *out = w;
    return KS_OK;
}

static void cu_weight_free(ks_backend *b, ks_weight *w) {
    if (!w) return;
    cuda_ctx *c = CTX(b);
    cudaStreamSynchronize(c->stream);
    raw_free(c, w->data);
    free(w);
}

/* ================================================================ dense ops */

/* y = x W^T + bias (acc = 0) or y += x W^T + bias (acc = 1) */
static ks_status matmul_impl(ks_backend *b, float *y, const float *x, const ks_weight *W, const ks_weight *bias, int n,
                             int in, int out, int acc) {
    cuda_ctx *c = CTX(b);
    if (W->cols != in || W->rows != out)
        return ks_errorf(KS_ERR_INTERNAL, "matmul: weight is (%lld, %lld), expected (%d, %d)", (long long)W->rows,
                         (long long)W->cols, out, in);
    if (n <= 0) return KS_OK;
    double t0 = 0;
    if (b->count_stats) {
        if (c->rec) return rec_fail(c, "a timed matmul (count_stats)");
        KS_CU(cudaStreamSynchronize(c->stream), "matmul (timing)");
        t0 = ks_now();
    }
    const float one = 1.0f, zero = 0.0f, *beta = acc ? &one : &zero;
    ks_status st;
    if (c->o.decode_kernels && W->type == KS_CUDA_BF16 && n == 1 && ks_cuda_gemv_supported(W->data, in) && (uintptr_t)x % 16 == 0 &&
        (!bias || bias->type == KS_CUDA_F32)) {
        /* one row (decode, logits): stream the bf16 weights once, float32 input, bias fused */
        if (bias && bias->rows * bias->cols != out)
            return ks_errorf(KS_ERR_INTERNAL, "matmul: bias of %lld values for %d outputs", (long long)(bias->rows * bias->cols), out);
        st = (acc ? ks_cuda_gemv_acc : ks_cuda_gemv)(c->stream, y, x, W->data, bias ? (const float *)bias->data : NULL, in, out,
                                                     c->o.pdl);
        if (st) return st;
        bias = NULL;
    } else if (W->type == KS_CUDA_BF16) {
        /* the bf16 copy of x in row chunks of at most MM_CONV_BYTES (a 128K-row input would
         * otherwise need a 1 GiB temporary), one GEMM per chunk */
        int rc = (int)KS_MAX((size_t)1, KS_MIN((size_t)n, MM_CONV_BYTES / ((size_t)in * 2)));
        void *xb;
        if ((st = dev_alloc(c, (size_t)rc * in * 2, "matmul input (bf16)", &xb))) return st;
        for (int r0 = 0; r0 < n && !st; r0 += rc) {
            int rn = KS_MIN(rc, n - r0);
            st = ks_cuda_convert(c->stream, xb, KS_CUDA_BF16, x + (size_t)r0 * in, KS_CUDA_F32, (size_t)rn * in);
            if (!st)
                st = blas_status(cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, out, rn, in, &one, W->data, CUDA_R_16BF,
                                              in, xb, CUDA_R_16BF, in, beta, y + (size_t)r0 * out, CUDA_R_32F, out,
                                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                                 "matmul (cublasGemmEx bf16)");
        }
        dev_free(c, xb);
    } else {
        st = blas_status(cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, &one, W->data, CUDA_R_32F, in, x,
                                      CUDA_R_32F, in, beta, y, CUDA_R_32F, out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                         "matmul (cublasGemmEx f32)");
    }
    if (st) return st;
    if (bias) {
        if (bias->type != KS_CUDA_F32 || bias->rows * bias->cols != out)
            return ks_errorf(KS_ERR_INTERNAL, "matmul: bias of %lld values for %d outputs", (long long)(bias->rows * bias->cols), out);
        if ((st = ks_cuda_add_bias(c->stream, y, (const float *)bias->data, n, out))) return st;
    }
    if (b->count_stats) {
        KS_CU(cudaStreamSynchronize(c->stream), "matmul (timing)");
        b->stat_matmul_s += ks_now() - t0;
    }
    b->stat_matmul_flop += 2.0 * n * in * out;
    return KS_OK;
}

/* y (n, out) = beta * y + x W^T: x (n, in) bf16, W (out, in) bf16, y float32 (yt CUDA_R_32F) or
 * bf16 (CUDA_R_16BF); float32 accumulation */
static ks_status gemm_bf16(cuda_ctx *c, void *y, cudaDataType yt, const void *xb, const ks_weight *W, int n, int in,
                           int out, float beta) {
    const float one = 1.0f;
    return blas_status(cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, &one, W->data, CUDA_R_16BF, in, xb,
                                    CUDA_R_16BF, in, &beta, y, yt, out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                       yt == CUDA_R_16BF ? "matmul (cublasGemmEx bf16 -> bf16)" : "matmul (cublasGemmEx bf16)");
}

static ks_status cu_matmul(ks_backend *b, float *y, const float *x, const ks_weight *W, const ks_weight *bias, int n,
                           int in, int out) {
    return matmul_impl(b, y, x, W, bias, n, in, out, 0);
}
static ks_status cu_matmul_add(ks_backend *b, float *y, const float *x, const ks_weight *W, const ks_weight *bias, int n,
                               int in, int out) {
    return matmul_impl(b, y, x, W, bias, n, in, out, 1);
}

static ks_status cu_rope(ks_backend *b, float *x, int n, int n_heads, const int32_t *pos, const ks_rope *r, int max_pos);
static ks_status rope_inv_dev(cuda_ctx *c, const ks_rope *r, int max_pos, const float **out);

/* bench counters for a fused call: like matmul_impl's (a timed call synchronises) */
static ks_status stats_begin(ks_backend *b, double *t0) {
    *t0 = 0;
    if (!b->count_stats) return KS_OK;
    if (CTX(b)->rec) return rec_fail(CTX(b), "a timed matmul (count_stats)");
    KS_CU(cudaStreamSynchronize(CTX(b)->stream), "matmul (timing)");
    *t0 = ks_now();
    return KS_OK;
}
static ks_status stats_end(ks_backend *b, double t0, double flop) {
    if (b->count_stats) {
        KS_CU(cudaStreamSynchronize(CTX(b)->stream), "matmul (timing)");
        b->stat_matmul_s += ks_now() - t0;
    }
    b->stat_matmul_flop += flop;
    return KS_OK;
}

static int gemv_weight_ok(const ks_weight *W, int in, int out) {
    return W->type == KS_CUDA_BF16 && W->cols == in && W->rows == out && ks_cuda_gemv_supported(W->data, in);
}
static int vec_ok(const ks_weight *v, int n) { return !v || (v->type == KS_CUDA_F32 && v->rows * v->cols == n); }

static ks_status cu_rmsnorm(ks_backend *b, float *out, const float *x, const ks_weight *w, int n, int dim, float eps);

/* A fused call's norm: into the gemv (*nw set) when the kernel takes it, else ks_cuda_rmsnorm
 * first (x then points at xn). */
static ks_status fused_norm(ks_backend *b, const float **x, const ks_weight *norm, float eps, float *xn, int n, int in,
                            int gemv, const float **nw) {
    *nw = NULL;
    if (!norm) return KS_OK;
    if (gemv && norm->type == KS_CUDA_F32 && norm->rows * norm->cols == in &&
        ks_cuda_gemv_norm_supported(*x, (const float *)norm->data, in) && (uintptr_t)xn % 16 == 0) {
        *nw = (const float *)norm->data;
        return KS_OK;
    }
    ks_status st = cu_rmsnorm(b, xn, *x, norm, n, in, eps);
    *x = xn;
    return st;
}

static ks_status cu_kv_append(ks_backend *b, ks_kv_layer *L, const float *k, const float *v, const int32_t *pos, int n);
static ks_status kv_reserve(ks_backend *b, ks_kv_layer *L, int n);

/* matmul_qkv, and with L non-NULL then kv_append(L, k, v, pos, n): on the one-row gemv path the
 * kernel stores the new cache row itself (no kv_append launch) */
static ks_status qkv_impl(ks_backend *b, float *q, float *k, float *v, const float *x, const ks_weight *norm, float eps,
                          float *xn, const ks_weight *Wq, const ks_weight *Wk, const ks_weight *Wv, const ks_weight *bq,
                          const ks_weight *bk, const ks_weight *bv, int n, int in, int H, int Hkv, int hd,
                          const int32_t *pos, const ks_rope *r, int max_pos, ks_kv_layer *L) {
    cuda_ctx *c = CTX(b);
    int QD = H * hd, KD = Hkv * hd;
    if (r && r->head_dim != hd)
        return ks_errorf(KS_ERR_UNSUPPORTED, "matmul_qkv: rope over %d of %d head dims", r->head_dim, hd);
    ks_status st;
    int gemv = n == 1 && c->o.decode_kernels && (uintptr_t)x % 16 == 0 && gemv_weight_ok(Wq, in, QD) &&
               gemv_weight_ok(Wk, in, KD) && gemv_weight_ok(Wv, in, KD) && vec_ok(bq, QD) && vec_ok(bk, KD) &&
               vec_ok(bv, KD) && (!r || (hd % 2 == 0 && hd <= 1024));
    const float *nw;
    if ((st = fused_norm(b, &x, norm, eps, xn, n, in, gemv, &nw))) return st;
    if ((uintptr_t)x % 16) gemv = 0; /* normalised apart into a misaligned xn */
    if (gemv) { /* decode: one launch for the norm, the three projections and RoPE */
        const float *inv = NULL;
        if (r && (st = rope_inv_dev(c, r, max_pos, &inv))) return st;
        double t0;
        if ((st = stats_begin(b, &t0))) return st;
        float *ys[3] = {q, k, v};
        const void *ws[3] = {Wq->data, Wk->data, Wv->data};
        const float *bs[3] = {bq ? (const float *)bq->data : NULL, bk ? (const float *)bk->data : NULL,
                              bv ? (const float *)bv->data : NULL};
        int rows[3] = {QD, KD, KD}, rope[3] = {r != NULL, r != NULL, 0};
        if (L && Hkv <= KS_CUDA_GEMV_KV_MAX_HEADS) { /* the cache row written by the gemv kernel */
            if ((st = kv_reserve(b, L, 1))) return st;
            /* recorded: position and row offset from the step slot (graph_run sets them) */
            ks_cuda_kv_row kr = {L->k, L->v, (int32_t *)L->pos_dev, L->capacity, Hkv, L->n, c->rec ? c->d_step + 1 : NULL};
            st = ks_cuda_gemv_qkv_kv(c->stream, x, nw, eps, nw ? xn : NULL, in, 3, ys, ws, bs, rows, rope, hd, pos[0],
                                     inv, r ? (float)r->attn_factor : 1.0f, &kr, c->o.pdl);
            if (st) return st;
            for (int h = 0; h < Hkv; h++) L->pos[(size_t)h * L->capacity + L->n[h]++] = pos[0];
            return stats_end(b, t0, 2.0 * in * (QD + 2.0 * KD));
        }
        if (c->rec) return rec_fail(c, "matmul_qkv without the cache row in the kernel");
        st = ks_cuda_gemv_qkv(c->stream, x, nw, eps, nw ? xn : NULL, in, 3, ys, ws, bs, rows, rope, hd, pos[0], inv,
                              r ? (float)r->attn_factor : 1.0f, c->o.pdl);
        if (st) return st;
        if ((st = stats_end(b, t0, 2.0 * in * (QD + 2.0 * KD)))) return st;
        return L ? cu_kv_append(b, L, k, v, pos, n) : KS_OK;
    }
    if (c->rec) return rec_fail(c, "matmul_qkv off the one-row gemv path");
    if (n > 1 && Wq->type == KS_CUDA_BF16 && Wk->type == KS_CUDA_BF16 && Wv->type == KS_CUDA_BF16) {
        /* prefill: the rows converted to bf16 once per chunk for all three projections */
        const ks_weight *Ws[3] = {Wq, Wk, Wv}, *Bs[3] = {bq, bk, bv};
        float *Ys[3] = {q, k, v};
        const int outs[3] = {QD, KD, KD};
        for (int i = 0; i < 3; i++) {
            if (Ws[i]->cols != in || Ws[i]->rows != outs[i])
                return ks_errorf(KS_ERR_INTERNAL, "matmul_qkv: weight %d is (%lld, %lld), expected (%d, %d)", i,
                                 (long long)Ws[i]->rows, (long long)Ws[i]->cols, outs[i], in);
            if (Bs[i] && (Bs[i]->type != KS_CUDA_F32 || Bs[i]->rows * Bs[i]->cols != outs[i]))
                return ks_errorf(KS_ERR_INTERNAL, "matmul_qkv: bias %d of %lld values for %d outputs", i,
                                 (long long)(Bs[i]->rows * Bs[i]->cols), outs[i]);
        }
        double t0;
        if ((st = stats_begin(b, &t0))) return st;
        int rc = (int)KS_MAX((size_t)1, KS_MIN((size_t)n, MM_CONV_BYTES / ((size_t)in * 2)));
        void *xb;
        if ((st = dev_alloc(c, (size_t)rc * in * 2, "matmul input (bf16)", &xb))) return st;
        for (int r0 = 0; r0 < n && !st; r0 += rc) {
            int rn = KS_MIN(rc, n - r0);
            st = ks_cuda_convert(c->stream, xb, KS_CUDA_BF16, x + (size_t)r0 * in, KS_CUDA_F32, (size_t)rn * in);
            for (int i = 0; i < 3 && !st; i++)
                st = gemm_bf16(c, Ys[i] + (size_t)r0 * outs[i], CUDA_R_32F, xb, Ws[i], rn, in, outs[i], 0.0f);
        }
        dev_free(c, xb);
        for (int i = 0; i < 3 && !st; i++)
            if (Bs[i]) st = ks_cuda_add_bias(c->stream, Ys[i], (const float *)Bs[i]->data, n, outs[i]);
        if (st || (st = stats_end(b, t0, 2.0 * n * in * (QD + 2.0 * KD)))) return st;
    } else if ((st = cu_matmul(b, q, x, Wq, bq, n, in, QD)) || (st = cu_matmul(b, k, x, Wk, bk, n, in, KD)) ||
               (st = cu_matmul(b, v, x, Wv, bv, n, in, KD)))
        return st;
    if (r && ((st = cu_rope(b, q, n, H, pos, r, max_pos)) || (st = cu_rope(b, k, n, Hkv, pos, r, max_pos)))) return st;
    return L ? cu_kv_append(b, L, k, v, pos, n) : KS_OK;
}

static ks_status cu_matmul_qkv(ks_backend *b, float *q, float *k, float *v, const float *x, const ks_weight *norm,
                               float eps, float *xn, const ks_weight *Wq, const ks_weight *Wk, const ks_weight *Wv,
                               const ks_weight *bq, const ks_weight *bk, const ks_weight *bv, int n, int in, int H,
                               int Hkv, int hd, const int32_t *pos, const ks_rope *r, int max_pos) {
    return qkv_impl(b, q, k, v, x, norm, eps, xn, Wq, Wk, Wv, bq, bk, bv, n, in, H, Hkv, hd, pos, r, max_pos, NULL);
}

static ks_status cu_matmul_qkv_append(ks_backend *b, ks_kv_layer *L, float *q, float *k, float *v, const float *x,
                                      const ks_weight *norm, float eps, float *xn, const ks_weight *Wq,
                                      const ks_weight *Wk, const ks_weight *Wv, const ks_weight *bq,
                                      const ks_weight *bk, const ks_weight *bv, int n, int in, int H, int Hkv, int hd,
                                      const int32_t *pos, const ks_rope *r, int max_pos) {
    if (!L || L->n_kv_heads != Hkv || L->head_dim != hd)
        return ks_errorf(KS_ERR_INTERNAL, "matmul_qkv_append: KV layer of %d heads x %d dims for %d x %d projections",
                         L ? L->n_kv_heads : 0, L ? L->head_dim : 0, Hkv, hd);
    return qkv_impl(b, q, k, v, x, norm, eps, xn, Wq, Wk, Wv, bq, bk, bv, n, in, H, Hkv, hd, pos, r, max_pos, L);
}

static ks_status cu_swiglu(ks_backend *b, float *out, const float *gate, const float *up, size_t n);

static ks_status cu_matmul_swiglu(ks_backend *b, float *y, const float *x, const ks_weight *norm, float eps, float *xn,
                                  const ks_weight *Wg, const ks_weight *Wu, float *tmp, int n, int in, int out) {
    cuda_ctx *c = CTX(b);
    ks_status st;
    int gemv = n == 1 && c->o.decode_kernels && (uintptr_t)x % 16 == 0 && gemv_weight_ok(Wg, in, out) && gemv_weight_ok(Wu, in, out);
    const float *nw;
    if ((st = fused_norm(b, &x, norm, eps, xn, n, in, gemv, &nw))) return st;
    if ((uintptr_t)x % 16) gemv = 0; /* normalised apart into a misaligned xn */
    if (gemv) {
        double t0;
        if ((st = stats_begin(b, &t0))) return st;
        if ((st = ks_cuda_gemv_swiglu(c->stream, y, x, nw, eps, nw ? xn : NULL, Wg->data, Wu->data, in, out, c->o.pdl))) return st;
        return stats_end(b, t0, 4.0 * in * out);
    }
    if ((st = cu_matmul(b, y, x, Wg, NULL, n, in, out)) || (st = cu_matmul(b, tmp, x, Wu, NULL, n, in, out))) return st;
    return cu_swiglu(b, y, y, tmp, (size_t)n * out);
}

#define MLP_ROWS 4096 /* rows per prefill-MLP chunk: bf16 gate and up of MLP_ROWS x ffn each */

/* Prefill MLP (ks_backend.mlp): per chunk of rows, xn -> bf16 once, gate and up GEMMs with bf16
 * outputs, SwiGLU bf16 -> bf16 in place, the down GEMM accumulating into x (float32). Float32
 * weights take the plain matmuls with float32 intermediates. */
static ks_status cu_mlp(ks_backend *b, float *x, const float *xn, const ks_weight *Wg, const ks_weight *Wu,
                        const ks_weight *Wd, int n, int dim, int ffn) {
    cuda_ctx *c = CTX(b);
    if (Wg->rows != ffn || Wg->cols != dim || Wu->rows != ffn || Wu->cols != dim || Wd->rows != dim || Wd->cols != ffn)
        return ks_errorf(KS_ERR_INTERNAL, "mlp: weights (%lld, %lld), (%lld, %lld), (%lld, %lld) for dim %d, ffn %d",
                         (long long)Wg->rows, (long long)Wg->cols, (long long)Wu->rows, (long long)Wu->cols,
                         (long long)Wd->rows, (long long)Wd->cols, dim, ffn);
    if (n <= 0) return KS_OK;
    ks_status st;
    int bf = Wg->type == KS_CUDA_BF16 && Wu->type == KS_CUDA_BF16 && Wd->type == KS_CUDA_BF16;
    int rc = KS_MIN(n, bf ? MLP_ROWS : 1024);
    void *xb = NULL, *g = NULL, *u = NULL;
    size_t es = bf ? 2 : 4;
    if ((st = dev_alloc(c, (size_t)rc * ffn * es, "mlp gate", &g)) || (st = dev_alloc(c, (size_t)rc * ffn * es, "mlp up", &u)) ||
        (bf && (st = dev_alloc(c, (size_t)rc * dim * 2, "mlp input (bf16)", &xb)))) {
        dev_free(c, g);
        dev_free(c, u);
        return st;
    }
    double t0 = 0;
    if (bf) st = stats_begin(b, &t0);
    for (int r0 = 0; r0 < n && !st; r0 += rc) {
        int rn = KS_MIN(rc, n - r0);
        const float *xr = xn + (size_t)r0 * dim;
        float *yr = x + (size_t)r0 * dim;
        if (!bf) {
            if (!(st = matmul_impl(b, (float *)g, xr, Wg, NULL, rn, dim, ffn, 0)) &&
                !(st = matmul_impl(b, (float *)u, xr, Wu, NULL, rn, dim, ffn, 0)) &&
                !(st = cu_swiglu(b, (float *)g, (float *)g, (float *)u, (size_t)rn * ffn)))
                st = matmul_impl(b, yr, (float *)g, Wd, NULL, rn, ffn, dim, 1);
            continue;
        }
        if (!(st = ks_cuda_convert(c->stream, xb, KS_CUDA_BF16, xr, KS_CUDA_F32, (size_t)rn * dim)) &&
            !(st = gemm_bf16(c, g, CUDA_R_16BF, xb, Wg, rn, dim, ffn, 0.0f)) &&
            !(st = gemm_bf16(c, u, CUDA_R_16BF, xb, Wu, rn, dim, ffn, 0.0f)) &&
            !(st = ks_cuda_swiglu_bf16(c->stream, g, g, u, (size_t)rn * ffn)))
            st = gemm_bf16(c, yr, CUDA_R_32F, g, Wd, rn, ffn, dim, 1.0f);
    }
    if (!st && bf) st = stats_end(b, t0, 6.0 * n * dim * ffn);
    dev_free(c, xb);
    dev_free(c, g);
    dev_free(c, u);
    return st;
}

static ks_status cu_embed(ks_backend *b, float *out, const ks_weight *E, const int32_t *ids, int n, int dim) {
    cuda_ctx *c = CTX(b);
    if (E->cols != dim || E->type != KS_CUDA_BF16)
        return ks_errorf(KS_ERR_INTERNAL, "embed: table is (%lld, %lld), expected %d columns", (long long)E->rows,
                         (long long)E->cols, dim);
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= E->rows)
            return ks_errorf(KS_ERR_ARG, "embed: token id %d out of range [0, %lld)", ids[i], (long long)E->rows);
    if (n <= 0) return KS_OK;
    if (c->rec) { /* the token id from the step slot (graph_run sets it) */
        if (n != 1) return rec_fail(c, "embed of several ids");
        return ks_cuda_embed(c->stream, out, E->data, c->d_step, 1, dim);
    }
    void *d_ids;
    ks_status st = upload_tmp(c, ids, sizeof(int32_t) * n, "embed ids", &d_ids);
    if (st) return st;
    st = ks_cuda_embed(c->stream, out, E->data, (const int32_t *)d_ids, n, dim);
    dev_free(c, d_ids);
    return st;
}

static ks_status cu_rmsnorm(ks_backend *b, float *out, const float *x, const ks_weight *w, int n, int dim, float eps) {
    if (w->type != KS_CUDA_F32 || w->rows * w->cols != dim)
        return ks_errorf(KS_ERR_INTERNAL, "rmsnorm: weight of %lld values for dim %d", (long long)(w->rows * w->cols), dim);
    if (n <= 0) return KS_OK;
    return ks_cuda_rmsnorm(CTX(b)->stream, out, x, (const float *)w->data, n, dim, eps);
}

/* The device inv_freq table of rope r at max_pos (longrope's factor choice): computed and
 * uploaded once per configuration, then reused (ROPE_CACHE entries, oldest replaced; a table
 * replaced is freed in stream order, after the kernels queued with it). */
static ks_status rope_inv_dev(cuda_ctx *c, const ks_rope *r, int max_pos, const float **out) {
    *out = NULL;
    int half = r->head_dim / 2;
    if (half < 1 || half > 512) return ks_errorf(KS_ERR_UNSUPPORTED, "rope: head_dim %d unsupported (2 to 1024)", r->head_dim);
    struct cuda_ctx::rope_cache::rope_key k;
    memset(&k, 0, sizeof k); /* padding too: keys compare with memcmp */
    k.type = (int)r->type;
    k.head_dim = r->head_dim;
    k.orig_max_pos = r->orig_max_pos;
    k.use_long = r->type == KS_ROPE_LONGROPE && max_pos + 1 > r->orig_max_pos;
    k.theta = r->theta;
    k.factor = r->factor;
    k.low = r->low_freq_factor;
    k.high = r->high_freq_factor;
    k.attn_factor = r->attn_factor;
    k.short_factor = r->short_factor;
    k.long_factor = r->long_factor;
    for (int i = 0; i < ROPE_CACHE; i++)
        if (c->rc[i].dev && !memcmp(&c->rc[i].key, &k, sizeof k)) { *out = c->rc[i].dev; return KS_OK; }
    float h[512];
    ks_rope_inv_freq(r, max_pos, h);
    void *d;
    ks_status st = raw_alloc(c, sizeof(float) * half, "rope inv_freq", &d);
    if (st) return st;
    cudaError_t e = cudaMemcpyAsync(d, h, sizeof(float) * half, cudaMemcpyHostToDevice, c->stream);
    if (!e) e = cudaStreamSynchronize(c->stream); /* h is on the stack; this happens once per configuration */
    if (e) { raw_free(c, d); return ks_cuda_status(e, "rope inv_freq upload"); }
    struct cuda_ctx::rope_cache *slot = &c->rc[c->rc_next];
    c->rc_next = (c->rc_next + 1) % ROPE_CACHE;
    if (slot->dev) c->rc_gen++; /* graphs that read the old table are stale */
    raw_free(c, slot->dev); /* synchronous above: nothing queued still reads it */
    slot->key = k;
    slot->dev = (float *)d;
    *out = slot->dev;
    return KS_OK;
}

static ks_status cu_rope(ks_backend *b, float *x, int n, int n_heads, const int32_t *pos, const ks_rope *r, int max_pos) {
    cuda_ctx *c = CTX(b);
    int d = r->head_dim, half = d / 2;
    if (half > 512) return ks_errorf(KS_ERR_UNSUPPORTED, "rope: head_dim %d too large", d);
    if (n <= 0) return KS_OK;
    const float *inv;
    ks_status st = rope_inv_dev(c, r, max_pos, &inv);
    if (st) return st;
    void *d_pos;
    if ((st = upload_tmp(c, pos, sizeof(int32_t) * n, "rope positions", &d_pos))) return st;
    st = ks_cuda_rope(c->stream, x, n, n_heads, d, (const int32_t *)d_pos, inv, (float)r->attn_factor);
    dev_free(c, d_pos);
    return st;
}

static ks_status cu_swiglu(ks_backend *b, float *out, const float *gate, const float *up, size_t n) {
    return ks_cuda_swiglu(CTX(b)->stream, out, gate, up, n);
}
static ks_status cu_add(ks_backend *b, float *x, const float *y, size_t n) { return ks_cuda_add(CTX(b)->stream, x, y, n); }

static ks_status cu_gather_rows(ks_backend *b, float *out, const float *x, const int32_t *idx, int k, int d) {
    cuda_ctx *c = CTX(b);
    if (k <= 0) return KS_OK;
    int32_t mx = 0;
    for (int i = 0; i < k; i++) {
        if (idx[i] < 0) return ks_errorf(KS_ERR_ARG, "gather_rows: negative index %d at position %d", idx[i], i);
        mx = KS_MAX(mx, idx[i]);
    }
    void *d_idx;
    ks_status st = upload_tmp(c, idx, sizeof(int32_t) * k, "gather_rows indices", &d_idx);
    if (st) return st;
    size_t ob = sizeof(float) * (size_t)k * d, xb = sizeof(float) * ((size_t)mx + 1) * d;
    const char *o = (const char *)out, *s = (const char *)x;
    if (o < s + xb && s < o + ob) { /* in place (the engine's propagate): through a temporary */
        void *t;
        if (!(st = dev_alloc(c, ob, "gather_rows temporary", &t))) {
            st = ks_cuda_gather_rows(c->stream, (float *)t, x, (const int32_t *)d_idx, k, d);
            if (!st) st = ks_cuda_status(cudaMemcpyAsync(out, t, ob, cudaMemcpyDeviceToDevice, c->stream), "gather_rows copy");
            dev_free(c, t);
        }
    } else {
        st = ks_cuda_gather_rows(c->stream, out, x, (const int32_t *)d_idx, k, d);
    }
    dev_free(c, d_idx);
    return st;
}

/* ================================================================ KV cache */

static void kv_release(cuda_ctx *c, ks_kv_layer *L) {
    raw_free(c, L->k);
    raw_free(c, L->v);
    raw_free(c, L->pos_dev);
    free(L->pos);
    L->k = L->v = L->pos_dev = NULL;
    L->pos = NULL;
}

/* (Re)allocate to `capacity` rows per head, keeping min(n[h], capacity) rows of each head. */
static ks_status cu_kv_alloc(ks_backend *b, ks_kv_layer *L, int capacity) {
    cuda_ctx *c = CTX(b);
    int H = L->n_kv_heads, d = L->head_dim;
    if (capacity < 1) capacity = 1;
    size_t rows = (size_t)H * capacity, rb = (size_t)d * 2;
    void *k = NULL, *v = NULL, *pd = NULL;
    int32_t *pos = (int32_t *)ks_malloc(rows * sizeof(int32_t));
    if (!pos) return KS_ERR_OOM;
    ks_status st = raw_alloc(c, rows * rb, "KV cache (keys)", &k);
    if (!st) st = raw_alloc(c, rows * rb, "KV cache (values)", &v);
    if (!st) st = raw_alloc(c, rows * sizeof(int32_t), "KV cache (positions)", &pd);
    if (!st && !L->n) {
        L->n = (int *)ks_calloc(H, sizeof(int));
        if (!L->n) st = KS_ERR_OOM;
    }
    if (!st && L->k) {
        int keep = KS_MIN(capacity, L->capacity), mrows = 0;
        for (int h = 0; h < H; h++) {
            L->n[h] = KS_MIN(L->n[h], keep);
            mrows = KS_MAX(mrows, L->n[h]);
            memcpy(pos + (size_t)h * capacity, L->pos + (size_t)h * L->capacity, sizeof(int32_t) * L->n[h]);
        }
        if (mrows > 0) {
            cudaError_t e = cudaMemcpy2DAsync(k, capacity * rb, L->k, L->capacity * rb, mrows * rb, H,
                                              cudaMemcpyDeviceToDevice, c->stream);
            if (!e) e = cudaMemcpy2DAsync(v, capacity * rb, L->v, L->capacity * rb, mrows * rb, H,
                                          cudaMemcpyDeviceToDevice, c->stream);
            if (!e) e = cudaMemcpy2DAsync(pd, capacity * sizeof(int32_t), L->pos_dev, L->capacity * sizeof(int32_t),
                                          mrows * sizeof(int32_t), H, cudaMemcpyDeviceToDevice, c->stream);
            if (!e) e = cudaStreamSynchronize(c->stream);
            if (e) st = ks_cuda_status(e, "KV cache reallocation");
        }
    }
    if (st) {
        raw_free(c, k);
        raw_free(c, v);
        raw_free(c, pd);
        free(pos);
        return st;
    }
    kv_release(c, L);
    L->k = k;
    L->v = v;
    L->pos_dev = pd;
    L->pos = pos;
    L->capacity = capacity;
    return KS_OK;
}

static void cu_kv_free(ks_backend *b, ks_kv_layer *L) {
    cuda_ctx *c = CTX(b);
    if (L->k || L->v || L->pos_dev) cudaStreamSynchronize(c->stream);
    kv_release(c, L);
    free(L->n);
    L->n = NULL;
    L->capacity = 0;
}

/* room for n more rows in every head (allocates L->n on first use) */
static ks_status kv_reserve(ks_backend *b, ks_kv_layer *L, int n) {
    int H = L->n_kv_heads, need = 0;
    for (int h = 0; h < H; h++) need = KS_MAX(need, (L->n ? L->n[h] : 0) + n);
    if (!L->k || !L->n || need > L->capacity) {
        /* room for 1024 more rows (a prefill is followed by decode steps), growing by at least a
         * quarter: amortised O(1) appends without doubling a long cache */
        int64_t cap = KS_MAX((int64_t)need + 1024, (int64_t)L->capacity + L->capacity / 4 + 256);
        if (cap > INT32_MAX) return ks_errorf(KS_ERR_OOM, "KV cache: %lld rows per head is too many", (long long)cap);
        return cu_kv_alloc(b, L, (int)cap);
    }
    return KS_OK;
}

static ks_status cu_kv_append(ks_backend *b, ks_kv_layer *L, const float *k, const float *v, const int32_t *pos, int n) {
    cuda_ctx *c = CTX(b);
    int H = L->n_kv_heads;
    if (n <= 0) return KS_OK;
    ks_status st = kv_reserve(b, L, n);
    if (st) return st;
    if (n == 1 && H <= KS_CUDA_KV1_MAX_HEADS) { /* decode: position and rows as kernel arguments */
        st = ks_cuda_kv_append1(c->stream, L->k, L->v, (int32_t *)L->pos_dev, L->capacity, H, L->head_dim, k, v, pos[0],
                                L->n, c->o.pdl);
        if (st) return st;
        for (int h = 0; h < H; h++) L->pos[(size_t)h * L->capacity + L->n[h]++] = pos[0];
        return KS_OK;
    }
    /* positions (n) then each head's first free row (H) */
    size_t bytes = sizeof(int32_t) * ((size_t)n + H);
    int32_t *h_buf = (int32_t *)ks_malloc(bytes);
    if (!h_buf) return KS_ERR_OOM;
    memcpy(h_buf, pos, sizeof(int32_t) * n);
    for (int h = 0; h < H; h++) h_buf[n + h] = L->n[h];
    void *d_buf;
    st = upload_tmp(c, h_buf, bytes, "KV append positions", &d_buf);
    free(h_buf);
    if (st) return st;
    st = ks_cuda_kv_append(c->stream, L->k, L->v, (int32_t *)L->pos_dev, L->capacity, H, L->head_dim, k, v,
                           (const int32_t *)d_buf, (const int32_t *)d_buf + n, n);
    dev_free(c, d_buf);
    if (st) return st;
    for (int h = 0; h < H; h++) {
        memcpy(L->pos + (size_t)h * L->capacity + L->n[h], pos, sizeof(int32_t) * n);
        L->n[h] += n;
    }
    return KS_OK;
}

static ks_status cu_kv_retain(ks_backend *b, ks_kv_layer *L, const int32_t *const *idx, const int *cnt, int shrink) {
    cuda_ctx *c = CTX(b);
    int H = L->n_kv_heads, d = L->head_dim, maxc = 0, moves = 0;
    size_t total = 0;
    for (int h = 0; h < H; h++) {
        if (cnt[h] < 0 || cnt[h] > L->n[h]) return ks_errorf(KS_ERR_ARG, "kv_retain: %d rows asked of head %d (%d rows)", cnt[h], h, L->n[h]);
        for (int i = 0; i < cnt[h]; i++) {
            if (idx[h][i] < 0 || idx[h][i] >= L->n[h] || (i && idx[h][i] <= idx[h][i - 1]))
                return ks_errorf(KS_ERR_ARG, "kv_retain: head %d: index %d at position %d is out of range [0, %d) or not ascending",
                                 h, idx[h][i], i, L->n[h]);
            if (idx[h][i] != i) moves = 1;
        }
        total += cnt[h];
        maxc = KS_MAX(maxc, cnt[h]);
    }
    /* reallocate only when at least half the capacity goes: a decode-time retain of one row
     * per step (StreamingLLM) must not reallocate at every step */
    int realloc_to = shrink && maxc < L->capacity / 2 ? KS_MAX(maxc, 1) : 0;
    if (moves || realloc_to) {
        /* host index buffer: offsets (H + 1) then the lists */
        int32_t *h_buf = (int32_t *)ks_malloc(sizeof(int32_t) * (H + 1 + total));
        if (!h_buf) return KS_ERR_OOM;
        int32_t *off = h_buf, *cat = h_buf + H + 1;
        off[0] = 0;
        for (int h = 0; h < H; h++) {
            memcpy(cat + off[h], idx[h], sizeof(int32_t) * cnt[h]);
            off[h + 1] = off[h] + cnt[h];
        }
        void *d_buf = NULL, *nk = NULL, *nv = NULL, *np = NULL;
        int ncap = realloc_to ? realloc_to : maxc; /* without reallocation: a compact temporary */
        size_t rb = (size_t)d * 2;
        ks_status st = upload_tmp(c, h_buf, sizeof(int32_t) * (H + 1 + total), "kv_retain indices", &d_buf);
        free(h_buf);
        if (st) return st;
        if (realloc_to) {
            st = raw_alloc(c, (size_t)H * ncap * rb, "KV cache (keys)", &nk);
            if (!st) st = raw_alloc(c, (size_t)H * ncap * rb, "KV cache (values)", &nv);
            if (!st) st = raw_alloc(c, (size_t)H * ncap * 4, "KV cache (positions)", &np);
        } else {
            st = dev_alloc(c, (size_t)H * ncap * rb, "kv_retain temporary", &nk);
            if (!st) st = dev_alloc(c, (size_t)H * ncap * rb, "kv_retain temporary", &nv);
            if (!st) st = dev_alloc(c, (size_t)H * ncap * 4, "kv_retain temporary", &np);
        }
        if (!st)
            st = ks_cuda_kv_gather(c->stream, nk, nv, (int32_t *)np, ncap, L->k, L->v, (const int32_t *)L->pos_dev,
                                   L->capacity, H, d, (const int32_t *)d_buf + H + 1, (const int32_t *)d_buf, maxc);
        if (!st && !realloc_to && maxc > 0) {
            cudaError_t e = cudaMemcpy2DAsync(L->k, L->capacity * rb, nk, ncap * rb, maxc * rb, H,
                                              cudaMemcpyDeviceToDevice, c->stream);
            if (!e) e = cudaMemcpy2DAsync(L->v, L->capacity * rb, nv, ncap * rb, maxc * rb, H,
                                          cudaMemcpyDeviceToDevice, c->stream);
            if (!e) e = cudaMemcpy2DAsync(L->pos_dev, L->capacity * 4, np, ncap * 4, maxc * 4, H,
                                          cudaMemcpyDeviceToDevice, c->stream);
            if (e) st = ks_cuda_status(e, "kv_retain copy back");
        }
        dev_free(c, d_buf);
        if (realloc_to) {
            int32_t *pos = NULL;
            if (!st && !(pos = (int32_t *)ks_malloc(sizeof(int32_t) * (size_t)H * ncap))) st = KS_ERR_OOM;
            if (!st) st = ks_cuda_status(cudaStreamSynchronize(c->stream), "kv_retain");
            if (st) {
                free(pos);
                raw_free(c, nk);
                raw_free(c, nv);
                raw_free(c, np);
                return st;
            }
            for (int h = 0; h < H; h++)
                for (int i = 0; i < cnt[h]; i++) pos[(size_t)h * ncap + i] = L->pos[(size_t)h * L->capacity + idx[h][i]];
            kv_release(c, L);
            L->k = nk;
            L->v = nv;
            L->pos_dev = np;
            L->pos = pos;
            L->capacity = ncap;
            for (int h = 0; h < H; h++) L->n[h] = cnt[h];
            return KS_OK;
        }
        dev_free(c, nk);
        dev_free(c, nv);
        dev_free(c, np);
        if (st) return st;
    }
    for (int h = 0; h < H; h++) {
        int32_t *pb = L->pos + (size_t)h * L->capacity;
        for (int i = 0; i < cnt[h]; i++) pb[i] = pb[idx[h][i]];
        L->n[h] = cnt[h];
    }
    return KS_OK;
}

/* ================================================================ attention */

static ks_status cu_attention(ks_backend *b, float *out, const float *q, const ks_kv_layer *L, const ks_attn_args *a) {
    cuda_ctx *c = CTX(b);
    int H = a->n_heads, Hkv = L->n_kv_heads, n = a->n, d = L->head_dim;
    if (n <= 0) return KS_OK;
    if (Hkv < 1 || H % Hkv)
        return ks_errorf(KS_ERR_ARG, "attention: %d query heads are not a multiple of %d KV heads", H, Hkv);
    int half = a->rope ? a->rope->head_dim / 2 : 0;
    if (a->rope && (a->rope->head_dim != d || half > 512))
        return ks_errorf(KS_ERR_UNSUPPORTED, "attention: rope over %d of %d dims", a->rope->head_dim, d);
    if (n == 1 && !a->idx && !a->rope && L->n && c->o.decode_kernels &&
        (c->attn_path == KS_CUDA_ATTN_AUTO || c->attn_path == KS_CUDA_ATTN_TC) &&
        Hkv <= KS_CUDA_ATTN_BYVAL_HEADS) {
        /* one decode row over the cache itself: key counts and position by value, no upload */
        ks_cuda_attn_params p;
        memset(&p, 0, sizeof p);
        p.out = out;
        p.q = q;
        p.k = L->k;
        p.v = L->v;
        p.kpos = (const int32_t *)L->pos_dev;
        p.n = 1;
        p.n_heads = H;
        p.n_kv_heads = Hkv;
        p.head_dim = d;
        p.capacity = L->capacity;
        for (int h = 0; h < Hkv; h++) p.max_nk = KS_MAX(p.max_nk, L->n[h]);
        p.scale = a->scale;
        p.window = a->window;
        p.pdl = c->o.pdl;
        p.splits = c->o.decode_splits;
        if (ks_cuda_attn_decode_tc_supported(&p)) {
            if (p.max_nk == 0 && c->rec) return rec_fail(c, "attention over an empty cache");
            if (p.max_nk == 0) /* nothing to attend to: zeros, as the CPU reference gives */
                return ks_cuda_status(cudaMemsetAsync(out, 0, sizeof(float) * (size_t)H * d, c->stream), "attention");
            int splits;
            void *ws = NULL;
            size_t wsb = ks_cuda_attn_decode_tc_workspace(&p, c->n_sm, &splits);
            if (c->rec) { /* key counts and position from the step slot, the graphs' own workspace */
                if (wsb > GRAPH_WS) return rec_fail(c, "attention with a split workspace this large");
                return ks_cuda_attn_decode_tc1(c->stream, &p, L->n, a->qpos[0], c->d_step + 1, splits, c->gws);
            }
            ks_status st = wsb ? dev_alloc(c, wsb, "attention workspace", &ws) : KS_OK;
            if (!st) st = ks_cuda_attn_decode_tc1(c->stream, &p, L->n, a->qpos[0], NULL, splits, ws);
            dev_free(c, ws);
            return st;
        }
    }
    /* host buffer: qpos (n), nk (Hkv), idx_off (Hkv), lists, inv_freq (half floats) */
    size_t total = 0;
    int max_nk = 0;
    for (int h = 0; h < Hkv; h++) {
        int nk = a->idx ? a->n_idx[h] : (L->n ? L->n[h] : 0);
        if (a->idx) {
            for (int t = 0; t < nk; t++)
                if (a->idx[h][t] < 0 || a->idx[h][t] >= L->n[h])
                    return ks_errorf(KS_ERR_ARG, "attention: index %d of KV head %d out of range [0, %d)", a->idx[h][t],
                                     h, L->n[h]);
            total += nk;
        }
        max_nk = KS_MAX(max_nk, nk);
    }
    size_t words = (size_t)n + 2 * Hkv + total + half;
    int32_t *hb = (int32_t *)ks_malloc(sizeof(int32_t) * words);
    if (!hb) return KS_ERR_OOM;
    memcpy(hb, a->qpos, sizeof(int32_t) * n);
    int32_t *nkh = hb + n, *offh = nkh + Hkv, *cat = offh + Hkv;
    size_t o = 0;
    for (int h = 0; h < Hkv; h++) {
        nkh[h] = a->idx ? a->n_idx[h] : (L->n ? L->n[h] : 0);
        offh[h] = (int32_t)o;
        if (a->idx) {
            memcpy(cat + o, a->idx[h], sizeof(int32_t) * nkh[h]);
            o += nkh[h];
        }
    }
    if (a->rope) ks_rope_inv_freq(a->rope, a->rope_max_pos, (float *)(cat + total));
    void *db;
    ks_status st = upload_tmp(c, hb, sizeof(int32_t) * words, "attention positions", &db);
    free(hb);
    if (st) return st;
    const int32_t *dq = (const int32_t *)db;
    const float *d_inv = a->rope ? (const float *)(dq + n + 2 * Hkv + total) : NULL;
    int rn = a->idx && a->renumber;
    ks_cuda_attn_params p;
    memset(&p, 0, sizeof p);
    p.out = out;
    p.q = q;
    p.k = L->k;
    p.v = L->v;
    p.kpos = (const int32_t *)L->pos_dev;
    p.qpos = dq;
    p.nk = dq + n;
    p.idx = a->idx ? dq + n + 2 * Hkv : NULL;
    p.idx_off = dq + n + Hkv;
    p.n = n;
    p.n_heads = H;
    p.n_kv_heads = Hkv;
    p.head_dim = d;
    p.capacity = L->capacity;
    p.max_nk = max_nk;
    p.scale = a->scale;
    p.window = a->window;
    p.renumber = rn;
    p.q_renumber = rn;
    p.pdl = c->o.pdl;
    p.splits = c->o.decode_splits;
    if (max_nk == 0) { /* nothing to attend to: zeros, as the CPU reference gives */
        st = ks_cuda_status(cudaMemsetAsync(out, 0, sizeof(float) * (size_t)n * H * d, c->stream), "attention");
        dev_free(c, db);
        return st;
    }
    /* a prefill kernel for prefill-sized calls (it reads bf16 keys in cache order; which one is
     * the planner's choice below, once the keys are in place) */
    int flash_shape = d == 64 || d == 128;
    int want_flash = (c->attn_path == KS_CUDA_ATTN_AUTO || c->attn_path == KS_CUDA_ATTN_FLASH) && flash_shape &&
                     (c->attn_path == KS_CUDA_ATTN_FLASH || n >= 64);
    /* otherwise the tensor-core decode kernel where it takes the shape (bf16 keys) */
    int want_tc = 0;
    if (!want_flash && (c->attn_path == KS_CUDA_ATTN_TC || (c->attn_path == KS_CUDA_ATTN_AUTO && c->o.decode_kernels))) {
        ks_cuda_attn_params t = p;
        t.k_f32 = 0;
        want_tc = ks_cuda_attn_decode_tc_supported(&t);
    }
    void *kc = NULL, *vc = NULL, *pc = NULL, *qr = NULL, *ws = NULL;
    if (a->rope || (a->idx && want_flash)) {
        /* compact copy of the attended rows (rotated when pre-RoPE); the float32 split-KV kernel
         * gets float32 rotated keys, the mma kernels (which round q and p anyway) bf16 ones */
        int k_f32 = !want_flash && !want_tc;
        size_t rows = (size_t)Hkv * max_nk;
        if (!(st = dev_alloc(c, rows * d * (k_f32 ? 4 : 2), "attention gathered keys", &kc)) &&
            !(st = dev_alloc(c, rows * d * 2, "attention gathered values", &vc)) &&
            !(st = dev_alloc(c, rows * 4, "attention gathered positions", &pc)))
            st = ks_cuda_attn_gather(c->stream, &p, d_inv, a->rope ? (float)a->rope->attn_factor : 1.0f, kc, k_f32, vc,
                                     (int32_t *)pc, max_nk);
        if (!st && a->rope && !(st = dev_alloc(c, sizeof(float) * (size_t)n * H * d, "attention rotated queries", &qr)))
            st = ks_cuda_attn_rope_q(c->stream, (float *)qr, q, n, H, Hkv, d, p.qpos, p.nk, rn, d_inv,
                                     (float)a->rope->attn_factor);
        p.k = kc;
        p.v = vc;
        p.kpos = (const int32_t *)pc;
        p.capacity = max_nk;
        p.idx = NULL;
        p.renumber = 0; /* the gathered positions already are the list indices */
        p.k_f32 = k_f32;
        if (qr) p.q = (const float *)qr;
    }
    if (!st) {
        ks_cuda_prefill_kernel pk = want_flash ? ks_cuda_attn_prefill_plan(&p, c->sm_major, c->o.prefill_attn == KS_PREFILL_ATTN_MMA)
                                               : KS_CUDA_PREFILL_NONE;
        if (pk != KS_CUDA_PREFILL_NONE) {
            size_t wsb = ks_cuda_attn_prefill_workspace(&p);
            if (!(st = dev_alloc(c, wsb, "attention workspace", &ws))) st = ks_cuda_attn_prefill(c->stream, &p, ws, pk);
            if (!st) c->prefill_calls[pk]++;
        } else if (want_tc && ks_cuda_attn_decode_tc_supported(&p)) {
            int splits;
            size_t wsb = ks_cuda_attn_decode_tc_workspace(&p, c->n_sm, &splits);
            if (wsb) st = dev_alloc(c, wsb, "attention workspace", &ws);
            if (!st) st = ks_cuda_attn_decode_tc(c->stream, &p, splits, ws);
        } else {
            int splits;
            size_t wsb = ks_cuda_attn_decode_workspace(&p, c->n_sm, &splits);
            if (wsb) st = dev_alloc(c, wsb, "attention workspace", &ws);
            if (!st) st = ks_cuda_attn_decode(c->stream, &p, splits, ws);
        }
    }
    dev_free(c, ws);
    dev_free(c, qr);
    dev_free(c, kc);
    dev_free(c, vc);
    dev_free(c, pc);
    dev_free(c, db);
    return st;
}

/* ================================================================ policy primitives (ks_backend.prims) */

#ifdef KS_BACKEND_PRIMS
#define PRIM_CTX(b) cuda_ctx *c_ = CTX(b); ks_cuda_scratch sc_ = ks_cuda_backend_scratch(b); (void)sc_
static ks_status pr_scores(ks_backend *b, const float *q, const int32_t *qpos, int64_t hq, int64_t m, const void *k,
                           int k_bf16, const int32_t *kpos, int64_t hkv, int64_t n, int64_t d, const ks_scores_opts *o,
                           float *out) {
    PRIM_CTX(b);
    return ks_cuda_scores(c_->stream, &sc_, q, qpos, hq, m, k, k_bf16, kpos, hkv, n, d, o, out);
}
static ks_status pr_pool1d(ks_backend *b, const float *x, int64_t rows, int64_t n, int64_t kernel, ks_pool_mode mode,
                           float *out) {
    PRIM_CTX(b);
    return ks_cuda_pool1d(c_->stream, &sc_, x, rows, n, kernel, mode, out);
}
static ks_status pr_topk(ks_backend *b, const float *x, int64_t rows, int64_t n, int64_t k, ks_topk_order order,
                         int32_t *oi, float *ov) {
    PRIM_CTX(b);
    return ks_cuda_topk(c_->stream, &sc_, x, rows, n, k, order, oi, ov);
}
static ks_status pr_argsort(ks_backend *b, const float *x, int64_t n, int desc, int32_t *oi) {
    PRIM_CTX(b);
    return ks_cuda_argsort(c_->stream, &sc_, x, n, desc, oi);
}
static ks_status pr_sort_f32(ks_backend *b, const float *x, int64_t n, int desc, float *out) {
    PRIM_CTX(b);
    return ks_cuda_sort_f32(c_->stream, &sc_, x, n, desc, out);
}
static ks_status pr_sort_i32(ks_backend *b, const int32_t *x, int64_t n, int32_t *out) {
    PRIM_CTX(b);
    return ks_cuda_sort_i32(c_->stream, &sc_, x, n, out);
}
static ks_status pr_rank(ks_backend *b, const float *x, int64_t n, int32_t *out) {
    PRIM_CTX(b);
    return ks_cuda_rank(c_->stream, &sc_, x, n, out);
}
static ks_status pr_unique(ks_backend *b, const int32_t *x, int64_t n, int32_t *out, int64_t *n_out) {
    PRIM_CTX(b);
    return ks_cuda_unique(c_->stream, &sc_, x, n, out, n_out);
}
static ks_status pr_union(ks_backend *b, const int32_t *a, int64_t na, const int32_t *bb, int64_t nb, int32_t *out,
                          int64_t *n_out) {
    PRIM_CTX(b);
    return ks_cuda_union(c_->stream, &sc_, a, na, bb, nb, out, n_out);
}
static ks_status pr_concat_i32(ks_backend *b, const int32_t *a, int64_t na, const int32_t *bb, int64_t nb, int32_t *out) {
    return ks_cuda_concat_i32(CTX(b)->stream, a, na, bb, nb, out);
}
static ks_status pr_concat_f32(ks_backend *b, const float *a, int64_t na, const float *bb, int64_t nb, float *out) {
    return ks_cuda_concat_f32(CTX(b)->stream, a, na, bb, nb, out);
}
static ks_status pr_arange(ks_backend *b, int64_t start, int64_t stop, int64_t step, int32_t *out) {
    return ks_cuda_arange(CTX(b)->stream, start, stop, step, out);
}
static ks_status pr_gather(ks_backend *b, const float *x, int64_t n, int64_t d, const int32_t *idx, int64_t k, float *out,
                           int64_t *err) {
    return ks_cuda_gather(CTX(b)->stream, x, n, d, idx, k, out, err);
}
static ks_status pr_gather_i32(ks_backend *b, const int32_t *x, int64_t n, const int32_t *idx, int64_t k, int32_t *out,
                               int64_t *err) {
    return ks_cuda_gather_i32(CTX(b)->stream, x, n, idx, k, out, err);
}
static ks_status pr_softmax(ks_backend *b, const float *x, int64_t rows, int64_t n, float *out) {
    return ks_cuda_softmax(CTX(b)->stream, x, rows, n, out);
}
static ks_status pr_sum(ks_backend *b, const float *x, int64_t rows, int64_t cols, int axis, float *out) {
    return ks_cuda_sum(CTX(b)->stream, x, rows, cols, axis, out);
}
static ks_status pr_mean(ks_backend *b, const float *x, int64_t rows, int64_t cols, int axis, float *out) {
    return ks_cuda_mean(CTX(b)->stream, x, rows, cols, axis, out);
}
static ks_status pr_var(ks_backend *b, const float *x, int64_t rows, int64_t cols, int axis, int64_t ddof, float *out) {
    return ks_cuda_var(CTX(b)->stream, x, rows, cols, axis, ddof, out);
}
static ks_status pr_cosine(ks_backend *b, const float *a, const float *bb, int64_t n, float *out) {
    return ks_cuda_cosine(CTX(b)->stream, a, bb, n, out);
}
static ks_status pr_cosine_rows(ks_backend *b, const float *a, const float *bb, int64_t rows, int64_t d, float *out) {
    return ks_cuda_cosine_rows(CTX(b)->stream, a, bb, rows, d, out);
}
static const ks_backend_prims cuda_prims = {
    pr_scores, pr_pool1d, pr_topk, pr_argsort, pr_sort_f32, pr_sort_i32, pr_rank, pr_unique, pr_union,
    pr_concat_i32, pr_concat_f32, pr_arange, pr_gather, pr_gather_i32, pr_softmax, pr_sum, pr_mean, pr_var,
    pr_cosine, pr_cosine_rows,
};
#endif

/* ================================================================ memory accounting, profiling */

static ks_status cu_ceilings(ks_backend *b, double *gemm_tflops, double *copy_gbs) {
    cuda_ctx *c = CTX(b);
    cudaError_t e = cudaStreamSynchronize(c->stream);
    if (e) return ks_cuda_status(e, "ceilings");
    return ks_cuda_ceilings(gemm_tflops, copy_gbs);
}

static void cu_mem_stats(ks_backend *b, ks_mem_stats *out, int reset_peak) {
    cuda_ctx *c = CTX(b);
    if (reset_peak) { /* return the pool's cached memory: its reserved high-water mark then covers this region only */
        cudaStreamSynchronize(c->stream);
        cudaMemPoolTrimTo(c->pool, 0);
    }
    ks_memtrack_stats(c->mem, out, reset_peak);
    uint64_t used = 0, resv = 0, zero = 0;
    if (reset_peak) { /* the driver resets a high-water mark (to the current value) by setting it to zero */
        cudaMemPoolSetAttribute(c->pool, cudaMemPoolAttrUsedMemHigh, &zero);
        cudaMemPoolSetAttribute(c->pool, cudaMemPoolAttrReservedMemHigh, &zero);
    }
    if (!cudaMemPoolGetAttribute(c->pool, cudaMemPoolAttrUsedMemHigh, &used)) out->pool_used_high = (size_t)used;
    if (!cudaMemPoolGetAttribute(c->pool, cudaMemPoolAttrReservedMemHigh, &resv)) out->pool_reserved_high = (size_t)resv;
    cudaGetLastError();
}

/* Resolve the recorded marks: wait for the last, book each interval to its tag, keep the last
 * event as the start of the next batch. */
static ks_status prof_flush(cuda_ctx *c) {
    if (c->pn < 2) return KS_OK;
    KS_CU(cudaEventSynchronize(c->pev[c->pn - 1]), "profiling (or an earlier kernel)");
    for (int i = 1; i < c->pn; i++) {
        if (c->ptag[i] < 0) continue;
        float ms = 0;
        KS_CU(cudaEventElapsedTime(&ms, c->pev[i - 1], c->pev[i]), "profiling (event time)");
        c->pacc[c->ptag[i]] += ms * 1e-3;
    }
    cudaEvent_t last = c->pev[c->pn - 1];
    c->pev[c->pn - 1] = c->pev[0];
    c->pev[0] = last;
    c->ptag[0] = -1;
    c->pn = 1;
    return KS_OK;
}

static ks_status cu_prof_mark(ks_backend *b, int tag) {
    cuda_ctx *c = CTX(b);
    if (tag >= KS_PROF_TAGS) return ks_errorf(KS_ERR_ARG, "profiling: tag %d out of range [0, %d)", tag, KS_PROF_TAGS);
    if (c->pn == c->pcap) {
        if (c->pcap < PROF_CAP) { /* grow: more events */
            int ncap = c->pcap ? c->pcap * 2 : 256;
            cudaEvent_t *ne = (cudaEvent_t *)ks_realloc(c->pev, sizeof *ne * ncap);
            if (!ne) return KS_ERR_OOM;
            c->pev = ne;
            int *nt = (int *)ks_realloc(c->ptag, sizeof *nt * ncap);
            if (!nt) return KS_ERR_OOM;
            c->ptag = nt;
            for (int i = c->pcap; i < ncap; i++) {
                cudaError_t e = cudaEventCreate(&c->pev[i]);
                if (e) { c->pcap = i; return ks_cuda_status(e, "profiling (event create)"); }
                c->pcap = i + 1;
            }
        } else {
            ks_status st = prof_flush(c);
            if (st) return st;
        }
    }
    KS_CU(cudaEventRecord(c->pev[c->pn], c->stream), "profiling (event record)");
    c->ptag[c->pn++] = tag;
    return KS_OK;
}

static ks_status cu_prof_collect(ks_backend *b, double *sec, int n_tags) {
    cuda_ctx *c = CTX(b);
    ks_status st = prof_flush(c);
    for (int t = 0; t < n_tags && t < KS_PROF_TAGS; t++) sec[t] += c->pacc[t];
    memset(c->pacc, 0, sizeof c->pacc);
    c->pn = 0; /* the next mark starts a new timeline */
    return st;
}

/* ================================================================ lifetime */

/* ================================================================ pinned host memory, decode graphs */

static void *cu_host_alloc(ks_backend *b, size_t bytes) {
    void *p = NULL;
    cudaError_t e = cudaMallocHost(&p, bytes ? bytes : 16);
    if (e) {
        cudaGetLastError();
        ks_errorf(KS_ERR_OOM, "cuda: cannot allocate %zu bytes of page-locked host memory (%s)", bytes,
                  cudaGetErrorString(e));
        return NULL;
    }
    return p;
}
static void cu_host_free(ks_backend *b, void *p) {
    if (p) cudaFreeHost(p);
}

/* Recording: the stream is captured (relaxed mode: nothing else on the host is restricted);
 * the graph's first node copies the pinned step slot {id, pos, delta} to the device, where the
 * recorded embed, q|k|v and attention kernels read it. */
static ks_status cu_graph_begin(ks_backend *b, int32_t id, int32_t pos) {
    cuda_ctx *c = CTX(b);
    if (c->rec) return ks_errorf(KS_ERR_INTERNAL, "cuda: graph_begin while recording");
    if (!c->h_step || !c->d_step || !c->gws) return ks_errorf(KS_ERR_INTERNAL, "cuda: no decode graph buffers");
    KS_CU(cudaStreamSynchronize(c->stream), "decode graph (an earlier kernel failed)"); /* h_step is free */
    c->h_step[0] = id;
    c->h_step[1] = pos;
    c->h_step[2] = 0;
    KS_CU(cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeRelaxed), "decode graph: begin capture");
    c->rec = 1;
    c->rec_failed = 0;
    cudaError_t e = cudaMemcpyAsync(c->d_step, c->h_step, 4 * sizeof(int32_t), cudaMemcpyHostToDevice, c->stream);
    if (e) {
        cudaGraph_t g = NULL;
        cudaStreamEndCapture(c->stream, &g);
        if (g) cudaGraphDestroy(g);
        cudaGetLastError();
        c->rec = 0;
        return ks_cuda_status(e, "decode graph: step slot copy");
    }
    return KS_OK;
}

static ks_status cu_graph_end(ks_backend *b, ks_graph **out) {
    cuda_ctx *c = CTX(b);
    *out = NULL;
    if (!c->rec) return ks_errorf(KS_ERR_INTERNAL, "cuda: graph_end without graph_begin");
    c->rec = 0;
    cudaGraph_t g = NULL;
    cudaError_t e = cudaStreamEndCapture(c->stream, &g);
    if (c->rec_failed || e || !g) {
        if (g) cudaGraphDestroy(g);
        if (e) {
            cudaGetLastError();
            if (!c->rec_failed) ks_errorf(KS_ERR_UNSUPPORTED, "cuda: decode graph capture failed (%s)", cudaGetErrorString(e));
        }
        return KS_ERR_UNSUPPORTED;
    }
    ks_graph *kg = (ks_graph *)ks_calloc(1, sizeof *kg);
    if (!kg) { cudaGraphDestroy(g); return KS_ERR_OOM; }
    e = cudaGraphInstantiate(&kg->exec, g, 0);
    cudaGraphDestroy(g);
    if (e) {
        cudaGetLastError();
        free(kg);
        return ks_errorf(KS_ERR_UNSUPPORTED, "cuda: decode graph instantiation failed (%s)", cudaGetErrorString(e));
    }
    kg->pos0 = c->h_step[1];
    kg->rc_gen = c->rc_gen;
    *out = kg;
    return KS_OK;
}

static ks_status cu_graph_run(ks_backend *b, ks_graph *g, int32_t id, int32_t pos) {
    cuda_ctx *c = CTX(b);
    if (c->rec) return ks_errorf(KS_ERR_INTERNAL, "cuda: graph_run while recording");
    if (g->rc_gen != c->rc_gen) return ks_errorf(KS_ERR_UNSUPPORTED, "cuda: decode graph reads a replaced rope table");
    /* the previous run's slot copy must be done before the slot is rewritten: every step ends
     * with a download that waits for the stream, so this only waits when a caller did not */
    KS_CU(cudaStreamSynchronize(c->stream), "decode graph (an earlier kernel failed)");
    c->h_step[0] = id;
    c->h_step[1] = pos;
    c->h_step[2] = pos - g->pos0;
    KS_CU(cudaGraphLaunch(g->exec, c->stream), "decode graph launch");
    return KS_OK;
}

static void cu_graph_free(ks_backend *b, ks_graph *g) {
    if (!g) return;
    cudaGraphExecDestroy(g->exec);
    free(g);
}

static void cu_destroy(ks_backend *b) {
    if (!b) return;
    cuda_ctx *c = CTX(b);
    if (c) {
        if (c->stream) cudaStreamSynchronize(c->stream);
        if (c->h_step) cudaFreeHost(c->h_step);
        raw_free(c, c->d_step);
        raw_free(c, c->gws);
        for (int i = 0; i < ROPE_CACHE; i++) raw_free(c, c->rc[i].dev);
        for (int i = 0; i < c->pcap; i++) cudaEventDestroy(c->pev[i]);
        free(c->pev);
        free(c->ptag);
        if (c->blas) cublasDestroy(c->blas);
        raw_free(c, c->blas_ws);
        if (c->pin) cudaFreeHost(c->pin);
        if (c->pool) cudaMemPoolDestroy(c->pool);
        if (c->stream) cudaStreamDestroy(c->stream);
        ks_memtrack_free(c->mem);
        free(c);
    }
    free(b);
}

static void *scratch_alloc(void *ud, size_t bytes) {
    void *p;
    return dev_alloc((cuda_ctx *)ud, bytes, "primitive scratch", &p) ? NULL : p;
}
static void scratch_free(void *ud, void *p) { dev_free((cuda_ctx *)ud, p); }
extern "C" ks_cuda_scratch ks_cuda_backend_scratch(ks_backend *b) {
    ks_cuda_scratch s = {scratch_alloc, scratch_free, b->ctx};
    return s;
}

extern "C" cudaStream_t ks_cuda_backend_stream(ks_backend *b) { return CTX(b)->stream; }
extern "C" int ks_cuda_backend_sm_count(ks_backend *b) { return CTX(b)->n_sm; }
extern "C" void ks_cuda_backend_set_attn_path(ks_backend *b, ks_cuda_attn_path path) { CTX(b)->attn_path = path; }
extern "C" long ks_cuda_backend_prefill_calls(ks_backend *b, ks_cuda_prefill_kernel k) {
    return k >= 0 && k < 3 ? CTX(b)->prefill_calls[k] : 0;
}

extern "C" ks_status ks_cuda_backend_create(const ks_backend_opts *opts, ks_backend **out) {
    *out = NULL;
    ks_backend_opts o = opts ? *opts : ks_backend_opts_default();
    int device = o.device;
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        cudaGetLastError();
        return ks_errorf(KS_ERR_DEVICE, "cuda: no usable GPU (%s)", e ? cudaGetErrorString(e) : "no devices");
    }
    if (device < 0 || device >= count) return ks_errorf(KS_ERR_ARG, "cuda: device %d out of range (%d GPUs)", device, count);
    ks_backend *b = (ks_backend *)ks_calloc(1, sizeof *b);
    cuda_ctx *c = (cuda_ctx *)ks_calloc(1, sizeof *c);
    if (!b || !c) { free(b); free(c); return KS_ERR_OOM; }
    b->ctx = c;
    b->opts = o;
    c->o = o;
    ks_status st = KS_OK;
    c->device = device;
    if (!(c->mem = ks_memtrack_new())) { st = KS_ERR_OOM; goto fail; }
    if ((e = cudaSetDevice(device))) { st = ks_cuda_status(e, "cudaSetDevice"); goto fail; }
    if ((e = cudaDeviceGetAttribute(&c->n_sm, cudaDevAttrMultiProcessorCount, device)) ||
        (e = cudaDeviceGetAttribute(&c->sm_major, cudaDevAttrComputeCapabilityMajor, device))) {
        st = ks_cuda_status(e, "device attributes");
        goto fail;
    }
    if ((e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking))) { st = ks_cuda_status(e, "stream"); goto fail; }
    {
        cudaMemPoolProps pp;
        memset(&pp, 0, sizeof pp);
        pp.allocType = cudaMemAllocationTypePinned;
        pp.handleTypes = cudaMemHandleTypeNone;
        pp.location.type = cudaMemLocationTypeDevice;
        pp.location.id = device;
        if ((e = cudaMemPoolCreate(&c->pool, &pp))) { st = ks_cuda_status(e, "memory pool"); goto fail; }
        uint64_t keep = UINT64_MAX;
        if ((e = cudaMemPoolSetAttribute(c->pool, cudaMemPoolAttrReleaseThreshold, &keep))) {
            st = ks_cuda_status(e, "memory pool");
            goto fail;
        }
    }
    if ((e = cudaMallocHost((void **)&c->pin, PIN_CAP))) { st = ks_cuda_status(e, "pinned staging buffer"); goto fail; }
    c->pin_cap = PIN_CAP;
    if ((st = blas_status(cublasCreate(&c->blas), "cublasCreate"))) goto fail;
    if ((st = blas_status(cublasSetStream(c->blas, c->stream), "cublasSetStream"))) goto fail;
    if ((st = raw_alloc(c, BLAS_WS, "cuBLAS workspace", &c->blas_ws))) goto fail;
    if ((st = blas_status(cublasSetWorkspace(c->blas, c->blas_ws, BLAS_WS), "cublasSetWorkspace"))) goto fail;
    /* decode graphs' step slot (pinned + device) and split workspace: fixed from the start, so
     * that recording a step changes no memory figure */
    if ((e = cudaMallocHost((void **)&c->h_step, 4 * sizeof(int32_t)))) { st = ks_cuda_status(e, "decode graph step slot"); goto fail; }
    memset(c->h_step, 0, 4 * sizeof(int32_t));
    if ((st = raw_alloc(c, 4 * sizeof(int32_t), "decode graph step slot", (void **)&c->d_step))) goto fail;
    if ((st = raw_alloc(c, GRAPH_WS, "decode graph attention workspace", &c->gws))) goto fail;
    cublasSetMathMode(c->blas, CUBLAS_DEFAULT_MATH);

    b->name = "cuda";
    b->alloc = cu_alloc;
    b->free = cu_free;
    b->upload = cu_upload;
    b->download = cu_download;
    b->copy = cu_copy;
    b->sync = cu_sync;
    b->weight_create = cu_weight_create;
    b->weight_free = cu_weight_free;
    b->weight_random = cu_weight_random;
    b->matmul = cu_matmul;
    if (o.fused) { /* off: the engine composes plain calls (A/B timing, fallback) */
        b->matmul_add = cu_matmul_add;
        b->matmul_qkv = cu_matmul_qkv;
        b->matmul_qkv_append = cu_matmul_qkv_append;
        b->matmul_swiglu = cu_matmul_swiglu;
    }
    if (o.mlp) b->mlp = cu_mlp; /* off: the engine's float32 prefill MLP */
    b->embed = cu_embed;
    b->rmsnorm = cu_rmsnorm;
    b->rope = cu_rope;
    b->swiglu = cu_swiglu;
    b->add = cu_add;
    b->gather_rows = cu_gather_rows;
    b->kv_alloc = cu_kv_alloc;
    b->kv_free = cu_kv_free;
    b->kv_append = cu_kv_append;
    b->kv_retain = cu_kv_retain;
    b->attention = cu_attention;
    b->destroy = cu_destroy;
    b->mem_stats = cu_mem_stats;
    b->ceilings = cu_ceilings;
    b->prof_mark = cu_prof_mark;
    b->prof_collect = cu_prof_collect;
    b->host_alloc = cu_host_alloc;
    b->host_free = cu_host_free;
    if (o.graphs) { /* off: every decode step launches its kernels one by one */
        b->graph_begin = cu_graph_begin;
        b->graph_end = cu_graph_end;
        b->graph_run = cu_graph_run;
        b->graph_free = cu_graph_free;
    }
#ifdef KS_BACKEND_PRIMS
    b->prims = &cuda_prims;
#endif
    *out = b;
    return KS_OK;
fail:
    cu_destroy(b);
    return st;
}
