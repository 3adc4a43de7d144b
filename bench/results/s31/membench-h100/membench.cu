// membench.cu — session 31: which load pattern reads TokenSelect's 128K keys fastest on this card?
// The keys of one layer at 128K: 8 KV heads x 130432 rows x 128 bf16 (256 B a row), head-major,
// 267 MB. Every kernel reads each byte once and folds it into an xor (kept live through a store).
//   sc1    sc1_logits' geometry and loads: grid (33, 8) x 256 threads (2 blocks an SM), a block a
//          contiguous run of rows of one head, warp w tiles t*8+w of 16 rows, lane l rows l/4 and
//          l/4+8, 16-byte pieces at 64 pp + 16 (l%4): 8 rows' 64 B an instruction; one tile ahead
//   contig the same grid, tiles and one-ahead, but each instruction 512 contiguous bytes (lane l
//          16 B at 512 i + 16 l of the 4 KB tile)
//   cpa    attn_decode_tc's geometry: grid (16, 8) x 128 threads, a block a contiguous split, warp w
//          tiles w, w+4, ..., each 4 KB by cp.async into a 2-stage ring, consumed from shared memory
//          (cpa8: 8 warps, 64 KB in flight an SM as sc1)
//   flat   a grid-stride uint4 read of the whole buffer, 4 blocks of 256 an SM (the copy reference)
#include <cstdio>
#include <cstdint>
#include <cuda_runtime.h>
#define CK(x) do { cudaError_t e_ = (x); if (e_) { printf("%s: %s\n", #x, cudaGetErrorString(e_)); return 1; } } while (0)
static const int H = 8, ROWS = 130432, RB = 256;

__global__ void __launch_bounds__(256, 2) k_sc1(const unsigned char *k, int run, int iters, unsigned *out) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gq = lane & 3, rl = lane >> 2;
    const unsigned char *kb = k + (size_t)blockIdx.y * ROWS * RB;
    const int r0b = blockIdx.x * run;
    uint4 cur[2][4], nxt[2][4];
    auto load = [&](int t, uint4 (&p)[2][4]) {
        const int base = r0b + (t * 8 + warp) * 16;
        for (int h = 0; h < 2; h++) {
            const int row = base + rl + 8 * h;
            const bool in = t < iters && row < ROWS;
            const unsigned char *rp = kb + (size_t)(in ? row : 0) * RB;
#pragma unroll
            for (int pp = 0; pp < 4; pp++) p[h][pp] = in ? __ldcs((const uint4 *)(rp + 64 * pp + 16 * gq)) : make_uint4(0, 0, 0, 0);
        }
    };
    unsigned acc = 0;
    load(0, cur);
    for (int t = 0; t < iters; t++) {
        load(t + 1, nxt);
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
            for (int pp = 0; pp < 4; pp++) { acc ^= cur[h][pp].x ^ cur[h][pp].y ^ cur[h][pp].z ^ cur[h][pp].w; cur[h][pp] = nxt[h][pp]; }
    }
    if (acc == 0x12345678u) out[0] = acc;
}

__global__ void __launch_bounds__(256, 2) k_contig(const unsigned char *k, int run, int iters, unsigned *out) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const unsigned char *kb = k + (size_t)blockIdx.y * ROWS * RB;
    const int r0b = blockIdx.x * run;
    uint4 cur[8], nxt[8];
    auto load = [&](int t, uint4 (&p)[8]) {
        const int base = r0b + (t * 8 + warp) * 16;
        const bool in = t < iters && base < ROWS;
        const unsigned char *tp = kb + (size_t)(in ? base : 0) * RB;
#pragma unroll
        for (int i = 0; i < 8; i++) p[i] = in ? __ldcs((const uint4 *)(tp + 512 * i + 16 * lane)) : make_uint4(0, 0, 0, 0);
    };
    unsigned acc = 0;
    load(0, cur);
    for (int t = 0; t < iters; t++) {
        load(t + 1, nxt);
#pragma unroll
        for (int i = 0; i < 8; i++) { acc ^= cur[i].x ^ cur[i].y ^ cur[i].z ^ cur[i].w; cur[i] = nxt[i]; }
    }
    if (acc == 0x12345678u) out[0] = acc;
}

