/* test_serve.c — continuous batching and `kvsieve serve` (issue 16).
 *
 * The step API (core/batch.c), on the bundled model, no binary needed:
 *   batch_ids_match_separate_runs   B sequences with mixed options and policies, started at
 *                                   different steps, their prompts prefilled in pieces, give the
 *                                   ids, text and kept positions of B separate ks_generate_ids runs
 *   batch_cancel_frees_rows         a cancelled sequence's session holds no KV rows; the others go on
 *   batch_bad_arguments             bad options / prompts / calls are KS_ERR_* with a message
 *
 * The server (KS_BIN, started on a free loopback port; tests/serve/setup.sh for the npm client)
 * is tested further below. */
#include "ktest.h"
#include "kvsieve.h"
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TINY "models/kvsieve-tiny"

/* ================================================================ the step API */

typedef struct bcase {
    const char *prompt;
    const char *policy;     /* NULL = full attention */
    const char *set[2];     /* "key=value" */
    float temperature, top_p;
    int top_k, max_new;
    float repeat_penalty;
    uint64_t seed;
    const char *stop;       /* NULL = none */
} bcase;

static const bcase CASES[] = {
    {"Once upon a time", NULL, {NULL}, 0, 1, 0, 24, 1, 0, NULL},
    {"The grass is green. The sky is", NULL, {NULL}, 0.8f, 0.9f, 0, 20, 1, 7, NULL},
    {"The grass is green. The grass is green. The grass is green. Where is the cat?", "gemfilter",
     {"layer=2", "k=8"}, 0, 1, 0, 16, 1, 0, NULL},
    {"A little dog ran", NULL, {NULL}, 1.0f, 1, 5, 18, 1.3f, 3, NULL},
    {"She said hello and", "streamingllm", {"budget=8", "rolling=true"}, 0, 1, 0, 22, 1, 0, NULL},
    {"Once upon a time there was", NULL, {NULL}, 0, 1, 0, 30, 1, 0, "."},
};
#define NCASES ((int)(sizeof CASES / sizeof CASES[0]))

static ks_status load_case_policy(ks_model *m, const bcase *c, ks_policy **p) {
    *p = NULL;
    if (!c->policy) return KS_OK;
    ks_status st = ks_policy_load(m, c->policy, p);
    for (int i = 0; !st && i < 2 && c->set[i]; i++) {
        char k[64];
        const char *eq = strchr(c->set[i], '=');
        snprintf(k, sizeof k, "%.*s", (int)(eq - c->set[i]), c->set[i]);
        st = ks_policy_set(*p, k, eq + 1);
    }
    return st;
}

static void case_opts(const bcase *c, ks_generate_opts *o, const char **stop) {
    ks_generate_opts_default(o);
    o->max_new_tokens = c->max_new;
    o->temperature = c->temperature;
    o->top_p = c->top_p;
    o->top_k = c->top_k;
    o->repeat_penalty = c->repeat_penalty;
    o->seed = c->seed;
    if (c->stop) { stop[0] = c->stop; o->stop = stop; o->n_stop = 1; }
}

