/* hold.c — held attends (policy.h ks_action_hold): a decode-time attend that the engine repeats
 * at a layer's later decode steps without firing the layer's decode event; and the declaration
 * of a replayable handler (ks_action_replay), whose recording core/decode.c keeps. */
#include "forward.h"

#include <stdlib.h>
#include <string.h>

/* One layer's held attend: the list (its runtime memory lent and retained, or the engine's copy),
 * the ranges as asked, and whether the trailing range ended at the layer's rows (it then moves
 * with them: the last r[3] - r[2] rows at every step). */
struct ks_hold {
    int on;
    int32_t *idx;        /* a host list (k entries), or NULL: the device list l */
    int k;
    ks_dev_list l;
    void *copy;          /* the engine's copy of a list that came without a lend (l.data = copy) */
    const ks_backend *be;
    int64_t r[4];
    int tail, renumber;
};

/* The fewest rows of any KV head of layer L (0 without rows). */
static int64_t layer_rows(const ks_kv_layer *L) {
    if (!L->n) return 0;
    int64_t n = L->n[0];
    for (int h = 1; h < L->n_kv_heads; h++) n = KS_MIN(n, L->n[h]);
    return n;
}

void ks_hold_drop(ks_session *s, int layer) {
    if (!s || !s->hold) return;
    for (int l = 0; l < s->m->cfg.n_layers; l++) {
        struct ks_hold *h = &s->hold[l];
        if ((layer >= 0 && l != layer) || !h->on) continue;
        if (h->l.lend) h->l.lend->release(h->l.lend);
        free(h->idx);
        if (h->copy) ((ks_backend *)h->be)->free((ks_backend *)h->be, h->copy); /* stream-ordered */
        memset(h, 0, sizeof *h);
        s->n_held--;
        s->hold_gen++;
    }
}

void ks_hold_free(ks_session *s) {
    if (!s) return;
    ks_hold_drop(s, -1);
    free(s->hold);
    s->hold = NULL;
    s->n_held = 0;
}

int ks_holds_all(const ks_session *s) { return s->hold && s->n_held == s->m->cfg.n_layers; }

int ks_hold_on(const ks_session *s, int layer) { return s->hold && s->hold[layer].on; }

int ks_hold_moves(const ks_session *s, int layer) { return ks_hold_on(s, layer) && s->hold[layer].tail; }

ks_status ks_hold_commit(ks_session *s, int layer, const ks_actions *a) {
    if (!a->hold) return KS_OK;
    const ks_config *c = &s->m->cfg;
    if (!s->hold && !(s->hold = ks_calloc((size_t)c->n_layers, sizeof *s->hold))) return KS_ERR_OOM;
    ks_hold_drop(s, layer);
    struct ks_hold *h = &s->hold[layer];
    ks_backend *be = (ks_backend *)a->be;
    h->l = a->hold_list;
    h->be = be;
    memcpy(h->r, a->hold_r, sizeof h->r);
    h->tail = h->r[2] < h->r[3] && h->r[3] == layer_rows(&s->kv[layer]);
    h->renumber = a->renumber;
    if (a->hold_idx) { /* a host list: the action's copy moves here */
        h->idx = a->hold_idx;
        h->k = a->hold_k;
        ((ks_actions *)a)->hold_idx = NULL;
        memset(&h->l, 0, sizeof h->l);
    } else if (h->l.lend) h->l.lend->retain(h->l.lend);
    else { /* no lend: the runtime may free the list after this event; the hold keeps a copy */
        size_t bytes = sizeof(int32_t) * (size_t)h->l.rows * h->l.k;
        void *p = be->alloc(be, bytes);
        if (!p) return ks_errorf(KS_ERR_OOM, "attend (hold): out of memory for a %zu-byte index list", bytes);
        ks_status st = be->copy(be, p, h->l.data, bytes);
        if (st) { be->free(be, p); return st; }
        h->copy = p;
        h->l.data = p;
        h->l.serial = 0; /* another memory than the tensor's: not that tensor's kept list */
    }
    h->on = 1;
    s->n_held++;
    s->hold_gen++;
    return KS_OK;
}

