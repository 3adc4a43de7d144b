/* tensor.c — the tensor userdata ("kvsieve.tensor"): host tensors and the methods of all.
 *
 * A tensor is a full userdata: a ks_tensor header followed (for owned tensors) by its data,
 * so the Lua allocator accounts for every byte (a policy's memory limit covers tensors too)
 * and the garbage collector frees it. A view points into memory it does not own: engine
 * buffers (scoped to the event that handed it out: using it later is an error, not a
 * crash) or another tensor (kept alive through the view's user value). Element access is
 * strided; most primitives take contiguous data and copy a strided argument first.
 *
 * Device tensors (ks_lua.h) keep their elements in backend memory; what keeps them there is
 * lua/tensor_dev.c: element access here goes through one cached host copy per tensor
 * (ks_lt_host / ks_lt_rd), views of them are device views, and the end of each event moves
 * the survivors to the host (ks_lt_dev_settle). Also here: the binding's error helpers
 * (ks_lua_errorf, ks_lua_core_error), which name the running event. */
#include "tensor_impl.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ================================================================ errors and scope */

const char *ks_lua_where_event(lua_State *L, char *buf, size_t n) {
    ks_lctx *c = ks_lua_ctx(L);
    buf[0] = 0;
    if (c && c->in_event && c->event) {
        if (c->layer >= 0) snprintf(buf, n, " (in %s, layer %d)", c->event, c->layer);
        else snprintf(buf, n, " (in %s)", c->event);
    }
    return buf;
}

int ks_lua_errorf(lua_State *L, const char *fn, const char *fmt, ...) {
    char msg[1024], where[96];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return luaL_error(L, "%s: %s%s", fn, msg, ks_lua_where_event(L, where, sizeof where));
}

int ks_lua_core_error(lua_State *L, const char *fn, ks_status st) {
    char msg[2048], where[96];
    const char *e = ks_last_error();
    if (!e || !*e) e = ks_status_name(st);
    size_t fl = strlen(fn);
    /* core messages usually start with the primitive's / action's name already */
    if (!strncmp(e, fn, fl) && (e[fl] == ':' || e[fl] == ' ')) snprintf(msg, sizeof msg, "%s", e);
    else snprintf(msg, sizeof msg, "%s: %s", fn, e);
    ks_lctx *c = ks_lua_ctx(L);
    if (c && c->event && strstr(msg, c->event)) where[0] = 0; /* already names the event */
    else ks_lua_where_event(L, where, sizeof where);
    return luaL_error(L, "%s%s", msg, where);
}

const char *ks_tdtype_name(ks_tdtype d) { return d == KS_T_I32 ? "i32" : "f32"; }

/* ================================================================ construction */

#define HDR_SIZE ((sizeof(ks_tensor) + 15) & ~(size_t)15)

static int64_t shape_numel(lua_State *L, int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) luaL_error(L, "tensor: negative dimension %I", (lua_Integer)shape[i]);
        if (__builtin_mul_overflow(n, shape[i], &n) || n > ((int64_t)1 << 40))
            luaL_error(L, "tensor: too many elements");
    }
    return n;
}

static void contig_strides(int ndim, const int64_t *shape, int64_t *stride) {
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        stride[i] = s;
        s *= shape[i] > 0 ? shape[i] : 1;
    }
}

ks_tensor *ks_lt_new(lua_State *L, ks_tdtype dt, int ndim, const int64_t *shape, int zero) {
    if (ndim < 0 || ndim > KS_TENSOR_MAXDIM) luaL_error(L, "tensor: %d dimensions (at most %d)", ndim, KS_TENSOR_MAXDIM);
    int64_t n = shape_numel(L, ndim, shape);
    size_t bytes = (size_t)n * 4;
    ks_tensor *t = lua_newuserdatauv(L, HDR_SIZE + bytes, 1);
    memset(t, 0, sizeof *t);
    t->dtype = dt;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
    contig_strides(ndim, shape, t->stride);
    t->numel = n;
    t->data = (char *)t + HDR_SIZE;
    t->origin_layer = -1;
    if (zero) memset(t->data, 0, bytes);
    luaL_setmetatable(L, KS_TENSOR_MT);
    return t;
}

/* Where host views of zero elements point when their owner gave no address (an empty KV head):
 * never NULL, so memcpy and pointer arithmetic on an empty tensor stay defined. */
static uint32_t empty_elems[1];

ks_tensor *ks_lt_view(lua_State *L, ks_tdtype dt, int ndim, const int64_t *shape, const int64_t *stride, void *data,
                      int scoped, int owner_idx) {
    if (owner_idx) owner_idx = lua_absindex(L, owner_idx);
    ks_lctx *c = ks_lua_ctx(L);
    if (scoped && !(c && c->in_event)) luaL_error(L, "tensor view: no event is running");
    ks_tensor *t = lua_newuserdatauv(L, sizeof(ks_tensor), 1);
    memset(t, 0, sizeof *t);
    t->dtype = dt;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
    if (stride)
        for (int i = 0; i < ndim; i++) t->stride[i] = stride[i];
    else contig_strides(ndim, shape, t->stride);
    t->numel = shape_numel(L, ndim, shape);
    t->data = data ? data : t->numel == 0 ? (void *)empty_elems : NULL;
    t->origin_layer = -1;
    if (scoped) {
        t->scope = c;
        t->serial = c->serial;
        t->origin = c->event;
        t->origin_layer = c->layer;
    }
    luaL_setmetatable(L, KS_TENSOR_MT);
    if (owner_idx) {
        lua_pushvalue(L, owner_idx);
        lua_setiuservalue(L, -2, 1);
    }
    return t;
}

