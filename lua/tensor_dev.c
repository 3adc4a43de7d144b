/* tensor_dev.c — device residency of tensors (ks_lua.h, "device tensors"): device views and
 * owned device tensors (the backend's memory, counted against _device_mb, freed by the
 * garbage collector), downloads and the one cached host copy per tensor (ks_lt_host, counted
 * in the policy's Lua memory), staging a tensor's data on a backend (ks_lt_on: uploads,
 * downloads, device gathers of strided views), and the end of an event: survivors stay on the
 * device for later events (ks_lt_dev_settle), or are lost after a failure (ks_lt_dev_drop,
 * which spares those kept by earlier events). The host side
 * of tensors (construction, element access, methods) is lua/tensor.c. */
#include "tensor_impl.h"

#include <stdlib.h>
#include <string.h>

static void dev_link(ks_lctx *c, ks_tensor *t) {
    t->dctx = c;
    t->dprev = NULL;
    t->dnext = c->dev_head;
    if (c->dev_head) c->dev_head->dprev = t;
    c->dev_head = t;
    c->dev_live++;
}

static void dev_unlink(ks_tensor *t) {
    ks_lctx *c = t->dctx;
    if (!c) return;
    if (t->dprev) t->dprev->dnext = t->dnext;
    else c->dev_head = t->dnext;
    if (t->dnext) t->dnext->dprev = t->dprev;
    t->dnext = t->dprev = NULL;
    t->dctx = NULL;
    c->dev_live--;
}

/* A tensor's memory lent to the engine: a count of holders, the tensor one of them. */
typedef struct lt_lend {
    ks_lend base;
    int refs;
    struct ks_backend *be;
    void *mem; /* as the tensor's dev_owned (tagged on the emulated device) */
} lt_lend;

static void lend_retain(ks_lend *l) { ((lt_lend *)l)->refs++; }

static void lend_release(ks_lend *l) {
    lt_lend *x = (lt_lend *)l;
    if (--x->refs > 0) return;
    x->be->free(x->be, x->mem);
    free(x);
}

ks_lend *ks_lt_lend(ks_tensor *t) {
    if (!t->be || !t->dev_owned) return NULL;
    if (!t->lend) {
        lt_lend *x = malloc(sizeof *x);
        if (!x) return NULL;
        *x = (lt_lend){{lend_retain, lend_release}, 1, t->be, t->dev_owned};
        t->lend = &x->base;
    }
    return t->lend;
}

/* Free the backend memory t owns (never raises). */
static void dev_release(ks_tensor *t, ks_lctx *c) {
    if (!t->dev_owned) return;
    if (t->lend) { /* freed now, or when the engine lets go of it too */
        t->lend->release(t->lend);
        t->lend = NULL;
    } else {
        t->be->free(t->be, t->dev_owned);
    }
    if (c) c->dev_used -= t->dev_bytes < c->dev_used ? t->dev_bytes : c->dev_used;
    t->dev_owned = NULL;
    t->dev_bytes = 0;
}

/* Host memory from the state's allocator, so a policy's memory limit counts it. */
static void *state_alloc(lua_State *L, size_t n, const char *what) {
    void *ud;
    lua_Alloc f = lua_getallocf(L, &ud);
    void *p = f(ud, NULL, LUA_TUSERDATA, n ? n : 1);
    if (!p) {
        ks_lctx *c = ks_lua_ctx(L);
        if (c && c->mem_exceeded) {
            c->fail_kind = KS_FAIL_MEMORY;
            ks_lua_errorf(L, what, "memory limit of %.4g MB exceeded by a %zu-byte host copy of a device tensor (parameter _memory_mb)",
                          c->mem_limit / 1048576.0, n);
        }
        ks_lua_errorf(L, what, "out of host memory for a %zu-byte host copy of a device tensor", n);
    }
    return p;
}

static void state_free(lua_State *L, void *p, size_t n) {
    if (!p) return;
    void *ud;
    lua_Alloc f = lua_getallocf(L, &ud);
    f(ud, p, n ? n : 1, 0);
}

int ks_lt_gc(lua_State *L) {
    ks_tensor *t = lua_touserdata(L, 1);
    if (!t) return 0;
    ks_lctx *c = t->dctx;
    dev_unlink(t);
    dev_release(t, c);
    if (t->host) {
        if (t->data == t->host) t->data = NULL;
        state_free(L, t->host, t->host_bytes);
        t->host = NULL;
    }
    return 0;
}

