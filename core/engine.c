/* engine.c — the forward pass with policy events, the KV cache, sampling and generation. */
#include "engine.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MLP_CHUNK 1024 /* rows per MLP chunk: never n x ffn activations at once */

const char *ks_event_name(ks_event_kind k) {
    static const char *n[] = {"prefill_qkv", "prefill_layer_end", "prefill_end", "decode_qkv", "token"};
    return (unsigned)k < KS_EV_COUNT ? n[k] : "?";
}

/* ================================================================ actions */

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

ks_status ks_action_restart(ks_event *ev, const int32_t *idx, int k) {
    if (ev->kind != KS_EV_PREFILL_QKV) return illegal(ev, "restart");
    if (ev->pass > 0) return ks_errorf(KS_ERR_POLICY, "restart: only one restart per request (already in pass %d)", ev->pass);
    if (ev->act.restart) return ks_errorf(KS_ERR_POLICY, "restart: asked twice in one event");
    ks_status st = take_list(ev, "restart", idx, k, ev->n, &ev->act.restart_idx);
    if (st) return st;
    ev->act.n_restart = k;
    ev->act.restart = 1;
    return KS_OK;
}

ks_status ks_action_propagate(ks_event *ev, const int32_t *idx, int k) {
    if (ev->kind != KS_EV_PREFILL_QKV && ev->kind != KS_EV_PREFILL_LAYER_END) return illegal(ev, "propagate");
    if (ev->act.propagate) return ks_errorf(KS_ERR_POLICY, "propagate: asked twice in one event");
    ks_status st = take_list(ev, "propagate", idx, k, ev->n, &ev->act.prop_idx);
    if (st) return st;
    ev->act.n_prop = k;
    ev->act.propagate = 1;
    return KS_OK;
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

static void actions_clear(ks_event *ev) {
    free(ev->act.restart_idx);
    free(ev->act.prop_idx);
    free_head_lists(ev->act.retain_idx, ev->act.n_retain, ev->n_kv_heads);
    free_head_lists(ev->act.attend_idx, ev->act.n_attend, ev->n_kv_heads);
    memset(&ev->act, 0, sizeof ev->act);
}

/* ================================================================ profiler */

const char *ks_phase_name(ks_phase p) {
    static const char *n[] = {"embed", "norm", "qkv", "rope", "kv_append", "attention", "o_proj", "mlp",
                              "swiglu/add", "policy", "kv_edit", "lm_head", "sync/download", "alloc", "other"};
    return (unsigned)p < KS_PH_COUNT ? n[p] : "?";
}

static int use_stamps(const ks_session *s) { return s->be->prof_mark && s->be->prof_collect && !s->prof.host_clock; }

/* Book the time since the previous mark to phase ph. */
static void prof_mark_(ks_session *s, ks_phase ph) {
    ks_profile *p = &s->prof;
    p->calls[p->stage][ph]++;
    if (use_stamps(s)) {
        s->be->prof_mark(s->be, p->stage * KS_PH_COUNT + (int)ph);
        return;
    }
    s->be->sync(s->be); /* errors surface in the next real call */
    double t = ks_now();
    p->sec[p->stage][ph] += t - p->t_last;
    p->t_last = t;
}
/* one branch when profiling is off */
#define PROF(s, ph) do { if ((s)->prof.on) prof_mark_((s), (ph)); } while (0)

static void prof_begin(ks_session *s, int stage) {
    ks_profile *p = &s->prof;
    if (!p->on) return;
    p->stage = stage;
    p->stamps = use_stamps(s);
    if (use_stamps(s)) s->be->prof_mark(s->be, -1);
    else s->be->sync(s->be);
    p->t_begin = p->t_last = ks_now();
}

static void prof_end(ks_session *s) {
    ks_profile *p = &s->prof;
    if (!p->on) return;
    prof_mark_(s, KS_PH_OTHER);
    if (use_stamps(s)) {
        s->be->sync(s->be);
        p->wall[p->stage] += ks_now() - p->t_begin;
        double sec[2 * KS_PH_COUNT] = {0};
        if (s->be->prof_collect(s->be, sec, 2 * KS_PH_COUNT) == KS_OK)
            for (int i = 0; i < KS_PH_COUNT; i++) {
                p->sec[0][i] += sec[i];
                p->sec[1][i] += sec[KS_PH_COUNT + i];
            }
    } else {
        p->wall[p->stage] += p->t_last - p->t_begin;
    }
}

void ks_profile_reset(ks_session *s) {
    ks_profile *p = &s->prof;
    int on = p->on, hc = p->host_clock;
    if (s->be->prof_collect) { /* drop marks still pending */
        double sec[KS_PROF_TAGS] = {0};
        s->be->prof_collect(s->be, sec, KS_PROF_TAGS);
    }
    memset(p, 0, sizeof *p);
    p->on = on;
    p->host_clock = hc;
}

void ks_profile_enable(ks_session *s, int on) {
    ks_profile_reset(s);
    s->prof.on = on != 0;
    s->prof.host_clock = on == 2;
}

void ks_profile_print(const ks_profile *p, FILE *f, const char *title) {
    if (!p->forwards[0] && !p->forwards[1]) return;
    double tot[2] = {0, 0};
    for (int st = 0; st < 2; st++)
        for (int i = 0; i < KS_PH_COUNT; i++) tot[st] += p->sec[st][i];
    double np = p->forwards[0] ? (double)p->forwards[0] : 1, nd = p->forwards[1] ? (double)p->forwards[1] : 1;
    fprintf(f, "profile: %s (%s; per prefill of %ld, per decode step of %ld)\n", title ? title : "",
            p->stamps ? "backend timestamps" : "sync + host clock", p->forwards[0], p->forwards[1]);
    fprintf(f, "  %-14s %11s %7s %9s   %12s %7s %9s\n", "phase", "prefill_s", "%", "calls", "decode_ms", "%", "calls");
    for (int i = 0; i < KS_PH_COUNT; i++) {
        if (!p->calls[0][i] && !p->calls[1][i]) continue;
        fprintf(f, "  %-14s %11.4f %6.1f%% %9.0f   %12.3f %6.1f%% %9.1f\n", ks_phase_name((ks_phase)i), p->sec[0][i] / np,
                tot[0] > 0 ? 100 * p->sec[0][i] / tot[0] : 0.0, p->calls[0][i] / np, 1e3 * p->sec[1][i] / nd,
                tot[1] > 0 ? 100 * p->sec[1][i] / tot[1] : 0.0, p->calls[1][i] / nd);
    }
    fprintf(f, "  %-14s %11.4f %7s %9s   %12.3f\n", "sum", tot[0] / np, "", "", 1e3 * tot[1] / nd);
    fprintf(f, "  %-14s %11.4f %7s %9s   %12.3f   (host clock: first mark to the device done)\n", "wall",
            p->wall[0] / np, "", "", 1e3 * p->wall[1] / nd);
}

/* ================================================================ session */

static void dec_free(ks_session *s);       /* the decode state (forward section) */
static void dec_drop_graph(ks_session *s);

ks_status ks_session_new(ks_model *m, ks_session **out) {
    ks_session *s = ks_calloc(1, sizeof *s);
    if (!s) return KS_ERR_OOM;
    s->m = m;
    s->be = m->be;
    s->stopped_at = -1;
    const ks_config *c = &m->cfg;
    s->kv = ks_calloc(c->n_layers, sizeof *s->kv);
    s->logits = m->be->host_alloc ? m->be->host_alloc(m->be, sizeof(float) * c->vocab)
                                  : ks_malloc(sizeof(float) * c->vocab);
    s->prop_layer_n = ks_calloc(c->n_layers, sizeof(int));
    if (!s->kv || !s->logits || !s->prop_layer_n) { ks_session_free_(s); return KS_ERR_OOM; }
    for (int l = 0; l < c->n_layers; l++) {
        s->kv[l].n_kv_heads = c->n_kv_heads;
        s->kv[l].head_dim = c->head_dim;
    }
    if (m->be->opts.profile) ks_profile_enable(s, m->be->opts.profile); /* the backend's option */
    *out = s;
    return KS_OK;
}

void ks_session_reset(ks_session *s) {
    dec_free(s);
    for (int l = 0; l < s->m->cfg.n_layers; l++) {
        s->be->kv_free(s->be, &s->kv[l]);
        s->kv[l].n_kv_heads = s->m->cfg.n_kv_heads;
        s->kv[l].head_dim = s->m->cfg.head_dim;
    }
    s->n_past = 0;
    s->n_tokens = 0;
    s->n_prompt = 0;
    s->restarted = 0;
    free(s->restart_idx);
    s->restart_idx = NULL;
    s->n_restart = 0;
    s->stopped_at = -1;
    s->policy_failed = 0;
    s->policy_error[0] = 0;
    s->t_prefill = s->t_decode = 0;
    s->n_decoded = 0;
    s->graph_steps = 0;
}

void ks_session_free_(ks_session *s) {
    if (!s) return;
    if (s->prof.on && s->be->opts.profile && ks_log_on()) { /* profiled by the backend's option: the table goes to the host's log */
        char *t = NULL;
        size_t tn = 0;
        FILE *f = open_memstream(&t, &tn);
        if (f) {
            ks_profile_print(&s->prof, f, "session");
            if (!fclose(f) && tn) ks_logf(KS_LOG_INFO, "%s", t);
        }
        free(t);
    }
    if (s->kv) {
        for (int l = 0; l < s->m->cfg.n_layers; l++) s->be->kv_free(s->be, &s->kv[l]);
        free(s->kv);
    }
    dec_free(s);
    if (s->logits) {
        if (s->be->host_alloc) s->be->host_free(s->be, s->logits);
        else free(s->logits);
    }
    free(s->tokens);
    free(s->restart_idx);
    free(s->prop_layer_n);
    free(s);
}

static ks_status push_tokens(ks_session *s, const int32_t *ids, int n) {
    if (s->n_tokens + n > s->cap_tokens) {
        int cap = KS_MAX(s->n_tokens + n, s->cap_tokens * 2 + 64);
        int32_t *t = ks_realloc(s->tokens, sizeof(int32_t) * cap);
        if (!t) return KS_ERR_OOM;
        s->tokens = t;
        s->cap_tokens = cap;
    }
    memcpy(s->tokens + s->n_tokens, ids, sizeof(int32_t) * n);
    s->n_tokens += n;
    return KS_OK;
}

size_t ks_session_kv_rows(const ks_session *s, int layer) {
    size_t r = 0;
    const ks_kv_layer *L = &s->kv[layer];
    if (!L->n) return 0;
    for (int h = 0; h < L->n_kv_heads; h++) r += L->n[h];
    return r;
}

/* ================================================================ forward */

/* Scratch activations for a forward over n rows. Five row buffers, each used for several
 * things in turn (a layer never needs more at once):
 *   x    residual stream                                  (n, dim)
 *   xn   rmsnorm output; then the attention output        (n, max(dim, n_heads*head_dim))
 *   q    queries; then the o-proj and the MLP outputs     (n, max(dim, n_heads*head_dim))
 *   k, v keys and values of this step, until appended     (n, n_kv_heads*head_dim)
 * plus the MLP's gate/up for one chunk of rows            (min(n, MLP_CHUNK), ffn) each.
 * (The attention output can't take q's buffer: attention reads q while writing it.) */
typedef struct fwd_buf {
    float *x, *xn, *q, *k, *v, *kpre, *gate, *up;
} fwd_buf;

static void fwd_free(ks_backend *be, fwd_buf *b) {
    float *p[] = {b->x, b->xn, b->q, b->k, b->v, b->gate, b->up};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++)
        if (p[i]) be->free(be, p[i]);
    memset(b, 0, sizeof *b);
}

