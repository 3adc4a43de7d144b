/* tp_nccl.cu — the device services of the tensor-parallel composite (core/tp_backend.h,
 * ks_tp_dev_ops) over NCCL and the CUDA runtime: one communicator per rank (ncclCommInitAll: all
 * ranks in this process, driven from one host thread), the float32 all-reduce on the ranks'
 * own streams (ncclGroupStart/End around one call per rank), the column gather onto rank 0 as
 * peer copies ordered by events, and the MLP without its residual (the partial product of a
 * row-parallel rank) from the CUDA backend's own dense operations (ks_cuda_dense.h). The gather
 * copies each rank's block whole (cudaMemcpyPeerAsync) into a staging buffer on rank 0 and
 * places it there, so it needs no strided copy across devices.
 *
 * No kernel of its own: the collectives are NCCL's, the copies the runtime's, the MLP the
 * backend's kernels (each tested against its CPU twin in tests/cuda/test_cuda.c); the composite
 * is tested end to end in tests/cuda/test_tp_cuda.c (one rank: the plain CUDA backend's
 * outputs; two: the one-GPU run's ids and kept sets).
 *
 * NVLink multicast (NVLS) must stay off on the shared machines: the caller's environment sets
 * NCCL_NVLS_ENABLE=0 (the library reads no environment and sets none). */
#include "cuda_backend_int.h"

#include <nccl.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "model.h"
#include "tp_backend.h"
}

struct ks_tp_dev {
    int n;
    int dev[KS_TP_MAX];
    cudaMemPool_t pool0;       /* rank 0's pool: the gather's staging buffers */
    ncclComm_t comm[KS_TP_MAX];
    cudaStream_t st[KS_TP_MAX];
    cudaEvent_t ev[KS_TP_MAX]; /* rank r's "work so far" (gather_cols) */
};

static ks_status nccl_status(ncclResult_t r, const char *what) {
    if (r == ncclSuccess) return KS_OK;
    return ks_errorf(KS_ERR_DEVICE, "tp: %s: NCCL: %s", what, ncclGetErrorString(r));
}

static void tp_use(ks_tp_dev *d, int r) { cudaSetDevice(d->dev[r]); }

static void tp_fini(ks_tp_dev *d) {
    if (!d) return;
    for (int r = 0; r < d->n; r++) {
        cudaSetDevice(d->dev[r]);
        if (d->comm[r]) ncclCommDestroy(d->comm[r]);
        if (d->ev[r]) cudaEventDestroy(d->ev[r]);
    }
    free(d);
}

/* Rank r's pool and plain allocations readable by every other rank's device, where the hardware
 * allows (peer copies then go over NVLink; otherwise the driver stages them). */
static ks_status peer_access(ks_backend *const *ranks, int n) {
    for (int r = 0; r < n; r++)
        for (int s = 0; s < n; s++) {
            if (r == s) continue;
            int dr = CTX(ranks[r])->device, ds = CTX(ranks[s])->device, can = 0;
            KS_CU(cudaDeviceCanAccessPeer(&can, ds, dr), "cudaDeviceCanAccessPeer");
            if (!can) continue;
            KS_CU(cudaSetDevice(ds), "cudaSetDevice");
            /* a speed-up only: copies work without it, so a refusal is not an error */
            if (cudaDeviceEnablePeerAccess(dr, 0) != cudaSuccess) cudaGetLastError();
            cudaMemAccessDesc a = {};
            a.location.type = cudaMemLocationTypeDevice;
            a.location.id = ds;
            a.flags = cudaMemAccessFlagsProtReadWrite;
            if (cudaMemPoolSetAccess(CTX(ranks[r])->pool, &a, 1) != cudaSuccess) cudaGetLastError();
        }
    return KS_OK;
}

