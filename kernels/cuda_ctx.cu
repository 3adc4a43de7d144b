/* cuda_ctx.cu — the CUDA backend's context (cuda_backend_int.h): device, stream, stream-ordered
 * memory pool, pinned staging ring, cuBLAS handle; the allocation helpers the other files use;
 * the memory operations of the backend table, memory statistics, pinned host memory; create
 * and destroy.
 *
 * Host arrays handed to an operation (token ids, positions, index lists) go to the device in
 * stream order: up to KS_CUDA_PUT_MAX bytes as a kernel argument, larger ones through the pinned
 * staging ring (a wrap of the ring waits for the stream), and those over a quarter of the ring
 * straight from pageable memory with a wait. upload, download, sync, weight creation, KV cache
 * reallocation and a new rope table wait for the stream too. */
#include "cuda_backend_int.h"
#include "gemm_wg.cuh"

#include <stdlib.h>
#include <string.h>

#define PIN_CAP ((size_t)16 << 20)
#define BLAS_WS ((size_t)32 << 20)

/* ================================================================ allocation, staging */

ks_status rec_fail(cuda_ctx *c, const char *what) {
    c->rec_failed = 1;
    return ks_errorf(KS_ERR_UNSUPPORTED, "cuda: %s cannot be recorded in a decode graph", what);
}

