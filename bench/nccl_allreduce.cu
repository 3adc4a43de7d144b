/* nccl_allreduce.cu — all-reduce bandwidth of the GPUs of one host through NCCL, the floor under
 * tensor parallelism's two all-reduces per layer (issue 17; bench/NOTES.md).
 *
 * One process, one thread: one communicator per GPU (ncclCommInitAll), each collective issued to
 * every GPU's stream between ncclGroupStart and ncclGroupEnd. For each element type (float32,
 * bf16) and each size from 8 KB to 1 GB (doubling), in place: `warmup` untimed all-reduces, then
 * `iters` timed ones between a sync of every stream and the next (host clock: the collective
 * spans all GPUs, so the wall time of the whole group is the time). Reported as nccl-tests does:
 *   algbw = bytes / time             (bytes of one rank's buffer)
 *   busbw = algbw * 2 (n - 1) / n    (what each link carries in a ring all-reduce: comparable
 *                                     across GPU counts, to be held against the link's rate)
 * Each size is checked once: rank r's buffer holds r + 1 + (i % 7) in element i, so the sum is
 * n (n + 1) / 2 + n (i % 7), exact in bf16 for these sizes of n; every element of rank 0's and
 * the last rank's result is compared.
 *
 * Usage: nccl_allreduce [-g gpus] [-b min_bytes] [-e max_bytes] [-n iters] [-w warmup]
 * NVLink multicast (NVLS) stays off: NCCL_NVLS_ENABLE=0 is set here unless the environment
 * already sets it (the shared machines require it off). Exit status 1 on any error or wrong sum. */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAXG 16

