/* serve.h — `kvsieve serve`: an OpenAI-compatible HTTP server over the engine's batched stepping
 * (kvsieve.h, ks_seq_* / ks_batch_step). Four files, one job each, sharing this header:
 *
 *   serve.c        the command: options, the model, the two threads, shutdown
 *   serve_http.c   the HTTP layer (libevent's evhttp, on the event-loop thread): routes, bodies,
 *                  replies and server-sent events, the mailbox the scheduler posts replies to,
 *                  disconnects (a closed connection cancels its job)
 *   serve_json.c   JSON: a small escaping writer (sj_buf) and the request parser (JSON body ->
 *                  srv_params, every field checked, errors as srv_error), no engine calls
 *   serve_sched.c  the scheduler thread: owns the model, every session and policy; admits queued
 *                  jobs by KV memory, prefills prompts in pieces between decode steps, steps all
 *                  sequences together, builds the replies
 *
 * Threads: the event loop (serve_http.c) and the scheduler (serve_sched.c). They share only the
 * job queue and the stats (srv_state.mu), a job's cancel flag (atomic), and the mailbox. A job is
 * made by the HTTP side, handed to the scheduler through the queue, and freed by the HTTP side
 * after the scheduler's last message for it (msg.last): the scheduler never touches a job after
 * posting that. */
#ifndef KS_SERVE_H
#define KS_SERVE_H

#include "kvsieve.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

/* ---------------------------------------------------------------- JSON writer (serve_json.c) */

typedef struct sj_buf { char *p; size_t n, cap; int oom; } sj_buf;
void sj_raw(sj_buf *b, const char *s, size_t n);
void sj_cat(sj_buf *b, const char *s);                 /* raw text */
void sj_printf(sj_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void sj_str(sj_buf *b, const char *s);                 /* a JSON string, escaped ("null" for NULL) */
void sj_strn(sj_buf *b, const char *s, size_t n);
void sj_free(sj_buf *b);

/* ---------------------------------------------------------------- requests (serve_json.c) */

/* An error reply: HTTP status, OpenAI's error type and code, a message naming the problem. */
typedef struct srv_error { int http; const char *type, *code; char msg[512]; } srv_error;
void srv_err(srv_error *e, int http, const char *type, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* {"error": {"message": ..., "type": ..., "param": null, "code": ...}} */
void srv_error_json(const srv_error *e, sj_buf *b);

enum { SRV_POL_NONE = 0, SRV_POL_NAME, SRV_POL_PATH, SRV_POL_INLINE };
#define SRV_MAX_STOP 8
#define SRV_MAX_SET 32

/* One request's parameters, everything owned (srv_params_free). */
typedef struct srv_params {
    int chat;                  /* /v1/chat/completions: msgs; else prompt */
    char *prompt;
    struct srv_turn { char *role, *content; } *msgs; /* (n_msgs) */
    int n_msgs;
    char *model;               /* as asked (NULL: not given) */
    int max_tokens;            /* -1: not given */
    float temperature, top_p, min_p, repeat_penalty;
    int top_k;
    uint64_t seed;
    char *stop[SRV_MAX_STOP];
    int n_stop;
    int stream;
    /* "kvsieve": {...} */
    int policy_kind;           /* SRV_POL_* */
    char *policy;              /* the name, path or source */
    char *set_key[SRV_MAX_SET], *set_val[SRV_MAX_SET];
    int n_set;
    int report_kept;
} srv_params;

/* Parse a request body of `path_chat` kind (1: chat). Returns 0, or -1 with e filled (400 for
 * malformed JSON, wrong types, unknown or unsupported fields and out-of-range values). */
int srv_parse_request(const char *body, size_t len, int path_chat, srv_params *p, srv_error *e);
void srv_params_free(srv_params *p);

/* ---------------------------------------------------------------- server state */

typedef struct srv_opts {
    const char *model_dir, *backend, *host;
    int port;                  /* 0: any free port (printed) */
    int max_batch;             /* sequences stepped together */
    long max_kv_tokens;        /* rows reserved (prompt + max_tokens) over the active sequences */
    int max_queue;             /* waiting jobs beyond which a request gets 429 */
    int prefill_chunk;         /* prompt tokens prefilled per scheduler round */
    int timeout_s;             /* evhttp read/write timeout */
    int no_inline, no_path;    /* forbid inline / path policies (403) */
    int threads;
    const char *chat_format;   /* NULL: the model's (auto) */
} srv_opts;

typedef struct srv_job srv_job;
struct srv_job {
    long id;
    srv_params p;
    atomic_int cancelled;      /* set by the HTTP side when the client went away */
    /* HTTP side only */
    struct evhttp_request *req;   /* NULL once the connection closed */
    int started;                  /* a streamed reply's headers are out */
    srv_job *pnext, *pprev;       /* the list of jobs awaiting their reply (srv_state.pending) */
    srv_job *next;                /* queue link (under srv_state.mu) */
    /* scheduler side only */
    void *sched;                  /* serve_sched.c's per-job state */
};

/* A message from the scheduler to the HTTP side. kind: a streamed chunk (body: one SSE event's
 * data, "data: " and the blank line added by the receiver), a whole reply (http status + JSON
 * body), or the end of a stream. last: the scheduler is done with the job. */
enum { SRV_MSG_CHUNK = 0, SRV_MSG_REPLY, SRV_MSG_END };
typedef struct srv_msg {
    srv_job *job;
    int kind, http, last;
    char *body;
    struct srv_msg *next;
} srv_msg;

typedef struct srv_stats {
    int active, queued, peak_active; /* peak: the most sequences stepped together so far */
    long kv_rows, kv_reserved; /* rows summed over layers and KV heads; tokens reserved */
    long requests, completed, cancelled, errors, rejected;
    long tokens_generated;
} srv_stats;

typedef struct srv_state {
    srv_opts o;
    ks_model *m;
    const char *model_name;    /* the folder's last component */
    const char *chat_format;   /* the model's, or NULL (chat refused) */
    char chat_why[256];        /* why there is none */
    int max_context;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    srv_job *q_head, *q_tail;  /* waiting jobs (mu) */
    int stopping;              /* (mu) */
    srv_stats st;              /* (mu) */
    long next_id;              /* HTTP side */
    srv_job *pending;          /* HTTP side: jobs whose client may still go away */
    /* the mailbox (mbox_mu), and the pipe that wakes the event loop */
    pthread_mutex_t mbox_mu;
    srv_msg *mb_head, *mb_tail;
    int wake[2];
} srv_state;

/* serve_sched.c: the scheduler thread's body (arg: srv_state *). */
void *srv_sched_main(void *arg);
/* serve_http.c: post a message (takes body); wakes the event loop. */
void srv_post(srv_state *S, srv_job *job, int kind, int http, char *body, int last);
/* serve_http.c: run the HTTP server until SIGINT / SIGTERM; returns the exit status. */
int srv_http_run(srv_state *S);
/* serve_http.c: after the scheduler stopped, free the jobs of undelivered messages. */
void srv_http_drain(srv_state *S);
/* serve.c: the command (repl/main.c's table). */
int ks_cli_serve(int argc, char **argv);

#endif
