/* serve_http.c — the HTTP layer of `kvsieve serve` (serve.h), on libevent's evhttp: one event
 * loop thread parses requests (evhttp), checks them (serve_json.c), queues them for the scheduler
 * and writes what the scheduler posts back (the mailbox, drained when the wake pipe is readable).
 *
 * A request's evhttp_request stays ours until we send its reply: when the client goes away first,
 * evhttp detaches it from the connection (it is freed by the send call we still make) and calls
 * the connection's close callback, which marks the job cancelled; the scheduler then frees its
 * rows at its next round and posts the job's last message. */
#include "serve.h"

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <event2/listener.h>
#include <event2/util.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define SRV_MAX_BODY (16u << 20)

/* ---------------------------------------------------------------- replies */

static const char *reason(int http) {
    switch (http) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 413: return "Payload Too Large";
    case 429: return "Too Many Requests";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
    default: return "Error";
    }
}

static void send_json(struct evhttp_request *req, int http, const char *body) {
    struct evbuffer *b = evbuffer_new();
    if (!b) { evhttp_send_error(req, 503, NULL); return; }
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", "application/json");
    evbuffer_add(b, body, strlen(body));
    evbuffer_add(b, "\n", 1);
    evhttp_send_reply(req, http, reason(http), b);
    evbuffer_free(b);
}

static void send_error(struct evhttp_request *req, const srv_error *e) {
    sj_buf b = {0};
    srv_error_json(e, &b);
    send_json(req, e->http, b.oom ? "{\"error\": {\"message\": \"out of memory\"}}" : b.p);
    sj_free(&b);
}

/* ---------------------------------------------------------------- the mailbox */

void srv_post(srv_state *S, srv_job *job, int kind, int http, char *body, int last) {
    srv_msg *m = calloc(1, sizeof *m);
    if (!m) { /* no memory for the message: the job's last one must arrive, so wait for some */
        while (!(m = calloc(1, sizeof *m))) usleep(1000);
        free(body);
        body = NULL;
        if (kind == SRV_MSG_REPLY) http = 503;
    }
    *m = (srv_msg){.job = job, .kind = kind, .http = http, .last = last, .body = body};
    pthread_mutex_lock(&S->mbox_mu);
    if (S->mb_tail) S->mb_tail->next = m; else S->mb_head = m;
    S->mb_tail = m;
    pthread_mutex_unlock(&S->mbox_mu);
    char c = 1;
    while (write(S->wake[1], &c, 1) < 0 && errno == EINTR) {}
}

/* The pending list: jobs whose reply is not sent, watched for their client leaving. */
static void pending_add(srv_state *S, srv_job *j) {
    j->pprev = NULL;
    j->pnext = S->pending;
    if (S->pending) S->pending->pprev = j;
    S->pending = j;
}

static void pending_remove(srv_state *S, srv_job *j) {
    if (j->pprev) j->pprev->pnext = j->pnext;
    else if (S->pending == j) S->pending = j->pnext;
    if (j->pnext) j->pnext->pprev = j->pprev;
    j->pnext = j->pprev = NULL;
}

static void job_free(srv_job *j) {
    srv_params_free(&j->p);
    free(j);
}

/* The connection of a job's request: its close callback is the job's only while it waits. */
static void detach_close(srv_job *j) {
    struct evhttp_connection *c = j->req ? evhttp_request_get_connection(j->req) : NULL;
    if (c) evhttp_connection_set_closecb(c, NULL, NULL);
}

