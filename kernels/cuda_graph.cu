/* cuda_graph.cu — the CUDA backend's decode-step graphs (graph_begin / graph_end / graph_run /
 * graph_free, segments, joins and decode handlers' recordings; cuda_backend_int.h). While a step is recorded (cuda_ctx.rec), the operations of the
 * other files record instead of run, and fail the recording (rec_fail) where a call could not
 * be replayed. */
#include "cuda_backend_int.h"

#include <stdlib.h>

struct ks_graph {
    cudaGraphExec_t exec;
    cudaGraph_t tmpl;      /* the recorded graph, kept for graph_join (its child graphs) */
    int32_t pos0;          /* position at graph_begin */
    unsigned rc_gen;
    int owns;              /* may launch handlers' blocks (a handler's recording, or a join of one) */
};

/* Recording: the stream is captured (relaxed mode: nothing else on the host is restricted);
 * the graph's first node copies the pinned step slot to the device, where the recorded embed,
 * q|k|v and attention kernels read it: {id, pos, delta, pos, 0}. Embed reads word 0; the q|k|v
 * kernel {pos, delta} (its row: the recorded one + delta); attention {pos, delta} (counts grow
 * with the step), or {pos, 0} over a layer whose recorded step wrote its row inside it (a KV
 * ring, cuda_attn.cu: the counts stay). */
static void step_slot(int32_t *h, int32_t id, int32_t pos, int32_t delta) {
    h[0] = id;
    h[1] = pos;
    h[2] = delta;
    h[3] = pos;
    h[4] = 0;
}

static ks_status cu_graph_begin(ks_backend *b, int32_t id, int32_t pos) {
    cuda_ctx *c = CTX(b);
    if (c->rec) return ks_errorf(KS_ERR_INTERNAL, "cuda: graph_begin while recording");
    if (!c->h_step || !c->d_step || !c->gws) return ks_errorf(KS_ERR_INTERNAL, "cuda: no decode graph buffers");
    KS_CU(cudaStreamSynchronize(c->stream), "decode graph (an earlier kernel failed)"); /* h_step is free */
    step_slot(c->h_step, id, pos, 0);
    KS_CU(cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeRelaxed), "decode graph: begin capture");
    c->rec = 1;
    c->rec_failed = 0;
    cudaError_t e = cudaMemcpyAsync(c->d_step, c->h_step, KS_CUDA_STEP_WORDS * sizeof(int32_t), cudaMemcpyHostToDevice, c->stream);
    if (e) {
        cudaGraph_t g = NULL;
        cudaStreamEndCapture(c->stream, &g);
        if (g) cudaGraphDestroy(g);
        cudaGetLastError();
        c->rec = 0;
        return ks_cuda_status(e, "decode graph: step slot copy");
    }
    return KS_OK;
}

/* A later segment of the step graph_run started: captured like the first, without the slot copy
 * (its kernels read the slot that the first segment's copy filled) and without a sync (the
 * previous segment may still run: the capture only records). */
static ks_status cu_graph_begin_seg(ks_backend *b) {
    cuda_ctx *c = CTX(b);
    if (c->rec) return ks_errorf(KS_ERR_INTERNAL, "cuda: graph_begin_seg while recording");
    if (!c->d_step) return ks_errorf(KS_ERR_INTERNAL, "cuda: no decode graph buffers");
    KS_CU(cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeRelaxed), "decode graph: begin capture (segment)");
    c->rec = 1;
    c->rec_failed = 0;
    return KS_OK;
}

/* A decode handler's segment (graph_begin_handler): as graph_begin_seg, with the memory it
 * allocates from the handlers' blocks (cuda_ctx.rec_own, cuda_ctx.cu own_alloc: fixed addresses
 * for every replay) and its primitives' growth read from the step slot (cuda_prims.cu). */
static ks_status cu_graph_begin_handler(ks_backend *b) {
    ks_status st = cu_graph_begin_seg(b);
    if (!st) CTX(b)->rec_own = 1;
    return st;
}

