/* gemvlab.cu — session 42's standalone measurement of the decode gemvs' read rate (not built by the
 * Makefile; nvcc -O3 -std=c++17 -arch=sm_90a gemvlab.cu -o gemvlab). Llama-3.1-8B shapes, random
 * bf16 weights, x float32. Each line: best of 20 timings of 8 back-to-back launches (PDL attribute
 * on, as in the decode step), two weight copies alternated so that L2 holds neither, us a launch
 * and TB/s of weight bytes. Variants of the fused norm + gate|up + SwiGLU kernel (gemv.cu's
 * gemv_fused_kernel<GF_SWIGLU, true>, same per-row summation order) and a plain read of the same
 * bytes (the ceiling). Each variant's output is compared bit for bit with the base kernel's. */
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

typedef __nv_bfloat16 bf16;
#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_) { fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); exit(1); } \
    } while (0)

static __device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
static __device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
static __device__ __forceinline__ void pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

/* the weight load: 0 = __ldcs (main), 1 = ld.global.nc.L1::no_allocate.L2::256B, 2 = ld.global.cs.L2::256B,
 * 3 = ld.global.nc.L1::no_allocate.L2::128B */
template <int LD> static __device__ __forceinline__ uint4 ldw(const uint4 *p) {
    uint4 v;
    if constexpr (LD == 0) return __ldcs(p);
    else if constexpr (LD == 1)
        asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    else if constexpr (LD == 2)
        asm volatile("ld.global.cs.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    else
        asm volatile("ld.global.nc.L1::no_allocate.L2::128B.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

static __device__ __forceinline__ float dot8(uint4 u, float4 x0, float4 x1) {
    const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&u);
    float2 a = __bfloat1622float2(h[0]), b = __bfloat1622float2(h[1]);
    float2 e = __bfloat1622float2(h[2]), f = __bfloat1622float2(h[3]);
    return a.x * x0.x + a.y * x0.y + b.x * x0.z + b.y * x0.w + e.x * x1.x + e.y * x1.y + f.x * x1.z + f.y * x1.w;
}

/* norm prologue as gemv.cu's (rmsnorm.cu arithmetic) */
static __device__ void norm_prologue(float4 *xs, const float *x, const float *__restrict__ w, int in, float eps) {
    __shared__ double part[8];
    const float4 *xi = reinterpret_cast<const float4 *>(x);
    const float4 *w4 = reinterpret_cast<const float4 *>(w);
    const int n4 = in / 4;
    double ss = 0;
    for (int j = threadIdx.x; j < n4; j += 256) {
        float4 v = xi[j];
        xs[j] = v;
        ss += (double)v.x * v.x + (double)v.y * v.y + (double)v.z * v.z + (double)v.w * v.w;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = ss;
    __syncthreads();
    double t = 0;
#pragma unroll
    for (int k = 0; k < 8; k++) t += part[k];
    float r = 1.0f / sqrtf((float)(t / in) + eps);
    for (int j = threadIdx.x; j < n4; j += 256) {
        float4 v = xs[j], g = w4[j];
        float4 o = make_float4(__fmul_rn(g.x, __fmul_rn(v.x, r)), __fmul_rn(g.y, __fmul_rn(v.y, r)),
                               __fmul_rn(g.z, __fmul_rn(v.z, r)), __fmul_rn(g.w, __fmul_rn(v.w, r)));
        xs[j] = o;
    }
    __syncthreads();
}

static __device__ __forceinline__ float silu_mul_g(float g, float u) { return __fmul_rn(__fdiv_rn(g, 1.0f + expf(-g)), u); }

/* UPW units a warp at once (unit = row u of Wa and of Wb); PERSIST: a one-wave grid whose warps loop
 * over units (the norm once a block). UNR: unroll of the 16-byte step loop. */
template <int UNR, int UPW, bool PERSIST, int LD = 0>
__global__ void __launch_bounds__(256) swg(float *__restrict__ y, const float *__restrict__ x, const float *__restrict__ nw,
                                           const bf16 *__restrict__ Wa_, const bf16 *__restrict__ Wb_, int in, int units) {
    extern __shared__ float4 xs[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int steps = in / 8;
    const int stride = PERSIST ? gridDim.x * 8 * UPW : 0;
    int u0 = (blockIdx.x * 8 + warp) * UPW;
    uint4 f[UPW][2];
#pragma unroll
    for (int k = 0; k < UPW; k++) {
        int u = u0 + k;
        if (u < units) {
            f[k][0] = ldw<LD>(reinterpret_cast<const uint4 *>(Wa_ + (size_t)u * in) + lane);
            f[k][1] = ldw<LD>(reinterpret_cast<const uint4 *>(Wb_ + (size_t)u * in) + lane);
        }
    }
    pdl_trigger();
    pdl_wait();
    norm_prologue(xs, x, nw, in, 1e-5f);
    for (bool firstit = true; u0 < units; u0 += stride, firstit = false) {
        float a0[UPW], a1[UPW];
        const uint4 *wa[UPW], *wb[UPW];
#pragma unroll
        for (int k = 0; k < UPW; k++) {
            int u = min(u0 + k, units - 1);
            wa[k] = reinterpret_cast<const uint4 *>(Wa_ + (size_t)u * in);
            wb[k] = reinterpret_cast<const uint4 *>(Wb_ + (size_t)u * in);
            if (!firstit) { f[k][0] = ldw<LD>(wa[k] + lane); f[k][1] = ldw<LD>(wb[k] + lane); }
        }
        {
            float4 x0 = xs[2 * lane], x1 = xs[2 * lane + 1];
#pragma unroll
            for (int k = 0; k < UPW; k++) { a0[k] = dot8(f[k][0], x0, x1); a1[k] = dot8(f[k][1], x0, x1); }
        }
#pragma unroll UNR
        for (int c = lane + 32; c < steps; c += 32) {
            float4 x0 = xs[2 * c], x1 = xs[2 * c + 1];
            uint4 ua[UPW], ub[UPW];
#pragma unroll
            for (int k = 0; k < UPW; k++) { ua[k] = ldw<LD>(wa[k] + c); ub[k] = ldw<LD>(wb[k] + c); }
#pragma unroll
            for (int k = 0; k < UPW; k++) { a0[k] += dot8(ua[k], x0, x1); a1[k] += dot8(ub[k], x0, x1); }
        }
#pragma unroll
        for (int k = 0; k < UPW; k++) {
            float va = warp_sum(a0[k]), vb = warp_sum(a1[k]);
            if (lane == 0 && u0 + k < units) y[u0 + k] = silu_mul_g(va, vb);
        }
        if (!PERSIST) break;
    }
}

/* gemv.cu's gemv_kernel<ROWS, true, UNR, KS> (y += W x), with the load LD */
template <int ROWS, int UNR, int KS, int LD>
__global__ void __launch_bounds__(256) gemv_p(float *__restrict__ y, const float *__restrict__ x, const bf16 *__restrict__ W, int in, int out) {
    constexpr int RG = 8 / KS;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int kq = warp % KS, rg = warp / KS;
    const int row0 = (blockIdx.x * RG + rg) * ROWS;
    const bool live = row0 < out;
    const int steps = in / 8;
    const int c_lo = (int)((long long)kq * steps / KS), c_hi = (int)((long long)(kq + 1) * steps / KS);
    const uint4 *Wv[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; r++) Wv[r] = reinterpret_cast<const uint4 *>(W + (size_t)min(row0 + r, out - 1) * in);
    const bool first = live && c_lo + lane < c_hi;
    uint4 u0[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; r++) u0[r] = first ? ldw<LD>(Wv[r] + c_lo + lane) : make_uint4(0, 0, 0, 0);
    pdl_trigger();
    pdl_wait();
    float acc[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; r++) acc[r] = 0.f;
    const float4 *xv = reinterpret_cast<const float4 *>(x);
    if (first) {
        const int c = c_lo + lane;
        float4 x0 = __ldg(xv + 2 * c), x1 = __ldg(xv + 2 * c + 1);
#pragma unroll
        for (int r = 0; r < ROWS; r++) acc[r] += dot8(u0[r], x0, x1);
    }
    if (live) {
#pragma unroll UNR
        for (int c = c_lo + lane + 32; c < c_hi; c += 32) {
            float4 x0 = __ldg(xv + 2 * c), x1 = __ldg(xv + 2 * c + 1);
            uint4 u[ROWS];
#pragma unroll
            for (int r = 0; r < ROWS; r++) u[r] = ldw<LD>(Wv[r] + c);
#pragma unroll
            for (int r = 0; r < ROWS; r++) acc[r] += dot8(u[r], x0, x1);
        }
    }
    __shared__ float part[8][ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
        float v = warp_sum(acc[r]);
        if (lane == 0) part[warp][r] = v;
    }
    __syncthreads();
    if (kq == 0 && lane < ROWS && row0 + lane < out) {
        float v = 0.f;
#pragma unroll
        for (int q = 0; q < KS; q++) v += part[rg * KS + q][lane];
        y[row0 + lane] = y[row0 + lane] + v;
    }
}

/* the ceiling: every 16 bytes of the two matrices read once (grid-stride, UNR loads in flight) */
template <int UNR, int LD = 0>
__global__ void __launch_bounds__(256) readall(unsigned *out, const uint4 *__restrict__ a, const uint4 *__restrict__ b, size_t n16) {
    pdl_trigger();
    pdl_wait();
    unsigned acc = 0;
    size_t t = (size_t)blockIdx.x * 256 + threadIdx.x, st = (size_t)gridDim.x * 256;
    for (size_t i = t; i < n16; i += st * UNR) {
        uint4 v[UNR];
#pragma unroll
        for (int k = 0; k < UNR; k++) v[k] = (i + k * st < n16) ? ldw<LD>(a + i + k * st) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int k = 0; k < UNR; k++) acc ^= v[k].x ^ v[k].y ^ v[k].z ^ v[k].w;
        for (int k = 0; k < UNR; k++) v[k] = (i + k * st < n16) ? ldw<LD>(b + i + k * st) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int k = 0; k < UNR; k++) acc ^= v[k].x ^ v[k].y ^ v[k].z ^ v[k].w;
    }
    if (acc == 0x12345678u) out[0] = acc;
}

static cudaStream_t S;
template <typename K, typename... A> static void launch(K k, dim3 g, size_t smem, A... a) {
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = g;
    cfg.blockDim = dim3(256);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = S;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    CK(cudaLaunchKernelEx(&cfg, k, a...));
}

template <typename F> static double best_us(F fn) {
    for (int i = 0; i < 3; i++) fn(i);
    CK(cudaStreamSynchronize(S));
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    double best = 1e30;
    for (int r = 0; r < 20; r++) {
        CK(cudaEventRecord(a, S));
        for (int j = 0; j < 8; j++) fn(j);
        CK(cudaEventRecord(b, S));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        if (ms < best) best = ms;
    }
    return best * 1000.0 / 8;
}

__global__ void fill(bf16 *w, size_t n, unsigned seed, float sc) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned h = (unsigned)i * 2654435761u ^ seed;
        h ^= h >> 13; h *= 0x5bd1e995u; h ^= h >> 15;
        w[i] = __float2bfloat16((((h & 0xffff) / 65535.0f) - 0.5f) * sc);
    }
}

