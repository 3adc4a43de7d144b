/* test_sampling.c — the sampling filters and stop strings of issue 15: top_k, min_p, the CTRL
 * repetition penalty and stop strings, in the sampler and generation (core/sample.c,
 * core/generate.c), through ks_generate on the bundled model, the CLI flags (--top-k, --min-p,
 * --repeat-penalty, --stop; needs KS_BIN) and the Lua generate options. Everything is
 * deterministic: fixed logits, fixed seeds, the bundled model on the CPU. */
#include "engine.h"
#include "kvsieve.h"
#include "ks_lua.h"
#include "ktest.h"
#include "testutil.h"

#include <lauxlib.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TINY "models/kvsieve-tiny"
static const char *prompt = "The grass is green. The sky is blue. The sun is bright. The grass is";

/* ---------------------------------------------------------------- the sampler */

static uint64_t lcg(uint64_t *s) { return *s = *s * 6364136223846793005ull + 1442695040888963407ull; }

/* n logits in [-8, 8), with a few exact ties to the maximum */
static void random_logits(float *l, int n, uint64_t seed) {
    for (int i = 0; i < n; i++) l[i] = (float)((lcg(&seed) >> 40) % 16000) / 1000.0f - 8.0f;
    if (seed % 3 == 0) {
        int a = (int)(lcg(&seed) >> 33) % n, b = (int)(lcg(&seed) >> 33) % n;
        l[a] = l[b] = 8.5f;
    }
}

static int32_t argmax_lowest(const float *l, int n) {
    int32_t b = 0;
    for (int i = 1; i < n; i++)
        if (l[i] > l[b]) b = i;
    return b;
}

/* top-k 1 is greedy, ties included (the lowest id); min-p 1 is greedy up to ties. */
KT_TEST(sampling_top_k_one_and_min_p_one_are_greedy) {
    enum { V = 257 };
    float l[V];
    static const float temps[] = {0.3f, 1.0f, 4.0f};
    for (int c = 0; c < 120; c++) {
        random_logits(l, V, 1000 + c);
        int32_t g = argmax_lowest(l, V);
        for (int t = 0; t < 3; t++) {
            ks_sampler k1, m1;
            ks_sampler_init(&k1, temps[t], 1, c);
            k1.top_k = 1;
            ks_sampler_init(&m1, temps[t], 1, c);
            m1.min_p = 1;
            int32_t a = ks_sample(&k1, l, V), b = ks_sample(&m1, l, V);
            KT_CHECK(a == g, "case %d T %g: top-k 1 drew %d, greedy %d", c, temps[t], a, g);
            /* min-p 1 keeps every token as likely as the best: with a tie at the top, any of them */
            KT_CHECK(b == g || l[b] == l[g], "case %d T %g: min-p 1 drew %d, greedy %d", c, temps[t], b, g);
        }
    }
}

/* top_k = k: only the k most likely tokens are drawn, and each of them is (a hot temperature
 * flattens the distribution). top_k 0 or >= the vocabulary is off: the very same draws. */
KT_TEST(sampling_top_k_keeps_k) {
    float l[8] = {0.5f, 3.0f, -1.0f, 2.9f, 2.8f, 0.1f, 2.7f, -3.0f}; /* ranked: 1, 3, 4, 6, 0, 5, 2, 7 */
    ks_sampler s;
    ks_sampler_init(&s, 5.0f, 1, 7);
    s.top_k = 3;
    int seen[8] = {0};
    for (int i = 0; i < 600; i++) seen[ks_sample(&s, l, 8)]++;
    KT_CHECK(seen[1] && seen[3] && seen[4], "a top-3 token was never drawn: %d %d %d", seen[1], seen[3], seen[4]);
    KT_CHECK(seen[0] + seen[2] + seen[5] + seen[6] + seen[7] == 0, "a token outside the top 3 was drawn");
    ks_sampler off, k0, kv;
    ks_sampler_init(&off, 1.3f, 0.95f, 99);
    ks_sampler_init(&k0, 1.3f, 0.95f, 99);
    ks_sampler_init(&kv, 1.3f, 0.95f, 99);
    k0.top_k = 0;
    kv.top_k = 8;
    for (int i = 0; i < 300; i++) {
        int32_t a = ks_sample(&off, l, 8), b = ks_sample(&k0, l, 8), c = ks_sample(&kv, l, 8);
        KT_CHECK(a == b && a == c, "draw %d: %d, top-k 0 %d, top-k = vocab %d", i, a, b, c);
    }
}

