// gridbar.cu — standalone: what a grid barrier and a grid-level radix pass cost on this GPU, for
// a fused TokenSelect selection (scores, vote, top-k in one cooperative kernel). Not part of the
// build: nvcc -O3 -arch=sm_90a -o gridbar gridbar.cu
// Grid: 2 blocks of 256 threads a multiprocessor, cooperative (sc1_logits' shape). Kernels:
//   bar<R>:  R barriers (prim_scores1.cu's sc1_grid_sync: arrive, spin, depart, the last resets)
//   pass<R>: R radix passes over n float keys held in registers (n / blocks a block): a 256-bin
//            histogram of the digit in shared memory, its nonzero bins added to a global
//            histogram (one per pass), a barrier, every block reading the 256 bins and scanning
//            them from the top, the bin of the k-th largest fixed (as tk_clu does in a cluster)
// Each timed as the mean of 20 launches (cudaEvent), R = 0 subtracted.
#include <cstdio>
#include <cstdint>
#include <cuda_runtime.h>

#define CK(x) do { cudaError_t e_ = (x); if (e_) { printf("%s: %s\n", #x, cudaGetErrorString(e_)); return 1; } } while (0)

__device__ __forceinline__ void grid_sync(unsigned *c, unsigned nb) {
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        atomicAdd(c, 1u);
        while (*(volatile unsigned *)c < nb) __nanosleep(64);
        __threadfence();
        if (atomicAdd(c + 1, 1u) == nb - 1) { c[0] = 0; c[1] = 0; }
    }
    __syncthreads();
}

__global__ void bar(unsigned *c, int R) {
    const unsigned nb = gridDim.x;
    for (int r = 0; r < R; r++) grid_sync(c + 2 * (r & 1), nb);
}

