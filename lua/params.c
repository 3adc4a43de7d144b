/* params.c — a Lua policy's parameters (lua/lpol.h): ks_policy_set parses text by the type of
 * the parameter's default (what --set and the module's `set` pass), ks_policy_get formats the
 * current value, and the names are listed in sorted order; the reserved parameters _memory_mb,
 * _instructions, _seconds (the sandbox's limits), _device and _device_mb (where an event's
 * views live, and the device memory bound); the module's params table and device counters. */
#include "lpol.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The _device modes by DEV_* value (lpol.h). */
static const char *const dev_mode_names[] = {"auto", "host", "emulate"};

static int dev_mode_parse(const char *v) {
    for (int i = 0; i < 3; i++)
        if (v && !strcasecmp(v, dev_mode_names[i])) return i;
    return -1;
}

static ks_lpol *need_lpol(const ks_policy *pol, const char *fn) {
    ks_lpol *p = ks_lpol_of((ks_policy *)pol);
    if (!p) ks_errorf(KS_ERR_ARG, "%s: policy %s is a C policy (no parameters)", fn, pol && pol->name ? pol->name : "?");
    return p;
}

static const lparam *find_param(const ks_lpol *p, const char *key) {
    for (int i = 0; i < p->n_params; i++)
        if (!strcmp(p->params[i].name, key)) return &p->params[i];
    return NULL;
}

static ks_status unknown_param(const ks_lpol *p, const char *key) {
    char list[1024] = "";
    for (int i = 0; i < p->n_params; i++) {
        size_t l = strlen(list);
        snprintf(list + l, sizeof list - l, "%s%s", i ? ", " : "", p->params[i].name);
    }
    return ks_errorf(KS_ERR_ARG, "policy %s: unknown parameter '%s' (parameters: %s%s_memory_mb, _instructions, _seconds, _device, _device_mb)",
                     p->name, key, list, p->n_params ? "; limits: " : "limits: ");
}

static int parse_bool(const char *v, int *out) {
    static const char *const t[] = {"true", "1", "yes", "on"}, *const f[] = {"false", "0", "no", "off"};
    for (int i = 0; i < 4; i++) {
        if (!strcasecmp(v, t[i])) { *out = 1; return 1; }
        if (!strcasecmp(v, f[i])) { *out = 0; return 1; }
    }
    return 0;
}

typedef struct set_args {
    ks_lpol *p;
    const char *key;
    int type;          /* what to push */
    long long i;
    double d;
    int b;
    const char *s;
    char *out;         /* get: destination */
    size_t n;
} set_args;

static int l_set_param(lua_State *L) {
    set_args *a = lua_touserdata(L, 1);
    lua_rawgeti(L, LUA_REGISTRYINDEX, a->p->ref_params);
    if (a->type == 'i') lua_pushinteger(L, a->i);
    else if (a->type == 'd') lua_pushnumber(L, a->d);
    else if (a->type == 'b') lua_pushboolean(L, a->b);
    else lua_pushstring(L, a->s);
    lua_setfield(L, -2, a->key);
    return 0;
}

/* A reserved limit's value: a finite number in [0, max] (a cast of anything larger to an
 * integer type is undefined: `_instructions=1e300` used to turn the budget off). */
static ks_status parse_limit(const ks_lpol *p, const char *key, const char *value, double max, double *out) {
    char *end;
    errno = 0;
    double v = strtod(value, &end);
    if (end == value || *end || errno || !(v >= 0) || !isfinite(v))
        return ks_errorf(KS_ERR_ARG, "policy %s: %s expects a non-negative number, got \"%s\"", p->name, key, value);
    if (v > max) return ks_errorf(KS_ERR_ARG, "policy %s: %s = %s is out of range (at most %.17g; 0 = unlimited)", p->name, key, value, max);
    *out = v;
    return KS_OK;
}

#define MAX_LIMIT_MB 1e12         /* _memory_mb, _device_mb: 1e12 MB * 2^20 < 2^63 bytes */
#define MAX_INSTRUCTIONS 1e18     /* < LLONG_MAX */
#define MAX_SECONDS 1e9

