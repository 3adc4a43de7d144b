/* attn_prefill_wgmma_pipe.cu — SUPERSEDED, kept for reference, not compiled (kernels/versions/).
 * Variants 5 .. 7 of kernels/attn_prefill_wgmma.cu: one CTA per SM, a cp.async ring filled by
 * all threads, one CTA barrier per key tile, FA3's intra-warpgroup pipelining. Measured on an
 * H200 at 247-364 TFLOP/s, slower than variant 4 (392-399); the warp-specialised kernel (variant
 * 10) replaced them (bench/NOTES.md, "sixth run"). It used the helpers of that file as they were
 * when it was removed (commit 0a3ed0b). */

/* ---------------------------------------------------------------- pipelined variants (5 .. 7) */

/* Variants 5 .. 7: one CTA per SM (all registers for NWG warpgroups), GQA packing as variant 3,
 * an NST-stage ring of K/V tiles filled by cp.async NST - 2 tiles ahead, and the two GEMMs of a
 * warpgroup overlapped with its softmax ("intra-warpgroup pipelining"): iteration j issues
 * S_j = Q K_j^T and O += P_{j-1} V_{j-1} back to back, waits for S_j only, runs the mask and the
 * softmax of S_j while the tensor cores still work on P_{j-1} V_{j-1}, then waits for that, scales
 * O by tile j's correction and packs P_j. One __syncthreads per tile: after it, every warp is done
 * with iteration j - 1, which read V_{j-2} and K_{j-1} at the latest, so the slot of tile j - 2 is
 * free and receives tile j + NST - 2 (V_{j-1} stays live until iteration j's PV). */
template <int D, int BN, int NWG, int NST> struct wp_smem {
    static constexpr int BM = 64 * NWG;
    static constexpr int Q = BM * D * 2;
    static constexpr int KV = BN * D * 2;
    static constexpr int TOTAL = 1024 + Q + NST * 2 * KV + NST * BN * 4 + 2 * 4 * NWG * 4;
};

template <int D, int BN, int NWG, int NST>
__global__ void __launch_bounds__(NWG * 128, 1) wg_pipe_kernel(const wg_args A) {
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    constexpr int NT = NWG * 128, BM = 64 * NWG;
    constexpr int NCH = D / 8, KS = D / 16, PK = BN / 16, SR = BN / 2, OR = D / 2;
    static_assert(NST >= 3, "the ring needs 3 slots at least");
    typedef wp_smem<D, BN, NWG, NST> L;
    unsigned char *smem = smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u);
    unsigned char *sQ = smem;                     /* SW128 (BM, D) */
    unsigned char *sK = sQ + L::Q;                /* NST x SW128 (BN, D) */
    unsigned char *sV = sK + NST * L::KV;         /* NST x SW128 (BN, D) */
    int *sKP = (int *)(sV + NST * L::KV);         /* NST x BN key positions */
    int *sRed = sKP + NST * BN;                   /* 2 x 4 * NWG */

    const ks_cuda_attn_params &p = A.p;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wg = warp >> 2, wq = warp & 3;
    const int g = lane >> 2, t4 = lane & 3;
    const int G = p.n_heads / p.n_kv_heads;
    const int kv = blockIdx.x;
    const int qb = A.n_qblocks - 1 - blockIdx.y; /* heaviest first */
    const int q0 = qb * BM, H = p.n_heads;
    const int nrows = p.n * G;
    auto row_q = [&](int f) -> int { return f / G; };
    auto row_h = [&](int f) -> int { return kv * G + (f - (f / G) * G); };
    const int nk = p.nk[kv], ntiles = (nk + BN - 1) / BN;
    const bf16 *Kg = (const bf16 *)p.k + (size_t)kv * p.capacity * D;
    const bf16 *Vg = (const bf16 *)p.v + (size_t)kv * p.capacity * D;
    const int32_t *KPg = (p.kpos && !p.renumber) ? p.kpos + (size_t)kv * p.capacity : nullptr;
    const int2 *TB = A.bounds + (size_t)kv * A.max_tiles;
    const int window = p.window;

    for (int e = tid; e < BM * NCH; e += NT) {
        int r = e / NCH, c = e - r * NCH;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (q0 + r < nrows) {
            const int f = q0 + r;
            const float4 *src = reinterpret_cast<const float4 *>(p.q + ((size_t)row_q(f) * H + row_h(f)) * D + c * 8);
            float4 a = src[0], b = src[1];
            v.x = pack_bf16(a.x, a.y);
            v.y = pack_bf16(a.z, a.w);
            v.z = pack_bf16(b.x, b.y);
            v.w = pack_bf16(b.z, b.w);
        }
        *reinterpret_cast<uint4 *>(sQ + (c >> 3) * (BM * 128) + r * 128 + (((c & 7) ^ (r & 7)) << 4)) = v;
    }
    const int row0 = wg * 64 + wq * 16 + g;
    int qp_r[2];
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        int f = q0 + row0 + 8 * hf, i = row_q(f);
        qp_r[hf] = f >= nrows ? INT_MIN : p.q_renumber ? nk - p.n + i : p.qpos[i];
    }
    int qlo = INT_MAX, qhi = INT_MIN;