/* Bytes fwd_alloc takes for n rows (bench notes and tests). */
static size_t fwd_bytes(const ks_config *c, int n) {
    size_t D = c->dim, QD = (size_t)c->n_heads * c->head_dim, KD = (size_t)c->n_kv_heads * c->head_dim;
    size_t W = KS_MAX(D, QD), ch = (size_t)KS_MIN(n, MLP_CHUNK);
    return sizeof(float) * ((size_t)n * (D + 2 * W + 2 * KD) + 2 * ch * c->ffn);
}

static ks_status fwd_alloc(ks_backend *be, const ks_config *c, int n, int pre_rope, fwd_buf *b) {
    size_t D = c->dim, QD = (size_t)c->n_heads * c->head_dim, KD = (size_t)c->n_kv_heads * c->head_dim;
    size_t W = KS_MAX(D, QD), ch = (size_t)KS_MIN(n, MLP_CHUNK);
    memset(b, 0, sizeof *b);
    b->x = be->alloc(be, sizeof(float) * n * D);
    b->xn = be->alloc(be, sizeof(float) * n * W);
    b->q = be->alloc(be, sizeof(float) * n * W);
    b->k = be->alloc(be, sizeof(float) * n * KD);
    b->v = be->alloc(be, sizeof(float) * n * KD);
    int own_mlp = n > 1 && be->mlp; /* the backend's prefill MLP brings its own intermediates */
    if (!own_mlp) {
        b->gate = be->alloc(be, sizeof(float) * ch * c->ffn);
        b->up = be->alloc(be, sizeof(float) * ch * c->ffn);
    }
    if (pre_rope) b->kpre = b->k; /* marks pre-RoPE mode: k stays unrotated */
    if (!b->x || !b->xn || !b->q || !b->k || !b->v || (!own_mlp && (!b->gate || !b->up))) {
        fwd_free(be, b);
        return ks_errorf(KS_ERR_OOM, "%s: out of memory for activations of %d rows (%.1f MiB)", be->name, n,
                         fwd_bytes(c, n) / 1048576.0);
    }
    return KS_OK;
}