ks_status blas_status(cublasStatus_t s, const char *what) {
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
/* Memory of decode handlers' recordings (cuda_ctx.rec_own; cuda_backend_int.h cu_owned): plain
 * cudaMalloc blocks whose addresses stay fixed for every replay. A block its user freed is
 * taken again by a later allocation of a recording (the smallest that fits): the recordings
 * replay in the order they were made, on one stream, so a reuse is as safe as a stream-ordered
 * pool's, and a step's handlers share one layer's worth of memory instead of one each. Blocks go
 * back to the device once no recording that may use them is left (cuda_own_graphs). */
static ks_status own_alloc(cuda_ctx *c, size_t bytes, const char *what, void **out) {
    bytes = (bytes + 255) & ~(size_t)255;
    int best = -1;
    for (int i = 0; i < c->n_own; i++)
        if (!c->own[i].user && c->own[i].bytes >= bytes && (best < 0 || c->own[i].bytes < c->own[best].bytes)) best = i;
    if (best >= 0) {
        c->own[best].user = 1;
        *out = c->own[best].p;
        return KS_OK;
    }
    if (c->n_own == c->cap_own) {
        int cap = c->cap_own ? 2 * c->cap_own : 64;
        cu_owned *o = (cu_owned *)realloc(c->own, sizeof *o * (size_t)cap);
        if (!o) return KS_ERR_OOM;
        c->own = o;
        c->cap_own = cap;
    }
    cudaError_t e = cudaMalloc(out, bytes);
    if (e == cudaErrorMemoryAllocation) { cudaGetLastError(); *out = NULL; return oom(bytes, what); }
    if (e != cudaSuccess) { *out = NULL; return ks_cuda_status(e, what); }
    ks_status st = ks_memtrack_add(c->mem, *out, bytes, 0);
    if (st) { cudaFree(*out); *out = NULL; return st; }
    c->own[c->n_own++] = (cu_owned){*out, bytes, 1};
    return KS_OK;
}

/* The blocks no user holds, back to the device (no recording can launch them any more). */
static void own_trim(cuda_ctx *c) {
    for (int i = c->n_own - 1; i >= 0; i--)
        if (!c->own[i].user) {
            ks_memtrack_remove(c->mem, c->own[i].p);
            cudaFree(c->own[i].p); /* waits for the device: nothing still reads it */
            c->own[i] = c->own[--c->n_own];
        }
}

void cuda_own_graphs(cuda_ctx *c, int d) {
    c->own_graphs += d;
    if (c->own_graphs <= 0 && !c->rec_own) {
        c->own_graphs = 0;
        own_trim(c);
    }
}

void cuda_own_free_all(cuda_ctx *c) {
    for (int i = 0; i < c->n_own; i++) {
        ks_memtrack_remove(c->mem, c->own[i].p);
        cudaFree(c->own[i].p);
    }
    free(c->own);
    c->own = NULL;
    c->n_own = c->cap_own = 0;
}

ks_status dev_alloc(cuda_ctx *c, size_t bytes, const char *what, void **out) {
    *out = NULL;
    if (c->rec && c->rec_own) return own_alloc(c, bytes ? bytes : 16, what, out);
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
void dev_free(cuda_ctx *c, void *p) {
    if (!p) return;
    for (int i = c->n_own - 1; i >= 0; i--)
        if (c->own[i].p == p) { /* free for a later recording; back to the device when none can use it */
            c->own[i].user = 0;
            if (!c->own_graphs && !c->rec_own) own_trim(c);
            return;
        }
    ks_memtrack_remove(c->mem, p);
    cudaFreeAsync(p, c->stream);
}

/* Long-lived memory (weights, KV cache): plain cudaMalloc, so cudaFree really returns it. */
ks_status raw_alloc(cuda_ctx *c, size_t bytes, const char *what, void **out) {
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
void raw_free(cuda_ctx *c, void *p) {
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
ks_status upload_tmp(cuda_ctx *c, const void *src, size_t bytes, const char *what, void **out) {
    ks_status st = dev_alloc(c, bytes, what, out);
    if (st) return st;
    st = stage_h2d(c, *out, src, bytes, what);
    if (st) { dev_free(c, *out); *out = NULL; }
    return st;
}

/* ================================================================ memory operations */

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

/* ================================================================ memory statistics, pinned host memory */

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

/* ================================================================ lifetime */

static void cu_destroy(ks_backend *b) {
    if (!b) return;
    cuda_ctx *c = CTX(b);
    if (c) {
        if (c->stream) cudaStreamSynchronize(c->stream);
        if (c->h_step) cudaFreeHost(c->h_step);
        raw_free(c, c->d_step);
        raw_free(c, c->gws);
        raw_free(c, c->adb_cnt);
        raw_free(c, c->rtab);
        ks_cuda_gemm_wg_cache_free(c->gwg_maps);
        raw_free(c, c->row_mlp);
        for (int i = 0; i < c->n_lslot; i++) {
            raw_free(c, c->lslot[i].desc);
            free(c->lslot[i].hdesc);
        }
        free(c->lslot);
        for (int i = 0; i < ROPE_CACHE; i++) raw_free(c, c->rc[i].dev);
        for (int i = 0; i < c->pcap; i++) cudaEventDestroy(c->pev[i]);
        free(c->pev);
        free(c->ptag);
        if (c->blas) cublasDestroy(c->blas);
        raw_free(c, c->blas_ws);
        raw_free(c, c->zc);
        cuda_own_free_all(c); /* what handler recordings still owned */
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
    cuda_ctx *c = CTX(b);
    ks_cuda_scratch s = {scratch_alloc, scratch_free, b->ctx, (unsigned *)c->zc, c->zc ? KS_CUDA_COUNTERS : 0};
    return s;
}

extern "C" cudaStream_t ks_cuda_backend_stream(ks_backend *b) { return CTX(b)->stream; }
extern "C" int ks_cuda_backend_sm_count(ks_backend *b) { return CTX(b)->n_sm; }

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
    if (!(c->mem = ks_memtrack_create())) { st = KS_ERR_OOM; goto fail; }
    if ((e = cudaSetDevice(device))) { st = ks_cuda_status(e, "cudaSetDevice"); goto fail; }
    if ((e = cudaDeviceGetAttribute(&c->n_sm, cudaDevAttrMultiProcessorCount, device)) ||
        (e = cudaDeviceGetAttribute(&c->sm_major, cudaDevAttrComputeCapabilityMajor, device))) {
        st = ks_cuda_status(e, "device attributes");
        goto fail;
    }
    {
        int mclk = 0, bus = 0; /* kHz (double data rate), bits; an attribute the device lacks leaves 1 block */
        if (cudaDeviceGetAttribute(&mclk, cudaDevAttrMemoryClockRate, device) ||
            cudaDeviceGetAttribute(&bus, cudaDevAttrGlobalMemoryBusWidth, device))
            cudaGetLastError();
        const double rate = 2.0 * 1e3 * mclk * (bus / 8.0); /* bytes a second at peak */
        c->attn_bps = c->n_sm > 0 && rate / c->n_sm >= 30e9 ? 2 : 1;
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
    if ((e = cudaMallocHost((void **)&c->h_step, KS_CUDA_STEP_WORDS * sizeof(int32_t)))) { st = ks_cuda_status(e, "decode graph step slot"); goto fail; }
    memset(c->h_step, 0, KS_CUDA_STEP_WORDS * sizeof(int32_t));
    if ((st = raw_alloc(c, KS_CUDA_STEP_WORDS * sizeof(int32_t), "decode graph step slot", (void **)&c->d_step))) goto fail;
    if ((st = raw_alloc(c, GRAPH_WS, "decode graph attention workspace", &c->gws))) goto fail;
    if ((st = raw_alloc(c, KS_CUDA_COUNTERS * sizeof(unsigned), "primitive counters", &c->zc))) goto fail;
    if ((e = cudaMemsetAsync(c->zc, 0, KS_CUDA_COUNTERS * sizeof(unsigned), c->stream)) || (e = cudaStreamSynchronize(c->stream))) {
        st = ks_cuda_status(e, "primitive counters");
        goto fail;
    }
    if (!(c->gwg_maps = ks_cuda_gemm_wg_cache_create())) { st = ks_errorf(KS_ERR_OOM, "n-row GEMM tensor maps"); goto fail; }
    cublasSetMathMode(c->blas, CUBLAS_DEFAULT_MATH);

    b->name = "cuda";
    b->attn_ranges = 1; /* cuda_attn.cu reads ks_attn_args.seg */
    b->alloc = cu_alloc;
    b->free = cu_free;
    b->upload = cu_upload;
    b->download = cu_download;
    b->copy = cu_copy;
    b->sync = cu_sync;
    b->destroy = cu_destroy;
    b->mem_stats = cu_mem_stats;
    b->host_alloc = cu_host_alloc;
    b->host_free = cu_host_free;
    cuda_dense_install(b);
    cuda_layer_install(b);
    cuda_kv_install(b);
    cuda_attn_install(b);
    cuda_prof_install(b);
    cuda_graph_install(b);
    cuda_prims_install(b);
    *out = b;
    return KS_OK;
fail:
    cu_destroy(b);
    return st;
}