KT_TEST(batch_ids_match_separate_runs) {
    ks_model *m = NULL;
    KT_CHECK(ks_model_open(TINY, "cpu", &m) == KS_OK, "%s", ks_last_error());
    /* the reference: one ks_generate_ids per case, on its own session */
    int32_t *ref_ids[NCASES] = {0}, *prompts[NCASES] = {0};
    int ref_n[NCASES] = {0}, np[NCASES] = {0}, ref_kept[NCASES] = {0};
    char *ref_text[NCASES] = {0};
    char why[512] = "";
    for (int i = 0; i < NCASES && !why[0]; i++) {
        ks_session *s = NULL;
        ks_policy *p = NULL;
        ks_generate_opts o;
        const char *stop[1];
        case_opts(&CASES[i], &o, stop);
        if (ks_tokenize(m, CASES[i].prompt, 1, &prompts[i], &np[i]) || ks_session_create(m, &s) ||
            load_case_policy(m, &CASES[i], &p) || ks_session_set_policy(s, p) ||
            ks_generate_ids(s, prompts[i], np[i], &o, NULL, NULL)) {
            snprintf(why, sizeof why, "case %d reference: %s", i, ks_last_error());
        } else {
            const int32_t *ids = ks_result_ids(s, &ref_n[i]);
            ref_ids[i] = malloc(sizeof(int32_t) * (size_t)(ref_n[i] + 1));
            memcpy(ref_ids[i], ids, sizeof(int32_t) * (size_t)ref_n[i]);
            ref_text[i] = strdup(ks_result_text(s));
            ref_kept[i] = ks_result_kept(s, 1, 0, NULL);
        }
        ks_session_free(s);
        ks_policy_free(p);
    }
    if (why[0]) {
        for (int i = 0; i < NCASES; i++) { free(ref_ids[i]); free(ref_text[i]); free(prompts[i]); }
        ks_model_close(m);
        KT_CHECK(0, "%s", why);
    }
    /* the batch: sequence i joins at step 2*i, its prompt prefilled in pieces of 3 tokens, one
     * piece per step (a policy takes the whole prompt at once) */
    ks_session *ss[NCASES] = {0};
    ks_policy *pp[NCASES] = {0};
    ks_seq *qs[NCASES] = {0};
    int nq = 0, steps = 0;
    const char *stops[NCASES][1];
    for (int i = 0; i < NCASES && !why[0]; i++)
        if (ks_session_create(m, &ss[i]) || load_case_policy(m, &CASES[i], &pp[i]) || ks_session_set_policy(ss[i], pp[i]))
            snprintf(why, sizeof why, "case %d: %s", i, ks_last_error());
    char *text[NCASES] = {0};
    size_t tlen[NCASES] = {0};
    for (; !why[0] && steps < 400; steps++) {
        if (steps % 2 == 0 && nq < NCASES) {
            ks_generate_opts o;
            case_opts(&CASES[nq], &o, stops[nq]);
            if (ks_seq_create(ss[nq], prompts[nq], np[nq], &o, &qs[nq])) { snprintf(why, sizeof why, "create %d: %s", nq, ks_last_error()); break; }
            nq++;
        }
        int live = nq < NCASES;
        for (int i = 0; i < nq; i++)
            if (ks_seq_get_state(qs[i]) == KS_SEQ_PREFILL && ks_seq_prefill(qs[i], 3))
                snprintf(why, sizeof why, "prefill %d: %s", i, ks_last_error());
        if (ks_batch_step(qs, nq)) snprintf(why, sizeof why, "step: %s", ks_last_error());
        for (int i = 0; i < nq; i++) {
            const char *pc = ks_seq_piece(qs[i]);
            size_t k = strlen(pc);
            text[i] = realloc(text[i], tlen[i] + k + 1);
            memcpy(text[i] + tlen[i], pc, k + 1);
            tlen[i] += k;
            if (ks_seq_get_state(qs[i]) != KS_SEQ_DONE) live = 1;
        }
        if (!live) break;
    }
    for (int i = 0; i < NCASES && !why[0]; i++) {
        int n;
        const int32_t *ids = ks_seq_ids(qs[i], &n);
        const char *fin = ks_seq_finish(qs[i]);
        if (!fin || !strcmp(fin, "error") || !strcmp(fin, "cancelled"))
            snprintf(why, sizeof why, "case %d: finish %s: %s", i, fin ? fin : "(running)", ks_seq_error(qs[i]));
        else if (n != ref_n[i] || memcmp(ids, ref_ids[i], sizeof(int32_t) * (size_t)n))
            snprintf(why, sizeof why, "case %d: %d ids in the batch, %d alone, or different ids", i, n, ref_n[i]);
        else if (strcmp(ks_result_text(ss[i]), ref_text[i]) || strcmp(text[i] ? text[i] : "", ref_text[i]))
            snprintf(why, sizeof why, "case %d: text \"%s\" / pieces \"%s\", alone \"%s\"", i, ks_result_text(ss[i]),
                     text[i] ? text[i] : "", ref_text[i]);
        else if (ks_result_kept(ss[i], 1, 0, NULL) != ref_kept[i])
            snprintf(why, sizeof why, "case %d: %d rows kept at layer 1, %d alone", i, ks_result_kept(ss[i], 1, 0, NULL), ref_kept[i]);
    }
    /* the cases meant to stop early did: the stop string ended case 5 before its 30 tokens */
    if (!why[0] && ref_n[5] >= 30) snprintf(why, sizeof why, "case 5 did not stop at its stop string (%d ids)", ref_n[5]);
    for (int i = 0; i < NCASES; i++) {
        ks_seq_free(qs[i]);
        ks_session_free(ss[i]);
        ks_policy_free(pp[i]);
        free(text[i]);
    }
    for (int i = 0; i < NCASES; i++) { free(ref_ids[i]); free(ref_text[i]); free(prompts[i]); }
    ks_model_close(m);
    KT_CHECK(!why[0], "%s", why);
}

