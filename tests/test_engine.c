/* test_engine.c — the engine's events and actions driven by C policies on a tiny random model:
 * invariants (a no-op policy, chunked prefill and pre-RoPE mode change nothing), what each
 * action does to KV rows and positions, and the validation of bad actions. */
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
    return ks_session_new(f->m, &f->s) ? -1 : 0;
}
static void fx_close(fixture *f) {
    ks_session_free_(f->s);
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
