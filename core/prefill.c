/* prefill.c — prefill: a prompt (or one chunk of it) through every layer, with the policy's
 * prefill events, the logits of its last row into s->logits.
 *
 * A prefill is a loop over passes. A pass runs its rows through the layers, firing the events of
 * each layer and applying the actions they ask for, and ends in one of two ways:
 *   done          the head's logits are computed, the session moves on to the next position
 *   restart(idx)  a policy chose rows idx at some layer's prefill_qkv: the pass is abandoned
 *                 (its KV rows dropped) and the next pass runs on those rows only, at positions
 *                 renumbered from where the prefill began (one restart per request)
 * Within a layer (prefill_layer): q/k/v -> PREFILL_QKV event -> KV append and attention (with
 * the event's attend lists) -> o-projection and MLP -> PREFILL_LAYER_END event -> retain and
 * propagate -> the next layer, or the end of the pass at a stop(). */
#include "forward.h"

#include <stdlib.h>
#include <string.h>

/* The rows a pass runs on (host memory). Propagate shrinks them within a pass, a restart
 * between passes; each array holds the n active rows first. */
typedef struct prefill_rows {
    int32_t *ids;   /* (n) token ids */
    int32_t *pos;   /* (n) positions */
    int32_t *orig;  /* (n) each row's index in the prompt (or chunk) as given */
    int n;
    int base;       /* position of the first row given (s->n_past when the prefill began) */
} prefill_rows;

/* How a pass ended: done (restart == 0) or restart(idx). */
typedef struct pass_end {
    int restart;
    int32_t *idx;   /* (k) sorted indices into the pass's rows (owned) */
    int k;
    int layer;      /* the layer that asked: layers 0..layer hold KV rows of the abandoned pass */
} pass_end;

/* ================================================================ one layer's events */

/* PREFILL_QKV at layer l (q, k, v of the rows in b, before the KV append). The handler's actions
 * go to *act (also after a failure: the caller frees them), except restart(idx), which ends the
 * pass (*end), and discard_kv, which marks the pass (s->discard_kv). */
static ks_status prefill_qkv_event(ks_session *s, const ks_fwd_buf *b, const prefill_rows *r, int l, int pass,
                                   int chunked, ks_actions *act, pass_end *end) {
    const ks_policy *pol = s->policy;
    if (!pol || !pol->on[KS_EV_PREFILL_QKV]) return KS_OK;
    ks_event ev;
    ks_event_init(s, &ev, KS_EV_PREFILL_QKV, l, pass, r->n);
    ev.q = b->a.q; ev.k = b->a.k; ev.v = b->a.v; ev.k_pre = b->kpre;
    ev.pos = r->pos; ev.ids = r->ids; ev.orig = r->orig; ev.kv = &s->kv[l];
    ks_status st = ks_event_fire(s, &ev);
    PROF(s, KS_PH_POLICY);
    *act = ks_actions_take(&ev);
    if (st) return st;
    if (act->restart && chunked) return ks_errorf(KS_ERR_POLICY, "restart is not allowed in a chunked prefill");
    if (act->discard_kv) {
        if (chunked) return ks_errorf(KS_ERR_POLICY, "discard_kv is not allowed in a chunked prefill");
        if (r->base > 0)
            return ks_errorf(KS_ERR_POLICY, "discard_kv: only in the first prefill of a session (it holds %d tokens)",
                             r->base);
        s->discard_kv = 1;
    }
    if (act->restart) { /* the list moves to *end; the event's other actions go with the pass */
        end->restart = 1;
        end->idx = act->restart_idx;
        end->k = act->n_restart;
        end->layer = l;
        act->restart_idx = NULL;
    }
    return KS_OK;
}

/* PREFILL_LAYER_END at layer l (the hidden rows x after the layer). Actions accumulate in *act:
 * asking again for one the layer's PREFILL_QKV asked for is an error. */