KT_TEST(batch_cancel_frees_rows) {
    ks_model *m = NULL;
    KT_CHECK(ks_model_open(TINY, "cpu", &m) == KS_OK, "%s", ks_last_error());
    ks_session *s[2] = {0};
    ks_seq *q[2] = {0};
    int32_t ids[] = {0, 100, 200, 300, 400};
    ks_generate_opts o;
    ks_generate_opts_default(&o);
    o.max_new_tokens = 40;
    char why[256] = "";
    for (int i = 0; i < 2 && !why[0]; i++)
        if (ks_session_create(m, &s[i]) || ks_seq_create(s[i], ids, 5, &o, &q[i]) || ks_seq_prefill(q[i], 0))
            snprintf(why, sizeof why, "%d: %s", i, ks_last_error());
    for (int t = 0; t < 4 && !why[0]; t++)
        if (ks_batch_step(q, 2)) snprintf(why, sizeof why, "step: %s", ks_last_error());
    size_t before = why[0] ? 0 : ks_seq_kv_rows(q[0]);
    size_t per_token = (size_t)ks_model_n_layers(m) * (size_t)ks_model_n_kv_heads(m);
    if (!why[0] && before != per_token * (5 + 4))
        snprintf(why, sizeof why, "%zu rows after 5 prompt tokens and 4 steps, expected %zu", before, per_token * 9);
    if (!why[0]) {
        ks_seq_cancel(q[0]);
        ks_batch_step(q, 2);
        if (ks_seq_kv_rows(q[0]) != 0) snprintf(why, sizeof why, "cancelled: %zu rows left", ks_seq_kv_rows(q[0]));
        else if (strcmp(ks_seq_finish(q[0]), "cancelled")) snprintf(why, sizeof why, "finish %s", ks_seq_finish(q[0]));
        else if (ks_seq_get_state(q[1]) != KS_SEQ_DECODE || ks_seq_kv_rows(q[1]) != per_token * 10)
            snprintf(why, sizeof why, "the other sequence: state %d, %zu rows", ks_seq_get_state(q[1]), ks_seq_kv_rows(q[1]));
    }
    for (int i = 0; i < 2; i++) { ks_seq_free(q[i]); ks_session_free(s[i]); }
    ks_model_close(m);
    KT_CHECK(!why[0], "%s", why);
}

KT_TEST(batch_bad_arguments) {
    ks_model *m = NULL;
    KT_CHECK(ks_model_open(TINY, "cpu", &m) == KS_OK, "%s", ks_last_error());
    ks_session *s = NULL;
    KT_CHECK(ks_session_create(m, &s) == KS_OK, "%s", ks_last_error());
    ks_seq *q = NULL;
    int32_t ids[] = {0, 5, 6};
    ks_generate_opts o;
    ks_generate_opts_default(&o);
    char why[256] = "";
    o.temperature = -1;
    if (ks_seq_create(s, ids, 3, &o, &q) != KS_ERR_ARG || q || !strstr(ks_last_error(), "temperature"))
        snprintf(why, sizeof why, "temperature -1: %s", ks_last_error());
    ks_generate_opts_default(&o);
    int32_t bad[] = {0, 99999};
    if (!why[0] && (ks_seq_create(s, bad, 2, &o, &q) != KS_ERR_ARG || !strstr(ks_last_error(), "99999")))
        snprintf(why, sizeof why, "id 99999: %s", ks_last_error());
    if (!why[0] && ks_seq_create(s, ids, 0, &o, &q) != KS_ERR_ARG) snprintf(why, sizeof why, "empty prompt accepted");
    if (!why[0] && ks_batch_step(NULL, 1) != KS_ERR_ARG) snprintf(why, sizeof why, "NULL batch accepted");
    if (!why[0] && ks_seq_create(s, ids, 3, &o, &q)) snprintf(why, sizeof why, "good: %s", ks_last_error());
    if (!why[0] && (ks_seq_prefill(q, -1) != KS_ERR_ARG)) snprintf(why, sizeof why, "max_rows -1 accepted");
    if (!why[0] && (ks_seq_prefill(q, 0) || ks_seq_prefill(q, 0) != KS_ERR_ARG))
        snprintf(why, sizeof why, "a second prefill of a prefilled prompt: %s", ks_last_error());
    ks_seq_free(q);
    ks_session_free(s);
    ks_model_close(m);
    KT_CHECK(!why[0], "%s", why);
}

/* ================================================================ the server
 *
 *   serve_openai_client                    the official openai npm client (tests/serve/client.mjs):
 *                                          models, completions, chat, streaming, per-request
 *                                          policies, an error as APIError
 *   serve_concurrent_matches_sequential    16 clients at once with mixed policies get the ids of the
 *                                          same 16 requests one after the other (greedy)
 *   serve_disconnect_frees_rows            a client that leaves (non-streamed and streamed) has its
 *                                          sequence cancelled and its rows freed (/health); a full
 *                                          queue answers 429 with Retry-After
 *   serve_bad_inputs                       each bad request gets its 4xx and a JSON error naming the
 *                                          problem; the server stays healthy; policies by path or
 *                                          source can be switched off (403); a stalled client is
 *                                          dropped after --timeout
 *
 * The server runs as a child (KS_BIN serve --port 0: a free port, read from its first line on
 * stderr) and is stopped with SIGTERM, which must end it with status 0. Requests go over plain
 * sockets, one connection each ("Connection: close"). */

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct srv { pid_t pid; int port; int err_fd; } srv;