void ks_lt_download(lua_State *L, ks_backend *be, void *dst, const void *src, size_t n) {
    if (!n) return;
    ks_lctx *c = ks_lua_ctx(L);
    if (c) c->dev_downloads++;
    ks_status st = be->download(be, dst, src, n);
    if (st) ks_lua_core_error(L, "download", st);
}

/* n bytes of backend memory for a device tensor: over the limit or refused by the backend, a
 * full collection (garbage device tensors are only freed by the collector) and one retry. */
static void *dev_alloc(lua_State *L, ks_backend *be, size_t n) {
    ks_lctx *c = ks_lua_ctx(L);
    if (!n) n = 4;
    if (c->dev_limit && c->dev_used + n > c->dev_limit) {
        lua_gc(L, LUA_GCCOLLECT);
        if (c->dev_used + n > c->dev_limit) {
            c->fail_kind = KS_FAIL_MEMORY;
            ks_lua_errorf(L, "device", "device memory limit of %.4g MB exceeded (%.4g MB in use, %zu bytes more asked; parameter _device_mb)",
                          c->dev_limit / 1048576.0, c->dev_used / 1048576.0, n);
        }
    }
    void *p = be->alloc(be, n);
    if (!p) {
        lua_gc(L, LUA_GCCOLLECT);
        p = be->alloc(be, n);
        if (!p) ks_lua_core_error(L, "device", KS_ERR_OOM);
    }
    c->dev_used += n;
    c->dev_allocs++;
    if (c->dev_used > c->dev_peak) c->dev_peak = c->dev_used;
    return p;
}

ks_tensor *ks_lt_dview(lua_State *L, ks_backend *be, ks_tdtype dt, int bf16, int ndim, const int64_t *shape,
                       const int64_t *stride, void *data, int scoped, int owner_idx) {
    ks_tensor *t = ks_lt_view(L, dt, ndim, shape, stride, data, scoped, owner_idx);
    t->data = data; /* a backend address as given (the empty-view stand-in is host memory) */
    t->be = be;
    t->bf16 = bf16;
    dev_link(ks_lua_ctx(L), t);
    return t;
}

ks_tensor *ks_lt_dnew(lua_State *L, ks_backend *be, ks_tdtype dt, int ndim, const int64_t *shape) {
    ks_tensor *t = ks_lt_dview(L, be, dt, 0, ndim, shape, NULL, NULL, 0, 0);
    size_t bytes = (size_t)t->numel * 4;
    t->dev_owned = dev_alloc(L, be, bytes);
    t->dev_bytes = bytes ? bytes : 4;
    t->data = t->dev_owned;
    t->id = ++ks_lua_ctx(L)->next_id;
    return t;
}

/* Offset (elements) of the last element of t + 1: the extent its strides reach. */
static int64_t span_of(const ks_tensor *t) {
    if (t->numel == 0) return 0;
    int64_t e = 0;
    for (int i = 0; i < t->ndim; i++) e += (t->shape[i] - 1) * t->stride[i];
    return e + 1;
}

/* Runs of contiguous elements along the last dimension (t strided, last stride 1). */
static int64_t runs_of(const ks_tensor *t) {
    if (t->ndim == 0 || t->numel == 0) return t->numel ? 1 : 0;
    return t->numel / t->shape[t->ndim - 1];
}

