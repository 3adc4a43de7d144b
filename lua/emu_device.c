/* emu_device.c — the emulated device: the CPU backend's primitives (core/cpu_prims.c) behind a
 * device backend of host memory at tagged addresses, so that lua/'s device-tensor path (device
 * views, ks_lt_on's uploads and downloads, host copies, the _device_mb budget, the move to the
 * host when an event ends) runs, and is tested, without a GPU: _device = "emulate" on the CPU
 * backend (ks_lua.h).
 *
 * An address is tagged by flipping bit 62, which makes it non-canonical on x86-64 (and out of
 * any mapping elsewhere): code that dereferences a device address without the backend faults at
 * once instead of silently working on host memory. Every entry untags its pointers and calls
 * the CPU table's entry, which already follows the device conventions (backend.h: counts and
 * cosine written through the output pointer, gather's error word, union in any order). */
#include "ks_lua.h"

#include "backend.h"
#include "common.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define EMU_TAG ((uintptr_t)1 << 62)
long ks_lua_emu_fail_in = 0;

void *ks_lua_emu_tag(const void *p) { return p ? (void *)((uintptr_t)p ^ EMU_TAG) : NULL; }
void *ks_lua_emu_untag(const void *p) { return p ? (void *)((uintptr_t)p ^ EMU_TAG) : NULL; }
#define U(p) ks_lua_emu_untag(p)
#define CPU ks_cpu_prims()

/* ================================================================ memory */

/* Every live block sits behind a header that links it into one list (under a mutex: several
 * sessions' policies may use the emulated device at once). The tag hides a block's address
 * from LeakSanitizer's scan for pointers, so without the list a device tensor still held by a
 * Lua state (kept across events, or garbage not yet collected) would read as a leak; the count
 * lets tests check that freeing their policies freed every block (ks_lua_emu_live). */
typedef struct emu_block {
    struct emu_block *prev, *next;
    size_t n;
    size_t pad; /* the data stays 16-byte aligned after a 32-byte header */
} emu_block;
static emu_block *emu_head;
static long emu_count;
static pthread_mutex_t emu_mu = PTHREAD_MUTEX_INITIALIZER;

long ks_lua_emu_live(void) {
    pthread_mutex_lock(&emu_mu);
    long n = emu_count;
    pthread_mutex_unlock(&emu_mu);
    return n;
}

static void *emu_alloc(ks_backend *b, size_t n) {
    if (ks_lua_emu_fail_in < 0 || (ks_lua_emu_fail_in > 0 && --ks_lua_emu_fail_in == 0)) {
        ks_lua_emu_fail_in = -1; /* from now on, until the test resets it */
        ks_errorf(KS_ERR_OOM, "emu: out of device memory allocating %zu bytes (injected failure)", n);
        return NULL;
    }
    emu_block *h = n > SIZE_MAX - sizeof(emu_block) ? NULL : malloc(sizeof(emu_block) + (n ? n : 1));
    if (!h) {
        ks_errorf(KS_ERR_OOM, "emu: out of memory allocating %zu bytes", n);
        return NULL;
    }
    h->n = n;
    h->prev = NULL;
    pthread_mutex_lock(&emu_mu);
    h->next = emu_head;
    if (emu_head) emu_head->prev = h;
    emu_head = h;
    emu_count++;
    pthread_mutex_unlock(&emu_mu);
    return ks_lua_emu_tag(h + 1);
}
static void emu_free(ks_backend *b, void *p) {
    if (!p) return;
    emu_block *h = (emu_block *)U(p) - 1;
    pthread_mutex_lock(&emu_mu);
    if (h->prev) h->prev->next = h->next;
    else emu_head = h->next;
    if (h->next) h->next->prev = h->prev;
    emu_count--;
    pthread_mutex_unlock(&emu_mu);
    free(h);
}
static ks_status emu_upload(ks_backend *b, void *dst, const void *src, size_t n) {
    if (n) memcpy(U(dst), src, n);
    return KS_OK;
}
static ks_status emu_download(ks_backend *b, void *dst, const void *src, size_t n) {
    if (n) memcpy(dst, U(src), n);
    return KS_OK;
}
static ks_status emu_copy(ks_backend *b, void *dst, const void *src, size_t n) {
    if (n) memmove(U(dst), U(src), n);
    return KS_OK;
}
static ks_status emu_sync(ks_backend *b) { return KS_OK; }
static ks_status emu_rope(ks_backend *b, float *x, int n, int n_heads, const int32_t *pos, const ks_rope *r, int max_pos) {
    float *h = U(x);
    ks_lua_rope_rows(h, h, n, n_heads, r->head_dim, pos, 0, r, max_pos);
    return KS_OK;
}