/* Start `KS_BIN serve -m model --port 0 extra`; 0 when it listens. */
static int srv_start(srv *s, const char *model, const char *extra, char *why, size_t nwhy) {
    int fd[2];
    if (pipe(fd)) { snprintf(why, nwhy, "pipe: %s", strerror(errno)); return -1; }
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "exec %s serve -m %s --port 0 --threads 1 %s", kt_bin(), model, extra ? extra : "");
    pid_t pid = fork();
    if (pid < 0) { snprintf(why, nwhy, "fork: %s", strerror(errno)); return -1; }
    if (pid == 0) {
        dup2(fd[1], 2);
        close(fd[0]);
        close(fd[1]);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    close(fd[1]);
    s->pid = pid;
    s->err_fd = fd[0];
    s->port = 0;
    char line[1024];
    size_t n = 0;
    for (;;) { /* its first line, within 60 s */
        struct pollfd p = {fd[0], POLLIN, 0};
        if (poll(&p, 1, 60000) <= 0) break;
        ssize_t r = read(fd[0], line + n, 1);
        if (r <= 0) break;
        if (line[n] == '\n' || n + 2 >= sizeof line) break;
        n++;
    }
    line[n] = 0;
    const char *at = strstr(line, "http://127.0.0.1:");
    if (at) s->port = atoi(at + strlen("http://127.0.0.1:"));
    if (s->port <= 0) {
        snprintf(why, nwhy, "the server did not start: \"%.400s\"", line);
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        close(fd[0]);
        return -1;
    }
    return 0;
}

/* SIGTERM; its exit status (0 = a clean stop), -1 when it had to be killed. */
static int srv_stop(srv *s) {
    kill(s->pid, SIGTERM);
    int st = 0;
    for (int i = 0; i < 300; i++) { /* 30 s */
        if (waitpid(s->pid, &st, WNOHANG) == s->pid) { close(s->err_fd); return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st); }
        usleep(100000);
    }
    kill(s->pid, SIGKILL);
    waitpid(s->pid, NULL, 0);
    close(s->err_fd);
    return -1;
}

static int tcp_connect(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a)) { close(fd); return -1; }
    struct timeval tv = {120, 0}; /* a hang guard, not a timing */
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

static int send_all(int fd, const char *p, size_t n) {
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w <= 0) return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static int send_request(int fd, const char *method, const char *path, const char *body) {
    char head[512];
    size_t bl = body ? strlen(body) : 0;
    snprintf(head, sizeof head, "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: application/json\r\n"
             "Content-Length: %zu\r\n\r\n", method, path, bl);
    return send_all(fd, head, strlen(head)) || (bl && send_all(fd, body, bl)) ? -1 : 0;
}

/* One request; the status (-1: no answer), the response head and body in out (malloc'd). */
static int http(int port, const char *method, const char *path, const char *body, char **out) {
    *out = NULL;
    int fd = tcp_connect(port);
    if (fd < 0) return -1;
    if (send_request(fd, method, path, body)) { close(fd); return -1; }
    size_t n = 0, cap = 4096;
    char *b = malloc(cap);
    for (;;) {
        if (n + 1024 > cap) b = realloc(b, cap *= 2);
        ssize_t r = recv(fd, b + n, cap - n - 1, 0);
        if (r <= 0) break;
        n += (size_t)r;
    }
    close(fd);
    b[n] = 0;
    *out = b;
    int st = -1;
    if (sscanf(b, "HTTP/1.%*d %d", &st) != 1) st = -1;
    return st;
}

/* A number field of a JSON text ("key": N), -1 when absent. */
static long json_field(const char *text, const char *key) {
    char k[64];
    snprintf(k, sizeof k, "\"%s\": ", key);
    const char *p = text ? strstr(text, k) : NULL;
    return p ? strtol(p + strlen(k), NULL, 10) : -1;
}

/* The "ids": [...] list of a reply, copied into buf ("" when absent). */
static void reply_ids(const char *text, char *buf, size_t n) {
    buf[0] = 0;
    const char *p = text ? strstr(text, "\"ids\": [") : NULL;
    const char *e = p ? strchr(p, ']') : NULL;
    if (p && e) snprintf(buf, n, "%.*s", (int)(e - p + 1), p);
}

static long health(int port, const char *key) {
    char *out;
    int st = http(port, "GET", "/health", NULL, &out);
    long v = st == 200 ? json_field(out, key) : -2;
    free(out);
    return v;
}

/* Wait (up to 60 s, a hang guard) until /health's key equals want. */
static int health_wait(int port, const char *key, long want) {
    for (int i = 0; i < 600; i++) {
        if (health(port, key) == want) return 0;
        usleep(100000);
    }
    return -1;
}

#define NEED_BIN() do { if (!kt_bin()) KT_SKIP("KS_BIN not set (run through make test)"); } while (0)

/* ---------------------------------------------------------------- the openai client */

/* A copy of the bundled model whose tokenizer has chatml's two tokens (<|pad|> becomes
 * <|im_start|>, <|eos|> <|im_end|>: the vocabulary keeps its size) and a chatml template, so that
 * /v1/chat/completions has a format. The weights are linked, not copied. */
