/* pool.h — a small thread pool whose idle workers sleep.
 *
 * The CPU backend runs its parallel loops here instead of OpenMP. OpenMP's workers spin while
 * they wait for the next loop; on a machine where another process holds a core, a spinning
 * worker and the thread it waits for fight for that core, and decode slowed 50x (issue 12).
 * Here a worker with nothing to do blocks on a condition variable, so a busy neighbour costs
 * in proportion to the cores it takes.
 *
 *   ks_pool_create(n, &p)    n threads in all, the caller included (n <= 0: usable CPUs)
 *   ks_pool_run(p, T, fn, c) calls fn(c, t, thread) once for every task t in [0, T), spread
 *                            over the threads; returns when every task has returned.
 *
 * Determinism is the caller's side of the contract: a task must write only its own outputs
 * and compute them the same way whichever thread runs it, so that results never depend on the
 * thread count (tests/test_determinism.c checks the backend's ops under 1, 2 and 3 threads).
 *
 * A run from inside a task (nested), or on a pool of one thread, runs its tasks in order on the
 * calling thread. Two host threads may share a pool: their runs take turns. */
#ifndef KS_POOL_H
#define KS_POOL_H

#include "common.h"

typedef struct ks_pool ks_pool;

/* fn(ctx, task, thread): thread in [0, ks_pool_threads(p)) names the thread running the task
 * (per-thread scratch); the task index alone must decide what the task computes. */
typedef void (*ks_pool_fn)(void *ctx, int64_t task, int thread);

/* n_threads <= 0: the CPUs this process may run on (its affinity mask; at most 256). KS_ERR_OOM or KS_ERR_INTERNAL
 * (a thread could not be started), with the message recorded. */
ks_status ks_pool_create(int n_threads, ks_pool **out);
void ks_pool_free(ks_pool *p);
int ks_pool_threads(const ks_pool *p);
void ks_pool_run(ks_pool *p, int64_t n_tasks, ks_pool_fn fn, void *ctx);

#endif