/* Layer body after attention (its output in xn): o-proj, residual, MLP (chunked), residual.
 * x (n, dim) updated; q and xn are overwritten. */
static ks_status layer_tail(ks_session *s, int l, fwd_buf *b, int n) {
    ks_backend *be = s->be;
    const ks_config *c = &s->m->cfg;
    const ks_layer_w *W = &s->m->layers[l];
    int D = c->dim, QD = c->n_heads * c->head_dim, F = c->ffn;
    float *out = b->q; /* q is dead once attention ran */
    /* one row (decode): the residual adds fold into the projections, gate/up/SwiGLU in one call */
    int acc = n == 1 && be->matmul_add, fsw = n == 1 && be->matmul_swiglu;
    /* a backend with its own prefill MLP also folds the o-projection's residual into the GEMM */
    int acc_o = acc || (n > 1 && be->mlp && be->matmul_add);
    ks_status st;
    if (acc_o) {
        if ((st = be->matmul_add(be, b->x, b->xn, W->wo, W->bo, n, QD, D))) return st;
        PROF(s, KS_PH_OPROJ);
    } else {
        if ((st = be->matmul(be, out, b->xn, W->wo, W->bo, n, QD, D))) return st;
        PROF(s, KS_PH_OPROJ);
        if ((st = be->add(be, b->x, out, (size_t)n * D))) return st;
        PROF(s, KS_PH_ELEMWISE);
    }
    if (!fsw) { /* (fused: the norm runs inside matmul_swiglu) */
        if ((st = be->rmsnorm(be, b->xn, b->x, W->ffn_norm, n, D, c->eps))) return st;
        PROF(s, KS_PH_NORM);
    }
    if (n > 1 && be->mlp) { /* the backend's own prefill MLP (residual folded in) */
        st = be->mlp(be, b->x, b->xn, W->w_gate, W->w_up, W->w_down, n, D, F);
        PROF(s, KS_PH_MLP);
        return st;
    }
    for (int r0 = 0; r0 < n; r0 += MLP_CHUNK) {
        int rn = KS_MIN(MLP_CHUNK, n - r0);
        const float *xin = b->xn + (size_t)r0 * D;
        if (fsw) { /* n == 1: one chunk */
            st = be->matmul_swiglu(be, b->gate, b->x, W->ffn_norm, c->eps, b->xn, W->w_gate, W->w_up, b->up, rn, D, F);
            if (st) return st;
            PROF(s, KS_PH_MLP);
        } else {
            if ((st = be->matmul(be, b->gate, xin, W->w_gate, NULL, rn, D, F))) return st;
            if ((st = be->matmul(be, b->up, xin, W->w_up, NULL, rn, D, F))) return st;
            PROF(s, KS_PH_MLP);
            if ((st = be->swiglu(be, b->gate, b->gate, b->up, (size_t)rn * F))) return st;
            PROF(s, KS_PH_ELEMWISE);
        }
        if (acc) st = be->matmul_add(be, b->x + (size_t)r0 * D, b->gate, W->w_down, NULL, rn, F, D);
        else st = be->matmul(be, out + (size_t)r0 * D, b->gate, W->w_down, NULL, rn, F, D);
        if (st) return st;
        PROF(s, KS_PH_MLP);
    }
    if (acc) return KS_OK;
    st = be->add(be, b->x, out, (size_t)n * D);
    PROF(s, KS_PH_ELEMWISE);
    return st;
}

/* q, k, v of n rows at positions pos, RoPE applied; kpre keeps k before RoPE when asked. */
static ks_status layer_qkv(ks_session *s, int l, fwd_buf *b, int n, const int32_t *pos, int max_pos) {
    ks_backend *be = s->be;
    const ks_config *c = &s->m->cfg;
    const ks_layer_w *W = &s->m->layers[l];
    int D = c->dim, QD = c->n_heads * c->head_dim, KD = c->n_kv_heads * c->head_dim;
    ks_status st;
    /* one row (decode), or prefill on a backend with its own prefill MLP (one bf16 copy of the
     * rows for the three projections): norm, projections and RoPE in one call, booked to qkv */
    if ((n == 1 || be->mlp) && be->matmul_qkv) {
        st = be->matmul_qkv(be, b->q, b->k, b->v, b->x, W->attn_norm, c->eps, b->xn, W->wq, W->wk, W->wv, W->bq, W->bk,
                            W->bv, n, D, c->n_heads, c->n_kv_heads, c->head_dim, pos, b->kpre ? NULL : &c->rope, max_pos);
        PROF(s, KS_PH_QKV);
        return st;
    }
    if ((st = be->rmsnorm(be, b->xn, b->x, W->attn_norm, n, D, c->eps))) return st;
    PROF(s, KS_PH_NORM);
    if ((st = be->matmul(be, b->q, b->xn, W->wq, W->bq, n, D, QD))) return st;
    if ((st = be->matmul(be, b->k, b->xn, W->wk, W->bk, n, D, KD))) return st;
    if ((st = be->matmul(be, b->v, b->xn, W->wv, W->bv, n, D, KD))) return st;
    PROF(s, KS_PH_QKV);
    if (b->kpre) return KS_OK; /* pre-RoPE mode: attention rotates q and k itself */
    if ((st = be->rope(be, b->q, n, c->n_heads, pos, &c->rope, max_pos))) return st;
    st = be->rope(be, b->k, n, c->n_kv_heads, pos, &c->rope, max_pos);
    PROF(s, KS_PH_ROPE);
    return st;
}

