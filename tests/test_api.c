/* test_api.c — the public API's additions of issue 15 ("a real library"), through kvsieve.h
 * only, on the bundled model: the version query, the log callback (and that the library itself
 * writes nothing to stderr), model options (threads reach the CPU backend's pool and change no
 * bit of the logits), last-position logits and top-n logprobs against generate's greedy choice,
 * and a C policy built from a struct of handlers whose retain changes the kept rows. */
#include "kvsieve.h"
#include "ks_lua.h" /* ks_lua_quiet: other tests silence policy failure notes; this one needs them */
#include "ktest.h"
#include "testutil.h"

#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define TINY "models/kvsieve-tiny"
static const char *prompt = "The grass is green. The sky is blue. The sun is bright. The grass is";

KT_TEST(api_version) {
    char want[64];
    snprintf(want, sizeof want, "%d.%d.%d", KS_VERSION_MAJOR, KS_VERSION_MINOR, KS_VERSION_PATCH);
    KT_CHECK(!strcmp(ks_version(), want), "ks_version() \"%s\", the header says %s", ks_version(), want);
    KT_CHECK(KS_VERSION_MAJOR > 0 || KS_VERSION_MINOR > 0, "version 0.0.x");
}

/* ---------------------------------------------------------------- log */

typedef struct logcap {
    int n, n_info, n_warn;
    char text[4096];
} logcap;

static void capture(void *user, ks_log_level level, const char *msg) {
    logcap *c = user;
    c->n++;
    c->n_info += level == KS_LOG_INFO;
    c->n_warn += level == KS_LOG_WARN;
    size_t len = strlen(c->text);
    snprintf(c->text + len, sizeof c->text - len, "%d|%s\n", (int)level, msg);
}

static const char *printing_policy =
    "return {\n"
    "  name = 'chatty',\n"
    "  prefill_end = function(ev) print('prefill done', 42) end,\n"
    "  token = function(ev) error('boom at a token') end,\n"
    "}\n";

/* Run fn with fd 2 on a temporary file; returns the bytes written there (-1 on setup failure). */
static long stderr_bytes_during(void (*fn)(void *), void *arg) {
    FILE *tf = tmpfile(); /* anonymous: no path, gone when closed */
    if (!tf) return -1;
    int fd = fileno(tf);
    fflush(stderr);
    int saved = dup(2);
    dup2(fd, 2);
    fn(arg);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    long n = (long)lseek(fd, 0, SEEK_END);
    fclose(tf);
    return n;
}

typedef struct run_args {
    ks_session *s;
    ks_status st;
} run_args;

static void run_generate(void *ud) {
    run_args *r = ud;
    ks_generate_opts o;
    ks_generate_opts_default(&o);
    o.max_new_tokens = 3;
    r->st = ks_generate(r->s, prompt, &o, NULL, NULL);
}

