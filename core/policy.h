/* policy.h — the engine's policy interface: a struct of optional event handlers.
 *
 * A policy reacts to engine events and may ask for actions. C policies fill ks_policy
 * directly; the Lua binding fills it with trampolines. A NULL handler costs nothing: the
 * engine neither builds the event nor computes anything for it. Handlers return KS_OK or
 * an error status with a message (ks_errorf); the engine stops the request (or falls back
 * to full attention when the session asks for that).
 *
 * Events (DESIGN.md "One request, as data"):
 *   PREFILL_QKV(l)       after RoPE at layer l: q, k, v, positions, ids of the active rows
 *   PREFILL_LAYER_END(l) after layer l's MLP: hidden rows
 *   PREFILL_END          after the last layer, before sampling the first token
 *   DECODE_QKV(l)        one decode step at layer l, after the new row was appended
 *   TOKEN                a token was sampled
 *
 * Actions (validated when asked: legal in this event, indices in range, no duplicates):
 *   restart(idx)    PREFILL_QKV, first pass only: prefill again on ids[idx], positions 0..k-1
 *   propagate(idx)  PREFILL_QKV / PREFILL_LAYER_END: after this layer only rows idx go on
 *                   (original positions kept)
 *   retain(idx)     PREFILL_QKV / PREFILL_LAYER_END / DECODE_QKV: the layer keeps only these
 *                   KV rows (shared list, or one list per KV head); the rest are freed after
 *                   this layer's attention
 *   attend(idx)     DECODE_QKV / PREFILL_QKV: this step (or prefill chunk) attends only these
 *                   rows of the layer — indices into the layer's rows including the ones this
 *                   step appends — per KV head or shared, optionally renumbering key positions
 *                   0..k-1 (queries then sit at k - n + i)
 *   stop()          any prefill event: end the forward pass here
 *   discard_kv()    PREFILL_QKV at layer 0 of pass 0 (first prefill of the session, not
 *                   chunked): this pass's KV rows will not be used (a restart follows), so
 *                   each layer's rows are freed right after its attention; the pass must end
 *                   in a restart, else the request fails (GemFilter: ~6.5 GiB less at 128K)
 * Index lists may be given in any order; the engine sorts them ascending.
 *
 * Device lists (issue 14). attend, retain and propagate also take a list in backend memory
 * (ks_dev_list: device memory on CUDA, host memory on the CPU backend), so a handler whose
 * selection runs on the device never waits for it:
 *   - the list must be ascending without duplicates (the engine does not sort on the device);
 *   - a list "checked by construction" (ks_dev_list.checked: each row strictly ascending with
 *     values in [lo, hi), what topk / arange / concat produce) is checked on the host against
 *     the bounds only (hi <= each head's rows), with no device work;
 *   - attend with an unchecked list queues the backend's check_idx on a copy of it: the
 *     first bad entry (out of range, not ascending, duplicate) is written to a backend word
 *     that the engine reads at the step's next sync (the logits download), failing the step
 *     with one line naming the action, the event, the layer, the KV head and the bad value
 *     (bad entries are replaced by 0 first, so the attention of the failing step stays in
 *     bounds; its output is discarded);
 *   - retain and propagate download their list when the engine applies them (the host keeps
 *     the mirror of the kept positions, ks_kv_layer.pos, and propagate's rows, exact), and
 *     check it there: one download per retain / propagate, none per attend.
 * The list is copied (a device-to-device copy on CUDA): the caller's memory may go right after.
 */
#ifndef KS_POLICY_H
#define KS_POLICY_H

#include "backend.h"

typedef enum ks_event_kind {
    KS_EV_PREFILL_QKV = 0,
    KS_EV_PREFILL_LAYER_END,
    KS_EV_PREFILL_END,
    KS_EV_DECODE_QKV,
    KS_EV_TOKEN,
    KS_EV_COUNT
} ks_event_kind;

const char *ks_event_name(ks_event_kind k);

typedef struct ks_session ks_session;

/* An index list in backend memory for the *_dev actions: `rows` lists of k entries each,
 * row-major (rows 1: one list for every KV head; rows n_kv_heads: one per head). */
