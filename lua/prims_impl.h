/* prims_impl.h — what the files of the `kvsieve` module's primitives share (internal to them):
 *   lua/prims_lua.c     placement, option tables, every primitive but scores, the registry
 *   lua/prims_scores.c  ks.scores (its many options)
 *
 * One dispatch. A primitive runs where its tensor inputs are (ks_lp_where): on the backend of
 * its device inputs, or on the host. Either way it calls one entry of one ks_backend_prims
 * table (ks_lp_prims): the device backend's, or for the host the CPU backend's table
 * (core/cpu_prims.c, core/prims.c on host buffers). Both tables follow the same conventions
 * (backend.h): counts, gather's error word and cosine's value are written through an output
 * pointer, which on a device is device memory (ks_lp_word / ks_lp_get read it back). What still
 * depends on the side is memory only: where outputs are allocated (ks_lp_out) and how a word is
 * read. */
#ifndef KS_PRIMS_IMPL_H
#define KS_PRIMS_IMPL_H

#include "ks_lua.h"

#include "backend.h"
#include "prims.h"

/* ---------------------------------------------------------------- option tables */

/* Raise unless every key of the options table at idx is one of `allowed` (NULL-terminated);
 * nil / none is no options. */
void ks_lp_check_opts(lua_State *L, int idx, const char *fn, const char *const *allowed);
/* opts[key] pushed (nil when the options are absent); returns its Lua type. */
int ks_lp_opt_get(lua_State *L, int idx, const char *key);
/* A boolean / string option, def when absent; raises on another type. A string stays valid
 * while the options table lives. */
int ks_lp_opt_bool(lua_State *L, int idx, const char *key, int def, const char *fn);
const char *ks_lp_opt_str(lua_State *L, int idx, const char *key, const char *def, const char *fn);
/* A {begin, end} option, 0-based half-open, negative values from n; checked within [0, n].
 * Returns 0 when absent. */
int ks_lp_opt_range(lua_State *L, int idx, const char *key, int64_t n, int64_t *b, int64_t *e, const char *fn);
/* The same, *rel: bit 0 set when begin was given negative (from n), bit 1 when end was. */
int ks_lp_opt_range_rel(lua_State *L, int idx, const char *key, int64_t n, int64_t *b, int64_t *e, int *rel,
                        const char *fn);

/* ---------------------------------------------------------------- placement */

/* Where a primitive over tensors ts[0..n) (NULL entries skipped) runs: the backend of the first
 * device input, unless the host inputs outweigh the device ones (then the host: "move the small
 * one"); NULL = the host. */
ks_backend *ks_lp_where(ks_tensor *const *ts, int n);
/* The primitive table for work on be: be's own, or the CPU backend's for the host (NULL). */
static inline const ks_backend_prims *ks_lp_prims(ks_backend *be) { return be ? be->prims : ks_cpu_prims(); }
/* The argument at arg as a tensor of dtype dt (tables and numbers converted): pushed, its stack
 * slot in *slot. */
ks_tensor *ks_lp_arg(lua_State *L, int arg, ks_tdtype dt, const char *fn, int *slot);
/* The contiguous data of the tensor at slot on be (NULL = host); a copy, if one is needed,
 * stays on the stack. */
const void *ks_lp_data(lua_State *L, int slot, ks_tensor *t, ks_backend *be);
/* A new owned output tensor on be (NULL = host), pushed. */
ks_tensor *ks_lp_out(lua_State *L, ks_backend *be, ks_tdtype dt, int ndim, const int64_t *shape);
/* The same with room for `grow` more columns a row (grow > 0 on a device: a result whose columns
 * follow the layer's rows in a recorded handler, ks_tensor.grow; its rows are laid out (rows,
 * cols + delta) at a replay); grow <= 0 or the host: ks_lp_out. */
ks_tensor *ks_lp_out_grow(lua_State *L, ks_backend *be, ks_tdtype dt, int ndim, const int64_t *shape, int64_t grow);
/* An 8-byte word a primitive writes a result into (a count, gather's error word, a float):
 * on a device a new device tensor (pushed; with `set`, set to the 8 bytes at host first), on
 * the host `host` itself (nothing pushed). */
void *ks_lp_word(lua_State *L, ks_backend *be, void *host, int set);
/* Read n bytes a primitive wrote at src on be (NULL = host: a copy). Raises on failure. */
void ks_lp_get(lua_State *L, ks_backend *be, void *dst, const void *src, size_t n);

/* Return the Lua error of a failed core call, naming fn. */
#define KS_LP_CORE(fn, call)                                                                                          \
    do {                                                                                                              \
        ks_status st_ = (call);                                                                                       \
        if (st_) return ks_lua_core_error(L, fn, st_);                                                                \
    } while (0)
/* Run primitive `name` of the table for be with (be, args...): the one dispatch. */
#define KS_LP_PRIM(fn, be, name, ...) KS_LP_CORE(fn, ks_lp_prims(be)->name((be), __VA_ARGS__))

/* ---------------------------------------------------------------- lua/prims_scores.c */

int ks_lp_scores(lua_State *L);

#endif