static ks_status prefill_layer_end_event(ks_session *s, const ks_fwd_buf *b, const prefill_rows *r, int l, int pass,
                                         ks_actions *act) {
    const ks_policy *pol = s->policy;
    if (!pol || !pol->on[KS_EV_PREFILL_LAYER_END]) return KS_OK;
    ks_event ev;
    ks_event_init(s, &ev, KS_EV_PREFILL_LAYER_END, l, pass, r->n);
    ev.hidden = b->a.x; ev.pos = r->pos; ev.ids = r->ids; ev.orig = r->orig; ev.kv = &s->kv[l];
    ev.act = *act;
    ks_status st = ks_event_fire(s, &ev);
    PROF(s, KS_PH_POLICY);
    *act = ks_actions_take(&ev);
    return st;
}

/* PREFILL_END, after the head. Of the actions only stop() is legal there, and it has nothing left to stop. */
static ks_status prefill_end_event(ks_session *s, const prefill_rows *r, int pass) {
    const ks_policy *pol = s->policy;
    if (!pol || !pol->on[KS_EV_PREFILL_END]) return KS_OK;
    ks_event ev;
    ks_event_init(s, &ev, KS_EV_PREFILL_END, -1, pass, r->n);
    ev.pos = r->pos; ev.ids = r->ids; ev.orig = r->orig;
    ks_status st = ks_event_fire(s, &ev);
    PROF(s, KS_PH_POLICY);
    if (!st && (ev.act.restart || ev.act.propagate || ev.act.retain || ev.act.attend))
        st = ks_errorf(KS_ERR_INTERNAL, "prefill_end: unexpected action");
    ks_actions_free(&ev.act, ev.n_kv_heads);
    return st;
}

/* ================================================================ one layer */

/* What the layer's events asked for once the layer ran: retain (the layer keeps only those KV
 * rows), then propagate (only those rows go on: x (n, dim) and r shrink to k rows). */
static ks_status prefill_apply(ks_session *s, ks_fwd_buf *b, prefill_rows *r, int l, ks_actions *act) {
    ks_backend *be = s->be;
    ks_status st;
    if (act->retain && s->discard_kv)
        return ks_errorf(KS_ERR_POLICY, "retain at layer %d: this pass's KV rows were discarded (discard_kv)", l);
    if (act->retain) {
        st = ks_actions_apply_retain(s, l, act);
        PROF(s, KS_PH_KV_EDIT);
        if (st) return st;
    }
    if (act->propagate) {
        if ((st = ks_actions_host_propagate(s, l, r->n, act))) return st; /* a device list: to the host */
        int k = act->n_prop;
        const int32_t *ix = act->prop_idx;
        st = be->gather_rows(be, b->a.x, b->a.x, ix, k, s->m->cfg.dim);
        PROF(s, KS_PH_KV_EDIT);
        if (st) return st;
        for (int i = 0; i < k; i++) { r->ids[i] = r->ids[ix[i]]; r->pos[i] = r->pos[ix[i]]; r->orig[i] = r->orig[ix[i]]; }
        r->n = k;
    }
    return KS_OK;
}

/* Layer l of a pass over rows r: x (n, dim) in b is the residual stream in and out. The actions
 * the layer's events ask for collect in *act (the caller frees them). */
