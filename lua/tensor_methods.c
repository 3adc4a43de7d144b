/* tensor_methods.c — the methods and operators of the tensor userdata ("kvsieve.tensor"):
 *
 *   t:numel() t:size([dim]) t:tolist() t:item(i...) t:slice(dim, b, e) t:row(i) t:clone()
 *   t:float() t:int() t:reshape(shape)   t.shape t.dtype t.ndim t.device   #t   tostring(t)
 *   t + u, t - u, t * u, t / u, -t (elementwise, numbers broadcast), __close
 *
 * Element access is strided over host data; a device tensor is read through its one cached
 * host copy (lua/tensor_dev.c), except f32 a + b of device tensors, which stays on the device
 * (two primitives of its backend's table). Views (slice, row, reshape of contiguous data) keep
 * their owner alive and stay scoped to the owner's event. */
#include "tensor_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int l_t_numel(lua_State *L) {
    ks_tensor *t = ks_lt_check(L, 1, "numel");
    lua_pushinteger(L, t->numel);
    return 1;
}

static void push_list(lua_State *L, const ks_tensor *t, int d, int64_t off) {
    int64_t n = t->shape[d];
    lua_createtable(L, (int)n, 0);
    for (int64_t i = 0; i < n; i++) {
        if (d + 1 == t->ndim) ks_lt_push_elem(L, t, off + i * t->stride[d]);
        else push_list(L, t, d + 1, off + i * t->stride[d]);
        lua_rawseti(L, -2, (lua_Integer)i + 1);
    }
}

static int l_t_tolist(lua_State *L) {
    ks_tensor *t0 = ks_lt_check(L, 1, "tolist");
    ks_tensor h = ks_lt_rd(L, t0), *t = &h;
    if (t->ndim == 0) ks_lt_push_elem(L, t, 0);
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
    ks_lt_push_elem(L, &one, 0);
}

static int l_t_item(lua_State *L) {
    ks_tensor *t = ks_lt_check(L, 1, "item");
    ks_tensor h;
    /* device tensors: through the host copy when it exists or is small, else one element */
    if (t->be && ((t->host && !ks_lt_mut(t)) || t->numel <= 4096)) { h = ks_lt_rd(L, t); t = &h; }
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
    else ks_lt_push_elem(L, t, off);
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
    v->base = t->base ? t->base : t; /* the memory it reads */
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
    v->base = t->base ? t->base : t;
    v->origin = t->origin;
    v->origin_layer = t->origin_layer;
    return 1;
}

/* A copy of the tensor at arg, on the same side (device tensors stay on their device). */
void ks_lt_clone_at(lua_State *L, int arg, ks_tensor *t) {
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
    ks_lt_clone_at(L, 1, t);
    return 1;
}

static int l_t_float(lua_State *L) {
    ks_tensor *t = ks_lt_check(L, 1, "float");
    ks_lt_convert(L, t, KS_T_F32);
    return 1;
}

static int l_t_int(lua_State *L) {
    ks_tensor *t = ks_lt_check(L, 1, "int");
    ks_lt_convert(L, t, KS_T_I32);
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
    v->base = pushed ? NULL : t->base ? t->base : t; /* a copy reads its own memory */
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
    else if (!strcmp(k, "storage")) /* the elements in memory: a bf16 view (the CUDA KV cache) reads as f32 */
        lua_pushstring(L, t->bf16 ? "bf16" : ks_tdtype_name(t->dtype));
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
    if (t->be && !t->lost && !ks_lt_view_stale(t)) {
        /* a device tensor: its host copy if there is one, else a few elements read one by one */
        h = *t;
        if (t->host && !ks_lt_mut(t)) {
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
    else if (ks_lt_view_stale(t)) luaL_addstring(&b, " <stale view>");
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

/* t (the i32 tensor at arg, on a device, marked valid by construction in [lo, hi), lo >= 0) + c
 * on its device without a download: the rows t of arange(c, c + hi) (two launches), marked
 * [lo + c, hi + c). 0: not such a case (the host path runs). */
static int dev_shift(lua_State *L, int arg, ks_tensor *t, lua_Integer c) {
    int64_t lo, hi;
    ks_backend *be = t->be;
    if (!be || !be->prims || t->bf16 || t->dtype != KS_T_I32 || t->ndim != 1 || !ks_lt_sorted(L, arg, &lo, &hi))
        return 0;
    if (lo < 0 || hi < 1 || c < INT32_MIN || c > INT32_MAX || hi + c > INT32_MAX || lo + c < INT32_MIN) return 0;
    int64_t n = hi;
    ks_tensor *ar = ks_lt_dnew(L, be, KS_T_I32, 1, &n);
    ks_status st = be->prims->arange(be, c, c + hi, 1, ar->data);
    if (st) return ks_lua_core_error(L, "add", st);
    int pushed;
    const int32_t *ix = ks_lt_on(L, arg, t, be, &pushed);
    ks_tensor *o = ks_lt_dnew(L, be, KS_T_I32, 1, t->shape);
    if ((st = be->prims->gather_i32(be, ar->data, hi, ix, t->numel, o->data, NULL))) return ks_lua_core_error(L, "add", st);
    ks_lt_mark_sorted(L, -1, lo + c, hi + c);
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
    /* a marked device list shifted by an integer (topk's rows + lo): stays on the device, marked */
    if ((op == '+' || op == '-') && a && !b && lua_isinteger(L, 2) && lua_tointeger(L, 2) != LUA_MININTEGER &&
        dev_shift(L, 1, a, op == '+' ? lua_tointeger(L, 2) : -lua_tointeger(L, 2)))
        return 1;
    if (op == '+' && b && !a && lua_isinteger(L, 1) && dev_shift(L, 2, b, lua_tointeger(L, 1))) return 1;
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
        double x = a ? ks_lt_elem_get(a, a->numel == 1 ? 0 : flat_off(a, i)) : sa;
        double y = b ? ks_lt_elem_get(b, b->numel == 1 ? 0 : flat_off(b, i)) : sb;
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

/* ================================================================ the metatable */

void ks_lt_methods_open(lua_State *L) {
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
