/* test_engine.c — the engine's events and actions driven by C policies on a tiny random model:
 * invariants (a no-op policy, chunked prefill and pre-RoPE mode change nothing), what each
 * action does to KV rows and positions, and the validation of bad actions; the profile, and the
 * backend calls of one request (each coarse forward op once per block). */
#include "engine.h"
#include "ktest.h"
#include "testutil.h"

#include <stdlib.h>
#include <string.h>

typedef struct fixture { char dir[256]; ks_model *m; ks_session *s; } fixture;

static int fx_open(fixture *f, int n_layers) {
    if (kt_tmpdir(f->dir, sizeof f->dir)) return -1;
    kt_tiny_cfg cfg = kt_tiny_default();
    cfg.n_layers = n_layers;
    if (kt_write_tiny_model(f->dir, &cfg)) return -1;
    if (ks_model_open(f->dir, "cpu", &f->m)) return -1;
    return ks_session_create(f->m, &f->s) ? -1 : 0;
}
static void fx_close(fixture *f) {
    ks_session_free(f->s);
    ks_model_close(f->m);
    kt_rmdir(f->dir);
}

static void prompt(int32_t *ids, int n) {
    for (int i = 0; i < n; i++) ids[i] = (i * 7 + 3) % 61 + 3;
}

static double max_diff(const float *a, const float *b, int n) {
    double m = 0;
    for (int i = 0; i < n; i++) m = fmax(m, fabs((double)a[i] - b[i]));
    return m;
}

/* prefill ids then decode a few tokens greedily; logits of the last step into out */
static ks_status run(ks_session *s, const ks_policy *p, const int32_t *ids, int n, int steps, float *out, int32_t *gen) {
    ks_session_reset(s);
    s->policy = p;
    ks_status st = ks_session_prefill(s, ids, n);
    ks_sampler smp;
    ks_sampler_init(&smp, 0, 1, 0);
    for (int t = 0; !st && t < steps; t++) {
        int32_t id = ks_sample(&smp, s->logits, s->m->cfg.vocab);
        if (gen) gen[t] = id;
        st = ks_session_decode(s, id);
    }
    if (!st && out) memcpy(out, s->logits, sizeof(float) * s->m->cfg.vocab);
    s->policy = NULL;
    return st;
}

static ks_status h_nothing(void *ud, ks_event *ev) { (void)ud; (void)ev; return KS_OK; }

/* ks_session_decode_greedy: the ids ks_sample gives on each step's logits, and the logits filled
 * (the CPU has no device argmax: the CUDA path is tests/cuda/test_cuda.c "greedy on the device") */
KT_TEST(engine_decode_greedy_gives_the_sampled_ids) {
    fixture f;
    KT_CHECK(fx_open(&f, 2) == 0, "tiny model: %s", ks_last_error());
    const int V = f.m->cfg.vocab, steps = 6;
    int32_t ids[12], gen[6], next;
    float *last = malloc(sizeof(float) * V);
    prompt(ids, 12);
    KT_CHECK(last && run(f.s, NULL, ids, 12, steps, last, gen) == KS_OK, "%s", ks_last_error());
    ks_session_reset(f.s);
    ks_status st = ks_session_prefill(f.s, ids, 12);
    ks_sampler smp;
    ks_sampler_init(&smp, 0, 1, 0);
    next = ks_sample(&smp, f.s->logits, V);
    for (int t = 0; !st && t < steps; t++) {
        KT_CHECK(next == gen[t], "step %d: id %d, the sampled run's %d", t, next, gen[t]);
        st = ks_session_decode_greedy(f.s, next, &next);
    }
    KT_CHECK(st == KS_OK, "%s", ks_last_error());
    const float *lg;
    int n;
    KT_CHECK(ks_session_logits(f.s, &lg, &n) == KS_OK && n == V && !memcmp(lg, last, sizeof(float) * V),
             "the greedy run's last logits differ");
    KT_CHECK(next == ks_sample(&smp, last, V), "the last next id is not the argmax of the last logits");
    KT_CHECK(ks_session_decode_greedy(f.s, 1, NULL) == KS_ERR_ARG, "no place for the id: accepted");
    free(last);
    fx_close(&f);
}

