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
#include "rope_table.cuh"
#include "ks_cuda_page.h"

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

/* ---------------------------------------------------------------- rope table */

/* r->tab for a renumbered list's rotation (rope_table.cuh): the backend's table, (re)built on the
 * stream for r's inv_freq / attn_factor when it holds another rope, except while recording (a
 * recorded launch takes the table only if it already holds this rope; the kernel checks the
 * header when it runs, so a table rebuilt later makes it compute, never rotate wrongly). A
 * failure to allocate leaves r->tab NULL: the kernel computes, as without a table. */
static void rope_table_for(cuda_ctx *c, ks_cuda_attn_rope *r, int d, int renumber) {
    r->tab = NULL;
    if (!renumber || (d != 64 && d != 128)) return;
    float key[KS_CUDA_ATTN_ROPE_HALF + 1];
    memset(key, 0, sizeof key);
    memcpy(key, r->inv_freq, sizeof(float) * (size_t)(d / 2));
    key[KS_CUDA_ATTN_ROPE_HALF] = r->attn_factor;
    if (c->rtab && c->rtab_d == d && !memcmp(key, c->rtab_key, sizeof key)) {
        r->tab = c->rtab;
        return;
    }
    if (c->rec) return;
    /* sized for head_dim 128, the largest the kernel takes; rebuilt in place (stream order) */
    if (!c->rtab && raw_alloc(c, ks_cuda_rope_table_bytes(KS_CUDA_ROPE_TAB_ROWS, 128), "rope table", &c->rtab)) {
        ks_clear_error();
        c->rtab = NULL;
        return;
    }
    if (ks_cuda_rope_table(c->stream, c->rtab, KS_CUDA_ROPE_TAB_ROWS, d, r->inv_freq, r->attn_factor)) {
        ks_clear_error();
        c->rtab_d = 0;
        return;
    }
    c->rtab_d = d;
    memcpy(c->rtab_key, key, sizeof key);
    r->tab = c->rtab;
}

/* The rotation mode a one-row list call runs in (ks_cuda_attn_decode_tc_list_splits' rope
 * argument): 2 for renumbered pre-RoPE lists at a head_dim the table takes, whether or not the
 * table could be built (without it the kernel computes at the same split count, so the bits stay
 * the same), 1 for other pre-RoPE calls, 0 without rope. The gather path picks its splits by it
 * too, so host and device lists give the same bits. */
static int list_rope_mode(const ks_attn_args *a, int renumber, int d) {
    if (!a->rope) return 0;
    return renumber && (d == 64 || d == 128) ? 2 : 1;
}

/* ---------------------------------------------------------------- staged lists (attn_stage) */

/* backend.h attn_stage: slot `slot`'s descriptor set to the lists of `a` (one allocation: each
 * head's list at idx[h] - the lowest) where they are: their counts, offsets from the lowest, the
 * row ranges and that base address, written by one launch (ks_cuda_list_stage: the words travel
 * as its arguments) only when they changed. The lists are not copied: the engine frees the
 * action that holds them in stream order after launching the segment that reads them. A policy
 * whose lists come from the same pool allocations step after step (TokenSelect, Quest) leaves
 * the descriptor as it was, and a step queues nothing here. */