static int chat_model(const char *dir) {
    char cwd[1024], path[1300], src[1300];
    if (!getcwd(cwd, sizeof cwd)) return -1;
    const char *link_these[] = {"config.json", "model.safetensors", "generation_config.json"};
    for (int i = 0; i < 3; i++) {
        snprintf(src, sizeof src, "%s/" TINY "/%s", cwd, link_these[i]);
        snprintf(path, sizeof path, "%s/%s", dir, link_these[i]);
        if (symlink(src, path)) return -1;
    }
    size_t n;
    char *t = kt_slurp(TINY "/tokenizer.json", &n);
    if (!t) return -1;
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    FILE *f = fopen(path, "wb");
    if (!f) { free(t); return -1; }
    for (size_t i = 0; i < n;) {
        if (!strncmp(t + i, "\"<|pad|>\"", 9)) { fputs("\"<|im_start|>\"", f); i += 9; }
        else if (!strncmp(t + i, "\"<|eos|>\"", 9)) { fputs("\"<|im_end|>\"", f); i += 9; }
        else fputc(t[i++], f);
    }
    fclose(f);
    free(t);
    return kt_write_file(dir, "tokenizer_config.json",
                         "{\"chat_template\": \"{% for m in messages %}<|im_start|>{{ m.role }}\\n{{ m.content }}<|im_end|>\\n"
                         "{% endfor %}<|im_start|>assistant\\n\"}");
}

KT_SLOW_TEST(serve_openai_client) {
    NEED_BIN();
    char out[16384], cmd[2048];
    int rc = kt_sh("bash tests/serve/setup.sh", out, sizeof out);
    if (rc != 0) KT_SKIP("the openai npm client could not be installed: %s", out);
    char dir[256], why[512] = "";
    KT_CHECK(kt_tmpdir(dir, sizeof dir) == 0, "tmpdir");
    KT_CHECK(chat_model(dir) == 0, "cannot write the chat model copy in %s", dir);
    srv s;
    if (srv_start(&s, dir, NULL, why, sizeof why)) { kt_rmdir(dir); KT_CHECK(0, "%s", why); }
    const char *name = strrchr(dir, '/') + 1;
    snprintf(cmd, sizeof cmd, "node tests/serve/client.mjs http://127.0.0.1:%d/v1 %s", s.port, name);
    rc = kt_sh(cmd, out, sizeof out);
    long active = health(s.port, "active");
    int stop = srv_stop(&s);
    kt_rmdir(dir);
    KT_CHECK(rc == 0 && strstr(out, "checks passed"), "client.mjs: exit %d: %s", rc, out);
    KT_CHECK(active == 0, "%ld sequences active after the client finished", active);
    KT_CHECK(stop == 0, "the server's exit status after SIGTERM: %d", stop);
}

/* ---------------------------------------------------------------- 16 at once */

#define NCONC 16
static const char *INLINE_POLICY = /* keeps the first 2 and the last 6 rows of each prefilled layer */
    "local ks = require \\\"kvsieve\\\"\\n"
    "return { name = \\\"ends\\\", prefill_qkv = function(ev)\\n"
    "  local n = ev.kv_rows[1] + ev.n\\n  if n <= 8 then return end\\n"
    "  ev:retain(ks.concat(ks.arange(0, 2), ks.arange(n - 6, n)))\\nend }";

static void conc_body(int i, char *b, size_t n) {
    const char *pol[] = {"", ", \"kvsieve\": {\"policy\": \"gemfilter\", \"set\": {\"layer\": 2, \"k\": 8}}",
                         ", \"kvsieve\": {\"policy\": \"streamingllm\", \"set\": {\"budget\": 8, \"rolling\": true}, \"report_kept\": true}",
                         NULL};
    char p[2048];
    if (i % 4 == 3) snprintf(p, sizeof p, ", \"kvsieve\": {\"policy\": \"%s\"}", INLINE_POLICY);
    else snprintf(p, sizeof p, "%s", pol[i % 4]);
    snprintf(b, n, "{\"prompt\": \"Story %d. The grass is green and the sky is blue. Once upon a time there was a dog named %c\", "
             "\"max_tokens\": %d, \"temperature\": %s, \"seed\": %d%s}", i, 'A' + i, 6 + (i % 5) * 3,
             i % 6 == 5 ? "0.8" : "0", i, p);
}

typedef struct conc_arg { int port, i; pthread_barrier_t *bar; char *out; int st; } conc_arg;

static void *conc_one(void *a_) {
    conc_arg *a = a_;
    char body[4096];
    conc_body(a->i, body, sizeof body);
    pthread_barrier_wait(a->bar);
    a->st = http(a->port, "POST", "/v1/completions", body, &a->out);
    return NULL;
}