__device__ __forceinline__ void cpa16(void *s, const void *g) {
    unsigned sa = (unsigned)__cvta_generic_to_shared(s);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(sa), "l"(g));
}
template <int W>
__global__ void __launch_bounds__(W * 32, 1) k_cpa(const unsigned char *k, int per, unsigned *out) {
    extern __shared__ __align__(16) unsigned char smem[];
    unsigned char (*ring)[2][4096] = (unsigned char (*)[2][4096])smem;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const unsigned char *kb = k + (size_t)blockIdx.y * ROWS * RB;
    const int tb = blockIdx.x * per, te = min(ROWS, tb + per);
    const int nt = (te - tb - warp * 16 + 16 * W - 1) / (16 * W);
    auto load = [&](int u) {
        const unsigned char *tp = kb + (size_t)(tb + (warp + W * u) * 16) * RB;
        for (int i = 0; i < 8; i++) cpa16(&ring[warp][u & 1][512 * i + 16 * lane], tp + 512 * i + 16 * lane);
    };
    unsigned acc = 0;
    if (nt > 0) load(0);
    asm volatile("cp.async.commit_group;");
    for (int u = 0; u < nt; u++) {
        if (u + 1 < nt) load(u + 1);
        asm volatile("cp.async.commit_group;");
        asm volatile("cp.async.wait_group 1;");
        __syncwarp();
        const uint4 *s = (const uint4 *)ring[warp][u & 1];
#pragma unroll
        for (int i = 0; i < 8; i++) { uint4 v = s[32 * i + lane]; acc ^= v.x ^ v.y ^ v.z ^ v.w; }
        __syncwarp();
    }
    if (acc == 0x12345678u) out[0] = acc;
}

__global__ void k_flat(const uint4 *k, size_t n, unsigned *out) {
    unsigned acc = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint4 v = __ldcs(k + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x12345678u) out[0] = acc;
}

int main() {
    const size_t bytes = (size_t)H * ROWS * RB;
    unsigned char *k, *junk;
    unsigned *out;
    CK(cudaMalloc(&k, bytes));
    CK(cudaMalloc(&junk, 256u << 20));
    CK(cudaMalloc(&out, 64));
    CK(cudaMemset(k, 1, bytes));
    int nsm = 0;
    CK(cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, 0));
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    const int want = nsm * 2 / H, step = 128;
    const int iters = (ROWS + want * step - 1) / (want * step), run = step * iters, nx = (ROWS + run - 1) / run;
    const int splits = nsm / H, per = ((ROWS + splits - 1) / splits + 127) / 128 * 128;
    CK(cudaFuncSetAttribute(k_cpa<8>, cudaFuncAttributeMaxDynamicSharedMemorySize, 8 * 8192));
    printf("bytes %zu, %d SMs; sc1/contig grid (%d, %d) iters %d run %d; cpa grid (%d, %d) per %d\n", bytes, nsm, nx, H, iters, run,
           splits, H, per);
    for (int round = 0; round < 2; round++)
        for (int kind = 0; kind < 5; kind++) {
            float best = 1e9f;
            for (int rep = 0; rep < 10; rep++) {
                CK(cudaMemset(junk, rep, 256u << 20)); /* the L2 holds none of the keys */
                cudaEventRecord(a);
                if (kind == 0) k_sc1<<<dim3(nx, H), 256>>>(k, run, iters, out);
                else if (kind == 1) k_contig<<<dim3(nx, H), 256>>>(k, run, iters, out);
                else if (kind == 2) k_cpa<4><<<dim3(splits, H), 128, 4 * 8192>>>(k, per, out);
                else if (kind == 4) k_cpa<8><<<dim3(splits, H), 256, 8 * 8192>>>(k, per, out);
                else k_flat<<<nsm * 4, 256>>>((const uint4 *)k, bytes / 16, out);
                cudaEventRecord(b);
                CK(cudaEventSynchronize(b));
                float ms;
                cudaEventElapsedTime(&ms, a, b);
                if (ms < best) best = ms;
            }
            const char *nm[5] = {"sc1", "contig", "cpa4", "flat", "cpa8"};
            printf("round %d %-7s %8.1f us  %.2f TB/s\n", round, nm[kind], best * 1e3, bytes / (best * 1e-3) / 1e12);
        }
    return 0;
}