static_assert(KS_CUDA_LSLOT_WORDS <= KS_CUDA_STAGE_MAX_WORDS, "a slot's descriptor fits one staging launch");
static_assert(KS_CUDA_LSLOT_PTR % 2 == 0, "the base address is 8-byte aligned in the descriptor");
ks_status cuda_attn_stage(ks_backend *b, int slot, const ks_kv_layer *L, const ks_attn_args *a) {
    cuda_ctx *c = CTX(b);
    const int Hkv = L->n_kv_heads;
    if (c->rec) return ks_errorf(KS_ERR_INTERNAL, "cuda: attn_stage while recording");
    if (slot < 0 || a->n != 1 || !a->idx || !a->idx_dev || Hkv > KS_CUDA_LSLOT_HEADS || !L->n)
        return ks_errorf(KS_ERR_UNSUPPORTED, "cuda: these attend lists cannot be staged (slot %d, %d rows, %d KV heads%s)",
                         slot, a->n, Hkv, a->idx && a->idx_dev ? "" : ", not device lists");
    const int32_t *dbase = NULL;
    for (int h = 0; h < Hkv; h++)
        if (!dbase || a->idx[h] < dbase) dbase = a->idx[h];
    int max_nk = 0;
    const int around = a->seg ? (a->seg_b1 - a->seg_b0) + (a->seg_a1 - a->seg_a0) : 0; /* rows of the ranges */
    const int page = a->seg ? a->seg_page : 0;
    if (page < 0 || (page && a->seg_a1 - a->seg_a0 > page))
        return ks_errorf(KS_ERR_ARG, "attention: a trailing range of %d rows as a page of %d", a->seg_a1 - a->seg_a0, page);
    for (int h = 0; h < Hkv; h++) {
        if (a->n_idx[h] < 0 || a->n_idx[h] + around > L->n[h])
            return ks_errorf(KS_ERR_ARG, "attention: %d indices for KV head %d of %d rows", a->n_idx[h] + around, h, L->n[h]);
        if (a->idx[h] - dbase > INT32_MAX - a->n_idx[h])
            return ks_errorf(KS_ERR_UNSUPPORTED, "cuda: attend lists spread over more than 2^31 entries");
        /* a page tail: the split count is the longest page's (the by-value call's choice too) */
        max_nk = KS_MAX(max_nk, a->n_idx[h] + around + (page ? page - (a->seg_a1 - a->seg_a0) : 0));
    }
    if (slot >= c->n_lslot) {
        cu_lslot *ns = (cu_lslot *)realloc(c->lslot, sizeof *ns * (size_t)(slot + 1));
        if (!ns) return ks_errorf(KS_ERR_OOM, "cuda: out of memory for list slot %d", slot);
        memset(ns + c->n_lslot, 0, sizeof *ns * (size_t)(slot + 1 - c->n_lslot));
        c->lslot = ns;
        c->n_lslot = slot + 1;
    }
    cu_lslot *ls = &c->lslot[slot];
    ks_status st;
    if (!ls->hdesc && !(ls->hdesc = (int32_t *)calloc(KS_CUDA_LSLOT_WORDS, sizeof(int32_t))))
        return ks_errorf(KS_ERR_OOM, "cuda: out of memory for a list slot's descriptor");
    if (!ls->desc &&
        (st = raw_alloc(c, sizeof(int32_t) * KS_CUDA_LSLOT_WORDS, "staged list descriptor", (void **)&ls->desc)))
        return st;
    /* the words this staging wants; the trailing range is kept relative to the query position,
     * so TokenSelect's stay the same from step to step (a page tail: its end, the kernel takes
     * the page of the row before it) */
    int32_t w[KS_CUDA_LSLOT_WORDS];
    memset(w, 0, sizeof w);
    const int nb = a->seg ? a->seg_b1 - a->seg_b0 : 0, na = a->seg ? a->seg_a1 - a->seg_a0 : 0;
    for (int h = 0; h < Hkv; h++) {
        w[h] = nb + a->n_idx[h] + na;
        w[KS_CUDA_LSLOT_HEADS + h] = (int32_t)(a->idx[h] - dbase);
    }
    if (a->seg) {
        w[2 * KS_CUDA_LSLOT_HEADS] = a->seg_b0;
        w[2 * KS_CUDA_LSLOT_HEADS + 1] = nb;
        w[2 * KS_CUDA_LSLOT_HEADS + 2] = (page ? a->seg_a1 : a->seg_a0) - (a->qpos[0] + 1);
        w[2 * KS_CUDA_LSLOT_HEADS + 3] = na;
        w[2 * KS_CUDA_LSLOT_HEADS + 4] = page;
    }
    memcpy(w + KS_CUDA_LSLOT_PTR, &dbase, sizeof dbase);
    const int same = ls->hkv == Hkv && !memcmp(ls->hdesc, w, sizeof w);
    if (!same) {
        memcpy(ls->hdesc, w, sizeof w);
        if ((st = ks_cuda_list_stage(c->stream, ls->desc, ls->hdesc, KS_CUDA_LSLOT_WORDS))) {
            ls->hkv = 0; /* the device copy is unknown: write it next time */
            return st;
        }
    }
    ls->hkv = Hkv;
    ls->max_nk = max_nk;
    ls->renumber = a->renumber != 0;
    ls->seg = a->seg != 0;
    return KS_OK;
}

/* A recorded attention over the lists of slot a->staged - 1: counts, offsets and the query
 * position read from device memory when it runs (ks_cuda_attn_decode_tc_rec), the split count
 * fixed from the recording's lists. */
