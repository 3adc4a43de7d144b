/* tensor.c — the tensor userdata ("kvsieve.tensor").
 *
 * A tensor is a full userdata: a ks_tensor header followed (for owned tensors) by its data,
 * so the Lua allocator accounts for every byte (a policy's memory limit covers tensors too)
 * and the garbage collector frees it. A view points into memory it does not own: engine
 * buffers (scoped to the event that handed it out: using it later is an error, not a
 * crash) or another tensor (kept alive through the view's user value). Element access is
 * strided; most primitives take contiguous data and copy a strided argument first. */
#include "ks_lua.h"

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
    t->data = data;
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

/* Element offset (in elements) of the flat index i (row-major order) in t. */
static inline int64_t flat_off(const ks_tensor *t, int64_t i) {
    int64_t off = 0;
    for (int d = t->ndim - 1; d >= 0; d--) {
        int64_t s = t->shape[d];
        off += (i % s) * t->stride[d];
        i /= s;
    }
    return off;
}

static void copy_contig(const ks_tensor *t, void *out) {
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
    if (ks_lt_is_contig(t)) return t->data;
    ks_tensor *c = ks_lt_new(L, t->dtype, t->ndim, t->shape, 0);
    copy_contig(t, c->data);
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

static int all_integers(lua_State *L, int idx, int depth, int nd) {
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
            if (!lua_istable(L, -1)) ks_lua_errorf(L, fn, "ragged table: expected a nested table, got %s", luaL_typename(L, -1));
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
    if (t->numel > 0 || nd == 1) fill_from_table(L, idx, t, 0, &pos, fn);
    return t;
}

/* Convert tensor t into a new owned tensor of dtype dt (pushed). */
static ks_tensor *convert(lua_State *L, const ks_tensor *t, ks_tdtype dt) {
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
    ks_tensor *t = ks_lt_check(L, 1, "tolist");
    if (t->ndim == 0) push_elem(L, t, 0);
    else {
        luaL_checkstack(L, t->ndim + 4, "tolist");
        push_list(L, t, 0, 0);
    }
    return 1;
}

static int l_t_item(lua_State *L) {
    ks_tensor *t = ks_lt_check(L, 1, "item");
    if (lua_gettop(L) >= 2) { /* item(i, j, ...) : one element, 0-based */
        int nidx = lua_gettop(L) - 1;
        if (nidx != t->ndim) return ks_lua_errorf(L, "item", "%d indices for a %d-d tensor", nidx, t->ndim);
        int64_t off = 0;
        for (int d = 0; d < t->ndim; d++) {
            lua_Integer i = luaL_checkinteger(L, d + 2);
            if (i < 0) i += t->shape[d];
            if (i < 0 || i >= t->shape[d])
                return ks_lua_errorf(L, "item", "index %lld out of range [0, %lld) in dimension %d", (long long)lua_tointeger(L, d + 2),
                                     (long long)t->shape[d], d);
            off += i * t->stride[d];
        }
        push_elem(L, t, off);
        return 1;
    }
    if (t->numel != 1) return ks_lua_errorf(L, "item", "tensor has %lld elements (item needs exactly 1, or indices)", (long long)t->numel);
    push_elem(L, t, 0);
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
    void *data = (char *)t->data + (size_t)(a * t->stride[d]) * 4;
    ks_tensor *v = ks_lt_view(L, t->dtype, t->ndim, shape, t->stride, data, 0, 1);
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
    void *data = (char *)t->data + (size_t)(i * t->stride[0]) * 4;
    ks_tensor *v = ks_lt_view(L, t->dtype, t->ndim - 1, t->shape + 1, t->stride + 1, data, 0, 1);
    v->scope = t->scope;
    v->serial = t->serial;
    v->origin = t->origin;
    v->origin_layer = t->origin_layer;
    return 1;
}

static int l_t_clone(lua_State *L) {
    ks_tensor *t = ks_lt_check(L, 1, "clone");
    ks_tensor *o = ks_lt_new(L, t->dtype, t->ndim, t->shape, 0);
    copy_contig(t, o->data);
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
        int n = (int)lua_rawlen(L, 2);
        if (n > KS_TENSOR_MAXDIM) return ks_lua_errorf(L, "reshape", "%d dimensions (at most %d)", n, KS_TENSOR_MAXDIM);
        for (int i = 0; i < n; i++) {
            lua_rawgeti(L, 2, i + 1);
            shape[nd++] = lua_tointeger(L, -1);
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
        else known *= shape[i];
    }
    if (infer >= 0) {
        if (known == 0 || t->numel % known) return ks_lua_errorf(L, "reshape", "cannot infer a dimension for %lld elements", (long long)t->numel);
        shape[infer] = t->numel / known;
        known *= shape[infer];
    }
    if (known != t->numel) return ks_lua_errorf(L, "reshape", "%lld elements cannot take a shape of %lld", (long long)t->numel, (long long)known);
    int pushed;
    void *data = ks_lt_contig(L, 1, t, &pushed);
    int owner = pushed ? lua_gettop(L) : 1;
    ks_tensor *v = ks_lt_view(L, t->dtype, nd, shape, NULL, data, 0, owner);
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
    else if (!strcmp(k, "device")) lua_pushliteral(L, "cpu");
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
    ks_tensor *t = luaL_checkudata(L, 1, KS_TENSOR_MT);
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
    if (t->closed) luaL_addstring(&b, " <closed>");
    else if (view_stale(t)) luaL_addstring(&b, " <stale view>");
    else {
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
static int arith(lua_State *L, char op) {
    const char *fn = op == '+' ? "add" : op == '-' ? "sub" : op == '*' ? "mul" : "div";
    ks_tensor *a = ks_lt_test(L, 1), *b = ks_lt_test(L, 2);
    if (a) ks_lt_check(L, 1, fn);
    if (b) ks_lt_check(L, 2, fn);
    if (!a && !lua_isnumber(L, 1)) return ks_lua_errorf(L, fn, "a tensor or number expected, got %s", luaL_typename(L, 1));
    if (!b && !lua_isnumber(L, 2)) return ks_lua_errorf(L, fn, "a tensor or number expected, got %s", luaL_typename(L, 2));
    const ks_tensor *shape_of = a && b ? (a->numel >= b->numel ? a : b) : a ? a : b;
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
        if (ints) ((int32_t *)o->data)[i] = (int32_t)(int64_t)r;
        else ((float *)o->data)[i] = (float)r;
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
        convert(L, t, dt < 0 ? t->dtype : (ks_tdtype)dt);
        return 1;
    }
    if (lua_type(L, 1) == LUA_TNUMBER) {
        ks_tdtype d = dt >= 0 ? (ks_tdtype)dt : lua_isinteger(L, 1) ? KS_T_I32 : KS_T_F32;
        ks_tensor *s = ks_lt_new(L, d, 0, NULL, 0);
        if (d == KS_T_F32) *(float *)s->data = (float)lua_tonumber(L, 1);
        else *(int32_t *)s->data = (int32_t)luaL_checkinteger(L, 1);
        return 1;
    }
    luaL_checktype(L, 1, LUA_TTABLE);
    tensor_from_table(L, 1, dt, "tensor");
    return 1;
}

static int read_shape(lua_State *L, int arg, int64_t *shape, const char *fn) {
    int nd = 0;
    if (lua_istable(L, arg)) {
        int n = (int)lua_rawlen(L, arg);
        if (n > KS_TENSOR_MAXDIM) return ks_lua_errorf(L, fn, "%d dimensions (at most %d)", n, KS_TENSOR_MAXDIM);
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
    int k = (int)lua_rawlen(L, 1);
    if (k < 1) return ks_lua_errorf(L, "stack", "needs at least one tensor");
    lua_rawgeti(L, 1, 1);
    ks_tensor *t0 = ks_lt_check(L, -1, "stack");
    if (t0->ndim >= KS_TENSOR_MAXDIM) return ks_lua_errorf(L, "stack", "the result would have more than %d dimensions", KS_TENSOR_MAXDIM);
    int64_t shape[KS_TENSOR_MAXDIM];
    shape[0] = k;
    memcpy(shape + 1, t0->shape, sizeof(int64_t) * t0->ndim);
    ks_tensor o0 = *t0;
    lua_pop(L, 1);
    ks_tensor *o = ks_lt_new(L, o0.dtype, o0.ndim + 1, shape, 0);
    for (int i = 0; i < k; i++) {
        lua_rawgeti(L, 1, i + 1);
        ks_tensor *t = ks_lt_check(L, -1, "stack");
        if (t->dtype != o0.dtype || t->ndim != o0.ndim || memcmp(t->shape, o0.shape, sizeof(int64_t) * o0.ndim))
            return ks_lua_errorf(L, "stack", "tensor %d differs in shape or dtype from the first", i + 1);
        copy_contig(t, (char *)o->data + (size_t)i * o0.numel * 4);
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
        static const luaL_Reg meta[] = {{"__newindex", l_t_newindex}, {"__len", l_t_len},   {"__close", l_t_close},
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