/* Run one policy handler (if any) and turn its failure into a policy error. */
static ks_status fire(ks_session *s, ks_event *ev) {
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

static void event_init(ks_session *s, ks_event *ev, ks_event_kind kind, int layer, int pass, int n) {
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

static ks_status check_interrupt(ks_session *s) {
    if (s->interrupt && *s->interrupt) return ks_errorf(KS_ERR_INTERRUPTED, "interrupted");
    return KS_OK;
}

/* Final norm + lm_head of row `row` of x into lg (vocab, backend). */
static ks_status head_compute(ks_session *s, fwd_buf *b, int row, float *lg) {
    ks_backend *be = s->be;
    const ks_config *c = &s->m->cfg;
    ks_status st;
    float *xr = b->x + (size_t)row * c->dim;
    if ((st = be->rmsnorm(be, b->xn, xr, s->m->final_norm, 1, c->dim, c->eps))) return st;
    PROF(s, KS_PH_NORM);
    st = be->matmul(be, lg, b->xn, s->m->lm_head, NULL, 1, c->dim, c->vocab);
    PROF(s, KS_PH_LM_HEAD);
    return st;
}

/* Logits of row `row` of x: final norm + lm_head, into s->logits (host). */
static ks_status head_logits(ks_session *s, fwd_buf *b, int row) {
    ks_backend *be = s->be;
    const ks_config *c = &s->m->cfg;
    float *lg = be->alloc(be, sizeof(float) * c->vocab);
    if (!lg) return KS_ERR_OOM;
    PROF(s, KS_PH_ALLOC);
    ks_status st = head_compute(s, b, row, lg);
    if (!st) st = be->download(be, s->logits, lg, sizeof(float) * c->vocab);
    PROF(s, KS_PH_SYNC);
    be->free(be, lg);
    return st;
}

/* Validate retention lists against the layer as it is now and apply them. */
static ks_status apply_retain(ks_session *s, int l, ks_event *ev) {
    ks_kv_layer *L = &s->kv[l];
    for (int h = 0; h < L->n_kv_heads; h++)
        if (ev->act.retain_idx[h][ev->act.n_retain[h] - 1] >= L->n[h])
            return ks_errorf(KS_ERR_POLICY, "retain at layer %d: row %d out of range for KV head %d (%d rows)", l,
                             ev->act.retain_idx[h][ev->act.n_retain[h] - 1], h, L->n[h]);
    return s->be->kv_retain(s->be, L, (const int32_t *const *)ev->act.retain_idx, ev->act.n_retain, 1);
}

/* One forward over rows ids_in (a whole prompt, or one chunk of a chunked prefill). */
static ks_status prefill_once(ks_session *s, const int32_t *ids_in, int n_in, int chunked) {
    const ks_config *c = &s->m->cfg;
    ks_backend *be = s->be;
    ks_status st = KS_OK;
    const ks_policy *pol = s->policy;
    int base = s->n_past, pass = 0;
    int n = n_in;
    int32_t *ids = ks_malloc(sizeof(int32_t) * n), *pos = ks_malloc(sizeof(int32_t) * n),
            *orig = ks_malloc(sizeof(int32_t) * n);
    fwd_buf b = {0};
    ks_event ev;
    memset(&ev, 0, sizeof ev);
    s->discard_kv = 0;
    prof_begin(s, 0);
    if (!ids || !pos || !orig) { st = KS_ERR_OOM; goto out; }
    for (int i = 0; i < n; i++) { ids[i] = ids_in[i]; pos[i] = base + i; orig[i] = i; }

restart:
    if ((st = fwd_alloc(be, c, n, pol && pol->want_pre_rope_keys, &b))) goto out;
    PROF(s, KS_PH_ALLOC);
    if ((st = be->embed(be, b.x, s->m->embed, ids, n, c->dim))) goto out;
    PROF(s, KS_PH_EMBED);
    for (int l = 0; l < c->n_layers; l++) {
        if ((st = check_interrupt(s))) goto out;
        int max_pos = pos[n - 1];
        for (int i = 0; i < n; i++) max_pos = KS_MAX(max_pos, pos[i]);
        PROF(s, KS_PH_OTHER);
        if ((st = layer_qkv(s, l, &b, n, pos, max_pos))) goto out;
        int stop = 0;
        ks_event keep; /* actions carried past attention */
        memset(&keep, 0, sizeof keep);
        if (pol && pol->on[KS_EV_PREFILL_QKV]) {
            event_init(s, &ev, KS_EV_PREFILL_QKV, l, pass, n);
            ev.q = b.q; ev.k = b.k; ev.v = b.v; ev.k_pre = b.kpre;
            ev.pos = pos; ev.ids = ids; ev.orig = orig; ev.kv = &s->kv[l];
            st = fire(s, &ev);
            PROF(s, KS_PH_POLICY);
            if (st) { actions_clear(&ev); goto out; } /* a failed handler may have asked for actions */
            if (ev.act.restart && chunked) {
                actions_clear(&ev);
                st = ks_errorf(KS_ERR_POLICY, "restart is not allowed in a chunked prefill");
                goto out;
            }
            if (ev.act.discard_kv) {
                if (chunked) st = ks_errorf(KS_ERR_POLICY, "discard_kv is not allowed in a chunked prefill");
                else if (base > 0)
                    st = ks_errorf(KS_ERR_POLICY, "discard_kv: only in the first prefill of a session (it holds %d tokens)",
                                   base);
                if (st) { actions_clear(&ev); goto out; }
                s->discard_kv = 1;
            }
            if (ev.act.restart) {
                /* abandon this pass: fresh prefill on the chosen ids, positions renumbered */
                int k = ev.act.n_restart;
                for (int i = 0; i < k; i++) {
                    int j = ev.act.restart_idx[i];
                    ids[i] = ids[j];
                    orig[i] = orig[j];
                    pos[i] = base + i;
                }
                actions_clear(&ev);
                free(s->restart_idx);
                s->restart_idx = ks_malloc(sizeof(int32_t) * k);
                if (!s->restart_idx) { s->n_restart = 0; st = KS_ERR_OOM; goto out; }
                memcpy(s->restart_idx, orig, sizeof(int32_t) * k);
                s->n_restart = k;
                s->restarted = 1;
                n = k;
                fwd_free(be, &b);
                PROF(s, KS_PH_ALLOC);
                for (int j = 0; j <= l; j++) {
                    /* drop what this pass appended */
                    be->kv_free(be, &s->kv[j]);
                    s->kv[j].n_kv_heads = c->n_kv_heads;
                    s->kv[j].head_dim = c->head_dim;
                }
                PROF(s, KS_PH_KV_EDIT);
                s->discard_kv = 0;
                pass++;
                goto restart;
            }
            keep.act = ev.act;
            memset(&ev.act, 0, sizeof ev.act);
        }
        if ((st = be->kv_append(be, &s->kv[l], b.k, b.v, pos, n))) { ev.act = keep.act; actions_clear(&ev); goto out; }
        PROF(s, KS_PH_KV_APPEND);
        ks_attn_args aa = {.n = n, .n_heads = c->n_heads, .qpos = pos, .scale = 1.0f / sqrtf((float)c->head_dim),
                           .window = c->sliding_window};
        if (b.kpre) { aa.rope = &c->rope; aa.rope_max_pos = max_pos; }
        if (keep.act.attend) {
            aa.idx = (const int32_t *const *)keep.act.attend_idx;
            aa.n_idx = keep.act.n_attend;
            aa.renumber = keep.act.renumber;
        }
        /* the attention output goes to xn (free until the MLP's norm), see fwd_buf */
        st = be->attention(be, b.xn, b.q, &s->kv[l], &aa);
        PROF(s, KS_PH_ATTENTION);
        if (st) { ev.act = keep.act; actions_clear(&ev); goto out; }
        if (s->discard_kv) {
            /* this pass's KV rows are not kept (a restart follows): free them now */
            be->kv_free(be, &s->kv[l]);
            s->kv[l].n_kv_heads = c->n_kv_heads;
            s->kv[l].head_dim = c->head_dim;
            PROF(s, KS_PH_KV_EDIT);
        }
        if ((st = layer_tail(s, l, &b, n))) { ev.act = keep.act; actions_clear(&ev); goto out; }
        if (pol && pol->on[KS_EV_PREFILL_LAYER_END]) {
            event_init(s, &ev, KS_EV_PREFILL_LAYER_END, l, pass, n);
            ev.hidden = b.x; ev.pos = pos; ev.ids = ids; ev.orig = orig; ev.kv = &s->kv[l];
            ev.act = keep.act; /* actions accumulate; a second ask of the same one is an error */
            memset(&keep.act, 0, sizeof keep.act);
            st = fire(s, &ev);
            PROF(s, KS_PH_POLICY);
            keep.act = ev.act;
            memset(&ev.act, 0, sizeof ev.act);
            if (st) { ev.act = keep.act; actions_clear(&ev); goto out; }
        }
        ev.act = keep.act;
        ev.n_kv_heads = c->n_kv_heads;
        if (ev.act.retain && s->discard_kv) {
            actions_clear(&ev);
            st = ks_errorf(KS_ERR_POLICY, "retain at layer %d: this pass's KV rows were discarded (discard_kv)", l);
            goto out;
        }
        if (ev.act.retain) {
            st = apply_retain(s, l, &ev);
            PROF(s, KS_PH_KV_EDIT);
            if (st) { actions_clear(&ev); goto out; }
        }
        if (ev.act.propagate) {
            int k = ev.act.n_prop;
            const int32_t *ix = ev.act.prop_idx;
            st = be->gather_rows(be, b.x, b.x, ix, k, c->dim);
            PROF(s, KS_PH_KV_EDIT);
            if (st) { actions_clear(&ev); goto out; }
            for (int i = 0; i < k; i++) { ids[i] = ids[ix[i]]; pos[i] = pos[ix[i]]; orig[i] = orig[ix[i]]; }
            n = k;
        }
        stop = ev.act.stop;
        actions_clear(&ev);
        s->prop_layer_n[l] = n;
        if (stop) { s->stopped_at = l; break; }
    }
    if (s->discard_kv) {
        /* the pass ended (all layers, or stop()) without the restart discard_kv promised */
        for (int j = 0; j < c->n_layers; j++) {
            be->kv_free(be, &s->kv[j]);
            s->kv[j].n_kv_heads = c->n_kv_heads;
            s->kv[j].head_dim = c->head_dim;
        }
        st = ks_errorf(KS_ERR_POLICY, "discard_kv: the first pass %s without a restart, and its KV rows are gone",
                       s->stopped_at >= 0 ? "stopped" : "completed");
        goto out;
    }
    if ((st = head_logits(s, &b, n - 1))) goto out;
    s->n_past = pos[n - 1] + 1;
    if (pol && pol->on[KS_EV_PREFILL_END]) {
        event_init(s, &ev, KS_EV_PREFILL_END, -1, pass, n);
        ev.pos = pos; ev.ids = ids; ev.orig = orig;
        st = fire(s, &ev);
        PROF(s, KS_PH_POLICY);
        if (!st && (ev.act.restart || ev.act.propagate || ev.act.retain || ev.act.attend))
            st = ks_errorf(KS_ERR_INTERNAL, "prefill_end: unexpected action");
        actions_clear(&ev);
    }
out:
    fwd_free(be, &b);
    PROF(s, KS_PH_ALLOC);
    s->discard_kv = 0;
    prof_end(s);
    free(ids);
    free(pos);
    free(orig);
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
    dec_drop_graph(s); /* the cache changes under it */
    ks_status st = push_tokens(s, ids_in, n_in);
    if (st) return st;
    if (s->n_prompt == 0) s->n_prompt = n_in;
    s->stopped_at = -1;
    if (s->n_past == 0 && s->policy && s->policy->begin) {
        st = s->policy->begin(s->policy->ud, s);
        if (st) /* like fire(): keep policy errors, interrupts and OOM as they are */
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

/* ---------------------------------------------------------------- decode */

/* What decode steps keep between calls (on a backend with graphs; freed after each step on others,
 * and by ks_session_reset): the one-row activations and the device logits (so no
 * step allocates), and on a backend with graphs the recorded step with what it assumed (the
 * contract of ks_backend.graph_begin): each layer's storage and per-head row counts at the
 * recording, its position, and the longrope factor choice (the inv_freq table it read). */
typedef struct ks_decode_state {
    fwd_buf b;
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
} ks_decode_state;

static void dec_drop_graph(ks_session *s) {
    ks_decode_state *d = s->dec;
    if (!d || !d->g) return;
    s->be->graph_free(s->be, d->g);
    d->g = NULL;
    d->ready = 0;
}

static void dec_free(ks_session *s) {
    ks_decode_state *d = s->dec;
    if (!d) return;
    dec_drop_graph(s);
    fwd_free(s->be, &d->b);
    if (d->lg) s->be->free(s->be, d->lg);
    free(d->k);
    free(d->n0);
    free(d);
    s->dec = NULL;
}

/* The decode state with buffers for pre-RoPE mode `pre` (reallocated when the mode changes). */
static ks_status dec_get(ks_session *s, int pre, ks_decode_state **out) {
    const ks_config *c = &s->m->cfg;
    ks_backend *be = s->be;
    ks_decode_state *d = s->dec;
    if (!d) {
        d = ks_calloc(1, sizeof *d);
        if (!d) return KS_ERR_OOM;
        d->k = ks_calloc((size_t)4 * c->n_layers, sizeof(void *));
        d->n0 = ks_calloc((size_t)c->n_layers * c->n_kv_heads, sizeof(int));
        if (!d->k || !d->n0) { free(d->k); free(d->n0); free(d); return KS_ERR_OOM; }
        d->v = d->k + c->n_layers;
        d->pd = d->v + c->n_layers;
        d->cap = (int *)(d->pd + c->n_layers);
        s->dec = d;
    }
    if (d->b.x && d->pre != pre) {
        dec_drop_graph(s);
        fwd_free(be, &d->b);
    }
    if (!d->b.x) {
        ks_status st = fwd_alloc(be, c, 1, pre, &d->b);
        if (st) return st;
        d->pre = pre;
    }
    if (!d->lg && !(d->lg = be->alloc(be, sizeof(float) * c->vocab)))
        return ks_errorf(KS_ERR_OOM, "%s: out of memory for the logits", be->name);
    *out = d;
    return KS_OK;
}

/* The device work of one decode step: embed `id` at `pos`, every layer (the policy's decode
 * event included), the final norm and lm_head into lg (vocab, backend). */
static ks_status decode_body(ks_session *s, fwd_buf *b, int32_t id, int32_t pos, float *lg) {
    const ks_config *c = &s->m->cfg;
    ks_backend *be = s->be;
    const ks_policy *pol = s->policy;
    ks_event ev;
    memset(&ev, 0, sizeof ev);
    ks_status st;
    if ((st = be->embed(be, b->x, s->m->embed, &id, 1, c->dim))) return st;
    PROF(s, KS_PH_EMBED);
    for (int l = 0; l < c->n_layers; l++) {
        if (!b->kpre && be->matmul_qkv_append) { /* norm, projections, RoPE and the cache row in one call */
            const ks_layer_w *W = &s->m->layers[l];
            st = be->matmul_qkv_append(be, &s->kv[l], b->q, b->k, b->v, b->x, W->attn_norm, c->eps, b->xn, W->wq, W->wk,
                                       W->wv, W->bq, W->bk, W->bv, 1, c->dim, c->n_heads, c->n_kv_heads, c->head_dim,
                                       &pos, &c->rope, pos);
            PROF(s, KS_PH_QKV);
            if (st) return st;
        } else {
            if ((st = layer_qkv(s, l, b, 1, &pos, pos))) return st;
            st = be->kv_append(be, &s->kv[l], b->k, b->v, &pos, 1);
            PROF(s, KS_PH_KV_APPEND);
            if (st) return st;
        }
        ks_attn_args aa = {.n = 1, .n_heads = c->n_heads, .qpos = &pos, .scale = 1.0f / sqrtf((float)c->head_dim),
                           .window = c->sliding_window};
        if (b->kpre) { aa.rope = &c->rope; aa.rope_max_pos = pos; }
        int have_ev = 0;
        if (pol && pol->on[KS_EV_DECODE_QKV]) {
            event_init(s, &ev, KS_EV_DECODE_QKV, l, 0, 1);
            ev.q = b->q; ev.k = b->k; ev.v = b->v; ev.k_pre = b->kpre;
            ev.pos = &pos; ev.ids = &id; ev.kv = &s->kv[l];
            st = fire(s, &ev);
            PROF(s, KS_PH_POLICY);
            if (st) { actions_clear(&ev); return st; }
            have_ev = 1;
            if (ev.act.attend) {
                aa.idx = (const int32_t *const *)ev.act.attend_idx;
                aa.n_idx = ev.act.n_attend;
                aa.renumber = ev.act.renumber;
            }
        }
        st = be->attention(be, b->xn, b->q, &s->kv[l], &aa); /* output to xn, see fwd_buf */
        PROF(s, KS_PH_ATTENTION);
        if (!st && have_ev && ev.act.retain) {
            st = apply_retain(s, l, &ev);
            PROF(s, KS_PH_KV_EDIT);
        }
        if (have_ev) actions_clear(&ev);
        if (st) return st;
        if ((st = layer_tail(s, l, b, 1))) return st;
    }
    return head_compute(s, b, 0, lg);
}

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

/* Book the row a graph run wrote at `pos` in every layer (what matmul_qkv_append does on the host). */
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
        if (st == KS_ERR_UNSUPPORTED) { dec_drop_graph(s); return st; }
        if (st) return st;
        dec_book_rows(s, pos);
        s->graph_steps++;
        return KS_OK;
    }
    dec_drop_graph(s);
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
        dec_drop_graph(s);
        return st;
    }
    s->graph_steps++;
    return KS_OK;
}

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
    prof_begin(s, 1);
    if (s->prof.on) s->prof.forwards[1]++;
    ks_status st = dec_get(s, pre, &d);
    PROF(s, KS_PH_ALLOC);
    if (!st) st = push_tokens(s, &id, 1);
    if (st) goto out;
    /* a graph when the step is the same every token: no decode-time policy handler, keys rotated
     * as stored, no profiling marks */
    int graphs = be->graph_begin && !pre && be->matmul_qkv_append && !(pol && pol->on[KS_EV_DECODE_QKV]) && !s->prof.on;
    st = graphs ? decode_graph(s, d, id, pos) : KS_ERR_UNSUPPORTED;
    if (st == KS_ERR_UNSUPPORTED) {
        ks_clear_error();
        st = decode_body(s, &d->b, id, pos, d->lg);
        if (!st) d->ready++;
    }
    if (!st) st = be->download(be, s->logits, d->lg, sizeof(float) * c->vocab);
    PROF(s, KS_PH_SYNC);
    if (!st) s->n_past++;
out:
    /* the buffers stay for the next step only where a graph may read them; elsewhere a step
     * leaves no scratch behind (allocating one row's buffers costs nothing there) */
    if (!be->graph_begin) dec_free(s);
    PROF(s, KS_PH_ALLOC);
    prof_end(s);
    s->t_decode += ks_now() - t0;
    return st;
}