/* min_p = 0.5: only tokens at least half as likely as the best (at T = 1: logit >= max - ln 2). */
KT_TEST(sampling_min_p_floor) {
    float l[6] = {2.0f, 1.5f, 1.2f, 1.0f, 0.0f, 1.4f}; /* max 2: kept 0 (1), 1 (0.61), 5 (0.55); not 2 (0.45) */
    ks_sampler s;
    ks_sampler_init(&s, 1.0f, 1, 3);
    s.min_p = 0.5f;
    int seen[6] = {0};
    for (int i = 0; i < 600; i++) seen[ks_sample(&s, l, 6)]++;
    KT_CHECK(seen[0] && seen[1] && seen[5], "a token above the floor never drawn: %d %d %d", seen[0], seen[1], seen[5]);
    KT_CHECK(seen[2] + seen[3] + seen[4] == 0, "a token below half the best's probability was drawn: %d %d %d", seen[2],
             seen[3], seen[4]);
}

/* The penalty: positive logits of seen tokens divided, negative ones multiplied, others kept;
 * and the probability of a repeated token goes down, in the softmax and in the draws. */
KT_TEST(sampling_repeat_penalty_lowers_repeats) {
    float l[4] = {2.0f, -1.0f, 1.5f, 0.0f};
    unsigned char seen[4] = {1, 1, 0, 1};
    ks_repeat_penalty(l, seen, 4, 2.0f);
    KT_CHECK(l[0] == 1.0f && l[1] == -2.0f && l[2] == 1.5f && l[3] == 0.0f, "penalised: %g %g %g %g", l[0], l[1], l[2], l[3]);
    float a[4] = {2.0f, 1.8f, 1.0f, 0.5f}, b[4];
    memcpy(b, a, sizeof a);
    unsigned char s0[4] = {1, 0, 0, 0};
    ks_repeat_penalty(b, s0, 4, 1.3f);
    double za = 0, zb = 0;
    for (int i = 0; i < 4; i++) { za += exp(a[i]); zb += exp(b[i]); }
    KT_CHECK(exp(b[0]) / zb < exp(a[0]) / za, "p(repeated) %g -> %g", exp(a[0]) / za, exp(b[0]) / zb);
    ks_sampler x, y;
    ks_sampler_init(&x, 1, 1, 5);
    ks_sampler_init(&y, 1, 1, 5);
    int na = 0, nb = 0;
    for (int i = 0; i < 2000; i++) { na += ks_sample(&x, a, 4) == 0; nb += ks_sample(&y, b, 4) == 0; }
    KT_CHECK(nb < na, "token 0 drawn %d times with the penalty, %d without", nb, na);
}

KT_TEST(sampling_stop_find) {
    const char *st[] = {"cd", "b", "zz"};
    KT_CHECK(ks_stop_find("abcd", 4, st, 3) == 1, "earliest of several");
    KT_CHECK(ks_stop_find("abcd", 4, st, 1) == 2, "one");
    KT_CHECK(ks_stop_find("abcd", 4, st + 2, 1) == -1, "none");
    KT_CHECK(ks_stop_find("abcd", 4, st, 0) == -1, "no stop strings");
    KT_CHECK(ks_stop_find("abc", 2, st, 1) == -1, "past len");
    const char *lng[] = {"abcdef"};
    KT_CHECK(ks_stop_find("abc", 3, lng, 1) == -1, "longer than the text");
}

/* ---------------------------------------------------------------- through ks_generate */

typedef struct run {
    int32_t ids[128];
    int n;
    char text[4096], streamed[4096];
    ks_status st;
} run;

static int on_piece(void *ud, int32_t id, const char *piece) {
    (void)id;
    run *r = ud;
    size_t k = strlen(r->streamed);
    snprintf(r->streamed + k, sizeof r->streamed - k, "%s", piece);
    return 0;
}

