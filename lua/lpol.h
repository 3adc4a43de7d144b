/* lpol.h — a Lua policy (struct ks_lpol) and what the files implementing it share; internal to
 * lua/ (the public side is policy_lua.h / kvsieve.h, the module's side ks_lua.h):
 *   lua/sandbox.c      the sandbox: allocator (memory limit), instruction hook (budgets),
 *                      the protected-call choke point, the safe standard library, failures
 *   lua/events.c       the event object, its views and actions; the trampolines
 *   lua/report.c       the policy's report (ev:report / ks.report)
 *   lua/policy_load.c  loading a policy file / string / inline table; the handler table; free
 *   lua/params.c       parameters: ks_policy_set / get (--set), the reserved limits
 */
#ifndef KS_LPOL_H
#define KS_LPOL_H

#include "ks_lua.h"
#include "policy_lua.h"

#include <stdlib.h>
#include <string.h>

#define HOOK_EVERY 1000                     /* instructions between hook calls */
#define DEFAULT_MEMORY_MB 64
#define DEFAULT_INSTRUCTIONS 100000000LL
#define DEFAULT_SECONDS 30.0
#define DEFAULT_DEVICE_MB 4096

/* Where an event's views live (the reserved parameter _device, default auto; the kvsieve CLI
 * sets it from the environment variable KVSIEVE_LUA_DEVICE, repl/env_opts.c): */
enum {
    DEV_AUTO = 0,   /* on the engine's device when its backend has primitives (CUDA), else host */
    DEV_HOST = 1,   /* always host views (copies of device buffers): primitives run on the CPU */
    DEV_EMULATE = 2 /* like auto, and on the CPU backend the emulated device (ks_lua.h) */
};

typedef struct lparam {
    char *name;
    int type;     /* LUA_TNUMBER, LUA_TBOOLEAN, LUA_TSTRING, LUA_TTABLE */
    int is_int;   /* number default was an integer */
} lparam;

typedef struct lreport {
    char *key, *val;
    int type;     /* LUA_TNUMBER, LUA_TBOOLEAN, LUA_TSTRING */
} lreport;

struct ks_lpol {
    ks_policy pol;             /* what the engine sees; pol.ud == this */
    char *name;
    char *chunk;               /* file path or chunk name (messages) */
    lua_State *L;              /* the state holding the handlers */
    lua_State *run_L;          /* the thread running them (inline policies: the caller's) */
    int own_state;             /* sandboxed: L is ours */
    ks_lctx ctx;               /* the context of an own state */
    int ref_fn[KS_EV_COUNT];   /* registry refs of the handlers (LUA_NOREF if none) */
    int ref_begin, ref_params, ref_module;
    lparam *params;            /* (n_params) sorted by name */
    int n_params;
    lreport *report;           /* (n_report) */
    int n_report, cap_report;
    size_t report_bytes;       /* keys and values held, counted in ctx.mem_used (own states) */
    int busy;
    long fail_count[KS_FAIL_COUNT];
    unsigned fail_logged;      /* bit per kind */
    ks_model *model;
    int dev_mode;              /* DEV_AUTO / DEV_HOST / DEV_EMULATE */
    size_t dev_limit;          /* bytes of device tensors at once (0 = unlimited): _device_mb */
};

static inline char *xstrdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = malloc(n);
    if (p) memcpy(p, s, n);
    return p;
}

/* ---------------------------------------------------------------- sandbox.c */

/* The allocator of a policy's own state (ud: its ks_lctx): refuses growth past mem_limit. */
void *ks_lpol_alloc(void *ud, void *ptr, size_t osize, size_t nsize);
/* The instruction hook (every HOOK_EVERY instructions): Ctrl-C and the per-call budgets. */
void ks_lua_count_hook(lua_State *L, lua_Debug *ar);
/* Run fn(ud) on L under lua_pcall with the traceback handler and the budgets; what (and
 * layer >= 0) name the call in messages. KS_OK, or KS_ERR_POLICY / KS_ERR_INTERRUPTED with
 * "policy NAME: WHAT: MESSAGE" recorded (and the failure counted once loaded). */
ks_status ks_lpol_protected(ks_lpol *p, lua_State *L, lua_CFunction fn, void *ud, const char *what, int layer);
/* Under ks_lpol_protected on a fresh state (ud: the ks_lpol): the sandboxed libraries and the
 * restricted kvsieve module (ref_module). */
int ks_lpol_open_sandbox(lua_State *L);

/* ---------------------------------------------------------------- events.c */

/* The handler names, indexed by ks_event_kind (the keys of the policy table). */
extern const char *const ks_lpol_handler_names[KS_EV_COUNT];
/* The engine's entry points: ks_policy.on[kind] and ks_policy.begin (ud: the ks_lpol). */
ks_status ks_lpol_trampoline(void *ud, ks_event *ev);
ks_status ks_lpol_begin(void *ud, ks_session *s);

/* ---------------------------------------------------------------- report.c */

/* Drop every report entry (and uncharge its memory). */
void ks_lpol_report_clear(ks_lpol *p);
/* Store key (argument karg) = value (karg + 1: string, number, boolean; nil removes). Raises on
 * bad arguments and over the memory limit (fn names the call). */
int ks_lpol_do_report(lua_State *L, ks_lpol *p, int karg, const char *fn);

/* ---------------------------------------------------------------- policy_load.c */

/* ks_policy.free of a Lua policy (ks_lpol_of recognises a Lua policy by it). */
void ks_lpol_free(void *ud);

#endif