ks_tensor *ks_lt_test(lua_State *L, int idx) { return luaL_testudata(L, idx, KS_TENSOR_MT); }

static int view_stale(const ks_tensor *t) {
    return t->scope && !(t->scope->in_event && t->scope->serial == t->serial);
}

ks_tensor *ks_lt_check(lua_State *L, int arg, const char *fn) {
    ks_tensor *t = luaL_testudata(L, arg, KS_TENSOR_MT);
    if (!t) {
        ks_lua_errorf(L, fn, "argument %d: tensor expected, got %s", arg, luaL_typename(L, arg));
        return NULL;
    }
    if (t->closed) ks_lua_errorf(L, fn, "argument %d: tensor used after it was closed", arg);
    if (t->lost) {
        ks_lctx *c = ks_lua_ctx(L);
        if (c) c->fail_kind = KS_FAIL_STALE;
        ks_lua_errorf(L, fn, "argument %d: device tensor lost: the handler that made it failed before it could move to host memory", arg);
    }
    if (view_stale(t)) {
        ks_lctx *c = ks_lua_ctx(L);
        if (c) c->fail_kind = KS_FAIL_STALE;
        if (t->origin_layer >= 0)
            ks_lua_errorf(L, fn, "tensor view used after its event ended (it came from %s, layer %d; keep a copy with :clone())",
                          t->origin, t->origin_layer);
        else
            ks_lua_errorf(L, fn, "tensor view used after its event ended (it came from %s; keep a copy with :clone())",
                          t->origin ? t->origin : "?");
    }
    return t;
}

int ks_lt_is_contig(const ks_tensor *t) {
    int64_t s = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && t->stride[i] != s) return 0;
        s *= t->shape[i];
    }
    return 1;
}

void ks_lt_copy_contig(const ks_tensor *t, void *out) {
    if (t->numel == 0) return; /* an empty view may have no data at all */
    if (ks_lt_is_contig(t)) {
        memcpy(out, t->data, (size_t)t->numel * 4);
        return;
    }
    const uint32_t *src = t->data;
    uint32_t *dst = out;
    /* walk the last dimension in runs */
    int last = t->ndim - 1;
    int64_t run = t->shape[last], rs = t->stride[last];
    for (int64_t r = 0; r < t->numel / (run ? run : 1); r++) {
        int64_t off = flat_off(t, r * run);
        for (int64_t j = 0; j < run; j++) dst[r * run + j] = src[off + j * rs];
    }
}

void *ks_lt_contig(lua_State *L, int arg, ks_tensor *t, int *pushed) {
    *pushed = 0;
    if (t->be) return (void *)ks_lt_host(L, t); /* device: the cached host copy */
    if (ks_lt_is_contig(t)) return t->data;
    ks_tensor *c = ks_lt_new(L, t->dtype, t->ndim, t->shape, 0);
    ks_lt_copy_contig(t, c->data);
    *pushed = 1;
    return c->data;
}

static double elem_get(const ks_tensor *t, int64_t off) {
    return t->dtype == KS_T_F32 ? (double)((const float *)t->data)[off] : (double)((const int32_t *)t->data)[off];
}

static void push_elem(lua_State *L, const ks_tensor *t, int64_t off) {
    if (t->dtype == KS_T_F32) lua_pushnumber(L, ((const float *)t->data)[off]);
    else lua_pushinteger(L, ((const int32_t *)t->data)[off]);
}

/* ================================================================ from Lua tables */

/* Shape of a nested table (rectangular), walking first elements. */
static int table_shape(lua_State *L, int idx, int64_t *shape) {
    int nd = 0;
    idx = lua_absindex(L, idx);
    lua_pushvalue(L, idx);
    while (lua_istable(L, -1)) {
        if (nd == KS_TENSOR_MAXDIM) { lua_pop(L, 1); return -1; }
        shape[nd++] = (int64_t)lua_rawlen(L, -1);
        if (lua_rawlen(L, -1) == 0) break;
        lua_rawgeti(L, -1, 1);
        lua_remove(L, -2);
    }
    lua_pop(L, 1);
    return nd;
}

/* Are all leaves of the nested table at idx integers? Only tables are walked: a string or a
 * tensor where a row should be is left for fill_from_table to name (lua_rawlen of a string
 * or a userdata is its byte size, and lua_rawgeti on them is undefined). */
static int all_integers(lua_State *L, int idx, int depth, int nd) {
    if (lua_type(L, idx) != LUA_TTABLE) return 0;
    size_t n = lua_rawlen(L, idx);
    for (size_t i = 1; i <= n; i++) {
        lua_rawgeti(L, idx, (lua_Integer)i);
        int ok = depth + 1 < nd ? all_integers(L, lua_gettop(L), depth + 1, nd) : lua_isinteger(L, -1);
        lua_pop(L, 1);
        if (!ok) return 0;
    }
    return 1;
}