static void gen(ks_session *s, const ks_generate_opts *o, run *r) {
    memset(r, 0, sizeof *r);
    r->st = ks_generate(s, prompt, o, on_piece, r);
    const int32_t *ids = ks_result_ids(s, &r->n);
    if (r->n > 128) r->n = 128;
    if (ids) memcpy(r->ids, ids, sizeof(int32_t) * r->n);
    snprintf(r->text, sizeof r->text, "%s", ks_result_text(s) ? ks_result_text(s) : "");
}

static ks_generate_opts opts_n(int n) {
    ks_generate_opts o;
    ks_generate_opts_default(&o);
    o.max_new_tokens = n;
    return o;
}

/* Greedy and seeded sampling with the new options at their defaults give what they gave
 * before the options existed (the seeded text was produced by the sampler before this
 * change); top-k 1 and min-p 1 at T = 1 give the greedy tokens. */
KT_TEST(sampling_generate_defaults_and_greedy_equivalents) {
    ks_model *m;
    KT_CHECK(ks_model_open(TINY, "cpu", &m) == KS_OK, "%s", ks_last_error());
    ks_session *s;
    KT_CHECK(ks_session_create(m, &s) == KS_OK, "%s", ks_last_error());
    ks_generate_opts o = opts_n(40);
    run g, r;
    gen(s, &o, &g);
    char why[8192] = "";
    if (g.st || g.n != 40) snprintf(why, sizeof why, "greedy: %s, %d ids", ks_last_error(), g.n);
    o.temperature = 1;
    o.seed = 3;
    gen(s, &o, &r);
    if (!why[0] && strcmp(r.text, " blue. The sun is blue. The sun is yellow. The sun is yellow. The sun is yellow. The sun is "
                                  "blue. The sun is yellow. The sun is yellow. The sun is"))
        snprintf(why, sizeof why, "seeded T=1 text changed: \"%s\"", r.text);
    o.top_k = 1;
    gen(s, &o, &r);
    if (!why[0] && (r.n != g.n || memcmp(r.ids, g.ids, sizeof(int32_t) * g.n))) snprintf(why, sizeof why, "top-k 1 != greedy");
    o.top_k = 0;
    o.min_p = 1;
    gen(s, &o, &r);
    if (!why[0] && (r.n != g.n || memcmp(r.ids, g.ids, sizeof(int32_t) * g.n))) snprintf(why, sizeof why, "min-p 1 != greedy");
    o = opts_n(40);
    o.repeat_penalty = 0; /* 0 and 1 are off */
    gen(s, &o, &r);
    if (!why[0] && (r.n != g.n || memcmp(r.ids, g.ids, sizeof(int32_t) * g.n))) snprintf(why, sizeof why, "penalty 0 != greedy");
    ks_session_free(s);
    ks_model_close(m);
    KT_CHECK(!why[0], "%s", why);
}

/* Share of generated tokens already in the context (prompt + earlier output). */
static double repeat_share(ks_model *m, const run *r) {
    int32_t *p;
    int np;
    if (ks_tokenize(m, prompt, 1, &p, &np)) return -1;
    int rep = 0;
    for (int i = 0; i < r->n; i++) {
        int found = 0;
        for (int j = 0; j < np && !found; j++) found = p[j] == r->ids[i];
        for (int j = 0; j < i && !found; j++) found = r->ids[j] == r->ids[i];
        rep += found;
    }
    free(p);
    return r->n ? (double)rep / r->n : 0;
}