/* ================================================================ primitives: the CPU table on untagged pointers */

static ks_status e_scores(ks_backend *b, const float *q, const int32_t *qpos, int64_t hq, int64_t m, const void *k, int k_bf16,
                          const int32_t *kpos, int64_t hkv, int64_t n, int64_t d, const ks_scores_opts *o, float *out) {
    ks_scores_opts oc; /* skip is device memory (q_rope_inv host memory, as on a GPU) */
    if (o && o->skip) {
        oc = *o;
        oc.skip = U(o->skip);
        o = &oc;
    }
    return CPU->scores(NULL, U(q), U(qpos), hq, m, U(k), k_bf16, U(kpos), hkv, n, d, o, U(out));
}
static ks_status e_pool1d(ks_backend *b, const float *x, int64_t rows, int64_t n, int64_t kernel, ks_pool_mode mode, float *out) {
    return CPU->pool1d(NULL, U(x), rows, n, kernel, mode, U(out));
}
static ks_status e_topk(ks_backend *b, const float *x, int64_t rows, int64_t n, int64_t k, int64_t base,
                       ks_topk_order order, int32_t *oi,
                        float *ov, const float *skip, int64_t grow) {
    return CPU->topk(NULL, U(x), rows, n, k, base, order, U(oi), U(ov), U(skip), grow);
}
static ks_status e_argsort(ks_backend *b, const float *x, int64_t n, int desc, int32_t *oi) {
    return CPU->argsort(NULL, U(x), n, desc, U(oi));
}
static ks_status e_sort_f32(ks_backend *b, const float *x, int64_t n, int desc, float *out) {
    return CPU->sort_f32(NULL, U(x), n, desc, U(out));
}
static ks_status e_sort_i32(ks_backend *b, const int32_t *x, int64_t n, int32_t *out) { return CPU->sort_i32(NULL, U(x), n, U(out)); }
static ks_status e_rank(ks_backend *b, const float *x, int64_t n, int32_t *out) { return CPU->rank(NULL, U(x), n, U(out)); }
static ks_status e_unique(ks_backend *b, const int32_t *x, int64_t n, int32_t *out, int64_t *n_out) {
    return CPU->unique(NULL, U(x), n, U(out), U(n_out));
}
static ks_status e_union(ks_backend *b, const int32_t *a, int64_t na, const int32_t *bb, int64_t nb, int32_t *out, int64_t *n_out) {
    return CPU->union_(NULL, U(a), na, U(bb), nb, U(out), U(n_out));
}
static ks_status e_concat_i32(ks_backend *b, const int32_t *a, int64_t na, const int32_t *bb, int64_t nb, int32_t *out) {
    return CPU->concat_i32(NULL, U(a), na, U(bb), nb, U(out));
}
static ks_status e_concat_f32(ks_backend *b, const float *a, int64_t na, const float *bb, int64_t nb, float *out) {
    return CPU->concat_f32(NULL, U(a), na, U(bb), nb, U(out));
}
static ks_status e_arange(ks_backend *b, int64_t start, int64_t stop, int64_t step, int32_t *out) {
    return CPU->arange(NULL, start, stop, step, U(out));
}
static ks_status e_gather(ks_backend *b, const float *x, int64_t n, int64_t d, const int32_t *idx, int64_t k, float *out,
                          int64_t *err) {
    return CPU->gather(NULL, U(x), n, d, U(idx), k, U(out), U(err));
}
static ks_status e_gather_i32(ks_backend *b, const int32_t *x, int64_t n, const int32_t *idx, int64_t k, int32_t *out,
                              int64_t *err) {
    return CPU->gather_i32(NULL, U(x), n, U(idx), k, U(out), U(err));
}
static ks_status e_softmax(ks_backend *b, const float *x, int64_t rows, int64_t n, float *out) {
    return CPU->softmax(NULL, U(x), rows, n, U(out));
}
static ks_status e_sum(ks_backend *b, const float *x, int64_t rows, int64_t cols, int axis, float *out) {
    return CPU->sum(NULL, U(x), rows, cols, axis, U(out));
}
static ks_status e_mean(ks_backend *b, const float *x, int64_t rows, int64_t cols, int axis, float *out) {
    return CPU->mean(NULL, U(x), rows, cols, axis, U(out));
}
static ks_status e_var(ks_backend *b, const float *x, int64_t rows, int64_t cols, int axis, int64_t ddof, float *out) {
    return CPU->var(NULL, U(x), rows, cols, axis, ddof, U(out));
}
static ks_status e_cosine(ks_backend *b, const float *a, const float *bb, int64_t n, float *out) {
    return CPU->cosine(NULL, U(a), U(bb), n, U(out));
}
static ks_status e_cosine_rows(ks_backend *b, const float *a, const float *bb, int64_t rows, int64_t d, float *out) {
    return CPU->cosine_rows(NULL, U(a), U(bb), rows, d, U(out));
}
static ks_status e_page_reduce(ks_backend *b, const void *x, int x_bf16, int64_t n, int64_t h, int64_t d, int64_t rs,
                               int64_t hs, int64_t page, int64_t p0, int64_t p1, float *omin, float *omax, float *omean,
                               uint32_t *obox) {
    return CPU->page_reduce(NULL, U(x), x_bf16, n, h, d, rs, hs, page, p0, p1, U(omin), U(omax), U(omean), U(obox));
}
static ks_status e_bound_scores(ks_backend *b, const float *q, int64_t hq, const float *lo, const float *hi,
                                const uint32_t *box, int64_t n, int64_t hkv, int64_t d, ks_bound_reduce red, float *out) {
    return CPU->bound_scores(NULL, U(q), hq, U(lo), U(hi), U(box), n, hkv, d, red, U(out));
}
static ks_status e_page_rows(ks_backend *b, const int32_t *pages, int64_t lists, int64_t k, int64_t page, int64_t n,
                             int64_t bb, int64_t be, int64_t ab, int64_t ae, int32_t *out, int64_t *err) {
    return CPU->page_rows(NULL, U(pages), lists, k, page, n, bb, be, ab, ae, U(out), U(err));
}
static ks_status e_ge(ks_backend *b, const float *x, int64_t n, double thr, float *out) { return CPU->ge(NULL, U(x), n, thr, U(out)); }
static ks_status e_where(ks_backend *b, const float *mask, int64_t nm, const void *a, const void *bb, int64_t n, void *out) {
    return CPU->where(NULL, U(mask), nm, U(a), U(bb), n, U(out));
}

static const ks_backend_prims emu_prims = {
    .scores = e_scores, .pool1d = e_pool1d, .topk = e_topk, .argsort = e_argsort, .sort_f32 = e_sort_f32,
    .sort_i32 = e_sort_i32, .rank = e_rank, .unique = e_unique, .union_ = e_union, .concat_i32 = e_concat_i32,
    .concat_f32 = e_concat_f32, .arange = e_arange, .gather = e_gather, .gather_i32 = e_gather_i32,
    .softmax = e_softmax, .sum = e_sum, .mean = e_mean, .var = e_var, .cosine = e_cosine, .cosine_rows = e_cosine_rows,
    .page_reduce = e_page_reduce, .bound_scores = e_bound_scores, .page_rows = e_page_rows, .ge = e_ge, .where = e_where,
};

static ks_backend emu_backend = {
    .name = "emu", .alloc = emu_alloc, .free = emu_free, .upload = emu_upload, .download = emu_download,
    .copy = emu_copy, .sync = emu_sync, .rope = emu_rope, .prims = &emu_prims,
};

ks_backend *ks_lua_emu_backend(void) { return &emu_backend; }
