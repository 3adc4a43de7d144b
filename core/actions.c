/* actions.c — policy events and their actions: building and firing an event, and the
 * ks_action_* calls a handler makes, each validated (legal in this event, indices in range, no
 * duplicates) and recorded in the event's ks_actions. The forward takes those actions out of
 * the event as a value of their own (ks_actions_take), applies them and frees them. */
#include "forward.h"

#include <stdlib.h>
#include <string.h>

const char *ks_event_name(ks_event_kind k) {
    static const char *n[] = {"prefill_qkv", "prefill_layer_end", "prefill_end", "decode_qkv", "token"};
    return (unsigned)k < KS_EV_COUNT ? n[k] : "?";
}

/* ================================================================ events */

void ks_event_init(ks_session *s, ks_event *ev, ks_event_kind kind, int layer, int pass, int n) {
    const ks_config *c = &s->m->cfg;
    memset(ev, 0, sizeof *ev);
    ev->kind = kind;
    ev->layer = layer;
    ev->pass = pass;
    ev->n = n;
    ev->n_prompt = s->n_prompt;
    ev->n_heads = c->n_heads;
    ev->n_kv_heads = c->n_kv_heads;
    ev->head_dim = c->head_dim;
    ev->dim = c->dim;
    ev->n_layers = c->n_layers;
    ev->be = s->be;
}

ks_status ks_event_fire(ks_session *s, ks_event *ev) {
    const ks_policy *p = s->policy;
    ks_event_fn fn = p ? p->on[ev->kind] : NULL;
    if (!fn) return KS_OK;
    ev->sess = s;
    ev->generation = ++s->generation;
    ks_status st = fn(p->ud, ev);
    ++s->generation; /* views of this event are stale from now on */
    if (st) {
        if (st != KS_ERR_POLICY && st != KS_ERR_INTERRUPTED && st != KS_ERR_OOM)
            st = ks_error_prefix(KS_ERR_POLICY, "policy %s", p->name ? p->name : "?");
        return st;
    }
    return KS_OK;
}

/* ================================================================ actions: asked by a handler */

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Copy, sort and check a list: in [0, n), no duplicates, k >= 1. */
static ks_status take_list(const ks_event *ev, const char *action, const int32_t *idx, int k, int n, int32_t **out) {
    if (k < 1) return ks_errorf(KS_ERR_POLICY, "%s in %s: empty index list", action, ks_event_name(ev->kind));
    if (!idx) return ks_errorf(KS_ERR_POLICY, "%s in %s: NULL index list", action, ks_event_name(ev->kind));
    int32_t *c = ks_malloc(sizeof(int32_t) * (size_t)k);
    if (!c) return KS_ERR_OOM;
    memcpy(c, idx, sizeof(int32_t) * (size_t)k);
    /* policies mostly hand over ascending lists (top-k sorted, aranges): sort only when needed
     * (a qsort per KV head and action was most of a decode-time handler's cost) */
    int sorted = 1;
    for (int i = 1; i < k && sorted; i++) sorted = c[i] > c[i - 1];
    if (!sorted) qsort(c, (size_t)k, sizeof *c, cmp_i32);
    for (int i = 0; i < k; i++) {
        if (c[i] < 0 || c[i] >= n) {
            ks_status st = ks_errorf(KS_ERR_POLICY, "%s in %s (layer %d): index %d out of range [0, %d)", action,
                                     ks_event_name(ev->kind), ev->layer, c[i], n);
            free(c);
            return st;
        }
        if (i && c[i] == c[i - 1]) {
            ks_status st = ks_errorf(KS_ERR_POLICY, "%s in %s (layer %d): duplicate index %d", action,
                                     ks_event_name(ev->kind), ev->layer, c[i]);
            free(c);
            return st;
        }
    }
    *out = c;
    return KS_OK;
}

static ks_status illegal(const ks_event *ev, const char *action) {
    return ks_errorf(KS_ERR_POLICY, "%s is not allowed in event %s", action, ks_event_name(ev->kind));
}

/* Record the one list of `action` (its flag *asked, the sorted copy in *out, its length in *n_out):
 * once per event, indices in [0, ev->n). */
static ks_status record_list(ks_event *ev, const char *action, int *asked, const int32_t *idx, int k, int32_t **out,
                             int *n_out) {
    if (*asked) return ks_errorf(KS_ERR_POLICY, "%s: asked twice in one event", action);
    ks_status st = take_list(ev, action, idx, k, ev->n, out);
    if (st) return st;
    *n_out = k;
    *asked = 1;
    return KS_OK;
}

ks_status ks_action_restart(ks_event *ev, const int32_t *idx, int k) {
    if (ev->kind != KS_EV_PREFILL_QKV) return illegal(ev, "restart");
    if (ev->pass > 0) return ks_errorf(KS_ERR_POLICY, "restart: only one restart per request (already in pass %d)", ev->pass);
    return record_list(ev, "restart", &ev->act.restart, idx, k, &ev->act.restart_idx, &ev->act.n_restart);
}

ks_status ks_action_propagate(ks_event *ev, const int32_t *idx, int k) {
    if (ev->kind != KS_EV_PREFILL_QKV && ev->kind != KS_EV_PREFILL_LAYER_END) return illegal(ev, "propagate");
    return record_list(ev, "propagate", &ev->act.propagate, idx, k, &ev->act.prop_idx, &ev->act.n_prop);
}