int main(int argc, char **argv) {
    int in = 4096;
    struct { const char *name; int units; } shapes[] = {{"gate|up 2 x 14336x4096", 14336}, {"q|k|v-like 2 x 3072x4096", 3072}};
    CK(cudaStreamCreateWithFlags(&S, cudaStreamNonBlocking));
    int nsm;
    CK(cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, 0));
    float *x, *nw, *y;
    unsigned *sink;
    CK(cudaMalloc(&x, in * 4));
    CK(cudaMalloc(&nw, in * 4));
    CK(cudaMalloc(&y, 14336 * 4 * 4));
    CK(cudaMalloc(&sink, 4));
    {
        std::vector<float> h(in);
        for (int i = 0; i < in; i++) h[i] = (float)((i * 37 % 101) - 50) / 50.0f;
        CK(cudaMemcpy(x, h.data(), in * 4, cudaMemcpyHostToDevice));
        for (int i = 0; i < in; i++) h[i] = 0.5f + (float)(i % 7) / 7.0f;
        CK(cudaMemcpy(nw, h.data(), in * 4, cudaMemcpyHostToDevice));
    }
    for (auto &sh : shapes) {
        const int U = sh.units;
        size_t n = (size_t)U * in;
        int ncopy = sh.units < 8192 ? 6 : 2;
        std::vector<bf16 *> A(ncopy), B(ncopy);
        for (int c = 0; c < ncopy; c++) {
            CK(cudaMalloc(&A[c], n * 2));
            CK(cudaMalloc(&B[c], n * 2));
            fill<<<1024, 256>>>(A[c], n, 11 + c, 0.03f);
            fill<<<1024, 256>>>(B[c], n, 91 + c, 0.03f);
        }
        CK(cudaDeviceSynchronize());
        double bytes = 2.0 * n * 2;
        size_t smem = in * 4;
        std::vector<float> ref(U), got(U);
        printf("== %s (%.1f MB), %d SMs\n", sh.name, bytes / 1e6, nsm);
        auto report = [&](const char *name, double us, bool check) {
            int diff = -1;
            if (check) {
                CK(cudaMemcpy(got.data(), y, U * 4, cudaMemcpyDeviceToHost));
                diff = 0;
                for (int i = 0; i < U; i++) diff += memcmp(&got[i], &ref[i], 4) != 0;
            }
            printf("  %-44s %8.2f us  %5.2f TB/s  %s\n", name, us, bytes / us / 1e6,
                   diff < 0 ? "" : diff ? "DIFFERS" : "same bits");
        };
        /* occupancy of each variant */
#define OCC(K)                                                                                       \
    ({                                                                                               \
        int b_;                                                                                      \
        CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b_, K, 256, smem));                        \
        b_;                                                                                          \
    })