KT_TEST(api_log_callback_gets_what_the_library_printed) {
    int quiet = ks_lua_quiet;
    ks_lua_quiet = 0;
    ks_model *m = NULL;
    ks_session *s = NULL;
    ks_policy *p = NULL;
    KT_CHECK(ks_model_open(TINY, "cpu", &m) == KS_OK, "%s", ks_last_error());
    KT_CHECK(ks_session_create(m, &s) == KS_OK, "%s", ks_last_error());
    KT_CHECK(ks_policy_load_string(m, "chatty.lua", printing_policy, &p) == KS_OK, "%s", ks_last_error());
    ks_session_set_policy(s, p);
    ks_session_set_fallback(s, 1); /* the token handler's error falls back to full attention */

    /* no callback: the print() and the failure note, which went to stderr before, go nowhere */
    ks_set_log(NULL, NULL);
    run_args r = {.s = s};
    long quiet_bytes = stderr_bytes_during(run_generate, &r);
    KT_CHECK(r.st == KS_OK, "generate: %s", ks_last_error());
    KT_CHECK(quiet_bytes == 0, "the library wrote %ld bytes to stderr", quiet_bytes);
    KT_CHECK(ks_result_policy_error(s)[0], "the policy's error was not reported");

    /* with one: both messages arrive, each once, and still nothing reaches stderr (a fresh
     * policy: the failure note comes once per kind and policy) */
    ks_policy_free(p);
    KT_CHECK(ks_policy_load_string(m, "chatty.lua", printing_policy, &p) == KS_OK, "%s", ks_last_error());
    ks_session_set_policy(s, p);
    logcap cap = {0};
    ks_set_log(capture, &cap);
    long bytes = stderr_bytes_during(run_generate, &r);
    ks_set_log(NULL, NULL);
    ks_lua_quiet = quiet;
    KT_CHECK(r.st == KS_OK, "generate: %s", ks_last_error());
    KT_CHECK(bytes == 0, "the library wrote %ld bytes to stderr with a callback set", bytes);
    char want[128];
    snprintf(want, sizeof want, "%d|[policy chatty] prefill done\t42\n", (int)KS_LOG_INFO);
    KT_CHECK(strstr(cap.text, want), "no print() message in:\n%s", cap.text);
    snprintf(want, sizeof want, "%d|policy chatty: first failure of kind", (int)KS_LOG_WARN);
    KT_CHECK(strstr(cap.text, want) && strstr(cap.text, "boom at a token"), "no failure note in:\n%s", cap.text);
    KT_CHECK(cap.n_warn == 1, "%d warnings:\n%s", cap.n_warn, cap.text);
    KT_CHECK(!strchr(cap.text, '\r'), "stray characters");
    ks_session_free(s);
    ks_policy_free(p);
    ks_model_close(m);
}

/* ---------------------------------------------------------------- model options */

static int n_threads_now(void) {
    DIR *d = opendir("/proc/self/task");
    if (!d) return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (e->d_name[0] != '.') n++;
    closedir(d);
    return n;
}

/* The count once it holds still: a thread that an earlier test joined can stay listed in
 * /proc/self/task for a moment after pthread_join returns (the kernel clears the joined tid
 * before it reaps the task), which made a count taken then one too high (seen once, under load) */
static int n_threads_settled(void) {
    int a = n_threads_now();
    for (int i = 0; i < 200; i++) {
        usleep(2000);
        int b = n_threads_now();
        if (b == a) return a;
        a = b;
    }
    return a;
}

/* Open with `threads`, check the pool's size through /proc, and keep the prompt's logits. */
static ks_status logits_with_threads(int threads, int *new_threads, float **out, int *vocab) {
    ks_model_opts o;
    ks_model_opts_default(&o);
    o.threads = threads;
    int before = n_threads_settled();
    ks_model *m;
    ks_status st = ks_model_open_ex(TINY, &o, &m);
    if (st) return st;
    *new_threads = n_threads_now() - before;
    ks_session *s;
    if ((st = ks_session_create(m, &s))) { ks_model_close(m); return st; }
    ks_generate_opts g;
    ks_generate_opts_default(&g);
    g.max_new_tokens = 0; /* prefill only: the logits after the prompt */
    const float *lg;
    if (!(st = ks_generate(s, prompt, &g, NULL, NULL)) && !(st = ks_session_logits(s, &lg, vocab))) {
        *out = malloc(sizeof(float) * (size_t)*vocab);
        if (*out) memcpy(*out, lg, sizeof(float) * (size_t)*vocab);
        else st = KS_ERR_OOM;
    }
    ks_session_free(s);
    ks_model_close(m);
    return st;
}