static ks_status layer_run(ks_session *s, ks_fwd_buf *b, prefill_rows *r, int l, int pass, int chunked,
                           ks_actions *act, pass_end *end) {
    ks_backend *be = s->be;
    ks_status st;
    if ((st = ks_session_check_interrupt(s))) return st;
    int max_pos = r->pos[r->n - 1];
    for (int i = 0; i < r->n; i++) max_pos = KS_MAX(max_pos, r->pos[i]);
    PROF(s, KS_PH_OTHER);
    /* the rows join the cache after the event (it may restart the pass or discard them) */
    if ((st = ks_layer_qkv(s, l, b, r->n, r->pos, max_pos, NULL))) return st;
    if ((st = prefill_qkv_event(s, b, r, l, pass, chunked, act, end)) || end->restart) return st;
    if ((st = be->kv_append(be, &s->kv[l], b->a.k, b->a.v, r->pos, r->n))) return st;
    PROF(s, KS_PH_KV_APPEND);
    ks_attn_args aa = ks_layer_attn_args(s, b, r->n, r->pos, max_pos, act);
    if ((st = ks_layer_attention(s, l, b, &aa))) return st;
    if (s->discard_kv) { /* this pass's KV rows are not kept (a restart follows): free them now */
        ks_session_kv_clear(s, l);
        PROF(s, KS_PH_KV_EDIT);
    }
    if ((st = ks_layer_tail(s, l, b, r->n))) return st;
    if ((st = prefill_layer_end_event(s, b, r, l, pass, act))) return st;
    return prefill_apply(s, b, r, l, act);
}

/* One layer with its actions owned here: *stop says the policy ended the pass at this layer. */
static ks_status prefill_layer(ks_session *s, ks_fwd_buf *b, prefill_rows *r, int l, int pass, int chunked,
                               pass_end *end, int *stop) {
    ks_actions act = {0};
    ks_status st = layer_run(s, b, r, l, pass, chunked, &act, end);
    *stop = act.stop;
    ks_actions_free(&act, s->m->cfg.n_kv_heads);
    return st;
}

/* ================================================================ passes */

/* The layers of one pass, then (done) the head's logits of the last row and PREFILL_END. */
static ks_status pass_run(ks_session *s, ks_fwd_buf *b, prefill_rows *r, int pass, int chunked, pass_end *end) {
    const ks_config *c = &s->m->cfg;
    ks_backend *be = s->be;
    ks_status st;
    if ((st = be->embed(be, b->a.x, s->m->embed, r->ids, r->n, c->dim))) return st;
    PROF(s, KS_PH_EMBED);
    for (int l = 0; l < c->n_layers; l++) {
        int stop = 0;
        if ((st = prefill_layer(s, b, r, l, pass, chunked, end, &stop)) || end->restart) return st;
        s->prop_layer_n[l] = r->n;
        if (stop) { s->stopped_at = l; break; }
    }
    if (s->discard_kv) {
        /* the pass ended (all layers, or stop()) without the restart discard_kv promised */
        for (int j = 0; j < c->n_layers; j++) ks_session_kv_clear(s, j);
        return ks_errorf(KS_ERR_POLICY, "discard_kv: the first pass %s without a restart, and its KV rows are gone",
                         s->stopped_at >= 0 ? "stopped" : "completed");
    }
    if ((st = ks_head_logits(s, b, r->n - 1))) return st;
    s->n_past = r->pos[r->n - 1] + 1;
    return prefill_end_event(s, r, pass);
}

/* One pass over rows r with its own activations: done, or restart(idx) in *end. */
static ks_status prefill_pass(ks_session *s, prefill_rows *r, int pass, int chunked, pass_end *end) {
    const ks_policy *pol = s->policy;
    ks_fwd_buf b;
    ks_status st = ks_fwd_alloc(s->be, &s->m->cfg, r->n, pol && pol->want_pre_rope_keys, &b);
    if (!st) {
        PROF(s, KS_PH_ALLOC);
        st = pass_run(s, &b, r, pass, chunked, end);
    }
    ks_fwd_free(s->be, &b);
    PROF(s, KS_PH_ALLOC);
    return st;
}

/* restart(idx): the next pass runs on rows idx of this one, at positions base, base + 1, ...
 * The session records which prompt rows were kept; the KV rows the pass appended are dropped. */