/* ================================================================ sampling */

static uint64_t rng_next(uint64_t *s) { /* splitmix64 */
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void ks_sampler_init(ks_sampler *s, float temperature, float top_p, uint64_t seed) {
    s->temperature = temperature;
    s->top_p = top_p <= 0 || top_p > 1 ? 1 : top_p;
    s->seed = seed;
    s->state = seed;
    s->top_k = 0;
    s->min_p = 0;
}

typedef struct { float p; int32_t id; } prob_id;
static int cmp_prob(const void *a, const void *b) {
    const prob_id *x = a, *y = b;
    if (x->p != y->p) return x->p < y->p ? 1 : -1;
    return (x->id > y->id) - (x->id < y->id);
}

/* The lowest index of the largest logit; NaNs never win except at index 0, which then stays (the
 * scalar rule `if (l[i] > l[best]) best = i`). The maximum comes from 8 independent lanes, which
 * the compiler vectorises; the plain loop's compare against a reloaded l[best] ran at ~3.7 ns per
 * element (0.47 ms for a 128K vocabulary, paid between every two decode steps). */
static int32_t argmax_f32(const float *l, int n) {
    if (n < 1 || l[0] != l[0]) return 0;
    float m[8];
    for (int j = 0; j < 8; j++) m[j] = -INFINITY;
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) m[j] = l[i + j] > m[j] ? l[i + j] : m[j];
    float mx = m[0];
    for (int j = 1; j < 8; j++) mx = m[j] > mx ? m[j] : mx;
    for (; i < n; i++) mx = l[i] > mx ? l[i] : mx;
    for (i = 0; i < n; i++)
        if (l[i] == mx) return i;
    return 0; /* not reached: mx is l[0] or larger and is some element */
}

