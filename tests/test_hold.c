/* test_hold.c — held attends (core/policy.h ks_action_hold, Lua ev:attend's hold): the engine
 * repeats a held attend at a layer's later decode steps without calling the handler, with the
 * same tokens, logits and kept rows as a handler that asks for it at every step; ev.held_steps
 * counts the repeats; ev:release(), a prefill and a reset hand the layer back to its handler;
 * a bad hold is an error naming it. The policy is tests/seg_policies.h's SEG_HOLDER (the CUDA
 * test runs it too). The joined graph of a step whose every layer is held:
 * tests/test_decode_graph.c.
 *   hold_repeats_the_attend_without_the_handler   host and device lists, every layer held
 *   hold_counts_and_release                       one layer unheld: it sees held_steps and
 *                                                 releases the others, which are asked again
 *   hold_dropped_by_a_prefill_and_a_reset
 *   hold_errors_are_named
 *   replay_actions_errors_are_named   ks_action_replay / _within / ks_action_attend_page from a C
 *                                     policy: bad calls named, right ones recorded */
#include "engine.h"
#include "forward.h"
#include "ks_lua.h"
#include "ktest.h"
#include "policy_lua.h"
#include "seg_policies.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TINY "models/kvsieve-tiny"

typedef struct hrun {
    ks_status st;
    char err[1024];
    int32_t ids[16];
    float *lg;             /* (steps, vocab) */
    int steps;
    long calls, held;      /* the policy's reports after the run */
    long long held_steps;  /* ks_session_held_steps */
    int kept_n[64];        /* rows of each layer's KV head 0 */
} hrun;

static void prompt_of(const ks_model *m, int32_t *ids, int n) {
    uint64_t x = 88172645463325252ull;
    ids[0] = m->cfg.bos;
    for (int i = 1; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        ids[i] = 3 + (int32_t)(x % (uint64_t)(m->cfg.vocab - 3));
    }
}

/* A 120-token prompt and `steps` greedy steps under SEG_HOLDER with params (and _device = mode). */
static void hrun_one(ks_model *m, const char *params, const char *mode, int steps, hrun *r) {
    memset(r, 0, sizeof *r);
    const int vocab = m->cfg.vocab;
    ks_policy *p = NULL;
    ks_session *s = NULL;
    r->lg = calloc((size_t)steps * vocab, sizeof(float));
    r->st = r->lg ? ks_policy_load_string(m, "holder", SEG_HOLDER, &p) : KS_ERR_OOM;
    if (!r->st) r->st = seg_set_params(p, params);
    if (!r->st) r->st = ks_policy_set(p, "_device", mode);
    if (!r->st) r->st = ks_session_create(m, &s);
    if (!r->st) r->st = ks_session_set_policy(s, p);
    int32_t prompt[120];
    prompt_of(m, prompt, 120);
    if (!r->st) r->st = ks_session_prefill(s, prompt, 120);
    ks_sampler g;
    ks_sampler_init(&g, 0, 1, 0);
    for (int t = 0; !r->st && t < steps; t++) {
        r->ids[t] = ks_sample(&g, s->logits, vocab);
        r->st = ks_session_decode(s, r->ids[t]);
        if (!r->st) memcpy(r->lg + (size_t)t * vocab, s->logits, sizeof(float) * vocab);
        r->steps = t + 1;
    }
    if (r->st) snprintf(r->err, sizeof r->err, "%s", ks_last_error());
    else {
        const char *c = ks_policy_report(p, "calls"), *h = ks_policy_report(p, "held");
        r->calls = c ? atol(c) : -1;
        r->held = h ? atol(h) : -1;
        r->held_steps = ks_session_held_steps(s);
        for (int l = 0; l < m->cfg.n_layers && l < 64; l++) r->kept_n[l] = s->kv[l].n[0];
    }
    ks_session_free(s);
    ks_policy_free(p);
}

static int same_steps(const ks_model *m, const hrun *a, const hrun *b) {
    if (a->steps != b->steps || memcmp(a->ids, b->ids, sizeof(int32_t) * a->steps) ||
        memcmp(a->lg, b->lg, sizeof(float) * (size_t)a->steps * m->cfg.vocab))
        return 0;
    return !memcmp(a->kept_n, b->kept_n, sizeof a->kept_n);
}

