/* cuda_graph.cu — the CUDA backend's decode-step graphs (graph_begin / graph_end / graph_run /
 * graph_free, segments, joins and decode handlers' recordings; cuda_backend_int.h). While a step is recorded (cuda_ctx.rec), the operations of the
 * other files record instead of run, and fail the recording (rec_fail) where a call could not
 * be replayed. */
#include "cuda_backend_int.h"

#include <stdlib.h>
#include <string.h>

struct ks_graph {
    cudaGraphExec_t exec;
    cudaGraph_t tmpl;      /* the recorded graph, kept for graph_join (its child graphs) */
    int32_t pos0;          /* position at graph_begin */
    unsigned rc_gen;
    int owns;              /* may launch handlers' blocks (a handler's recording, or a join of one) */
    int handler;           /* a decode handler's recording (graph_begin_handler) */
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
        kg->owns = kg->handler = 1;
        cuda_own_graphs(c, 1);
    }
    *out = kg;
    return KS_OK;
}

/* The segments as one graph, so the step runs as one launch and the kernels of consecutive
 * segments follow each other as inside one recording. Where a decode handler's recording is
 * among them, their nodes are copied into it (graph_inline), each segment behind the one before,
 * with a programmatic edge where a list attention follows a handler's last kernel; otherwise
 * (held steps), or where a segment holds a node graph_inline does not copy, each segment is a
 * child graph node. */
static void cu_graph_free(ks_backend *b, ks_graph *g);

/* A join's work uploaded to the device now, in stream order behind the work queued (the decode
 * step that made it, core/decode.c dec_hjoin), so that its first launch does not pay it; one
 * that fails is left to that launch. */
static void join_upload(cuda_ctx *c, ks_graph *g) {
    if (cudaGraphUpload(g->exec, c->stream) != cudaSuccess) cudaGetLastError();
}

/* src's nodes and edges copied into g (kernel nodes with their launch attributes, copies,
 * memsets, empty nodes; each edge with its data), each root of src behind all n_prev nodes prev;
 * *leaves (malloc'd, *n_leaves) gets the copies of src's leaves. A root kernel that waits late
 * (ks_cuda_attn_decode_tc_waits_late) behind a single kernel leaf gets a programmatic edge from
 * that kernel's launch completion: its blocks start once the kernel before has started them all,
 * and wait (griddepcontrol.wait) for its end only where they read what it may have written.
 * *n_prog counts those edges. Another kind of node is cudaErrorNotSupported. */
static cudaError_t graph_inline(cuda_ctx *c, cudaGraph_t g, cudaGraph_t src, const cudaGraphNode_t *prev, size_t n_prev,
                                int after_handler, cudaGraphNode_t **leaves, size_t *n_leaves, int *n_prog) {
    size_t n = 0, ne = 0;
    *leaves = NULL;
    *n_leaves = 0;
    cudaError_t e = cudaGraphGetNodes(src, NULL, &n);
    if (!e) e = cudaGraphGetEdges(src, NULL, NULL, NULL, &ne);
    if (e) return e;
    cudaGraphNode_t *nd = (cudaGraphNode_t *)calloc(2 * n + 1, sizeof *nd), *cp = nd ? nd + n : NULL;
    cudaGraphNode_t *from = (cudaGraphNode_t *)calloc(2 * ne + 1, sizeof *from), *to = from ? from + ne : NULL;
    cudaGraphEdgeData *ed = (cudaGraphEdgeData *)calloc(ne + 1, sizeof *ed);
    char *in = (char *)calloc(2 * n + 1, 1), *outd = in ? in + n : NULL; /* node i has an incoming / outgoing edge */
    const void **fn = (const void **)calloc(n + 1, sizeof *fn);                /* a kernel node's function */
    *leaves = (cudaGraphNode_t *)calloc(n + 1, sizeof **leaves);
    if (!nd || !from || !ed || !in || !fn || !*leaves) e = cudaErrorMemoryAllocation;
    if (!e && n) e = cudaGraphGetNodes(src, nd, &n); /* (an empty recording: a handler that queued nothing) */
    if (!e && ne) e = cudaGraphGetEdges(src, from, to, ed, &ne);
    for (size_t i = 0; !e && i < n; i++) {
        cudaGraphNodeType t;
        if ((e = cudaGraphNodeGetType(nd[i], &t))) break;
        if (t == cudaGraphNodeTypeKernel) {
            cudaKernelNodeParams kp;
            if (!(e = cudaGraphKernelNodeGetParams(nd[i], &kp)) && !(e = cudaGraphAddKernelNode(&cp[i], g, NULL, 0, &kp)))
                e = cudaGraphKernelNodeCopyAttributes(cp[i], nd[i]);
            fn[i] = kp.func;
        } else if (t == cudaGraphNodeTypeMemcpy) {
            cudaMemcpy3DParms mp;
            if (!(e = cudaGraphMemcpyNodeGetParams(nd[i], &mp))) e = cudaGraphAddMemcpyNode(&cp[i], g, NULL, 0, &mp);
        } else if (t == cudaGraphNodeTypeMemset) {
            cudaMemsetParams ms;
            if (!(e = cudaGraphMemsetNodeGetParams(nd[i], &ms))) e = cudaGraphAddMemsetNode(&cp[i], g, NULL, 0, &ms);
        } else if (t == cudaGraphNodeTypeEmpty) {
            e = cudaGraphAddEmptyNode(&cp[i], g, NULL, 0);
        } else {
            e = cudaErrorNotSupported;
        }
    }
    for (size_t j = 0; !e && j < ne; j++) {
        size_t a = n, c = n;
        for (size_t i = 0; i < n; i++) { /* a segment holds tens of nodes: a scan is enough */
            if (nd[i] == from[j]) a = i;
            if (nd[i] == to[j]) c = i;
        }
        if (a == n || c == n) { e = cudaErrorInvalidValue; break; }
        outd[a] = in[c] = 1;
        e = cudaGraphAddDependencies(g, &cp[a], &cp[c], &ed[j], 1);
    }
    int prev_kernel = 0;
    if (!e && n_prev == 1) {
        cudaGraphNodeType t;
        prev_kernel = !cudaGraphNodeGetType(prev[0], &t) && t == cudaGraphNodeTypeKernel;
    }
    for (size_t i = 0; !e && i < n; i++) {
        if (!in[i] && n_prev) {
            if (prev_kernel && after_handler && ks_cuda_attn_decode_tc_waits_late(fn[i])) {
                cudaGraphEdgeData pe;
                memset(&pe, 0, sizeof pe);
                pe.type = cudaGraphDependencyTypeProgrammatic;
                pe.from_port = cudaGraphKernelNodePortLaunchCompletion;
                e = cudaGraphAddDependencies(g, &prev[0], &cp[i], &pe, 1);
                if (!e) (*n_prog)++;
                /* its blocks wait for the top-k: they stage the query and prefetch the layer's
                 * o-projection meanwhile (hints: where they cannot be set the node stays as it was) */
                const void *k = NULL;
                const cu_wnext *wn = NULL;
                if (!e && !ks_cuda_attn_decode_tc_node_k(cp[i], &k)) wn = cu_wnext_of(c, k);
                if (!e && !ks_cuda_attn_decode_tc_node_edge(cp[i], wn ? wn->w : NULL, wn ? wn->bytes : 0) && wn)
                    c->pf_nodes++;
                cudaGetLastError();
            } else {
                for (size_t j = 0; !e && j < n_prev; j++) e = cudaGraphAddDependencies(g, &prev[j], &cp[i], NULL, 1);
            }
        }
        if (!outd[i]) (*leaves)[(*n_leaves)++] = cp[i];
    }
    free(nd);
    free(from);
    free(ed);
    free(in);
    free(fn);
    return e;
}