static void free_head_lists(int32_t **l, int *n, int H) {
    if (l)
        for (int h = 0; h < H; h++) free(l[h]);
    free(l);
    free(n);
}

/* Per-head lists against each head's row count (rows of the layer after this event's append). */
static ks_status take_heads(ks_event *ev, const char *action, const int32_t *const *idx, const int *k, int shared,
                            int32_t ***out, int **nout) {
    int H = ev->n_kv_heads;
    int32_t **l = ks_calloc(H, sizeof *l);
    int *n = ks_calloc(H, sizeof *n);
    if (!l || !n) { free(l); free(n); return KS_ERR_OOM; }
    for (int h = 0; h < H; h++) {
        /* rows of the layer once this step's rows are in (PREFILL_QKV fires before the append) */
        int rows = (ev->kv && ev->kv->n ? ev->kv->n[h] : 0) + (ev->kind == KS_EV_PREFILL_QKV ? ev->n : 0);
        const int32_t *src = shared ? idx[0] : idx[h];
        int kh = shared ? k[0] : k[h];
        ks_status st = take_list(ev, action, src, kh, rows, &l[h]);
        if (st) { free_head_lists(l, n, H); return st; }
        n[h] = kh;
    }
    *out = l;
    *nout = n;
    return KS_OK;
}

static ks_status retain_common(ks_event *ev, const int32_t *const *idx, const int *k, int shared) {
    if (ev->kind != KS_EV_PREFILL_QKV && ev->kind != KS_EV_PREFILL_LAYER_END && ev->kind != KS_EV_DECODE_QKV)
        return illegal(ev, "retain");
    if (ev->act.retain) return ks_errorf(KS_ERR_POLICY, "retain: asked twice in one event");
    ks_status st = take_heads(ev, "retain", idx, k, shared, &ev->act.retain_idx, &ev->act.n_retain);
    if (st) return st;
    ev->act.retain = 1;
    return KS_OK;
}
ks_status ks_action_retain(ks_event *ev, const int32_t *idx, int k) { return retain_common(ev, &idx, &k, 1); }
ks_status ks_action_retain_heads(ks_event *ev, const int32_t *const *idx, const int *k) {
    return retain_common(ev, idx, k, 0);
}

static ks_status attend_common(ks_event *ev, const int32_t *const *idx, const int *k, int shared, int renumber) {
    if (ev->kind != KS_EV_DECODE_QKV && ev->kind != KS_EV_PREFILL_QKV) return illegal(ev, "attend");
    if (ev->act.attend) return ks_errorf(KS_ERR_POLICY, "attend: asked twice in one event");
    ks_status st = take_heads(ev, "attend", idx, k, shared, &ev->act.attend_idx, &ev->act.n_attend);
    if (st) return st;
    ev->act.attend = 1;
    ev->act.renumber = renumber;
    return KS_OK;
}
ks_status ks_action_attend(ks_event *ev, const int32_t *idx, int k, int renumber) {
    return attend_common(ev, &idx, &k, 1, renumber);
}
ks_status ks_action_attend_heads(ks_event *ev, const int32_t *const *idx, const int *k, int renumber) {
    return attend_common(ev, idx, k, 0, renumber);
}

ks_status ks_action_stop(ks_event *ev) {
    if (ev->kind == KS_EV_DECODE_QKV || ev->kind == KS_EV_TOKEN) return illegal(ev, "stop");
    ev->act.stop = 1;
    return KS_OK;
}

ks_status ks_action_discard_kv(ks_event *ev) {
    if (ev->kind != KS_EV_PREFILL_QKV) return illegal(ev, "discard_kv");
    if (ev->pass > 0 || ev->layer != 0)
        return ks_errorf(KS_ERR_POLICY, "discard_kv: only in prefill_qkv at layer 0 of the first pass (asked at layer %d of pass %d)",
                         ev->layer, ev->pass);
    ev->act.discard_kv = 1;
    return KS_OK;
}

/* ================================================================ actions: taken by the forward */

ks_actions ks_actions_take(ks_event *ev) {
    ks_actions a = ev->act;
    memset(&ev->act, 0, sizeof ev->act);
    return a;
}

void ks_actions_free(ks_actions *a, int n_kv_heads) {
    free(a->restart_idx);
    free(a->prop_idx);
    free_head_lists(a->retain_idx, a->n_retain, n_kv_heads);
    free_head_lists(a->attend_idx, a->n_attend, n_kv_heads);
    memset(a, 0, sizeof *a);
}

ks_status ks_actions_apply_retain(ks_session *s, int l, const ks_actions *a) {
    ks_kv_layer *L = &s->kv[l];
    for (int h = 0; h < L->n_kv_heads; h++) /* lists are sorted: the last is the largest */
        if (a->retain_idx[h][a->n_retain[h] - 1] >= L->n[h])
            return ks_errorf(KS_ERR_POLICY, "retain at layer %d: row %d out of range for KV head %d (%d rows)", l,
                             a->retain_idx[h][a->n_retain[h] - 1], h, L->n[h]);
    return s->be->kv_retain(s->be, L, (const int32_t *const *)a->retain_idx, a->n_retain, 1);
}
