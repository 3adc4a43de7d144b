/* ks_lua.h — the Lua 5.4 binding of kvsieve (internal to lua/ and repl/).
 *
 * Pieces (one file each):
 *   lua/tensor.c      the tensor userdata ("kvsieve.tensor"): owned data or views into engine
 *                     memory that die with their event; methods; the error helpers below
 *   lua/tensor_dev.c  device residency of tensors: device views and owned device tensors,
 *                     downloads and host copies, staging on a backend, the end of an event
 *   lua/prims_lua.c   the native primitives (pool1d, topk, sort, ...) and the primitive registry:
 *                     one ks_backend_prims entry per call, the device backend's table for device
 *                     tensors, the CPU backend's (core/cpu_prims.c) for host ones (prims_impl.h)
 *   lua/prims_scores.c ks.scores and its options
 *   lua/ext_rope.c    ks.rope, the model's rotary embedding as a primitive
 *   lua/emu_device.c  the emulated device: the device-tensor path on the CPU, for tests
 *   Lua policies (struct ks_lpol, lua/lpol.h; the public ks_policy_* C API, policy_lua.h):
 *   lua/sandbox.c     a policy state's allocator, budgets, protected calls, safe stdlib
 *   lua/events.c      the event object, its views and actions; the trampolines
 *   lua/report.c      reports (ev:report / ks.report)
 *   lua/policy_load.c loading a policy file / string / inline table; the handler table
 *   lua/params.c      parameters (ks_policy_set / get, --set) and the reserved limits
 *   lua/module.c      the `kvsieve` module for scripts and the REPL: the module table, models,
 *                     the embedded prelude; module_policy.c policy objects, module_session.c
 *                     sessions, generate and results (module_impl.h)
 *
 * Every lua_State the binding touches carries a ks_lctx in its extra space (LUA_EXTRASPACE):
 * the event scope (which event is running, for views and error messages) and, in a policy's
 * sandboxed state, its limits. Conventions of the Lua API: token positions, rows, heads and
 * tensor dimensions are 0-based everywhere; Lua tables returned are ordinary 1-based
 * sequences. Only this layer raises Lua errors; core calls return a status and the binding
 * converts it with luaL_error after its own cleanup (no longjmp ever crosses a core frame).
 * The binding reads sessions and models through calls (kvsieve.h, core/session_api.h), never
 * through the fields of struct ks_session or struct ks_model: no file of lua/ includes engine.h
 * (their definitions). Events are
 * read as core/policy.h's ks_event record (the engine's interface to policies: zero-copy views of
 * its buffers), backends through backend.h's interface (memory, rope, the prims table).
 */
#ifndef KS_LUA_H
#define KS_LUA_H

#include <lauxlib.h>
#include <lua.h>
#include <signal.h>
#include <stdint.h>

#include "policy.h"
#include "session_api.h"

/* ---------------------------------------------------------------- per-state context */

/* Failure kinds of policy calls (counted per policy; each kind is logged once). */
typedef enum ks_fail_kind {
    KS_FAIL_NONE = 0,
    KS_FAIL_ERROR,        /* a Lua error raised by the handler (or a primitive / action) */
    KS_FAIL_MEMORY,       /* the policy's memory limit */
    KS_FAIL_INSTRUCTIONS, /* the per-call instruction budget */
    KS_FAIL_TIMEOUT,      /* the per-call wall-clock budget */
    KS_FAIL_RETURN,       /* a handler returned something */
    KS_FAIL_STALE,        /* a view or event object used after its event ended */
    KS_FAIL_FORBIDDEN,    /* a call outside the sandbox's allow-list */
    KS_FAIL_INTERRUPTED,  /* Ctrl-C */
    KS_FAIL_COUNT
} ks_fail_kind;

const char *ks_fail_kind_name(ks_fail_kind k);

struct ks_lpol;

