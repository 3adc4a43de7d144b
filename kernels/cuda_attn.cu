/* cuda_attn.cu — the CUDA backend's attention (cuda_backend_int.h): which kernel serves a call
 * (the path planner below: the tensor-core decode kernel over the cache itself for one decode
 * row, or over device lists and/or pre-RoPE rows that it reads in place and rotates itself,
 * with everything by value; else a prefill kernel for prefill-sized calls, chosen by
 * ks_cuda_attn_prefill_plan, else the tensor-core decode kernel where it takes the shape, else
 * the float32 split-KV kernel), the host lists it needs on the device (device lists,
 * ks_attn_args.idx_dev, are read in place), the gathered (and rotated) copy of the attended rows
 * for the kernels that read neither, and the launch; check_idx (index lists
 * checked on the device, kernels/check_idx.cu). ks_cuda_backend_set_attn_path (tests) pins one path. */
#include "cuda_backend_int.h"
#include "attn_prep.cuh"
#include "attn_decode_batch.cuh"
#include "argmax_rows.cuh"

#include <stdlib.h>
#include <string.h>

/* The launch parameters every path shares: a->n query rows over the cache of L itself, with
 * this backend's PDL and decode split choices (the caller adds lists, counts and max_nk). */
static void attn_params(cuda_ctx *c, ks_cuda_attn_params *p, float *out, const float *q, const ks_kv_layer *L,
                        const ks_attn_args *a) {
    memset(p, 0, sizeof *p);
    p->out = out;
    p->q = q;
    p->k = L->k;
    p->v = L->v;
    p->kpos = (const int32_t *)L->pos_dev;
    p->n = a->n;
    p->n_heads = a->n_heads;
    p->n_kv_heads = L->n_kv_heads;
    p->head_dim = L->head_dim;
    p->capacity = L->capacity;
    p->scale = a->scale;
    p->window = a->window;
    p->pdl = c->o.pdl;
    p->splits = c->o.decode_splits;
}

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
        attn_params(c, &p, out, q, L, a);
        for (int h = 0; h < Hkv; h++) p.max_nk = KS_MAX(p.max_nk, L->n[h]);
        if (ks_cuda_attn_decode_tc_supported(&p)) {
            if (p.max_nk == 0 && c->rec) return rec_fail(c, "attention over an empty cache");
            if (p.max_nk == 0) /* nothing to attend to: zeros, as the CPU reference gives */
                return ks_cuda_status(cudaMemsetAsync(out, 0, sizeof(float) * (size_t)H * d, c->stream), "attention");
            int splits;
            void *ws = NULL;
            size_t wsb = ks_cuda_attn_decode_tc_workspace(&p, c->n_sm, &splits);
            if (c->rec) { /* key counts and position from the step slot, the graphs' own workspace */
                if (wsb > GRAPH_WS) return rec_fail(c, "attention with a split workspace this large");
                /* a step that wrote its row inside the layer (a KV ring: the newest row is not the
                 * last) keeps the recorded counts: the slot's {pos, 0} instead of {pos, delta} */
                int ring = L->n[0] > 0 && L->pos[L->n[0] - 1] != a->qpos[0];
                return ks_cuda_attn_decode_tc1(c->stream, &p, L->n, a->qpos[0], c->d_step + (ring ? 3 : 1), splits, c->gws);
            }
            ks_status st = wsb ? dev_alloc(c, wsb, "attention workspace", &ws) : KS_OK;
            if (!st) st = ks_cuda_attn_decode_tc1(c->stream, &p, L->n, a->qpos[0], NULL, splits, ws);
            dev_free(c, ws);
            return st;
        }
    }
    if (n == 1 && (a->idx || a->rope) && (!a->idx || a->idx_dev) && L->n && c->o.decode_kernels &&
        (c->attn_path == KS_CUDA_ATTN_AUTO || c->attn_path == KS_CUDA_ATTN_TC) && Hkv <= KS_CUDA_ATTN_BYVAL_HEADS &&
        half <= KS_CUDA_ATTN_ROPE_HALF) {
        /* one decode row over device lists and/or pre-RoPE rows (TokenSelect): the tensor-core
         * kernel reads the listed rows in place and rotates them itself; counts, list offsets,
         * position and rope table by value (no upload), no allocation but the split workspace */
        ks_cuda_attn_params p;
        attn_params(c, &p, out, q, L, a);
        int nk[KS_CUDA_ATTN_BYVAL_HEADS], off[KS_CUDA_ATTN_BYVAL_HEADS];
        const int32_t *dbase = NULL; /* the allocation holding the lists: the lowest of them */
        for (int h = 0; a->idx && h < Hkv; h++)
            if (!dbase || a->idx[h] < dbase) dbase = a->idx[h];
        for (int h = 0; h < Hkv; h++) {
            nk[h] = a->idx ? a->n_idx[h] : L->n[h];
            if (nk[h] < 0 || nk[h] > L->n[h])
                return ks_errorf(KS_ERR_ARG, "attention: %d indices for KV head %d of %d rows", nk[h], h, L->n[h]);
            off[h] = dbase ? (int)(a->idx[h] - dbase) : 0;
            p.max_nk = KS_MAX(p.max_nk, nk[h]);
        }
        p.idx = dbase;
        p.renumber = p.q_renumber = a->idx && a->renumber;
        if (!p.splits) p.splits = ks_cuda_attn_decode_tc_list_splits(&p, c->n_sm, a->rope != NULL);
        if (ks_cuda_attn_decode_tc_supported(&p)) {
            if (c->rec) return rec_fail(c, "attention over an index list or pre-RoPE keys");
            if (p.max_nk == 0) /* nothing to attend to: zeros, as the CPU reference gives */
                return ks_cuda_status(cudaMemsetAsync(out, 0, sizeof(float) * (size_t)H * d, c->stream), "attention");
            ks_cuda_attn_rope rope;
            if (a->rope) {
                ks_rope_inv_freq(a->rope, a->rope_max_pos, rope.inv_freq);
                rope.attn_factor = (float)a->rope->attn_factor;
            }
            int splits;
            void *ws = NULL;
            size_t wsb = ks_cuda_attn_decode_tc_workspace(&p, c->n_sm, &splits);
            ks_status st = wsb ? dev_alloc(c, wsb, "attention workspace", &ws) : KS_OK;
            if (!st)
                st = ks_cuda_attn_decode_tc_list(c->stream, &p, nk, dbase ? off : NULL, a->qpos[0], a->rope ? &rope : NULL,
                                                 splits, ws);
            dev_free(c, ws);
            return st;
        }
    }
    /* host buffer: qpos (n), nk (Hkv), idx_off (Hkv), host lists, inv_freq (half floats); device
     * lists (a->idx_dev) are read where they are: only their offsets travel */
    size_t total = 0;
    int max_nk = 0;
    const int32_t *dbase = NULL; /* device lists: the allocation holding them */
    if (a->idx && a->idx_dev)
        for (int h = 0; h < Hkv; h++)
            if (!dbase || a->idx[h] < dbase) dbase = a->idx[h];
    for (int h = 0; h < Hkv; h++) {
        int nk = a->idx ? a->n_idx[h] : (L->n ? L->n[h] : 0);
        if (a->idx && a->idx_dev) {
            if (nk > L->n[h])
                return ks_errorf(KS_ERR_ARG, "attention: %d indices for KV head %d of %d rows", nk, h, L->n[h]);
        } else if (a->idx) {
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
        if (dbase) offh[h] = (int32_t)(a->idx[h] - dbase);
        else if (a->idx) {
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
    attn_params(c, &p, out, q, L, a);
    p.qpos = dq;
    p.nk = dq + n;
    p.idx = dbase ? dbase : a->idx ? dq + n + 2 * Hkv : NULL;
    p.idx_off = dq + n + Hkv;
    p.max_nk = max_nk;
    p.renumber = rn;
    p.q_renumber = rn;
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
            if (!p.splits && n == 1 && (a->idx || a->rope)) /* one row over a list: as above */
                p.splits = ks_cuda_attn_decode_tc_list_splits(&p, c->n_sm, a->rope != NULL);
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

extern "C" ks_status ks_cuda_check_idx(cudaStream_t s, int32_t *x, int rows, int k, const int *lim, uint64_t *slot);

/* backend.h check_idx: kernels/check_idx.cu on the stream (nothing waits) */
static ks_status cu_check_idx(ks_backend *b, int32_t *lists, int rows, int k, const int *lim, uint64_t *slot) {
    cuda_ctx *c = CTX(b);
    if (c->rec) return rec_fail(c, "an index list check");
    return ks_cuda_check_idx(c->stream, lists, rows, k, lim, slot);
}

void cuda_attn_install(ks_backend *b) {
    b->attention = cu_attention;
    b->check_idx = cu_check_idx;
    b->attn_decode_batch = ks_cuda_attn_decode_batch_hook; /* kernels/attn_decode_batch.cu */
    b->argmax_rows = ks_cuda_argmax_rows_hook;             /* kernels/argmax_rows.cu (argmax_rows.cuh) */
}

extern "C" void ks_cuda_backend_set_attn_path(ks_backend *b, ks_cuda_attn_path path) { CTX(b)->attn_path = path; }
extern "C" long ks_cuda_backend_prefill_calls(ks_backend *b, ks_cuda_prefill_kernel k) {
    return k >= 0 && k < 3 ? CTX(b)->prefill_calls[k] : 0;
}