KT_TEST(api_threads_option_reaches_the_backend_and_changes_no_bit) {
    float *l1 = NULL, *l2 = NULL, *l3 = NULL;
    int v1 = 0, v2 = 0, v3 = 0, t1 = -1, t2 = -1, t3 = -1;
    KT_CHECK(logits_with_threads(1, &t1, &l1, &v1) == KS_OK, "threads 1: %s", ks_last_error());
    ks_status st2 = logits_with_threads(2, &t2, &l2, &v2);
    ks_status st3 = logits_with_threads(3, &t3, &l3, &v3);
    int same2 = st2 == KS_OK && v2 == v1 && !memcmp(l1, l2, sizeof(float) * (size_t)v1);
    int same3 = st3 == KS_OK && v3 == v1 && !memcmp(l1, l3, sizeof(float) * (size_t)v1);
    free(l1);
    free(l2);
    free(l3);
    KT_CHECK(st2 == KS_OK && st3 == KS_OK, "threads 2/3: %s", ks_last_error());
    /* a pool of N threads is the caller plus N - 1 workers, started when the model opens */
    KT_CHECK(t1 == 0 && t2 == 1 && t3 == 2, "new threads for 1, 2, 3: %d, %d, %d", t1, t2, t3);
    KT_CHECK(same2 && same3, "the logits differ between 1 and %s threads", same2 ? "3" : "2");

    ks_model_opts o;
    ks_model_opts_default(&o);
    ks_model *m = NULL;
    o.threads = -1;
    KT_CHECK(ks_model_open_ex(TINY, &o, &m) == KS_ERR_ARG && !m, "threads -1 accepted");
    KT_CHECK(strstr(ks_last_error(), "threads"), "message: %s", ks_last_error());
    o.threads = 0;
    o.backend = "tpu";
    KT_CHECK(ks_model_open_ex(TINY, &o, &m) == KS_ERR_ARG && !m, "backend tpu accepted");
    KT_CHECK(ks_model_open_ex(TINY, NULL, &m) == KS_OK, "default options: %s", ks_last_error());
    ks_model_close(m);
}

/* ---------------------------------------------------------------- logits and logprobs */