/* Download device tensor t into dst (numel contiguous 32-bit elements of t->dtype). */
static void dev_to_host(lua_State *L, ks_tensor *t, void *dst) {
    size_t es = esize(t);
    if (!t->numel) return;
    if (ks_lt_is_contig(t) && !t->bf16) {
        ks_lt_download(L, t->be, dst, t->data, (size_t)t->numel * 4);
        return;
    }
    int64_t span = span_of(t), runs = runs_of(t), last = t->ndim ? t->shape[t->ndim - 1] : 1;
    int last_contig = t->ndim == 0 || t->stride[t->ndim - 1] == 1;
    uint32_t *out = dst;
    if (last_contig && runs <= 1024 && span > 4 * t->numel) {
        /* far-apart runs (a head of ev.k, a slice): one download per run */
        void *buf = malloc((size_t)last * es);
        if (!buf) ks_lua_errorf(L, "download", "out of host memory");
        for (int64_t r = 0; r < runs; r++) {
            int64_t off = flat_off(t, r * last);
            ks_lctx *c = ks_lua_ctx(L);
            if (c) c->dev_downloads++;
            ks_status st = t->be->download(t->be, buf, (const char *)t->data + off * es, (size_t)last * es);
            if (st) { free(buf); ks_lua_core_error(L, "download", st); }
            for (int64_t j = 0; j < last; j++) out[r * last + j] = span_elem(buf, j, t->bf16);
        }
        free(buf);
        return;
    }
    void *buf = malloc((size_t)span * es);
    if (!buf) ks_lua_errorf(L, "download", "out of host memory for %lld elements", (long long)span);
    ks_lctx *c = ks_lua_ctx(L);
    if (c) c->dev_downloads++;
    ks_status st = t->be->download(t->be, buf, t->data, (size_t)span * es);
    if (st) { free(buf); ks_lua_core_error(L, "download", st); }
    for (int64_t i = 0; i < t->numel; i++) out[i] = span_elem(buf, flat_off(t, i), t->bf16);
    free(buf);
}

const void *ks_lt_host(lua_State *L, ks_tensor *t) {
    if (!t->be && ks_lt_is_contig(t)) return t->data;
    if (t->host && ks_lt_mut(t)) { /* written in place since (perhaps by a replay): read again */
        if (t->be) dev_to_host(L, t, t->host);
        else ks_lt_copy_contig(t, t->host);
    }
    if (t->host) return t->host;
    size_t bytes = (size_t)t->numel * 4;
    void *h = state_alloc(L, bytes, "tensor");
    if (t->be) {
        /* keep h owned by t before anything can raise, so an error cannot leak it */
        t->host = h;
        t->host_bytes = bytes ? bytes : 1;
        dev_to_host(L, t, h);
    } else {
        ks_lt_copy_contig(t, h);
        t->host = h;
        t->host_bytes = bytes ? bytes : 1;
    }
    return t->host;
}

/* A host-readable copy of t's header: the cached contiguous copy for device tensors. */
ks_tensor ks_lt_rd(lua_State *L, ks_tensor *t) {
    ks_tensor h = *t;
    if (!t->be) return h;
    h.data = (void *)ks_lt_host(L, t);
    h.be = NULL;
    h.bf16 = 0;
    int64_t s = 1;
    for (int i = h.ndim - 1; i >= 0; i--) {
        h.stride[i] = s;
        s *= h.shape[i] > 0 ? h.shape[i] : 1;
    }
    return h;
}

const void *ks_lt_on(lua_State *L, int arg, ks_tensor *t, ks_backend *be, int *pushed) {
    *pushed = 0;
    arg = lua_absindex(L, arg);
    if (!be) {
        if (t->be) return ks_lt_host(L, t);
        return ks_lt_contig(L, arg, t, pushed);
    }
    if (t->be == be && !t->bf16 && ks_lt_is_contig(t)) return t->data;
    ks_tensor *o;
    if (t->be == be && !t->bf16 && t->ndim && t->stride[t->ndim - 1] == 1 && runs_of(t) <= 256) {
        /* a strided view on the same device: copy its runs */
        o = ks_lt_dnew(L, be, t->dtype, t->ndim, t->shape);
        int64_t last = t->shape[t->ndim - 1], runs = runs_of(t);
        for (int64_t r = 0; r < runs; r++) {
            ks_status st = be->copy(be, (char *)o->data + (size_t)(r * last) * 4, (const char *)t->data + (size_t)flat_off(t, r * last) * 4,
                                    (size_t)last * 4);
            if (st) ks_lua_core_error(L, "copy", st);
        }
    } else {
        /* host data (or a bf16 / scattered device view: through its host copy) */
        const void *h = t->be ? ks_lt_host(L, t) : NULL;
        int hp = 0;
        if (!h) h = ks_lt_contig(L, arg, t, &hp);
        o = ks_lt_dnew(L, be, t->dtype, t->ndim, t->shape);
        ks_status st = be->upload(be, o->data, h, (size_t)t->numel * 4);
        if (st) ks_lua_core_error(L, "upload", st);
        if (hp) lua_remove(L, -2);
    }
    *pushed = 1;
    return o->data;
}