static ks_status tp_init(ks_backend *const *ranks, int n, ks_tp_dev **out) {
    *out = NULL;
    if (n < 1 || n > KS_TP_MAX) return ks_errorf(KS_ERR_ARG, "tp: %d ranks (1..%d)", n, KS_TP_MAX);
    ks_tp_dev *d = (ks_tp_dev *)ks_calloc(1, sizeof *d);
    if (!d) return KS_ERR_OOM;
    d->n = n;
    for (int r = 0; r < n; r++) {
        if (strcmp(ranks[r]->name, "cuda")) { free(d); return ks_errorf(KS_ERR_ARG, "tp: rank %d is no CUDA backend", r); }
        d->dev[r] = CTX(ranks[r])->device;
        if (r == 0) d->pool0 = CTX(ranks[0])->pool;
        d->st[r] = CTX(ranks[r])->stream;
        for (int s = 0; s < r; s++)
            if (d->dev[s] == d->dev[r]) {
                int g = d->dev[r];
                free(d);
                return ks_errorf(KS_ERR_ARG, "tp: ranks %d and %d are both on GPU %d (one rank per GPU)", s, r, g);
            }
    }
    ks_status st = peer_access(ranks, n);
    for (int r = 0; r < n && !st; r++) {
        cudaSetDevice(d->dev[r]);
        st = ks_cuda_status(cudaEventCreateWithFlags(&d->ev[r], cudaEventDisableTiming), "cudaEventCreate");
    }
    if (!st) st = nccl_status(ncclCommInitAll(d->comm, n, d->dev), "ncclCommInitAll");
    if (st) { tp_fini(d); return st; }
    *out = d;
    return KS_OK;
}

static ks_status tp_all_reduce(ks_tp_dev *d, float *const *buf, size_t count) {
    if (d->n == 1 || !count) return KS_OK;
    ks_status st = nccl_status(ncclGroupStart(), "ncclGroupStart");
    for (int r = 0; r < d->n && !st; r++)
        st = nccl_status(ncclAllReduce(buf[r], buf[r], count, ncclFloat32, ncclSum, d->comm[r], d->st[r]), "ncclAllReduce");
    ks_status se = nccl_status(ncclGroupEnd(), "ncclGroupEnd");
    return st ? st : se;
}

static ks_status tp_gather_cols(ks_tp_dev *d, float *dst, size_t ld, float *const *src, int rows, const size_t *col0,
                                const size_t *w) {
    if (rows <= 0) return KS_OK;
    for (int r = 1; r < d->n; r++) { /* rank 0 waits for what each rank queued so far */
        cudaSetDevice(d->dev[r]);
        KS_CU(cudaEventRecord(d->ev[r], d->st[r]), "cudaEventRecord");
    }
    cudaSetDevice(d->dev[0]);
    for (int r = 0; r < d->n; r++) {
        if (r) KS_CU(cudaStreamWaitEvent(d->st[0], d->ev[r], 0), "cudaStreamWaitEvent");
        if (!w[r]) continue;
        size_t wb = w[r] * sizeof(float), bytes = wb * (size_t)rows;
        const void *from = src[r];
        void *stage = NULL;
        if (r) { /* rank r's block whole to rank 0 (one peer copy), then into its columns there */
            KS_CU(cudaMallocFromPoolAsync(&stage, bytes, d->pool0, d->st[0]), "gather: staging on rank 0");
            KS_CU(cudaMemcpyPeerAsync(stage, d->dev[0], src[r], d->dev[r], bytes, d->st[0]), "gather: peer copy");
            from = stage;
        }
        cudaError_t e = cudaMemcpy2DAsync(dst + col0[r], ld * sizeof(float), from, wb, wb, (size_t)rows,
                                          cudaMemcpyDeviceToDevice, d->st[0]);
        if (stage) cudaFreeAsync(stage, d->st[0]);
        if (e) return ks_cuda_status(e, "gather onto rank 0");
    }
    if (d->n == 1) return KS_OK;
    KS_CU(cudaEventRecord(d->ev[0], d->st[0]), "cudaEventRecord");
    for (int r = 1; r < d->n; r++) { /* nothing on rank r overwrites its source before the copy read it */
        cudaSetDevice(d->dev[r]);
        KS_CU(cudaStreamWaitEvent(d->st[r], d->ev[0], 0), "cudaStreamWaitEvent");
    }
    return KS_OK;
}

