/* actions.c — policy events and their actions: building and firing an event, and the
 * ks_action_* calls a handler makes, each validated (legal in this event, indices in range, no
 * duplicates) and recorded in the event's ks_actions. The forward takes those actions out of
 * the event as a value of their own (ks_actions_take), applies them and frees them.
 * Device lists (policy.h, "Device lists"): the *_dev actions copy a backend list into the
 * actions; attend's unchecked lists are checked by the backend's check_idx into a word of the
 * session's deferred checks (ks_devcheck below), read at the step's next sync
 * (ks_devcheck_sync); retain and propagate lists are downloaded and checked when applied. */
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
    if (ev->kv && ev->layer >= 0) { /* a handler sees a layer's rows in logical order (a KV ring) */
        ks_status sr = ks_ring_restore(s, ev->layer);
        if (sr) return sr;
    }
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

/* ================================================================ device lists */

/* The deferred checks of one forward (attend with an unchecked device list): one backend word
 * per check, and what the message needs. Lives in the decode state (ks_decode_devcheck). */
struct ks_devcheck {
    uint64_t *slots;         /* (cap) backend words: check_idx's results */
    int cap, used;
    struct devrec {
        int layer, rows, k;
        ks_event_kind kind;
        int lim[KS_DEVCHECK_HEADS]; /* (rows) each list's row count */
    } *rec;                  /* (cap) */
};

void ks_devcheck_free(ks_backend *be, ks_devcheck *c) {
    if (!c) return;
    if (c->slots) be->free(be, c->slots);
    free(c->rec);
    free(c);
}

/* A free word for a check at ev (NULL: none, check on the host): the forward's checks so far
 * fill at most 4 per layer before a sync. */
static uint64_t *devcheck_slot(ks_event *ev, const ks_dev_list *l, const int *lim) {
    if (!ev->sess || !ev->be->check_idx || l->rows > KS_DEVCHECK_HEADS) return NULL;
    ks_devcheck **pc = ks_decode_devcheck(ev->sess);
    if (!pc) return NULL;
    ks_devcheck *c = *pc;
    ks_backend *be = (ks_backend *)ev->be;
    if (!c) {
        int cap = 4 * ev->n_layers;
        c = ks_calloc(1, sizeof *c);
        if (!c) return NULL;
        c->rec = ks_calloc((size_t)cap, sizeof *c->rec);
        c->slots = be->alloc(be, sizeof(uint64_t) * (size_t)cap);
        if (!c->rec || !c->slots) { ks_devcheck_free(be, c); ks_clear_error(); return NULL; }
        c->cap = cap;
        *pc = c;
    }
    if (c->used >= c->cap) return NULL;
    struct devrec *r = &c->rec[c->used];
    r->layer = ev->layer;
    r->kind = ev->kind;
    r->rows = l->rows;
    r->k = l->k;
    memcpy(r->lim, lim, sizeof(int) * l->rows);
    return c->slots + c->used++;
}

void ks_devcheck_reset(ks_session *s) {
    ks_devcheck **pc = s->dec ? ks_decode_devcheck(s) : NULL;
    if (pc && *pc) (*pc)->used = 0;
}

/* The message of a failed check: key as check_idx writes it, the list (rows, k) checked against lim. */
static ks_status list_error(const char *action, ks_event_kind kind, int layer, uint64_t key, int rows, int k,
                            const int *lim) {
    int64_t at = (int64_t)(key >> 34);
    int why = (int)((key >> 32) & 3);
    int32_t v = (int32_t)(uint32_t)key;
    int r = (int)(at / k), i = (int)(at % k);
    char head[48] = "";
    if (rows > 1) snprintf(head, sizeof head, " of KV head %d", r);
    if (why == 1)
        return ks_errorf(KS_ERR_POLICY, "%s in %s (layer %d): index %d at position %d%s out of range [0, %d)", action,
                         ks_event_name(kind), layer, v, i, head, lim[r]);
    return ks_errorf(KS_ERR_POLICY, "%s in %s (layer %d): %s index %d at position %d%s (a device list must be ascending)",
                     action, ks_event_name(kind), layer, why == 3 ? "duplicate" : "unsorted", v, i, head);
}

