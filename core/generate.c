/* generate.c — generation: prefill the prompt, then sample and decode token by token, with the
 * token event, streaming of complete UTF-8 text and stop strings. */
#include "forward.h"

#include <stdlib.h>
#include <string.h>

long ks_stop_find(const char *text, size_t len, const char *const *stop, int n) {
    long best = -1;
    for (int j = 0; j < n; j++) {
        size_t k = strlen(stop[j]);
        if (k == 0 || k > len) continue;
        size_t lim = best >= 0 ? (size_t)best : len - k; /* an earlier hit is all that matters */
        for (size_t i = 0; i <= lim && i + k <= len; i++)
            if (text[i] == stop[j][0] && !memcmp(text + i, stop[j], k)) { best = (long)i; break; }
    }
    return best;
}

size_t ks_stop_holdback(const char *text, size_t len, const char *const *stop, int n) {
    size_t hold = 0;
    for (int j = 0; j < n; j++) {
        size_t k = strlen(stop[j]);
        for (size_t m = k > 0 ? KS_MIN(k - 1, len) : 0; m > hold; m--)
            if (!memcmp(text + len - m, stop[j], m)) { hold = m; break; }
    }
    return hold;
}

int ks_is_eos(const ks_config *c, int32_t id) {
    for (int i = 0; i < c->n_eos; i++)
        if (c->eos[i] == id) return 1;
    return 0;
}

size_t ks_utf8_complete(const char *s, size_t n) {
    size_t i = n, back = 0;
    while (i > 0 && back < 4) {
        unsigned char ch = (unsigned char)s[i - 1];
        if ((ch & 0xC0) != 0x80) {
            size_t need = ch < 0x80 ? 1 : (ch >> 5) == 6 ? 2 : (ch >> 4) == 14 ? 3 : (ch >> 3) == 30 ? 4 : 1;
            return (back + 1 >= need) ? n : i - 1;
        }
        i--;
        back++;
    }
    return n;
}

ks_status ks_session_generate(ks_session *s, const int32_t *ids, int n, const ks_gen_params *p, ks_token_cb cb,
                              void *ud, int32_t **out_ids, int *n_out) {
    const ks_config *c = &s->m->cfg;
    if (out_ids) *out_ids = NULL;
    if (n_out) *n_out = 0;
    if (p->max_new < 0) return ks_errorf(KS_ERR_ARG, "generate: max_new must be >= 0");
    ks_status st = ks_session_prefill(s, ids, n);
    if (st) return st;
    ks_sampler smp;
    ks_sampler_init(&smp, p->temperature, p->top_p, p->seed);
    smp.top_k = p->top_k;
    smp.min_p = p->min_p;
    /* the repetition penalty works on a copy of the logits (s->logits stay the model's), with a
     * byte per vocabulary entry marking the tokens of the context */
    int penal = p->repeat_penalty > 0 && p->repeat_penalty != 1;
    float *plog = NULL;
    unsigned char *seen = NULL;
    if (penal) {
        plog = ks_malloc(sizeof(float) * (size_t)c->vocab);
        seen = calloc((size_t)c->vocab, 1);
        if (!plog || !seen) { free(plog); free(seen); return KS_ERR_OOM; }
        for (int i = 0; i < n; i++)
            if (ids[i] >= 0 && ids[i] < c->vocab) seen[ids[i]] = 1;
    }
    /* the id buffer grows with the generation: max_new may be INT_MAX ("until EOS or the
     * context ends"), where max_new + 1 overflowed and a buffer of max_new would be 8 GB */
    size_t gcap = (size_t)KS_MIN(p->max_new, 255) + 1;
    int32_t *gen = ks_malloc(sizeof(int32_t) * gcap);
    if (!gen) { free(plog); free(seen); return KS_ERR_OOM; }
    int ng = 0;
    size_t emitted = 0; /* bytes of decoded text already streamed */
    /* greedy without a penalty: each step's id from the device's argmax where the backend has
     * one (ks_session_decode_greedy; the logits stay there unless asked) */
    const int greedy = p->temperature <= 0 && !penal;
    int32_t next = -1;
    for (int t = 0; t < p->max_new; t++) {
        const float *lg = s->logits;
        if (penal) {
            memcpy(plog, s->logits, sizeof(float) * (size_t)c->vocab);
            ks_repeat_penalty(plog, seen, c->vocab, p->repeat_penalty);
            lg = plog;
        }
        int32_t id = next >= 0 ? next : ks_sample(&smp, lg, c->vocab);
        if (penal && id >= 0 && id < c->vocab) seen[id] = 1;
        if ((size_t)ng == gcap) {
            int32_t *g2 = ks_realloc(gen, sizeof(int32_t) * gcap * 2);
            if (!g2) { st = KS_ERR_OOM; break; }
            gen = g2;
            gcap *= 2;
        }
        gen[ng++] = id;
        if (s->policy && s->policy->on[KS_EV_TOKEN]) {
            ks_event ev;
            ks_event_init(s, &ev, KS_EV_TOKEN, -1, 0, 1);
            ev.token = id;
            st = ks_event_fire(s, &ev);
            ks_actions_free(&ev.act, ev.n_kv_heads); /* none is legal here; a handler may have tried */
            if (st) break;
        }
        int eos = p->stop_at_eos && ks_is_eos(c, id);
        int last = eos || t + 1 == p->max_new, hit = 0;
        if (cb || p->n_stop > 0) {
            const char *piece = "";
            char *text = NULL;
            size_t len = 0;
            /* the output so far, decoded (without the EOS: with stop strings, the text held
             * back is streamed at the EOS) */
            size_t nd = eos ? (p->n_stop > 0 ? (size_t)ng - 1 : 0) : (size_t)ng;
            if (s->m->tok && nd > 0) {
                if (ks_tokenizer_decode(s->m->tok, gen, nd, 1, &text, &len) == KS_OK) {
                    size_t ok = ks_utf8_complete(text, len);
                    if (p->n_stop > 0) {
                        long at = ks_stop_find(text, ok, p->stop, p->n_stop);
                        if (at >= 0) { ok = (size_t)at; hit = 1; }
                        else if (!last) ok -= ks_stop_holdback(text, ok, p->stop, p->n_stop);
                    }
                    if (ok > emitted) {
                        text[ok] = 0;
                        piece = text + emitted;
                        emitted = ok;
                    }
                }
            }
            int stop = cb ? cb(ud, id, piece) : 0;
            free(text);
            if (stop || hit) break;
        }
        if (eos) break;
        if (t + 1 == p->max_new) break;
        if ((st = ks_session_check_interrupt(s))) break;
        if ((st = greedy ? ks_session_decode_greedy(s, id, &next) : ks_session_decode(s, id))) break;
        s->n_decoded++;
    }
    if (!st) st = ks_ring_restore_all(s); /* a KV ring's rows in logical order for the kept reports */
    free(plog);
    free(seen);
    if (out_ids) *out_ids = gen;
    else free(gen);
    if (n_out) *n_out = ng;
    return st;
}
