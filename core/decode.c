/* decode.c — one decode step: a token through every layer (with the policy's decode event), its
 * logits into s->logits; on a backend with graphs, the step recorded once and replayed while
 * the cache still matches what the recording assumed. */
#include "forward.h"
#include "tp_backend.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ================================================================ decode state */

/* What decode steps keep between calls (on a backend with graphs; freed after each step on others,
 * and by ks_session_reset): the one-row activations and the device logits (so no
 * step allocates), and on a backend with graphs the recorded step with what it assumed (the
 * contract of ks_backend.graph_begin): each layer's storage and per-head row counts at the
 * recording, its position, and the longrope factor choice (the inv_freq table it read). */
typedef struct ks_decode_state {
    ks_fwd_buf b;
    int pre;                 /* b was allocated in pre-RoPE mode */
    float *lg;               /* (vocab) backend: logits of the step */
    ks_graph *g;             /* NULL = none recorded */
    ks_graph **seg;          /* (n_layers + 1) a step with a decode handler, recorded in segments
                              * (decode_segments); nseg of them recorded, n_layers + 1 when whole */
    int nseg;
    int seg_miss;            /* consecutive steps whose handler asked for another kind of attention
                              * than the recording has (two: it is dropped and recorded anew) */
    char *seg_att;           /* (n_layers) the recording's attention of that layer reads the lists its
                              * handler staged (backend attn_stage, slot = the layer): 1, 2 with
                              * renumbered positions, + 2 with row ranges (dec_acted); 0 the whole layer */
    int32_t pos0;            /* position at the recording */
    int long_rope;
    void **k, **v, **pd;     /* (n_layers) storage at the recording */
    int *cap;                /* (n_layers) */
    int *n0;                 /* (n_layers, n_kv_heads) rows before the recorded step's append */
    int ready;               /* plain steps since the graph was dropped (record after one) */
    /* the KV ring (policy.h ks_policy.ring_*): the sinks and budget the rows were rotated under
     * (ring_b 0: no layer rotated since the last restore), each layer's rotation as last known
     * (a hint, checked against the positions; -1 unknown), the ring slot each layer's recorded
     * append wrote (-1: appended at the end), the positions that slot held before the
     * recording (undone when it fails), and the attend list of a host-memory ring step */
    int ring_s, ring_b;
    int *ring_r, *ring_p0;   /* (n_layers) */
    int32_t *ring_save;      /* (n_layers, n_kv_heads) */
    int32_t *ring_list;      /* (ring_b) */
    int ring_list_n;
    const int32_t **ring_idx; /* (n_kv_heads) all ring_list */
    int *ring_cnt;           /* (n_kv_heads) */
    ks_graph *joined[2];     /* the segments' recording joined (backend graph_join) in two graphs, for
                              * steps whose every layer is held (no handler runs): segments
                              * [0, JOIN_HEAD) and the rest; NULL = not joined yet */
    int join_failed;         /* graph_join refused these segments: held steps launch them one by one */
    int32_t joined_pos;      /* the position of the last joined step (-1: none since the recording) */
    unsigned long long joined_gen; /* the session's hold_gen at that step */
    int fails;               /* recordings that failed; no more graphs for the session after 2 */
    /* recorded handlers (policy.h ks_action_replay; decode_record_handlers): hseg[l] the device
     * work of layer l's decode handler, recorded between seg[l] and seg[l + 1] (nh of them, nl
     * when whole), at position hpos, allowing hgrow rows of growth; rep[l]: layer l's last fired
     * decode event declared replay; hjoined: seg[0], hseg[0], seg[1], ... joined as three graphs */
    ks_graph **hseg;         /* (n_layers), in seg's allocation */
    int nh;
    int32_t hpos;
    int64_t hgrow;
    int hlim;                /* hgrow is a handler's (ks_action_replay_within): past it the declarations
                                are stale too, so the events fire before anything is recorded anew */
    char *rep;               /* (n_layers), in seg_att's allocation */
    int hfails;              /* handler recordings that failed; none tried after 2 */
    ks_graph *hjoined[3];    /* HJOIN_CUT */
    ks_graph *hjold[3];      /* the joins of a recording dropped at its handlers' limit (hlim), given to
                                the next join to update (graph_join's *out) */
    int hjoin_failed;
    ks_devcheck *chk;        /* deferred checks of attend device lists (actions.c), or NULL */
} ks_decode_state;

/* Free the recorded handlers (the segments stay). */
static void dec_drop_handlers(ks_session *s, ks_decode_state *d) {
    for (int i = 0; i < 3; i++) {
        if (d->hjoined[i]) s->be->graph_free(s->be, d->hjoined[i]);
        if (d->hjold[i]) s->be->graph_free(s->be, d->hjold[i]);
    }
    d->hjoined[0] = d->hjoined[1] = d->hjoined[2] = NULL;
    d->hjold[0] = d->hjold[1] = d->hjold[2] = NULL;
    d->hjoin_failed = 0;
    for (int l = 0; l < d->nh; l++) s->be->graph_free(s->be, d->hseg[l]);
    d->nh = 0;
}

void ks_decode_drop_graph(ks_session *s) {
    ks_decode_state *d = s->dec;
    if (d) dec_drop_handlers(s, d);
    if (!d || (!d->g && !d->nseg)) return;
    if (d->g) s->be->graph_free(s->be, d->g);
    for (int i = 0; i < d->nseg; i++) s->be->graph_free(s->be, d->seg[i]);
    for (int i = 0; i < 2; i++)
        if (d->joined[i]) s->be->graph_free(s->be, d->joined[i]);
    d->g = NULL;
    d->joined[0] = d->joined[1] = NULL;
    d->join_failed = 0;
    d->joined_pos = -1;
    d->nseg = 0;
    d->ready = 0;
}

void ks_decode_free(ks_session *s) {
    ks_decode_state *d = s->dec;
    if (!d) return;
    ks_decode_drop_graph(s);
    ks_fwd_free(s->be, &d->b);
    if (d->lg) s->be->free(s->be, d->lg);
    ks_devcheck_free(s->be, d->chk);
    free(d->seg);
    free(d->seg_att);
    free(d->k);
    free(d->n0);
    free(d->ring_r);
    free(d->ring_save);
    free(d->ring_list);
    free(d->ring_idx);
    free(d);
    s->dec = NULL;
}

/* The session's decode state, created empty when it has none (NULL: out of memory). */
static ks_decode_state *dec_state(ks_session *s) {
    const ks_config *c = &s->m->cfg;
    ks_decode_state *d = s->dec;
    if (d) return d;
    d = ks_calloc(1, sizeof *d);
    if (!d) return NULL;
    d->k = ks_calloc((size_t)4 * c->n_layers, sizeof(void *));
    d->n0 = ks_calloc((size_t)c->n_layers * c->n_kv_heads, sizeof(int));
    d->ring_r = ks_malloc(sizeof(int) * 2 * (size_t)c->n_layers);
    d->ring_save = ks_calloc((size_t)c->n_layers * c->n_kv_heads, sizeof(int32_t));
    d->ring_idx = ks_calloc((size_t)c->n_kv_heads, sizeof(int32_t *) + sizeof(int));
    d->seg = ks_calloc((size_t)2 * c->n_layers + 1, sizeof(ks_graph *));
    d->seg_att = ks_calloc((size_t)2 * c->n_layers, 1);
    if (!d->k || !d->n0 || !d->ring_r || !d->ring_save || !d->ring_idx || !d->seg || !d->seg_att) {
        free(d->k); free(d->n0); free(d->ring_r); free(d->ring_save); free(d->ring_idx); free(d->seg); free(d->seg_att);
        free(d);
        return NULL;
    }
    d->ring_p0 = d->ring_r + c->n_layers;
    d->hseg = d->seg + c->n_layers + 1;
    d->rep = d->seg_att + c->n_layers;
    for (int l = 0; l < 2 * c->n_layers; l++) d->ring_r[l] = -1;
    d->joined_pos = -1;
    d->ring_cnt = (int *)(d->ring_idx + c->n_kv_heads);
    d->v = d->k + c->n_layers;
    d->pd = d->v + c->n_layers;
    d->cap = (int *)(d->pd + c->n_layers);
    s->dec = d;
    return d;
}

