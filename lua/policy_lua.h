/* policy_lua.h — Lua policies: the file format, the event object, the sandbox, and the calls
 * that load and drive a policy. The calls are part of the public API: include/kvsieve.h
 * ("policies") declares the same prototypes, so a host needs only kvsieve.h; they are repeated
 * here with the details of each (identical prototypes, so both may be included). Implemented
 * in lua/policy_load.c (loading), lua/params.c (parameters), lua/report.c (reports), with the
 * sandbox in lua/sandbox.c and the events in lua/events.c; ks_policy_free is in core/api.c.
 *
 * A policy file is a Lua 5.4 chunk returning a table:
 *
 *   return {
 *     name = "gemfilter",                 -- default: the file name without .lua
 *     description = "...", paper = "...", -- optional text
 *     params = { layer = 13, k = 1024 },  -- defaults; the type of each default is the
 *                                         -- type a --set value is parsed as
 *     pre_rope_keys = false,              -- true (TokenSelect): the KV cache keeps keys before
 *                                         -- RoPE, ev.q / ev.k (and ev.k_pre) are unrotated and
 *                                         -- attention rotates at the (renumbered) positions
 *     prefill_chunk = 0,                  -- > 0: prefill in chunks of this many tokens
 *     begin = function(p) end,            -- at the start of each request (reset state here)
 *     prefill_qkv = function(ev, p) end,  -- event handlers, all optional; a missing one costs
 *     prefill_layer_end = ..., prefill_end = ..., decode_qkv = ..., token = ...,
 *   }
 *
 * The event object `ev` (valid only during its event; using it, or a tensor view taken from
 * it, later is the error "... used after its event ended"; :clone() keeps a copy). All
 * rows, positions, heads and layers are 0-based; Lua tables returned are 1-based sequences.
 *   ev.event ev.layer (-1 in prefill_end / token) ev.pass (1 after a restart) ev.n (rows)
 *   ev.n_prompt ev.n_heads ev.n_kv_heads ev.head_dim ev.dim ev.n_layers ev.token (token)
 *   ev.q (n, n_heads, head_dim)  ev.k / ev.v / ev.k_pre (n, n_kv_heads, head_dim)   [qkv events]
 *   ev.hidden (n, dim) [prefill_layer_end]   ev.pos / ev.ids (n) i32, ev.orig (n) [prefill]
 *   ev.kv_rows {rows per KV head}   ev:kv_pos(h) i32 positions of head h's rows
 *   ev:kv_keys([h]) / ev:kv_values([h]) (rows, n_kv_heads | 1, head_dim) views of the cache
 *     (prefill_qkv: the rows before this step's; prefill_layer_end / decode_qkv: after)
 * Actions (the engine validates each; idx = an i32 tensor or a table of integers; per-head =
 * a table of n_kv_heads such lists, or a 2-d i32 tensor):
 *   ev:restart(idx)  ev:propagate(idx)  ev:retain(idx | per-head)
 *   ev:attend(idx | per-head [, {renumber = true}])  ev:stop()  ev:report(key, value)
 *   ev:discard_kv()  (prefill_qkv of pass 0 at layer 0: this pass's KV is not kept; a restart must follow)
 * require("kvsieve") in a policy gives the tensors and primitives (ks.scores, ks.topk, ...),
 * ks.report(key, value) (also from begin), ks.config (when loaded with a model), and, in begin
 * only, ks.unhook(event): this request runs without that handler, as if the table had none
 * (a decode_qkv handler that would do nothing for these parameters: without it a decode step
 * makes no policy call and a backend with graphs replays the step as one graph); the next
 * begin re-arms it.
 *
 * Any other top-level key is an error at load (typo protection), except names starting
 * with "_" (private helpers). Each loaded policy runs in its own sandboxed Lua state:
 * memory limit (default 64 MB), per-call instruction budget (default 100 million) and
 * wall-clock budget (default 30 s), standard library allow-list (base without dofile /
 * loadfile / binary chunks, string, table, math, utf8, coroutine, os.clock/time/date/
 * difftime; no io; print goes to the host's log, ks_set_log, at KS_LOG_INFO; require only
 * "kvsieve"). The limits are the reserved parameters _memory_mb, _instructions and _seconds
 * (0 = unlimited).
 * Device tensors: on a backend with primitives on the device (CUDA), ev.q, ev.k, ev.v, ev.hidden
 * and ev:kv_keys() / kv_values() are views of the device buffers (no copy) and the primitives
 * called on them run on the device, returning device tensors; element access (t:item(),
 * t:tolist(), tostring) and actions download what they read. Results a handler keeps past its
 * event (a selection reused at the next step, page summaries) stay on the device, where later
 * events use them without a copy (free the policy before closing its model).
 * Reserved parameter _device = "auto" (default; the kvsieve CLI sets it from the environment
 * variable KVSIEVE_LUA_DEVICE, repl/env_opts.c; the library reads no environment):
 * device views where the backend has device primitives; "host": host copies and CPU
 * primitives everywhere (the behaviour before device tensors); "emulate": on the CPU backend,
 * the emulated device of lua/emu_device.c (tests of the device path without a GPU). _device_mb
 * (default 4096, 0 = unlimited) bounds the bytes of device tensors alive at once (not counted
 * in _memory_mb; host copies of device data are).
 * Handlers return nothing and act through the event object (ev:retain(...), ...). Every
 * failure (error, budget, memory, invalid return value, stale view, forbidden call) makes
 * the engine call fail with KS_ERR_POLICY and a message "policy NAME: EVENT (layer L):
 * FILE:LINE: ..." plus a traceback — or fall back to full attention where the session
 * asked for that (ks_session_set_fallback). A policy is not thread-safe: use it from one
 * thread (one session at a time).
 */
