/* cuda_prof.cu — the CUDA backend's profiling marks (prof_mark / prof_collect: CUDA events on
 * the stream, resolved in batches) and its ceilings (the GEMM and copy rates of the device, for
 * kvsieve bench; cuda_backend_int.h). */
#include "cuda_backend_int.h"
#include "ceilings.cuh"

#include <stdlib.h>
#include <string.h>

#define PROF_CAP 4096 /* profiling events in flight before a batch is resolved */

static ks_status cu_ceilings(ks_backend *b, double *gemm_tflops, double *copy_gbs) {
    cuda_ctx *c = CTX(b);
    cudaError_t e = cudaStreamSynchronize(c->stream);
    if (e) return ks_cuda_status(e, "ceilings");
    return ks_cuda_ceilings(gemm_tflops, copy_gbs);
}

/* Resolve the recorded marks: wait for the last, book each interval to its tag, keep the last
 * event as the start of the next batch. */
static ks_status prof_flush(cuda_ctx *c) {
    if (c->pn < 2) return KS_OK;
    KS_CU(cudaEventSynchronize(c->pev[c->pn - 1]), "profiling (or an earlier kernel)");
    for (int i = 1; i < c->pn; i++) {
        if (c->ptag[i] < 0) continue;
        float ms = 0;
        KS_CU(cudaEventElapsedTime(&ms, c->pev[i - 1], c->pev[i]), "profiling (event time)");
        c->pacc[c->ptag[i]] += ms * 1e-3;
    }
    cudaEvent_t last = c->pev[c->pn - 1];
    c->pev[c->pn - 1] = c->pev[0];
    c->pev[0] = last;
    c->ptag[0] = -1;
    c->pn = 1;
    return KS_OK;
}

static ks_status cu_prof_mark(ks_backend *b, int tag) {
    cuda_ctx *c = CTX(b);
    if (tag >= KS_PROF_TAGS) return ks_errorf(KS_ERR_ARG, "profiling: tag %d out of range [0, %d)", tag, KS_PROF_TAGS);
    if (c->pn == c->pcap) {
        if (c->pcap < PROF_CAP) { /* grow: more events */
            int ncap = c->pcap ? c->pcap * 2 : 256;
            cudaEvent_t *ne = (cudaEvent_t *)ks_realloc(c->pev, sizeof *ne * ncap);
            if (!ne) return KS_ERR_OOM;
            c->pev = ne;
            int *nt = (int *)ks_realloc(c->ptag, sizeof *nt * ncap);
            if (!nt) return KS_ERR_OOM;
            c->ptag = nt;
            for (int i = c->pcap; i < ncap; i++) {
                cudaError_t e = cudaEventCreate(&c->pev[i]);
                if (e) { c->pcap = i; return ks_cuda_status(e, "profiling (event create)"); }
                c->pcap = i + 1;
            }
        } else {
            ks_status st = prof_flush(c);
            if (st) return st;
        }
    }
    KS_CU(cudaEventRecord(c->pev[c->pn], c->stream), "profiling (event record)");
    c->ptag[c->pn++] = tag;
    return KS_OK;
}

static ks_status cu_prof_collect(ks_backend *b, double *sec, int n_tags) {
    cuda_ctx *c = CTX(b);
    ks_status st = prof_flush(c);
    for (int t = 0; t < n_tags && t < KS_PROF_TAGS; t++) sec[t] += c->pacc[t];
    memset(c->pacc, 0, sizeof c->pacc);
    c->pn = 0; /* the next mark starts a new timeline */
    return st;
}

void cuda_prof_install(ks_backend *b) {
    b->ceilings = cu_ceilings;
    b->prof_mark = cu_prof_mark;
    b->prof_collect = cu_prof_collect;
}