/* A policy runtime's device memory lent to the engine (ks_dev_list.lend): retain adds a holder,
 * release drops one, and the memory is freed (on its backend: stream-ordered on a device) when
 * the last holder lets go. The runtime holds it while its tensor lives; the engine, from an
 * attend that reads the list where it is until the work that reads it was queued
 * (ks_actions_free), so a tensor the policy drops before the attention runs stays readable. */
typedef struct ks_lend {
    void (*retain)(struct ks_lend *l);
    void (*release)(struct ks_lend *l);
} ks_lend;

typedef struct ks_dev_list {
    const int32_t *data;     /* (rows, k) backend memory of the event's backend */
    int rows, k;
    int checked;             /* 1: valid by construction: every row strictly ascending, values in [lo, hi) */
    int64_t lo, hi;          /* with checked */
    uint64_t serial;         /* 0, or an id of these contents that no other list of the session has (a
                                policy's tensor, read-only): an attend of the same serial at the same
                                layer reuses the engine's copy of it (ks_action_attend_dev) */
    ks_lend *lend;           /* NULL, or (with serial) the handle of the memory data points into: a
                                decode-time attend then reads the list where it is, no copy */
} ks_dev_list;

/* What a handler asked for (filled by ks_action_*; read by the engine). A device list lives in
 * one backend allocation owned here (the *_dbuf fields, freed by ks_actions_free on `be`):
 * attend_idx[h] then point into attend_dbuf (backend memory; attend_dev = 1); a retain or
 * propagate device list is downloaded into the host fields when the engine applies it. */
typedef struct ks_actions {
    int restart, propagate, retain, attend, stop, renumber;
    int discard_kv;                               /* see discard_kv() above */
    int32_t *restart_idx; int n_restart;          /* sorted */
    int32_t *prop_idx; int n_prop;                /* sorted */
    int32_t **retain_idx; int *n_retain;          /* (n_kv_heads) sorted lists */
    int32_t **attend_idx; int *n_attend;          /* (n_kv_heads) sorted lists */
    int attend_dev;                               /* attend_idx point into attend_dbuf (backend memory) */
    uint64_t attend_gen;                          /* attend_dev: 0, or the id of the engine's kept copy the
                                                     lists point into (not attend_dbuf: not freed here) */
    int attend_seg;                               /* attend_dev lists with row ranges around them (the
                                                     backend's attn_ranges): ks_attn_args.seg */
    int32_t seg_b0, seg_b1, seg_a0, seg_a1;       /* with attend_seg */
    int32_t seg_page;                             /* with attend_seg: 0, or the trailing range is the current
                                                     page of seg_page rows (ks_action_attend_page) */
    void *attend_dbuf, *retain_dbuf, *prop_dbuf;  /* backend copies of device lists, or NULL */
    ks_lend *attend_lend;                         /* a list read where it is (held; released by ks_actions_free) */
    int retain_rows, retain_k, retain_checked;    /* retain_dbuf: (retain_rows, retain_k), checked by construction */
    int prop_checked;                             /* prop_dbuf: (n_prop), checked by construction */
    int retain_kind, prop_kind;                   /* the ks_event_kind that asked (messages) */
    const ks_backend *be;                         /* owner of the *_dbuf buffers */
    int hold;                                     /* the attend is held (ks_action_hold*) */
    ks_dev_list hold_list;                        /* with hold: the device list, or */
    int32_t *hold_idx; int hold_k;                /* the host list (owned here until the engine takes it) */
    int64_t hold_r[4];                            /* and the ranges the attend was given */
    int replay;                                   /* the event's device work may be recorded and replayed
                                                     (ks_action_replay) */
    int64_t replay_rows;                          /* with replay: 0, or the most rows the layer may gain
                                                     after this event's before the work is stale
                                                     (ks_action_replay_within) */
} ks_actions;