KT_TEST(engine_noop_chunked_prerope_match_full) {
    fixture f;
    KT_CHECK(fx_open(&f, 3) == 0, "%s", ks_last_error());
    int32_t ids[50];
    prompt(ids, 50);
    float ref[64], got[64];
    KT_CHECK(run(f.s, NULL, ids, 50, 4, ref, NULL) == KS_OK, "%s", ks_last_error());
    ks_policy noop = {.name = "noop"};
    for (int e = 0; e < KS_EV_COUNT; e++) noop.on[e] = h_nothing;
    KT_CHECK(run(f.s, &noop, ids, 50, 4, got, NULL) == KS_OK, "%s", ks_last_error());
    KT_CHECK(max_diff(ref, got, 64) == 0, "no-op policy changed logits by %g", max_diff(ref, got, 64));
    ks_policy chunked = {.name = "chunked", .prefill_chunk = 7};
    KT_CHECK(run(f.s, &chunked, ids, 50, 4, got, NULL) == KS_OK, "%s", ks_last_error());
    KT_CHECK(max_diff(ref, got, 64) < 1e-4, "chunked prefill differs by %g", max_diff(ref, got, 64));
    ks_policy pre = {.name = "prerope", .want_pre_rope_keys = 1, .prefill_chunk = 16};
    KT_CHECK(run(f.s, &pre, ids, 50, 4, got, NULL) == KS_OK, "%s", ks_last_error());
    KT_CHECK(max_diff(ref, got, 64) < 1e-4, "pre-RoPE mode differs by %g", max_diff(ref, got, 64));
    fx_close(&f);
}

/* retain rows {0, 2, 5, n-1} at layer 1, per head different for head 1 */
static ks_status h_retain(void *ud, ks_event *ev) {
    (void)ud;
    if (ev->layer != 1) return KS_OK;
    int32_t a[] = {ev->n - 1, 0, 2, 5}, b[] = {1, 3, ev->n - 1};
    const int32_t *lists[] = {a, b};
    int cnt[] = {4, 3};
    return ks_action_retain_heads(ev, lists, cnt);
}

KT_TEST(engine_retain_frees_rows_and_keeps_positions) {
    fixture f;
    KT_CHECK(fx_open(&f, 3) == 0, "%s", ks_last_error());
    int32_t ids[40];
    prompt(ids, 40);
    ks_policy p = {.name = "retain"};
    p.on[KS_EV_PREFILL_QKV] = h_retain;
    KT_CHECK(run(f.s, &p, ids, 40, 2, NULL, NULL) == KS_OK, "%s", ks_last_error());
    const ks_kv_layer *L = &f.s->kv[1];
    /* 2 decode steps appended 2 rows after retention */
    KT_CHECK(L->n[0] == 6 && L->n[1] == 5, "rows %d %d", L->n[0], L->n[1]);
    int32_t want0[] = {0, 2, 5, 39, 40, 41}, want1[] = {1, 3, 39, 40, 41};
    for (int i = 0; i < 6; i++) KT_CHECK(L->pos[i] == want0[i], "head 0 row %d pos %d", i, L->pos[i]);
    for (int i = 0; i < 5; i++) KT_CHECK(L->pos[L->capacity + i] == want1[i], "head 1 row %d pos %d", i, L->pos[L->capacity + i]);
    KT_CHECK(L->capacity < 40, "retained rows not freed: capacity %d", L->capacity);
    KT_CHECK(f.s->kv[0].n[0] == 42 && f.s->kv[2].n[1] == 42, "other layers keep everything");
    fx_close(&f);
}

static ks_status h_propagate(void *ud, ks_event *ev) {
    (void)ud;
    if (ev->layer != 0) return KS_OK;
    int32_t idx[] = {0, 4, 9, 10, 20, ev->n - 1};
    return ks_action_propagate(ev, idx, 6);
}

KT_TEST(engine_propagate_keeps_original_positions) {
    fixture f;
    KT_CHECK(fx_open(&f, 3) == 0, "%s", ks_last_error());
    int32_t ids[30];
    prompt(ids, 30);
    ks_policy p = {.name = "prop"};
    p.on[KS_EV_PREFILL_LAYER_END] = h_propagate;
    KT_CHECK(run(f.s, &p, ids, 30, 1, NULL, NULL) == KS_OK, "%s", ks_last_error());
    KT_CHECK(f.s->kv[0].n[0] == 31, "layer 0 keeps all rows (+1 decode): %d", f.s->kv[0].n[0]);
    const ks_kv_layer *L = &f.s->kv[2];
    KT_CHECK(L->n[0] == 7, "layer 2 rows %d", L->n[0]);
    int32_t want[] = {0, 4, 9, 10, 20, 29, 30};
    for (int i = 0; i < 7; i++) KT_CHECK(L->pos[i] == want[i], "row %d pos %d", i, L->pos[i]);
    KT_CHECK(f.s->n_past == 31, "decode continues at the original positions: n_past %d", f.s->n_past);
    fx_close(&f);
}

static ks_status h_restart(void *ud, ks_event *ev) {
    (void)ud;
    if (ev->layer != 1 || ev->pass) return KS_OK;
    int32_t idx[] = {3, 1, 8, 12};
    return ks_action_restart(ev, idx, 4);
}