void ks_lt_dev_settle(lua_State *L) {
    ks_lctx *c = ks_lua_ctx(L);
    if (!c || !c->dev_head) return;
    lua_gc(L, LUA_GCCOLLECT); /* the event's garbage device tensors are freed now */
    for (ks_tensor *t = c->dev_head, *next; t; t = next) {
        next = t->dnext;
        if (t->scope) dev_unlink(t); /* a view of an engine buffer: stale from now on */
        else t->kept = 1;            /* owned, or a view of an owned one: stays where it is */
    }
}

void ks_lt_dev_drop(lua_State *L) {
    ks_lctx *c = ks_lua_ctx(L);
    if (!c) return;
    for (ks_tensor *t = c->dev_head, *next; t; t = next) {
        next = t->dnext;
        if (t->kept) continue; /* made by an earlier event that succeeded: still valid */
        dev_unlink(t);
        if (t->scope) continue;
        dev_release(t, c);
        if (t->host && !ks_lt_mut(t)) { /* it was downloaded already: keep that copy (not one written since) */
            t->be = NULL;
            t->bf16 = 0;
            t->data = t->host;
            int64_t s = 1;
            for (int i = t->ndim - 1; i >= 0; i--) {
                t->stride[i] = s;
                s *= t->shape[i] > 0 ? t->shape[i] : 1;
            }
        } else {
            t->lost = 1;
            t->data = NULL;
        }
    }
}

/* ---------------------------------------------------------------- lists valid by construction */

/* The marks live in a weak-keyed registry table (tensor -> lo << 32 | (uint32)hi): tensors are
 * read-only, so a mark stays true for the tensor's life, except for one written in place (an
 * `into` option), whose write sets or drops its mark; views and copies carry none. */
static const char sorted_key = 0;

static void sorted_table(lua_State *L) {
    if (lua_rawgetp(L, LUA_REGISTRYINDEX, &sorted_key) == LUA_TTABLE) return;
    lua_pop(L, 1);
    lua_newtable(L);
    lua_createtable(L, 0, 1);
    lua_pushliteral(L, "k");
    lua_setfield(L, -2, "__mode");
    lua_setmetatable(L, -2);
    lua_pushvalue(L, -1);
    lua_rawsetp(L, LUA_REGISTRYINDEX, &sorted_key);
}

void ks_lt_mark_sorted(lua_State *L, int idx, int64_t lo, int64_t hi) {
    ks_tensor *t = ks_lt_test(L, idx);
    if (!t || t->dtype != KS_T_I32 || t->ndim < 1 || t->ndim > 2 || lo < INT32_MIN || hi > INT32_MAX || lo > hi) return;
    idx = lua_absindex(L, idx);
    sorted_table(L);
    lua_pushvalue(L, idx);
    lua_pushinteger(L, (lua_Integer)((uint64_t)(int64_t)lo << 32 | (uint32_t)(int32_t)hi));
    lua_rawset(L, -3);
    lua_pop(L, 1);
}

void ks_lt_unmark(lua_State *L, int idx) {
    if (!ks_lt_test(L, idx)) return;
    idx = lua_absindex(L, idx);
    if (lua_rawgetp(L, LUA_REGISTRYINDEX, &sorted_key) != LUA_TTABLE) { lua_pop(L, 1); return; }
    lua_pushvalue(L, idx);
    lua_pushnil(L);
    lua_rawset(L, -3);
    lua_pop(L, 1);
}

int ks_lt_sorted(lua_State *L, int idx, int64_t *lo, int64_t *hi) {
    if (!ks_lt_test(L, idx)) return 0;
    idx = lua_absindex(L, idx);
    if (lua_rawgetp(L, LUA_REGISTRYINDEX, &sorted_key) != LUA_TTABLE) { lua_pop(L, 1); return 0; }
    lua_pushvalue(L, idx);
    int ok = lua_rawget(L, -2) == LUA_TNUMBER;
    if (ok) {
        uint64_t w = (uint64_t)lua_tointeger(L, -1);
        *lo = (int32_t)(uint32_t)(w >> 32);
        *hi = (int32_t)(uint32_t)w;
    }
    lua_pop(L, 2);
    return ok;
}