KT_TEST(api_logits_and_logprobs_agree_with_greedy_generate) {
    ks_model *m;
    ks_session *s;
    KT_CHECK(ks_model_open(TINY, "cpu", &m) == KS_OK, "%s", ks_last_error());
    KT_CHECK(ks_session_create(m, &s) == KS_OK, "%s", ks_last_error());
    const float *lg = NULL;
    int vocab = -1;
    int32_t ids[8];
    float lp[8];
    KT_CHECK(ks_session_logits(s, &lg, &vocab) == KS_ERR_ARG && !lg, "logits before any run");
    KT_CHECK(ks_session_top_logprobs(s, 3, ids, lp) == KS_ERR_ARG, "logprobs before any run");
    for (int n_new = 1; n_new <= 5; n_new += 4) {
        ks_generate_opts o;
        ks_generate_opts_default(&o);
        o.max_new_tokens = n_new;
        KT_CHECK(ks_generate(s, prompt, &o, NULL, NULL) == KS_OK, "%s", ks_last_error());
        int ng;
        const int32_t *gen = ks_result_ids(s, &ng);
        KT_CHECK(ng >= 1, "nothing generated");
        KT_CHECK(ks_session_logits(s, &lg, &vocab) == KS_OK, "%s", ks_last_error());
        KT_CHECK(vocab == ks_model_vocab(m), "vocab %d vs %d", vocab, ks_model_vocab(m));
        /* the last generated token is the argmax of these logits (greedy, lowest id on ties) */
        int32_t best = 0;
        for (int i = 1; i < vocab; i++)
            if (lg[i] > lg[best]) best = i;
        KT_CHECK(best == gen[ng - 1], "n_new %d: argmax %d, generated %d", n_new, best, gen[ng - 1]);
        KT_CHECK(ks_session_top_logprobs(s, 8, ids, lp) == KS_OK, "%s", ks_last_error());
        KT_CHECK(ids[0] == gen[ng - 1], "top-1 %d, generated %d", ids[0], gen[ng - 1]);
        /* log softmax, written out here in long double */
        long double mx = lg[best], sum = 0;
        for (int i = 0; i < vocab; i++) sum += expl((long double)lg[i] - mx);
        for (int j = 0; j < 8; j++) {
            double want = (double)((long double)lg[ids[j]] - mx - logl(sum));
            KT_CHECK(KT_NEAR(lp[j], want, 1e-5), "logprob %d: %g, want %g", j, (double)lp[j], want);
            KT_CHECK(lp[j] <= 0, "logprob %g > 0", (double)lp[j]);
            if (j) {
                KT_CHECK(lg[ids[j]] < lg[ids[j - 1]] || (lg[ids[j]] == lg[ids[j - 1]] && ids[j] > ids[j - 1]),
                         "order at %d: id %d (%g) after id %d (%g)", j, ids[j], (double)lg[ids[j]], ids[j - 1],
                         (double)lg[ids[j - 1]]);
                for (int i = 0; i < vocab; i++) /* nothing left out is better than what came in */
                    KT_CHECK(lg[i] <= lg[ids[7]] || i == ids[0] || i == ids[1] || i == ids[2] || i == ids[3] ||
                                 i == ids[4] || i == ids[5] || i == ids[6] || i == ids[7],
                             "id %d (%g) is missing from the top 8", i, (double)lg[i]);
            }
        }
    }
    /* all of them: the probabilities sum to 1 */
    int32_t *all = malloc(sizeof(int32_t) * (size_t)vocab);
    float *alp = malloc(sizeof(float) * (size_t)vocab);
    KT_CHECK(all && alp, "oom");
    ks_status st = ks_session_top_logprobs(s, vocab, all, alp);
    double total = 0;
    for (int i = 0; i < vocab && !st; i++) total += exp((double)alp[i]);
    free(all);
    free(alp);
    KT_CHECK(st == KS_OK && KT_NEAR(total, 1.0, 1e-4), "sum of probabilities %g (%s)", total, ks_last_error());
    KT_CHECK(ks_session_top_logprobs(s, 0, ids, lp) == KS_ERR_ARG, "k 0 accepted");
    KT_CHECK(ks_session_top_logprobs(s, vocab + 1, ids, lp) == KS_ERR_ARG, "k > vocab accepted");
    KT_CHECK(ks_session_top_logprobs(s, 3, ids, NULL) == KS_OK, "logprobs NULL: %s", ks_last_error());
    ks_session_free(s);
    ks_model_close(m);
}

/* ---------------------------------------------------------------- C policies */

/* A StreamingLLM in C: after each layer's prefill keep the first `sinks` and the last `recent`
 * KV rows; check what the events show on the way. */
typedef struct sink_policy {
    int sinks, recent;
    int layer_ends, qkv_seen, tokens, begins, freed;
    int bad;            /* a check inside a handler failed: what */
    char why[160];
} sink_policy;

static ks_status sp_begin(void *user, ks_session *s) {
    (void)s;
    ((sink_policy *)user)->begins++;
    return KS_OK;
}

static ks_status sp_qkv(void *user, ks_event *ev) {
    sink_policy *p = user;
    p->qkv_seen++;
    int n = ks_event_rows(ev);
    const int32_t *pos = ks_event_positions(ev);
    size_t nk = ks_event_tensor_size(ev, KS_TENSOR_K);
    if (n != ks_event_prompt_tokens(ev) || !pos || pos[n - 1] != n - 1 || ks_event_pass(ev) != 0 || nk == 0 ||
        nk % (size_t)n || ks_event_tensor_size(ev, KS_TENSOR_HIDDEN) != 0) {
        snprintf(p->why, sizeof p->why, "prefill_qkv at layer %d: rows %d, prompt %d, K floats %zu", ks_event_layer(ev), n,
                 ks_event_prompt_tokens(ev), nk);
        p->bad = 1;
        return KS_OK;
    }
    float *k = malloc(sizeof(float) * nk);
    if (!k) return KS_ERR_OOM;
    ks_status st = ks_event_copy(ev, KS_TENSOR_K, k, nk);
    int finite = 1;
    for (size_t i = 0; i < nk && !st; i++) finite &= isfinite(k[i]) != 0;
    ks_status small = ks_event_copy(ev, KS_TENSOR_K, k, nk - 1);
    free(k);
    if (st || !finite || small != KS_ERR_ARG) {
        snprintf(p->why, sizeof p->why, "ks_event_copy: %d, finite %d, too small %d", (int)st, finite, (int)small);
        p->bad = 1;
    }
    return KS_OK;
}