#ifndef KS_POLICY_LUA_H
#define KS_POLICY_LUA_H

#include "kvsieve.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Load a policy by name or path. A name (no '/' and not ending in ".lua") is looked up as
 * NAME.lua in: each folder of search_path (colon-separated; NULL = none), ./policies, and
 * <folder of the executable>/../policies. m (may be NULL) exposes the model's config to the
 * policy as require("kvsieve").config. Free with ks_policy_free. Nothing here reads the
 * environment: the CLI passes $KVSIEVE_POLICY_PATH (repl/env_opts.c). */
ks_status ks_policy_load_path(ks_model *m, const char *name_or_path, const char *search_path, ks_policy **out);
/* ks_policy_load_path with no search path. */
ks_status ks_policy_load(ks_model *m, const char *name_or_path, ks_policy **out);
/* The same from source text; chunkname names it in messages (e.g. "inline.lua"). */
ks_status ks_policy_load_string(ks_model *m, const char *chunkname, const char *source, ks_policy **out);
/* Set a parameter from text: parsed as an integer, number, boolean (true/false/1/0/yes/no/
 * on/off) or string, following the type of its default. Unknown keys are KS_ERR_ARG with
 * the list of valid ones. Also the reserved limits _memory_mb, _instructions, _seconds, and
 * _device (auto / host / emulate) and _device_mb (any Lua policy, inline ones too). */
ks_status ks_policy_set(ks_policy *p, const char *key, const char *value);
/* The current value of a parameter as text (numbers in %.17g), into buf (n bytes). */
ks_status ks_policy_get(const ks_policy *p, const char *key, char *buf, size_t n);
/* Parameter names, in sorted order: i in [0, ks_policy_n_params). */
int ks_policy_n_params(const ks_policy *p);
const char *ks_policy_param_name(const ks_policy *p, int i);
const char *ks_policy_name(const ks_policy *p);
/* What the policy reported during the last request (ev:report(key, value)), e.g.
 * "selection_layer" -> "13": the value as text, or NULL if the key was not reported.
 * Reports are cleared when a request starts. */
const char *ks_policy_report(const ks_policy *p, const char *key);
int ks_policy_n_reports(const ks_policy *p);
const char *ks_policy_report_key(const ks_policy *p, int i);
/* Free a policy made by ks_policy_load*; for a C policy struct, calls its free(ud) hook. */
void ks_policy_free(ks_policy *p);

#ifdef __cplusplus
}
#endif
#endif
