/* ktrace.c — a device timeline for any CUDA program, without a profiler binary: a library the
 * CUDA driver loads through CUDA_INJECTION64_PATH, which asks CUPTI for the activity records of
 * every kernel, memcpy and memset (graph-launched ones too) and writes them, one line each, to
 * the file KTRACE_OUT names (default ktrace.csv) when the program exits:
 *   K|C|S,start_ns,end_ns,stream,graph_node,name      (C: memcpy, its kind as the name; S: memset)
 *   R,start_ns,end_ns,thread,0,name                    (a CUDA runtime call of the host: the time the
 *                                                       host spent in it, on the same clock)
 * The device machine has ncu but no nsys; ncu serialises kernels and so cannot show the gaps
 * between them, which is what a decode step's launches cost. bench/ktrace.py sums a run's
 * decode steps from this file. Build (CUDA 13; not part of `make`):
 *   cc -O2 -shared -fPIC -I$CUDA_HOME/include bench/ktrace.c -o build-cuda/ktrace.so \
 *      -L$CUDA_HOME/lib64 -lcupti
 * Run: CUDA_INJECTION64_PATH=$PWD/build-cuda/ktrace.so KTRACE_OUT=t.csv build-cuda/kvsieve bench ...
 * A development tool: it prints to stderr, reads the environment, and is never linked into the
 * library. */
#include <cupti.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static FILE *g_out;

static void CUPTIAPI buf_request(uint8_t **buf, size_t *size, size_t *max_records) {
    *size = (size_t)16 << 20;
    *buf = aligned_alloc(8, *size);
    *max_records = 0;
}

static void CUPTIAPI buf_complete(CUcontext ctx, uint32_t stream, uint8_t *buf, size_t size, size_t valid) {
    (void)ctx, (void)stream, (void)size;
    CUpti_Activity *r = NULL;
    while (g_out && cuptiActivityGetNextRecord(buf, valid, &r) == CUPTI_SUCCESS) {
        if (r->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || r->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
            const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)r;
            fprintf(g_out, "K,%llu,%llu,%u,%u,%s\n", (unsigned long long)k->start, (unsigned long long)k->end,
                    k->streamId, k->graphNodeId ? 1u : 0u, k->name ? k->name : "?");
        } else if (r->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
            const CUpti_ActivityMemcpy6 *m = (const CUpti_ActivityMemcpy6 *)r;
            fprintf(g_out, "C,%llu,%llu,%u,%u,memcpy%u_%llu\n", (unsigned long long)m->start, (unsigned long long)m->end,
                    m->streamId, m->graphNodeId ? 1u : 0u, (unsigned)m->copyKind, (unsigned long long)m->bytes);
        } else if (r->kind == CUPTI_ACTIVITY_KIND_RUNTIME) {
            const CUpti_ActivityAPI *a = (const CUpti_ActivityAPI *)r;
            const char *name = NULL;
            if (cuptiGetCallbackName(CUPTI_CB_DOMAIN_RUNTIME_API, a->cbid, &name) != CUPTI_SUCCESS || !name) name = "?";
            fprintf(g_out, "R,%llu,%llu,%u,0,%s\n", (unsigned long long)a->start, (unsigned long long)a->end,
                    (unsigned)a->threadId, name);
        } else if (r->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
            const CUpti_ActivityMemset4 *m = (const CUpti_ActivityMemset4 *)r;
            fprintf(g_out, "S,%llu,%llu,%u,%u,memset_%llu\n", (unsigned long long)m->start, (unsigned long long)m->end,
                    m->streamId, m->graphNodeId ? 1u : 0u, (unsigned long long)m->bytes);
        }
    }
    free(buf);
}

static void finish(void) {
    cuptiActivityFlushAll(1);
    if (g_out) fclose(g_out);
    g_out = NULL;
}

int InitializeInjection(void) {
    const char *path = getenv("KTRACE_OUT");
    g_out = fopen(path && *path ? path : "ktrace.csv", "w");
    if (!g_out) {
        fprintf(stderr, "ktrace: cannot write %s\n", path && *path ? path : "ktrace.csv");
        return 0;
    }
    if (cuptiActivityRegisterCallbacks(buf_request, buf_complete) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME) != CUPTI_SUCCESS) {
        fprintf(stderr, "ktrace: CUPTI refused the activity records\n");
        return 0;
    }
    atexit(finish);
    return 1;
}