static ks_status sp_layer_end(void *user, ks_event *ev) {
    sink_policy *p = user;
    p->layer_ends++;
    int n = ks_event_kv_rows(ev, 0, NULL);
    if (n <= p->sinks + p->recent) return KS_OK;
    int32_t keep[64];
    int k = 0;
    for (int i = 0; i < p->sinks; i++) keep[k++] = i;
    for (int i = n - p->recent; i < n; i++) keep[k++] = i;
    return ks_action_retain(ev, keep, k);
}

static ks_status sp_token(void *user, ks_event *ev) {
    sink_policy *p = user;
    if (ks_event_token(ev) < 0 || ks_event_layer(ev) != -1) { snprintf(p->why, sizeof p->why, "token event"); p->bad = 1; }
    p->tokens++;
    return KS_OK;
}

static void sp_free(void *user) { ((sink_policy *)user)->freed++; }

static ks_status sp_bad_retain(void *user, ks_event *ev) {
    (void)user;
    int32_t idx = ks_event_kv_rows(ev, 0, NULL) + 5; /* out of range */
    return ks_action_retain(ev, &idx, 1);
}

KT_TEST(api_c_policy_from_handlers_keeps_what_it_retains) {
    ks_model *m;
    ks_session *s;
    KT_CHECK(ks_model_open(TINY, "cpu", &m) == KS_OK, "%s", ks_last_error());
    KT_CHECK(ks_session_create(m, &s) == KS_OK, "%s", ks_last_error());
    ks_generate_opts o;
    ks_generate_opts_default(&o);
    o.max_new_tokens = 4;
    KT_CHECK(ks_generate(s, prompt, &o, NULL, NULL) == KS_OK, "%s", ks_last_error());
    int n_prompt = ks_result_prompt_tokens(s), n_full;
    ks_result_ids(s, &n_full);
    KT_CHECK(n_prompt > 12, "prompt of %d tokens", n_prompt);
    int full_rows = ks_result_kept(s, 0, 0, NULL);
    KT_CHECK(full_rows == n_prompt + n_full - 1, "full attention: %d rows", full_rows);

    sink_policy sp = {.sinks = 2, .recent = 4};
    ks_policy_handlers h = {.name = "c_sinks", .user = &sp, .prefill_qkv = sp_qkv, .prefill_layer_end = sp_layer_end,
                            .token = sp_token, .begin = sp_begin, .free_user = sp_free};
    ks_policy *p = NULL;
    KT_CHECK(ks_policy_create_c(&h, &p) == KS_OK && p, "%s", ks_last_error());
    h.name = "changed after creation"; /* the struct was copied */
    KT_CHECK(!strcmp(ks_policy_name(p), "c_sinks"), "name %s", ks_policy_name(p));
    KT_CHECK(ks_policy_n_params(p) == 0 && ks_policy_n_reports(p) == 0, "a C policy has no params or reports");
    ks_session_set_policy(s, p);
    ks_status st = ks_generate(s, prompt, &o, NULL, NULL);
    KT_CHECK(st == KS_OK, "%s", ks_last_error());
    KT_CHECK(!sp.bad, "%s", sp.why);
    int ng;
    ks_result_ids(s, &ng);
    int L = ks_model_n_layers(m);
    KT_CHECK(sp.begins == 1 && sp.layer_ends == L && sp.qkv_seen == L && sp.tokens == ng,
             "begin %d, layer ends %d, qkv %d, tokens %d (generated %d, %d layers)", sp.begins, sp.layer_ends,
             sp.qkv_seen, sp.tokens, ng, L);
    /* every layer and KV head: the 2 sinks, the last 4 prompt rows, then one row per decode step */
    for (int l = 0; l < L; l++)
        for (int hh = 0; hh < ks_model_n_kv_heads(m); hh++) {
            const int32_t *pos;
            int k = ks_result_kept(s, l, hh, &pos);
            KT_CHECK(k == 2 + 4 + ng - 1, "layer %d head %d: %d rows", l, hh, k);
            int32_t want[64], w = 0;
            for (int i = 0; i < 2; i++) want[w++] = i;
            for (int i = n_prompt - 4; i < n_prompt + ng - 1; i++) want[w++] = i;
            KT_CHECK(!memcmp(pos, want, sizeof(int32_t) * (size_t)k), "layer %d head %d: other positions", l, hh);
        }
    ks_session_set_policy(s, NULL);
    ks_policy_free(p);
    KT_CHECK(sp.freed == 1, "free_user ran %d times", sp.freed);

    /* a bad action from a handler: KS_ERR_POLICY naming the action */
    ks_policy_handlers hb = {.name = "c_bad", .prefill_layer_end = sp_bad_retain};
    KT_CHECK(ks_policy_create_c(&hb, &p) == KS_OK, "%s", ks_last_error());
    ks_session_set_policy(s, p);
    st = ks_generate(s, prompt, &o, NULL, NULL);
    KT_CHECK(st == KS_ERR_POLICY && strstr(ks_last_error(), "retain"), "bad retain: %d %s", (int)st, ks_last_error());
    ks_session_set_policy(s, NULL);
    ks_policy_free(p);
    hb.prefill_chunk = -1;
    KT_CHECK(ks_policy_create_c(&hb, &p) == KS_ERR_ARG, "prefill_chunk -1 accepted");
    KT_CHECK(ks_policy_create_c(NULL, &p) == KS_ERR_ARG, "no handlers accepted");
    ks_policy_free(NULL);
    ks_session_free(s);
    ks_model_close(m);
}