static ks_status cu_graph_end(ks_backend *b, ks_graph **out) {
    cuda_ctx *c = CTX(b);
    *out = NULL;
    if (!c->rec) return ks_errorf(KS_ERR_INTERNAL, "cuda: graph_end without graph_begin");
    const int own = c->rec_own;
    c->rec = 0;
    c->rec_own = 0;
    cudaGraph_t g = NULL;
    cudaError_t e = cudaStreamEndCapture(c->stream, &g);
    if (c->rec_failed || e || !g) {
        if (g) cudaGraphDestroy(g);
        if (e) {
            cudaGetLastError();
            if (!c->rec_failed) ks_errorf(KS_ERR_UNSUPPORTED, "cuda: decode graph capture failed (%s)", cudaGetErrorString(e));
        }
        if (own) cuda_own_graphs(c, 0);
        return KS_ERR_UNSUPPORTED;
    }
    ks_graph *kg = (ks_graph *)ks_calloc(1, sizeof *kg);
    if (!kg) { cudaGraphDestroy(g); if (own) cuda_own_graphs(c, 0); return KS_ERR_OOM; }
    e = cudaGraphInstantiate(&kg->exec, g, 0);
    if (e) {
        cudaGraphDestroy(g);
        cudaGetLastError();
        free(kg);
        if (own) cuda_own_graphs(c, 0);
        return ks_errorf(KS_ERR_UNSUPPORTED, "cuda: decode graph instantiation failed (%s)", cudaGetErrorString(e));
    }
    kg->tmpl = g;
    kg->pos0 = c->h_step[1];
    kg->rc_gen = c->rc_gen;
    if (own) {
        kg->owns = 1;
        cuda_own_graphs(c, 1);
    }
    *out = kg;
    return KS_OK;
}

/* The segments as one graph: each a child graph node (a copy of its recording), each depending
 * on the one before, so the step runs as one launch; the kernels of consecutive segments follow
 * each other as inside one recording, without the gap of a graph launch between them. */
static void cu_graph_free(ks_backend *b, ks_graph *g);

/* A join's work uploaded to the device now, in stream order behind the work queued (the decode
 * step that made it, core/decode.c dec_hjoin), so that its first launch does not pay it; one
 * that fails is left to that launch. */
static void join_upload(cuda_ctx *c, ks_graph *g) {
    if (cudaGraphUpload(g->exec, c->stream) != cudaSuccess) cudaGetLastError();
}

static ks_status cu_graph_join(ks_backend *b, ks_graph *const *segs, int n, ks_graph **out) {
    cuda_ctx *c = CTX(b);
    ks_graph *old = *out; /* an earlier join the caller gives up: updated in place where it can be */
    *out = NULL;
    if (c->rec) { cu_graph_free(b, old); return ks_errorf(KS_ERR_INTERNAL, "cuda: graph_join while recording"); }
    if (n < 1) { cu_graph_free(b, old); return ks_errorf(KS_ERR_INTERNAL, "cuda: graph_join of no segment"); }
    for (int i = 0; i < n; i++)
        if (!segs[i] || !segs[i]->tmpl || segs[i]->rc_gen != segs[0]->rc_gen) {
            cu_graph_free(b, old);
            return ks_errorf(KS_ERR_UNSUPPORTED, "cuda: segment %d cannot be joined (no recording, or another device table)", i);
        }
    cudaGraph_t g = NULL;
    cudaGraphNode_t prev = NULL;
    cudaError_t e = cudaGraphCreate(&g, 0);
    for (int i = 0; !e && i < n; i++) {
        cudaGraphNode_t node;
        e = cudaGraphAddChildGraphNode(&node, g, prev ? &prev : NULL, prev ? 1 : 0, segs[i]->tmpl);
        prev = node;
    }
    if (!e && old && old->rc_gen == segs[0]->rc_gen) {
        /* the same chain of segments with other handlers' recordings (a policy recorded anew, its
         * kernels the same, their arguments not): an update costs a fraction of an instantiation */
        cudaGraphExecUpdateResultInfo info;
        if (cudaGraphExecUpdate(old->exec, g, &info) == cudaSuccess) {
            cudaGraphDestroy(g);
            int owns = 0;
            for (int i = 0; i < n && !owns; i++) owns = segs[i]->owns;
            if (owns != old->owns) cuda_own_graphs(c, owns ? 1 : -1);
            old->owns = owns;
            old->pos0 = segs[0]->pos0;
            join_upload(c, old);
            *out = old;
            return KS_OK;
        }
        cudaGetLastError(); /* another shape of graph: a new instantiation */
    }
    cu_graph_free(b, old);
    ks_graph *kg = NULL;
    if (!e && !(kg = (ks_graph *)ks_calloc(1, sizeof *kg))) {
        if (g) cudaGraphDestroy(g);
        return KS_ERR_OOM;
    }
    if (!e) e = cudaGraphInstantiate(&kg->exec, g, 0);
    if (e) {
        if (g) cudaGraphDestroy(g);
        cudaGetLastError();
        free(kg);
        return ks_errorf(KS_ERR_UNSUPPORTED, "cuda: joining %d decode segments failed (%s)", n, cudaGetErrorString(e));
    }
    cudaGraphDestroy(g); /* the executable holds what it needs; a joined graph is never joined again */
    kg->pos0 = segs[0]->pos0;
    kg->rc_gen = segs[0]->rc_gen;
    for (int i = 0; i < n && !kg->owns; i++) kg->owns = segs[i]->owns;
    if (kg->owns) cuda_own_graphs(c, 1);
    join_upload(c, kg);
    *out = kg;
    return KS_OK;
}