KT_TEST(hold_repeats_the_attend_without_the_handler) {
    ks_lua_quiet = 1;
    ks_model *m;
    KT_CHECK(ks_model_open(TINY, "cpu", &m) == KS_OK, "%s", ks_last_error());
    const int L = m->cfg.n_layers, steps = 8;
    static const struct { const char *how, *mode; } c[] = {{"host", "host"}, {"device", "emulate"}};
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        static hrun ask, hold;
        char pa[128], ph[128];
        snprintf(pa, sizeof pa, "how=%s", c[i].how);
        snprintf(ph, sizeof ph, "how=%s,hold=true", c[i].how);
        hrun_one(m, pa, c[i].mode, steps, &ask);
        hrun_one(m, ph, c[i].mode, steps, &hold);
        KT_CHECK(ask.st == KS_OK && hold.st == KS_OK, "%s: %s / %s", c[i].how, ask.err, hold.err);
        KT_CHECK(same_steps(m, &ask, &hold), "%s: held steps differ from asked ones", c[i].how);
        KT_CHECK(ask.calls == (long)steps * L && ask.held_steps == 0, "%s: asked every step: %ld calls, %lld held",
                 c[i].how, ask.calls, ask.held_steps);
        /* the first step asks at every layer, the later ones at none */
        KT_CHECK(hold.calls == L && hold.held_steps == (long long)(steps - 1) * L, "%s: held: %ld calls (%d), %lld held (%d)",
                 c[i].how, hold.calls, L, hold.held_steps, (steps - 1) * L);
        free(ask.lg);
        free(hold.lg);
    }
    ks_model_close(m);
}

KT_TEST(hold_counts_and_release) {
    ks_lua_quiet = 1;
    ks_model *m;
    KT_CHECK(ks_model_open(TINY, "cpu", &m) == KS_OK, "%s", ks_last_error());
    const int L = m->cfg.n_layers, steps = 8, F = L - 1;
    KT_CHECK(L >= 2, "the tiny model has %d layers", L);
    static hrun ask, hold, rel;
    char p[160];
    snprintf(p, sizeof p, "how=device,free_layer=%d", F);
    hrun_one(m, p, "emulate", steps, &ask);
    snprintf(p, sizeof p, "how=device,hold=true,free_layer=%d", F);
    hrun_one(m, p, "emulate", steps, &hold);
    /* free_layer sees 2 (L - 1) held steps at step 2 and releases: step 3 asks every layer again,
     * which hold again from step 4 */
    snprintf(p, sizeof p, "how=device,hold=true,free_layer=%d,release_at=%d", F, 2 * (L - 1));
    hrun_one(m, p, "emulate", steps, &rel);
    KT_CHECK(ask.st == KS_OK && hold.st == KS_OK && rel.st == KS_OK, "%s / %s / %s", ask.err, hold.err, rel.err);
    KT_CHECK(same_steps(m, &ask, &hold) && same_steps(m, &ask, &rel), "held or released steps differ from asked ones");
    /* held: step 0 asks L layers, each later step free_layer alone, which last saw (steps - 1 - 1)
     * steps of L - 1 held layers (its own step's layers below it included: (steps - 1) (L - 1)) */
    KT_CHECK(hold.calls == L + (steps - 1), "held: %ld calls, expected %d", hold.calls, L + steps - 1);
    KT_CHECK(hold.held == (long)(steps - 1) * (L - 1) && hold.held_steps == (long long)(steps - 1) * (L - 1),
             "held: the handler saw %ld held steps, the session counts %lld, expected %d", hold.held, hold.held_steps,
             (steps - 1) * (L - 1));
    /* released: steps 0 and 3 ask L layers, the other six free_layer alone */
    KT_CHECK(rel.calls == 2 * L + (steps - 2), "released: %ld calls, expected %d", rel.calls, 2 * L + steps - 2);
    KT_CHECK(rel.held_steps == (long long)(steps - 2) * (L - 1), "released: %lld held steps, expected %d", rel.held_steps,
             (steps - 2) * (L - 1));
    free(ask.lg);
    free(hold.lg);
    free(rel.lg);
    ks_model_close(m);
}