/* ---------------------------------------------------------------- the CLI's --threads */

KT_TEST(api_cli_generate_threads_option) {
    const char *bin = getenv("KS_BIN");
    if (!bin || !*bin) KT_SKIP("KS_BIN not set (run through make test)");
    char cmd[1024], out1[4096], out2[4096];
    /* ks_model_opts.threads under the CLI: any count gives the same tokens; a bad one is refused */
    snprintf(cmd, sizeof cmd, "%s generate -m " TINY " -p 'The grass is' -n 6 --threads 1", bin);
    int rc1 = kt_sh(cmd, out1, sizeof out1);
    snprintf(cmd, sizeof cmd, "%s generate -m " TINY " -p 'The grass is' -n 6 --threads 3", bin);
    int rc2 = kt_sh(cmd, out2, sizeof out2);
    KT_CHECK(rc1 == 0 && rc2 == 0, "exit %d / %d: %s %s", rc1, rc2, out1, out2);
    char *t1 = strstr(out1, "[kvsieve]"), *t2 = strstr(out2, "[kvsieve]"); /* the timing line differs */
    if (t1) *t1 = 0;
    if (t2) *t2 = 0;
    KT_CHECK(out1[0] && !strcmp(out1, out2), "1 thread:\n%s\n3 threads:\n%s", out1, out2);
    snprintf(cmd, sizeof cmd, "%s generate -m " TINY " -p 'The grass is' -n 2 --threads -2", bin);
    KT_CHECK(kt_sh(cmd, out1, sizeof out1) != 0 && strstr(out1, "--threads"), "--threads -2: %s", out1);
}