static void deliver(srv_state *S, srv_msg *m) {
    srv_job *j = m->job;
    struct evhttp_request *req = j->req;
    int gone = atomic_load(&j->cancelled);
    if (req) switch (m->kind) {
        case SRV_MSG_CHUNK:
            if (gone) break;
            if (!j->started) {
                struct evkeyvalq *h = evhttp_request_get_output_headers(req);
                evhttp_add_header(h, "Content-Type", "text/event-stream");
                evhttp_add_header(h, "Cache-Control", "no-cache");
                evhttp_send_reply_start(req, 200, "OK");
                j->started = 1;
            }
            struct evbuffer *b = evbuffer_new();
            if (b) {
                evbuffer_add_printf(b, "data: %s\n\n", m->body ? m->body : "{\"error\": {\"message\": \"out of memory\"}}");
                evhttp_send_reply_chunk(req, b);
                evbuffer_free(b);
            }
            break;
        case SRV_MSG_REPLY:
            detach_close(j);
            send_json(req, m->http, m->body ? m->body : "{\"error\": {\"message\": \"out of memory\", \"type\": \"server_error\"}}");
            j->req = NULL;
            break;
        case SRV_MSG_END:
            detach_close(j);
            if (j->started) {
                if (!gone) {
                    struct evbuffer *e = evbuffer_new();
                    if (e) { evbuffer_add_printf(e, "data: [DONE]\n\n"); evhttp_send_reply_chunk(req, e); evbuffer_free(e); }
                }
                evhttp_send_reply_end(req);
            } else {
                srv_error e;
                srv_err(&e, 503, "server_error", "shutting_down", "the server is shutting down");
                send_error(req, &e); /* a detached request (client gone) is only freed */
            }
            j->req = NULL;
            break;
        }
    if (!j->req) pending_remove(S, j);
    free(m->body);
    if (m->last) { pending_remove(S, j); job_free(j); }
    free(m);
}

/* evhttp reads nothing from a connection while its request waits for the reply, so a client
 * that closes it then is seen here: its socket reads end-of-file. (Data waiting to be read is a
 * pipelined next request: the client is still there.) */
static void watch_cb(evutil_socket_t fd_, short what, void *arg) {
    srv_state *S = arg;
    for (srv_job *j = S->pending; j; j = j->pnext) {
        if (!j->req || atomic_load(&j->cancelled)) continue;
        struct evhttp_connection *c = evhttp_request_get_connection(j->req);
        struct bufferevent *bev = c ? evhttp_connection_get_bufferevent(c) : NULL;
        evutil_socket_t fd = bev ? bufferevent_getfd(bev) : -1;
        if (fd < 0) continue;
        char ch;
        ssize_t r = recv(fd, &ch, 1, MSG_PEEK | MSG_DONTWAIT);
        if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) atomic_store(&j->cancelled, 1);
    }
}

static void wake_cb(evutil_socket_t fd, short what, void *arg) {
    srv_state *S = arg;
    char buf[256];
    while (read(fd, buf, sizeof buf) > 0) {}
    pthread_mutex_lock(&S->mbox_mu);
    srv_msg *m = S->mb_head;
    S->mb_head = S->mb_tail = NULL;
    pthread_mutex_unlock(&S->mbox_mu);
    while (m) {
        srv_msg *nx = m->next;
        deliver(S, m);
        m = nx;
    }
}

static void on_close(struct evhttp_connection *c, void *arg) {
    srv_job *j = arg;
    atomic_store(&j->cancelled, 1); /* the request stays ours (detached) until we reply */
    evhttp_connection_set_closecb(c, NULL, NULL);
}

/* ---------------------------------------------------------------- routes */

static void health(srv_state *S, struct evhttp_request *req) {
    pthread_mutex_lock(&S->mu);
    srv_stats st = S->st;
    pthread_mutex_unlock(&S->mu);
    sj_buf b = {0};
    sj_printf(&b, "{\"status\": \"ok\", \"model\": ");
    sj_str(&b, S->model_name);
    long per_token = (long)ks_model_n_layers(S->m) * ks_model_n_kv_heads(S->m);
    sj_printf(&b, ", \"active\": %d, \"peak_active\": %d, \"queued\": %d, \"kv_rows\": %ld, \"kv_tokens\": %ld, \"kv_tokens_reserved\": %ld, \"max_kv_tokens\": %ld, "
                  "\"max_batch\": %d, \"requests\": %ld, \"completed\": %ld, \"cancelled\": %ld, \"errors\": %ld, "
                  "\"rejected\": %ld, \"tokens_generated\": %ld}",
              st.active, st.peak_active, st.queued, st.kv_rows, (st.kv_rows + per_token - 1) / per_token, st.kv_reserved, S->o.max_kv_tokens,
              S->o.max_batch, st.requests,
              st.completed, st.cancelled, st.errors, st.rejected, st.tokens_generated);
    send_json(req, 200, b.oom ? "{}" : b.p);
    sj_free(&b);
}