static void fill_from_table(lua_State *L, int idx, ks_tensor *t, int depth, int64_t *pos, const char *fn) {
    size_t n = lua_rawlen(L, idx);
    if ((int64_t)n != t->shape[depth]) ks_lua_errorf(L, fn, "ragged table: a row has %zu entries, expected %lld", n, (long long)t->shape[depth]);
    for (size_t i = 1; i <= n; i++) {
        lua_rawgeti(L, idx, (lua_Integer)i);
        if (depth + 1 < t->ndim) {
            if (lua_type(L, -1) != LUA_TTABLE)
                ks_lua_errorf(L, fn, "ragged table: entry %zu at depth %d is a %s, expected a nested table", i, depth + 1, luaL_typename(L, -1));
            fill_from_table(L, lua_gettop(L), t, depth + 1, pos, fn);
        } else {
            int isnum;
            if (t->dtype == KS_T_I32) {
                lua_Integer v = lua_tointegerx(L, -1, &isnum);
                if (!isnum) {
                    if (lua_isnumber(L, -1))
                        ks_lua_errorf(L, fn, "entry %lld is %g, not an integer", (long long)*pos + 1, lua_tonumber(L, -1));
                    ks_lua_errorf(L, fn, "entry %lld is a %s, not a number", (long long)*pos + 1, luaL_typename(L, -1));
                }
                if (v < INT32_MIN || v > INT32_MAX) ks_lua_errorf(L, fn, "entry %lld = %lld is outside int32", (long long)*pos + 1, (long long)v);
                ((int32_t *)t->data)[(*pos)++] = (int32_t)v;
            } else {
                lua_Number v = lua_tonumberx(L, -1, &isnum);
                if (!isnum) ks_lua_errorf(L, fn, "entry %lld is a %s, not a number", (long long)*pos + 1, luaL_typename(L, -1));
                ((float *)t->data)[(*pos)++] = (float)v;
            }
        }
        lua_pop(L, 1);
    }
}

static ks_tensor *tensor_from_table(lua_State *L, int idx, int dt /* KS_T_ANY = infer */, const char *fn) {
    idx = lua_absindex(L, idx);
    int64_t shape[KS_TENSOR_MAXDIM];
    int nd = table_shape(L, idx, shape);
    if (nd < 0) ks_lua_errorf(L, fn, "table nested deeper than %d levels", KS_TENSOR_MAXDIM);
    if (dt < 0) dt = all_integers(L, idx, 0, nd) ? KS_T_I32 : KS_T_F32;
    ks_tensor *t = ks_lt_new(L, (ks_tdtype)dt, nd, shape, 0);
    int64_t pos = 0;
    fill_from_table(L, idx, t, 0, &pos, fn); /* also when empty: it checks the rows are tables */
    return t;
}

/* Convert tensor t into a new owned tensor of dtype dt (pushed). */
static ks_tensor *convert(lua_State *L, ks_tensor *t0, ks_tdtype dt) {
    ks_tensor h = ks_lt_rd(L, t0), *t = &h; /* device tensors: through their host copy */
    ks_tensor *o = ks_lt_new(L, dt, t->ndim, t->shape, 0);
    for (int64_t i = 0; i < t->numel; i++) {
        int64_t off = flat_off(t, i);
        if (dt == KS_T_F32) ((float *)o->data)[i] = (float)elem_get(t, off);
        else {
            double v = elem_get(t, off);
            if (!(v >= INT32_MIN && v <= INT32_MAX)) luaL_error(L, "int: value %f is outside int32", v);
            ((int32_t *)o->data)[i] = (int32_t)v; /* truncation toward zero, like torch */
        }
    }
    return o;
}

ks_tensor *ks_lt_arg(lua_State *L, int arg, ks_tdtype dt, const char *fn) {
    arg = lua_absindex(L, arg);
    if (lua_istable(L, arg)) return tensor_from_table(L, arg, dt, fn);
    if (dt != KS_T_I32 && lua_type(L, arg) == LUA_TNUMBER) {
        ks_tensor *t = ks_lt_new(L, KS_T_F32, 0, NULL, 0);
        *(float *)t->data = (float)lua_tonumber(L, arg);
        return t;
    }
    ks_tensor *t = ks_lt_check(L, arg, fn);
    if (t->dtype == dt || dt == KS_T_ANY) { lua_pushvalue(L, arg); return t; }
    if (dt == KS_T_I32) ks_lua_errorf(L, fn, "argument %d: an i32 tensor (or a table of integers) expected, got f32", arg);
    return convert(L, t, dt);
}

/* ================================================================ methods */

static int l_t_numel(lua_State *L) {
    ks_tensor *t = ks_lt_check(L, 1, "numel");
    lua_pushinteger(L, t->numel);
    return 1;
}

static void push_list(lua_State *L, const ks_tensor *t, int d, int64_t off) {
    int64_t n = t->shape[d];
    lua_createtable(L, (int)n, 0);
    for (int64_t i = 0; i < n; i++) {
        if (d + 1 == t->ndim) push_elem(L, t, off + i * t->stride[d]);
        else push_list(L, t, d + 1, off + i * t->stride[d]);
        lua_rawseti(L, -2, (lua_Integer)i + 1);
    }
}

static int l_t_tolist(lua_State *L) {
    ks_tensor *t0 = ks_lt_check(L, 1, "tolist");
    ks_tensor h = ks_lt_rd(L, t0), *t = &h;
    if (t->ndim == 0) push_elem(L, t, 0);
    else {
        luaL_checkstack(L, t->ndim + 4, "tolist");
        push_list(L, t, 0, 0);
    }
    return 1;
}

/* One element of device tensor t at element offset off (no host copy of the whole tensor). */
static void push_dev_elem(lua_State *L, const ks_tensor *t, int64_t off) {
    uint32_t u = 0;
    ks_lt_download(L, t->be, &u, (const char *)t->data + (size_t)off * esize(t), esize(t));
    uint32_t v = t->bf16 ? span_elem(&u, 0, 1) : u;
    ks_tensor one = *t;
    one.data = &v;
    one.be = NULL;
    push_elem(L, &one, 0);
}