ks_devcheck **ks_decode_devcheck(ks_session *s) {
    ks_decode_state *d = dec_state(s);
    return d ? &d->chk : NULL;
}

/* The decode state with buffers for pre-RoPE mode `pre` (reallocated when the mode changes). */
static ks_status dec_get(ks_session *s, int pre, ks_decode_state **out) {
    const ks_config *c = &s->m->cfg;
    ks_backend *be = s->be;
    ks_decode_state *d = dec_state(s);
    if (!d) return KS_ERR_OOM;
    if (d->b.a.x && d->pre != pre) {
        ks_decode_drop_graph(s);
        ks_fwd_free(be, &d->b);
    }
    if (!d->b.a.x) {
        ks_status st = ks_fwd_alloc(be, c, 1, pre, &d->b);
        if (st) return st;
        d->pre = pre;
    }
    if (!d->lg && !(d->lg = be->alloc(be, sizeof(float) * c->vocab)))
        return ks_errorf(KS_ERR_OOM, "%s: out of memory for the logits", be->name);
    *out = d;
    return KS_OK;
}

/* ================================================================ the KV ring */

int ks_ring_on(const ks_session *s) {
    return s->policy && s->policy->ring_budget > 0 && !ks_tp_ranks(s->be);
}

/* The rotation of ring layer L (sinks S, budget B; head 0 holds B rows): the one index j of
 * [0, M = B - S) where its rows [S, B) descend in position cyclically (pos[S + j] <
 * pos[S + (j - 1) mod M]: there the oldest row sits). hint (-1: none) is tried first: the rows
 * of a ring are a rotation of an ascending run, which has exactly one such index. -1: the rows
 * are not a rotated ascending run (not ring-shaped; the caller says so). */
static int ring_rot(const ks_kv_layer *L, int S, int B, int hint) {
    const int32_t *p = L->pos + S;
    int M = B - S;
    if (M == 1) return 0;
    if (hint >= 0 && hint < M && p[hint] < p[(hint + M - 1) % M]) return hint;
    int j = -1, k = 0;
    for (int i = 0; i < M; i++)
        if (p[i] < p[(i + M - 1) % M]) { j = i; k++; }
    return k == 1 ? j : -1;
}

/* The ring's sinks and budget for layer work now: those the rows were rotated under when some
 * are, else the policy's (0 budget: none). */
static void ring_params(const ks_session *s, int *S, int *B) {
    const ks_decode_state *d = s->dec;
    if (d && d->ring_b) { *S = d->ring_s; *B = d->ring_b; return; }
    *S = ks_ring_on(s) ? s->policy->ring_sinks : 0;
    *B = ks_ring_on(s) ? s->policy->ring_budget : 0;
}

/* The logical-order index list of a ring layer at rotation r: its rows [0, S), then [S + r, B),
 * then [S, S + r), then any rows past B (a batched step's append) in place; into out (n). */
static void ring_order(int S, int B, int r, int n, int32_t *out) {
    int k = 0;
    for (int i = 0; i < S; i++) out[k++] = i;
    for (int i = S + r; i < B; i++) out[k++] = i;
    for (int i = S; i < S + r; i++) out[k++] = i;
    for (int i = B; i < n; i++) out[k++] = i;
}

ks_status ks_ring_restore(ks_session *s, int l) {
    int S, B;
    ring_params(s, &S, &B);
    ks_kv_layer *L = &s->kv[l];
    if (!B || !L->n || L->n[0] < B) return KS_OK;
    ks_decode_state *d = s->dec;
    int H = L->n_kv_heads;
    for (int h = 1; h < H; h++)
        if (L->n[h] != L->n[0]) return KS_OK; /* never a ring: its heads differ */
    int r = ring_rot(L, S, B, d ? d->ring_r[l] : -1);
    if (r <= 0) { /* in order (or never ring-shaped: left as it is) */
        if (d) d->ring_r[l] = r;
        return KS_OK;
    }
    int n = L->n[0];
    int32_t *list = ks_malloc(sizeof(int32_t) * (size_t)n);
    const int32_t **idx = ks_malloc(sizeof(int32_t *) * H);
    int *cnt = ks_malloc(sizeof(int) * H);
    ks_status st = KS_OK;
    if (!list || !idx || !cnt) st = ks_errorf(KS_ERR_OOM, "kv ring: out of memory restoring layer %d", l);
    else {
        ring_order(S, B, r, n, list);
        for (int h = 0; h < H; h++) { idx[h] = list; cnt[h] = n; }
        ks_decode_drop_graph(s); /* the rows move under it */
        st = s->be->kv_retain(s->be, L, idx, cnt, 0);
        if (!st && d) d->ring_r[l] = 0;
    }
    free(list);
    free(idx);
    free(cnt);
    return st;
}

ks_status ks_ring_restore_all(ks_session *s) {
    ks_decode_state *d = s->dec;
    if (!d || !d->ring_b) return KS_OK; /* nothing was rotated since the last restore */
    for (int l = 0; l < s->m->cfg.n_layers; l++) {
        ks_status st = ks_ring_restore(s, l);
        if (st) return st;
    }
    d->ring_b = 0;
    return KS_OK;
}

/* Layer l before a ring decode step (sinks S, budget B): its heads must hold one row count;
 * more than B rows (a prefill that kept more) are cut to the sinks and the most recent B - S
 * first, as the step would evict them. *full: the layer holds B rows (the step overwrites
 * one), its rotation in *rot. */
static ks_status ring_prepare(ks_session *s, ks_decode_state *d, int l, int S, int B, int *full, int *rot) {
    ks_kv_layer *L = &s->kv[l];
    *full = 0;
    if (!L->n) return KS_OK;
    int H = L->n_kv_heads, n = L->n[0];
    for (int h = 1; h < H; h++)
        if (L->n[h] != n)
            return ks_errorf(KS_ERR_POLICY, "policy %s: kv_ring: layer %d's KV heads hold different row counts (%d and %d)",
                             s->policy->name, l, n, L->n[h]);
    if (n < B) return KS_OK;
    if (n > B) { /* logical order first (rows past B: appended by a step without the ring), then keep the ring's rows */
        ks_status sr = ks_ring_restore(s, l);
        if (sr) return sr;
        int32_t *list = ks_malloc(sizeof(int32_t) * (size_t)B);
        if (!list) return KS_ERR_OOM;
        for (int i = 0; i < S; i++) list[i] = i;
        for (int i = S; i < B; i++) list[i] = n - (B - i);
        for (int h = 0; h < H; h++) { d->ring_idx[h] = list; d->ring_cnt[h] = B; }
        ks_decode_drop_graph(s);
        ks_status st = s->be->kv_retain(s->be, L, d->ring_idx, d->ring_cnt, 0);
        free(list);
        if (st) return st;
        d->ring_r[l] = 0;
    }
    int r = ring_rot(L, S, B, d->ring_r[l]);
    if (r < 0)
        return ks_errorf(KS_ERR_POLICY, "policy %s: kv_ring: layer %d's rows are not in position order", s->policy->name, l);
    *full = 1;
    *rot = r;
    return KS_OK;
}

/* A ring step's q|k|v into layer l: the new row overwrites physical row S + r (the oldest after
 * the sinks) through a view of the layer whose row counts say S + r, so the backend's append
 * writes there; the counts stay B and the rotation advances. */
static ks_status ring_qkv(ks_session *s, ks_decode_state *d, int l, ks_fwd_buf *b, int32_t pos, int S, int B, int r) {
    ks_kv_layer *L = &s->kv[l];
    int H = L->n_kv_heads;
    int stack[16], *nv = H <= 16 ? stack : ks_malloc(sizeof(int) * H);
    if (!nv) return KS_ERR_OOM;
    for (int h = 0; h < H; h++) nv[h] = S + r;
    ks_kv_layer V = *L;
    V.n = nv;
    ks_status st = ks_layer_qkv_at(s, l, b, &pos, &V);
    if (nv != stack) free(nv);
    if (!st && (V.k != L->k || V.v != L->v || V.pos != L->pos || V.capacity != L->capacity))
        st = ks_errorf(KS_ERR_INTERNAL, "kv ring: the backend moved layer %d's storage for an append inside it", l);
    if (st) return st;
    d->ring_r[l] = (r + 1) % (B - S);
    d->ring_s = S;
    d->ring_b = B;
    return KS_OK;
}