KT_SLOW_TEST(serve_concurrent_matches_sequential) {
    NEED_BIN();
    srv s;
    char why[512] = "";
    KT_CHECK(srv_start(&s, TINY, "--max-batch 16", why, sizeof why) == 0, "%s", why);
    char seq_ids[NCONC][1024];
    for (int i = 0; i < NCONC && !why[0]; i++) {
        char body[4096], *out;
        conc_body(i, body, sizeof body);
        int st = http(s.port, "POST", "/v1/completions", body, &out);
        reply_ids(out, seq_ids[i], sizeof seq_ids[i]);
        if (st != 200 || !seq_ids[i][0] || !strcmp(seq_ids[i], "\"ids\": []"))
            snprintf(why, sizeof why, "sequential %d: status %d: %.300s", i, st, out ? out : "");
        free(out);
    }
    conc_arg a[NCONC];
    pthread_t th[NCONC];
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, NCONC);
    int started = 0;
    if (!why[0])
        for (; started < NCONC; started++) {
            a[started] = (conc_arg){.port = s.port, .i = started, .bar = &bar};
            if (pthread_create(&th[started], NULL, conc_one, &a[started])) break;
        }
    if (!why[0] && started < NCONC) { /* cannot happen short of no threads: unblock the barrier */
        snprintf(why, sizeof why, "pthread_create failed at %d", started);
        for (int k = started; k < NCONC; k++) pthread_barrier_wait(&bar);
    }
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    pthread_barrier_destroy(&bar);
    for (int i = 0; i < started && !why[0]; i++) {
        char ids[1024];
        reply_ids(a[i].out, ids, sizeof ids);
        if (a[i].st != 200) snprintf(why, sizeof why, "concurrent %d: status %d: %.300s", i, a[i].st, a[i].out ? a[i].out : "");
        else if (strcmp(ids, seq_ids[i])) snprintf(why, sizeof why, "request %d: concurrent %.200s, sequential %.200s", i, ids, seq_ids[i]);
    }
    for (int i = 0; i < started; i++) free(a[i].out);
    long requests = health(s.port, "requests"), active = health(s.port, "active"), rows = health(s.port, "kv_rows");
    long peak = health(s.port, "peak_active");
    int stop = srv_stop(&s);
    KT_CHECK(!why[0], "%s", why);
    /* the 16 were released together and each takes several steps: they overlapped */
    KT_CHECK(peak >= 2, "at most %ld sequences were ever stepped together", peak);
    KT_CHECK(requests == 2 * NCONC && active == 0 && rows == 0, "health after: %ld requests, %ld active, %ld rows", requests, active, rows);
    KT_CHECK(stop == 0, "exit status after SIGTERM: %d", stop);
}

/* ---------------------------------------------------------------- disconnects and the queue */

static const char *LONG_REQ = "{\"prompt\": \"Once upon a time\", \"max_tokens\": 12000, \"temperature\": 0%s}";

/* Send a long request on a connection of its own, wait until it is generating, close the
 * connection: the sequence must be cancelled and every row freed. */
static int leave_midway(int port, int stream, long cancelled_before, char *why, size_t n) {
    char body[256];
    snprintf(body, sizeof body, LONG_REQ, stream ? ", \"stream\": true" : "");
    int fd = tcp_connect(port);
    if (fd < 0 || send_request(fd, "POST", "/v1/completions", body)) { snprintf(why, n, "cannot send"); if (fd >= 0) close(fd); return -1; }
    int busy = 0;
    for (int i = 0; i < 600 && !busy; i++) { /* generating: rows in use */
        busy = health(port, "kv_rows") > 0;
        if (!busy) usleep(50000);
    }
    if (stream && busy) { /* a streamed reply has begun */
        char b[512];
        busy = recv(fd, b, sizeof b, 0) > 0;
    }
    close(fd);
    if (!busy) { snprintf(why, n, "%s request never held rows", stream ? "streamed" : "plain"); return -1; }
    if (health_wait(port, "active", 0) || health_wait(port, "kv_rows", 0)) {
        snprintf(why, n, "%s: rows not freed after the client left: active %ld, kv_rows %ld", stream ? "streamed" : "plain",
                 health(port, "active"), health(port, "kv_rows"));
        return -1;
    }
    if (health(port, "cancelled") != cancelled_before + 1) {
        snprintf(why, n, "%s: cancelled %ld, expected %ld", stream ? "streamed" : "plain", health(port, "cancelled"), cancelled_before + 1);
        return -1;
    }
    return 0;
}