static ks_status prefill_restart(ks_session *s, prefill_rows *r, const pass_end *end) {
    int k = end->k;
    for (int i = 0; i < k; i++) {
        int j = end->idx[i];
        r->ids[i] = r->ids[j];
        r->orig[i] = r->orig[j];
        r->pos[i] = r->base + i;
    }
    free(s->restart_idx);
    s->restart_idx = ks_malloc(sizeof(int32_t) * k);
    if (!s->restart_idx) { s->n_restart = 0; return KS_ERR_OOM; }
    memcpy(s->restart_idx, r->orig, sizeof(int32_t) * k);
    s->n_restart = k;
    s->restarted = 1;
    r->n = k;
    for (int j = 0; j <= end->layer; j++) ks_session_kv_clear(s, j);
    PROF(s, KS_PH_KV_EDIT);
    s->discard_kv = 0;
    return KS_OK;
}

/* One prefill of rows ids_in (a whole prompt, or one chunk of a chunked prefill): passes until
 * one is done. */
static ks_status prefill_once(ks_session *s, const int32_t *ids_in, int n_in, int chunked) {
    prefill_rows r = {.ids = ks_malloc(sizeof(int32_t) * n_in), .pos = ks_malloc(sizeof(int32_t) * n_in),
                      .orig = ks_malloc(sizeof(int32_t) * n_in), .n = n_in, .base = s->n_past};
    ks_status st = KS_OK;
    s->discard_kv = 0;
    ks_devcheck_reset(s);
    ks_prof_begin(s, 0);
    if (!r.ids || !r.pos || !r.orig) st = KS_ERR_OOM;
    else
        for (int i = 0; i < n_in; i++) { r.ids[i] = ids_in[i]; r.pos[i] = r.base + i; r.orig[i] = i; }
    for (int pass = 0; !st; pass++) {
        pass_end end = {0};
        st = prefill_pass(s, &r, pass, chunked, &end);
        if (!st && end.restart) st = prefill_restart(s, &r, &end);
        free(end.idx);
        if (!end.restart) break; /* done (or failed) */
    }
    s->discard_kv = 0;
    ks_prof_end(s);
    free(r.ids);
    free(r.pos);
    free(r.orig);
    return st;
}

ks_status ks_session_prefill(ks_session *s, const int32_t *ids_in, int n_in) {
    const ks_config *c = &s->m->cfg;
    if (n_in < 1) return ks_errorf(KS_ERR_ARG, "prefill: empty prompt");
    if (s->n_past + n_in > c->max_pos)
        return ks_errorf(KS_ERR_CONTEXT, "prompt of %d tokens (after %d) exceeds the model's context of %d tokens",
                         n_in, s->n_past, c->max_pos);
    for (int i = 0; i < n_in; i++)
        if (ids_in[i] < 0 || ids_in[i] >= c->vocab)
            return ks_errorf(KS_ERR_ARG, "prefill: token id %d at index %d out of range [0, %d)", ids_in[i], i, c->vocab);
    double t0 = ks_now();
    ks_decode_drop_graph(s); /* the cache changes under it */
    ks_hold_drop(s, -1);     /* held decode attends: the policy decides again after a prompt */
    ks_status st = ks_session_push_tokens(s, ids_in, n_in);
    if (st) return st;
    if (s->n_prompt == 0) s->n_prompt = n_in;
    s->stopped_at = -1;
    if (s->n_past == 0 && s->policy && s->policy->begin) {
        st = s->policy->begin(s->policy->ud, s);
        if (st) /* like ks_event_fire: keep policy errors, interrupts and OOM as they are */
            return (st == KS_ERR_POLICY || st == KS_ERR_INTERRUPTED || st == KS_ERR_OOM)
                       ? st : ks_error_prefix(KS_ERR_POLICY, "policy %s", s->policy->name);
    }
    if (s->prof.on) s->prof.forwards[0]++;
    int chunk = s->policy ? s->policy->prefill_chunk : 0;
    if (chunk > 0 && n_in > chunk) {
        for (int c0 = 0; c0 < n_in && !st; c0 += chunk)
            st = prefill_once(s, ids_in + c0, KS_MIN(chunk, n_in - c0), 1);
    } else {
        st = prefill_once(s, ids_in, n_in, 0);
    }
    s->t_prefill += ks_now() - t0;
    return st;
}