KT_TEST(engine_restart_renumbers_and_equals_fresh_prefill) {
    fixture f;
    KT_CHECK(fx_open(&f, 3) == 0, "%s", ks_last_error());
    int32_t ids[20];
    prompt(ids, 20);
    ks_policy p = {.name = "restart"};
    p.on[KS_EV_PREFILL_QKV] = h_restart;
    float got[64], ref[64];
    KT_CHECK(run(f.s, &p, ids, 20, 2, got, NULL) == KS_OK, "%s", ks_last_error());
    KT_CHECK(f.s->restarted && f.s->n_restart == 4, "restart recorded");
    KT_CHECK(f.s->restart_idx[0] == 1 && f.s->restart_idx[3] == 12, "restart idx sorted");
    KT_CHECK(f.s->kv[0].n[0] == 6 && f.s->kv[0].pos[5] == 5, "renumbered positions 0..5");
    int32_t sub[] = {ids[1], ids[3], ids[8], ids[12]};
    int32_t g1[2];
    KT_CHECK(run(f.s, NULL, sub, 4, 2, ref, g1) == KS_OK, "%s", ks_last_error());
    KT_CHECK(max_diff(ref, got, 64) < 1e-5, "restart != fresh prefill of the subset: %g", max_diff(ref, got, 64));
    fx_close(&f);
}

static ks_status h_attend_all(void *ud, ks_event *ev) {
    (void)ud;
    int n = ev->kv->n[0];
    int32_t *idx = malloc(sizeof(int32_t) * n);
    for (int i = 0; i < n; i++) idx[i] = n - 1 - i;
    ks_status st = ks_action_attend(ev, idx, n, 0);
    free(idx);
    return st;
}

KT_TEST(engine_attend_all_rows_equals_full) {
    fixture f;
    KT_CHECK(fx_open(&f, 2) == 0, "%s", ks_last_error());
    int32_t ids[25];
    prompt(ids, 25);
    float ref[64], got[64];
    KT_CHECK(run(f.s, NULL, ids, 25, 3, ref, NULL) == KS_OK, "%s", ks_last_error());
    ks_policy p = {.name = "attend"};
    p.on[KS_EV_DECODE_QKV] = h_attend_all;
    KT_CHECK(run(f.s, &p, ids, 25, 3, got, NULL) == KS_OK, "%s", ks_last_error());
    KT_CHECK(max_diff(ref, got, 64) < 1e-5, "attend(all) differs: %g", max_diff(ref, got, 64));
    fx_close(&f);
}

static int g_bad;
static ks_status h_bad(void *ud, ks_event *ev) {
    (void)ud;
    int32_t dup[] = {1, 1}, oob[] = {0, 999};
    switch (g_bad) {
    case 0: return ks_action_retain(ev, dup, 2);
    case 1: return ks_action_retain(ev, oob, 2);
    case 2: return ks_action_attend(ev, dup, 1, 0); /* attend is illegal in prefill_layer_end */
    case 3: return ks_action_restart(ev, dup, 1);   /* restart is illegal in prefill_layer_end */
    default: return ks_action_retain(ev, NULL, 0);
    }
}

KT_TEST(engine_bad_actions_are_named_errors) {
    fixture f;
    KT_CHECK(fx_open(&f, 2) == 0, "%s", ks_last_error());
    int32_t ids[10];
    prompt(ids, 10);
    ks_policy p = {.name = "bad"};
    p.on[KS_EV_PREFILL_LAYER_END] = h_bad;
    const char *want[] = {"duplicate", "out of range", "not allowed", "not allowed", "empty"};
    for (g_bad = 0; g_bad < 5; g_bad++) {
        ks_status st = run(f.s, &p, ids, 10, 0, NULL, NULL);
        KT_CHECK(st == KS_ERR_POLICY, "case %d: status %d", g_bad, st);
        KT_CHECK(strstr(ks_last_error(), want[g_bad]), "case %d: %s", g_bad, ks_last_error());
    }
    /* the session is fine afterwards */
    KT_CHECK(run(f.s, NULL, ids, 10, 2, NULL, NULL) == KS_OK, "%s", ks_last_error());
    fx_close(&f);
}

/* TokenSelect-style: pre-RoPE keys, attend a subset with renumbered positions; equals a fresh
 * prefill of the gathered tokens (positions 0..k-1) when every layer attends the same rows. */
static ks_status h_attend_sub(void *ud, ks_event *ev) {
    (void)ud;
    int n = ev->kv->n[0];
    int32_t idx[] = {0, 2, 3, n - 1};
    return ks_action_attend(ev, idx, 4, 1);
}