static void models(srv_state *S, struct evhttp_request *req) {
    sj_buf b = {0};
    sj_cat(&b, "{\"object\": \"list\", \"data\": [{\"id\": ");
    sj_str(&b, S->model_name);
    sj_printf(&b, ", \"object\": \"model\", \"created\": 0, \"owned_by\": \"kvsieve\", \"max_model_len\": %d}]}", S->max_context);
    send_json(req, 200, b.oom ? "{}" : b.p);
    sj_free(&b);
}

static void reject(srv_state *S, struct evhttp_request *req, const srv_error *e) {
    pthread_mutex_lock(&S->mu);
    S->st.rejected++;
    pthread_mutex_unlock(&S->mu);
    if (e->http == 429) evhttp_add_header(evhttp_request_get_output_headers(req), "Retry-After", "1");
    send_error(req, e);
}

static void completion(srv_state *S, struct evhttp_request *req, int chat) {
    srv_error e;
    struct evbuffer *in = evhttp_request_get_input_buffer(req);
    size_t len = evbuffer_get_length(in);
    const char *body = len ? (const char *)evbuffer_pullup(in, -1) : "";
    srv_job *j = calloc(1, sizeof *j);
    if (!j) { srv_err(&e, 503, "server_error", "out_of_memory", "out of memory"); reject(S, req, &e); return; }
    if (srv_parse_request(body, len, chat, &j->p, &e)) { free(j); reject(S, req, &e); return; }
    int bad = 0;
    if (j->p.policy_kind == SRV_POL_INLINE && S->o.no_inline)
        bad = (srv_err(&e, 403, "permission_error", "policy_forbidden", "inline policies are off on this server (--no-inline-policies)"), 1);
    else if (j->p.policy_kind == SRV_POL_PATH && S->o.no_path)
        bad = (srv_err(&e, 403, "permission_error", "policy_forbidden", "policies by path are off on this server (--no-path-policies)"), 1);
    else if (j->p.model && strcmp(j->p.model, S->model_name))
        bad = (srv_err(&e, 404, "invalid_request_error", "model_not_found", "the model '%.100s' does not exist (this server has '%s')",
                       j->p.model, S->model_name), 1);
    if (!bad) {
        pthread_mutex_lock(&S->mu);
        if (S->st.queued >= S->o.max_queue) {
            bad = 1;
            srv_err(&e, 429, "rate_limit_error", "queue_full", "%d requests are waiting already (--max-queue); retry later", S->st.queued);
        } else {
            j->id = ++S->next_id;
            j->req = req;
            if (S->q_tail) S->q_tail->next = j; else S->q_head = j;
            S->q_tail = j;
            S->st.queued++;
            S->st.requests++;
            pthread_cond_signal(&S->cv);
        }
        pthread_mutex_unlock(&S->mu);
    }
    if (bad) { job_free(j); reject(S, req, &e); return; }
    struct evhttp_connection *c = evhttp_request_get_connection(req);
    if (c) evhttp_connection_set_closecb(c, on_close, j);
    pending_add(S, j);
}

static void route(struct evhttp_request *req, void *arg) {
    srv_state *S = arg;
    const char *path = evhttp_uri_get_path(evhttp_request_get_evhttp_uri(req));
    enum evhttp_cmd_type cmd = evhttp_request_get_command(req);
    srv_error e;
    struct { const char *path; int post; } R[] = {
        {"/health", 0}, {"/v1/models", 0}, {"/v1/completions", 1}, {"/v1/chat/completions", 1}};
    int r = -1;
    for (int i = 0; i < 4; i++)
        if (path && !strcmp(path, R[i].path)) r = i;
    if (r < 0) {
        srv_err(&e, 404, "invalid_request_error", "not_found", "no such endpoint: %.200s", path ? path : "?");
        reject(S, req, &e);
    } else if ((cmd == EVHTTP_REQ_POST) != R[r].post) {
        srv_err(&e, 405, "invalid_request_error", "method_not_allowed", "%s takes %s", R[r].path, R[r].post ? "POST" : "GET");
        evhttp_add_header(evhttp_request_get_output_headers(req), "Allow", R[r].post ? "POST" : "GET");
        reject(S, req, &e);
    } else if (r == 0) {
        health(S, req);
    } else if (r == 1) {
        models(S, req);
    } else {
        completion(S, req, r == 3);
    }
}