#pragma unroll
    for (int hf = 0; hf < 2; hf++)
        if (q0 + row0 + 8 * hf < nrows) { qlo = min(qlo, qp_r[hf]); qhi = max(qhi, qp_r[hf]); }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        qlo = min(qlo, __shfl_xor_sync(0xffffffffu, qlo, o));
        qhi = max(qhi, __shfl_xor_sync(0xffffffffu, qhi, o));
    }
    if (lane == 0) { sRed[warp] = qlo; sRed[4 * NWG + warp] = qhi; }

    auto tile_bounds = [&](int t) -> int2 {
        int2 b = TB[t * BN / WG_BOUNDS_TILE];
        if (BN > WG_BOUNDS_TILE) {
#pragma unroll
            for (int x = 1; x < BN / WG_BOUNDS_TILE; x++) {
                int e = t * BN / WG_BOUNDS_TILE + x;
                if (e < A.max_tiles) {
                    int2 c = TB[e];
                    b.x = min(b.x, c.x);
                    b.y = max(b.y, c.y);
                }
            }
        }
        return b;
    };
    auto load_tile = [&](int t, int slot) {
        unsigned char *dk = sK + slot * L::KV, *dv = sV + slot * L::KV;
        for (int e = tid; e < BN * NCH; e += NT) {
            int r = e / NCH, c = e - r * NCH;
            int j = t * BN + r;
            int ok = j < nk;
            size_t off = (size_t)(ok ? j : 0) * D + c * 8;
            int so = (c >> 3) * (BN * 128) + r * 128 + (((c & 7) ^ (r & 7)) << 4);
            cp_async16(dk + so, Kg + off, ok ? 16 : 0);
            cp_async16(dv + so, Vg + off, ok ? 16 : 0);
        }
        for (int r = tid; r < BN; r += NT) {
            int j = t * BN + r;
            if (KPg) cp_async4(sKP + slot * BN + r, KPg + (j < nk ? j : 0), j < nk ? 4 : 0);
            else sKP[slot * BN + r] = j;
        }
    };

    proxy_fence(); /* the Q stores are read by wgmma */
    __syncthreads();
    int qmin = INT_MAX, qmax = INT_MIN;
#pragma unroll
    for (int w = 0; w < 4 * NWG; w++) { qmin = min(qmin, sRed[w]); qmax = max(qmax, sRed[4 * NWG + w]); }
    auto skipped = [&](int t) -> bool {
        int2 b = tile_bounds(t);
        return b.x > qmax || (window > 0 && (long long)qmin - b.y >= window);
    };
    auto next_tile = [&](int t) -> int {
        while (t < ntiles && skipped(t)) t++;
        return t;
    };

    /* prologue: tiles 0 .. NST - 3 of the sequence in flight, one commit group each */
    int t_load = -1; /* the last tile id issued (ntiles once the sequence is exhausted) */
#pragma unroll
    for (int j = 0; j < NST - 2; j++) {
        t_load = next_tile(t_load + 1);
        if (t_load < ntiles) load_tile(t_load, j);
        cp_async_commit();
    }

    float o[OR];
