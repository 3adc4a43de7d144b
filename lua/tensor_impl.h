/* tensor_impl.h — what the tensor files share (internal to them; the tensor API is in ks_lua.h):
 *   lua/tensor.c          construction (owned, views, from Lua tables), checks, conversion,
 *                         ks.tensor / ks.zeros / ks.stack, the error helpers
 *   lua/tensor_methods.c  methods and operators, the metatable
 *   lua/tensor_dev.c      device residency: device tensors, downloads, host copies, staging */
#ifndef KS_TENSOR_IMPL_H
#define KS_TENSOR_IMPL_H

#include "ks_lua.h"

#include "common.h"

#include <string.h>

/* Bytes per element as stored: 2 for a bf16 device view, else 4. */
static inline size_t esize(const ks_tensor *t) { return t->bf16 ? 2 : 4; }

/* Element offset (in elements) of the flat index i (row-major order) in t. Callers pass
 * 0 <= i < numel, so no dimension is 0 here (an empty tensor has no element to find). */
static inline int64_t flat_off(const ks_tensor *t, int64_t i) {
    int64_t off = 0;
    for (int d = t->ndim - 1; d >= 0; d--) {
        int64_t s = t->shape[d];
        off += (i % s) * t->stride[d];
        i /= s;
    }
    return off;
}

/* Element j of a downloaded span (es bytes each) as a 32-bit pattern of dtype. */
static inline uint32_t span_elem(const void *span, int64_t off, int bf16) {
    if (bf16) {
        float f = ks_bf16_to_f32(((const uint16_t *)span)[off]);
        uint32_t u;
        memcpy(&u, &f, 4);
        return u;
    }
    return ((const uint32_t *)span)[off];
}

/* A view whose event has ended. */
static inline int ks_lt_view_stale(const ks_tensor *t) {
    return t->scope && !(t->scope->in_event && t->scope->serial == t->serial);
}

/* Element at offset off of host data, as a double / pushed as a Lua number or integer. */
static inline double ks_lt_elem_get(const ks_tensor *t, int64_t off) {
    return t->dtype == KS_T_F32 ? (double)((const float *)t->data)[off] : (double)((const int32_t *)t->data)[off];
}
static inline void ks_lt_push_elem(lua_State *L, const ks_tensor *t, int64_t off) {
    if (t->dtype == KS_T_F32) lua_pushnumber(L, ((const float *)t->data)[off]);
    else lua_pushinteger(L, ((const int32_t *)t->data)[off]);
}

/* ---------------------------------------------------------------- tensor.c */

/* Copy host tensor t into out (numel contiguous elements of its dtype). */
void ks_lt_copy_contig(const ks_tensor *t, void *out);
/* A new host tensor of dtype dt with t's values (converted), pushed. */
ks_tensor *ks_lt_convert(lua_State *L, ks_tensor *t0, ks_tdtype dt);

/* ---------------------------------------------------------------- tensor_methods.c */

/* Fill the tensor metatable on top of the stack: methods (__index), operators, __gc, names. */
void ks_lt_methods_open(lua_State *L);
/* A copy of the tensor t at arg, on its side (device tensors stay on their device), pushed. */
void ks_lt_clone_at(lua_State *L, int arg, ks_tensor *t);

/* ---------------------------------------------------------------- tensor_dev.c */

/* Lists valid by construction (issue 14): an i32 tensor (1-d, or 2-d: per row) whose every row
 * is strictly ascending with values in [lo, hi) may be marked so (topk, arange, concat and a
 * shift by a constant mark their results); the event's actions then skip the check of its
 * order and uniqueness and check only the bounds. ks_lt_sorted: 1 and the bounds when the
 * tensor at idx is marked. (Used by lua/prims_lua.c and lua/events.c too.) */
void ks_lt_mark_sorted(lua_State *L, int idx, int64_t lo, int64_t hi);
/* Drop the tensor at idx's mark (it was written in place: ks_tensor.mut). */
void ks_lt_unmark(lua_State *L, int idx);
int ks_lt_sorted(lua_State *L, int idx, int64_t *lo, int64_t *hi);

/* __gc of every tensor: unlinks a device tensor and frees its device memory and host copy. */
int ks_lt_gc(lua_State *L);
/* A host-readable copy of t's header: the cached contiguous copy for device tensors (t itself
 * for host tensors). */
ks_tensor ks_lt_rd(lua_State *L, ks_tensor *t);

#endif