KT_TEST(engine_attend_renumbered_prerope) {
    fixture f;
    KT_CHECK(fx_open(&f, 1) == 0, "%s", ks_last_error());
    int32_t ids[12];
    prompt(ids, 12);
    ks_policy p = {.name = "ts", .want_pre_rope_keys = 1};
    p.on[KS_EV_DECODE_QKV] = h_attend_sub;
    float got[64], ref[64];
    /* prefill 12, then decode token t at position 12, attending rows {0,2,3,12} renumbered 0..3 */
    KT_CHECK(run(f.s, &p, ids, 12, 1, got, NULL) == KS_OK, "%s", ks_last_error());
    int32_t g0;
    KT_CHECK(run(f.s, NULL, ids, 12, 1, NULL, &g0) == KS_OK, "%s", ks_last_error());
    /* with one layer, the decode step's output only depends on the attended rows' k/v, which
     * for layer 0 depend only on their own tokens: equals prefill of {id0, id2, id3, g0} */
    int32_t sub[] = {ids[0], ids[2], ids[3], g0};
    KT_CHECK(run(f.s, NULL, sub, 4, 0, ref, NULL) == KS_OK, "%s", ks_last_error());
    KT_CHECK(max_diff(ref, got, 64) < 1e-5, "renumbered attend differs: %g", max_diff(ref, got, 64));
    fx_close(&f);
}

/* A device list lent by its owner (ks_dev_list.lend; the CPU backend's memory is the host's): a
 * decode-time attend reads it where it is (the action's lists point into it, no copy), holds it
 * from the action until the attention ran (one retain, released by ks_actions_free), and gives
 * the same logits as the host list. The owner overwrites the list once the last holder lets go:
 * an attention that read it after its release would read rows out of range. */
typedef struct fake_lend {
    ks_lend base;
    int refs, retains, releases;
} fake_lend;
static void fl_retain(ks_lend *l) { fake_lend *f = (fake_lend *)l; f->refs++; f->retains++; }
static int32_t g_lent[4];
static void fl_release(ks_lend *l) {
    fake_lend *f = (fake_lend *)l;
    f->refs--;
    f->releases++;
    if (!f->refs) for (int i = 0; i < 4; i++) g_lent[i] = INT32_MAX; /* the owner reuses its memory */
}
static fake_lend g_lend;
static uint64_t g_serial;
static int g_lent_bad; /* steps where the action copied the list or did not hold it */
static ks_status h_attend_lent(void *ud, ks_event *ev) {
    (void)ud;
    int n = ev->kv->n[0];
    g_lent[0] = 0; g_lent[1] = 2; g_lent[2] = 3; g_lent[3] = n - 1;
    ks_dev_list l = {.data = g_lent, .rows = 1, .k = 4, .checked = 1, .lo = 0, .hi = n, .serial = ++g_serial,
                     .lend = &g_lend.base};
    ks_status st = ks_action_attend_dev(ev, &l, 1);
    if (!st && (ev->act.attend_idx[0] != g_lent || g_lend.refs != 1 || ev->act.attend_dbuf)) g_lent_bad++;
    return st;
}

KT_TEST(engine_attend_lent_list_read_in_place) {
    fixture f;
    KT_CHECK(fx_open(&f, 2) == 0, "%s", ks_last_error());
    int32_t ids[12];
    prompt(ids, 12);
    ks_policy ph = {.name = "host", .want_pre_rope_keys = 1}, pl = {.name = "lent", .want_pre_rope_keys = 1};
    ph.on[KS_EV_DECODE_QKV] = h_attend_sub;
    pl.on[KS_EV_DECODE_QKV] = h_attend_lent;
    g_lend = (fake_lend){{fl_retain, fl_release}, 0, 0, 0};
    float ref[64], got[64];
    KT_CHECK(run(f.s, &ph, ids, 12, 3, ref, NULL) == KS_OK, "%s", ks_last_error());
    KT_CHECK(run(f.s, &pl, ids, 12, 3, got, NULL) == KS_OK, "%s", ks_last_error());
    const int attends = 3 * 2; /* steps x layers */
    KT_CHECK(g_lent_bad == 0, "%d of %d attends copied the lent list or did not hold it", g_lent_bad, attends);
    KT_CHECK(g_lend.retains == attends && g_lend.releases == attends && g_lend.refs == 0,
             "lend held %d times, released %d times over %d attends", g_lend.retains, g_lend.releases, attends);
    KT_CHECK(max_diff(ref, got, 64) == 0, "the lent list gave logits %g away from the host list's", max_diff(ref, got, 64));
    fx_close(&f);
}

/* ---------------------------------------------------------------- profiler, memory, discard_kv */

static int fx_open_cfg(fixture *f, const kt_tiny_cfg *cfg) {
    if (kt_tmpdir(f->dir, sizeof f->dir)) return -1;
    if (kt_write_tiny_model(f->dir, cfg)) return -1;
    if (ks_model_open(f->dir, "cpu", &f->m)) return -1;
    return ks_session_create(f->m, &f->s) ? -1 : 0;
}

static double prof_sum(const ks_profile *p, int stage) {
    double t = 0;
    for (int i = 0; i < KS_PH_COUNT; i++) t += p->sec[stage][i];
    return t;
}