/* The attention arguments of a ring step on a host-memory backend: the layer's rows in logical
 * order as an attend list, so the sums run in the order of the compacting path (bit for bit);
 * a device backend attends the rows as they lie (the sum does not depend on their order but
 * for rounding). */
static ks_status ring_attend(ks_session *s, ks_decode_state *d, int l, int S, int B, ks_actions *act) {
    const ks_kv_layer *L = &s->kv[l];
    if (!s->be->host_memory) return KS_OK;
    if (d->ring_list_n < B) {
        int32_t *p = realloc(d->ring_list, sizeof(int32_t) * (size_t)B);
        if (!p) return KS_ERR_OOM;
        d->ring_list = p;
        d->ring_list_n = B;
    }
    ring_order(S, B, d->ring_r[l], B, d->ring_list);
    for (int h = 0; h < L->n_kv_heads; h++) { d->ring_idx[h] = d->ring_list; d->ring_cnt[h] = B; }
    act->attend = 1;
    act->attend_idx = (int32_t **)d->ring_idx;
    act->n_attend = d->ring_cnt;
    return KS_OK;
}

/* ================================================================ one step */

/* One layer of a step in three parts, run in this order by decode_from; a step recorded in
 * segments (decode_segments) is cut between them. */

/* Layer l's norm, projections, RoPE (unless pre-RoPE) and new cache row: at the end, or in a full
 * ring layer over its oldest row after the sinks (*full; its attend list then goes into act). */
static ks_status dec_layer_in(ks_session *s, ks_decode_state *d, ks_fwd_buf *b, int l, int32_t pos, int *full,
                              ks_actions *act) {
    const ks_policy *pol = s->policy;
    int ring = ks_ring_on(s), S = ring ? pol->ring_sinks : 0, B = ring ? pol->ring_budget : 0, r = 0;
    ks_status st;
    *full = 0;
    if (ring && (st = ring_prepare(s, d, l, S, B, full, &r))) return st;
    if (*full) st = ring_qkv(s, d, l, b, pos, S, B, r);
    else st = ks_layer_qkv(s, l, b, 1, &pos, pos, &s->kv[l]);
    if (!st && *full) st = ring_attend(s, d, l, S, B, act);
    return st;
}

static void dec_event_init(ks_session *s, ks_fwd_buf *b, int l, int32_t *pos, int32_t *id, ks_event *ev) {
    ks_event_init(s, ev, KS_EV_DECODE_QKV, l, 0, 1);
    ev->q = b->a.q; ev->k = b->a.k; ev->v = b->a.v; ev->k_pre = b->kpre;
    ev->pos = pos; ev->ids = id; ev->kv = &s->kv[l];
}

/* Layer l's held attend (hold.c) into act: 1; 0 none (or it no longer fits: dropped); -1 out of
 * memory. No handler runs. */
static int dec_layer_held(ks_session *s, ks_fwd_buf *b, int l, int32_t *pos, int32_t *id, ks_actions *act) {
    ks_event ev;
    dec_event_init(s, b, l, pos, id, &ev);
    int held = ks_hold_replay(s, &ev);
    if (held > 0) *act = ks_actions_take(&ev);
    return held;
}

/* Layer l's decode event, when the policy handles it (never on a ring): its actions into act
 * (attend in this attention, retain after it); a held attend without the event. grow > 0:
 * the handler's device work is being recorded (ks_event.grow). Notes in the decode state
 * whether the event declared replay. */
static ks_status dec_layer_fire(ks_session *s, ks_fwd_buf *b, int l, int32_t *pos, int32_t *id, ks_actions *act,
                                int64_t grow) {
    const ks_policy *pol = s->policy;
    if (s->dec) s->dec->rep[l] = 0;
    if (!pol || !pol->on[KS_EV_DECODE_QKV] || ks_ring_on(s)) return KS_OK;
    int held = grow ? 0 : dec_layer_held(s, b, l, pos, id, act);
    if (held) {
        PROF(s, KS_PH_POLICY);
        return held < 0 ? KS_ERR_OOM : KS_OK;
    }
    ks_event ev;
    dec_event_init(s, b, l, pos, id, &ev);
    ev.grow = grow;
    ks_status st = ks_event_fire(s, &ev);
    PROF(s, KS_PH_POLICY);
    *act = ks_actions_take(&ev);
    /* a declaration valid for one more row only would make a recording that never replays */
    if (!st && s->dec) s->dec->rep[l] = (char)(act->replay && act->replay_rows != 1);
    if (!st && act->hold) st = ks_hold_commit(s, l, act);
    if (st) ks_actions_free(act, s->m->cfg.n_kv_heads);
    return st;
}
static ks_status dec_layer_event(ks_session *s, ks_fwd_buf *b, int l, int32_t *pos, int32_t *id, ks_actions *act) {
    return dec_layer_fire(s, b, l, pos, id, act, 0);
}

/* Layer l's attention (with act), the retain it asked for, and the rest of the layer; frees
 * act's lists (a ring step's belong to the state). staged: a recording whose attention reads
 * the lists staged in slot l (act then carries no lists). */
static ks_status dec_layer_out(ks_session *s, ks_fwd_buf *b, int l, int32_t pos, int full, ks_actions *act, int staged) {
    ks_attn_args aa = ks_layer_attn_args(s, b, 1, &pos, pos, act);
    if (staged) aa.staged = l + 1;
    ks_status st = ks_layer_attention(s, l, b, &aa);
    if (!st && act->retain) {
        st = ks_actions_apply_retain(s, l, act);
        PROF(s, KS_PH_KV_EDIT);
    }
    if (!full) ks_actions_free(act, s->m->cfg.n_kv_heads);
    if (st) return st;
    return ks_layer_tail(s, l, b, 1);
}

/* The layers of a step from l0 on, then the final norm and lm_head into lg (vocab, backend).
 * act0 (non-NULL): layer l0's q|k|v and event ran already, these are its actions (not a ring
 * layer's). */
static ks_status decode_from(ks_session *s, ks_decode_state *d, ks_fwd_buf *b, int32_t id, int32_t pos, float *lg,
                             int l0, ks_actions *act0) {
    const ks_config *c = &s->m->cfg;
    ks_status st;
    for (int l = l0; l < c->n_layers; l++) {
        int full = 0;
        ks_actions act = {0};
        if (act0 && l == l0) act = *act0;
        else if ((st = dec_layer_in(s, d, b, l, pos, &full, &act)) || (st = dec_layer_event(s, b, l, &pos, &id, &act))) {
            if (!full) ks_actions_free(&act, c->n_kv_heads);
            return st;
        }
        if ((st = dec_layer_out(s, b, l, pos, full, &act, 0))) return st;
    }
    return ks_head_compute(s, b, 0, 1, lg);
}

/* The device work of one decode step: embed `id` at `pos`, every layer (the policy's decode
 * event included), the final norm and lm_head into lg (vocab, backend). */
static ks_status decode_body(ks_session *s, ks_decode_state *d, ks_fwd_buf *b, int32_t id, int32_t pos, float *lg) {
    ks_status st = s->be->embed(s->be, b->a.x, s->m->embed, &id, 1, s->m->cfg.dim);
    if (st) return st;
    PROF(s, KS_PH_EMBED);
    return decode_from(s, d, b, id, pos, lg, 0, NULL);
}

/* ================================================================ the recorded step (backend graphs) */

static int dec_long_rope(const ks_config *c, int32_t pos) {
    return c->rope.type == KS_ROPE_LONGROPE && pos + 1 > c->rope.orig_max_pos;
}

