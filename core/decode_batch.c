/* decode_batch.c — one decode step for n sessions of one model, the weights read once for all:
 * the n tokens go through each layer's dense ops (attn_in, attn_out, mlp) as n rows of one
 * call, and through its attention one session at a time over that session's own KV rows (and
 * its policy's attend lists). engine.h has the contract of ks_sessions_decode.
 *
 * One step, as data (row r of the step's activations is session sess[r] at position pos[r]):
 *   embed         x (n, dim) = E[ids]                                     one call
 *   per layer l:
 *     attn_in     q (n, QD), k, v (n, KD) for all rows                    one call per group (below)
 *     kv_append   row r's k, v into sess[r]->kv[l]                        per session
 *     decode_qkv  sess[r]'s policy event, on views of row r only          per session
 *     attention   row r's q over sess[r]->kv[l] -> xn row r (n, QD)       per session
 *     retain      what the event asked, on sess[r]->kv[l]                 per session
 *       (rows without a decode event and with rotated keys: append + attention of all of them
 *        in one backend call, ks_backend.attn_decode_batch, where the backend has it; CUDA:
 *        kernels/attn_decode_batch.cu, one launch per layer instead of 2 per session; when
 *        every row of the step goes through it, it also writes the rows as bf16, which
 *        attn_out then reads (ks_acts.xn_bf16: no conversion before the o-projection))
 *     attn_out,   x (n, dim) += ...                                       one call each
 *     mlp
 *   head          the logits of all rows (n, vocab)                       one call
 *   download      row r's logits into sess[r]->logits                     per session
 *     (ks_sessions_decode_greedy, decode_batch.h: the greedy rows' argmax where the logits are,
 *      ks_backend.argmax_rows over the (n, vocab) logits in one call, n ids downloaded with one
 *      wait; CUDA: kernels/argmax_rows.cu. Those rows' logits are not downloaded)
 * A group is a run of rows whose attn_in arguments agree: the same rotation (a policy that
 * wants pre-RoPE keys leaves its rows unrotated) and the same longrope factor choice (its
 * inv_freq table follows the largest position of the call). Rows are ordered by group, so a
 * batch of ordinary sessions is one group and one call.
 *
 * Results. On the CPU backend every row is bit-identical to the same session's own
 * ks_session_decode (cpu_gemm.h: an element of a product depends only on its two input rows,
 * never on the row's place in the batch or on n; the norms, RoPE and SwiGLU are per row and
 * element; attention and events run per session exactly as in decode.c), so the
 * ids of a batched run equal those of separate runs, bit for bit, and tests/test_batch_decode.c
 * proves it. On CUDA the dense ops with n > 1 rows take the GEMM path (cuBLAS / the fused
 * projections) where one row takes the gemv kernels, and the two round to bf16 differently: a
 * batched session's logits may differ from its single-row run in the last bits, and greedy ids
 * may then part where two logits (nearly) tie.
 *
 * A session whose policy (or its own append, attention, retain or check) fails drops out of
 * the step at that point: its status and message go to st[i] / msg[i], its row rides along in
 * the dense ops without being read again, and the session is left as a failed
 * ks_session_decode leaves it (the token pushed, the layers before and at the failure with the
 * new row, n_past unchanged). The others go on. A failure of a shared op (embed, attn_in,
 * attn_out, mlp, the step's buffers) fails every session still in the step. */
#include "decode_batch.h"
#include "forward.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The step's sessions and what they need, in row order. */
typedef struct brow {
    ks_session *s;
    int i;          /* index in the caller's arrays */
    int32_t id, pos;
    int pre;        /* pre-RoPE keys (the policy's want_pre_rope_keys) */
    int key;        /* group key: pre * 2 + longrope's long-factor choice */
    float *q;       /* (QD) this row's queries in the step's buffers */
    int dead;       /* failed: no more per-session work */
    int greedy;     /* its next id wanted (next[i]) instead of its logits */
} brow;

/* Record session row's failure st (message: the last error, copied now). */
static void row_fail(brow *r, ks_status st, ks_status *sts, char **msg) {
    r->dead = 1;
    sts[r->i] = st ? st : KS_ERR_INTERNAL;
    if (msg) {
        const char *e = ks_last_error();
        free(msg[r->i]);
        msg[r->i] = ks_strdup(e && *e ? e : ks_status_name(sts[r->i]));
    }
}

/* One session's part of layer l after the dense attn_in: its new KV row, its decode event on
 * its own row, attention over its own rows into its row of xn, its retain. */