KT_TEST(engine_profile_phases_sum_to_wall) {
    kt_tiny_cfg cfg = kt_tiny_default();
    cfg.dim = 64; cfg.n_layers = 4; cfg.n_heads = 4; cfg.n_kv_heads = 2; cfg.ffn = 160; cfg.max_pos = 1024;
    fixture f;
    KT_CHECK(fx_open_cfg(&f, &cfg) == 0, "%s", ks_last_error());
    int n = 600, steps = 5;
    int32_t *ids = malloc(sizeof(int32_t) * n);
    prompt(ids, n);
    /* off: nothing is booked */
    KT_CHECK(run(f.s, NULL, ids, 50, 1, NULL, NULL) == KS_OK, "%s", ks_last_error());
    long calls = 0;
    for (int i = 0; i < KS_PH_COUNT; i++) calls += f.s->prof.calls[0][i] + f.s->prof.calls[1][i];
    KT_CHECK(calls == 0 && f.s->prof.forwards[0] == 0, "profiling off booked %ld calls", calls);
    /* on (the CPU backend has no timestamps: sync + host clock) */
    ks_profile_enable(f.s, 1);
    KT_CHECK(run(f.s, NULL, ids, n, steps, NULL, NULL) == KS_OK, "%s", ks_last_error());
    const ks_profile *p = &f.s->prof;
    KT_CHECK(p->forwards[0] == 1 && p->forwards[1] == steps, "forwards %ld / %ld", p->forwards[0], p->forwards[1]);
    double sp = prof_sum(p, 0), sd = prof_sum(p, 1);
    KT_CHECK(fabs(sp - f.s->t_prefill) <= 0.05 * f.s->t_prefill + 1e-4, "prefill phases sum %.6f s, wall %.6f s", sp,
             f.s->t_prefill);
    KT_CHECK(fabs(sd - f.s->t_decode) <= 0.05 * f.s->t_decode + 1e-4, "decode phases sum %.6f s, wall %.6f s", sd,
             f.s->t_decode);
    KT_CHECK(fabs(sp - p->wall[0]) <= 1e-9 + 1e-6 * sp, "prefill sum %.9f vs its own wall %.9f", sp, p->wall[0]);
    /* one phase per backend forward op (backend.h); decode's cache row is part of attn_in (qkv) */
    ks_phase need[] = {KS_PH_EMBED, KS_PH_QKV, KS_PH_ATTENTION, KS_PH_OPROJ, KS_PH_MLP, KS_PH_LM_HEAD, KS_PH_KV_APPEND};
    for (size_t i = 0; i < sizeof need / sizeof need[0]; i++) {
        KT_CHECK(p->sec[0][need[i]] > 0 && p->calls[0][need[i]] > 0, "prefill phase %s: %g s, %ld calls",
                 ks_phase_name(need[i]), p->sec[0][need[i]], p->calls[0][need[i]]);
        if (need[i] == KS_PH_KV_APPEND) continue;
        KT_CHECK(p->sec[1][need[i]] > 0 && p->calls[1][need[i]] > 0, "decode phase %s: %g s, %ld calls",
                 ks_phase_name(need[i]), p->sec[1][need[i]], p->calls[1][need[i]]);
    }
    KT_CHECK(p->calls[1][KS_PH_MLP] == (long)steps * cfg.n_layers && p->calls[1][KS_PH_QKV] == (long)steps * cfg.n_layers,
             "decode: one attn_in and one mlp a layer a step (%ld, %ld)", p->calls[1][KS_PH_QKV], p->calls[1][KS_PH_MLP]);
    KT_CHECK(p->calls[1][KS_PH_ATTENTION] == (long)steps * cfg.n_layers, "decode attention calls %ld",
             p->calls[1][KS_PH_ATTENTION]);
    KT_CHECK(p->calls[0][KS_PH_POLICY] == 0, "no policy, no policy phase");
    /* the table prints */
    FILE *tf = tmpfile();
    KT_CHECK(tf != NULL, "tmpfile");
    if (tf) {
        ks_profile_print(p, tf, "test");
        long sz = ftell(tf);
        char buf[4096] = {0};
        rewind(tf);
        size_t got = fread(buf, 1, sizeof buf - 1, tf);
        fclose(tf);
        KT_CHECK(sz > 200 && got > 0 && strstr(buf, "attention") && strstr(buf, "wall"), "table: %s", buf);
    }
    /* a policy's handler time is its own phase */
    ks_profile_reset(f.s);
    ks_policy noop = {.name = "noop"};
    for (int e = 0; e < KS_EV_COUNT; e++) noop.on[e] = h_nothing;
    KT_CHECK(run(f.s, &noop, ids, 100, 1, NULL, NULL) == KS_OK, "%s", ks_last_error());
    KT_CHECK(p->calls[0][KS_PH_POLICY] == 2 * cfg.n_layers + 1 && p->calls[1][KS_PH_POLICY] == cfg.n_layers,
             "policy calls %ld / %ld", p->calls[0][KS_PH_POLICY], p->calls[1][KS_PH_POLICY]);
    ks_profile_enable(f.s, 0);
    free(ids);
    fx_close(&f);
}