KT_TEST(sampling_generate_repeat_penalty) {
    ks_model *m;
    KT_CHECK(ks_model_open(TINY, "cpu", &m) == KS_OK, "%s", ks_last_error());
    ks_session *s;
    KT_CHECK(ks_session_create(m, &s) == KS_OK, "%s", ks_last_error());
    ks_generate_opts o = opts_n(40);
    run g, r;
    gen(s, &o, &g);
    o.repeat_penalty = 1.5f;
    gen(s, &o, &r);
    double a = repeat_share(m, &g), b = repeat_share(m, &r);
    ks_session_free(s);
    ks_model_close(m);
    KT_CHECK(g.st == KS_OK && r.st == KS_OK, "generate failed");
    /* the bundled model mostly repeats its prompt when greedy (0.78 of its tokens) */
    KT_CHECK(a > 0.6 && b < a - 0.3, "share of repeated tokens: %.2f greedy, %.2f with penalty 1.5", a, b);
    KT_CHECK(r.ids[0] != g.ids[0], "the first token did not change (the prompt's tokens are penalised)");
}

/* Stop strings cut the text before the first one; the ids are the greedy ids up to the token
 * that completed it; the stream shows exactly the result text (never a stop string's start,
 * even held back text is flushed at the end when no stop string came, at max_new or EOS). */
KT_TEST(sampling_generate_stop_strings) {
    ks_model *m;
    KT_CHECK(ks_model_open(TINY, "cpu", &m) == KS_OK, "%s", ks_last_error());
    ks_session *s;
    KT_CHECK(ks_session_create(m, &s) == KS_OK, "%s", ks_last_error());
    ks_generate_opts o = opts_n(40);
    run g, r;
    gen(s, &o, &g);
    char why[8192] = "";
    /* " sky" first shows up in the output's second sentence of that kind */
    const char *sky = strstr(g.text, " sky");
    if (!sky) snprintf(why, sizeof why, "the greedy text has no \" sky\": %s", g.text);
    const char *st1[] = {" sky"};
    o.stop = st1;
    o.n_stop = 1;
    if (!why[0]) gen(s, &o, &r);
    if (!why[0] && (r.st || strncmp(r.text, g.text, (size_t)(sky - g.text)) || strlen(r.text) != (size_t)(sky - g.text)))
        snprintf(why, sizeof why, "stop \" sky\": \"%.1500s\", want the greedy text up to it", r.text);
    if (!why[0] && strcmp(r.streamed, r.text)) snprintf(why, sizeof why, "streamed \"%.1500s\" != text \"%.1500s\"", r.streamed, r.text);
    if (!why[0] && (r.n >= g.n || memcmp(r.ids, g.ids, sizeof(int32_t) * r.n)))
        snprintf(why, sizeof why, "ids: %d, not a shorter prefix of the greedy ones (%d)", r.n, g.n);
    /* several: the earliest wins */
    const char *st2[] = {"back again", " sun is blue", "Here"};
    o.stop = st2;
    o.n_stop = 3;
    if (!why[0]) gen(s, &o, &r);
    const char *first = strstr(g.text, " sun is blue");
    if (!why[0] && (!first || strlen(r.text) != (size_t)(first - g.text) || strcmp(r.streamed, r.text)))
        snprintf(why, sizeof why, "several stops: \"%.1500s\" (streamed \"%.1500s\")", r.text, r.streamed);
    /* one that never comes but whose starts do ("The grass is " ...): all text, all streamed */
    const char *st3[] = {"The grass is purple"};
    o.stop = st3;
    o.n_stop = 1;
    if (!why[0]) gen(s, &o, &r);
    if (!why[0] && (strcmp(r.text, g.text) || strcmp(r.streamed, g.text) || r.n != g.n))
        snprintf(why, sizeof why, "a stop string that never comes changed the output: \"%.1500s\" / \"%.1500s\"", r.text, r.streamed);
    /* ending at EOS (the penalised run ends early) with held-back text ("." of ". Zebra") */
    o.repeat_penalty = 1.5f;
    o.n_stop = 0;
    run e;
    if (!why[0]) gen(s, &o, &e);
    const char *st4[] = {". Zebra"};
    o.stop = st4;
    o.n_stop = 1;
    if (!why[0]) gen(s, &o, &r);
    if (!why[0] && (e.n >= 40 || strcmp(r.text, e.text) || strcmp(r.streamed, e.text)))
        snprintf(why, sizeof why, "EOS run (%d ids): \"%.1000s\" / streamed \"%.1000s\" / without stops \"%.1000s\"", e.n, r.text, r.streamed, e.text);
    ks_session_free(s);
    ks_model_close(m);
    KT_CHECK(!why[0], "%s", why);
}