/* The recorded step still describes the cache (ks_backend.graph_begin's contract) at `pos`. */
static int dec_graph_valid(ks_session *s, ks_decode_state *d, int32_t pos) {
    const ks_config *c = &s->m->cfg;
    if ((!d->g && d->nseg != c->n_layers + 1) || pos < d->pos0 || dec_long_rope(c, pos) != d->long_rope) return 0;
    int delta = pos - d->pos0;
    int ring = ks_ring_on(s), S = ring ? s->policy->ring_sinks : 0, B = ring ? s->policy->ring_budget : 0;
    if (ring != (d->ring_b > 0) || (ring && (S != d->ring_s || B != d->ring_b))) return 0;
    for (int l = 0; l < c->n_layers; l++) {
        const ks_kv_layer *L = &s->kv[l];
        if (L->k != d->k[l] || L->v != d->v[l] || L->pos_dev != d->pd[l] || L->capacity != d->cap[l] || !L->n) return 0;
        const int *n0 = d->n0 + (size_t)l * c->n_kv_heads;
        if (d->ring_p0[l] >= 0) { /* a ring layer: B rows, this step's slot the recorded one + delta */
            if (d->ring_p0[l] + delta >= B) return 0; /* it wraps: record anew */
            for (int h = 0; h < c->n_kv_heads; h++)
                if (L->n[h] != B) return 0;
            int r = ring_rot(L, S, B, d->ring_r[l]);
            if (r < 0 || S + r != d->ring_p0[l] + delta) return 0;
            d->ring_r[l] = r;
            continue;
        }
        for (int h = 0; h < c->n_kv_heads; h++)
            if (L->n[h] != n0[h] + delta || L->n[h] + 1 > L->capacity || (ring && L->n[h] >= B)) return 0;
    }
    return 1;
}

/* Book the row a graph run wrote at `pos` in every layer (what attn_in with L does on the host). */
static void dec_book_layer(ks_session *s, ks_decode_state *d, int l, int32_t pos) {
    ks_kv_layer *L = &s->kv[l];
    if (d->ring_p0[l] >= 0) { /* ring: the slot dec_graph_valid found; the rotation advances */
        int slot = d->ring_s + d->ring_r[l];
        for (int h = 0; h < L->n_kv_heads; h++) L->pos[(size_t)h * L->capacity + slot] = pos;
        d->ring_r[l] = (d->ring_r[l] + 1) % (d->ring_b - d->ring_s);
        return;
    }
    for (int h = 0; h < L->n_kv_heads; h++) L->pos[(size_t)h * L->capacity + L->n[h]++] = pos;
}
/* Undo dec_book_layer of a replayed step's layer l (not a ring layer: segments have none). */
static void dec_unbook_row(ks_session *s, int l) {
    ks_kv_layer *L = &s->kv[l];
    for (int h = 0; h < L->n_kv_heads; h++) L->n[h]--;
}
static void dec_book_rows(ks_session *s, ks_decode_state *d, int32_t pos) {
    for (int l = 0; l < s->m->cfg.n_layers; l++) dec_book_layer(s, d, l, pos);
}

/* Undo the host effects of a recording that did not run (attn_in booked rows: the counts of
 * appends at the end, the positions of ring slots, and the rotations). */
static void dec_unbook_layer(ks_session *s, ks_decode_state *d, int l) {
    const ks_config *c = &s->m->cfg;
    ks_kv_layer *L = &s->kv[l];
    memcpy(L->n, d->n0 + (size_t)l * c->n_kv_heads, sizeof(int) * c->n_kv_heads);
    if (d->ring_p0[l] >= 0)
        for (int h = 0; h < c->n_kv_heads; h++)
            L->pos[(size_t)h * L->capacity + d->ring_p0[l]] = d->ring_save[(size_t)l * c->n_kv_heads + h];
    d->ring_r[l] = -1;
}
static void dec_unbook(ks_session *s, ks_decode_state *d) {
    for (int l = 0; l < s->m->cfg.n_layers; l++) dec_unbook_layer(s, d, l);
}

/* A recording failed, for the reason in the printf-style message: counted (after two the session
 * records no more), and the session's first is said once (KS_LOG_INFO), later ones only in the
 * backend's verbose notes. */