/* GemFilter-like: at layer R of the first pass, restart on the K rows whose keys score highest
 * against the last query (head 0, dot product); optionally discard_kv at layer 0. */
#define DK_R 3
#define DK_K 9
static int g_dk_mode; /* 0: plain, 1: discard_kv, 2: discard_kv without restart, 3: discard at layer 1,
                         4: discard in prefill_layer_end */
static ks_status h_gem(void *ud, ks_event *ev) {
    (void)ud;
    if (ev->kind == KS_EV_PREFILL_LAYER_END) return g_dk_mode == 4 && ev->layer == 0 ? ks_action_discard_kv(ev) : KS_OK;
    if (ev->pass) return KS_OK;
    if (ev->layer == 0 && (g_dk_mode == 1 || g_dk_mode == 2)) {
        ks_status st = ks_action_discard_kv(ev);
        if (st) return st;
    }
    if (ev->layer == 1 && g_dk_mode == 3) return ks_action_discard_kv(ev);
    if (ev->layer != DK_R || g_dk_mode == 2) return KS_OK;
    int n = ev->n, d = ev->head_dim, H = ev->n_heads, Hkv = ev->n_kv_heads;
    const float *q = ev->q + (size_t)(n - 1) * H * d; /* last row, head 0 */
    float *sc = malloc(sizeof(float) * n);
    int32_t idx[DK_K];
    for (int j = 0; j < n; j++) {
        double a = 0;
        for (int t = 0; t < d; t++) a += (double)q[t] * ev->k[(size_t)j * Hkv * d + t];
        sc[j] = (float)a;
    }
    for (int i = 0; i < DK_K; i++) { /* top-K by selection, ties to the lower index */
        int best = -1;
        for (int j = 0; j < n; j++)
            if (sc[j] > -1e30f && (best < 0 || sc[j] > sc[best])) best = j;
        idx[i] = best;
        sc[best] = -1e31f;
    }
    free(sc);
    return ks_action_restart(ev, idx, DK_K);
}

KT_TEST(engine_discard_kv_same_result_lower_peak) {
    kt_tiny_cfg cfg = kt_tiny_default();
    cfg.n_layers = 6; cfg.max_pos = 512;
    fixture f;
    KT_CHECK(fx_open_cfg(&f, &cfg) == 0, "%s", ks_last_error());
    ks_backend *be = f.m->be;
    KT_CHECK(be->mem_stats != NULL, "the CPU backend reports memory");
    if (!be->mem_stats) { fx_close(&f); return; }
    int n = 300, steps = 3, V = cfg.vocab;
    int32_t *ids = malloc(sizeof(int32_t) * n);
    prompt(ids, n);
    ks_policy p = {.name = "gem"};
    p.on[KS_EV_PREFILL_QKV] = h_gem;
    p.on[KS_EV_PREFILL_LAYER_END] = h_gem;
    float lg[2][64];
    int32_t gen[2][8], kept_idx[2][DK_K];
    size_t peak[2];
    ks_mem_stats m0, m1;
    be->mem_stats(be, &m0, 0);
    for (int mode = 0; mode < 2; mode++) {
        g_dk_mode = mode;
        ks_session_reset(f.s);
        be->mem_stats(be, &m1, 1);
        KT_CHECK(run(f.s, &p, ids, n, steps, lg[mode], gen[mode]) == KS_OK, "mode %d: %s", mode, ks_last_error());
        be->mem_stats(be, &m1, 0);
        peak[mode] = m1.peak;
        KT_CHECK(f.s->restarted && f.s->n_restart == DK_K, "mode %d: restart recorded (%d)", mode, f.s->n_restart);
        memcpy(kept_idx[mode], f.s->restart_idx, sizeof kept_idx[mode]);
        KT_CHECK(m1.scratch == 0, "mode %d: %zu scratch bytes still allocated after the request", mode, m1.scratch);
        for (int l = 0; l < cfg.n_layers; l++)
            KT_CHECK(f.s->kv[l].n && f.s->kv[l].n[0] == DK_K + steps, "mode %d layer %d: %d KV rows", mode, l,
                     f.s->kv[l].n ? f.s->kv[l].n[0] : -1);
    }
    KT_CHECK(memcmp(kept_idx[0], kept_idx[1], sizeof kept_idx[0]) == 0, "discard_kv changed the kept tokens");
    KT_CHECK(memcmp(gen[0], gen[1], sizeof(int32_t) * steps) == 0, "discard_kv changed the generated ids");
    KT_CHECK(max_diff(lg[0], lg[1], V) == 0, "discard_kv changed the logits by %g", max_diff(lg[0], lg[1], V));
    const ks_kv_layer *L = &f.s->kv[2];
    for (int i = 0; i < DK_K; i++) KT_CHECK(L->pos[i] == i, "renumbered position %d at row %d", L->pos[i], i);
    /* without discard, layers 0..R-1 hold n rows each when layer R-1 attends; with it, one layer */
    size_t kv_layer = (size_t)n * cfg.n_kv_heads * (cfg.dim / cfg.n_heads) * sizeof(float) * 2;
    KT_CHECK(peak[0] >= peak[1] + (DK_R - 1) * kv_layer, "peak %zu without discard_kv, %zu with (expected >= %zu less)",
             peak[0], peak[1], (DK_R - 1) * kv_layer);
    /* after a reset only the weights remain */
    ks_session_reset(f.s);
    be->mem_stats(be, &m1, 0);
    KT_CHECK(m1.cur == m0.cur && m1.scratch == 0, "after reset %zu bytes (weights %zu)", m1.cur, m0.cur);
    free(ids);
    fx_close(&f);
}