/* The segments' nodes in one graph (graph_inline), each segment behind the leaves of the one
 * before (an empty recording passes its predecessor on): no child graph boundary between them,
 * and a list attention that waits late starts while the policy's last kernel (TokenSelect's
 * top-k) runs: ~2.5 us a call sooner at its end, TokenSelect's TPOT -0.04 ms at 32K and -0.07 ms
 * at 128K on an H100 (bench/NOTES.md, issue 14, session 36). */
static cudaError_t graph_flat(cuda_ctx *c, cudaGraph_t g, ks_graph *const *segs, int n, int *n_prog) {
    cudaGraphNode_t *prev = NULL;
    size_t n_prev = 0;
    cudaError_t e = cudaSuccess;
    int after_handler = 0; /* the last segment with nodes was a decode handler's recording */
    for (int i = 0; !e && i < n; i++) {
        cudaGraphNode_t *lv = NULL;
        size_t nl = 0;
        e = graph_inline(c, g, segs[i]->tmpl, prev, n_prev, after_handler, &lv, &nl, n_prog);
        if (!e && nl == 0) { /* an empty recording: the next one follows the one before it */
            free(lv);
            continue;
        }
        free(prev);
        prev = lv;
        n_prev = nl;
        after_handler = segs[i]->handler;
    }
    free(prev);
    return e;
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
    int n_prog = 0, handlers = 0;
    for (int i = 0; i < n; i++) handlers += segs[i]->handler;
    cudaError_t e = cudaGraphCreate(&g, 0);
    /* flat where an edge may be made (a handler's recording among the segments); child graphs
     * for the rest (held steps), or where a segment holds a node graph_inline does not copy */
    const int flat = !e && handlers && !graph_flat(c, g, segs, n, &n_prog);
    if (!e && !flat) {
        if (handlers) { /* the copy failed part way: start again */
            cudaGetLastError();
            cudaGraphDestroy(g);
            g = NULL;
            n_prog = 0;
            e = cudaGraphCreate(&g, 0);
        }
        cudaGraphNode_t prev = NULL;
        for (int i = 0; !e && i < n; i++) {
            cudaGraphNode_t node;
            e = cudaGraphAddChildGraphNode(&node, g, prev ? &prev : NULL, prev ? 1 : 0, segs[i]->tmpl);
            prev = node;
        }
    }
    c->prog_edges += n_prog;
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

extern "C" int ks_cuda_backend_prog_edges(ks_backend *b) {
    return CTX(b)->prog_edges;
}

extern "C" int ks_cuda_backend_prefetch_nodes(ks_backend *b) {
    return CTX(b)->pf_nodes;
}
