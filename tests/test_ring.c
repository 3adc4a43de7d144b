/* test_ring.c — the KV ring (core/policy.h ks_policy.ring_*, ks.kv_ring) on the CPU backend and
 * the bundled tiny model: a ring decode step overwrites a full layer's oldest row after the
 * sinks in place; the compacting path (a decode_qkv handler that attends and retains the same
 * rows at every step) is the reference it must equal bit for bit.
 *   ring_matches_compaction            a prompt longer than the budget (cut at the prefill), one
 *                                      shorter (the layers grow, then ring), sinks = 0, and
 *                                      policies/streamingllm.lua itself: at every step the logits
 *                                      bit for bit, the ids, the kept rows as sets (the ring's are
 *                                      rotated: the test checks that they were), and after the
 *                                      generation's end the kept lists in order
 *   ring_chat_turn_restores_order      ring steps, a second prefill at n_past > 0 (a chat turn:
 *                                      the handler's retain indexes rows in logical order), more
 *                                      ring steps: the same, bit for bit
 *   ring_batched_then_alone            a ring session stepped alone (rotated), then in a batch
 *                                      with another session (the decode_qkv handler, on rows put
 *                                      back in order), then alone again: its logits equal the
 *                                      compacting run's bit for bit
 *   ring_generate_kept_in_order        ks_generate_ids, and a ks_seq stepped alone (the server's
 *                                      path), with rolling StreamingLLM: ids and kept lists (in
 *                                      order) equal the compacting policy's
 *   ring_errors                        ks.kv_ring's bad arguments and places: one-line
 *                                      KS_ERR_POLICY messages naming the problem */
#include "decode_batch.h"
#include "engine.h"
#include "forward.h"
#include "ktest.h"
#include "kvsieve.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TINY "models/kvsieve-tiny"

/* StreamingLLM's eviction as a plain Lua policy; ring = true declares it as the engine's ring
 * (the decode_qkv handler then runs only where the engine has no ring), ring = false compacts
 * at every decode step (the reference). */
static const char *SRC =
    "local ks = require 'kvsieve'\n"
    "local function keep(rows, p) return ks.concat(ks.arange(0, p.sinks), ks.arange(rows - (p.budget - p.sinks), rows)) end\n"
    "return { name = 'sinkwindow', params = { budget = 24, sinks = 4, ring = false },\n"
    "  begin = function(p) if p.ring then ks.kv_ring{ sinks = p.sinks, budget = p.budget } end end,\n"
    "  prefill_qkv = function(ev, p) local rows = ev.kv_rows[1] + ev.n\n"
    "    if rows > p.budget then ev:retain(keep(rows, p)) end end,\n"
    "  decode_qkv = function(ev, p) local rows = ev.kv_rows[1]\n"
    "    if rows > p.budget then local k = keep(rows, p); ev:attend(k); ev:retain(k) end end }\n";