ks_status ks_policy_set(ks_policy *pol, const char *key, const char *value) {
    ks_lpol *p = need_lpol(pol, "ks_policy_set");
    if (!p) return KS_ERR_ARG;
    if (!key || !value) return ks_errorf(KS_ERR_ARG, "ks_policy_set: NULL key or value");
    char *end;
    if (!strcmp(key, "_device")) {
        int m = dev_mode_parse(value);
        if (m < 0) return ks_errorf(KS_ERR_ARG, "policy %s: _device expects auto, host or emulate, got \"%s\"", p->name, value);
        if (p->busy) return ks_errorf(KS_ERR_ARG, "policy %s: cannot set parameters while it runs", p->name);
        p->dev_mode = m;
        return KS_OK;
    }
    if (!strcmp(key, "_device_mb")) {
        double v;
        ks_status st = parse_limit(p, key, value, MAX_LIMIT_MB, &v);
        if (st) return st;
        p->dev_limit = (size_t)(v * 1048576.0);
        return KS_OK;
    }
    if (key[0] == '_') {
        if (!p->own_state) return ks_errorf(KS_ERR_ARG, "policy %s: limits apply only to sandboxed policies (loaded from a file)", p->name);
        double v;
        int known = !strcmp(key, "_memory_mb") || !strcmp(key, "_instructions") || !strcmp(key, "_seconds");
        if (!known) return unknown_param(p, key);
        ks_status st = parse_limit(p, key, value, !strcmp(key, "_memory_mb") ? MAX_LIMIT_MB : !strcmp(key, "_instructions") ? MAX_INSTRUCTIONS : MAX_SECONDS, &v);
        if (st) return st;
        if (!strcmp(key, "_memory_mb")) {
            if (v > 0 && v * 1048576.0 < (double)p->ctx.mem_used)
                return ks_errorf(KS_ERR_ARG, "policy %s: _memory_mb = %g is below what the policy uses now (%.1f MB)", p->name, v,
                                 p->ctx.mem_used / 1048576.0);
            p->ctx.mem_limit = (size_t)(v * 1048576.0);
        } else if (!strcmp(key, "_instructions")) p->ctx.instr_limit = (long long)v;
        else if (!strcmp(key, "_seconds")) p->ctx.seconds = v;
        else return unknown_param(p, key);
        return KS_OK;
    }
    const lparam *pp = find_param(p, key);
    if (!pp) return unknown_param(p, key);
    set_args a = {.p = p, .key = pp->name};
    switch (pp->type) {
    case LUA_TNUMBER:
        errno = 0;
        if (pp->is_int) {
            long long v = strtoll(value, &end, 10);
            if (end != value && !*end && !errno) { a.type = 'i'; a.i = v; break; }
            errno = 0;
            double d = strtod(value, &end); /* "1e3" is an integer too: when it is one, in range */
            if (end != value && !*end && !errno && d >= -0x1p63 && d < 0x1p63 && d == (double)(long long)d) {
                a.type = 'i';
                a.i = (long long)d;
                break;
            }
            if (end != value && !*end && d == d && (errno == ERANGE || !(d >= -0x1p63 && d < 0x1p63)))
                return ks_errorf(KS_ERR_ARG, "policy %s: parameter %s = %s is out of the integer range", p->name, key, value);
            return ks_errorf(KS_ERR_ARG, "policy %s: parameter %s expects an integer, got \"%s\"", p->name, key, value);
        }
        a.d = strtod(value, &end);
        if (end == value || *end || errno) return ks_errorf(KS_ERR_ARG, "policy %s: parameter %s expects a number, got \"%s\"", p->name, key, value);
        a.type = 'd';
        break;
    case LUA_TBOOLEAN:
        if (!parse_bool(value, &a.b))
            return ks_errorf(KS_ERR_ARG, "policy %s: parameter %s expects true or false, got \"%s\"", p->name, key, value);
        a.type = 'b';
        break;
    case LUA_TSTRING: a.type = 's'; a.s = value; break;
    default: return ks_errorf(KS_ERR_ARG, "policy %s: parameter %s is a table; set it from Lua (p.%s = ...)", p->name, key, key);
    }
    if (p->busy) return ks_errorf(KS_ERR_ARG, "policy %s: cannot set parameters while it runs", p->name);
    return ks_lpol_protected(p, p->own_state ? p->L : p->run_L, l_set_param, &a, "set", -1);
}

static int l_get_param(lua_State *L) {
    set_args *a = lua_touserdata(L, 1);
    lua_rawgeti(L, LUA_REGISTRYINDEX, a->p->ref_params);
    int t = lua_getfield(L, -1, a->key);
    if (t == LUA_TNUMBER && lua_isinteger(L, -1)) snprintf(a->out, a->n, "%lld", (long long)lua_tointeger(L, -1));
    else if (t == LUA_TNUMBER) snprintf(a->out, a->n, "%.17g", lua_tonumber(L, -1));
    else if (t == LUA_TBOOLEAN) snprintf(a->out, a->n, "%s", lua_toboolean(L, -1) ? "true" : "false");
    else if (t == LUA_TSTRING) snprintf(a->out, a->n, "%s", lua_tostring(L, -1));
    else if (t == LUA_TNIL) snprintf(a->out, a->n, "nil");
    else snprintf(a->out, a->n, "(%s)", luaL_typename(L, -1));
    return 0;
}