static ks_status attn_staged(cuda_ctx *c, float *out, const float *q, const ks_kv_layer *L, const ks_attn_args *a) {
    const int slot = a->staged - 1;
    if (!c->rec) return ks_errorf(KS_ERR_INTERNAL, "attention: staged lists outside a recording");
    if (slot < 0 || slot >= c->n_lslot || !c->lslot[slot].desc || c->lslot[slot].hkv != L->n_kv_heads || a->n != 1)
        return rec_fail(c, "attention over a list slot that holds no lists for this layer");
    const cu_lslot *ls = &c->lslot[slot];
    ks_cuda_attn_params p;
    attn_params(c, &p, out, q, L, a);
    p.idx_at = (const int32_t *const *)(ls->desc + KS_CUDA_LSLOT_PTR);
    p.nk = ls->desc;
    p.idx_off = ls->desc + KS_CUDA_LSLOT_HEADS;
    /* row ranges: the decode loop records and replays a layer only while its handler asks for
     * the same kind of attend (core/decode.c dec_acted: ranges or not) */
    p.seg_dev = ls->seg ? ls->desc + 2 * KS_CUDA_LSLOT_HEADS : NULL;
    p.qpos = c->d_step + 1;
    p.max_nk = ls->max_nk;
    p.renumber = p.q_renumber = ls->renumber;
    if (p.max_nk == 0) return rec_fail(c, "attention over empty staged lists");
    ks_cuda_attn_rope rope;
    memset(&rope, 0, sizeof rope);
    if (a->rope) {
        ks_rope_inv_freq(a->rope, a->rope_max_pos, rope.inv_freq);
        rope.attn_factor = (float)a->rope->attn_factor;
        rope_table_for(c, &rope, L->head_dim, p.renumber);
    }
    if (!p.splits) p.splits = ks_cuda_attn_decode_tc_list_splits(&p, c->n_sm, list_rope_mode(a, p.renumber, L->head_dim));
    if (!ks_cuda_attn_decode_tc_supported(&p)) return rec_fail(c, "attention over staged lists of this shape");
    int splits;
    size_t wsb = ks_cuda_attn_decode_tc_workspace(&p, c->n_sm, &splits);
    if (wsb > GRAPH_WS) return rec_fail(c, "attention with a split workspace this large");
    return ks_cuda_attn_decode_tc_rec(c->stream, &p, NULL, NULL, a->rope ? &rope : NULL, splits, c->gws);
}

static ks_status cu_attention(ks_backend *b, float *out, const float *q, const ks_kv_layer *L, const ks_attn_args *a);

/* a->seg's row ranges written out around its lists (one list shared by every head, or one per
 * head laid out one after the other, as ks_action_attend_dev_ranges keeps them) with page_rows,
 * then the attention over those whole lists: the paths that do not read ranges themselves
 * (prefill-sized calls, shapes the one-row tensor-core kernel does not take) */