static ks_status row_layer(brow *r, int l, const ks_fwd_buf *B, int row, float *xn_row) {
    ks_session *s = r->s;
    ks_backend *be = s->be;
    const ks_config *c = &s->m->cfg;
    size_t KD = (size_t)c->n_kv_heads * c->head_dim;
    ks_fwd_buf v = {0}; /* row `row` of B, as a one-row forward's buffers */
    v.a.x = B->a.x + (size_t)row * c->dim;
    v.a.xn = xn_row;
    v.a.q = r->q;
    v.a.k = B->a.k + (size_t)row * KD;
    v.a.v = B->a.v + (size_t)row * KD;
    v.kpre = r->pre ? v.a.k : NULL;
    ks_status st = be->kv_append(be, &s->kv[l], v.a.k, v.a.v, &r->pos, 1);
    if (st) return st;
    const ks_policy *pol = s->policy;
    ks_actions act = {0};
    if (pol && pol->on[KS_EV_DECODE_QKV]) {
        ks_event ev;
        ks_event_init(s, &ev, KS_EV_DECODE_QKV, l, 0, 1);
        ev.q = v.a.q; ev.k = v.a.k; ev.v = v.a.v; ev.k_pre = v.kpre;
        ev.pos = &r->pos; ev.ids = &r->id; ev.kv = &s->kv[l];
        st = ks_event_fire(s, &ev);
        act = ks_actions_take(&ev);
        if (st) { ks_actions_free(&act, c->n_kv_heads); return st; }
    }
    ks_attn_args aa = ks_layer_attn_args(s, &v, 1, &r->pos, r->pos, &act);
    st = ks_layer_attention(s, l, &v, &aa);
    if (!st && act.retain) st = ks_actions_apply_retain(s, l, &act);
    ks_actions_free(&act, c->n_kv_heads);
    return st;
}

ks_status ks_attn_decode_batch_loop(ks_backend *b, int n, ks_kv_layer *const *L, const float *const *q,
                                    const float *const *k, const float *const *v, const int32_t *pos, int n_heads,
                                    float scale, int window, float *const *out) {
    for (int i = 0; i < n; i++) {
        ks_status st = b->kv_append(b, L[i], k[i], v[i], &pos[i], 1);
        ks_attn_args a = {.n = 1, .n_heads = n_heads, .qpos = &pos[i], .scale = scale, .window = window};
        if (!st) st = b->attention(b, out[i], q[i], L[i], &a);
        if (st) return st;
    }
    return KS_OK;
}

void ks_argmax_rows_ref(const float *x, int rows, int cols, int32_t *out) {
    for (int r = 0; r < rows; r++) {
        const float *l = x + (size_t)r * cols;
        float bv = -INFINITY;
        int32_t bi = INT32_MAX; /* no candidate yet: any non-NaN value wins (-inf too, by index) */
        for (int i = 0; i < cols; i++)
            if (l[i] > bv || (l[i] == bv && i < bi)) { bv = l[i]; bi = i; }
        out[r] = cols < 1 || l[0] != l[0] || bi == INT32_MAX ? 0 : bi;
    }
}

/* ks_sample's greedy id of each host row: its vectorised scan, the same ids as the reference
 * (tests/test_batch_decode.c) at ~6x its speed (128256 logits: 32 against 202 us on the
 * development machine) */
static void greedy_rows(const float *x, int rows, int cols, int32_t *out) {
    ks_sampler g;
    ks_sampler_init(&g, 0, 1, 0);
    for (int r = 0; r < rows; r++) out[r] = ks_sample(&g, x + (size_t)r * cols, cols);
}

/* out (rows) = the argmax of each row of the backend's logits x (rows, cols): the backend's own
 * argmax_rows, else ks_sample's greedy in place (host memory) or after one download of all rows. */
static ks_status argmax_rows(ks_backend *be, const float *x, int rows, int cols, int32_t *out) {
    if (be->argmax_rows) return be->argmax_rows(be, x, rows, cols, out);
    if (be->host_memory) {
        greedy_rows(x, rows, cols, out);
        return KS_OK;
    }
    float *h = ks_malloc(sizeof(float) * (size_t)rows * cols);
    if (!h) return ks_errorf(KS_ERR_OOM, "decode: out of memory for %d rows of logits", rows);
    ks_status st = be->download(be, h, x, sizeof(float) * (size_t)rows * cols);
    if (!st) greedy_rows(h, rows, cols, out);
    free(h);
    return st;
}