KT_TEST(sampling_options_checked) {
    ks_model *m;
    KT_CHECK(ks_model_open(TINY, "cpu", &m) == KS_OK, "%s", ks_last_error());
    ks_session *s;
    KT_CHECK(ks_session_create(m, &s) == KS_OK, "%s", ks_last_error());
    const char *empty[] = {""}, *null1[] = {NULL};
    struct { const char *what; ks_generate_opts o; } bad[8];
    int nb = 0;
    bad[nb].what = "top_k -1"; bad[nb].o = opts_n(4); bad[nb++].o.top_k = -1;
    bad[nb].what = "min_p 1.5"; bad[nb].o = opts_n(4); bad[nb++].o.min_p = 1.5f;
    bad[nb].what = "min_p NaN"; bad[nb].o = opts_n(4); bad[nb++].o.min_p = NAN;
    bad[nb].what = "repeat_penalty -1"; bad[nb].o = opts_n(4); bad[nb++].o.repeat_penalty = -1;
    bad[nb].what = "repeat_penalty inf"; bad[nb].o = opts_n(4); bad[nb++].o.repeat_penalty = INFINITY;
    bad[nb].what = "n_stop 1, stop NULL"; bad[nb].o = opts_n(4); bad[nb++].o.n_stop = 1;
    bad[nb].what = "empty stop"; bad[nb].o = opts_n(4); bad[nb].o.stop = empty; bad[nb++].o.n_stop = 1;
    bad[nb].what = "NULL stop"; bad[nb].o = opts_n(4); bad[nb].o.stop = null1; bad[nb++].o.n_stop = 1;
    char why[512] = "";
    for (int i = 0; i < nb && !why[0]; i++) {
        ks_status st = ks_generate(s, prompt, &bad[i].o, NULL, NULL);
        if (st != KS_ERR_ARG) snprintf(why, sizeof why, "%s: status %d", bad[i].what, (int)st);
    }
    ks_session_free(s);
    ks_model_close(m);
    KT_CHECK(!why[0], "%s", why);
}

/* ---------------------------------------------------------------- CLI and Lua */

static int one_line(const char *s) { return s[0] && strchr(s, '\n') == s + strlen(s) - 1; }

/* kt_sh joins stderr: drop generate's timing line */
static void cut_timing(char *out) {
    char *t = strstr(out, "[kvsieve]");
    if (t) *t = 0;
}

