/* seg_policies.h — Lua policies for the tests of decode steps recorded in segments, shared by
 * the CPU test (tests/test_decode_graph.c) and the CUDA one (tests/cuda/test_cuda_policies.c), so
 * that both check the same handler, and the helpers both runs use. */
#ifndef KS_TEST_SEG_POLICIES_H
#define KS_TEST_SEG_POLICIES_H

#include <stdio.h>
#include <string.h>
#include "engine.h"
#include "forward.h"
#include "kvsieve.h"

/* attends to all rows but the first at layer 1 of every 7th step (steps 3, 10, ...), and at step
 * 20 retains all rows but the first two at layer 0: the steps that act fall back to plain
 * launches from that layer on, the retain makes the recording stale */
static const char *const SEG_ACTOR =
    "local ks = require 'kvsieve'\n"
    "local step = 0\n"
    "return { name = 'actor',\n"
    "  decode_qkv = function(ev)\n"
    "    if ev.layer == 0 then step = step + 1 end\n"
    "    local rows = ev.kv_rows[1]\n"
    "    if step % 7 == 3 and ev.layer == 1 then ev:attend(ks.arange(1, rows)) end\n"
    "    if step == 20 and ev.layer == 0 then ev:retain(ks.arange(2, rows)) end\n"
    "  end }\n";

/* Attends at every layer to rows [0, 4) ++ a list fixed at the layer's first decode step (rows
 * [10 + l, 60 + l)) ++ the last 30 rows, renumbered at odd layers; the list a host table
 * (how = 'host') or a device tensor valid by construction (how = 'device': a topk shifted). With
 * hold = true the attend is held (ev:attend's hold) at every layer but free_layer (-1: none);
 * free_layer's handler, once ev.held_steps reaches release_at (0: never), drops every hold once
 * (ev:release()). Reports: "calls" (handler calls), "held" (ev.held_steps at the last call).
 * Its steps are the same with and without hold. */
static const char *const SEG_HOLDER =
    "local ks = require 'kvsieve'\n"
    "local kept, calls, released = {}, 0, false\n"
    "return { name = 'holder', params = { hold = false, how = 'device', free_layer = -1, release_at = 0 },\n"
    "  begin = function() kept, calls, released = {}, 0, false end,\n"
    "  decode_qkv = function(ev, p)\n"
    "    calls = calls + 1\n"
    "    ev:report('calls', calls)\n"
    "    ev:report('held', ev.held_steps)\n"
    "    local n, l = ev.kv_rows[1], ev.layer\n"
    "    if not kept[l] then\n"
    "      local a, b = 10 + l, 60 + l\n"
    "      if p.how == 'host' then local t = {} for i = a, b - 1 do t[#t + 1] = i end kept[l] = t\n"
    "      else local v = {} for i = 1, b - a do v[i] = 1.0 end kept[l] = ks.topk(ks._upload(ks.tensor(v)), b - a, { values = false }) + a end\n"
    "    end\n"
    "    ev:attend(kept[l], { renumber = l % 2 == 1, before = { 0, 4 }, after = { n - 30, n }, hold = p.hold and l ~= p.free_layer })\n"
    "    if l == p.free_layer and p.release_at > 0 and ev.held_steps >= p.release_at and not released then\n"
    "      released = true\n"
    "      ev:release()\n"
    "    end\n"
    "  end }\n";

/* Apply "key=value,key=value" (NULL or "": nothing) to policy p with ks_policy_set; the first
 * failure's status (entries without '=' are skipped). */
static inline ks_status seg_set_params(ks_policy *p, const char *params) {
    char kv[256];
    snprintf(kv, sizeof kv, "%s", params ? params : "");
    ks_status st = KS_OK;
    for (char *save = NULL, *tok = strtok_r(kv, ",", &save); !st && tok; tok = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(tok, '=');
        if (!eq) continue;
        *eq = 0;
        st = ks_policy_set(p, tok, eq + 1);
    }
    return st;
}

/* Fire the token event of id on session s as ks_generate fires it, before the step that decodes
 * id (a policy counts its device decisions there: TokenSelect's selection cache); KS_OK where
 * the policy has no token handler. */
static inline ks_status seg_fire_token(ks_session *s, int32_t id) {
    if (!s->policy || !s->policy->on[KS_EV_TOKEN]) return KS_OK;
    ks_event ev;
    ks_event_init(s, &ev, KS_EV_TOKEN, -1, 0, 1);
    ev.token = id;
    ks_status st = ks_event_fire(s, &ev);
    ks_actions_free(&ev.act, ev.n_kv_heads); /* none is legal here */
    return st;
}

#endif