/* The host twin of check_idx's rule (policy.h): the first bad entry's key, or UINT64_MAX. */
static uint64_t host_check(const int32_t *x, int rows, int k, const int *lim) {
    for (int r = 0; r < rows; r++)
        for (int i = 0; i < k; i++) {
            int32_t v = x[(size_t)r * k + i];
            int why = v < 0 || v >= lim[r] ? 1 : i && v < x[(size_t)r * k + i - 1] ? 2 : i && v == x[(size_t)r * k + i - 1] ? 3 : 0;
            if (why) return (uint64_t)((int64_t)r * k + i) << 34 | (uint64_t)why << 32 | (uint32_t)v;
        }
    return UINT64_MAX;
}

ks_status ks_devcheck_sync(ks_session *s) {
    ks_devcheck **pc = s->dec ? ks_decode_devcheck(s) : NULL;
    ks_devcheck *c = pc ? *pc : NULL;
    if (!c || !c->used) return KS_OK;
    int n = c->used;
    c->used = 0;
    uint64_t w[4 * 256];
    uint64_t *key = n <= (int)(sizeof w / sizeof w[0]) ? w : ks_malloc(sizeof(uint64_t) * (size_t)n);
    if (!key) return KS_ERR_OOM;
    ks_status st = s->be->download(s->be, key, c->slots, sizeof(uint64_t) * (size_t)n);
    for (int j = 0; !st && j < n; j++)
        if (key[j] != UINT64_MAX) {
            const struct devrec *r = &c->rec[j];
            st = list_error("attend", r->kind, r->layer, key[j], r->rows, r->k, r->lim);
            if (s->policy && s->policy->name) st = ks_error_prefix(st, "policy %s", s->policy->name);
        }
    if (key != w) free(key);
    return st;
}

/* Shape and bounds of a device list at ev: rows 1 or n_kv_heads (one if !heads), k >= 1; lim[r]
 * = the rows list r may index (a shared list: the fewest of any head's); checked lists against
 * their bounds. */
static ks_status dev_list_check(const ks_event *ev, const char *action, const ks_dev_list *l, int heads, int *lim) {
    const char *e = ks_event_name(ev->kind);
    int H = ev->n_kv_heads;
    if (!l || !l->data) return ks_errorf(KS_ERR_POLICY, "%s in %s: NULL index list", action, e);
    if (l->k < 1) return ks_errorf(KS_ERR_POLICY, "%s in %s: empty index list", action, e);
    if (l->rows != 1 && !(heads && l->rows == H))
        return ks_errorf(KS_ERR_POLICY, "%s in %s (layer %d): %d lists for %d KV heads", action, e, ev->layer, l->rows, H);
    if ((int64_t)l->rows * l->k >= (int64_t)1 << 30)
        return ks_errorf(KS_ERR_POLICY, "%s in %s: a device list of %lld entries is too long", action, e,
                         (long long)l->rows * l->k);
    if (!heads) lim[0] = ev->n;
    else
        for (int r = 0; r < l->rows; r++) {
            lim[r] = INT32_MAX;
            for (int h = (l->rows == 1 ? 0 : r); h < (l->rows == 1 ? H : r + 1); h++) {
                int rows = (ev->kv && ev->kv->n ? ev->kv->n[h] : 0) + (ev->kind == KS_EV_PREFILL_QKV ? ev->n : 0);
                lim[r] = KS_MIN(lim[r], rows);
            }
        }
    if (l->checked)
        for (int r = 0; r < l->rows; r++)
            if (l->lo < 0 || l->hi > lim[r] || l->k > l->hi - l->lo)
                return ks_errorf(KS_ERR_POLICY, "%s in %s (layer %d): a list of %d indices in [%lld, %lld) does not fit the "
                                 "rows [0, %d)%s", action, e, ev->layer, l->k, (long long)l->lo, (long long)l->hi, lim[r],
                                 l->rows > 1 ? " of a KV head" : "");
    return KS_OK;
}