static void on_signal(evutil_socket_t sig, short what, void *arg) { event_base_loopexit(arg, NULL); }

/* ---------------------------------------------------------------- run */

int srv_http_run(srv_state *S) {
    struct event_base *base = event_base_new();
    struct evhttp *http = base ? evhttp_new(base) : NULL;
    if (!http) {
        fprintf(stderr, "kvsieve: serve: cannot start the event loop\n");
        if (base) event_base_free(base);
        return 1;
    }
    evhttp_set_max_body_size(http, SRV_MAX_BODY);
    evhttp_set_max_headers_size(http, 64 * 1024);
    evhttp_set_timeout(http, S->o.timeout_s);
    evhttp_set_allowed_methods(http, EVHTTP_REQ_GET | EVHTTP_REQ_POST);
    evhttp_set_default_content_type(http, "application/json");
    evhttp_set_gencb(http, route, S);
    struct evhttp_bound_socket *bs = evhttp_bind_socket_with_handle(http, S->o.host, (ev_uint16_t)S->o.port);
    int rc = 1;
    if (!bs) {
        fprintf(stderr, "kvsieve: serve: cannot listen on %s:%d: %s\n", S->o.host, S->o.port, strerror(errno));
        goto out;
    }
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    int port = S->o.port;
    if (getsockname(evhttp_bound_socket_get_fd(bs), (struct sockaddr *)&ss, &sl) == 0)
        port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port : ((struct sockaddr_in *)&ss)->sin_port);
    fcntl(S->wake[0], F_SETFL, O_NONBLOCK);
    struct event *wake = event_new(base, S->wake[0], EV_READ | EV_PERSIST, wake_cb, S);
    struct event *si = evsignal_new(base, SIGINT, on_signal, base), *st = evsignal_new(base, SIGTERM, on_signal, base);
    struct event *watch = event_new(base, -1, EV_PERSIST, watch_cb, S);
    struct timeval every = {0, 100 * 1000}; /* 0.1 s */
    if (!wake || !si || !st || !watch || event_add(wake, NULL) || event_add(si, NULL) || event_add(st, NULL) ||
        event_add(watch, &every)) {
        fprintf(stderr, "kvsieve: serve: cannot set up the event loop\n");
    } else {
        fprintf(stderr, "kvsieve: serve: listening on http://%s:%d (model %s, batch %d, %ld KV tokens)\n", S->o.host, port,
                S->model_name, S->o.max_batch, S->o.max_kv_tokens);
        fflush(stderr);
        rc = event_base_dispatch(base) < 0;
        fprintf(stderr, "kvsieve: serve: stopped\n");
        /* the scheduler's last messages: stop it, then free what it posts */
        pthread_mutex_lock(&S->mu);
        S->stopping = 1;
        pthread_cond_signal(&S->cv);
        pthread_mutex_unlock(&S->mu);
    }
    if (watch) event_free(watch);
    if (wake) event_free(wake);
    if (si) event_free(si);
    if (st) event_free(st);
out:
    evhttp_free(http);
    event_base_free(base);
    return rc;
}

/* After the scheduler has stopped: free the jobs of the messages nobody delivered. */
void srv_http_drain(srv_state *S) {
    srv_msg *m = S->mb_head;
    S->mb_head = S->mb_tail = NULL;
    while (m) {
        srv_msg *nx = m->next;
        free(m->body);
        if (m->last) job_free(m->job);
        free(m);
        m = nx;
    }
}