KT_TEST(engine_discard_kv_errors) {
    fixture f;
    KT_CHECK(fx_open(&f, 5) == 0, "%s", ks_last_error());
    int32_t ids[40];
    prompt(ids, 40);
    ks_policy p = {.name = "gem"};
    p.on[KS_EV_PREFILL_QKV] = h_gem;
    p.on[KS_EV_PREFILL_LAYER_END] = h_gem;
    const char *want[] = {"completed without a restart", "only in prefill_qkv at layer 0", "not allowed in event prefill_layer_end"};
    for (int i = 0; i < 3; i++) {
        g_dk_mode = 2 + i;
        ks_status st = run(f.s, &p, ids, 40, 1, NULL, NULL);
        KT_CHECK(st == KS_ERR_POLICY && strstr(ks_last_error(), want[i]), "mode %d: status %d: %s", g_dk_mode, st,
                 ks_last_error());
    }
    /* chunked prefill: refused */
    g_dk_mode = 1;
    ks_policy pc = p;
    pc.prefill_chunk = 16;
    ks_status st = run(f.s, &pc, ids, 40, 0, NULL, NULL);
    KT_CHECK(st == KS_ERR_POLICY && strstr(ks_last_error(), "chunked"), "chunked: %d: %s", st, ks_last_error());
    /* a second prefill on a session holding tokens: refused */
    ks_session_reset(f.s);
    KT_CHECK(ks_session_prefill(f.s, ids, 10) == KS_OK, "%s", ks_last_error());
    f.s->policy = &p;
    st = ks_session_prefill(f.s, ids + 10, 30);
    f.s->policy = NULL;
    KT_CHECK(st == KS_ERR_POLICY && strstr(ks_last_error(), "first prefill"), "second prefill: %d: %s", st, ks_last_error());
    /* the session is fine afterwards */
    KT_CHECK(run(f.s, NULL, ids, 40, 2, NULL, NULL) == KS_OK, "%s", ks_last_error());
    fx_close(&f);
}

/* `kvsieve bench --profile` on the CPU: the peak_GiB column and the per-phase table */
KT_TEST(engine_bench_profile_and_peak_column) {
    const char *bin = getenv("KS_BIN");
    if (!bin || !*bin) KT_SKIP("KS_BIN not set (run through make test)");
    char cmd[512];
    snprintf(cmd, sizeof cmd,
             "%s bench --random-weights bench/configs/cpu-small.json --lengths 64 --gen 2 --repeat 1 --profile 2>&1", bin);
    FILE *p = popen(cmd, "r");
    KT_CHECK(p != NULL, "popen");
    if (!p) return;
    static char out[16384];
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = 0;
    int rc = pclose(p);
    KT_CHECK(rc == 0, "bench exited %d: %s", rc, out);
    KT_CHECK(strstr(out, "peak_GiB") != NULL, "no peak_GiB column: %s", out);
    const char *row = strstr(out, "\nnone ");
    double peak = 0;
    int ok = row && sscanf(row, " none %*d %*f %*f %*f %*f %*s %*f %*d %lf", &peak) == 1;
    KT_CHECK(ok && peak > 0.05 && peak < 1.0, "peak column %g (28 M float32 parameters are 0.1 GiB): %s", peak, out);
    KT_CHECK(strstr(out, "profile: none, 64 tokens") && strstr(out, "attention") && strstr(out, "mlp"),
             "no per-phase table: %s", out);
    KT_CHECK(strstr(out, "memory none") != NULL, "no memory breakdown line: %s", out);
}

/* ---------------------------------------------------------------- the forward's backend calls */

/* Counting shims over a backend's forward entries (one wrapped backend at a time). */
static ks_backend g_orig;
static long g_calls[10]; /* embed, attn_in (no L), attn_in (L), attention, attn_out, mlp, head, gather_rows, rope, kv_append */

