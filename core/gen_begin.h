/* gen_begin.h — the start of a generation request (api.c), one for both ways in: ks_generate_ids
 * (api.c) and ks_seq_create (batch.c) refuse the same options with the same words and start from
 * the same fresh session. */
#ifndef KS_GEN_BEGIN_H
#define KS_GEN_BEGIN_H

#include "engine.h"

/* KS_OK, or KS_ERR_ARG "WHO: FIELD must be ..., got V" for the first option out of range: a
 * negative max_new_tokens or top_k, a temperature or repeat_penalty that is NaN, negative or
 * infinite, top_p outside (0, 1], min_p outside [0, 1], n_stop < 0 or stop NULL with n_stop > 0, a
 * NULL or empty stop string. Checked before anything runs: never reinterpreted. */
ks_status ks_generate_opts_check(const ks_generate_opts *o, const char *who);
/* s reset (ks_session_reset: its KV rows freed, its positions back to 0) and the last request's
 * results dropped (ks_result_ids / _text empty). */
void ks_generate_fresh(ks_session *s);

#endif