KT_TEST(serve_disconnect_frees_rows) {
    NEED_BIN();
    srv s;
    char why[512] = "";
    KT_CHECK(srv_start(&s, TINY, "--max-batch 1 --max-queue 1", why, sizeof why) == 0, "%s", why);
    if (!leave_midway(s.port, 0, 0, why, sizeof why)) leave_midway(s.port, 1, 1, why, sizeof why);
    /* the queue: one generating (batch 1), one waiting (queue 1), the third gets 429 */
    int fa = -1, fb = -1;
    if (!why[0]) {
        char body[256];
        snprintf(body, sizeof body, LONG_REQ, "");
        fa = tcp_connect(s.port);
        if (fa < 0 || send_request(fa, "POST", "/v1/completions", body) || health_wait(s.port, "active", 1))
            snprintf(why, sizeof why, "the first request did not start");
        fb = why[0] ? -1 : tcp_connect(s.port);
        if (!why[0] && (fb < 0 || send_request(fb, "POST", "/v1/completions", body) || health_wait(s.port, "queued", 1)))
            snprintf(why, sizeof why, "the second request did not queue");
        char *out = NULL;
        int st = why[0] ? 0 : http(s.port, "POST", "/v1/completions", body, &out);
        if (!why[0] && (st != 429 || !strstr(out, "Retry-After: 1") || !strstr(out, "\"code\": \"queue_full\"")))
            snprintf(why, sizeof why, "a full queue: status %d: %.400s", st, out ? out : "");
        free(out);
    }
    if (fa >= 0) close(fa);
    if (fb >= 0) close(fb);
    if (!why[0] && (health_wait(s.port, "active", 0) || health_wait(s.port, "queued", 0) || health_wait(s.port, "kv_rows", 0)))
        snprintf(why, sizeof why, "after both left: active %ld, queued %ld, rows %ld", health(s.port, "active"),
                 health(s.port, "queued"), health(s.port, "kv_rows"));
    int stop = srv_stop(&s);
    KT_CHECK(!why[0], "%s", why);
    KT_CHECK(stop == 0, "exit status after SIGTERM: %d", stop);
}

/* ---------------------------------------------------------------- bad input */

typedef struct bad_case { const char *method, *path, *body; int status; const char *want; } bad_case;