typedef struct ks_lctx {
    int sandboxed;                 /* a policy's own state (limits apply) */
    const char *name;              /* policy name for messages / print (sandboxed states) */
    /* event scope: views created during an event are valid while serial stays the same */
    int in_event;
    uint64_t serial, next_serial;
    const char *event;             /* name of the running event, or NULL */
    int layer;                     /* its layer (-1 if none) */
    ks_event *ev;                  /* the running engine event (NULL outside events) */
    struct ks_lpol *pol;           /* the policy whose handler runs */
    /* sandbox limits (0 = unlimited) */
    size_t mem_used, mem_limit;
    int mem_exceeded;              /* the allocator refused a block since the last reset */
    int budget_active;             /* instruction / time budgets apply to the current call */
    long long instr_count, instr_limit;
    double seconds, deadline;      /* deadline is set at the call's first hook tick (lazily:
                                    * no clock read for calls that run fewer instructions) */
    int event_mt_ref;              /* registry ref of the event metatable (0 = not yet) */
    volatile sig_atomic_t *interrupt;
    ks_fail_kind fail_kind;        /* set just before raising a classified error */
    /* host copies of device buffers viewed during the running event (non-CPU backends in
     * "host" device mode): allocated outside the policy's Lua allocator (they are engine
     * data, not policy memory) and freed when the event ends */
    void *stage[16];
    int n_stage;
    /* device tensors (see "device tensors" below) */
    struct ks_backend *dev;        /* the running event's views live here (NULL: host views) */
    struct ks_tensor *dev_head;    /* every live device tensor of this state (a list) */
    long dev_live;                 /* its length */
    size_t dev_used, dev_limit;    /* bytes of owned device tensors; limit 0 = none */
    size_t dev_peak;               /* most bytes at once since the state was made */
    long dev_downloads;            /* host copies made of device data (tests, reports) */
    long dev_allocs;               /* device tensors allocated */
    uint64_t next_id;              /* the last ks_tensor.id given */
} ks_lctx;

/* The context of L (every state made by the binding has one). */
static inline ks_lctx *ks_lua_ctx(lua_State *L) { return *(ks_lctx **)lua_getextraspace(L); }
static inline void ks_lua_set_ctx(lua_State *L, ks_lctx *c) { *(ks_lctx **)lua_getextraspace(L) = c; }