static void prompt_ids(int32_t *ids, int n, int salt) {
    for (int i = 0; i < n; i++) ids[i] = 3 + (i * 131 + salt * 977 + i * i * 7) % 4000;
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* A policy: "ring" / "compact" (SRC with ring = true / false) or "streamingllm" (the file, rolling). */
static ks_status policy_for(ks_model *m, const char *kind, int sinks, int budget, ks_policy **p) {
    char b[32], sk[32];
    snprintf(b, sizeof b, "%d", budget);
    snprintf(sk, sizeof sk, "%d", sinks);
    ks_status st = !strcmp(kind, "streamingllm") ? ks_policy_load(m, "streamingllm", p)
                                                  : ks_policy_load_string(m, "sinkwindow", SRC, p);
    if (!st) st = ks_policy_set(*p, "budget", b);
    if (!st) st = ks_policy_set(*p, "sinks", sk);
    if (!st && !strcmp(kind, "streamingllm")) st = ks_policy_set(*p, "rolling", "true");
    else if (!st) st = ks_policy_set(*p, "ring", !strcmp(kind, "ring") ? "true" : "false");
    return st;
}

/* One run's record: per step the logits and each layer / head's kept rows sorted, the ids, and
 * whether some layer's rows were ever out of position order (rotated). */
typedef struct run_rec {
    int steps, vocab, nl, nh, cap;  /* cap: kept rows recorded per layer and head */
    int32_t *ids;                   /* (steps) */
    float *lg;                      /* (steps, vocab) */
    int32_t *kept;                  /* (steps, nl, nh, cap) sorted, -1 padded */
    int32_t *final;                 /* (nl, nh, cap) after the end (in order) */
    int rotated;
} run_rec;

static void rec_free(run_rec *r) { free(r->ids); free(r->lg); free(r->kept); free(r->final); }

static void snap_kept(const ks_session *s, int32_t *out, int cap, int sort, int *rotated) {
    const ks_config *c = &s->m->cfg;
    for (int l = 0; l < c->n_layers; l++)
        for (int h = 0; h < c->n_kv_heads; h++) {
            const int32_t *pos;
            int n = ks_result_kept(s, l, h, &pos);
            int32_t *o = out + ((size_t)l * c->n_kv_heads + h) * cap;
            for (int i = 0; i < cap; i++) o[i] = i < n ? pos[i] : -1;
            for (int i = 1; rotated && i < n; i++)
                if (pos[i] < pos[i - 1]) *rotated = 1;
            if (sort) qsort(o, (size_t)(n < cap ? n : cap), sizeof(int32_t), cmp_i32);
        }
}

/* prefill n1 ids, `s1` greedy steps; with n2 > 0 a second prefill of n2 ids (a chat turn) and
 * s2 more steps; then the generation's end (ks_ring_restore_all). with_batch: steps s1/3 ..
 * 2*s1/3 go through ks_sessions_decode together with a second, policy-less session. */
static ks_status run(ks_model *m, const char *kind, int sinks, int budget, int n1, int s1, int n2, int s2, int with_batch,
                     run_rec *r) {
    const ks_config *c = &m->cfg;
    memset(r, 0, sizeof *r);
    r->steps = s1 + s2;
    r->vocab = c->vocab;
    r->nl = c->n_layers;
    r->nh = c->n_kv_heads;
    r->cap = n1 + n2 + r->steps + 1;
    size_t per = (size_t)r->nl * r->nh * r->cap;
    r->ids = malloc(sizeof(int32_t) * r->steps);
    r->lg = malloc(sizeof(float) * (size_t)r->steps * r->vocab);
    r->kept = malloc(sizeof(int32_t) * per * r->steps);
    r->final = malloc(sizeof(int32_t) * per);
    if (!r->ids || !r->lg || !r->kept || !r->final) return KS_ERR_OOM;
    ks_session *s = NULL, *o = NULL;
    ks_policy *p = NULL;
    int32_t pr[256];
    ks_sampler g;
    ks_sampler_init(&g, 0, 1, 0);
    ks_status st = ks_session_create(m, &s);
    if (!st) st = policy_for(m, kind, sinks, budget, &p);
    if (!st) st = ks_session_set_policy(s, p);
    if (!st) { prompt_ids(pr, n1, 1); st = ks_session_prefill(s, pr, n1); }
    if (!st && with_batch) { st = ks_session_create(m, &o); prompt_ids(pr, 7, 2); if (!st) st = ks_session_prefill(o, pr, 7); }
    for (int t = 0; !st && t < r->steps; t++) {
        if (t == s1 && n2 > 0) { prompt_ids(pr, n2, 3); if ((st = ks_session_prefill(s, pr, n2))) break; }
        int32_t id = ks_sample(&g, s->logits, r->vocab);
        r->ids[t] = id;
        if (with_batch && t >= s1 / 3 && t < 2 * s1 / 3) {
            ks_session *both[2] = {s, o};
            int32_t bid[2] = {id, ks_sample(&g, o->logits, r->vocab)};
            ks_status bs[2];
            st = ks_sessions_decode(both, bid, 2, bs, NULL);
            if (!st) st = bs[0] ? bs[0] : bs[1];
        } else
            st = ks_session_decode(s, id);
        if (st) break;
        memcpy(r->lg + (size_t)t * r->vocab, s->logits, sizeof(float) * r->vocab);
        snap_kept(s, r->kept + per * t, r->cap, 1, &r->rotated);
    }
    if (!st) st = ks_ring_restore_all(s); /* what a generation's end does */
    if (!st) snap_kept(s, r->final, r->cap, 0, NULL);
    ks_session_free(o);
    ks_session_free(s);
    ks_policy_free(p);
    return st;
}

/* a and b equal: ids, logits bit for bit, kept sets at every step, the final lists. why: the first difference. */
static void compare(const run_rec *a, const run_rec *b, const char *what, char *why, size_t cap) {
    size_t per = (size_t)a->nl * a->nh * a->cap;
    for (int t = 0; t < a->steps && !why[0]; t++) {
        if (a->ids[t] != b->ids[t]) snprintf(why, cap, "%s: step %d id %d against %d", what, t, a->ids[t], b->ids[t]);
        else if (memcmp(a->lg + (size_t)t * a->vocab, b->lg + (size_t)t * a->vocab, sizeof(float) * a->vocab))
            snprintf(why, cap, "%s: step %d logits differ", what, t);
        else if (memcmp(a->kept + per * t, b->kept + per * t, sizeof(int32_t) * per))
            snprintf(why, cap, "%s: step %d kept rows differ (as sets)", what, t);
    }
    if (!why[0] && memcmp(a->final, b->final, sizeof(int32_t) * per))
        snprintf(why, cap, "%s: the kept lists after the end differ", what);
}

static void ring_case(kt_ctx *kt_, const char *kind, int sinks, int budget, int n1, int s1, int n2, int s2, int with_batch) {
    ks_model *m = NULL;
    KT_CHECK(ks_model_open(TINY, "cpu", &m) == KS_OK, "%s", ks_last_error());
    if (!m) return;
    run_rec a, b;
    char why[256] = "", what[96];
    snprintf(what, sizeof what, "%s sinks %d budget %d prompt %d+%d", kind, sinks, budget, n1, n2);
    ks_status sa = run(m, kind, sinks, budget, n1, s1, n2, s2, with_batch, &a);
    KT_CHECK(sa == KS_OK, "%s: %s", what, ks_last_error());
    ks_status sb = run(m, "compact", sinks, budget, n1, s1, n2, s2, with_batch, &b);
    KT_CHECK(sb == KS_OK, "compact %s: %s", what, ks_last_error());
    if (!sa && !sb) {
        compare(&a, &b, what, why, sizeof why);
        KT_CHECK(!why[0], "%s", why);
        /* (one slot, budget - sinks = 1, is overwritten in place: never out of order) */
        KT_CHECK(a.rotated || budget - sinks == 1, "%s: the ring never rotated a layer (did it run?)", what);
        KT_CHECK(!b.rotated, "%s: the compacting run's rows were out of order", what);
    }
    rec_free(&a);
    rec_free(&b);
    ks_model_close(m);
}

KT_TEST(ring_matches_compaction) {
    ring_case(kt_, "ring", 4, 24, 40, 50, 0, 0, 0);          /* cut at the prefill; wraps twice */
    ring_case(kt_, "ring", 4, 24, 10, 40, 0, 0, 0);          /* grows to the budget, then rings */
    ring_case(kt_, "ring", 0, 7, 12, 20, 0, 0, 0);           /* no sinks: a sliding window */
    ring_case(kt_, "ring", 6, 7, 12, 9, 0, 0, 0);            /* one ring slot */
    ring_case(kt_, "streamingllm", 4, 24, 40, 50, 0, 0, 0);  /* the policy file itself */
}

KT_TEST(ring_chat_turn_restores_order) {
    ring_case(kt_, "ring", 4, 24, 40, 30, 9, 25, 0);
    ring_case(kt_, "streamingllm", 2, 16, 20, 23, 30, 10, 0); /* the second prompt longer than the budget */
}

KT_TEST(ring_batched_then_alone) {
    ring_case(kt_, "ring", 4, 24, 40, 45, 0, 0, 1);
}

/* A request of 40 new tokens on a 48-token prompt (sinks 3, budget 20), through ks_generate_ids
 * (seq = 0) or a ks_seq stepped alone with ks_batch_step (seq = 1: the server's path): the ids
 * and every layer and head's kept list (cap 32 each) into ids / kept. */
static ks_status request(ks_model *m, const char *kind, int seq, int32_t *ids, int *n, int32_t *kept, int *nk) {
    const ks_config *c = &m->cfg;
    int32_t pr[48];
    prompt_ids(pr, 48, 5);
    ks_session *s = NULL;
    ks_policy *p = NULL;
    ks_seq *q = NULL;
    ks_generate_opts o;
    ks_generate_opts_default(&o);
    o.max_new_tokens = 40;
    ks_status st = ks_session_create(m, &s);
    if (!st) st = policy_for(m, kind, 3, 20, &p);
    if (!st) st = ks_session_set_policy(s, p);
    if (!st && !seq) st = ks_generate_ids(s, pr, 48, &o, NULL, NULL);
    if (!st && seq) st = ks_seq_create(s, pr, 48, &o, &q);
    if (!st && seq) st = ks_seq_prefill(q, 0);
    while (!st && seq && ks_seq_get_state(q) != KS_SEQ_DONE) st = ks_batch_step(&q, 1);
    if (!st && seq) st = ks_seq_status(q);
    *n = 0;
    *nk = 0;
    if (!st) {
        const int32_t *g = ks_result_ids(s, n);
        memcpy(ids, g, sizeof(int32_t) * (*n < 64 ? *n : 64));
        for (int l = 0; l < c->n_layers; l++)
            for (int h = 0; h < c->n_kv_heads; h++) {
                const int32_t *pos;
                int r = ks_result_kept(s, l, h, &pos);
                *nk += r;
                for (int i = 0; i < r && i < 32; i++) kept[((size_t)l * c->n_kv_heads + h) * 32 + i] = pos[i];
            }
    }
    ks_seq_free(q);
    ks_session_free(s);
    ks_policy_free(p);
    return st;
}

KT_TEST(ring_generate_kept_in_order) {
    ks_model *m = NULL;
    KT_CHECK(ks_model_open(TINY, "cpu", &m) == KS_OK, "%s", ks_last_error());
    if (!m) return;
    const ks_config *c = &m->cfg;
    size_t kn = (size_t)c->n_layers * c->n_kv_heads * 32;
    int32_t ids[3][64];
    int n[3], nk[3];
    int32_t *kept[3];
    static const char *what[3] = {"compacting, generate", "ring, generate", "ring, ks_seq"};
    for (int k = 0; k < 3; k++) {
        kept[k] = calloc(kn, sizeof(int32_t));
        ks_status st = request(m, k ? "streamingllm" : "compact", k == 2, ids[k], &n[k], kept[k], &nk[k]);
        KT_CHECK(st == KS_OK, "%s: %s", what[k], ks_last_error());
    }
    for (int k = 1; k < 3; k++) {
        KT_CHECK(n[0] > 0 && n[k] == n[0] && !memcmp(ids[k], ids[0], sizeof(int32_t) * (n[0] < 64 ? n[0] : 64)),
                 "%s: generated ids differ from the compacting run's (%d and %d tokens)", what[k], n[k], n[0]);
        KT_CHECK(nk[0] == c->n_layers * c->n_kv_heads * 20 && nk[k] == nk[0] && !memcmp(kept[k], kept[0], sizeof(int32_t) * kn),
                 "%s: kept lists differ from the compacting run's after the request (%d and %d rows)", what[k], nk[k], nk[0]);
    }
    for (int k = 0; k < 3; k++) free(kept[k]);
    ks_model_close(m);
}

KT_TEST(ring_errors) {
    ks_model *m = NULL;
    KT_CHECK(ks_model_open(TINY, "cpu", &m) == KS_OK, "%s", ks_last_error());
    if (!m) return;
    static const struct { const char *begin, *handler, *want; } C[] = {
        {"ks.kv_ring{ sinks = 4, budget = 4 }", "", "budget = 4 must exceed sinks = 4"},
        {"ks.kv_ring{ sinks = -1, budget = 8 }", "", "sinks = -1 must be >= 0"},
        {"ks.kv_ring{ sinks = 1.5, budget = 8 }", "", "sinks must be an integer, got 1.5"},
        {"ks.kv_ring{ budget = 8 }", "", "sinks must be an integer, got nil"},
        {"ks.kv_ring{ sinks = 1, budget = '8' }", "", "budget must be an integer, got string"},
        {"ks.kv_ring(8)", "", "expects a table {sinks = S, budget = B}, got number"},
        {"ks.kv_ring{ sinks = 1, budget = 8, sink = 2 }", "", "unknown key sink (keys: sinks, budget)"},
        {"", "ks.kv_ring{ sinks = 1, budget = 8 }", "kv_ring: only inside a policy's begin"},
    };
    for (size_t i = 0; i < sizeof C / sizeof C[0]; i++) {
        char src[512];
        snprintf(src, sizeof src,
                 "local ks = require 'kvsieve'\nreturn { name = 'badring', begin = function(p) %s end,\n"
                 "  prefill_qkv = function(ev, p) %s end }\n",
                 C[i].begin, C[i].handler);
        ks_policy *p = NULL;
        ks_session *s = NULL;
        ks_status st = ks_policy_load_string(m, "badring", src, &p);
        if (!st) st = ks_session_create(m, &s);
        if (!st) st = ks_session_set_policy(s, p);
        int32_t pr[8];
        prompt_ids(pr, 8, 9);
        if (!st) st = ks_session_prefill(s, pr, 8);
        const char *e = ks_last_error();
        KT_CHECK(st == KS_ERR_POLICY, "case %zu: status %d, want a policy error", i, (int)st);
        KT_CHECK(e && strstr(e, C[i].want), "case %zu: message '%s' lacks '%s'", i, e ? e : "", C[i].want);
        ks_session_free(s);
        ks_policy_free(p);
    }
    ks_model_close(m);
}