int32_t ks_sample(ks_sampler *s, const float *logits, int vocab) {
    int32_t best = argmax_f32(logits, vocab);
    if (s->temperature <= 0) return best;
    prob_id *pi = malloc(sizeof(prob_id) * vocab);
    if (!pi) return best;
    double sum = 0, mx = logits[best];
    for (int i = 0; i < vocab; i++) {
        pi[i].p = (float)exp((logits[i] - mx) / s->temperature);
        pi[i].id = i;
        sum += pi[i].p;
    }
    qsort(pi, vocab, sizeof *pi, cmp_prob);
    /* top_k: the k first; top_p then counts shares of their mass (top_k off: of the whole sum,
     * summed in id order as always, so the draws stay bit-identical) */
    int keep = vocab;
    if (s->top_k > 0 && s->top_k < vocab) {
        keep = s->top_k;
        sum = 0;
        for (int i = 0; i < keep; i++) sum += pi[i].p;
    }
    double cum = 0;
    for (int i = 0; i < keep; i++) {
        cum += pi[i].p / sum;
        if (cum >= s->top_p) { keep = i + 1; break; }
    }
    /* min_p: relative to the most likely token, pi[0]; the first always stays */
    if (s->min_p > 0) {
        double floor_p = (double)s->min_p * pi[0].p;
        int k = 1;
        while (k < keep && pi[k].p >= floor_p) k++;
        keep = k;
    }
    double mass = 0;
    for (int i = 0; i < keep; i++) mass += pi[i].p;
    double r = (double)(rng_next(&s->state) >> 11) * (1.0 / 9007199254740992.0) * mass;
    int32_t out = pi[keep - 1].id;
    for (int i = 0; i < keep; i++) {
        r -= pi[i].p;
        if (r < 0) { out = pi[i].id; break; }
    }
    free(pi);
    return out;
}