/* " (in prefill_qkv, layer 3)" when an event runs on L, else "". buf >= 64 bytes. */
const char *ks_lua_where_event(lua_State *L, char *buf, size_t n);
/* Raise "fn: <formatted message> (in EVENT, layer L)" with the caller's file:line. */
int ks_lua_errorf(lua_State *L, const char *fn, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Raise the core's last error (ks_last_error), naming fn if the message does not already. */
int ks_lua_core_error(lua_State *L, const char *fn, ks_status st);

/* ---------------------------------------------------------------- tensors */

#define KS_TENSOR_MT "kvsieve.tensor"
#define KS_TENSOR_MAXDIM 4

typedef enum ks_tdtype { KS_T_ANY = -1 /* arguments: keep / infer */, KS_T_F32 = 0, KS_T_I32 = 1 } ks_tdtype;

/* Device tensors. A tensor whose `be` is set lives in that backend's memory: `data` is a
 * backend address the host never dereferences. They come from an event's views when the
 * engine's backend has primitives (ks_backend.prims; the CUDA backend) or from the emulated
 * device (below), and from primitives run on such views: a primitive with a device input runs
 * the backend's primitive and returns owned device tensors (host inputs are uploaded, unless
 * they outweigh the device ones: then the device ones are downloaded and it runs on the host).
 * Element access and host-only consumers (item, tolist, tostring, arithmetic other than f32
 * a + b, dtype conversion, actions taking index tensors) download lazily: one contiguous host
 * copy per tensor, kept (tensors are read-only, so it never goes stale; the one exception, a
 * tensor written in place by an `into` option, is read again at each use: ks_tensor.mut) and
 * counted in the policy's Lua memory. Owned device memory is counted separately (ks_lctx.dev_used against
 * dev_limit: the reserved parameter _device_mb) and freed by the garbage collector.
 * Lifetime: when a handler returns, the state is collected (garbage device tensors are freed)
 * and every device tensor still reachable (a policy keeping a selection, a fingerprint or page
 * summaries for later steps) stays on the device, `kept`, for any later event to use in place
 * (tensors are read-only: nothing can go stale; counted against _device_mb until collected);
 * views of engine buffers (ev.q, ev:kv_keys(), their slices) are stale instead, as on the host.
 * Kept tensors are the model's backend memory: free a policy before closing its model. A
 * handler that fails leaves the device tensors it made "lost" (freed; using one is an error);
 * kept ones of earlier events stay valid. */
typedef struct ks_tensor {
    ks_tdtype dtype;                   /* logical type (a bf16 device view reads as f32) */
    int ndim;                          /* 0..4 (0 = scalar) */
    int64_t shape[KS_TENSOR_MAXDIM];
    int64_t stride[KS_TENSOR_MAXDIM];  /* in elements */
    int64_t numel;
    void *data;                        /* first element (host, or backend memory when be) */
    ks_lctx *scope;                    /* non-NULL: valid only while scope->serial == serial */
    uint64_t serial;
    const char *origin;                /* the event it came from (static string) */
    int origin_layer;
    int closed;                        /* closed by __close */
    /* device tensors */
    struct ks_backend *be;             /* NULL: host data */
    int bf16;                          /* elements stored as bf16 (views of a bf16 KV cache) */
    int lost;                          /* its event failed while it was on the device */
    void *dev_owned;                   /* backend allocation owned (freed on GC / move to host) */
    size_t dev_bytes;
    void *host;                        /* contiguous host copy (numel elements of dtype), or NULL;
                                        * owned, from the state's allocator (host_bytes) */
    size_t host_bytes;
    ks_lctx *dctx;                     /* the list it is on (device tensors) */
    struct ks_tensor *dnext, *dprev;
    int kept;                          /* outlived the event that made it (ks_lt_dev_settle) */
    uint64_t id;                       /* owned device tensors: a number no other tensor of this state
                                        * had (its data never changes: ks_dev_list.serial) */
    struct ks_lend *lend;              /* owned device tensors lent to the engine (ks_lt_lend), or NULL */
    int64_t grow;                      /* > 0: its last dimension follows the layer's rows at the replays of
                                        * a recorded handler (policy.h ks_event.grow): ev:kv_keys() while
                                        * the engine records, and ks.scores results over such keys with
                                        * end-relative ranges; only ks.scores and ks.topk read it (others
                                        * refuse it); the allocation has room for this many more columns */
    int mut;                           /* written in place (ks.where / ks.add's `into`): no longer read-only.
                                        * Its host copy and its views' are read again at each use (a
                                        * recorded handler's replay writes it without the host knowing),
                                        * it has no marks but those its last write gave, and an action
                                        * that takes it gets a new id (ks_dev_list.serial) each time */
    struct ks_tensor *base;            /* a view: the tensor whose memory it reads (kept alive through the
                                        * view's uservalue), NULL for owned tensors and copies */
} ks_tensor;

/* 1 when t, or the tensor it views, was written in place (ks_tensor.mut). */
static inline int ks_lt_mut(const ks_tensor *t) { return t->mut || (t->base && t->base->mut); }

/* A new owned contiguous tensor on the stack (data uninitialised unless zero). Raises on
 * memory errors. */
ks_tensor *ks_lt_new(lua_State *L, ks_tdtype dt, int ndim, const int64_t *shape, int zero);
/* A new view on the stack. stride NULL = contiguous. Scoped to the running event when
 * scoped != 0 (raises if none runs). owner_idx != 0: keep that stack value alive (uservalue). */
ks_tensor *ks_lt_view(lua_State *L, ks_tdtype dt, int ndim, const int64_t *shape, const int64_t *stride, void *data,
                      int scoped, int owner_idx);
/* Check argument arg is a usable tensor (not closed, not a stale view); fn names the caller. */
ks_tensor *ks_lt_check(lua_State *L, int arg, const char *fn);
#define ks_checktensor(L, arg, fn) ks_lt_check((L), (arg), (fn))
/* Is the value at idx a tensor? (no checks) */
ks_tensor *ks_lt_test(lua_State *L, int idx);
int ks_lt_is_contig(const ks_tensor *t);
/* 1 when t owns its memory (ks_lt_new / ks_lt_dnew, not a view): what an `into` option takes. */
int ks_lt_owned(const ks_tensor *t);
/* Contiguous data of tensor at arg: t->data if contiguous, else a contiguous copy pushed on
 * the stack (*pushed = 1). */
void *ks_lt_contig(lua_State *L, int arg, ks_tensor *t, int *pushed);
/* The value at arg as a tensor of dtype dt: a tensor (converted if needed) or a (nested)
 * Lua table of numbers (KS_T_ANY: tensors as they are, tables inferred: all integers ->
 * i32). Always pushes exactly one value (the tensor to use). */
ks_tensor *ks_lt_arg(lua_State *L, int arg, ks_tdtype dt, const char *fn);
/* ---- device tensors (see above) */

/* A new owned device tensor on be (uninitialised) pushed on the stack; counts toward the
 * device limit (a full collection is tried first when the limit or the backend refuses).
 * Raises on failure. */
ks_tensor *ks_lt_dnew(lua_State *L, struct ks_backend *be, ks_tdtype dt, int ndim, const int64_t *shape);
/* A device view of backend memory (engine buffers, or part of another tensor: owner_idx as in
 * ks_lt_view). bf16: elements are bf16 (dtype must be KS_T_F32). */
ks_tensor *ks_lt_dview(lua_State *L, struct ks_backend *be, ks_tdtype dt, int bf16, int ndim, const int64_t *shape,
                       const int64_t *stride, void *data, int scoped, int owner_idx);
/* Contiguous host data of t (numel elements of t->dtype): t->data for contiguous host
 * tensors, else the tensor's cached host copy (made on first use: a download for device
 * tensors). Valid while t lives. Raises on failure. */
const void *ks_lt_host(lua_State *L, ks_tensor *t);
/* The data of the tensor t at stack index arg, contiguous, in t->dtype, on backend be (NULL =
 * host): no copy when it already is; else a copy (upload, download, device gather of a
 * strided or bf16 view) pushed on the stack (*pushed = 1). */
const void *ks_lt_on(lua_State *L, int arg, ks_tensor *t, struct ks_backend *be, int *pushed);
/* Read n bytes of backend memory into dst (counted in dev_downloads). Raises on failure. */
void ks_lt_download(lua_State *L, struct ks_backend *be, void *dst, const void *src, size_t n);
/* End of an event: collect garbage; every device tensor still alive stays on its device, kept
 * for later events (views of engine buffers are left stale). Runs under the event's protected
 * call. */
void ks_lt_dev_settle(lua_State *L);
/* After any event (a no-op after a settle): free the device tensors the event made that are not
 * kept and mark them lost (or host tensors where a host copy exists). Never raises. */
void ks_lt_dev_drop(lua_State *L);
/* The lending handle of owned device tensor t's memory (policy.h ks_lend; made on first use, the
 * tensor one holder: its memory is freed when the tensor and every engine holder let go), or
 * NULL (not an owned device tensor, or out of memory: the engine copies the list then). */
struct ks_lend *ks_lt_lend(ks_tensor *t);

/* The emulated device: the CPU backend's primitives behind a device backend, with host memory
 * at tagged addresses (dereferencing one without going through the backend faults), so the
 * device-tensor code path runs - and is tested - on the CPU backend (lua/emu_device.c).
 * Select it with the policy parameter _device = "emulate" (the kvsieve CLI: the environment
 * variable KVSIEVE_LUA_DEVICE=emulate). Test hook: ks_lua_emu_fail_in = n > 0 makes the n-th allocation from
 * now and every later one fail (KS_ERR_OOM) until it is set to 0 again. ks_lua_emu_live: the
 * blocks allocated and not yet freed, all policies of the process together (tests check that it
 * returns to its earlier count once their policies are freed). */
struct ks_backend *ks_lua_emu_backend(void);
long ks_lua_emu_live(void);
void *ks_lua_emu_untag(const void *p);
void *ks_lua_emu_tag(const void *p);
extern long ks_lua_emu_fail_in;

/* Register the tensor metatable and add ks.tensor / ks.zeros / ks.stack to the table on top. */
void ks_lt_open(lua_State *L);
const char *ks_tdtype_name(ks_tdtype d);

/* ---------------------------------------------------------------- primitives */

/* Add the native primitives (scores, pool1d, topk, ...) to the module table on top. */
void ks_prims_open(lua_State *L);
/* ks.rope (lua/ext_rope.c), in the primitive registry. */
int ks_lp_rope(lua_State *L);
/* The rotation behind ks.rope on host memory: out (m, H, d) = x rotated at pos[i] (or at `one`
 * for every row when pos is NULL) with r's frequencies for max_pos; out may be x. */
void ks_lua_rope_rows(float *out, const float *x, int64_t m, int64_t H, int64_t d, const int32_t *pos, int32_t one,
                      const ks_rope *r, int64_t max_pos);
/* The running event's model RoPE for heads of d dims, as ks.rope takes it inside a handler: inv
 * (d / 2 <= 512) the frequencies for the event rows' largest position, *af its cos / sin factor.
 * Raises a Lua error (in fn's name) outside an event or when the model rotates another d. */
void ks_lua_event_rope(lua_State *L, const char *fn, int64_t d, float *inv, float *af);

/* ---------------------------------------------------------------- policies */

/* A policy implemented in Lua: either in its own sandboxed state (loaded from a file or a
 * string) or inline in a host state (REPL / script: a table of handlers; not sandboxed). */
typedef struct ks_lpol ks_lpol;

/* The ks_lpol behind a ks_policy made by this binding, or NULL (a C policy). */
ks_lpol *ks_lpol_of(ks_policy *p);
/* Make the handlers run on thread L for the next request (inline policies: the thread that
 * called generate). */
void ks_lpol_set_thread(ks_lpol *lp, lua_State *L);
/* Inline policies: a table of handlers in host state L (not sandboxed). _create allocates an
 * empty one (NULL on out of memory; raises nothing; ks_policy_free frees it) so the caller can
 * box it for the GC first; _take then validates the table at idx and takes its handlers
 * (raises on errors). */
ks_policy *ks_lpol_inline_create(lua_State *L);
void ks_lpol_inline_take(lua_State *L, int idx, ks_policy *p);
/* LUA_TNUMBER / LUA_TBOOLEAN / LUA_TSTRING / LUA_TTABLE of a parameter's default, or LUA_TNONE. */
int ks_lpol_param_type(const ks_policy *p, const char *key);
/* Push the model's config table (n_layers, n_heads, ...). */
void ks_lua_push_config(lua_State *L, const ks_model *m);
/* Non-zero: do not log the first failure of each kind (the KS_LOG_WARN line through the host's
 * log, ks_set_log; lua/sandbox.c); failures are still counted. Tests and the quiet CLI set it. */
extern int ks_lua_quiet;
/* Push a table of the policy's report (key -> number/boolean/string). */
void ks_lpol_push_report(lua_State *L, const ks_policy *p);
/* Push a table of parameter name -> current value (converted to Lua values). */
void ks_lpol_push_params(lua_State *L, ks_policy *p);
/* Non-zero while one of the policy's handlers (or begin) runs: it must not be freed then. */
int ks_lpol_busy(const ks_policy *p);
/* How many calls of the policy failed with kind k (since it was loaded). */
long ks_lpol_failures(const ks_policy *p, ks_fail_kind k);
/* Push a table of failure kind -> count. */
void ks_lpol_push_failures(lua_State *L, const ks_policy *p);
/* Device-tensor counters of a Lua policy's state (all zero for a C policy): mode is the
 * _device setting ("auto", "host", "emulate"). */
typedef struct ks_lpol_devstats {
    const char *mode;
    long allocs, downloads;        /* device tensors allocated, downloads made */
    size_t used, peak, limit;      /* device bytes now (0 between events), at most, allowed */
} ks_lpol_devstats;
void ks_lpol_dev_stats(const ks_policy *p, ks_lpol_devstats *out);
/* Add the policy-state module functions (report, config) to the module table on top. */
void ks_policy_module_open(lua_State *L, int sandboxed);

/* ---------------------------------------------------------------- the module */

/* The full `kvsieve` module (models, sessions, policies, primitives, prelude): for scripts
 * and the REPL. Usable with luaL_requiref(L, "kvsieve", luaopen_kvsieve, 0). The state must
 * have a ks_lctx (ks_lua_host_state makes one). */
int luaopen_kvsieve(lua_State *L);
/* A new unsandboxed host state with the standard libraries and the kvsieve module
 * preloaded (require "kvsieve"), or NULL on out of memory. Close with ks_lua_host_close. */
lua_State *ks_lua_host_state(void);
void ks_lua_host_close(lua_State *L);
/* Every session the module runs checks *flag (Ctrl-C); NULL = none. Policies' instruction
 * hooks check it too. */
void ks_lua_set_interrupt(volatile sig_atomic_t *flag);
volatile sig_atomic_t *ks_lua_get_interrupt(void);

/* The embedded prelude (lua/prelude.lua, linked in by lua/prelude_blob.c), NUL-terminated. */
extern const char ks_prelude_lua[];

#endif