KT_TEST(hold_dropped_by_a_prefill_and_a_reset) {
    ks_lua_quiet = 1;
    ks_model *m;
    KT_CHECK(ks_model_open(TINY, "cpu", &m) == KS_OK, "%s", ks_last_error());
    const int L = m->cfg.n_layers;
    ks_policy *p = NULL;
    ks_session *s = NULL;
    KT_CHECK(ks_policy_load_string(m, "holder", SEG_HOLDER, &p) == KS_OK, "%s", ks_last_error());
    KT_CHECK(seg_set_params(p, "how=device,hold=true") == KS_OK && ks_policy_set(p, "_device", "emulate") == KS_OK, "%s",
             ks_last_error());
    KT_CHECK(ks_session_create(m, &s) == KS_OK && ks_session_set_policy(s, p) == KS_OK, "%s", ks_last_error());
    int32_t prompt[120];
    prompt_of(m, prompt, 120);
    ks_status st = ks_session_prefill(s, prompt, 100);
    for (int t = 0; !st && t < 3; t++) st = ks_session_decode(s, 5 + t);
    KT_CHECK(st == KS_OK, "%s", ks_last_error());
    const char *c = ks_policy_report(p, "calls");
    KT_CHECK(c && atoi(c) == L && ks_session_held_steps(s) == 2 * L, "3 steps: %s calls, %lld held", c ? c : "-",
             ks_session_held_steps(s));
    /* more prompt on the same conversation: the holds go, the next step asks every layer */
    st = ks_session_prefill(s, prompt + 100, 20);
    if (!st) st = ks_session_decode(s, 9);
    KT_CHECK(st == KS_OK, "%s", ks_last_error());
    c = ks_policy_report(p, "calls");
    KT_CHECK(c && atoi(c) == 2 * L, "after a prefill: %s calls, expected %d", c ? c : "-", 2 * L);
    /* a reset: the count starts again and no hold is left */
    ks_session_reset(s);
    KT_CHECK(ks_session_held_steps(s) == 0 && !ks_hold_on(s, 0), "after a reset: %lld held steps", ks_session_held_steps(s));
    ks_session_free(s);
    ks_policy_free(p);
    ks_model_close(m);
}

/* A policy that holds wrongly, by `case`. */
static const char *bad_hold =
    "local ks = require 'kvsieve'\n"
    "local function dev(a, b) local v = {} for i = 1, b - a do v[i] = 1.0 end return ks.topk(ks._upload(ks.tensor(v)), b - a, { values = false }) + a end\n"
    "return { name = 'badhold', params = { case = '' },\n"
    "  prefill_qkv = function(ev, p)\n"
    "    if p.case == 'prefill' and ev.layer == 1 then ev:attend(dev(0, 4), { hold = true }) end\n"
    "  end,\n"
    "  decode_qkv = function(ev, p)\n"
    "    if ev.layer ~= 1 then return end\n"
    "    local n = ev.kv_rows[1]\n"
    "    if p.case == 'heads' then local t = {} for h = 1, ev.n_kv_heads do t[h] = { 0, 1, 2 } end ev:attend(t, { hold = true })\n"
    "    elseif p.case == 'unchecked' then ev:attend(ks._upload(ks.tensor({ 0, 1, 2 })), { hold = true })\n"
    "    elseif p.case == 'release' then ev:release(ev.n_layers)\n"
    "    elseif p.case == 'release_neg' then ev:release(-1)\n"
    "    end\n"
    "  end }\n";