static ks_status tp_zero(ks_tp_dev *d, int r, void *p, size_t bytes) {
    cudaSetDevice(d->dev[r]);
    KS_CU(cudaMemsetAsync(p, 0, bytes, d->st[r]), "zero a rank buffer");
    return KS_OK;
}

#define MLP_ROWS 1024 /* rows per chunk of the float32 path: never n x ffn intermediates at once */

/* The MLP of cuda_layer.cu's cu_mlp under the same options, writing the partial product into
 * a->x instead of adding it: the norm first (it reads x), then x = 0 and the projections add. */
static ks_status tp_mlp_partial(ks_backend *b, const ks_layer_w *W, const ks_config *cf, const ks_acts *a, int n) {
    cuda_ctx *c = CTX(b);
    int D = cf->dim, F = cf->ffn;
    size_t xb = sizeof(float) * (size_t)n * D;
    ks_status st;
    if (n == 1 && c->o.fused) { /* norm + gate|up + SwiGLU in one launch, then the down projection */
        void *g = NULL;
        size_t fr = ((size_t)F + 3) & ~(size_t)3;
        if ((st = dev_alloc(c, sizeof(float) * 2 * fr, "tp: one row's MLP", &g))) return st;
        float *gate = (float *)g, *up = gate + fr;
        st = ks_cuda_dense_swiglu_proj(b, gate, a->x, W->ffn_norm, cf->eps, a->xn, W->w_gate, W->w_up, up, 1, D, F);
        if (!st) st = ks_cuda_status(cudaMemsetAsync(a->x, 0, xb, c->stream), "tp: zero x");
        if (!st) st = ks_cuda_dense_matmul_add(b, a->x, gate, W->w_down, NULL, 1, F, D);
        dev_free(c, g);
        return st;
    }
    if ((st = ks_cuda_dense_rmsnorm(b, a->xn, a->x, W->ffn_norm, n, D, cf->eps))) return st;
    KS_CU(cudaMemsetAsync(a->x, 0, xb, c->stream), "tp: zero x");
    if (n > 1 && c->o.mlp) return ks_cuda_dense_mlp_bf16(b, a->x, a->xn, NULL, W->w_gate, W->w_up, W->w_down, n, D, F);
    /* float32 intermediates, in row chunks */
    int ch = n < MLP_ROWS ? n : MLP_ROWS;
    void *g = NULL;
    if ((st = dev_alloc(c, sizeof(float) * 2 * (size_t)ch * F, "tp: MLP intermediates", &g))) return st;
    float *gate = (float *)g, *up = gate + (size_t)ch * F;
    for (int r0 = 0; r0 < n && !st; r0 += MLP_ROWS) {
        int rn = n - r0 < MLP_ROWS ? n - r0 : MLP_ROWS;
        const float *h = a->xn + (size_t)r0 * D;
        if (!(st = ks_cuda_dense_matmul(b, gate, h, W->w_gate, NULL, rn, D, F)) &&
            !(st = ks_cuda_dense_matmul(b, up, h, W->w_up, NULL, rn, D, F)) &&
            !(st = ks_cuda_dense_swiglu(b, gate, gate, up, (size_t)rn * F)))
            st = ks_cuda_dense_matmul_add(b, a->x + (size_t)r0 * D, gate, W->w_down, NULL, rn, F, D);
    }
    dev_free(c, g);
    return st;
}

static const ks_tp_dev_ops nccl_ops = {"cuda", tp_init, tp_fini, tp_use, tp_all_reduce, tp_gather_cols, tp_zero, tp_mlp_partial};

extern "C" const ks_tp_dev_ops *ks_tp_nccl_ops(void) { return &nccl_ops; }