__device__ __forceinline__ unsigned ld_acq(const unsigned *p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void red_rel(unsigned *p, unsigned v) {
    asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ unsigned atom_acqrel(unsigned *p, unsigned v) {
    unsigned o;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;" : "=r"(o) : "l"(p), "r"(v) : "memory");
    return o;
}
// v2: one monotonic counter a launch (barrier r waits for (r + 1) nb arrivals), a release add and
// acquire polls without sleeping; zeroed by the last block to leave (an exit counter)
__global__ void bar2(unsigned *c, int R) {
    const unsigned nb = gridDim.x;
    for (int r = 0; r < R; r++) {
        __syncthreads();
        if (threadIdx.x == 0) {
            red_rel(c, 1u);
            const unsigned target = (unsigned)(r + 1) * nb;
            while (ld_acq(c) < target) {}
        }
        __syncthreads();
    }
    if (threadIdx.x == 0 && atom_acqrel(c + 1, 1u) == nb - 1) { c[0] = 0; c[1] = 0; }
}
// v3: v2 with the arrivals spread over 16 counters (block b adds to counter b % 16); the last of
// each group (an acq_rel add that returns) adds to the top counter, and everyone polls the top
__global__ void bar3(unsigned *c, int R) {
    const unsigned nb = gridDim.x, G = 16, grp = blockIdx.x % G;
    const unsigned gsz = nb / G + (grp < nb % G ? 1 : 0);
    unsigned *top = c, *sub = c + 32, *ex = c + 1;
    for (int r = 0; r < R; r++) {
        __syncthreads();
        if (threadIdx.x == 0) {
            if (atom_acqrel(sub + 32 * grp, 1u) == (unsigned)(r + 1) * gsz - 1) red_rel(top, 1u);
            const unsigned target = (unsigned)(r + 1) * G;
            while (ld_acq(top) < target) {}
        }
        __syncthreads();
    }
    if (threadIdx.x == 0 && atom_acqrel(ex, 1u) == nb - 1) {
        top[0] = 0; ex[0] = 0;
        for (unsigned g = 0; g < G; g++) sub[32 * g] = 0;
    }
}

__device__ __forceinline__ uint32_t fkey(float f) {
    uint32_t u = __float_as_uint(f);
    return u ^ ((u >> 31) ? 0xffffffffu : 0x80000000u);
}

// keys: (n) floats; gh: (R, 256) zeroed; out: the chosen prefix (block 0 writes it)
__global__ void pass(const float *keys, int n, int k, unsigned *c, unsigned *gh, int R, uint32_t *out) {
    __shared__ unsigned h[256], wt[8], sel[3];
    const int t = threadIdx.x, lane = t & 31, w = t >> 5, nb = gridDim.x;
    const int per = (n + nb - 1) / nb, b0 = blockIdx.x * per;
    uint32_t kv[4];
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const int i = b0 + t + 256 * j;
        kv[j] = (i < n && i < b0 + per) ? fkey(keys[i]) : 0u;
    }
    uint32_t prefix = 0, mask = 0;
    unsigned need = k;
    for (int r = 0, shift = 24; r < R; r++, shift = shift ? shift - 8 : 24) {
        h[t] = 0;
        __syncthreads();
#pragma unroll
        for (int j = 0; j < 4; j++)
            if ((kv[j] & mask) == prefix) atomicAdd(&h[(kv[j] >> shift) & 255u], 1u);
        __syncthreads();
        unsigned *g = gh + 256 * r;
        if (h[t]) atomicAdd(&g[t], h[t]);
        grid_sync(c + 2 * (r & 1), nb);
        const unsigned gc = __ldcg(&g[255 - t]); // bin 255 - t: t = 0 is the top bin
        unsigned s = gc;
#pragma unroll
        for (int d = 1; d < 32; d <<= 1) {
            const unsigned y = __shfl_up_sync(0xffffffffu, s, d);
            if (lane >= d) s += y;
        }
        if (lane == 31) wt[w] = s;
        __syncthreads();
        unsigned before = s - gc;
        for (int u = 0; u < w; u++) before += wt[u];
        if (before < need && before + gc >= need) { sel[0] = 255 - t; sel[1] = before; sel[2] = gc; }
        __syncthreads();
        if (shift == 0) { prefix = 0; mask = 0; need = k; continue; } // wrap for long R: start over
        prefix |= sel[0] << shift;
        mask |= 255u << shift;
        need -= sel[1];
        __syncthreads();
    }
    if (blockIdx.x == 0 && t == 0) *out = prefix;
}

int main() {
    int dev = 0, nsm = 0, occ = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, dev));
    cudaDeviceProp pr;
    CK(cudaGetDeviceProperties(&pr, dev));
    printf("%s, %d SMs\n", pr.name, nsm);
    const int nb = nsm * 2;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, pass, 256, 0));
    if (occ < 2) { printf("occupancy %d\n", occ); return 1; }
    unsigned *c, *gh;
    uint32_t *out;
    float *keys;
    const int RMAX = 64;
    CK(cudaMalloc(&c, 4096));
    CK(cudaMemset(c, 0, 4096));
    {
        cudaEvent_t e0, e1;
        CK(cudaEventCreate(&e0));
        CK(cudaEventCreate(&e1));
        void (*ks[3])(unsigned *, int) = {bar, bar2, bar3};
        const char *nm[3] = {"sc1_grid_sync", "monotonic, acquire polls", "16 groups, then the top"};
        for (int round = 0; round < 3; round++)
            for (int v = 0; v < 3; v++) {
                float t[2];
                for (int q = 0; q < 2; q++) {
                    int R = q ? 64 : 0;
                    void *ab[] = {&c, &R};
                    CK(cudaLaunchCooperativeKernel((void *)ks[v], nb, 256, ab, 0, 0));
                    CK(cudaEventRecord(e0));
                    for (int it = 0; it < 20; it++) CK(cudaLaunchCooperativeKernel((void *)ks[v], nb, 256, ab, 0, 0));
                    CK(cudaEventRecord(e1));
                    CK(cudaEventSynchronize(e1));
                    CK(cudaEventElapsedTime(&t[q], e0, e1));
                }
                unsigned hc[64];
                CK(cudaMemcpy(hc, c, sizeof hc, cudaMemcpyDeviceToHost));
                unsigned nz = 0;
                for (int i = 0; i < 64; i++) nz |= hc[i];
                printf("barrier %-26s round %d: %.3f us a barrier (launch %.2f us), counters %s at rest\n", nm[v], round,
                       (t[1] - t[0]) * 1000 / 20 / 64, t[0] * 1000 / 20, nz ? "NOT zero" : "zero");
            }
    }
    CK(cudaMalloc(&gh, sizeof(unsigned) * 256 * RMAX));
    CK(cudaMalloc(&out, 4));
    for (int n : {32128, 130432}) {
        CK(cudaMalloc(&keys, sizeof(float) * n));
        // softmax-vote-like keys: positive, spread over several binades (a fixed LCG)
        float *hk = new float[n];
        uint64_t s = 12345;
        for (int i = 0; i < n; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            hk[i] = expf(-12.0f * (float)((s >> 33) & 0xffffff) / 16777216.0f);
        }
        CK(cudaMemcpy(keys, hk, sizeof(float) * n, cudaMemcpyHostToDevice));
        delete[] hk;
        cudaEvent_t e0, e1;
        CK(cudaEventCreate(&e0));
        CK(cudaEventCreate(&e1));
        for (int round = 0; round < 2; round++) {
            float tb[2], tp[2];
            const int Rs[2] = {0, 32};
            for (int q = 0; q < 2; q++) {
                int R = Rs[q];
                void *ab[] = {&c, &R};
                CK(cudaLaunchCooperativeKernel((void *)bar, nb, 256, ab, 0, 0)); // warm
                CK(cudaEventRecord(e0));
                for (int it = 0; it < 20; it++) CK(cudaLaunchCooperativeKernel((void *)bar, nb, 256, ab, 0, 0));
                CK(cudaEventRecord(e1));
                CK(cudaEventSynchronize(e1));
                CK(cudaEventElapsedTime(&tb[q], e0, e1));
                int k = 2048;
                void *ap[] = {&keys, &n, &k, &c, &gh, &R, &out};
                CK(cudaMemset(gh, 0, sizeof(unsigned) * 256 * RMAX));
                CK(cudaLaunchCooperativeKernel((void *)pass, nb, 256, ap, 0, 0));
                float tot = 0;
                for (int it = 0; it < 20; it++) {
                    CK(cudaMemset(gh, 0, sizeof(unsigned) * 256 * RMAX));
                    CK(cudaEventRecord(e0));
                    CK(cudaLaunchCooperativeKernel((void *)pass, nb, 256, ap, 0, 0));
                    CK(cudaEventRecord(e1));
                    CK(cudaEventSynchronize(e1));
                    float ms;
                    CK(cudaEventElapsedTime(&ms, e0, e1));
                    tot += ms;
                }
                tp[q] = tot;
            }
            printf("n %6d round %d: launch of bar (R = 0) %.2f us; a barrier %.3f us; launch of pass (R = 0) %.2f us; "
                   "a radix pass %.3f us (grid %d x 256)\n",
                   n, round, tb[0] * 1000 / 20, (tb[1] - tb[0]) * 1000 / 20 / 32, tp[0] * 1000 / 20,
                   (tp[1] - tp[0]) * 1000 / 20 / 32, nb);
        }
        CK(cudaFree(keys));
    }
    return 0;
}