KT_TEST(hold_errors_are_named) {
    ks_lua_quiet = 1;
    ks_model *m;
    KT_CHECK(ks_model_open(TINY, "cpu", &m) == KS_OK, "%s", ks_last_error());
    char want_rel[96];
    snprintf(want_rel, sizeof want_rel, "release: layer %d is not in [0, %d)", m->cfg.n_layers, m->cfg.n_layers);
    const struct { const char *c, *want; } cases[] = {
        {"prefill", "hold only in decode_qkv (asked in prefill_qkv)"},
        {"heads", "hold takes one list for every KV head"},
        {"unchecked", "hold needs a list valid by construction"},
        {"release", want_rel},
        {"release_neg", "release: layer -1 is not in"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ks_policy *p = NULL;
        ks_session *s = NULL;
        KT_CHECK(ks_policy_load_string(m, "badhold", bad_hold, &p) == KS_OK, "%s", ks_last_error());
        char params[64];
        snprintf(params, sizeof params, "case=%s", cases[i].c);
        ks_status st = seg_set_params(p, params);
        if (!st) st = ks_policy_set(p, "_device", "emulate");
        if (!st) st = ks_session_create(m, &s);
        if (!st) st = ks_session_set_policy(s, p);
        int32_t prompt[40];
        prompt_of(m, prompt, 40);
        if (!st) st = ks_session_prefill(s, prompt, 40);
        for (int t = 0; !st && t < 2; t++) st = ks_session_decode(s, 7);
        const char *err = ks_last_error();
        KT_CHECK(st == KS_ERR_POLICY, "%s: status %d (%s)", cases[i].c, st, err);
        KT_CHECK(strstr(err, cases[i].want) != NULL, "%s: message '%s' lacks '%s'", cases[i].c, err, cases[i].want);
        ks_session_free(s);
        ks_policy_free(p);
    }
    ks_model_close(m);
}

/* ---------------------------------------------------------------- replay and page actions */

/* The core actions of recorded handlers, called from a C policy's decode handler (layer 1 of the
 * first decode step) on the CPU backend: each bad call is KS_ERR_POLICY with a message naming it,
 * and the calls that are right succeed (policy.h ks_action_replay, ks_action_replay_within,
 * ks_action_attend_page). */
typedef struct rcase {
    int c, done;           /* done: the handler ran its case */
    ks_status st;
    char err[400];
    int replay;
    int64_t rows;
} rcase;

static ks_status replay_case(void *user, ks_event *ev) {
    rcase *r = user;
    if (ev->layer != 1 || r->done) return KS_OK;
    ks_status st = KS_OK;
    int32_t idx[2] = {0, 1};
    switch (r->c) {
    case 0: st = ks_action_replay_within(ev, 0); break;                  /* no row to replay */
    case 1: st = ks_action_attend_page(ev, 4); break;                    /* page without an attend */
    case 2: st = ks_action_attend(ev, idx, 2, 0);                        /* a host list */
            if (!st) st = ks_action_replay(ev);
            break;
    case 3: st = ks_action_attend(ev, idx, 2, 0);                        /* page of a host list */
            if (!st) st = ks_action_attend_page(ev, 4);
            break;
    case 4: st = ks_action_replay(ev);                                   /* nothing asked: right */
            r->replay = ev->act.replay;
            r->rows = ev->act.replay_rows;
            break;
    case 5: st = ks_action_replay_within(ev, 9);                         /* right, 9 rows */
            r->replay = ev->act.replay;
            r->rows = ev->act.replay_rows;
            break;
    case 6: st = ks_action_attend_page(ev, 0); break;                    /* a page of no rows */
    }
    r->done = 1;
    r->st = st;
    snprintf(r->err, sizeof r->err, "%s", st ? ks_last_error() : "");
    return st;
}

KT_TEST(replay_actions_errors_are_named) {
    ks_model *m;
    KT_CHECK(ks_model_open(TINY, "cpu", &m) == KS_OK, "%s", ks_last_error());
    static const char *want[] = {
        "replay (layer 1): within 0 rows: must be at least 1",
        "attend (layer 1): page follows a device-list attend with a trailing range",
        "replay (layer 1): only a device-list attend",
        "attend (layer 1): page follows a device-list attend with a trailing range",
        NULL,
        NULL,
        "attend (layer 1): a page of 0 rows",
    };
    for (int c = 0; c < (int)(sizeof want / sizeof want[0]); c++) {
        rcase r = {.c = c};
        ks_policy_handlers h = {.name = "replay_case", .user = &r, .decode_qkv = replay_case};
        ks_policy *p = NULL;
        ks_session *s = NULL;
        ks_status st = ks_policy_create_c(&h, &p);
        if (!st) st = ks_session_create(m, &s);
        if (!st) st = ks_session_set_policy(s, p);
        int32_t prompt[40];
        prompt_of(m, prompt, 40);
        if (!st) st = ks_session_prefill(s, prompt, 40);
        if (!st) st = ks_session_decode(s, 7);
        if (want[c]) {
            KT_CHECK(st == KS_ERR_POLICY && r.done && r.st == KS_ERR_POLICY, "case %d: status %d, the action's %d (%s)", c, st, r.st,
                     r.err);
            KT_CHECK(strstr(r.err, want[c]) != NULL, "case %d: message '%s' lacks '%s'", c, r.err, want[c]);
        } else {
            KT_CHECK(st == KS_OK && r.done && r.st == KS_OK, "case %d: status %d, the action's %d (%s)", c, st, r.st, r.err);
            KT_CHECK(r.replay == 1 && r.rows == (c == 5 ? 9 : 0), "case %d: replay %d within %lld rows", c, r.replay,
                     (long long)r.rows);
        }
        ks_session_free(s);
        ks_policy_free(p);
    }
    ks_model_close(m);
}