/* Per layer, the last decode-time attend list that came with a serial (ks_dev_list.serial: a
 * policy's read-only tensor): the list itself where the runtime lends its memory (ks_dev_list.lend:
 * read where it is, held by the action until its attention was queued), else the engine's copy.
 * While a policy attends the same tensor at a layer (TokenSelect's selection cache), the entry is
 * reused: no copy and no check again, and the same list id (ks_backend.list_gen) lets the backend
 * skip staging it again. A lent entry is dereferenced only for that same tensor, which is then
 * alive (the handler passed it); a serial is never reused within a policy's state (the entries
 * are dropped with the policy). */
struct ks_list_keep {
    uint64_t serial, gen;
    void *buf;
    int owned; /* buf is the engine's copy (else the lent list itself: never freed here) */
    int rows, k;
    const ks_backend *be;
};

void ks_list_keep_free(ks_session *s) {
    if (!s || !s->lkeep) return;
    for (int l = 0; l < s->m->cfg.n_layers; l++)
        if (s->lkeep[l].buf && s->lkeep[l].owned)
            ((ks_backend *)s->lkeep[l].be)->free((ks_backend *)s->lkeep[l].be, s->lkeep[l].buf);
    free(s->lkeep);
    s->lkeep = NULL;
}

/* The kept entry for ev's layer, created on first use; NULL where lists are not kept (not a
 * decode event, no serial, out of memory) */
static struct ks_list_keep *list_keep_at(const ks_event *ev, const ks_dev_list *l) {
    ks_session *s = ev->sess;
    if (!l->serial || !l->checked || !s || ev->kind != KS_EV_DECODE_QKV || ev->layer < 0 ||
        ev->layer >= s->m->cfg.n_layers)
        return NULL; /* only lists valid by construction: a kept list is never checked again */
    if (!s->lkeep && !(s->lkeep = ks_calloc((size_t)s->m->cfg.n_layers, sizeof *s->lkeep))) {
        ks_clear_error();
        return NULL;
    }
    return &s->lkeep[ev->layer];
}

/* A backend copy of l (rows * k words) in *out. */
static ks_status dev_list_copy(const ks_event *ev, const ks_dev_list *l, void **out) {
    ks_backend *be = (ks_backend *)ev->be;
    size_t bytes = sizeof(int32_t) * (size_t)l->rows * l->k;
    void *p = be->alloc(be, bytes);
    if (!p) return ks_errorf(KS_ERR_OOM, "%s: out of memory for a %zu-byte index list", be->name, bytes);
    ks_status st = be->copy(be, p, l->data, bytes);
    if (st) { be->free(be, p); return st; }
    *out = p;
    return KS_OK;
}

