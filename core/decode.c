/* decode.c — one decode step: a token through every layer (with the policy's decode event), its
 * logits into s->logits; on a backend with graphs, the step recorded once and replayed while
 * the cache still matches what the recording assumed. */
#include "forward.h"

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
    int32_t pos0;            /* position at the recording */
    int long_rope;
    void **k, **v, **pd;     /* (n_layers) storage at the recording */
    int *cap;                /* (n_layers) */
    int *n0;                 /* (n_layers, n_kv_heads) rows before the recorded step's append */
    int ready;               /* plain steps since the graph was dropped (record after one) */
    int fails;               /* recordings that failed; no more graphs for the session after 2 */
    ks_devcheck *chk;        /* deferred checks of attend device lists (actions.c), or NULL */
} ks_decode_state;

void ks_decode_drop_graph(ks_session *s) {
    ks_decode_state *d = s->dec;
    if (!d || !d->g) return;
    s->be->graph_free(s->be, d->g);
    d->g = NULL;
    d->ready = 0;
}

void ks_decode_free(ks_session *s) {
    ks_decode_state *d = s->dec;
    if (!d) return;
    ks_decode_drop_graph(s);
    ks_fwd_free(s->be, &d->b);
    if (d->lg) s->be->free(s->be, d->lg);
    ks_devcheck_free(s->be, d->chk);
    free(d->k);
    free(d->n0);
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
    if (!d->k || !d->n0) { free(d->k); free(d->n0); free(d); return NULL; }
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

/* ================================================================ one step */

/* The device work of one decode step: embed `id` at `pos`, every layer (the policy's decode
 * event included), the final norm and lm_head into lg (vocab, backend). */
static ks_status decode_body(ks_session *s, ks_fwd_buf *b, int32_t id, int32_t pos, float *lg) {
    const ks_config *c = &s->m->cfg;
    ks_backend *be = s->be;
    const ks_policy *pol = s->policy;
    ks_status st;
    if ((st = be->embed(be, b->a.x, s->m->embed, &id, 1, c->dim))) return st;
    PROF(s, KS_PH_EMBED);
    for (int l = 0; l < c->n_layers; l++) {
        /* norm, projections, RoPE (unless pre-RoPE) and the new cache row */
        if ((st = ks_layer_qkv(s, l, b, 1, &pos, pos, &s->kv[l]))) return st;
        ks_actions act = {0}; /* the decode event's: attend in this attention, retain after it */
        if (pol && pol->on[KS_EV_DECODE_QKV]) {
            ks_event ev;
            ks_event_init(s, &ev, KS_EV_DECODE_QKV, l, 0, 1);
            ev.q = b->a.q; ev.k = b->a.k; ev.v = b->a.v; ev.k_pre = b->kpre;
            ev.pos = &pos; ev.ids = &id; ev.kv = &s->kv[l];
            st = ks_event_fire(s, &ev);
            PROF(s, KS_PH_POLICY);
            act = ks_actions_take(&ev);
            if (st) { ks_actions_free(&act, c->n_kv_heads); return st; }
        }
        ks_attn_args aa = ks_layer_attn_args(s, b, 1, &pos, pos, &act);
        st = ks_layer_attention(s, l, b, &aa);
        if (!st && act.retain) {
            st = ks_actions_apply_retain(s, l, &act);
            PROF(s, KS_PH_KV_EDIT);
        }
        ks_actions_free(&act, c->n_kv_heads);
        if (st) return st;
        if ((st = ks_layer_tail(s, l, b, 1))) return st;
    }
    return ks_head_compute(s, b, 0, 1, lg);
}

/* ================================================================ the recorded step (backend graphs) */

static int dec_long_rope(const ks_config *c, int32_t pos) {
    return c->rope.type == KS_ROPE_LONGROPE && pos + 1 > c->rope.orig_max_pos;
}

/* The recorded step still describes the cache (ks_backend.graph_begin's contract) at `pos`. */
static int dec_graph_valid(ks_session *s, ks_decode_state *d, int32_t pos) {
    const ks_config *c = &s->m->cfg;
    if (!d->g || pos < d->pos0 || dec_long_rope(c, pos) != d->long_rope) return 0;
    int delta = pos - d->pos0;
    for (int l = 0; l < c->n_layers; l++) {
        const ks_kv_layer *L = &s->kv[l];
        if (L->k != d->k[l] || L->v != d->v[l] || L->pos_dev != d->pd[l] || L->capacity != d->cap[l] || !L->n) return 0;
        for (int h = 0; h < c->n_kv_heads; h++)
            if (L->n[h] != d->n0[l * c->n_kv_heads + h] + delta || L->n[h] + 1 > L->capacity) return 0;
    }
    return 1;
}

/* Book the row a graph run wrote at `pos` in every layer (what attn_in with L does on the host). */
static void dec_book_rows(ks_session *s, int32_t pos) {
    const ks_config *c = &s->m->cfg;
    for (int l = 0; l < c->n_layers; l++) {
        ks_kv_layer *L = &s->kv[l];
        for (int h = 0; h < L->n_kv_heads; h++) L->pos[(size_t)h * L->capacity + L->n[h]++] = pos;
    }
}

/* One step through a graph: run the recorded one when it still holds, else record it (after one
 * plain step since it was dropped, so lazy backend set-up happens outside a recording).
 * KS_ERR_UNSUPPORTED: nothing was done, take the plain path. */
static ks_status decode_graph(ks_session *s, ks_decode_state *d, int32_t id, int32_t pos) {
    const ks_config *c = &s->m->cfg;
    ks_backend *be = s->be;
    ks_status st;
    if (dec_graph_valid(s, d, pos)) {
        st = be->graph_run(be, d->g, id, pos);
        if (st == KS_ERR_UNSUPPORTED) { ks_decode_drop_graph(s); return st; }
        if (st) return st;
        dec_book_rows(s, pos);
        s->graph_steps++;
        return KS_OK;
    }
    ks_decode_drop_graph(s);
    if (d->fails >= 2 || d->ready < 1) return KS_ERR_UNSUPPORTED;
    for (int l = 0; l < c->n_layers; l++) { /* room for the row in the storage the graph will read */
        const ks_kv_layer *L = &s->kv[l];
        if (!L->k || !L->n) return KS_ERR_UNSUPPORTED;
        for (int h = 0; h < c->n_kv_heads; h++)
            if (L->n[h] + 1 > L->capacity) return KS_ERR_UNSUPPORTED;
        d->k[l] = L->k; d->v[l] = L->v; d->pd[l] = L->pos_dev; d->cap[l] = L->capacity;
        memcpy(d->n0 + (size_t)l * c->n_kv_heads, L->n, sizeof(int) * c->n_kv_heads);
    }
    if ((st = be->graph_begin(be, id, pos))) {
        d->fails++;
        return KS_ERR_UNSUPPORTED;
    }
    ks_status sb = decode_body(s, &d->b, id, pos, d->lg);
    ks_graph *g = NULL;
    st = be->graph_end(be, &g);
    if (!st && sb) { be->graph_free(be, g); g = NULL; st = KS_ERR_UNSUPPORTED; }
    if (st) { /* undo the host effects (the rows booked); the plain path runs the step */
        for (int l = 0; l < c->n_layers; l++)
            memcpy(s->kv[l].n, d->n0 + (size_t)l * c->n_kv_heads, sizeof(int) * c->n_kv_heads);
        d->fails++;
        if (be->opts.verbose) ks_logf(KS_LOG_DEBUG, "decode graph not recorded: %s", ks_last_error());
        return KS_ERR_UNSUPPORTED;
    }
    d->g = g;
    d->pos0 = pos;
    d->long_rope = dec_long_rope(c, pos);
    /* the recording booked the rows already: run it for this token without booking again */
    if ((st = be->graph_run(be, g, id, pos))) { /* nothing ran: unbook the rows */
        for (int l = 0; l < c->n_layers; l++)
            memcpy(s->kv[l].n, d->n0 + (size_t)l * c->n_kv_heads, sizeof(int) * c->n_kv_heads);
        ks_decode_drop_graph(s);
        return st;
    }
    s->graph_steps++;
    return KS_OK;
}

/* ================================================================ the call */

ks_status ks_session_decode(ks_session *s, int32_t id) {
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
    ks_devcheck_reset(s);
    PROF(s, KS_PH_ALLOC);
    if (!st) st = ks_session_push_tokens(s, &id, 1);
    if (st) goto out;
    /* a graph when the step is the same every token: no decode-time policy handler, keys rotated
     * as stored, no profiling marks */
    int graphs = be->graph_begin && !pre && !(pol && pol->on[KS_EV_DECODE_QKV]) && !s->prof.on;
    st = graphs ? decode_graph(s, d, id, pos) : KS_ERR_UNSUPPORTED;
    if (st == KS_ERR_UNSUPPORTED) {
        ks_clear_error();
        st = decode_body(s, &d->b, id, pos, d->lg);
        if (!st) d->ready++;
    }
    if (!st) st = be->download(be, s->logits, d->lg, sizeof(float) * c->vocab);
    if (!st) st = ks_devcheck_sync(s); /* the step's device list checks, now that it has run */
    PROF(s, KS_PH_SYNC);
    if (!st) s->n_past++;
out:
    /* the buffers stay for the next step only where a graph may read them; elsewhere a step
     * leaves no scratch behind (allocating one row's buffers costs nothing there) */
    if (!be->graph_begin) ks_decode_free(s);
    PROF(s, KS_PH_ALLOC);
    ks_prof_end(s);
    s->t_decode += ks_now() - t0;
    return st;
}