#define RUN(NAME, K, UPW, PERS)                                                                      \
    do {                                                                                             \
        int occ = OCC(K);                                                                            \
        unsigned g = PERS ? (unsigned)(occ * nsm) : (unsigned)((U + 8 * UPW - 1) / (8 * UPW));       \
        if (PERS && g * 8u * UPW > (unsigned)U) g = (U + 8 * UPW - 1) / (8 * UPW);                   \
        double us = best_us([&](int i) { launch(K, dim3(g), smem, y, (const float *)x, (const float *)nw, (const bf16 *)A[i % ncopy], (const bf16 *)B[i % ncopy], in, U); }); \
        char nm[96];                                                                                 \
        snprintf(nm, sizeof nm, "%s (grid %u, %d/SM)", NAME, g, occ);                                \
        report(nm, us, true);                                                                        \
    } while (0)
        /* the base: unroll 4, one unit a warp, one block per 8 units */
        launch(swg<4, 1, false>, dim3((U + 7) / 8), smem, y, (const float *)x, (const float *)nw, (const bf16 *)A[1], (const bf16 *)B[1], in, U); /* the copy the timed loops end on (j = 7) */
        CK(cudaStreamSynchronize(S));
        CK(cudaMemcpy(ref.data(), y, U * 4, cudaMemcpyDeviceToHost));
        for (int round = 0; round < 2; round++) {
            printf(" round %d\n", round);
            {
#define RD(NAME, K)                                                                                  \
    do {                                                                                             \
        unsigned g = nsm * 8;                                                                        \
        double us = best_us([&](int i) { launch(K, dim3(g), 0, sink, (const uint4 *)A[i % ncopy], (const uint4 *)B[i % ncopy], n / 8); }); \
        report(NAME, us, false);                                                                     \
    } while (0)
                RD("read only, __ldcs", (readall<8, 0>));
                RD("read only, nc.no_allocate.L2::256B", (readall<8, 1>));
                RD("read only, cs.L2::256B", (readall<8, 2>));
                RD("read only, nc.no_allocate.L2::128B", (readall<8, 3>));
            }
            RUN("base: unroll 4, 1 unit, __ldcs", (swg<4, 1, false, 0>), 1, false);
            RUN("unroll 4, 1 unit, nc.L2::256B", (swg<4, 1, false, 1>), 1, false);
            RUN("unroll 4, 1 unit, cs.L2::256B", (swg<4, 1, false, 2>), 1, false);
            RUN("unroll 4, 1 unit, nc.L2::128B", (swg<4, 1, false, 3>), 1, false);
            RUN("unroll 2, 2 units, __ldcs", (swg<2, 2, false, 0>), 2, false);
            RUN("unroll 2, 2 units, nc.L2::256B", (swg<2, 2, false, 1>), 2, false);
            RUN("unroll 2, 2 units, cs.L2::256B", (swg<2, 2, false, 2>), 2, false);
            RUN("unroll 8, 1 unit, nc.L2::256B", (swg<8, 1, false, 1>), 1, false);
            RUN("unroll 2, 1 unit, nc.L2::256B", (swg<2, 1, false, 1>), 1, false);
        }
        for (int c = 0; c < ncopy; c++) { cudaFree(A[c]); cudaFree(B[c]); }
    }
    /* the plain gemvs: down (4096 x 14336) and o (4096 x 4096), y += W x */
    struct { const char *name; int out, in; } ps[] = {{"down 4096x14336", 4096, 14336}, {"o 4096x4096", 4096, 4096}};
    float *xb;
    CK(cudaMalloc(&xb, 14336 * 4));
    CK(cudaMemset(xb, 0, 14336 * 4));
    for (auto &sh : ps) {
        size_t n = (size_t)sh.out * sh.in;
        int ncopy = sh.in > 8192 ? 2 : 6;
        std::vector<bf16 *> A(ncopy);
        for (int c = 0; c < ncopy; c++) {
            CK(cudaMalloc(&A[c], n * 2));
            fill<<<1024, 256>>>(A[c], n, 31 + c, 0.03f);
        }
        CK(cudaDeviceSynchronize());
        double bytes = n * 2.0;
        printf("== %s (%.1f MB)\n", sh.name, bytes / 1e6);
        for (int round = 0; round < 2; round++) {
            printf(" round %d\n", round);
#define PL(NAME, ROWS, KS, K)                                                                         \
    do {                                                                                             \
        unsigned g = (sh.out + (8 / KS) * ROWS - 1) / ((8 / KS) * ROWS);                              \
        double us = best_us([&](int i) { launch(K, dim3(g), 0, y, (const float *)xb, (const bf16 *)A[i % ncopy], sh.in, sh.out); }); \
        printf("  %-44s %8.2f us  %5.2f TB/s\n", NAME, us, bytes / us / 1e6);                        \
    } while (0)
            {
                unsigned g = nsm * 8;
                double us = best_us([&](int i) { launch(readall<8, 0>, dim3(g), 0, sink, (const uint4 *)A[i % ncopy], (const uint4 *)A[(i + 1) % ncopy], n / 16); });
                printf("  %-44s %8.2f us  %5.2f TB/s\n", "read only, __ldcs", us, bytes / us / 1e6);
                us = best_us([&](int i) { launch(readall<8, 1>, dim3(g), 0, sink, (const uint4 *)A[i % ncopy], (const uint4 *)A[(i + 1) % ncopy], n / 16); });
                printf("  %-44s %8.2f us  %5.2f TB/s\n", "read only, nc.L2::256B", us, bytes / us / 1e6);
            }
            if (sh.in > 8192) {
                PL("main: rows 1, unroll 8, ksplit 2, __ldcs", 1, 2, (gemv_p<1, 8, 2, 0>));
                PL("rows 1, unroll 8, ksplit 2, nc.L2::256B", 1, 2, (gemv_p<1, 8, 2, 1>));
                PL("rows 1, unroll 8, ksplit 2, cs.L2::256B", 1, 2, (gemv_p<1, 8, 2, 2>));
                PL("rows 2, unroll 4, ksplit 2, nc.L2::256B", 2, 2, (gemv_p<2, 4, 2, 1>));
            } else {
                PL("main: rows 4, unroll 8, ksplit 4, __ldcs", 4, 4, (gemv_p<4, 8, 4, 0>));
                PL("rows 4, unroll 8, ksplit 4, nc.L2::256B", 4, 4, (gemv_p<4, 8, 4, 1>));
                PL("rows 4, unroll 8, ksplit 4, cs.L2::256B", 4, 4, (gemv_p<4, 8, 4, 2>));
                PL("rows 2, unroll 8, ksplit 4, nc.L2::256B", 2, 4, (gemv_p<2, 8, 4, 1>));
            }
        }
        for (int c = 0; c < ncopy; c++) cudaFree(A[c]);
    }
    return 0;
}
