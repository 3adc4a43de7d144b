/* serve.c — `kvsieve serve`: options, the model, the scheduler thread and the HTTP loop
 * (serve.h has the design; docs/serve.md the API). */
#include "serve.h"
#include "cli.h"

#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void serve_log(void *user, ks_log_level level, const char *msg) {
    (void)user;
    if (level <= KS_LOG_INFO || ks_cli_verbose) fprintf(stderr, "kvsieve: %s\n", msg);
}

static int parse(int argc, char **argv, srv_opts *o) {
    *o = (srv_opts){.backend = "cpu", .host = "127.0.0.1", .port = 8080, .max_batch = 16, .max_kv_tokens = 65536,
                    .max_queue = 64, .prefill_chunk = 256, .timeout_s = 60};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int n;
#define NEED() do { if (!v) { fprintf(stderr, "kvsieve: option %s needs a value\n", a); return -1; } i++; } while (0)
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) { NEED(); o->model_dir = v; }
        else if (!strcmp(a, "--backend")) { NEED(); o->backend = v; }
        else if (!strcmp(a, "--host")) { NEED(); o->host = v; }
        else if (!strcmp(a, "--port")) { NEED(); if (ks_arg_int(a, v, 0, 65535, &o->port)) return -1; }
        else if (!strcmp(a, "--max-batch")) { NEED(); if (ks_arg_int(a, v, 1, 4096, &o->max_batch)) return -1; }
        else if (!strcmp(a, "--max-kv-tokens")) { NEED(); if (ks_arg_int(a, v, 1, INT_MAX, &n)) return -1; o->max_kv_tokens = n; }
        else if (!strcmp(a, "--max-queue")) { NEED(); if (ks_arg_int(a, v, 0, 1 << 20, &o->max_queue)) return -1; }
        else if (!strcmp(a, "--prefill-chunk")) { NEED(); if (ks_arg_int(a, v, 1, INT_MAX, &o->prefill_chunk)) return -1; }
        else if (!strcmp(a, "--timeout")) { NEED(); if (ks_arg_int(a, v, 1, 86400, &o->timeout_s)) return -1; }
        else if (!strcmp(a, "--threads")) { NEED(); if (ks_arg_int(a, v, 0, 4096, &o->threads)) return -1; }
        else if (!strcmp(a, "--chat")) { NEED(); o->chat_format = v; }
        else if (!strcmp(a, "--no-inline-policies")) o->no_inline = 1;
        else if (!strcmp(a, "--no-path-policies")) o->no_path = 1;
        else if (ks_cli_is_verbose(a)) ks_cli_set_verbose();
        else { fprintf(stderr, "kvsieve: serve: unknown option \"%s\" (kvsieve serve --help)\n", a); return -1; }
#undef NEED
    }
    if (!o->model_dir) { fprintf(stderr, "kvsieve: serve: -m DIR is required\n"); return -1; }
    return 0;
}

int ks_cli_serve(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (ks_cli_is_help(argv[i])) return ks_cli_help("serve"), 0;
    srv_state S;
    memset(&S, 0, sizeof S);
    if (parse(argc, argv, &S.o)) return 2;
    ks_set_log(serve_log, NULL);
    signal(SIGPIPE, SIG_IGN);
    ks_model_opts mo;
    ks_model_opts_default(&mo);
    mo.backend = S.o.backend;
    mo.threads = S.o.threads;
    if (ks_model_open_ex(S.o.model_dir, &mo, &S.m)) return ks_cli_fail("serve");
    /* the model's name: its folder's last component */
    char name[256];
    size_t L = strlen(S.o.model_dir);
    while (L > 1 && S.o.model_dir[L - 1] == '/') L--;
    size_t b = L;
    while (b > 0 && S.o.model_dir[b - 1] != '/') b--;
    snprintf(name, sizeof name, "%.*s", (int)(L - b), S.o.model_dir + b);
    S.model_name = name;
    S.max_context = ks_model_max_context(S.m);
    /* the chat format: --chat, or the model's template; none: chat requests get a 400 */
    if (S.o.chat_format) {
        ks_chat_msg probe = {"user", "x"};
        char *t = NULL;
        if (ks_chat_format(S.o.chat_format, &probe, 1, &t)) { ks_model_close(S.m); return ks_cli_fail("serve: --chat"); }
        free(t);
        S.chat_format = S.o.chat_format;
    } else if (ks_chat_from_model_dir(S.o.model_dir, &S.chat_format) || !S.chat_format) {
        S.chat_format = NULL;
        snprintf(S.chat_why, sizeof S.chat_why, "this model has no chat template, which /v1/chat/completions needs "
                 "(start the server with --chat FMT: %s)", ks_chat_format_names());
    }
    if (pthread_mutex_init(&S.mu, NULL) || pthread_mutex_init(&S.mbox_mu, NULL) || pthread_cond_init(&S.cv, NULL) ||
        pipe(S.wake) || fcntl(S.wake[1], F_SETFL, O_NONBLOCK)) {
        fprintf(stderr, "kvsieve: serve: cannot set up threads\n");
        ks_model_close(S.m);
        return 1;
    }
    pthread_t th;
    if (pthread_create(&th, NULL, srv_sched_main, &S)) {
        fprintf(stderr, "kvsieve: serve: cannot start the scheduler thread\n");
        ks_model_close(S.m);
        return 1;
    }
    int rc = srv_http_run(&S);
    pthread_mutex_lock(&S.mu); /* srv_http_run set it; again for its early failures */
    S.stopping = 1;
    pthread_cond_signal(&S.cv);
    pthread_mutex_unlock(&S.mu);
    pthread_join(th, NULL);
    srv_http_drain(&S);
    close(S.wake[0]);
    close(S.wake[1]);
    pthread_cond_destroy(&S.cv);
    pthread_mutex_destroy(&S.mu);
    pthread_mutex_destroy(&S.mbox_mu);
    ks_model_close(S.m);
    return rc;
}