static int l_t_item(lua_State *L) {
    ks_tensor *t = ks_lt_check(L, 1, "item");
    ks_tensor h;
    /* device tensors: through the host copy when it exists or is small, else one element */
    if (t->be && (t->host || t->numel <= 4096)) { h = ks_lt_rd(L, t); t = &h; }
    int64_t off = 0;
    if (lua_gettop(L) >= 2) { /* item(i, j, ...) : one element, 0-based */
        int nidx = lua_gettop(L) - 1;
        if (nidx != t->ndim) return ks_lua_errorf(L, "item", "%d indices for a %d-d tensor", nidx, t->ndim);
        for (int d = 0; d < t->ndim; d++) {
            lua_Integer i = luaL_checkinteger(L, d + 2);
            if (i < 0) i += t->shape[d];
            if (i < 0 || i >= t->shape[d])
                return ks_lua_errorf(L, "item", "index %lld out of range [0, %lld) in dimension %d", (long long)lua_tointeger(L, d + 2),
                                     (long long)t->shape[d], d);
            off += i * t->stride[d];
        }
    } else if (t->numel != 1)
        return ks_lua_errorf(L, "item", "tensor has %lld elements (item needs exactly 1, or indices)", (long long)t->numel);
    if (t->be) push_dev_elem(L, t, off);
    else push_elem(L, t, off);
    return 1;
}

/* slice(dim, start, stop): a view of [start, stop) along dim (0-based, negative counts from the end). */
static int l_t_slice(lua_State *L) {
    ks_tensor *t = ks_lt_check(L, 1, "slice");
    lua_Integer d = luaL_checkinteger(L, 2);
    if (d < 0) d += t->ndim;
    if (d < 0 || d >= t->ndim) return ks_lua_errorf(L, "slice", "dimension %lld out of range for a %d-d tensor", (long long)luaL_checkinteger(L, 2), t->ndim);
    int64_t n = t->shape[d];
    lua_Integer a = luaL_optinteger(L, 3, 0), b = luaL_optinteger(L, 4, n);
    if (a < 0) a += n;
    if (b < 0) b += n;
    if (a < 0 || b > n || a > b)
        return ks_lua_errorf(L, "slice", "range [%lld, %lld) is outside [0, %lld] of dimension %lld", (long long)a, (long long)b, (long long)n, (long long)d);
    int64_t shape[KS_TENSOR_MAXDIM];
    memcpy(shape, t->shape, sizeof shape);
    shape[d] = b - a;
    /* an empty tensor's data may be NULL: no offset from it (UBSan, found by fuzz_lua_prims) */
    void *data = t->data ? (char *)t->data + (size_t)(a * t->stride[d]) * esize(t) : t->data;
    ks_tensor *v = t->be ? ks_lt_dview(L, t->be, t->dtype, t->bf16, t->ndim, shape, t->stride, data, 0, 1)
                         : ks_lt_view(L, t->dtype, t->ndim, shape, t->stride, data, 0, 1);
    v->scope = t->scope;
    v->serial = t->serial;
    v->origin = t->origin;
    v->origin_layer = t->origin_layer;
    return 1;
}

/* row(i): the i-th entry of the first dimension, one dimension less (a view). */
static int l_t_row(lua_State *L) {
    ks_tensor *t = ks_lt_check(L, 1, "row");
    if (t->ndim < 1) return ks_lua_errorf(L, "row", "a scalar tensor has no rows");
    lua_Integer i = luaL_checkinteger(L, 2);
    if (i < 0) i += t->shape[0];
    if (i < 0 || i >= t->shape[0]) return ks_lua_errorf(L, "row", "row %lld out of range [0, %lld)", (long long)lua_tointeger(L, 2), (long long)t->shape[0]);
    void *data = t->data ? (char *)t->data + (size_t)(i * t->stride[0]) * esize(t) : t->data;
    ks_tensor *v = t->be ? ks_lt_dview(L, t->be, t->dtype, t->bf16, t->ndim - 1, t->shape + 1, t->stride + 1, data, 0, 1)
                         : ks_lt_view(L, t->dtype, t->ndim - 1, t->shape + 1, t->stride + 1, data, 0, 1);
    v->scope = t->scope;
    v->serial = t->serial;
    v->origin = t->origin;
    v->origin_layer = t->origin_layer;
    return 1;
}

/* A copy of the tensor at arg, on the same side (device tensors stay on their device). */
static void clone_at(lua_State *L, int arg, ks_tensor *t) {
    if (t->be) {
        int pushed;
        const void *d = ks_lt_on(L, arg, t, t->be, &pushed);
        if (pushed) return; /* already a fresh copy */
        ks_tensor *o = ks_lt_dnew(L, t->be, t->dtype, t->ndim, t->shape);
        ks_status st = t->be->copy(t->be, o->data, d, (size_t)t->numel * 4);
        if (st) ks_lua_core_error(L, "clone", st);
        return;
    }
    ks_tensor *o = ks_lt_new(L, t->dtype, t->ndim, t->shape, 0);
    ks_lt_copy_contig(t, o->data);
}

static int l_t_clone(lua_State *L) {
    ks_tensor *t = ks_lt_check(L, 1, "clone");
    clone_at(L, 1, t);
    return 1;
}