#define CK(call)                                                                                              \
    do {                                                                                                      \
        cudaError_t e_ = (call);                                                                              \
        if (e_ != cudaSuccess) {                                                                              \
            fprintf(stderr, "nccl_allreduce: %s: %s\n", #call, cudaGetErrorString(e_));                     \
            exit(1);                                                                                          \
        }                                                                                                     \
    } while (0)
#define NK(call)                                                                                              \
    do {                                                                                                      \
        ncclResult_t r_ = (call);                                                                             \
        if (r_ != ncclSuccess) {                                                                              \
            fprintf(stderr, "nccl_allreduce: %s: %s\n", #call, ncclGetErrorString(r_));                     \
            exit(1);                                                                                          \
        }                                                                                                     \
    } while (0)

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

/* buf (n elements) = r + 1 + (i % 7) */
template <typename T> __global__ void fill(T *buf, size_t n, int r) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        buf[i] = (T)(float)(r + 1 + (int)(i % 7));
}
/* bad[0] += count of elements != want(i) */
template <typename T> __global__ void check(const T *buf, size_t n, int g, unsigned long long *bad) {
    unsigned long long c = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        c += (float)buf[i] != (float)(g * (g + 1) / 2 + g * (int)(i % 7));
    if (c) atomicAdd(bad, c);
}

typedef struct {
    int g;
    ncclComm_t comm[MAXG];
    cudaStream_t st[MAXG];
    void *buf[MAXG];
    unsigned long long *bad[MAXG];
} ctx_t;

static void sync_all(ctx_t *c) {
    for (int r = 0; r < c->g; r++) { CK(cudaSetDevice(r)); CK(cudaStreamSynchronize(c->st[r])); }
}

static void all_reduce(ctx_t *c, size_t count, ncclDataType_t dt) {
    NK(ncclGroupStart());
    for (int r = 0; r < c->g; r++) NK(ncclAllReduce(c->buf[r], c->buf[r], count, dt, ncclSum, c->comm[r], c->st[r]));
    NK(ncclGroupEnd());
}

/* One size of one type: checked, then timed. Returns the seconds of one all-reduce (0: wrong sum). */
template <typename T> static double run_size(ctx_t *c, size_t bytes, ncclDataType_t dt, int warmup, int iters) {
    size_t count = bytes / sizeof(T);
    for (int r = 0; r < c->g; r++) {
        CK(cudaSetDevice(r));
        fill<T><<<1024, 256, 0, c->st[r]>>>((T *)c->buf[r], count, r);
        CK(cudaGetLastError());
        CK(cudaMemsetAsync(c->bad[r], 0, sizeof(unsigned long long), c->st[r]));
    }
    all_reduce(c, count, dt);
    int wrong = 0;
    for (int r = 0; r < c->g; r += (c->g > 1 ? c->g - 1 : 1)) {
        CK(cudaSetDevice(r));
        check<T><<<1024, 256, 0, c->st[r]>>>((const T *)c->buf[r], count, c->g, c->bad[r]);
        CK(cudaGetLastError());
        unsigned long long h = 0;
        CK(cudaMemcpyAsync(&h, c->bad[r], sizeof h, cudaMemcpyDeviceToHost, c->st[r]));
        CK(cudaStreamSynchronize(c->st[r]));
        if (h) { fprintf(stderr, "nccl_allreduce: %zu bytes: %llu wrong sums on rank %d\n", bytes, h, r); wrong = 1; }
    }
    if (wrong) return 0;
    for (int i = 0; i < warmup; i++) all_reduce(c, count, dt);
    sync_all(c);
    double t0 = now();
    for (int i = 0; i < iters; i++) all_reduce(c, count, dt);
    sync_all(c);
    return (now() - t0) / iters;
}

int main(int argc, char **argv) {
    int g = 0, iters = 20, warmup = 5;
    size_t lo = 8 << 10, hi = (size_t)1 << 30;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) { fprintf(stderr, "nccl_allreduce: %s needs a value\n", a); return 2; }
        if (!strcmp(a, "-g")) g = atoi(v);
        else if (!strcmp(a, "-b")) lo = strtoull(v, NULL, 10);
        else if (!strcmp(a, "-e")) hi = strtoull(v, NULL, 10);
        else if (!strcmp(a, "-n")) iters = atoi(v);
        else if (!strcmp(a, "-w")) warmup = atoi(v);
        else { fprintf(stderr, "usage: nccl_allreduce [-g gpus] [-b min_bytes] [-e max_bytes] [-n iters] [-w warmup]\n"); return 2; }
        i++;
    }
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    int have = 0;
    CK(cudaGetDeviceCount(&have));
    if (g <= 0) g = have;
    if (g < 1 || g > have || g > MAXG || lo < 8 || hi < lo || iters < 1 || warmup < 0) {
        fprintf(stderr, "nccl_allreduce: bad arguments (%d GPUs asked, %d present; sizes %zu..%zu)\n", g, have, lo, hi);
        return 2;
    }
    int ver = 0;
    NK(ncclGetVersion(&ver));
    ctx_t c;
    memset(&c, 0, sizeof c);
    c.g = g;
    int devs[MAXG];
    for (int r = 0; r < g; r++) devs[r] = r;
    NK(ncclCommInitAll(c.comm, g, devs));
    for (int r = 0; r < g; r++) {
        CK(cudaSetDevice(r));
        CK(cudaStreamCreateWithFlags(&c.st[r], cudaStreamNonBlocking));
        CK(cudaMalloc(&c.buf[r], hi));
        CK(cudaMalloc((void **)&c.bad[r], sizeof(unsigned long long)));
    }
    cudaDeviceProp p;
    CK(cudaGetDeviceProperties(&p, 0));
    printf("# all-reduce (sum, in place), %d x %s, NCCL %d, NCCL_NVLS_ENABLE=%s, %d warm-up + %d timed each\n", g,
           p.name, ver, getenv("NCCL_NVLS_ENABLE"), warmup, iters);
    printf("%12s %6s %10s %10s %10s\n", "bytes", "type", "time_us", "algbw_GBs", "busbw_GBs");
    int bad = 0;
    for (int t = 0; t < 2; t++)
        for (size_t bytes = lo; bytes <= hi; bytes *= 2) {
            double s = t == 0 ? run_size<float>(&c, bytes, ncclFloat32, warmup, iters)
                              : run_size<__nv_bfloat16>(&c, bytes, ncclBfloat16, warmup, iters);
            if (s <= 0) { bad = 1; continue; }
            double alg = bytes / s / 1e9;
            printf("%12zu %6s %10.1f %10.2f %10.2f\n", bytes, t == 0 ? "f32" : "bf16", s * 1e6, alg,
                   alg * 2.0 * (g - 1) / g);
            fflush(stdout);
        }
    for (int r = 0; r < g; r++) {
        CK(cudaSetDevice(r));
        CK(cudaFree(c.buf[r]));
        CK(cudaFree(c.bad[r]));
        CK(cudaStreamDestroy(c.st[r]));
        ncclCommDestroy(c.comm[r]);
    }
    if (bad) fprintf(stderr, "nccl_allreduce: FAILED (wrong sums above)\n");
    return bad;
}