static void dec_fail(ks_session *s, ks_decode_state *d, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void dec_fail(ks_session *s, ks_decode_state *d, const char *fmt, ...) {
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (d->fails++ == 0)
        ks_logf(KS_LOG_INFO, "decode: a step cannot replay as a recorded graph (%s); such steps run as plain launches", msg);
    else if (s->be->opts.verbose) ks_logf(KS_LOG_DEBUG, "decode graph not recorded: %s", msg);
}

/* One step through a graph: run the recorded one when it still holds, else record it (after one
 * plain step since it was dropped, so lazy backend set-up happens outside a recording).
 * KS_ERR_UNSUPPORTED: nothing was done, take the plain path. */
static ks_status decode_graph(ks_session *s, ks_decode_state *d, int32_t id, int32_t pos) {
    const ks_config *c = &s->m->cfg;
    ks_backend *be = s->be;
    ks_status st;
    if (d->g && dec_graph_valid(s, d, pos)) {
        st = be->graph_run(be, d->g, id, pos);
        if (st == KS_ERR_UNSUPPORTED) { ks_decode_drop_graph(s); return st; }
        if (st) return st;
        dec_book_rows(s, d, pos);
        s->graph_steps++;
        return KS_OK;
    }
    ks_decode_drop_graph(s);
    if (d->fails >= 2 || d->ready < 1) return KS_ERR_UNSUPPORTED;
    int ring = ks_ring_on(s), S = ring ? s->policy->ring_sinks : 0, B = ring ? s->policy->ring_budget : 0;
    for (int l = 0; l < c->n_layers; l++) { /* room for the row in the storage the graph will read */
        const ks_kv_layer *L = &s->kv[l];
        if (!L->k || !L->n) return KS_ERR_UNSUPPORTED;
        d->ring_p0[l] = -1;
        if (ring && L->n[0] >= B) { /* a ring step: the slot it writes (a layer to cut first: plain) */
            int r = -1;
            for (int h = 0; h < c->n_kv_heads; h++)
                if (L->n[h] != B) return KS_ERR_UNSUPPORTED;
            if ((r = ring_rot(L, S, B, d->ring_r[l])) < 0) return KS_ERR_UNSUPPORTED;
            d->ring_r[l] = r;
            d->ring_p0[l] = S + r;
            for (int h = 0; h < c->n_kv_heads; h++)
                d->ring_save[(size_t)l * c->n_kv_heads + h] = L->pos[(size_t)h * L->capacity + S + r];
        } else
            for (int h = 0; h < c->n_kv_heads; h++)
                if (L->n[h] + 1 > L->capacity || (ring && L->n[h] != L->n[0])) return KS_ERR_UNSUPPORTED;
        d->k[l] = L->k; d->v[l] = L->v; d->pd[l] = L->pos_dev; d->cap[l] = L->capacity;
        memcpy(d->n0 + (size_t)l * c->n_kv_heads, L->n, sizeof(int) * c->n_kv_heads);
    }
    d->ring_s = S;
    d->ring_b = B; /* the recording rotates ring layers under these (0: none) */
    if ((st = be->graph_begin(be, id, pos))) {
        dec_fail(s, d, "%s", ks_last_error());
        return KS_ERR_UNSUPPORTED;
    }
    ks_status sb = decode_body(s, d, &d->b, id, pos, d->lg);
    ks_graph *g = NULL;
    st = be->graph_end(be, &g);
    if (!st && sb) { be->graph_free(be, g); g = NULL; st = KS_ERR_UNSUPPORTED; }
    if (st) { /* undo the host effects (the rows booked); the plain path runs the step */
        dec_unbook(s, d);
        dec_fail(s, d, "%s", ks_last_error());
        return KS_ERR_UNSUPPORTED;
    }
    d->g = g;
    d->pos0 = pos;
    d->long_rope = dec_long_rope(c, pos);
    /* the recording booked the rows already: run it for this token without booking again */
    if ((st = be->graph_run(be, g, id, pos))) { /* nothing ran: unbook the rows */
        dec_unbook(s, d);
        ks_decode_drop_graph(s);
        return st;
    }
    s->graph_steps++;
    return KS_OK;
}

/* What a decode event asked for: 0 nothing (a no-op, or a handler that only reads and reports),
 * else 1, or 2 for an attend with renumbered positions, plus 2 for row ranges around the list
 * (a recorded attention is one of these kinds) */
static int dec_acted(const ks_actions *a) {
    if (!(a->restart || a->propagate || a->retain || a->attend || a->stop || a->renumber || a->discard_kv)) return 0;
    return (a->attend && a->renumber ? 2 : 1) + (a->attend && a->attend_seg ? 2 : 0);
}

/* 1 when the event asked only to attend (TokenSelect, Quest): a recorded segment can take the
 * lists through the backend's staged list slot, where attn_stage accepts them (CUDA: device
 * lists) */
static int dec_stageable(const ks_session *s, const ks_actions *a) {
    return s->be->attn_stage && a->attend && !a->restart && !a->propagate && !a->retain && !a->stop && !a->discard_kv;
}

/* Stage layer l's attend lists (act's) in slot l. act stays: the caller frees it once the
 * segment that reads the slot was launched (its buffers stream-ordered, after the copy), or
 * runs the layer plain with it. */
static ks_status dec_stage(ks_session *s, ks_fwd_buf *b, int l, int32_t pos, ks_actions *act) {
    ks_attn_args aa = ks_layer_attn_args(s, b, 1, &pos, pos, act);
    return s->be->attn_stage(s->be, l, &s->kv[l], &aa);
}

/* Check the cache for a recording at `pos` and remember what it assumes (decode_graph's
 * conditions without a ring). 0: a layer has no room or no rows; do not record. */
static int dec_seg_prepare(ks_session *s, ks_decode_state *d, int32_t pos) {
    const ks_config *c = &s->m->cfg;
    for (int l = 0; l < c->n_layers; l++) {
        const ks_kv_layer *L = &s->kv[l];
        if (!L->k || !L->n) return 0;
        for (int h = 0; h < c->n_kv_heads; h++)
            if (L->n[h] + 1 > L->capacity) return 0;
        d->ring_p0[l] = -1;
        d->k[l] = L->k; d->v[l] = L->v; d->pd[l] = L->pos_dev; d->cap[l] = L->capacity;
        memcpy(d->n0 + (size_t)l * c->n_kv_heads, L->n, sizeof(int) * c->n_kv_heads);
    }
    d->ring_s = d->ring_b = 0;
    d->pos0 = pos;
    d->long_rope = dec_long_rope(c, pos);
    return 1;
}

/* Layer l's lists (act's, an attend of kind att: dec_acted) staged and segment l + 1 launched
 * behind them; act freed after the launch (stream-ordered: the segment reads the lists in place).
 * Where the lists cannot be staged or the recording went stale, the rest of the step runs plain
 * from layer l's attention with act (*plain = 1). */
static ks_status dec_stage_next(ks_session *s, ks_decode_state *d, int32_t id, int32_t pos, int l, int att,
                                ks_actions *act, int *plain) {
    const ks_config *c = &s->m->cfg;
    ks_fwd_buf *b = &d->b;
    ks_status st;
    *plain = 0;
    if (att && (st = dec_stage(s, b, l, pos, act))) {
        if (st != KS_ERR_UNSUPPORTED) { ks_actions_free(act, c->n_kv_heads); return st; }
        ks_clear_error();
        *plain = 1;
        return decode_from(s, d, b, id, pos, d->lg, l, act);
    }
    if ((st = s->be->graph_launch(s->be, d->seg[l + 1])) == KS_ERR_UNSUPPORTED) {
        ks_clear_error();
        ks_decode_drop_graph(s);
        *plain = 1;
        return decode_from(s, d, b, id, pos, d->lg, l, act);
    }
    ks_actions_free(act, c->n_kv_heads);
    return st;
}

/* The replay of a step recorded in segments from layer l0 on, segments 0 .. l0 launched (the
 * first with graph_run): each layer's row booked (l0's already when booked), its handler run (or
 * its held attend taken; pre: l0's actions, taken already), its lists staged and the next segment
 * launched behind it. The first layer whose handler asks for another kind of attention than the
 * recording has runs the rest of the step plain. */
static ks_status seg_replay(ks_session *s, ks_decode_state *d, int32_t id, int32_t pos, int l0, int booked,
                            ks_actions *pre) {
    const ks_config *c = &s->m->cfg;
    ks_fwd_buf *b = &d->b;
    ks_status st;
    for (int l = l0; l < c->n_layers; l++) {
        if (l > l0 || !booked) dec_book_layer(s, d, l, pos);
        ks_actions act = {0};
        if (pre && l == l0) act = *pre;
        else if ((st = dec_layer_event(s, b, l, &pos, &id, &act))) return st;
        /* the recorded attention of this layer reads staged lists, or the whole layer: the
         * handler must have asked for the same kind */
        int att = dec_acted(&act);
        if (att != d->seg_att[l] || (att && !dec_stageable(s, &act))) {
            /* a policy whose pattern changed for good (TokenSelect: dense until the context
             * outgrows its budget, then attending lists) is recorded anew */
            if (++d->seg_miss >= 2) ks_decode_drop_graph(s);
            return decode_from(s, d, b, id, pos, d->lg, l, &act);
        }
        int plain;
        st = dec_stage_next(s, d, id, pos, l, att, &act, &plain);
        if (plain || st) return st;
    }
    d->seg_miss = 0;
    s->graph_steps++;
    return KS_OK;
}

/* A replay whose every layer is held (policy.h ks_action_hold: no handler runs): every layer's
 * row booked and its held lists staged, then the segments joined into two graphs (backend
 * graph_join, made on first use; JOIN_HEAD) in two launches: no gap between the segments inside
 * either, no host work between them. A layer whose held attend does not replay as recorded (dropped, another kind,
 * not staged) launches the segments before it one by one and goes on as seg_replay from it.
 * KS_ERR_UNSUPPORTED: nothing was done (the backend cannot join them: said once). */
/* Segments in the first of the two joined graphs. A graph's launch costs host time that grows
 * with its kernels, and the device waits for all of it before the first kernel: a short first
 * graph starts the device while the host launches the long second one behind it (one graph of
 * every segment left ~200 us of idle before a 128K step's first kernel, bench/NOTES.md, issue 14
 * session 24). */
#define JOIN_HEAD 2

/* The joined step: its first graph with graph_run (the step slot), the second behind it. */
static ks_status joined_launch(ks_backend *be, ks_decode_state *d, int32_t id, int32_t pos) {
    ks_status st = be->graph_run(be, d->joined[0], id, pos);
    if (!st && d->joined[1]) st = be->graph_launch(be, d->joined[1]);
    return st;
}

/* The recorded segments joined into d->joined (first use). KS_ERR_UNSUPPORTED: the backend
 * cannot join them (said once; the held steps launch the segments one by one from then on). */
static ks_status dec_join(ks_session *s, ks_decode_state *d) {
    const int nl = s->m->cfg.n_layers;
    ks_backend *be = s->be;
    if (d->joined[0]) return KS_OK;
    if (d->join_failed) return KS_ERR_UNSUPPORTED;
    int head = JOIN_HEAD > 0 && JOIN_HEAD < nl + 1 ? JOIN_HEAD : nl + 1;
    ks_status st = be->graph_join(be, d->seg, head, &d->joined[0]);
    if (!st && head < nl + 1) st = be->graph_join(be, d->seg + head, nl + 1 - head, &d->joined[1]);
    if (!st) return KS_OK;
    d->join_failed = 1;
    for (int i = 0; i < 2; i++)
        if (d->joined[i]) be->graph_free(be, d->joined[i]);
    d->joined[0] = d->joined[1] = NULL;
    if (st != KS_ERR_UNSUPPORTED) return st;
    ks_logf(KS_LOG_INFO, "decode: held steps launch their %d recorded segments one by one (%s)", nl + 1, ks_last_error());
    ks_clear_error();
    return KS_ERR_UNSUPPORTED;
}

/* A joined step launched at pos: counted, and remembered for the next step's fast path when its
 * staged slots need nothing new (same) */
static void joined_done(ks_session *s, ks_decode_state *d, int32_t pos, int same) {
    d->seg_miss = 0;
    s->graph_steps++;
    s->joined_steps++;
    d->joined_pos = same ? pos : -1;
    d->joined_gen = s->hold_gen;
}

static ks_status decode_joined(ks_session *s, ks_decode_state *d, int32_t id, int32_t pos) {
    const ks_config *c = &s->m->cfg;
    const int nl = c->n_layers;
    ks_backend *be = s->be;
    ks_fwd_buf *b = &d->b;
    ks_status st = dec_join(s, d);
    if (st) return st;
    if (d->joined_pos >= 0 && d->joined_pos == pos - 1 && d->joined_gen == s->hold_gen) {
        /* the step before was this joined graph under the same holds, each read in place (row
         * ranges, ks_attn_args.seg): every layer's attend is that step's with one more row at
         * the end, which the staged slot says already (attn_stage keeps the trailing range
         * relative to the query position), and still fits (rows only grew): book the rows and
         * launch, no host work per layer */
        dec_book_rows(s, d, pos);
        st = joined_launch(be, d, id, pos);
        if (st) {
            for (int j = 0; j < nl; j++) dec_unbook_row(s, j);
            d->joined_pos = -1;
            if (st == KS_ERR_UNSUPPORTED) ks_decode_drop_graph(s);
            return st;
        }
        s->held_steps += nl;
        joined_done(s, d, pos, 1);
        return KS_OK;
    }
    d->joined_pos = -1;
    ks_actions *act = ks_calloc((size_t)nl, sizeof *act);
    if (!act) return KS_ERR_OOM;
    int l = 0, held = 0, same = 1; /* same: the next step's staging would write what this one did */
    for (; l < nl; l++) {
        dec_book_layer(s, d, l, pos);
        if ((held = dec_layer_held(s, b, l, &pos, &id, &act[l])) <= 0) break;
        if (ks_hold_moves(s, l) && !act[l].attend_seg) same = 0; /* a whole list with the rows at its end */
        int att = dec_acted(&act[l]);
        if (att != d->seg_att[l] || (att && !dec_stageable(s, &act[l]))) break;
        if (att && (st = dec_stage(s, b, l, pos, &act[l]))) {
            if (st != KS_ERR_UNSUPPORTED) break;
            ks_clear_error();
            st = KS_OK;
            break;
        }
    }
    if (held < 0) st = KS_ERR_OOM;
    int last = KS_MIN(l, nl - 1); /* the last layer whose row is booked */
    if (!st && l == nl) { /* the whole step in two launches */
        st = joined_launch(be, d, id, pos);
        if (st) for (int j = 0; j < nl; j++) dec_unbook_row(s, j); /* nothing ran */
        if (st == KS_ERR_UNSUPPORTED) ks_decode_drop_graph(s);
        if (!st) joined_done(s, d, pos, same); /* the next step may take the fast path above */
    } else if (!st) { /* segments 0 .. l one by one (l's row is booked), the rest as seg_replay */
        int j = 0;
        st = be->graph_run(be, d->seg[0], id, pos);
        while (!st && ++j <= l) st = be->graph_launch(be, d->seg[j]);
        if (st && j == 0) for (int k = 0; k <= last; k++) dec_unbook_row(s, k); /* nothing ran */
        if (st == KS_ERR_UNSUPPORTED) { /* a stale recording */
            ks_clear_error();
            ks_decode_drop_graph(s);
            if (j > 0) { /* segments 0 .. j - 1 ran: the rest of the step plain from layer j - 1's attention */
                for (int k = j; k <= last; k++) dec_unbook_row(s, k);
                ks_actions a0 = act[j - 1];
                memset(&act[j - 1], 0, sizeof a0);
                st = decode_from(s, d, b, id, pos, d->lg, j - 1, &a0);
            }
        } else if (!st) {
            ks_actions *pre = held > 0 ? &act[l] : NULL; /* l's held attend was taken: seg_replay uses it */
            st = seg_replay(s, d, id, pos, l, 1, pre);
            if (pre) memset(pre, 0, sizeof *pre); /* seg_replay took it */
        }
    }
    for (int j = 0; j < nl; j++) ks_actions_free(&act[j], c->n_kv_heads); /* after the launches that read them */
    free(act);
    return st;
}

/* ---------------------------------------------------------------- recorded handlers */

/* Rows a handler recording may grow by before it is made anew: its growing results (a vote's
 * columns) are allocated for them and its kernels split the grown counts, so more is memory and
 * a larger split for nothing; one recording a HREC_GROW steps costs one step with Lua. */
#define HREC_GROW 256

static int dec_rep_all(const ks_session *s, const ks_decode_state *d) {
    for (int l = 0; l < s->m->cfg.n_layers; l++)
        if (!d->rep[l]) return 0;
    return 1;
}

static ks_status dec_hjoin(ks_session *s, ks_decode_state *d); /* below, with HJOIN_CUT */

/* A handler recording failed: counted (none tried after two), said once. */
static void hrec_fail(ks_session *s, ks_decode_state *d, int l, const char *why) {
    if (d->hfails++ == 0)
        ks_logf(KS_LOG_INFO, "decode: layer %d's decode handler declared replay but cannot be recorded (%s); it runs "
                "from Lua at every step", l, why);
    else if (s->be->opts.verbose) ks_logf(KS_LOG_DEBUG, "decode handler not recorded: layer %d: %s", l, why);
}

/* A step whose every layer's handler declared replay at the step before (policy.h
 * ks_action_replay), segments valid: run as seg_replay does, but each layer's handler fired
 * inside a recording (graph_begin_handler, ks_event.grow) that is launched, then its lists
 * staged and the next segment launched. Later steps replay the lot without Lua
 * (decode_replayed). A layer whose handler did not declare replay, or asked for another kind of
 * attention, ends the recording: the rest of the step as seg_replay from it. A recording that
 * fails (a call the backend could not record, or an error the handler met while recorded:
 * nothing of it ran) fires that layer's event again outside it (a policy's own error then shows
 * as it would have). KS_ERR_UNSUPPORTED: nothing was done. */
static ks_status decode_record_handlers(ks_session *s, ks_decode_state *d, int32_t id, int32_t pos) {
    const ks_config *c = &s->m->cfg;
    const int nl = c->n_layers;
    ks_backend *be = s->be;
    ks_fwd_buf *b = &d->b;
    int64_t grow = HREC_GROW;
    for (int l = 0; l < nl; l++) /* rows each layer can still take after this step's */
        for (int h = 0; h < c->n_kv_heads; h++) grow = KS_MIN(grow, (int64_t)s->kv[l].capacity - s->kv[l].n[h] - 1);
    if (grow < 1) return KS_ERR_UNSUPPORTED;
    int64_t lim = grow; /* the growth the recording allows: grow, or less where a handler said so */
    ks_status st = be->graph_run(be, d->seg[0], id, pos);
    if (st == KS_ERR_UNSUPPORTED) { ks_decode_drop_graph(s); return st; }
    if (st) return st;
    for (int l = 0; l < nl; l++) {
        dec_book_layer(s, d, l, pos);
        ks_actions act = {0};
        ks_graph *hg = NULL;
        if ((st = be->graph_begin_handler(be))) {
            hrec_fail(s, d, l, ks_last_error());
            ks_clear_error();
            dec_drop_handlers(s, d);
            return seg_replay(s, d, id, pos, l, 1, NULL);
        }
        ks_status se = dec_layer_fire(s, b, l, &pos, &id, &act, grow);
        char why[400];
        snprintf(why, sizeof why, "%s", se ? ks_last_error() : "");
        st = be->graph_end(be, &hg);
        if (st || se) {
            /* not recorded (a call the backend could not record, or one the runtime refuses while
             * recording: nothing of it ran): the event again, outside a recording, where a
             * policy's own error shows as it would have */
            if (hg) be->graph_free(be, hg);
            ks_actions_free(&act, c->n_kv_heads);
            hrec_fail(s, d, l, se ? why : ks_last_error());
            ks_clear_error();
            dec_drop_handlers(s, d);
            if (st && st != KS_ERR_UNSUPPORTED) return st;
            if (se == KS_ERR_OOM || se == KS_ERR_INTERRUPTED) return se;
            return seg_replay(s, d, id, pos, l, 1, NULL);
        }
        if ((st = be->graph_launch(be, hg))) {
            be->graph_free(be, hg);
            ks_actions_free(&act, c->n_kv_heads);
            dec_drop_handlers(s, d);
            return st;
        }
        d->hseg[d->nh++] = hg;
        int att = dec_acted(&act);
        if (!act.replay || att != d->seg_att[l] || (att && !dec_stageable(s, &act))) {
            /* its work ran; this layer does not replay: no recording, the step goes on as
             * seg_replay with the actions it asked for (counted as a failure: a policy that
             * declares replay at some steps only is not recorded anew at every step) */
            d->hfails++;
            if (s->be->opts.verbose) ks_logf(KS_LOG_DEBUG, "decode handler not recorded: layer %d did not declare replay", l);
            dec_drop_handlers(s, d);
            return seg_replay(s, d, id, pos, l, 1, &act);
        }
        if (act.replay_rows > 0) lim = KS_MIN(lim, act.replay_rows); /* ks_action_replay_within */
        int plain;
        st = dec_stage_next(s, d, id, pos, l, att, &act, &plain);
        if (plain || st) { dec_drop_handlers(s, d); return st; }
    }
    d->hpos = pos;
    d->hgrow = lim;
    d->hlim = lim < grow;
    d->seg_miss = 0;
    s->graph_steps++;
    /* the join while the device runs this step; one that fails here is tried again (and its
     * error said) at the first replay */
    if (dec_hjoin(s, d)) {
        ks_clear_error();
        d->hjoin_failed = 0;
    }
    return KS_OK;
}

/* Where the replayed step's 2 n_layers + 1 graphs are cut into three joined ones: the host's
 * launch of a graph costs time that grows with its nodes (~4.5 us a segment on an H200) while the
 * device waits for a graph's launch to end before its first kernel; so a first graph of one
 * segment (embed, layer 0's q|k|v) starts the device at once, a second of two layers runs while
 * the host launches the long last one. With two graphs cut at JOIN_HEAD the device waited ~280 us
 * for the second's launch at every step (bench/NOTES.md, session 27). */
static const int HJOIN_CUT[2] = {1, 6};

/* The recorded step's 2 n_layers + 1 graphs joined as three (HJOIN_CUT), once a recording is
 * whole; a join the backend refuses is said once and the replays launch the graphs one by one.
 * Called at the end of the recording step, after its last launch: the join's host work (an
 * instantiation, ~1.8 ms at 128K on an H200) runs while the device still works through that
 * step, instead of before the first replay's launch (bench/NOTES.md, issue 14, session 31);
 * the first replay joins where the recording did not. */
static ks_status dec_hjoin(ks_session *s, ks_decode_state *d) {
    const int nl = s->m->cfg.n_layers;
    ks_backend *be = s->be;
    if (d->hjoined[0] || d->hjoin_failed || !be->graph_join || d->nh != nl) return KS_OK;
    ks_graph **all = ks_malloc(sizeof(ks_graph *) * (size_t)(2 * nl + 1));
    if (!all) return KS_ERR_OOM;
    for (int l = 0; l < nl; l++) { all[2 * l] = d->seg[l]; all[2 * l + 1] = d->hseg[l]; }
    all[2 * nl] = d->seg[nl];
    const int total = 2 * nl + 1;
    int cut[4] = {0, KS_MIN(HJOIN_CUT[0], total), KS_MIN(HJOIN_CUT[1], total), total}, k = 0;
    ks_status st = KS_OK;
    for (int i = 0; !st && i < 3; i++)
        if (cut[i + 1] > cut[i]) {
            d->hjoined[k] = d->hjold[i]; /* the backend's from here: updated into the new join, or freed */
            d->hjold[i] = NULL;
            st = be->graph_join(be, all + cut[i], cut[i + 1] - cut[i], &d->hjoined[k++]);
        }
    free(all);
    if (st) {
        for (int i = 0; i < 3; i++)
            if (d->hjoined[i]) be->graph_free(be, d->hjoined[i]);
        d->hjoined[0] = d->hjoined[1] = d->hjoined[2] = NULL;
        d->hjoin_failed = 1;
        if (st != KS_ERR_UNSUPPORTED) return st;
        ks_logf(KS_LOG_INFO, "decode: replayed steps launch their %d recorded segments and handlers one by one (%s)",
                total, ks_last_error());
        ks_clear_error();
    }
    return KS_OK;
}

/* A step of a session whose handlers are recorded (decode_record_handlers): every layer's row
 * booked, then seg[0], hseg[0], seg[1], ..., seg[nl] launched (joined as three graphs where the
 * backend can: HJOIN_CUT), no Lua and no host work per layer: each layer's staged slot still
 * holds the recorded lists (their addresses the recording's own, the trailing range relative
 * to the query). Past the growth the recording allows: dropped, KS_ERR_UNSUPPORTED (nothing
 * done; the step fires the events and a later one records anew). */
static ks_status decode_replayed(ks_session *s, ks_decode_state *d, int32_t id, int32_t pos) {
    const int nl = s->m->cfg.n_layers;
    ks_backend *be = s->be;
    if (pos < d->hpos || pos - d->hpos > d->hgrow) {
        ks_graph *keep[3] = {NULL, NULL, NULL};
        if (d->hlim) { /* a handler's own limit: fire the events first, and keep the joins to update */
            memset(d->rep, 0, (size_t)nl);
            memcpy(keep, d->hjoined, sizeof keep);
            memset(d->hjoined, 0, sizeof d->hjoined);
        }
        dec_drop_handlers(s, d);
        memcpy(d->hjold, keep, sizeof keep);
        return KS_ERR_UNSUPPORTED;
    }
    ks_status st = dec_hjoin(s, d);
    if (st) return st;
    dec_book_rows(s, d, pos);
    if (d->hjoined[0]) {
        st = be->graph_run(be, d->hjoined[0], id, pos);
        for (int i = 1; !st && i < 3 && d->hjoined[i]; i++) st = be->graph_launch(be, d->hjoined[i]);
    } else {
        st = be->graph_run(be, d->seg[0], id, pos);
        for (int l = 0; !st && l < nl; l++) {
            st = be->graph_launch(be, d->hseg[l]);
            if (!st) st = be->graph_launch(be, d->seg[l + 1]);
        }
    }
    if (st) { /* a stale recording (the backend's tables replaced): found before anything ran */
        for (int l = 0; l < nl; l++) dec_unbook_row(s, l);
        if (st == KS_ERR_UNSUPPORTED) ks_decode_drop_graph(s);
        return st;
    }
    s->replayed_steps += nl;
    d->seg_miss = 0;
    s->graph_steps++;
    if (d->hjoined[0]) s->joined_steps++;
    return KS_OK;
}

/* A step whose decode-time handler runs between recorded segments (ks_backend.graph_begin_seg):
 * segment 0 is the embed and layer 0's q|k|v, segment l + 1 layer l's attention and the rest of
 * it with layer l + 1's q|k|v (the last: the final norm and lm_head). Between segments l and
 * l + 1 the handler of layer l runs on the host as in a plain step, with its row booked; while
 * it asks for nothing (a no-op, or a handler that only reads and reports) the step replays. The
 * first layer whose handler acts ends the replay: the rest of the step runs plain from that
 * layer's attention on, and the recording stays for the next step (one whose rows change fails
 * dec_graph_valid then). Recording runs each segment as soon as it is recorded, since the
 * handler between needs its results; a handler that acts while the step is recorded counts as a
 * failed recording (after two the session records no more), so that a policy acting at every
 * step is not recorded anew at every step. KS_ERR_UNSUPPORTED: nothing was done, take the
 * plain path. */
static ks_status decode_segments(ks_session *s, ks_decode_state *d, int32_t id, int32_t pos) {
    const ks_config *c = &s->m->cfg;
    const int nl = c->n_layers;
    ks_backend *be = s->be;
    ks_fwd_buf *b = &d->b;
    ks_status st;
    if (d->nseg == nl + 1 && dec_graph_valid(s, d, pos)) {
        if (d->nh == nl && (st = decode_replayed(s, d, id, pos)) != KS_ERR_UNSUPPORTED) return st;
        if (be->graph_join && ks_holds_all(s) && (st = decode_joined(s, d, id, pos)) != KS_ERR_UNSUPPORTED) return st;
        if (!d->nh && be->graph_begin_handler && d->hfails < 2 && dec_rep_all(s, d) &&
            (st = decode_record_handlers(s, d, id, pos)) != KS_ERR_UNSUPPORTED)
            return st;
        st = be->graph_run(be, d->seg[0], id, pos);
        if (st == KS_ERR_UNSUPPORTED) { ks_decode_drop_graph(s); return st; }
        if (st) return st;
        return seg_replay(s, d, id, pos, 0, 0, NULL);
    }
    ks_decode_drop_graph(s);
    if (d->fails >= 2 || d->ready < 1 || !dec_seg_prepare(s, d, pos)) return KS_ERR_UNSUPPORTED;
    ks_graph *g = NULL;
    int full = 0;
    ks_actions none = {0};
    if ((st = be->graph_begin(be, id, pos))) {
        dec_fail(s, d, "%s", ks_last_error());
        return KS_ERR_UNSUPPORTED;
    }
    ks_status sb = be->embed(be, b->a.x, s->m->embed, &id, 1, c->dim);
    if (!sb) sb = dec_layer_in(s, d, b, 0, pos, &full, &none);
    st = be->graph_end(be, &g);
    if (!st && sb) { be->graph_free(be, g); g = NULL; st = KS_ERR_UNSUPPORTED; }
    if (!st && (st = be->graph_run(be, g, id, pos))) { be->graph_free(be, g); g = NULL; }
    if (st) { /* nothing ran: undo layer 0's booking, the plain path runs the step */
        dec_unbook(s, d);
        dec_fail(s, d, "%s", ks_last_error());
        return st;
    }
    d->seg[d->nseg++] = g;
    d->seg_miss = 0;
    for (int l = 0; l < nl; l++) {
        ks_actions act = {0};
        if ((st = dec_layer_event(s, b, l, &pos, &id, &act))) { ks_decode_drop_graph(s); return st; }
        d->seg_att[l] = (char)dec_acted(&act);
        if (d->seg_att[l] && (!dec_stageable(s, &act) || (st = dec_stage(s, b, l, pos, &act)))) {
            if (st && st != KS_ERR_UNSUPPORTED) { ks_actions_free(&act, c->n_kv_heads); ks_decode_drop_graph(s); return st; }
            if (st) dec_fail(s, d, "layer %d's attend lists: %s", l, ks_last_error());
            else
                dec_fail(s, d, "layer %d's decode handler asked for %s, which a recorded step does not take", l,
                         act.retain ? "a retain" : act.propagate ? "a propagate" : act.restart ? "a restart" : act.stop ? "a stop"
                         : act.discard_kv ? "discard_kv" : "an action");
            ks_clear_error();
            ks_decode_drop_graph(s);
            return decode_from(s, d, b, id, pos, d->lg, l, &act);
        }
        if ((st = be->graph_begin_seg(be))) {
            dec_fail(s, d, "%s", ks_last_error());
            ks_clear_error();
            ks_decode_drop_graph(s);
            return decode_from(s, d, b, id, pos, d->lg, l, &act);
        }
        sb = dec_layer_out(s, b, l, pos, 0, &none, d->seg_att[l]);
        if (!sb) sb = l + 1 < nl ? dec_layer_in(s, d, b, l + 1, pos, &full, &none) : ks_head_compute(s, b, 0, 1, d->lg);
        st = be->graph_end(be, &g);
        if (!st && sb) { be->graph_free(be, g); g = NULL; st = KS_ERR_UNSUPPORTED; }
        if (!st && (st = be->graph_launch(be, g))) { be->graph_free(be, g); g = NULL; }
        if (st) { /* this segment did not run: undo layer l + 1's booking, the rest runs plain */
            if (l + 1 < nl) dec_unbook_layer(s, d, l + 1);
            dec_fail(s, d, "segment %d: %s", l + 1, ks_last_error());
            ks_clear_error();
            ks_decode_drop_graph(s);
            return decode_from(s, d, b, id, pos, d->lg, l, &act);
        }
        ks_actions_free(&act, c->n_kv_heads); /* after the launch that reads the lists in place */
        d->seg[d->nseg++] = g;
    }
    s->graph_steps++;
    return KS_OK;
}

/* ================================================================ the call */

/* ks_session_decode, and with next (non-NULL) ks_session_decode_greedy */
static ks_status decode_one(ks_session *s, int32_t id, int32_t *next) {
    const ks_config *c = &s->m->cfg;
    ks_backend *be = s->be;
    if (id < 0 || id >= c->vocab) return ks_errorf(KS_ERR_ARG, "decode: token id %d out of range [0, %d)", id, c->vocab);
    if (s->n_past + 1 > c->max_pos)
        return ks_errorf(KS_ERR_CONTEXT, "decode: position %d exceeds the model's context of %d tokens", s->n_past, c->max_pos);
    double t0 = ks_now();
    const ks_policy *pol = s->policy;
    int32_t pos = s->n_past;
    int pre = pol && pol->want_pre_rope_keys;
    ks_decode_state *d = NULL;
    ks_prof_begin(s, 1);
    if (s->prof.on) s->prof.forwards[1]++;
    ks_status st = dec_get(s, pre, &d);
    if (!st && d->ring_b && (!ks_ring_on(s) || pol->ring_sinks != d->ring_s || pol->ring_budget != d->ring_b))
        st = ks_ring_restore_all(s); /* rows rotated under another ring (or none now): in order first */
    ks_devcheck_reset(s);
    PROF(s, KS_PH_ALLOC);
    if (!st) st = ks_session_push_tokens(s, &id, 1);
    if (st) goto out;
    /* a graph when the step is the same every token: no decode-time policy handler, keys rotated
     * as stored, no profiling marks */
    int handler = pol && pol->on[KS_EV_DECODE_QKV] && !ks_ring_on(s);
    int graphs = be->graph_begin && !pre && !handler && !s->prof.on;
    /* with a handler: the step in segments, the handler between them */
    int segs = be->graph_begin && be->graph_begin_seg && handler && !s->prof.on;
    st = graphs ? decode_graph(s, d, id, pos) : segs ? decode_segments(s, d, id, pos) : KS_ERR_UNSUPPORTED;
    if (st == KS_ERR_UNSUPPORTED) {
        ks_clear_error();
        st = decode_body(s, d, &d->b, id, pos, d->lg);
        if (!st) d->ready++;
    }
    if (!st && next && be->argmax_rows && !be->host_memory && be->graph_begin) {
        /* the id alone comes back; the logits stay in d->lg (kept: a backend with graphs) */
        st = be->argmax_rows(be, d->lg, 1, c->vocab, next);
        s->logits_stale = !st;
    } else if (!st) {
        st = be->download(be, s->logits, d->lg, sizeof(float) * c->vocab);
        s->logits_stale = 0;
        if (!st && next) {
            ks_sampler g;
            ks_sampler_init(&g, 0, 1, 0);
            *next = ks_sample(&g, s->logits, c->vocab);
        }
    }
    if (!st) st = ks_devcheck_sync(s); /* the step's device list checks, now that it has run */
    PROF(s, KS_PH_SYNC);
    if (!st) s->n_past++;
out:
    /* the buffers stay for the next step only where a graph may read them; elsewhere a step
     * leaves no scratch behind (allocating one row's buffers costs nothing there) */
    if (!be->graph_begin && !(s->dec && s->dec->ring_b)) ks_decode_free(s); /* rotated rows: keep their ring */
    PROF(s, KS_PH_ALLOC);
    ks_prof_end(s);
    s->t_decode += ks_now() - t0;
    return st;
}

ks_status ks_session_decode(ks_session *s, int32_t id) { return decode_one(s, id, NULL); }

ks_status ks_session_decode_greedy(ks_session *s, int32_t id, int32_t *next) {
    if (!next) return ks_errorf(KS_ERR_ARG, "decode: no place for the next id");
    return decode_one(s, id, next);
}

ks_status ks_session_logits_fill(ks_session *s) {
    if (!s->logits_stale) return KS_OK;
    const ks_decode_state *d = s->dec;
    if (!d || !d->lg) return ks_errorf(KS_ERR_INTERNAL, "decode: the step's logits are gone");
    ks_status st = s->be->download(s->be, s->logits, d->lg, sizeof(float) * s->m->cfg.vocab);
    if (!st) s->logits_stale = 0;
    return st;
}
