/* report.c — what a policy reports during a request (ev:report / ks.report, bound in
 * events.c): key -> value copies kept outside the Lua heap (they outlive calls), charged
 * against a sandboxed policy's memory limit like its Lua objects, cleared when a request
 * begins; the public ks_policy_report* accessors and the module's report table (lua/lpol.h). */
#include "lpol.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Report copies live outside the Lua heap (they outlive calls) but are the policy's memory:
 * a sandboxed policy's keys and values count against _memory_mb like its Lua objects. */
static void report_uncharge(ks_lpol *p, size_t n) {
    if (n > p->report_bytes) n = p->report_bytes;
    p->report_bytes -= n;
    if (p->own_state) p->ctx.mem_used -= n < p->ctx.mem_used ? n : p->ctx.mem_used;
}

static void report_charge(lua_State *L, ks_lpol *p, size_t n, const char *fn) {
    if (p->own_state) {
        ks_lctx *c = &p->ctx;
        if (c->mem_limit && (n > c->mem_limit || c->mem_used > c->mem_limit - n)) {
            c->mem_exceeded = 1;
            c->fail_kind = KS_FAIL_MEMORY;
            ks_lua_errorf(L, fn, "memory limit of %.4g MB exceeded by a %zu-byte report entry (reports count as the policy's memory; "
                                 "parameter _memory_mb)", c->mem_limit / 1048576.0, n);
        }
        c->mem_used += n;
    }
    p->report_bytes += n;
}

void ks_lpol_report_clear(ks_lpol *p) {
    for (int i = 0; i < p->n_report; i++) {
        free(p->report[i].key);
        free(p->report[i].val);
    }
    p->n_report = 0;
    report_uncharge(p, p->report_bytes);
}

/* Store key = value (string, number, boolean; nil removes). Raises on bad arguments. */
int ks_lpol_do_report(lua_State *L, ks_lpol *p, int karg, const char *fn) {
    const char *key = luaL_checkstring(L, karg);
    char buf[64];
    const char *val = NULL;
    int type = lua_type(L, karg + 1);
    switch (type) {
    case LUA_TNUMBER:
        if (lua_isinteger(L, karg + 1)) snprintf(buf, sizeof buf, "%lld", (long long)lua_tointeger(L, karg + 1));
        else snprintf(buf, sizeof buf, "%.14g", lua_tonumber(L, karg + 1));
        val = buf;
        break;
    case LUA_TBOOLEAN: val = lua_toboolean(L, karg + 1) ? "true" : "false"; break;
    case LUA_TSTRING: val = lua_tostring(L, karg + 1); break;
    case LUA_TNIL: break;
    default: return ks_lua_errorf(L, fn, "value must be a string, number, boolean or nil, got %s", luaL_typename(L, karg + 1));
    }
    for (int i = 0; i < p->n_report; i++)
        if (!strcmp(p->report[i].key, key)) {
            size_t old = strlen(p->report[i].val) + 1;
            if (!val) {
                report_uncharge(p, old + strlen(p->report[i].key) + 1);
                free(p->report[i].key);
                free(p->report[i].val);
                p->report[i] = p->report[--p->n_report];
                return 0;
            }
            /* the new value replaces the old one: only a growth must fit (charged before
             * anything changes, so a refusal leaves the entry and the count as they were) */
            size_t nv = strlen(val) + 1;
            if (nv > old) report_charge(L, p, nv - old, fn);
            char *v = xstrdup(val);
            if (!v) {
                if (nv > old) report_uncharge(p, nv - old);
                return luaL_error(L, "out of memory");
            }
            if (nv < old) report_uncharge(p, old - nv);
            free(p->report[i].val);
            p->report[i].val = v;
            p->report[i].type = type;
            return 0;
        }
    if (!val) return 0;
    if (p->n_report == p->cap_report) {
        int cap = p->cap_report * 2 + 8;
        if (cap > 4096) return ks_lua_errorf(L, fn, "too many report keys (at most 4096)");
        lreport *r = realloc(p->report, sizeof *r * cap);
        if (!r) return luaL_error(L, "out of memory");
        p->report = r;
        p->cap_report = cap;
    }
    size_t nb = strlen(key) + 1 + strlen(val) + 1;
    report_charge(L, p, nb, fn);
    char *k = xstrdup(key), *v = xstrdup(val);
    if (!k || !v) { free(k); free(v); report_uncharge(p, nb); return luaL_error(L, "out of memory"); }
    p->report[p->n_report++] = (lreport){k, v, type};
    return 0;
}

/* ================================================================ the public accessors */

const char *ks_policy_report(const ks_policy *pol, const char *key) {
    ks_lpol *p = ks_lpol_of((ks_policy *)pol);
    if (!p || !key) return NULL;
    for (int i = 0; i < p->n_report; i++)
        if (!strcmp(p->report[i].key, key)) return p->report[i].val;
    return NULL;
}

int ks_policy_n_reports(const ks_policy *pol) {
    ks_lpol *p = ks_lpol_of((ks_policy *)pol);
    return p ? p->n_report : 0;
}

const char *ks_policy_report_key(const ks_policy *pol, int i) {
    ks_lpol *p = ks_lpol_of((ks_policy *)pol);
    return p && i >= 0 && i < p->n_report ? p->report[i].key : NULL;
}

void ks_lpol_push_report(lua_State *L, const ks_policy *pol) {
    ks_lpol *p = ks_lpol_of((ks_policy *)pol);
    lua_newtable(L);
    if (!p) return;
    for (int i = 0; i < p->n_report; i++) {
        const lreport *r = &p->report[i];
        if (r->type == LUA_TNUMBER) {
            char *end;
            long long v = strtoll(r->val, &end, 10);
            if (!*end) lua_pushinteger(L, v);
            else lua_pushnumber(L, strtod(r->val, NULL));
        } else if (r->type == LUA_TBOOLEAN) lua_pushboolean(L, !strcmp(r->val, "true"));
        else lua_pushstring(L, r->val);
        lua_setfield(L, -2, r->key);
    }
}