static int l_t_float(lua_State *L) {
    ks_tensor *t = ks_lt_check(L, 1, "float");
    convert(L, t, KS_T_F32);
    return 1;
}

static int l_t_int(lua_State *L) {
    ks_tensor *t = ks_lt_check(L, 1, "int");
    convert(L, t, KS_T_I32);
    return 1;
}

/* reshape(d0, d1, ...) or reshape({d0, ...}); one dimension may be -1. Contiguous tensors
 * give a view, others a copy. */
static int l_t_reshape(lua_State *L) {
    ks_tensor *t = ks_lt_check(L, 1, "reshape");
    int64_t shape[KS_TENSOR_MAXDIM];
    int nd = 0, infer = -1;
    int top = lua_gettop(L);
    if (top == 2 && lua_istable(L, 2)) {
        size_t len = lua_rawlen(L, 2);
        if (len > KS_TENSOR_MAXDIM) return ks_lua_errorf(L, "reshape", "%zu dimensions (at most %d)", len, KS_TENSOR_MAXDIM);
        int n = (int)len;
        for (int i = 0; i < n; i++) {
            lua_rawgeti(L, 2, i + 1);
            int isint;
            shape[nd++] = lua_tointegerx(L, -1, &isint);
            if (!isint) return ks_lua_errorf(L, "reshape", "shape entry %d is not an integer", i + 1);
            lua_pop(L, 1);
        }
    } else {
        if (top - 1 > KS_TENSOR_MAXDIM) return ks_lua_errorf(L, "reshape", "%d dimensions (at most %d)", top - 1, KS_TENSOR_MAXDIM);
        for (int i = 2; i <= top; i++) shape[nd++] = luaL_checkinteger(L, i);
    }
    int64_t known = 1;
    for (int i = 0; i < nd; i++) {
        if (shape[i] == -1) {
            if (infer >= 0) return ks_lua_errorf(L, "reshape", "only one dimension may be -1");
            infer = i;
        } else if (shape[i] < 0) return ks_lua_errorf(L, "reshape", "negative dimension %lld", (long long)shape[i]);
        else if (__builtin_mul_overflow(known, shape[i], &known))
            return ks_lua_errorf(L, "reshape", "shape too large (its element count overflows 64 bits)");
    }
    if (infer >= 0) {
        if (known == 0 || t->numel % known) return ks_lua_errorf(L, "reshape", "cannot infer a dimension for %lld elements", (long long)t->numel);
        shape[infer] = t->numel / known;
        known *= shape[infer];
    }
    if (known != t->numel) return ks_lua_errorf(L, "reshape", "%lld elements cannot take a shape of %lld", (long long)t->numel, (long long)known);
    int pushed = 0, bf16 = t->bf16;
    void *data = t->data;
    if (!ks_lt_is_contig(t)) {
        data = (void *)ks_lt_on(L, 1, t, t->be, &pushed); /* a contiguous copy on the same side */
        bf16 = 0;
    }
    int owner = pushed ? lua_gettop(L) : 1;
    ks_tensor *v = t->be ? ks_lt_dview(L, t->be, t->dtype, bf16, nd, shape, NULL, data, 0, owner)
                         : ks_lt_view(L, t->dtype, nd, shape, NULL, data, 0, owner);
    v->scope = t->scope;
    v->serial = t->serial;
    v->origin = t->origin;
    v->origin_layer = t->origin_layer;
    return 1;
}

static void push_shape(lua_State *L, const ks_tensor *t) {
    lua_createtable(L, t->ndim, 0);
    for (int i = 0; i < t->ndim; i++) {
        lua_pushinteger(L, t->shape[i]);
        lua_rawseti(L, -2, i + 1);
    }
}

static int l_t_size(lua_State *L) {
    ks_tensor *t = ks_lt_check(L, 1, "size");
    if (lua_isnoneornil(L, 2)) { push_shape(L, t); return 1; }
    lua_Integer d = luaL_checkinteger(L, 2);
    if (d < 0) d += t->ndim;
    if (d < 0 || d >= t->ndim) return ks_lua_errorf(L, "size", "dimension %lld out of range for a %d-d tensor", (long long)lua_tointeger(L, 2), t->ndim);
    lua_pushinteger(L, t->shape[d]);
    return 1;
}

static int l_t_index(lua_State *L) {
    /* methods first (they check the tensor themselves) */
    lua_pushvalue(L, 2);
    if (lua_rawget(L, lua_upvalueindex(1)) != LUA_TNIL) return 1;
    lua_pop(L, 1);
    if (lua_type(L, 2) == LUA_TNUMBER)
        return ks_lua_errorf(L, "tensor", "t[i] is not supported (indices are 0-based): use t:item(i) or t:row(i)");
    if (lua_type(L, 2) != LUA_TSTRING) return ks_lua_errorf(L, "tensor", "no field of type %s", luaL_typename(L, 2));
    const char *k = lua_tostring(L, 2);
    ks_tensor *t = ks_lt_check(L, 1, k);
    if (!strcmp(k, "shape")) push_shape(L, t);
    else if (!strcmp(k, "dtype")) lua_pushstring(L, ks_tdtype_name(t->dtype));
    else if (!strcmp(k, "device")) /* the emulated device is host memory: "cpu", like the policies expect there */
        lua_pushstring(L, t->be && t->be != ks_lua_emu_backend() ? t->be->name : "cpu");
    else if (!strcmp(k, "ndim")) lua_pushinteger(L, t->ndim);
    else if (!strcmp(k, "is_view")) lua_pushboolean(L, t->scope != NULL);
    else return ks_lua_errorf(L, "tensor", "no field or method '%s'", k);
    return 1;
}