void ks_repeat_penalty(float *logits, const unsigned char *seen, int vocab, float penalty) {
    for (int i = 0; i < vocab; i++)
        if (seen[i]) logits[i] = logits[i] > 0 ? logits[i] / penalty : logits[i] * penalty;
}

/* ================================================================ generation */

long ks_stop_find(const char *text, size_t len, const char *const *stop, int n) {
    long best = -1;
    for (int j = 0; j < n; j++) {
        size_t k = strlen(stop[j]);
        if (k == 0 || k > len) continue;
        size_t lim = best >= 0 ? (size_t)best : len - k; /* an earlier hit is all that matters */
        for (size_t i = 0; i <= lim && i + k <= len; i++)
            if (text[i] == stop[j][0] && !memcmp(text + i, stop[j], k)) { best = (long)i; break; }
    }
    return best;
}

/* Bytes at the end of text[0..len) that are a proper prefix of some stop string (the longest
 * such suffix): they may become a stop string with the next token, so they wait. */
static size_t stop_holdback(const char *text, size_t len, const char *const *stop, int n) {
    size_t hold = 0;
    for (int j = 0; j < n; j++) {
        size_t k = strlen(stop[j]);
        for (size_t m = k > 0 ? KS_MIN(k - 1, len) : 0; m > hold; m--)
            if (!memcmp(text + len - m, stop[j], m)) { hold = m; break; }
    }
    return hold;
}