int ks_hold_replay(ks_session *s, ks_event *ev) {
    int layer = ev->layer;
    if (!ks_hold_on(s, layer)) return 0;
    const struct ks_hold *h = &s->hold[layer];
    int64_t r[4];
    memcpy(r, h->r, sizeof r);
    if (h->tail) { /* the last (a1 - a0) rows of the layer as it is now */
        int64_t n = layer_rows(&s->kv[layer]);
        r[2] = n - (h->r[3] - h->r[2]);
        r[3] = n;
    }
    ev->sess = s;
    int ranges = r[0] < r[1] || r[2] < r[3];
    ks_status st;
    if (h->idx) { /* the whole host list again, checked as any */
        int64_t w = (r[1] - r[0]) + h->k + (r[3] - r[2]);
        int32_t *all = w > 0 && w <= INT32_MAX && r[2] >= 0 ? ks_malloc(sizeof(int32_t) * (size_t)w) : NULL;
        if (!all) st = w > 0 && w <= INT32_MAX && r[2] >= 0 ? KS_ERR_OOM : KS_ERR_POLICY;
        else {
            int64_t o = 0;
            for (int64_t j = r[0]; j < r[1]; j++) all[o++] = (int32_t)j;
            memcpy(all + o, h->idx, sizeof(int32_t) * (size_t)h->k);
            o += h->k;
            for (int64_t j = r[2]; j < r[3]; j++) all[o++] = (int32_t)j;
            st = ks_action_attend(ev, all, (int)w, h->renumber);
            free(all);
        }
    } else {
        ks_dev_list l = h->l;
        st = ranges ? ks_action_attend_dev_ranges(ev, &l, r, h->renumber) : ks_action_attend_dev(ev, &l, h->renumber);
    }
    if (st == KS_ERR_OOM) return ks_actions_free(&ev->act, ev->n_kv_heads), -1;
    if (st) { /* the layer moved under the hold (its rows no longer fit): the event decides again */
        ks_actions_free(&ev->act, ev->n_kv_heads);
        ks_clear_error();
        ks_hold_drop(s, layer);
        return 0;
    }
    s->held_steps++;
    return 1;
}

/* The checks both kinds of hold make: a decode event whose attend (of that kind) was asked. */
static ks_status hold_check(const ks_event *ev, int dev) {
    if (ev->kind != KS_EV_DECODE_QKV)
        return ks_errorf(KS_ERR_POLICY, "attend: hold only in decode_qkv (asked in %s)", ks_event_name(ev->kind));
    if (ev->act.hold) return ks_errorf(KS_ERR_POLICY, "attend (layer %d): hold asked twice in one event", ev->layer);
    if (!ev->act.attend || !ev->act.attend_dev != !dev)
        return ks_errorf(KS_ERR_POLICY, "attend (layer %d): hold follows the %s attend it holds", ev->layer,
                         dev ? "device-list" : "host-list");
    return KS_OK;
}

ks_status ks_action_hold_host(ks_event *ev, const int32_t *idx, int k, const int64_t r[4]) {
    ks_status st = hold_check(ev, 0);
    if (st) return st;
    if (!idx || k < 0) return ks_errorf(KS_ERR_POLICY, "attend (layer %d): hold of a NULL list", ev->layer);
    int32_t *c = ks_malloc(sizeof(int32_t) * (size_t)(k ? k : 1));
    if (!c) return KS_ERR_OOM;
    if (k) memcpy(c, idx, sizeof(int32_t) * (size_t)k);
    ev->act.hold = 1;
    ev->act.hold_idx = c;
    ev->act.hold_k = k;
    if (r) memcpy(ev->act.hold_r, r, sizeof ev->act.hold_r);
    else memset(ev->act.hold_r, 0, sizeof ev->act.hold_r);
    return KS_OK;
}

ks_status ks_action_hold(ks_event *ev, const ks_dev_list *l, const int64_t r[4]) {
    ks_status st = hold_check(ev, 1);
    if (st) return st;
    if (!l || !l->data || !l->checked)
        return ks_errorf(KS_ERR_POLICY, "attend (layer %d): hold needs a list valid by construction (a ks.topk, ks.arange "
                         "or ks.concat result, or one shifted by a constant)", ev->layer);
    ev->act.hold = 1;
    ev->act.hold_list = *l;
    ev->act.hold_list.lend = l->lend;
    if (r) memcpy(ev->act.hold_r, r, sizeof ev->act.hold_r);
    else memset(ev->act.hold_r, 0, sizeof ev->act.hold_r);
    return KS_OK;
}

ks_status ks_action_replay(ks_event *ev) {
    if (ev->kind != KS_EV_DECODE_QKV)
        return ks_errorf(KS_ERR_POLICY, "replay only in decode_qkv (asked in %s)", ks_event_name(ev->kind));
    const ks_actions *a = &ev->act;
    int other = a->restart || a->propagate || a->retain || a->stop || a->discard_kv || (a->renumber && !a->attend);
    if (other || (a->attend && !a->attend_dev))
        return ks_errorf(KS_ERR_POLICY, "replay (layer %d): only a device-list attend (a list the policy's primitives "
                         "made on the device), or nothing, can be recorded", ev->layer);
    ev->act.replay = 1;
    ev->act.replay_rows = 0;
    return KS_OK;
}

ks_status ks_action_replay_within(ks_event *ev, int64_t rows) {
    if (rows < 1)
        return ks_errorf(KS_ERR_POLICY, "replay (layer %d): within %lld rows: must be at least 1", ev->layer, (long long)rows);
    ks_status st = ks_action_replay(ev);
    if (!st) ev->act.replay_rows = rows;
    return st;
}