ks_status ks_action_attend_dev_ranges(ks_event *ev, const ks_dev_list *l, const int64_t r[4], int renumber) {
    if (ev->kind != KS_EV_DECODE_QKV && ev->kind != KS_EV_PREFILL_QKV) return illegal(ev, "attend");
    const char *e = ks_event_name(ev->kind);
    if (!l || !l->data || l->k < 1) return ks_errorf(KS_ERR_POLICY, "attend in %s: an empty index list with row ranges", e);
    if (r[0] == r[1] && r[2] == r[3]) return ks_action_attend_dev(ev, l, renumber);
    if (!l->checked)
        return ks_errorf(KS_ERR_POLICY, "attend in %s (layer %d): before / after ranges need a list valid by construction "
                         "(a ks.topk, ks.arange or ks.concat result, or one shifted by a constant)", e, ev->layer);
    int H = ev->n_kv_heads, rows = INT32_MAX;
    for (int h = 0; h < H; h++)
        rows = KS_MIN(rows, (ev->kv && ev->kv->n ? ev->kv->n[h] : 0) + (ev->kind == KS_EV_PREFILL_QKV ? ev->n : 0));
    int64_t b0 = r[0], b1 = r[1], a0 = r[2], a1 = r[3];
    if (b0 < 0 || b0 > b1 || a0 > a1 || a1 > rows || (b1 > b0 && b1 > l->lo) || (a1 > a0 && l->hi > a0))
        return ks_errorf(KS_ERR_POLICY, "attend in %s (layer %d): rows [%lld, %lld) ++ a list in [%lld, %lld) ++ rows "
                         "[%lld, %lld) are not ascending inside the %d rows of every KV head", e, ev->layer, (long long)b0,
                         (long long)b1, (long long)l->lo, (long long)l->hi, (long long)a0, (long long)a1, rows);
    ks_backend *be = (ks_backend *)ev->be;
    if (be->attn_ranges && (l->rows == 1 || l->rows == H)) { /* read in place: the list alone is copied */
        ks_status st = ks_action_attend_dev(ev, l, renumber);
        if (st) return st;
        ev->act.attend_seg = 1;
        ev->act.seg_b0 = (int32_t)b0; ev->act.seg_b1 = (int32_t)b1;
        ev->act.seg_a0 = (int32_t)a0; ev->act.seg_a1 = (int32_t)a1;
        return KS_OK;
    }
    /* the whole list, built by the backend's page_rows (pages of one row) */
    if (!be->prims || !be->prims->page_rows) return ks_errorf(KS_ERR_UNSUPPORTED, "attend: %s has no page_rows", be->name);
    int64_t w = (b1 - b0) + l->k + (a1 - a0);
    int32_t *buf = be->alloc(be, sizeof(int32_t) * (size_t)l->rows * (size_t)w);
    if (!buf) return ks_errorf(KS_ERR_OOM, "attend: out of memory for a %lld-entry list", (long long)(l->rows * w));
    ks_status st = be->prims->page_rows(be, l->data, l->rows, l->k, 1, rows, b0, b1, a0, a1, buf, NULL);
    ks_dev_list whole = {.data = buf, .rows = l->rows, .k = (int)w, .checked = 1,
                         .lo = b1 > b0 ? b0 : l->lo, .hi = a1 > a0 ? a1 : l->hi};
    if (!st) st = ks_action_attend_dev(ev, &whole, renumber);
    be->free(be, buf); /* stream-ordered: after the action's copy of it */
    return st;
}

ks_status ks_action_attend_page(ks_event *ev, int page) {
    if (ev->kind != KS_EV_DECODE_QKV) return illegal(ev, "attend");
    if (page < 1) return ks_errorf(KS_ERR_POLICY, "attend (layer %d): a page of %d rows", ev->layer, page);
    const ks_actions *a = &ev->act;
    if (!a->attend || !a->attend_dev)
        return ks_errorf(KS_ERR_POLICY, "attend (layer %d): page follows a device-list attend with a trailing range",
                         ev->layer);
    int N = ev->kv && ev->kv->n ? ev->kv->n[0] : 0;
    for (int h = 1; ev->kv && ev->kv->n && h < ev->n_kv_heads; h++)
        if (ev->kv->n[h] != N)
            return ks_errorf(KS_ERR_POLICY, "attend (layer %d): page with KV heads of different rows (%d and %d)", ev->layer,
                             N, ev->kv->n[h]);
    int64_t p0 = N > 0 ? (int64_t)(N - 1) / page * page : 0;
    /* a built list (a backend that does not read ranges) holds the page's rows as they are now:
     * nothing to follow, and such a backend does not replay */
    int32_t a0 = a->attend_seg ? a->seg_a0 : (int32_t)p0, a1 = a->attend_seg ? a->seg_a1 : N;
    if (N < 1 || a0 != p0 || a1 != N)
        return ks_errorf(KS_ERR_POLICY, "attend (layer %d): the trailing range [%d, %d) is not the current page of %d rows "
                         "[%lld, %d)", ev->layer, a0, a1, page, (long long)p0, N);
    if (a->attend_seg) ev->act.seg_page = page;
    return KS_OK;
}

