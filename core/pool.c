/* pool.c — the sleeping thread pool of pool.h.
 *
 * One job at a time: the caller publishes (fn, ctx, n_tasks) under the mutex, bumps the
 * generation and wakes the workers it needs; every participant (caller included) takes task
 * indices from one atomic counter until they run out; the caller then sleeps until the last
 * participating worker reports back. Workers block on `go` between jobs: no spinning. */
#include "pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#define POOL_MAX 256

struct ks_pool {
    int n;                      /* threads in all, the caller included */
    pthread_t *th;              /* (n - 1) workers */
    struct worker_arg *args;    /* (n - 1) */
    pthread_mutex_t run_mu;     /* one job at a time */
    pthread_mutex_t mu;         /* guards everything below */
    pthread_cond_t go, done;
    uint64_t gen;               /* bumped for every job */
    int quit;
    int want;                   /* workers 1..want take part in the current job */
    int active;                 /* of those, still running */
    ks_pool_fn fn;
    void *ctx;
    int64_t n_tasks;
    atomic_llong next;          /* the next task index to hand out */
};

struct worker_arg { ks_pool *p; int id; };

/* Set while this thread runs tasks of some pool: a nested run goes serial. */
static _Thread_local int tl_in_pool;

static void take_tasks(ks_pool *p, int id) {
    for (;;) {
        long long t = atomic_fetch_add_explicit(&p->next, 1, memory_order_relaxed);
        if (t >= p->n_tasks) break;
        p->fn(p->ctx, (int64_t)t, id);
    }
}

static void *worker(void *arg) {
    struct worker_arg *a = arg;
    ks_pool *p = a->p;
    uint64_t seen = 0;
    tl_in_pool = 1;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (p->gen == seen && !p->quit) pthread_cond_wait(&p->go, &p->mu);
        if (p->quit) break;
        seen = p->gen;
        if (a->id > p->want) continue; /* not needed for this job */
        pthread_mutex_unlock(&p->mu);
        take_tasks(p, a->id);
        pthread_mutex_lock(&p->mu);
        if (--p->active == 0) pthread_cond_signal(&p->done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

ks_status ks_pool_create(int n_threads, ks_pool **out) {
    *out = NULL;
    if (n_threads <= 0) { /* the CPUs this process may run on (taskset, cgroups), else all online */
        cpu_set_t set;
        long c = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = c > 0 ? (int)c : 1;
    }
    if (n_threads > POOL_MAX) n_threads = POOL_MAX;
    ks_pool *p = ks_calloc(1, sizeof *p);
    if (!p) return KS_ERR_OOM;
    p->n = 1;
    pthread_mutex_init(&p->run_mu, NULL);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->go, NULL);
    pthread_cond_init(&p->done, NULL);
    atomic_init(&p->next, 0);
    if (n_threads > 1) {
        p->th = ks_calloc((size_t)n_threads - 1, sizeof *p->th);
        p->args = ks_calloc((size_t)n_threads - 1, sizeof *p->args);
        if (!p->th || !p->args) { ks_pool_free(p); return KS_ERR_OOM; }
        for (int i = 0; i < n_threads - 1; i++) {
            p->args[i].p = p;
            p->args[i].id = i + 1;
            if (pthread_create(&p->th[i], NULL, worker, &p->args[i]) != 0) {
                ks_pool_free(p);
                return ks_errorf(KS_ERR_INTERNAL, "thread pool: cannot start thread %d of %d", i + 2, n_threads);
            }
            p->n++;
        }
    }
    *out = p;
    return KS_OK;
}

void ks_pool_free(ks_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->quit = 1;
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n - 1; i++) pthread_join(p->th[i], NULL);
    pthread_mutex_destroy(&p->run_mu);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->go);
    pthread_cond_destroy(&p->done);
    free(p->th);
    free(p->args);
    free(p);
}

int ks_pool_threads(const ks_pool *p) { return p ? p->n : 1; }

void ks_pool_run(ks_pool *p, int64_t n_tasks, ks_pool_fn fn, void *ctx) {
    if (n_tasks <= 0) return;
    if (!p || p->n == 1 || n_tasks == 1 || tl_in_pool) {
        for (int64_t t = 0; t < n_tasks; t++) fn(ctx, t, 0);
        return;
    }
    pthread_mutex_lock(&p->run_mu);
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->ctx = ctx;
    p->n_tasks = n_tasks;
    atomic_store_explicit(&p->next, 0, memory_order_relaxed);
    p->want = (int)KS_MIN((int64_t)p->n - 1, n_tasks - 1);
    p->active = p->want;
    p->gen++;
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    tl_in_pool = 1;
    take_tasks(p, 0);
    tl_in_pool = 0;
    pthread_mutex_lock(&p->mu);
    while (p->active > 0) pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
    pthread_mutex_unlock(&p->run_mu);
}
