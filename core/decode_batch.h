/* decode_batch.h — the batched decode step's extras beside ks_sessions_decode (engine.h):
 *
 * ks_attn_decode_batch_loop — the reference of ks_backend.attn_decode_batch (core/backend.h), for
 * any backend: kv_append of each session's new row, then its one-row attention, session by
 * session (what core/decode_batch.c does without the hook). It is the CPU twin of the CUDA kernel
 * (kernels/attn_decode_batch.cu): tests install it as a CPU backend's hook to run the engine's
 * batched-attention path, and compare the kernel with it; the CUDA backend falls back to it for
 * shapes its kernel does not take. Same arguments and contract as the hook.
 *
 * ks_argmax_rows_ref — the reference of ks_backend.argmax_rows on host rows: out[r] = the lowest
 * index of the largest of x[r][0 .. cols), NaN never the largest, 0 when x[r][0] is NaN (the
 * greedy rule of ks_sample, core/sample.c, whose ids it equals on every row). It is written as
 * the kernel reduces (kernels/argmax_rows.cu): (value, index) pairs merged by "larger value, or
 * equal value and lower index", an order-free rule, so any split of a row gives these ids. Tests
 * compare the kernel with it; where the backend has no argmax_rows, the engine takes ks_sample's
 * greedy on the host (its vectorised scan; the same ids, tests/test_batch_decode.c).
 *
 * ks_sessions_decode_greedy — ks_sessions_decode (same arguments, contract and results) that also
 * gives each session's next greedy id: with greedy NULL or greedy[i] != 0, next[i] = the argmax
 * of session i's new logits (ks_sample's greedy rule) computed where the logits are (the
 * backend's argmax_rows over all rows of the step in one call: B ids come back instead of B
 * logits rows, one wait for the step), and s[i]->logits is NOT written (it keeps what it held
 * before the step). Other sessions, and any session the step ran alone (n == 1, profiled), get
 * their logits as ks_sessions_decode gives them, next[i] their argmax (greedy) or -1 (not
 * greedy); next[i] is -1 for a session that failed. For callers that sample greedily and need no
 * logits (kvsieve.h's ks_seq with device greedy; the batched bench); sampling with a temperature,
 * a repeat penalty or logprobs needs the logits and keeps ks_sessions_decode. */
#ifndef KS_DECODE_BATCH_H
#define KS_DECODE_BATCH_H

#include "backend.h"

ks_status ks_attn_decode_batch_loop(ks_backend *b, int n, ks_kv_layer *const *L, const float *const *q,
                                    const float *const *k, const float *const *v, const int32_t *pos, int n_heads,
                                    float scale, int window, float *const *out);

void ks_argmax_rows_ref(const float *x, int rows, int cols, int32_t *out);

typedef struct ks_session ks_session;
ks_status ks_sessions_decode_greedy(ks_session *const *s, const int32_t *ids, int n, const unsigned char *greedy,
                                    int32_t *next, ks_status *st, char **msg);

#endif