KT_TEST(sampling_cli_flags) {
    if (!kt_bin()) KT_SKIP("KS_BIN not set (run through make test)");
    char cmd[2048], out[8192], ref[8192];
    static const char *const bad[][2] = {
        {"--top-k abc", "--top-k"}, {"--top-k -1", "--top-k"}, {"--min-p 1.5", "--min-p"}, {"--min-p nan", "--min-p"},
        {"--repeat-penalty 0", "--repeat-penalty"}, {"--repeat-penalty x", "--repeat-penalty"}, {"--stop ''", "--stop"},
        {"--stop", "--stop"}};
    for (int i = 0; i < 8; i++) {
        snprintf(cmd, sizeof cmd, "%s generate -m " TINY " -p hi -n 2 %s", kt_bin(), bad[i][0]);
        int rc = kt_sh(cmd, out, sizeof out);
        KT_CHECK(rc == 2 && one_line(out) && strstr(out, bad[i][1]) && !strncmp(out, "kvsieve: ", 9),
                 "%s: rc %d, \"%s\"", bad[i][0], rc, out);
    }
    /* greedy vs top-k 1 at T = 1 and min-p 1 at T = 1: the same text */
    snprintf(cmd, sizeof cmd, "%s generate -m " TINY " -p '%s' -n 30", kt_bin(), prompt);
    KT_CHECK(kt_sh(cmd, ref, sizeof ref) == 0, "%s", ref);
    cut_timing(ref);
    snprintf(cmd, sizeof cmd, "%s generate -m " TINY " -p '%s' -n 30 --temp 1 --seed 9 --top-k 1", kt_bin(), prompt);
    KT_CHECK(kt_sh(cmd, out, sizeof out) == 0 && (cut_timing(out), !strcmp(out, ref)), "top-k 1:\n%s\ngreedy:\n%s", out, ref);
    snprintf(cmd, sizeof cmd, "%s generate -m " TINY " -p '%s' -n 30 --temp 1 --seed 9 --min-p 1", kt_bin(), prompt);
    KT_CHECK(kt_sh(cmd, out, sizeof out) == 0 && (cut_timing(out), !strcmp(out, ref)), "min-p 1:\n%s\ngreedy:\n%s", out, ref);
    /* --stop, twice: the output ends right before the earliest */
    snprintf(cmd, sizeof cmd, "%s generate -m " TINY " -p '%s' -n 30 --stop 'back again' --stop ' sky'", kt_bin(), prompt);
    KT_CHECK(kt_sh(cmd, out, sizeof out) == 0, "%s", out);
    cut_timing(out);
    const char *cut = strstr(ref + strlen(prompt), " sky");
    KT_CHECK(cut, "the greedy output has no \" sky\": %s", ref);
    KT_CHECK(strlen(out) == (size_t)(cut - ref) + 1 && !strncmp(out, ref, (size_t)(cut - ref)),
             "--stop ' sky':\n%s\ngreedy:\n%s", out, ref);
    snprintf(cmd, sizeof cmd, "%s generate -m " TINY " -p '%s' -n 30 --repeat-penalty 1.5", kt_bin(), prompt);
    KT_CHECK(kt_sh(cmd, out, sizeof out) == 0 && (cut_timing(out), strcmp(out, ref)), "--repeat-penalty 1.5 changed nothing: %s", out);
}

KT_TEST(sampling_lua_options) {
    lua_State *L = ks_lua_host_state();
    KT_CHECK(L, "no Lua state");
    const char *code =
        "local ks = require 'kvsieve'\n"
        "local m = ks.load('" TINY "')\n"
        "local s = m:session()\n"
        "local p = 'The grass is green. The sky is blue. The sun is bright. The grass is'\n"
        "local g = s:generate(p, {n = 30})\n"
        "local k = s:generate(p, {n = 30, temp = 1, seed = 4, top_k = 1})\n"
        "assert(k.text == g.text, 'top_k 1: ' .. k.text)\n"
        "local mp = s:generate(p, {n = 30, temp = 1, seed = 4, min_p = 1})\n"
        "assert(mp.text == g.text, 'min_p 1: ' .. mp.text)\n"
        "local at = g.text:find(' sky', 1, true)\n"
        "assert(at, 'no sky in ' .. g.text)\n"
        "local pieces = {}\n"
        "local st = s:generate(p, {n = 30, stop = {'zzz', ' sky'}, stream = function(piece) pieces[#pieces + 1] = piece end})\n"
        "assert(st.text == g.text:sub(1, at - 1), 'stop: ' .. st.text)\n"
        "assert(table.concat(pieces) == st.text, 'streamed: ' .. table.concat(pieces))\n"
        "assert(s:generate(p, {n = 30, stop = ' sky'}).text == st.text, 'a single stop string')\n"
        "assert(s:generate(p, {n = 30, repeat_penalty = 1.5}).text ~= g.text, 'penalty changed nothing')\n"
        "for _, bad in ipairs({{stop = 5}, {stop = {''}}, {stop = {1}}, {top_k = -1}, {min_p = 2}, {repeat_penalty = -1}}) do\n"
        "  bad.n = 2\n"
        "  local ok, err = pcall(s.generate, s, p, bad)\n"
        "  assert(not ok, 'accepted a bad option')\n"
        "end\n"
        "local many = {} for i = 1, 17 do many[i] = 'x' .. i end\n"
        "assert(not pcall(s.generate, s, p, {n = 2, stop = many}), '17 stop strings accepted')\n";
    int rc = luaL_dostring(L, code);
    char err[2048];
    snprintf(err, sizeof err, "%s", rc ? lua_tostring(L, -1) : "");
    ks_lua_host_close(L);
    KT_CHECK(rc == LUA_OK, "%s", err);
}