/* A row whose append and attention the backend's batched decode attention may do: no decode
 * event (so no attend lists, no retain) and rotated keys. */
static int batchable(const brow *r) {
    const ks_policy *pol = r->s->policy;
    return !r->pre && !(pol && pol->on[KS_EV_DECODE_QKV]);
}

/* The arguments of one attn_decode_batch call, host arrays of up to n rows. */
typedef struct batch_args {
    int on;                 /* the backend has attn_decode_batch */
    int *row;               /* (n) step row of each entry */
    ks_kv_layer **L;        /* (n) */
    const float **q, **k, **v;
    float **out;
    int32_t *pos;           /* (n) */
} batch_args;

static int batch_args_alloc(batch_args *a, int n) {
    a->row = ks_malloc(sizeof(int) * (size_t)n);
    a->L = ks_malloc(sizeof(ks_kv_layer *) * (size_t)n);
    a->q = ks_malloc(sizeof(float *) * 3 * (size_t)n);
    a->out = ks_malloc(sizeof(float *) * (size_t)n);
    a->pos = ks_malloc(sizeof(int32_t) * (size_t)n);
    if (a->q) { a->k = a->q + n; a->v = a->q + 2 * n; }
    return !a->row || !a->L || !a->q || !a->out || !a->pos;
}

static void batch_args_free(batch_args *a) {
    free(a->row);
    free(a->L);
    free(a->q);
    free(a->out);
    free(a->pos);
}

/* The dense part of the step and the per-session work between, for rows R[0..n) (n >= 2, all
 * alive, ordered by group key). Shared failures are returned; per-session ones are recorded. */