ks_status ks_action_attend_dev(ks_event *ev, const ks_dev_list *l, int renumber) {
    if (ev->kind != KS_EV_DECODE_QKV && ev->kind != KS_EV_PREFILL_QKV) return illegal(ev, "attend");
    if (ev->act.attend) return ks_errorf(KS_ERR_POLICY, "attend: asked twice in one event");
    if (ev->act.be && ev->act.be != ev->be) return ks_errorf(KS_ERR_INTERNAL, "attend: device lists of two backends");
    int lim[KS_DEVCHECK_HEADS], *lm = l && l->rows > KS_DEVCHECK_HEADS ? ks_malloc(sizeof(int) * l->rows) : lim;
    if (!lm) return KS_ERR_OOM;
    void *buf = NULL;
    ks_status st = dev_list_check(ev, "attend", l, 1, lm);
    struct ks_list_keep *kp = st ? NULL : list_keep_at(ev, l);
    int reused = kp && kp->buf && kp->serial == l->serial && kp->rows == l->rows && kp->k == l->k && kp->be == ev->be;
    int lent = !reused && kp && l->lend; /* valid by construction and lent: read where it is */
    if (reused) buf = kp->buf; /* the same tensor as this layer's last attend: copied and checked then */
    else if (lent) buf = (void *)l->data;
    else if (!st) st = dev_list_copy(ev, l, &buf);
    if (!st && !reused && !l->checked) {
        ks_backend *be = (ks_backend *)ev->be;
        uint64_t *slot = devcheck_slot(ev, l, lm);
        st = slot ? be->check_idx(be, buf, l->rows, l->k, lm, slot) : KS_ERR_UNSUPPORTED;
        if (st == KS_ERR_UNSUPPORTED) { /* no deferred check: download and check here */
            ks_clear_error();
            if (slot) (*ks_decode_devcheck(ev->sess))->used--; /* the slot was the last one taken */
            size_t words = (size_t)l->rows * l->k;
            int32_t *h = ks_malloc(sizeof(int32_t) * words);
            st = h ? be->download(be, h, buf, sizeof(int32_t) * words) : KS_ERR_OOM;
            uint64_t key = st ? UINT64_MAX : host_check(h, l->rows, l->k, lm);
            if (key != UINT64_MAX) st = list_error("attend", ev->kind, ev->layer, key, l->rows, l->k, lm);
            free(h);
        }
    }
    int H = ev->n_kv_heads;
    int32_t **ix = NULL;
    int *n = NULL;
    if (!st && (!(ix = ks_calloc(H, sizeof *ix)) || !(n = ks_calloc(H, sizeof *n)))) st = KS_ERR_OOM;
    if (lm != lim) free(lm);
    if (st) {
        free(ix);
        if (buf && !reused && !lent) ev->be->free((ks_backend *)ev->be, buf);
        return st;
    }
    for (int h = 0; h < H; h++) {
        ix[h] = (int32_t *)buf + (l->rows == 1 ? 0 : (size_t)h * l->k);
        n[h] = l->k;
    }
    if (kp && !reused) { /* this layer's list from now on (a previous copy is freed stream-ordered) */
        ks_backend *be = (ks_backend *)ev->be;
        if (kp->buf && kp->owned) ((ks_backend *)kp->be)->free((ks_backend *)kp->be, kp->buf);
        *kp = (struct ks_list_keep){.serial = l->serial, .gen = ++be->list_gen, .buf = buf, .owned = !lent,
                                    .rows = l->rows, .k = l->k, .be = ev->be};
        reused = 1; /* the keep owns a copy; a lent list is the runtime's */
    }
    if (l->lend && buf == (void *)l->data) { /* read where it is: held until the attention was queued */
        l->lend->retain(l->lend);
        ev->act.attend_lend = l->lend;
    }
    ev->act.attend_idx = ix;
    ev->act.n_attend = n;
    ev->act.attend_dbuf = reused ? NULL : buf;
    ev->act.attend_gen = kp && reused ? kp->gen : 0;
    ev->act.attend_dev = 1;
    ev->act.be = ev->be;
    ev->act.attend = 1;
    ev->act.renumber = renumber;
    return KS_OK;
}