typedef struct ks_event {
    ks_event_kind kind;
    int layer;               /* -1 for PREFILL_END / TOKEN */
    int pass;                /* 0, or 1 after a restart */
    int n;                   /* active rows (prefill) or 1 (decode) */
    int n_prompt;            /* tokens in the original prompt */
    int n_heads, n_kv_heads, head_dim, dim, n_layers;
    const ks_backend *be;
    const float *q;          /* (n, n_heads, head_dim) post-RoPE, backend memory */
    const float *k;          /* (n, n_kv_heads, head_dim) post-RoPE */
    const float *v;          /* (n, n_kv_heads, head_dim) */
    const float *k_pre;      /* (n, n_kv_heads, head_dim) pre-RoPE keys (when the policy asked) */
    const float *hidden;     /* PREFILL_LAYER_END: (n, dim) */
    const int32_t *pos;      /* (n) positions of the active rows (host) */
    const int32_t *ids;      /* (n) token ids of the active rows (host) */
    const int32_t *orig;     /* (n) each active row's index in the prompt as given (host) */
    const ks_kv_layer *kv;   /* the layer's KV rows (NULL for PREFILL_END / TOKEN) */
    int32_t token;           /* TOKEN: the sampled id */
    ks_session *sess;
    unsigned generation;     /* bumped after each event: views with an older one are stale */
    int64_t grow;            /* DECODE_QKV while the engine records the handler's device work
                              * (ks_action_replay): the rows the layer may gain at the recording's
                              * replays (ks_scores_opts.grow); 0 otherwise */
    ks_actions act;
} ks_event;

typedef ks_status (*ks_event_fn)(void *ud, ks_event *ev);

typedef struct ks_policy {
    const char *name;
    void *ud;
    ks_event_fn on[KS_EV_COUNT];   /* NULL = not handled: costs nothing */
    /* TokenSelect mode: the KV cache holds keys BEFORE RoPE, q/k in events are pre-RoPE, and
     * attention rotates queries and keys at their (possibly renumbered) positions */
    int want_pre_rope_keys;
    int prefill_chunk;             /* > 0: prefill in chunks of this many tokens (restart refused) */
    /* A KV ring for this request (set by begin, e.g. ks.kv_ring; ring_budget 0 = none): every
     * layer keeps its first ring_sinks rows and its most recent ring_budget - ring_sinks rows.
     * Once a layer holds ring_budget rows, a single-session decode step (ks_session_decode)
     * writes its new row over the layer's oldest row after the sinks, in place, attends the
     * ring_budget rows, and calls no DECODE_QKV handler; on CUDA such steps replay as the
     * recorded graph. The rows then sit rotated: logical row i >= sinks lives at physical row
     * sinks + (i - sinks + r) mod (budget - sinks), r found from the positions (ascending in
     * logical order). Every other path (prefill, events, retain, the end of a generation)
     * first puts the rows back in logical order (one kv_retain permutation), so it sees what
     * it would without the ring. Paths without a ring (several sessions stepped together,
     * tensor-parallel backends) call the DECODE_QKV handler instead: a policy that declares
     * a ring keeps a handler that evicts the same rows (StreamingLLM's) or has none.
     * 0 <= ring_sinks < ring_budget. */
    int ring_sinks, ring_budget;
    /* called at the start of each request (fresh session state), before any event; NULL = none */
    ks_status (*begin)(void *ud, ks_session *s);
    void (*free)(void *ud);        /* called by ks_policy_free */
} ks_policy;

/* Actions. Each validates and records; errors are KS_ERR_POLICY with a message naming the
 * action, the event and the bad value. Lists are copied. */
ks_status ks_action_restart(ks_event *ev, const int32_t *idx, int k);
ks_status ks_action_propagate(ks_event *ev, const int32_t *idx, int k);
ks_status ks_action_retain(ks_event *ev, const int32_t *idx, int k);
ks_status ks_action_retain_heads(ks_event *ev, const int32_t *const *idx, const int *k);
ks_status ks_action_attend(ks_event *ev, const int32_t *idx, int k, int renumber);
ks_status ks_action_attend_heads(ks_event *ev, const int32_t *const *idx, const int *k, int renumber);
/* The same on lists in backend memory (see "Device lists" above). propagate takes one row. */
ks_status ks_action_attend_dev(ks_event *ev, const ks_dev_list *l, int renumber);
/* attend to the rows [r[0], r[1]) of every KV head, then l, then the rows [r[2], r[3]): one list
 * valid by construction (l->checked) between the ranges, r[1] <= l->lo and l->hi <= r[2] (empty
 * ranges impose nothing), 0 <= r[0] <= r[1], r[2] <= r[3] <= the rows of every head. The result
 * is ks_action_attend_dev of that whole list (the list page_rows builds with pages of one row);
 * a backend with attn_ranges reads the ranges in place instead of a built list. */