static ks_status step_rows(brow *R, int n, int32_t *next, ks_status *sts, char **msg) {
    ks_session *s0 = R[0].s;
    ks_backend *be = s0->be;
    const ks_config *c = &s0->m->cfg;
    size_t D = c->dim, QD = (size_t)c->n_heads * c->head_dim, KD = (size_t)c->n_kv_heads * c->head_dim;
    size_t W = KS_MAX(D, QD);
    ks_fwd_buf B;
    ks_status st = ks_fwd_alloc(be, c, n, 0, &B); /* (n) rows; pre-RoPE mode is set per group view */
    if (st) return st;
    int32_t *ids = ks_malloc(sizeof(int32_t) * 3 * (size_t)n), *pos = ids ? ids + n : NULL, *am = ids ? ids + 2 * n : NULL;
    float *lg = be->alloc(be, sizeof(float) * (size_t)n * c->vocab); /* (n, vocab) */
    batch_args bt = {.on = be->attn_decode_batch != NULL};
    /* the attention's rows again as bf16, when every row goes through the batched attention: the
     * o-projection's GEMM input without a conversion (ks_acts.xn_bf16) */
    void *xn16 = bt.on ? be->alloc(be, 2 * (size_t)n * QD) : NULL;
    if (!ids || !lg || (bt.on && batch_args_alloc(&bt, n))) {
        st = ks_errorf(KS_ERR_OOM, "decode: out of memory for a batch of %d rows", n);
        goto out;
    }
    for (int r = 0; r < n; r++) { ids[r] = R[r].id; pos[r] = R[r].pos; }
    /* each group's q rows start at its first row's slot of W floats (a one-group step: row r at
     * r * QD, as attn_in writes them) */
    for (int g0 = 0, g1; g0 < n; g0 = g1) {
        for (g1 = g0 + 1; g1 < n && R[g1].key == R[g0].key; g1++) {}
        for (int r = g0; r < g1; r++) R[r].q = B.a.q + (size_t)g0 * W + (size_t)(r - g0) * QD;
    }
    if ((st = be->embed(be, B.a.x, s0->m->embed, ids, n, c->dim))) goto out;
    for (int l = 0; l < c->n_layers; l++) {
        for (int g0 = 0, g1; g0 < n; g0 = g1) { /* attn_in per group of equal arguments */
            int mp = pos[g0];
            for (g1 = g0 + 1; g1 < n && R[g1].key == R[g0].key; g1++) mp = KS_MAX(mp, pos[g1]);
            ks_fwd_buf v = {0};
            v.a.x = B.a.x + (size_t)g0 * D;
            v.a.xn = B.a.xn + (size_t)g0 * W;
            v.a.q = B.a.q + (size_t)g0 * W;
            v.a.k = B.a.k + (size_t)g0 * KD;
            v.a.v = B.a.v + (size_t)g0 * KD;
            v.kpre = R[g0].pre ? v.a.k : NULL;
            if ((st = ks_layer_qkv(R[g0].s, l, &v, g1 - g0, pos + g0, mp, NULL))) goto out;
        }
        /* per session; the attention output row r goes to xn at r * QD, where attn_out reads it
         * (xn's normalised rows are dead once every attn_in ran). Rows without a decode-time
         * policy go through the backend's batched decode attention where it has one (append and
         * attention of all of them in one call); the rest one by one. */
        int nb = 0;
        for (int r = 0; r < n; r++) {
            if (R[r].dead) continue;
            if (bt.on && batchable(&R[r])) {
                ks_session *s = R[r].s;
                bt.row[nb] = r;
                bt.L[nb] = &s->kv[l];
                bt.q[nb] = R[r].q;
                bt.k[nb] = B.a.k + (size_t)r * KD;
                bt.v[nb] = B.a.v + (size_t)r * KD;
                bt.out[nb] = B.a.xn + (size_t)r * QD;
                bt.pos[nb++] = R[r].pos;
                continue;
            }
            ks_status sr = row_layer(&R[r], l, &B, r, B.a.xn + (size_t)r * QD);
            if (sr) row_fail(&R[r], sr, sts, msg);
        }
        void *ob = NULL; /* every row's attention output, contiguous from xn: its bf16 copy too */
        if (nb) {
            ks_attn_args aa = ks_layer_attn_args(s0, &B, 1, &bt.pos[0], bt.pos[0], NULL); /* scale, window */
            ob = nb == n ? xn16 : NULL;
            ks_status sr = be->attn_decode_batch(be, nb, bt.L, bt.q, bt.k, bt.v, bt.pos, c->n_heads, aa.scale, aa.window,
                                                 bt.out, ob);
            for (int i = 0; sr && i < nb; i++) row_fail(&R[bt.row[i]], sr, sts, msg);
            if (sr) ob = NULL;
        }
        B.a.xn_bf16 = ob; /* for this layer's attn_out only */
        st = ks_layer_tail(s0, l, &B, n);
        B.a.xn_bf16 = NULL;
        if (st) goto out;
    }
    /* the head over all n rows at once (the lm_head read once; a dead row's logits are computed
     * and never read, as its row was carried through the layers) */
    if ((st = ks_head_compute(s0, &B, 0, n, lg))) goto out;
    int ng = 0; /* greedy rows: all n rows' ids in one call (a dead row's id is never read) */
    for (int r = 0; r < n; r++) ng += !R[r].dead && R[r].greedy;
    if (ng && (st = argmax_rows(be, lg, n, c->vocab, am))) goto out;
    for (int r = 0; r < n; r++) {
        ks_session *s = R[r].s;
        if (R[r].dead) continue;
        ks_status sr = KS_OK;
        s->logits_stale = 0; /* a greedy row's logits are not downloaded (as documented), never an older step's */
        if (R[r].greedy) next[R[r].i] = am[r];
        else sr = be->download(be, s->logits, lg + (size_t)r * c->vocab, sizeof(float) * c->vocab);
        if (!sr) sr = ks_devcheck_sync(s); /* its device list checks, now that the step ran */
        if (sr) {
            row_fail(&R[r], sr, sts, msg);
            if (next) next[R[r].i] = -1;
        } else s->n_past++;
    }
out:
    if (xn16) be->free(be, xn16);
    if (lg) be->free(be, lg);
    free(ids);
    batch_args_free(&bt);
    ks_fwd_free(be, &B);
    return st;
}

static int cmp_key(const void *a, const void *b) {
    const brow *x = a, *y = b;
    return x->key != y->key ? (x->key > y->key) - (x->key < y->key) : (x->i > y->i) - (x->i < y->i);
}

/* A session stepped alone (ks_session_decode filled its logits): its next id, as the batched rows'. */
static void alone_next(const brow *r, int32_t *next) {
    if (next) {
        if (r->dead || !r->greedy) next[r->i] = -1;
        else greedy_rows(r->s->logits, 1, r->s->m->cfg.vocab, &next[r->i]);
    }
}

