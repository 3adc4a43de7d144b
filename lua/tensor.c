/* tensor.c — the tensor userdata ("kvsieve.tensor"): construction and checks.
 *
 * A tensor is a full userdata: a ks_tensor header followed (for owned tensors) by its data,
 * so the Lua allocator accounts for every byte (a policy's memory limit covers tensors too)
 * and the garbage collector frees it. A view points into memory it does not own: engine
 * buffers (scoped to the event that handed it out: using it later is an error, not a
 * crash) or another tensor (kept alive through the view's user value). Element access is
 * strided; most primitives take contiguous data and copy a strided argument first.
 *
 * Here: owned tensors and views, argument checks, tensors from Lua tables and conversions,
 * ks.tensor / ks.zeros / ks.stack, and the binding's error helpers (ks_lua_errorf,
 * ks_lua_core_error), which name the running event. The methods and operators are
 * lua/tensor_methods.c. Device tensors (ks_lua.h) keep their elements in backend memory; what
 * keeps them there is lua/tensor_dev.c: element access goes through one cached host copy per
 * tensor (ks_lt_host / ks_lt_rd), views of them are device views, and at the end of each event
 * the survivors stay on the device for later events (ks_lt_dev_settle). */
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

/* The element count of a shape, checked before any stride is computed: every dimension >= 0,
 * and the product of the dimensions with zeros counted as ones (the extent that strides and
 * partial products reach, also for an empty tensor such as (0, 2^62, 8)) at most 2^40. */
static int64_t shape_numel(lua_State *L, int ndim, const int64_t *shape) {
    int64_t n = 1, ext = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) luaL_error(L, "tensor: negative dimension %I", (lua_Integer)shape[i]);
        if (__builtin_mul_overflow(ext, shape[i] ? shape[i] : 1, &ext) || ext > ((int64_t)1 << 40))
            luaL_error(L, "tensor: too many elements");
        n *= shape[i];
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
    t->numel = shape_numel(L, ndim, shape);
    if (stride)
        for (int i = 0; i < ndim; i++) t->stride[i] = stride[i];
    else contig_strides(ndim, shape, t->stride);
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

int ks_lt_owned(const ks_tensor *t) {
    if (t->be) return t->dev_owned && t->data == t->dev_owned && !t->bf16;
    return t->data == (const char *)t + HDR_SIZE;
}

ks_tensor *ks_lt_test(lua_State *L, int idx) { return luaL_testudata(L, idx, KS_TENSOR_MT); }

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
    if (ks_lt_view_stale(t)) {
        ks_lctx *c = ks_lua_ctx(L);
        if (c) c->fail_kind = KS_FAIL_STALE;
        if (t->origin_layer >= 0)
            ks_lua_errorf(L, fn, "tensor view used after its event ended (it came from %s, layer %d; keep a copy with :clone())",
                          t->origin, t->origin_layer);
        else
            ks_lua_errorf(L, fn, "tensor view used after its event ended (it came from %s; keep a copy with :clone())",
                          t->origin ? t->origin : "?");
    }
    if (t->grow && strcmp(fn, "scores") && strcmp(fn, "topk")) /* its length is the recording's, not a replay's */
        ks_lua_errorf(L, fn, "argument %d follows the layer's rows in a recorded handler (ev:kv_keys() or a ks.scores "
                      "result over it): only ks.scores and ks.topk take it", arg);
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
ks_tensor *ks_lt_convert(lua_State *L, ks_tensor *t0, ks_tdtype dt) {
    ks_tensor h = ks_lt_rd(L, t0), *t = &h; /* device tensors: through their host copy */
    ks_tensor *o = ks_lt_new(L, dt, t->ndim, t->shape, 0);
    for (int64_t i = 0; i < t->numel; i++) {
        int64_t off = flat_off(t, i);
        if (dt == KS_T_F32) ((float *)o->data)[i] = (float)ks_lt_elem_get(t, off);
        else {
            double v = ks_lt_elem_get(t, off);
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
    return ks_lt_convert(L, t, dt);
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
        if (t->be && (dt < 0 || (ks_tdtype)dt == t->dtype)) ks_lt_clone_at(L, 1, t);
        else ks_lt_convert(L, t, dt < 0 ? t->dtype : (ks_tdtype)dt);
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
    if (luaL_newmetatable(L, KS_TENSOR_MT)) ks_lt_methods_open(L);
    lua_pop(L, 1);
    static const luaL_Reg fns[] = {{"tensor", l_tensor}, {"zeros", l_zeros}, {"stack", l_stack}, {NULL, NULL}};
    lua_pushvalue(L, mod);
    luaL_setfuncs(L, fns, 0);
    lua_pop(L, 1);
}