static int l_t_newindex(lua_State *L) {
    return ks_lua_errorf(L, "tensor", "tensors are read-only (cannot set '%s')", luaL_tolstring(L, 2, NULL));
}

static int l_t_len(lua_State *L) {
    ks_tensor *t = ks_lt_check(L, 1, "#");
    lua_pushinteger(L, t->ndim ? t->shape[0] : 1);
    return 1;
}

static int l_t_close(lua_State *L) {
    ks_tensor *t = luaL_checkudata(L, 1, KS_TENSOR_MT);
    t->closed = 1;
    return 0;
}

static void fmt_elem(char *b, size_t n, const ks_tensor *t, int64_t off) {
    if (t->dtype == KS_T_I32) snprintf(b, n, "%d", ((const int32_t *)t->data)[off]);
    else snprintf(b, n, "%.4g", ((const float *)t->data)[off]);
}

static int l_t_tostring(lua_State *L) {
    ks_tensor *t0 = luaL_checkudata(L, 1, KS_TENSOR_MT), *t = t0;
    ks_tensor h;
    if (t->be && !t->lost && !view_stale(t)) {
        /* a device tensor: its host copy if there is one, else a few elements read one by one */
        h = *t;
        if (t->host) {
            h.data = t->host;
            h.be = NULL;
            int64_t s = 1;
            for (int i = h.ndim - 1; i >= 0; i--) { h.stride[i] = s; s *= h.shape[i] > 0 ? h.shape[i] : 1; }
            t = &h;
        }
    }
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    char tmp[64];
    luaL_addstring(&b, "tensor(");
    luaL_addstring(&b, ks_tdtype_name(t->dtype));
    luaL_addstring(&b, ", [");
    for (int i = 0; i < t->ndim; i++) {
        snprintf(tmp, sizeof tmp, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
        luaL_addstring(&b, tmp);
    }
    luaL_addstring(&b, "])");
    if (t0->be) {
        luaL_addstring(&b, " on ");
        luaL_addstring(&b, t0->be->name);
    }
    if (t->closed) luaL_addstring(&b, " <closed>");
    else if (t->lost) luaL_addstring(&b, " <lost>");
    else if (view_stale(t)) luaL_addstring(&b, " <stale view>");
    else if (t->be) { /* peek at the first elements without copying the tensor */
        luaL_addstring(&b, " [");
        int64_t show = t->numel < 8 ? t->numel : 8;
        for (int64_t i = 0; i < show; i++) {
            uint32_t u = 0;
            if (t->be->download(t->be, &u, (const char *)t->data + (size_t)flat_off(t, i) * esize(t), esize(t))) break;
            uint32_t v = t->bf16 ? span_elem(&u, 0, 1) : u;
            ks_tensor one = *t;
            one.data = &v;
            if (i) luaL_addstring(&b, ", ");
            fmt_elem(tmp, sizeof tmp, &one, 0);
            luaL_addstring(&b, tmp);
        }
        if (show < t->numel) luaL_addstring(&b, ", ...");
        luaL_addstring(&b, "]");
    } else {
        luaL_addstring(&b, " [");
        int64_t show = t->numel < 8 ? t->numel : 8;
        for (int64_t i = 0; i < show; i++) {
            if (i) luaL_addstring(&b, ", ");
            fmt_elem(tmp, sizeof tmp, t, flat_off(t, i));
            luaL_addstring(&b, tmp);
        }
        if (show < t->numel) luaL_addstring(&b, ", ...");
        luaL_addstring(&b, "]");
    }
    luaL_pushresult(&b);
    return 1;
}

/* ---------------------------------------------------------------- arithmetic */

/* a OP b where either may be a number; same shapes, or one scalar (0-d / 1 element). */
/* a + b of two f32 tensors of one shape on a device: the column sums of [a; b] (concat, then
 * sum over axis 0 in double, rounded once: the same float as the host's a + b). */
static int dev_add(lua_State *L, ks_tensor *a, ks_tensor *b) {
    ks_backend *be = a->be ? a->be : b->be;
    int pa, pb;
    const float *da = ks_lt_on(L, 1, a, be, &pa);
    int ia = lua_gettop(L);
    const float *db = ks_lt_on(L, 2, b, be, &pb);
    int64_t two = 2 * a->numel;
    ks_tensor *tmp = ks_lt_dnew(L, be, KS_T_F32, 1, &two);
    ks_status st = be->prims->concat_f32(be, da, a->numel, db, b->numel, tmp->data);
    ks_tensor *o = ks_lt_dnew(L, be, KS_T_F32, a->ndim, a->shape);
    if (!st) st = be->prims->sum(be, tmp->data, 2, a->numel, 0, o->data);
    if (st) return ks_lua_core_error(L, "add", st);
    (void)ia;
    return 1;
}

static int arith(lua_State *L, char op) {
    const char *fn = op == '+' ? "add" : op == '-' ? "sub" : op == '*' ? "mul" : "div";
    ks_tensor *a = ks_lt_test(L, 1), *b = ks_lt_test(L, 2);
    if (a) ks_lt_check(L, 1, fn);
    if (b) ks_lt_check(L, 2, fn);
    if (op == '+' && a && b && (a->be || b->be) && a->dtype == KS_T_F32 && b->dtype == KS_T_F32 && a->ndim == b->ndim &&
        !memcmp(a->shape, b->shape, sizeof(int64_t) * a->ndim) && (a->be ? a->be : b->be)->prims)
        return dev_add(L, a, b);
    ks_tensor ha, hb; /* device operands: through their host copies */
    if (a && a->be) { ha = ks_lt_rd(L, a); a = &ha; }
    if (b && b->be) { hb = ks_lt_rd(L, b); b = &hb; }
    if (!a && !lua_isnumber(L, 1)) return ks_lua_errorf(L, fn, "a tensor or number expected, got %s", luaL_typename(L, 1));
    if (!b && !lua_isnumber(L, 2)) return ks_lua_errorf(L, fn, "a tensor or number expected, got %s", luaL_typename(L, 2));
    /* the result takes the shape of the non-scalar operand (a 1-element tensor broadcasts,
     * also over an empty one: the result is then empty) */
    const ks_tensor *shape_of = a && b ? (a->numel == 1 ? b : a) : a ? a : b;
    if (a && b && a->numel != 1 && b->numel != 1) {
        if (a->ndim != b->ndim || memcmp(a->shape, b->shape, sizeof(int64_t) * a->ndim))
            return ks_lua_errorf(L, fn, "shapes differ (no broadcasting except with a scalar)");
    }
    int ints = (!a || a->dtype == KS_T_I32) && (!b || b->dtype == KS_T_I32) && op != '/' && (a || lua_isinteger(L, 1)) &&
               (b || lua_isinteger(L, 2));
    ks_tensor *o = ks_lt_new(L, ints ? KS_T_I32 : KS_T_F32, shape_of->ndim, shape_of->shape, 0);
    double sa = a ? 0 : lua_tonumber(L, 1), sb = b ? 0 : lua_tonumber(L, 2);
    for (int64_t i = 0; i < o->numel; i++) {
        double x = a ? elem_get(a, a->numel == 1 ? 0 : flat_off(a, i)) : sa;
        double y = b ? elem_get(b, b->numel == 1 ? 0 : flat_off(b, i)) : sb;
        double r = op == '+' ? x + y : op == '-' ? x - y : op == '*' ? x * y : x / y;
        if (ints) {
            /* i32 results stay i32 only when they fit (a cast of an out-of-range double is
             * undefined): an integer scalar such as math.maxinteger lands here too */
            if (!(r >= INT32_MIN && r <= INT32_MAX))
                return ks_lua_errorf(L, fn, "i32 result %.17g is outside int32 (convert with :float() first)", r);
            ((int32_t *)o->data)[i] = (int32_t)r;
        } else ((float *)o->data)[i] = (float)r;
    }
    return 1;
}
static int l_t_add(lua_State *L) { return arith(L, '+'); }
static int l_t_sub(lua_State *L) { return arith(L, '-'); }
static int l_t_mul(lua_State *L) { return arith(L, '*'); }
static int l_t_div(lua_State *L) { return arith(L, '/'); }
static int l_t_unm(lua_State *L) {
    lua_settop(L, 1);
    lua_pushinteger(L, -1);
    lua_rotate(L, 1, 1);
    return arith(L, '*');
}

/* ================================================================ module functions */

/* ks.tensor(table [, "f32"|"i32"]) : a tensor from (nested) tables; dtype inferred (all
 * integers -> i32) unless given. ks.tensor(t) of a tensor copies it. */
static int l_tensor(lua_State *L) {
    int dt = -1;
    if (!lua_isnoneornil(L, 2)) {
        const char *s = luaL_checkstring(L, 2);
        if (!strcmp(s, "f32") || !strcmp(s, "float")) dt = KS_T_F32;
        else if (!strcmp(s, "i32") || !strcmp(s, "int")) dt = KS_T_I32;
        else return ks_lua_errorf(L, "tensor", "unknown dtype \"%s\" (f32 or i32)", s);
    }
    ks_tensor *t = ks_lt_test(L, 1);
    if (t) {
        ks_lt_check(L, 1, "tensor");
        if (t->be && (dt < 0 || (ks_tdtype)dt == t->dtype)) clone_at(L, 1, t);
        else convert(L, t, dt < 0 ? t->dtype : (ks_tdtype)dt);
        return 1;
    }
    if (lua_type(L, 1) == LUA_TNUMBER) {
        ks_tdtype d = dt >= 0 ? (ks_tdtype)dt : lua_isinteger(L, 1) ? KS_T_I32 : KS_T_F32;
        ks_tensor *s = ks_lt_new(L, d, 0, NULL, 0);
        if (d == KS_T_F32) *(float *)s->data = (float)lua_tonumber(L, 1);
        else {
            lua_Integer v = luaL_checkinteger(L, 1);
            if (v < INT32_MIN || v > INT32_MAX) return ks_lua_errorf(L, "tensor", "%lld is outside int32", (long long)v);
            *(int32_t *)s->data = (int32_t)v;
        }
        return 1;
    }
    luaL_checktype(L, 1, LUA_TTABLE);
    tensor_from_table(L, 1, dt, "tensor");
    return 1;
}

static int read_shape(lua_State *L, int arg, int64_t *shape, const char *fn) {
    int nd = 0;
    if (lua_istable(L, arg)) {
        size_t len = lua_rawlen(L, arg);
        if (len > KS_TENSOR_MAXDIM) return ks_lua_errorf(L, fn, "%zu dimensions (at most %d)", len, KS_TENSOR_MAXDIM);
        int n = (int)len;
        for (int i = 0; i < n; i++) {
            lua_rawgeti(L, arg, i + 1);
            if (!lua_isinteger(L, -1)) return ks_lua_errorf(L, fn, "shape entries must be integers");
            shape[nd++] = lua_tointeger(L, -1);
            lua_pop(L, 1);
        }
    } else shape[nd++] = luaL_checkinteger(L, arg);
    return nd;
}

/* ks.zeros(shape [, dtype]) : shape is a number or a table. */
static int l_zeros(lua_State *L) {
    int64_t shape[KS_TENSOR_MAXDIM];
    int nd = read_shape(L, 1, shape, "zeros");
    const char *s = luaL_optstring(L, 2, "f32");
    ks_tdtype dt = !strcmp(s, "i32") || !strcmp(s, "int") ? KS_T_I32 : KS_T_F32;
    if (dt == KS_T_F32 && strcmp(s, "f32") && strcmp(s, "float")) return ks_lua_errorf(L, "zeros", "unknown dtype \"%s\"", s);
    ks_lt_new(L, dt, nd, shape, 1);
    return 1;
}

/* ks.stack({t1, t2, ...}) : tensors of one shape and dtype -> (k, shape...). */
static int l_stack(lua_State *L) {
    luaL_checktype(L, 1, LUA_TTABLE);
    size_t len = lua_rawlen(L, 1);
    if (len < 1) return ks_lua_errorf(L, "stack", "needs at least one tensor");
    if (len > INT32_MAX) return ks_lua_errorf(L, "stack", "too many tensors (%zu)", len);
    int k = (int)len;
    lua_rawgeti(L, 1, 1);
    ks_tensor *t0 = ks_lt_check(L, -1, "stack");
    if (t0->ndim >= KS_TENSOR_MAXDIM) return ks_lua_errorf(L, "stack", "the result would have more than %d dimensions", KS_TENSOR_MAXDIM);
    int64_t shape[KS_TENSOR_MAXDIM];
    shape[0] = k;
    memcpy(shape + 1, t0->shape, sizeof(int64_t) * t0->ndim);
    ks_tensor o0 = *t0;
    lua_pop(L, 1);
    /* on a device when any part is there (the others are uploaded) */
    ks_backend *be = NULL;
    for (int i = 0; i < k && !be; i++) {
        lua_rawgeti(L, 1, i + 1);
        ks_tensor *t = ks_lt_test(L, -1);
        if (t && t->be) be = t->be;
        lua_pop(L, 1);
    }
    ks_tensor *o = be ? ks_lt_dnew(L, be, o0.dtype, o0.ndim + 1, shape) : ks_lt_new(L, o0.dtype, o0.ndim + 1, shape, 0);
    for (int i = 0; i < k; i++) {
        lua_rawgeti(L, 1, i + 1);
        ks_tensor *t = ks_lt_check(L, -1, "stack");
        if (t->dtype != o0.dtype || t->ndim != o0.ndim || memcmp(t->shape, o0.shape, sizeof(int64_t) * o0.ndim))
            return ks_lua_errorf(L, "stack", "tensor %d differs in shape or dtype from the first", i + 1);
        if (be) {
            int pushed;
            const void *d = ks_lt_on(L, -1, t, be, &pushed);
            ks_status st = be->copy(be, (char *)o->data + (size_t)i * o0.numel * 4, d, (size_t)o0.numel * 4);
            if (st) return ks_lua_core_error(L, "stack", st);
            if (pushed) lua_pop(L, 1);
        } else ks_lt_copy_contig(t, (char *)o->data + (size_t)i * o0.numel * 4);
        lua_pop(L, 1);
    }
    return 1;
}

void ks_lt_open(lua_State *L) {
    int mod = lua_gettop(L);
    if (luaL_newmetatable(L, KS_TENSOR_MT)) {
        static const luaL_Reg methods[] = {
            {"numel", l_t_numel}, {"tolist", l_t_tolist}, {"item", l_t_item},     {"slice", l_t_slice},
            {"row", l_t_row},     {"clone", l_t_clone},   {"float", l_t_float},   {"int", l_t_int},
            {"reshape", l_t_reshape}, {"size", l_t_size}, {NULL, NULL}};
        luaL_newlib(L, methods);
        lua_pushcclosure(L, l_t_index, 1);
        lua_setfield(L, -2, "__index");
        static const luaL_Reg meta[] = {{"__gc", ks_lt_gc}, {"__newindex", l_t_newindex}, {"__len", l_t_len},   {"__close", l_t_close},
                                        {"__tostring", l_t_tostring}, {"__add", l_t_add},   {"__sub", l_t_sub},
                                        {"__mul", l_t_mul},           {"__div", l_t_div},   {"__unm", l_t_unm},
                                        {NULL, NULL}};
        luaL_setfuncs(L, meta, 0);
        lua_pushliteral(L, KS_TENSOR_MT);
        lua_setfield(L, -2, "__metatable"); /* getmetatable(t) cannot reach the real one */
        lua_pushliteral(L, KS_TENSOR_MT);
        lua_setfield(L, -2, "__name");
    }
    lua_pop(L, 1);
    static const luaL_Reg fns[] = {{"tensor", l_tensor}, {"zeros", l_zeros}, {"stack", l_stack}, {NULL, NULL}};
    lua_pushvalue(L, mod);
    luaL_setfuncs(L, fns, 0);
    lua_pop(L, 1);
}