ks_status ks_action_attend_dev_ranges(ks_event *ev, const ks_dev_list *l, const int64_t r[4], int renumber);
/* After ks_action_attend_dev_ranges in a DECODE_QKV event: its trailing range [r[2], r[3]) is the
 * current page of `page` rows, r[2] = (N - 1) / page * page and r[3] = N (N the layer's rows, the
 * new row included), and stays so when the attend is replayed (ks_action_replay): at a later step
 * the range is that step's current page, [(N' - 1) / page * page, N'), not the same rows moved (a
 * Quest step attends its newest, partial page). KS_ERR_POLICY: not in DECODE_QKV, no ranged
 * device attend before, page < 1, or a trailing range that is not that page. */
ks_status ks_action_attend_page(ks_event *ev, int page);
ks_status ks_action_retain_dev(ks_event *ev, const ks_dev_list *l);
ks_status ks_action_propagate_dev(ks_event *ev, const ks_dev_list *l);
ks_status ks_action_stop(ks_event *ev);
ks_status ks_action_discard_kv(ks_event *ev);

/* Held attends (issue 14: a decode step without Lua). After ks_action_attend_dev or
 * ks_action_attend_dev_ranges in a DECODE_QKV event, ks_action_hold(ev, l, r) with the same
 * list and ranges (r NULL: no ranges) lets the engine repeat that attend at this layer's later
 * single-session decode steps (ks_session_decode) without firing the event there: the list l
 * (valid by construction; the engine keeps its memory: l->lend retained, else a copy) and the
 * ranges, a trailing range that ended at the layer's rows moving with them (the last
 * r[3] - r[2] rows at every step). It is a permission, not a promise: the event fires again at
 * that layer after ks_hold_drop (ev:release in Lua), a prefill, a reset or a change of policy,
 * in batched steps, and where the repeated attend no longer fits the layer (then the hold is
 * dropped). A step whose every layer is held runs no handler at all, and on a backend with
 * graph_join replays its recorded segments joined (core/decode.c decode_joined). The session counts the layer steps so repeated
 * (ks_session_held_steps, session_api.h). KS_ERR_POLICY: not in DECODE_QKV, no device attend
 * asked first in this event, or a list that is not valid by construction. */
ks_status ks_action_hold(ks_event *ev, const ks_dev_list *l, const int64_t r[4]);
/* The same after ks_action_attend of the host list [r[0], r[1]) ++ idx (k entries, ascending) ++
 * [r[2], r[3]) (r NULL: idx alone): the engine keeps a copy of idx and builds the whole list
 * again at each held step. */
ks_status ks_action_hold_host(ks_event *ev, const int32_t *idx, int k, const int64_t r[4]);

/* Recorded handlers (issue 14: Lua once a step). After ks_action_attend_dev or
 * ks_action_attend_dev_ranges in a DECODE_QKV event, ks_action_replay(ev) declares that the
 * event's device work (the primitives it ran and the attend) is a function of the step's device
 * inputs (q, k, v, the layer's rows) alone, every range that follows the layer's rows given
 * relative to its end: on a backend with graph_begin_handler the engine may, once every layer
 * declared it, record the handlers' work with the step (ev->grow > 0 then: the rows the layer
 * may gain before the recording is made anew) and replay it at later steps without firing the
 * event (core/decode.c decode_replayed), as long as the recording fits. Like a hold it is a
 * permission: the event fires again after a change of policy, a prefill, a reset, past the
 * growth the recording allowed, or where a recording fails. The session counts the layer steps
 * so replayed (ks_session_replayed_steps). A handler that asked for nothing may declare it too
 * (what it ran is recorded; the layer attends to every row). KS_ERR_POLICY: not in DECODE_QKV,
 * or an action other than a device-list attend asked first in this event. */
ks_status ks_action_replay(ks_event *ev);
/* ks_action_replay, the work valid only while the layer gains at most `rows` (>= 1) rows after
 * this event's: a recording made at this event is replayed at most `rows` steps (Quest: until its
 * current page is full, after which a new page joins the candidates and its summaries change).
 * A handler that asks for nothing (a layer it leaves dense) may declare either: its recorded work
 * is what it ran, nothing to attend. KS_ERR_POLICY as ks_action_replay, or rows < 1. */
ks_status ks_action_replay_within(ks_event *ev, int64_t rows);

#endif
