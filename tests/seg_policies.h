/* seg_policies.h — Lua policies for the tests of decode steps recorded in segments, shared by
 * the CPU test (tests/test_decode_graph.c) and the CUDA one (tests/cuda/test_cuda_policies.c), so
 * that both check the same handler. */
#ifndef KS_TEST_SEG_POLICIES_H
#define KS_TEST_SEG_POLICIES_H

#include <stdio.h>
#include <string.h>
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

#endif