static ks_status attn_unranged(ks_backend *b, float *out, const float *q, const ks_kv_layer *L, const ks_attn_args *a) {
    cuda_ctx *c = CTX(b);
    const int Hkv = L->n_kv_heads, k = a->n_idx[0];
    const int shared = a->idx[Hkv - 1] == a->idx[0];
    int rows = INT32_MAX;
    for (int h = 0; h < Hkv; h++) {
        if (a->n_idx[h] != k || a->idx[h] != a->idx[0] + (shared ? 0 : (size_t)h * k))
            return ks_errorf(KS_ERR_INTERNAL, "attention: row ranges around lists that are neither shared nor one per head "
                             "in one block");
        rows = KS_MIN(rows, L->n[h] + (a->n > 1 ? a->n : 0));
    }
    const int lists = shared ? 1 : Hkv;
    const int64_t w = (int64_t)(a->seg_b1 - a->seg_b0) + k + (a->seg_a1 - a->seg_a0);
    void *buf = NULL;
    const int32_t **ix = (const int32_t **)calloc((size_t)Hkv, sizeof *ix);
    int *cnt = (int *)calloc((size_t)Hkv, sizeof *cnt);
    ks_status st = ix && cnt ? dev_alloc(c, sizeof(int32_t) * (size_t)(lists * w), "attention list", &buf) : KS_ERR_OOM;
    if (!st)
        st = ks_cuda_page_rows(c->stream, a->idx[0], lists, k, 1, rows, a->seg_b0, a->seg_b1, a->seg_a0, a->seg_a1,
                               (int32_t *)buf, NULL);
    if (!st) {
        for (int h = 0; h < Hkv; h++) { ix[h] = (const int32_t *)buf + (shared ? 0 : (size_t)h * w); cnt[h] = (int)w; }
        ks_attn_args a2 = *a;
        a2.seg = 0;
        a2.idx = ix;
        a2.n_idx = cnt;
        a2.idx_dev = 1;
        st = cu_attention(b, out, q, L, &a2);
    }
    dev_free(c, buf);
    free(ix);
    free(cnt);
    return st;
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
    if (a->staged) return attn_staged(c, out, q, L, a);
    if (a->seg && (!a->idx || !a->idx_dev || !L->n))
        return ks_errorf(KS_ERR_ARG, "attention: row ranges without a device list");
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
            size_t wsb = ks_cuda_attn_decode_tc_workspace(&p, c->n_sm * c->attn_bps, &splits);
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
    const int by_value_list = n == 1 && (a->idx || a->rope) && (!a->idx || a->idx_dev) && L->n && c->o.decode_kernels &&
                              (c->attn_path == KS_CUDA_ATTN_AUTO || c->attn_path == KS_CUDA_ATTN_TC) &&
                              Hkv <= KS_CUDA_ATTN_BYVAL_HEADS && half <= KS_CUDA_ATTN_ROPE_HALF;
    if (a->seg && !by_value_list) return attn_unranged(b, out, q, L, a);
    if (by_value_list) {
        /* one decode row over device lists and/or pre-RoPE rows (TokenSelect): the tensor-core
         * kernel reads the listed rows in place and rotates them itself; counts, list offsets,
         * position and rope table by value (no upload), no allocation but the split workspace */
        ks_cuda_attn_params p;
        attn_params(c, &p, out, q, L, a);
        int nk[KS_CUDA_ATTN_BYVAL_HEADS], off[KS_CUDA_ATTN_BYVAL_HEADS];
        const int32_t *dbase = NULL; /* the allocation holding the lists: the lowest of them */
        for (int h = 0; a->idx && h < Hkv; h++)
            if (!dbase || a->idx[h] < dbase) dbase = a->idx[h];
        int grow_to = 0; /* a page tail: the split count is chosen for its longest (ks_attn_args.seg_page) */
        if (a->seg) { /* rows [b0, b1) ++ list ++ [a0, a1), read in place */
            p.seg_b0 = a->seg_b0;
            p.seg_nb = a->seg_b1 - a->seg_b0;
            p.seg_a0 = a->seg_a0;
            p.seg_na = a->seg_a1 - a->seg_a0;
            if (a->seg_page < 0 || (a->seg_page && p.seg_na > a->seg_page))
                return ks_errorf(KS_ERR_ARG, "attention: a trailing range of %d rows as a page of %d", p.seg_na, a->seg_page);
            if (a->seg_page) grow_to = a->seg_page - p.seg_na;
        }
        for (int h = 0; h < Hkv; h++) {
            nk[h] = a->idx ? p.seg_nb + a->n_idx[h] + p.seg_na : L->n[h];
            if (nk[h] < 0 || nk[h] > L->n[h])
                return ks_errorf(KS_ERR_ARG, "attention: %d indices for KV head %d of %d rows", nk[h], h, L->n[h]);
            off[h] = dbase ? (int)(a->idx[h] - dbase) : 0;
            p.max_nk = KS_MAX(p.max_nk, nk[h] + grow_to);
        }
        p.idx = dbase;
        p.renumber = p.q_renumber = a->idx && a->renumber;
        if (a->seg && !ks_cuda_attn_decode_tc_supported(&p)) return attn_unranged(b, out, q, L, a);
        if (ks_cuda_attn_decode_tc_supported(&p)) {
            if (c->rec && (a->idx || p.max_nk == 0))
                return rec_fail(c, "attention over an index list that was not staged, or over an empty cache");
            if (p.max_nk == 0) /* nothing to attend to: zeros, as the CPU reference gives */
                return ks_cuda_status(cudaMemsetAsync(out, 0, sizeof(float) * (size_t)H * d, c->stream), "attention");
            ks_cuda_attn_rope rope;
            memset(&rope, 0, sizeof rope);
            if (a->rope) {
                ks_rope_inv_freq(a->rope, a->rope_max_pos, rope.inv_freq);
                rope.attn_factor = (float)a->rope->attn_factor;
                rope_table_for(c, &rope, d, p.renumber);
            }
            if (!p.splits) p.splits = ks_cuda_attn_decode_tc_list_splits(&p, c->n_sm, list_rope_mode(a, p.renumber, d));
            if (c->rec) { /* pre-RoPE rows of the cache itself: counts and position from the step slot */
                int splits;
                size_t wsb = ks_cuda_attn_decode_tc_workspace(&p, c->n_sm, &splits);
                if (wsb > GRAPH_WS) return rec_fail(c, "attention with a split workspace this large");
                return ks_cuda_attn_decode_tc_rec(c->stream, &p, L->n, c->d_step + 1, &rope, splits, c->gws);
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
                p.splits = ks_cuda_attn_decode_tc_list_splits(&p, c->n_sm, list_rope_mode(a, rn, d));
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