ks_status ks_action_retain_dev(ks_event *ev, const ks_dev_list *l) {
    if (ev->kind != KS_EV_PREFILL_QKV && ev->kind != KS_EV_PREFILL_LAYER_END && ev->kind != KS_EV_DECODE_QKV)
        return illegal(ev, "retain");
    if (ev->act.retain) return ks_errorf(KS_ERR_POLICY, "retain: asked twice in one event");
    if (ev->act.be && ev->act.be != ev->be) return ks_errorf(KS_ERR_INTERNAL, "retain: device lists of two backends");
    int lim[KS_DEVCHECK_HEADS], *lm = l && l->rows > KS_DEVCHECK_HEADS ? ks_malloc(sizeof(int) * l->rows) : lim;
    if (!lm) return KS_ERR_OOM;
    ks_status st = dev_list_check(ev, "retain", l, 1, lm);
    if (lm != lim) free(lm);
    if (!st) st = dev_list_copy(ev, l, &ev->act.retain_dbuf);
    if (st) return st;
    ev->act.retain_rows = l->rows;
    ev->act.retain_k = l->k;
    ev->act.retain_checked = l->checked;
    ev->act.retain_kind = ev->kind;
    ev->act.be = ev->be;
    ev->act.retain = 1;
    return KS_OK;
}

ks_status ks_action_propagate_dev(ks_event *ev, const ks_dev_list *l) {
    if (ev->kind != KS_EV_PREFILL_QKV && ev->kind != KS_EV_PREFILL_LAYER_END) return illegal(ev, "propagate");
    if (ev->act.propagate) return ks_errorf(KS_ERR_POLICY, "propagate: asked twice in one event");
    if (ev->act.be && ev->act.be != ev->be) return ks_errorf(KS_ERR_INTERNAL, "propagate: device lists of two backends");
    int lim[1];
    ks_status st = dev_list_check(ev, "propagate", l, 0, lim);
    if (!st) st = dev_list_copy(ev, l, &ev->act.prop_dbuf);
    if (st) return st;
    ev->act.n_prop = l->k;
    ev->act.prop_checked = l->checked;
    ev->act.prop_kind = ev->kind;
    ev->act.be = ev->be;
    ev->act.propagate = 1;
    return KS_OK;
}

/* A device list of a (rows, k) downloaded into host lists (n_kv_heads of them, owned: *out, the
 * counts *nout) and checked like check_idx against lim (rows entries): the host side of retain
 * and propagate device lists. */