KT_TEST(serve_bad_inputs) {
    NEED_BIN();
    srv s;
    char why[1024] = "";
    KT_CHECK(srv_start(&s, TINY, "--max-kv-tokens 4096", why, sizeof why) == 0, "%s", why);
    /* a prompt over the model's context (16384 tokens): "x " x 20000 */
    size_t big_n = 2 * 20000 + 64;
    char *big = malloc(big_n);
    strcpy(big, "{\"prompt\": \"");
    for (int i = 0; i < 20000; i++) strcat(big + 11 + 2 * i, "x ");
    strcat(big, "\"}");
    const bad_case cases[] = {
        {"POST", "/v1/completions", "{\"prompt\": \"hi\", ", 400, "not valid JSON"},
        {"POST", "/v1/completions", "", 400, "not valid JSON"},
        {"POST", "/v1/completions", "[1, 2]", 400, "must be an object"},
        {"POST", "/v1/completions", "{\"prompt\": \"hi\", \"bogus\": 1}", 400, "unknown field 'bogus'"},
        {"POST", "/v1/completions", "{\"prompt\": \"hi\", \"kvsieve\": {\"polcy\": \"x\"}}", 400, "unknown field 'kvsieve.polcy'"},
        {"POST", "/v1/completions", "{\"prompt\": 7}", 400, "'prompt' must be a string, got a number"},
        {"POST", "/v1/completions", "{\"prompt\": \"hi\", \"max_tokens\": \"8\"}", 400, "'max_tokens' must be an integer"},
        {"POST", "/v1/completions", "{\"prompt\": \"hi\", \"temperature\": -1}", 400, "'temperature' must be in"},
        {"POST", "/v1/completions", "{\"prompt\": \"hi\", \"stop\": [1]}", 400, "'stop' must be a string"},
        {"POST", "/v1/completions", "{\"prompt\": \"hi\", \"n\": 2}", 400, "'n' is not supported"},
        {"POST", "/v1/completions", "{\"max_tokens\": 3}", 400, "'prompt' is required"},
        {"POST", "/v1/completions", "{\"prompt\": \"hi\", \"model\": \"gpt-4\"}", 404, "'gpt-4' does not exist"},
        {"POST", "/v1/completions", "{\"prompt\": \"hi\", \"kvsieve\": {\"policy\": \"no_such_policy\"}}", 400, "no policy named \\\"no_such_policy\\\""},
        {"POST", "/v1/completions", "{\"prompt\": \"hi\", \"kvsieve\": {\"policy\": \"gemfilter\", \"set\": {\"nope\": 1}}}", 400, "unknown parameter 'nope'"},
        {"POST", "/v1/completions", "{\"prompt\": \"hi\", \"kvsieve\": {\"policy\": \"gemfilter\", \"set\": {\"layer\": 99}}}", 400, "policy gemfilter"},
        {"POST", "/v1/completions", "{\"prompt\": \"hi\", \"kvsieve\": {\"set\": {\"k\": 1}}}", 400, "kvsieve.set without kvsieve.policy"},
        {"POST", "/v1/completions", "{\"prompt\": \"hi\", \"kvsieve\": {\"policy\": \"return {name = 'bad', prefill_qkv = function(ev) error('boom') end}\"}}", 400, "boom"},
        {"POST", "/v1/completions", "{\"prompt\": \"hi\", \"kvsieve\": {\"policy\": \"return {name = 'spin', prefill_qkv = function(ev) while true do end end}\", \"set\": {\"_instructions\": 100000}}}", 400, "instruction budget exceeded"},
        {"POST", "/v1/completions", "{\"prompt\": \"hi\", \"kvsieve\": {\"policy\": \"return {\"}}", 400, "policy inline: load"},
        {"POST", "/v1/completions", "{\"prompt\": \"hi\", \"max_tokens\": 20000}", 400, "maximum context length is 16384"},
        {"POST", "/v1/completions", big, 400, "maximum context length is 16384"},
        {"POST", "/v1/completions", "{\"prompt\": \"hi\", \"max_tokens\": 5000}", 400, "--max-kv-tokens 4096"},
        {"POST", "/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}", 400, "no chat template"},
        {"POST", "/v1/chat/completions", "{\"messages\": [{\"role\": \"user\"}]}", 400, "needs a 'role' and a 'content'"},
        {"POST", "/v1/chat/completions", "{\"messages\": \"hi\"}", 400, "'messages' must be an array"},
        {"GET", "/v1/completions", NULL, 405, "takes POST"},
        {"POST", "/health", "{}", 405, "takes GET"},
        {"GET", "/v2/nothing", NULL, 404, "no such endpoint"},
    };
    int n = (int)(sizeof cases / sizeof cases[0]);
    for (int i = 0; i < n && !why[0]; i++) {
        char *out = NULL;
        int st = http(s.port, cases[i].method, cases[i].path, cases[i].body, &out);
        const char *body = out ? strstr(out, "\r\n\r\n") : NULL;
        if (st != cases[i].status || !body || !strstr(body, "{\"error\": {\"message\": ") || !strstr(body, cases[i].want))
            snprintf(why, sizeof why, "case %d (%s %s): status %d (want %d and \"%s\"): %.600s", i, cases[i].method, cases[i].path, st,
                     cases[i].status, cases[i].want, body ? body : out ? out : "(no reply)");
        else if (health(s.port, "active") != 0)
            snprintf(why, sizeof why, "case %d: the server is not healthy after it", i);
        free(out);
    }
    free(big);
    /* still serving */
    char *out = NULL;
    int st = why[0] ? 0 : http(s.port, "POST", "/v1/completions", "{\"prompt\": \"hi\", \"max_tokens\": 3, \"temperature\": 0}", &out);
    if (!why[0] && (st != 200 || json_field(out, "completion_tokens") != 3)) snprintf(why, sizeof why, "after the bad inputs: %d %.300s", st, out);
    free(out);
    int stop = srv_stop(&s);
    KT_CHECK(!why[0], "%s", why);
    KT_CHECK(stop == 0, "exit status after SIGTERM: %d", stop);
    /* policies by path and source switched off; a stalled client dropped */
    KT_CHECK(srv_start(&s, TINY, "--no-inline-policies --no-path-policies --timeout 1", why, sizeof why) == 0, "%s", why);
    const char *forbidden[] = {"{\"prompt\": \"hi\", \"kvsieve\": {\"policy\": \"return {name = 'x'}\"}}",
                               "{\"prompt\": \"hi\", \"kvsieve\": {\"policy\": \"policies/gemfilter.lua\"}}"};
    for (int i = 0; i < 2 && !why[0]; i++) {
        st = http(s.port, "POST", "/v1/completions", forbidden[i], &out);
        if (st != 403 || !strstr(out, "\"code\": \"policy_forbidden\"")) snprintf(why, sizeof why, "forbidden %d: %d %.300s", i, st, out);
        free(out);
    }
    st = why[0] ? 0 : http(s.port, "POST", "/v1/completions", "{\"prompt\": \"hi\", \"max_tokens\": 2, \"kvsieve\": {\"policy\": \"gemfilter\", \"set\": {\"layer\": 2}}}", &out);
    if (!why[0] && st != 200) snprintf(why, sizeof why, "a policy by name with the others off: %d %.300s", st, out);
    free(out);
    if (!why[0]) { /* half a request, then silence: the server closes the connection */
        int fd = tcp_connect(s.port);
        const char *half = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"prompt\"";
        char b[256];
        if (fd < 0 || send_all(fd, half, strlen(half))) snprintf(why, sizeof why, "cannot send half a request");
        else if (recv(fd, b, sizeof b, 0) < 0) snprintf(why, sizeof why, "a stalled client was not dropped (%s)", strerror(errno));
        if (fd >= 0) close(fd);
    }
    stop = srv_stop(&s);
    KT_CHECK(!why[0], "%s", why);
    KT_CHECK(stop == 0, "exit status after SIGTERM: %d", stop);
}