static ks_status decode_n(const char *fn, ks_session *const *s, const int32_t *ids, int n, const unsigned char *greedy,
                          int32_t *next, ks_status *st, char **msg) {
    if (!s || !ids || !st || n < 0)
        return ks_errorf(KS_ERR_ARG, "%s: %s", fn, n < 0 ? "n must be >= 0" : "NULL sessions, ids or statuses");
    for (int i = 0; i < n; i++) {
        if (!s[i]) return ks_errorf(KS_ERR_ARG, "%s: session %d is NULL", fn, i);
        if (s[i]->m != s[0]->m || s[i]->be != s[0]->be)
            return ks_errorf(KS_ERR_ARG, "%s: session %d is on another model than session 0", fn, i);
        for (int j = 0; j < i; j++)
            if (s[j] == s[i]) return ks_errorf(KS_ERR_ARG, "%s: sessions %d and %d are the same", fn, j, i);
    }
    if (next)
        for (int i = 0; i < n; i++) next[i] = -1;
    if (msg)
        for (int i = 0; i < n; i++) msg[i] = NULL;
    brow stack[16], *R = n <= 16 ? stack : ks_calloc((size_t)n, sizeof(brow));
    if (!R) return KS_ERR_OOM;
    int nr = 0;
    for (int i = 0; i < n; i++) {
        ks_session *si = s[i];
        const ks_config *c = &si->m->cfg;
        st[i] = KS_OK;
        brow r = {.s = si, .i = i, .id = ids[i], .pos = si->n_past, .greedy = next && (!greedy || greedy[i])};
        if (ids[i] < 0 || ids[i] >= c->vocab)
            row_fail(&r, ks_errorf(KS_ERR_ARG, "decode: token id %d out of range [0, %d)", ids[i], c->vocab), st, msg);
        else if (si->n_past + 1 > c->max_pos)
            row_fail(&r, ks_errorf(KS_ERR_CONTEXT, "decode: position %d exceeds the model's context of %d tokens",
                                   si->n_past, c->max_pos), st, msg);
        if (r.dead) continue;
        r.pre = si->policy && si->policy->want_pre_rope_keys;
        r.key = r.pre * 2 + (c->rope.type == KS_ROPE_LONGROPE && r.pos + 1 > c->rope.orig_max_pos);
        R[nr++] = r;
    }
    /* one session, or sessions being profiled (whose phases are their own step's): the
     * single-session step (with its recorded graph where the backend has one) */
    int nb = 0;
    for (int k = 0; k < nr; k++) {
        if (nr > 1 && !R[k].s->prof.on) { R[nb++] = R[k]; continue; }
        ks_status sk = ks_session_decode(R[k].s, R[k].id);
        if (sk) row_fail(&R[k], sk, st, msg);
        alone_next(&R[k], next);
    }
    if (nb == 1) {
        ks_status sk = ks_session_decode(R[0].s, R[0].id);
        if (sk) row_fail(&R[0], sk, st, msg);
        alone_next(&R[0], next);
        nb = 0;
    }
    if (nb > 0) {
        double t0 = ks_now();
        qsort(R, (size_t)nb, sizeof *R, cmp_key);
        int live = 0;
        for (int k = 0; k < nb; k++) {
            ks_session *sk = R[k].s;
            ks_devcheck_reset(sk);
            ks_status sp = ks_session_push_tokens(sk, &R[k].id, 1);
            if (sp) { row_fail(&R[k], sp, st, msg); continue; }
            R[live++] = R[k];
        }
        ks_status sh = live ? step_rows(R, live, next, st, msg) : KS_OK;
        double dt = ks_now() - t0;
        for (int k = 0; k < live; k++) {
            if (sh && !R[k].dead) {
                row_fail(&R[k], sh, st, msg);
                if (next) next[R[k].i] = -1;
            }
            R[k].s->t_decode += dt;
            /* as ks_session_decode: no scratch stays where no graph may read it */
            if (!R[k].s->be->graph_begin) ks_decode_free(R[k].s);
        }
    }
    if (R != stack) free(R);
    return KS_OK;
}

ks_status ks_sessions_decode(ks_session *const *s, const int32_t *ids, int n, ks_status *st, char **msg) {
    return decode_n("ks_sessions_decode", s, ids, n, NULL, NULL, st, msg);
}

ks_status ks_sessions_decode_greedy(ks_session *const *s, const int32_t *ids, int n, const unsigned char *greedy,
                                    int32_t *next, ks_status *st, char **msg) {
    if (!next) return ks_errorf(KS_ERR_ARG, "ks_sessions_decode_greedy: NULL next ids");
    return decode_n("ks_sessions_decode_greedy", s, ids, n, greedy, next, st, msg);
}