ks_status ks_policy_get(const ks_policy *pol, const char *key, char *buf, size_t n) {
    ks_lpol *p = need_lpol(pol, "ks_policy_get");
    if (!p) return KS_ERR_ARG;
    if (!buf || n == 0) return ks_errorf(KS_ERR_ARG, "ks_policy_get: no buffer");
    buf[0] = 0;
    if (key && !strcmp(key, "_device")) {
        snprintf(buf, n, "%s", dev_mode_names[p->dev_mode]);
        return KS_OK;
    }
    if (key && !strcmp(key, "_device_mb")) {
        snprintf(buf, n, "%.17g", p->dev_limit / 1048576.0);
        return KS_OK;
    }
    if (key && key[0] == '_' && p->own_state) {
        if (!strcmp(key, "_memory_mb")) snprintf(buf, n, "%.17g", p->ctx.mem_limit / 1048576.0);
        else if (!strcmp(key, "_instructions")) snprintf(buf, n, "%lld", p->ctx.instr_limit);
        else if (!strcmp(key, "_seconds")) snprintf(buf, n, "%.17g", p->ctx.seconds);
        else return unknown_param(p, key);
        return KS_OK;
    }
    const lparam *pp = key ? find_param(p, key) : NULL;
    if (!pp) return unknown_param(p, key ? key : "(null)");
    if (p->busy) return ks_errorf(KS_ERR_ARG, "policy %s: cannot read parameters while it runs", p->name);
    set_args a = {.p = p, .key = pp->name, .out = buf, .n = n};
    return ks_lpol_protected(p, p->own_state ? p->L : p->run_L, l_get_param, &a, "get", -1);
}

int ks_policy_n_params(const ks_policy *pol) {
    ks_lpol *p = ks_lpol_of((ks_policy *)pol);
    return p ? p->n_params : 0;
}

const char *ks_policy_param_name(const ks_policy *pol, int i) {
    ks_lpol *p = ks_lpol_of((ks_policy *)pol);
    return p && i >= 0 && i < p->n_params ? p->params[i].name : NULL;
}

const char *ks_policy_name(const ks_policy *pol) { return pol && pol->name ? pol->name : ""; }

/* ================================================================ for the module (host states) */

void ks_lpol_push_params(lua_State *L, ks_policy *pol) {
    ks_lpol *p = ks_lpol_of(pol);
    lua_newtable(L);
    if (!p) return;
    for (int i = 0; i < p->n_params; i++) {
        char buf[1024];
        if (p->params[i].type == LUA_TTABLE) {
            lua_pushliteral(L, "(table)");
        } else {
            if (ks_policy_get(pol, p->params[i].name, buf, sizeof buf)) luaL_error(L, "%s", ks_last_error());
            if (p->params[i].type == LUA_TNUMBER) {
                char *end;
                long long v = strtoll(buf, &end, 10);
                if (!*end && p->params[i].is_int) lua_pushinteger(L, v);
                else lua_pushnumber(L, strtod(buf, NULL));
            } else if (p->params[i].type == LUA_TBOOLEAN) lua_pushboolean(L, !strcmp(buf, "true"));
            else lua_pushstring(L, buf);
        }
        lua_setfield(L, -2, p->params[i].name);
    }
}

int ks_lpol_param_type(const ks_policy *pol, const char *key) {
    ks_lpol *p = ks_lpol_of((ks_policy *)pol);
    const lparam *pp = p ? find_param(p, key) : NULL;
    return pp ? pp->type : LUA_TNONE;
}

void ks_lpol_dev_stats(const ks_policy *pol, ks_lpol_devstats *out) {
    memset(out, 0, sizeof *out);
    ks_lpol *p = ks_lpol_of((ks_policy *)pol);
    out->mode = dev_mode_names[p ? p->dev_mode : DEV_AUTO];
    if (!p || !p->L) return;
    const ks_lctx *c = p->own_state ? &p->ctx : ks_lua_ctx(p->L);
    if (!c) return;
    out->allocs = c->dev_allocs;
    out->downloads = c->dev_downloads;
    out->used = c->dev_used;
    out->peak = c->dev_peak;
    out->limit = p->dev_limit;
}