static ks_status dev_list_host(ks_session *s, const char *action, ks_event_kind kind, int layer, const void *buf,
                               int rows, int k, int heads, const int *lim, int32_t ***out, int **nout) {
    int H = heads;
    size_t words = (size_t)rows * k;
    int32_t *h = ks_malloc(sizeof(int32_t) * words);
    if (!h) return KS_ERR_OOM;
    ks_status st = s->be->download(s->be, h, buf, sizeof(int32_t) * words);
    uint64_t key = st ? UINT64_MAX : host_check(h, rows, k, lim);
    if (key != UINT64_MAX) st = list_error(action, kind, layer, key, rows, k, lim);
    int32_t **l = NULL;
    int *n = NULL;
    if (!st && (!(l = ks_calloc(H, sizeof *l)) || !(n = ks_calloc(H, sizeof *n)))) st = KS_ERR_OOM;
    for (int r = 0; !st && r < H; r++) {
        if (!(l[r] = ks_malloc(sizeof(int32_t) * k))) { st = KS_ERR_OOM; break; }
        memcpy(l[r], h + (rows == 1 ? 0 : (size_t)r * k), sizeof(int32_t) * k);
        n[r] = k;
    }
    free(h);
    if (st) { free_head_lists(l, n, H); return st; }
    *out = l;
    *nout = n;
    return KS_OK;
}

ks_status ks_actions_host_propagate(ks_session *s, int l, int n_rows, ks_actions *a) {
    if (!a->prop_dbuf) return KS_OK;
    int32_t **ls;
    int *n;
    ks_status st = dev_list_host(s, "propagate", (ks_event_kind)a->prop_kind, l, a->prop_dbuf, 1, a->n_prop, 1, &n_rows, &ls, &n);
    if (st) return st;
    free(a->prop_idx);
    a->prop_idx = ls[0];
    free(ls);
    free(n);
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
    if (a->attend_dev) { free(a->attend_idx); free(a->n_attend); } /* pointers into attend_dbuf */
    else free_head_lists(a->attend_idx, a->n_attend, n_kv_heads);
    ks_backend *be = (ks_backend *)a->be;
    void *d[] = {a->attend_dbuf, a->retain_dbuf, a->prop_dbuf};
    for (int i = 0; i < 3; i++)
        if (d[i]) be->free(be, d[i]); /* stream-ordered on CUDA: after the work that reads it */
    if (a->attend_lend) a->attend_lend->release(a->attend_lend); /* the same */
    free(a->hold_idx);
    memset(a, 0, sizeof *a);
}

ks_status ks_actions_apply_retain(ks_session *s, int l, const ks_actions *a) {
    ks_kv_layer *L = &s->kv[l];
    ks_status sr = ks_ring_restore(s, l); /* the lists index the rows in logical order */
    if (sr) return sr;
    int32_t **ix = a->retain_idx;
    int *cnt = a->n_retain;
    if (a->retain_dbuf) { /* a device list: downloaded and checked against the layer as it is now */
        int lim[KS_DEVCHECK_HEADS] = {0}, *lm = a->retain_rows > KS_DEVCHECK_HEADS ? ks_malloc(sizeof(int) * a->retain_rows) : lim;
        if (!lm) return KS_ERR_OOM;
        for (int r = 0; r < a->retain_rows; r++) {
            lm[r] = INT32_MAX;
            for (int h = a->retain_rows == 1 ? 0 : r; h < (a->retain_rows == 1 ? L->n_kv_heads : r + 1); h++)
                lm[r] = KS_MIN(lm[r], L->n[h]);
        }
        ks_status st = dev_list_host(s, "retain", (ks_event_kind)a->retain_kind, l, a->retain_dbuf, a->retain_rows,
                                     a->retain_k, L->n_kv_heads, lm, &ix, &cnt);
        if (lm != lim) free(lm);
        if (st) return st;
        st = s->be->kv_retain(s->be, L, (const int32_t *const *)ix, cnt, 1);
        free_head_lists(ix, cnt, L->n_kv_heads);
        return st;
    }
    for (int h = 0; h < L->n_kv_heads; h++) /* lists are sorted: the last is the largest */
        if (ix[h][cnt[h] - 1] >= L->n[h])
            return ks_errorf(KS_ERR_POLICY, "retain at layer %d: row %d out of range for KV head %d (%d rows)", l,
                             ix[h][cnt[h] - 1], h, L->n[h]);
    return s->be->kv_retain(s->be, L, (const int32_t *const *)ix, cnt, 1);
}