#pragma unroll
    for (int i = 0; i < OR; i++) o[i] = 0.f;
    float m_r[2] = {-INFINITY, -INFINITY}, l_r[2] = {0.f, 0.f};
    const float sl2 = A.scale_log2;
    const uint32_t qbase = smem_u32(sQ) + wg * 64 * 128;
    uint32_t pa[PK][4];
    int t = next_tile(0);
    int j = 0, pslot = 0;
    for (; t < ntiles; j++) {
        const int slot = j % NST;
        cp_async_wait<NST - 3>(); /* tile j's group (NST - 3 younger groups may stay in flight) */
        proxy_fence();
        __syncthreads();
        t_load = t_load < ntiles ? next_tile(t_load + 1) : ntiles;
        if (t_load < ntiles) load_tile(t_load, (j + NST - 2) % NST);
        cp_async_commit();

        const uint32_t kbase = smem_u32(sK + slot * L::KV);
        float s[SR];
        pin(s);
        pin(o);
        wg_fence();
#pragma unroll
        for (int ks = 0; ks < KS; ks++) {
            uint32_t off = (ks & 3) * 32;
            uint64_t da = wg_desc(qbase + (ks >> 2) * (BM * 128) + off, 16, 1024);
            uint64_t db = wg_desc(kbase + (ks >> 2) * (BN * 128) + off, 16, 1024);
            wg_mma<BN>::ss(s, da, db, ks > 0);
        }
        wg_commit();
        if (j > 0) {
            const uint32_t vbase = smem_u32(sV + pslot * L::KV);
#pragma unroll
            for (int kk = 0; kk < PK; kk++) {
                uint64_t db = wg_desc(vbase + kk * 2048, BN * 128, 1024);
                wg_mma<D>::rs(o, pa[kk], db);
            }
        }
        wg_commit();
        asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory"); /* S_j done, P V may run */
        pin(s);

        int2 tb = tile_bounds(t);
        bool full = (t + 1) * BN <= nk && tb.y <= qmin && (window <= 0 || (long long)qmax - tb.x < window);
        if (full) {
#pragma unroll
            for (int i = 0; i < SR; i++) s[i] *= sl2;
        } else {
            const int *kp = sKP + slot * BN;
#pragma unroll
            for (int i = 0; i < SR; i++) {
                int col = (i >> 2) * 8 + t4 * 2 + (i & 1);
                int key = kp[col];
                int qp = qp_r[(i >> 1) & 1];
                bool vis = t * BN + col < nk && key <= qp && (window <= 0 || (long long)qp - key < window);
                s[i] = vis ? s[i] * sl2 : -INFINITY;
            }
        }
        float corr[2];
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            float mx = -INFINITY;
#pragma unroll
            for (int i = 0; i < SR / 4; i++) mx = fmaxf(mx, fmaxf(s[4 * i + 2 * hf], s[4 * i + 2 * hf + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            float mn = fmaxf(m_r[hf], mx);
            float base = mn == -INFINITY ? 0.f : mn;
            corr[hf] = fast_exp2(m_r[hf] - base);
            m_r[hf] = mn;
            float ps = 0.f;
#pragma unroll
            for (int i = 0; i < SR / 4; i++) {
                s[4 * i + 2 * hf] = fast_exp2(s[4 * i + 2 * hf] - base);
                s[4 * i + 2 * hf + 1] = fast_exp2(s[4 * i + 2 * hf + 1] - base);
                ps += s[4 * i + 2 * hf] + s[4 * i + 2 * hf + 1];
            }
            l_r[hf] = l_r[hf] * corr[hf] + ps;
        }
        wg_wait0(); /* P_{j-1} V_{j-1} done: O and pa are free */
        pin(o);
        pin_u(pa); /* pa stays allocated (the async read) until here; the new P is built after */
        pin(s);
#pragma unroll
        for (int i = 0; i < OR; i++) o[i] *= corr[(i >> 1) & 1];
#pragma unroll
        for (int kk = 0; kk < PK; kk++) {
            pa[kk][0] = pack_bf16(s[8 * kk + 0], s[8 * kk + 1]);
            pa[kk][1] = pack_bf16(s[8 * kk + 2], s[8 * kk + 3]);
            pa[kk][2] = pack_bf16(s[8 * kk + 4], s[8 * kk + 5]);
            pa[kk][3] = pack_bf16(s[8 * kk + 6], s[8 * kk + 7]);
        }
        pslot = slot;
        t = next_tile(t + 1);
    }
    if (j > 0) { /* the last tile's P V (its slot was not refilled: refills go NST - 2 ahead) */
        const uint32_t vbase = smem_u32(sV + pslot * L::KV);
        pin(o);
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < PK; kk++) {
            uint64_t db = wg_desc(vbase + kk * 2048, BN * 128, 1024);
            wg_mma<D>::rs(o, pa[kk], db);
        }
        wg_commit();
        wg_wait0();
        pin(o);
    }
    cp_async_wait<0>();

#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        float l = l_r[hf];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        float inv = l > 0.f ? 1.0f / l : 0.f;
        int f = q0 + row0 + 8 * hf;
        if (f < nrows) {
            float *dst = p.out + ((size_t)row_q(f) * H + row_h(f)) * D + t4 * 2;
#pragma unroll
            for (int c = 0; c < OR / 4; c++)
                *reinterpret_cast<float2 *>(dst + c * 8) = make_float2(o[4 * c + 2 * hf] * inv, o[4 * c + 2 * hf + 1] * inv);
        }
    }
}

template <int D, int BN, int NWG, int NST> static ks_status wp_launch(cudaStream_t s, wg_args a) {
    static int attr_done = 0;
    const int smem = wp_smem<D, BN, NWG, NST>::TOTAL;
    if (!attr_done) {
        KS_CU(cudaFuncSetAttribute(wg_pipe_kernel<D, BN, NWG, NST>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
              "attention (wgmma, pipelined) shared memory");
        attr_done = 1;
    }
    const int BM = 64 * NWG;
    long long rows = (long long)a.p.n * (a.p.n_heads / a.p.n_kv_heads);
    if ((rows + BM - 1) / BM > 65535)
        return ks_errorf(KS_ERR_UNSUPPORTED, "attention (wgmma): %d query rows is too many", a.p.n);
    a.n_qblocks = (int)((rows + BM - 1) / BM);
    dim3 grid(a.p.n_kv_heads, a.n_qblocks);
    wg_pipe_kernel<D, BN, NWG, NST><<<grid, NWG * 128, smem, s>>>(a);
    KS_CU_LAUNCH("attention (wgmma pipelined prefill) kernel");
    return KS_OK;
}