static ks_status w_embed(ks_backend *b, float *x, const ks_weight *E, const int32_t *ids, int n, int dim) {
    g_calls[0]++;
    return g_orig.embed(b, x, E, ids, n, dim);
}
static ks_status w_attn_in(ks_backend *b, const ks_layer_w *W, const ks_config *c, const ks_acts *a, int n,
                           const int32_t *pos, int max_pos, int rotate, ks_kv_layer *L) {
    g_calls[L ? 2 : 1]++;
    return g_orig.attn_in(b, W, c, a, n, pos, max_pos, rotate, L);
}
static ks_status w_attention(ks_backend *b, float *out, const float *q, const ks_kv_layer *L, const ks_attn_args *a) {
    g_calls[3]++;
    return g_orig.attention(b, out, q, L, a);
}
static ks_status w_attn_out(ks_backend *b, const ks_layer_w *W, const ks_config *c, const ks_acts *a, int n) {
    g_calls[4]++;
    return g_orig.attn_out(b, W, c, a, n);
}
static ks_status w_mlp(ks_backend *b, const ks_layer_w *W, const ks_config *c, const ks_acts *a, int n) {
    g_calls[5]++;
    return g_orig.mlp(b, W, c, a, n);
}
static ks_status w_head(ks_backend *b, const ks_weight *nw, const ks_weight *lm, const ks_config *c, const ks_acts *a,
                        int row, int n, float *lg) {
    g_calls[6]++;
    return g_orig.head(b, nw, lm, c, a, row, n, lg);
}
static ks_status w_gather_rows(ks_backend *b, float *out, const float *x, const int32_t *idx, int k, int d) {
    g_calls[7]++;
    return g_orig.gather_rows(b, out, x, idx, k, d);
}
static ks_status w_rope(ks_backend *b, float *x, int n, int h, const int32_t *pos, const ks_rope *r, int max_pos) {
    g_calls[8]++;
    return g_orig.rope(b, x, n, h, pos, r, max_pos);
}
static ks_status w_kv_append(ks_backend *b, ks_kv_layer *L, const float *k, const float *v, const int32_t *pos, int n) {
    g_calls[9]++;
    return g_orig.kv_append(b, L, k, v, pos, n);
}

/* One request drives the backend only through its coarse forward ops, each once per block: a
 * prefill is embed, then per layer attn_in (q, k, v only: the cache append follows the layer's
 * event), kv_append, attention, attn_out, mlp, and one head; a decode step is the same with the
 * cache row inside attn_in. No other compute entry is called, and the results are those of the
 * unwrapped backend bit for bit. */
KT_TEST(engine_forward_calls_each_coarse_op_once_per_block) {
    fixture f;
    int Ly = 3, n = 23, steps = 4;
    KT_CHECK(fx_open(&f, Ly) == 0, "%s", ks_last_error());
    int V = f.m->cfg.vocab;
    int32_t ids[23], gen_a[4], gen_b[4];
    prompt(ids, n);
    float *la = malloc(sizeof(float) * V), *lb = malloc(sizeof(float) * V);
    KT_CHECK(run(f.s, NULL, ids, n, steps, la, gen_a) == KS_OK, "%s", ks_last_error());
    ks_backend *be = f.m->be;
    g_orig = *be;
    memset(g_calls, 0, sizeof g_calls);
    be->embed = w_embed; be->attn_in = w_attn_in; be->attention = w_attention; be->attn_out = w_attn_out;
    be->mlp = w_mlp; be->head = w_head; be->gather_rows = w_gather_rows; be->rope = w_rope;
    be->kv_append = w_kv_append;
    ks_status st = run(f.s, NULL, ids, n, steps, lb, gen_b);
    *be = g_orig;
    KT_CHECK(st == KS_OK, "%s", ks_last_error());
    long F = 1 + steps; /* forwards: one prefill, `steps` decode steps */
    KT_CHECK(g_calls[0] == F && g_calls[6] == F, "embed %ld, head %ld (want %ld each)", g_calls[0], g_calls[6], F);
    KT_CHECK(g_calls[1] == Ly && g_calls[2] == (long)steps * Ly, "attn_in without / with the cache: %ld / %ld (want %d / %d)",
             g_calls[1], g_calls[2], Ly, steps * Ly);
    KT_CHECK(g_calls[3] == F * Ly && g_calls[4] == F * Ly && g_calls[5] == F * Ly, "attention %ld, attn_out %ld, mlp %ld (want %ld)",
             g_calls[3], g_calls[4], g_calls[5], F * Ly);
    /* the prefill's appends are the engine's; a decode step's come from inside the CPU's attn_in */
    KT_CHECK(g_calls[9] == F * Ly, "kv_append %ld (want %ld)", g_calls[9], F * Ly);
    KT_CHECK(g_calls[7] == 0 && g_calls[8] == 0, "gather_rows %ld, rope %ld (want none without a policy)", g_calls[7], g_calls[8]);
    KT_CHECK(!memcmp(la, lb, sizeof(float) * V) && !memcmp(gen_a, gen_b, sizeof gen_a), "results differ under the shims");
    free(la);
    free(lb);
    fx_close(&f);
}