static ks_status cu_graph_run(ks_backend *b, ks_graph *g, int32_t id, int32_t pos) {
    cuda_ctx *c = CTX(b);
    if (c->rec) return ks_errorf(KS_ERR_INTERNAL, "cuda: graph_run while recording");
    if (g->rc_gen != c->rc_gen) return ks_errorf(KS_ERR_UNSUPPORTED, "cuda: decode graph reads a replaced device table (rope inv_freq, one-row MLP buffers)");
    /* the previous run's slot copy must be done before the slot is rewritten: every step ends
     * with a download that waits for the stream, so this only waits when a caller did not */
    KS_CU(cudaStreamSynchronize(c->stream), "decode graph (an earlier kernel failed)");
    step_slot(c->h_step, id, pos, pos - g->pos0);
    KS_CU(cudaGraphLaunch(g->exec, c->stream), "decode graph launch");
    return KS_OK;
}

/* A later segment: launched behind the work queued before it; the slot stays as the step's
 * graph_run set it (no sync: the host runs ahead, the segments queue). */
static ks_status cu_graph_launch(ks_backend *b, ks_graph *g) {
    cuda_ctx *c = CTX(b);
    if (c->rec) return ks_errorf(KS_ERR_INTERNAL, "cuda: graph_launch while recording");
    if (g->rc_gen != c->rc_gen) return ks_errorf(KS_ERR_UNSUPPORTED, "cuda: decode graph reads a replaced device table (rope inv_freq, one-row MLP buffers)");
    KS_CU(cudaGraphLaunch(g->exec, c->stream), "decode graph launch (segment)");
    return KS_OK;
}

static void cu_graph_free(ks_backend *b, ks_graph *g) {
    if (!g) return;
    cudaGraphExecDestroy(g->exec);
    if (g->tmpl) cudaGraphDestroy(g->tmpl);
    if (g->owns) cuda_own_graphs(CTX(b), -1); /* the last: handlers' blocks no user holds go back */
    free(g);
}

void cuda_graph_install(ks_backend *b) {
    /* off: every decode step launches its kernels one by one; so too without the fused one-row
     * kernels (opts.fused, opts.decode_kernels): only their q|k|v gemv writes the cache row at the
     * position the graph's step slot gives, so a step without it cannot be recorded */
    if (!b->opts.graphs || !b->opts.fused || !b->opts.decode_kernels) return;
    b->graph_begin = cu_graph_begin;
    b->graph_end = cu_graph_end;
    b->graph_run = cu_graph_run;
    b->graph_free = cu_graph_free;
    b->graph_begin_seg = cu_graph_begin_seg;
    b->graph_launch = cu_graph_launch;
    b->graph_join = cu_graph_join;
    b->graph_begin_handler = cu_graph_begin_handler;
    b->attn_stage = cuda_attn_stage; /* cuda_attn.cu: lists a recorded attention reads */
}