static int is_eos(const ks_config *c, int32_t id) {
    for (int i = 0; i < c->n_eos; i++)
        if (c->eos[i] == id) return 1;
    return 0;
}

/* Longest prefix of s (len n) that is complete UTF-8. */
static size_t utf8_complete(const char *s, size_t n) {
    size_t i = n, back = 0;
    while (i > 0 && back < 4) {
        unsigned char ch = (unsigned char)s[i - 1];
        if ((ch & 0xC0) != 0x80) {
            size_t need = ch < 0x80 ? 1 : (ch >> 5) == 6 ? 2 : (ch >> 4) == 14 ? 3 : (ch >> 3) == 30 ? 4 : 1;
            return (back + 1 >= need) ? n : i - 1;
        }
        i--;
        back++;
    }
    return n;
}

ks_status ks_session_generate(ks_session *s, const int32_t *ids, int n, const ks_gen_params *p, ks_token_cb cb,
                              void *ud, int32_t **out_ids, int *n_out) {
    const ks_config *c = &s->m->cfg;
    if (out_ids) *out_ids = NULL;
    if (n_out) *n_out = 0;
    if (p->max_new < 0) return ks_errorf(KS_ERR_ARG, "generate: max_new must be >= 0");
    ks_status st = ks_session_prefill(s, ids, n);
    if (st) return st;
    ks_sampler smp;
    ks_sampler_init(&smp, p->temperature, p->top_p, p->seed);
    smp.top_k = p->top_k;
    smp.min_p = p->min_p;
    /* the repetition penalty works on a copy of the logits (s->logits stay the model's), with a
     * byte per vocabulary entry marking the tokens of the context */
    int penal = p->repeat_penalty > 0 && p->repeat_penalty != 1;
    float *plog = NULL;
    unsigned char *seen = NULL;
    if (penal) {
        plog = ks_malloc(sizeof(float) * (size_t)c->vocab);
        seen = calloc((size_t)c->vocab, 1);
        if (!plog || !seen) { free(plog); free(seen); return KS_ERR_OOM; }
        for (int i = 0; i < n; i++)
            if (ids[i] >= 0 && ids[i] < c->vocab) seen[ids[i]] = 1;
    }
    /* the id buffer grows with the generation: max_new may be INT_MAX ("until EOS or the
     * context ends"), where max_new + 1 overflowed and a buffer of max_new would be 8 GB */
    size_t gcap = (size_t)KS_MIN(p->max_new, 255) + 1;
    int32_t *gen = ks_malloc(sizeof(int32_t) * gcap);
    if (!gen) { free(plog); free(seen); return KS_ERR_OOM; }
    int ng = 0;
    size_t emitted = 0; /* bytes of decoded text already streamed */
    for (int t = 0; t < p->max_new; t++) {
        const float *lg = s->logits;
        if (penal) {
            memcpy(plog, s->logits, sizeof(float) * (size_t)c->vocab);
            ks_repeat_penalty(plog, seen, c->vocab, p->repeat_penalty);
            lg = plog;
        }
        int32_t id = ks_sample(&smp, lg, c->vocab);
        if (penal && id >= 0 && id < c->vocab) seen[id] = 1;
        if ((size_t)ng == gcap) {
            int32_t *g2 = ks_realloc(gen, sizeof(int32_t) * gcap * 2);
            if (!g2) { st = KS_ERR_OOM; break; }
            gen = g2;
            gcap *= 2;
        }
        gen[ng++] = id;
        if (s->policy && s->policy->on[KS_EV_TOKEN]) {
            ks_event ev;
            event_init(s, &ev, KS_EV_TOKEN, -1, 0, 1);
            ev.token = id;
            st = fire(s, &ev);
            actions_clear(&ev);
            if (st) break;
        }
        int eos = p->stop_at_eos && is_eos(c, id);
        int last = eos || t + 1 == p->max_new, hit = 0;
        if (cb || p->n_stop > 0) {
            const char *piece = "";
            char *text = NULL;
            size_t len = 0;
            /* the output so far, decoded (without the EOS: with stop strings, the text held
             * back is streamed at the EOS) */
            size_t nd = eos ? (p->n_stop > 0 ? (size_t)ng - 1 : 0) : (size_t)ng;
            if (s->m->tok && nd > 0) {
                if (ks_tokenizer_decode(s->m->tok, gen, nd, 1, &text, &len) == KS_OK) {
                    size_t ok = utf8_complete(text, len);
                    if (p->n_stop > 0) {
                        long at = ks_stop_find(text, ok, p->stop, p->n_stop);
                        if (at >= 0) { ok = (size_t)at; hit = 1; }
                        else if (!last) ok -= stop_holdback(text, ok, p->stop, p->n_stop);
                    }
                    if (ok > emitted) {
                        text[ok] = 0;
                        piece = text + emitted;
                        emitted = ok;
                    }
                }
            }
            int stop = cb ? cb(ud, id, piece) : 0;
            free(text);
            if (stop || hit) break;
        }
        if (eos) break;
        if (t + 1 == p->max_new) break;
        if ((st = check_interrupt(s))) break;
        if ((st = ks_session_decode(s, id))) break;
        s->n_decoded++;
    }
    free(plog);
    free(seen);
    if (out_ids) *out_ids = gen;
    else free(gen);
    if (n_out) *n_out = ng;
    return st;
}
