/* fuzz_serve_request.c — libFuzzer harness for `kvsieve serve`'s request parser and JSON writer
 * (repl/serve_json.c, compiled in here: it is the CLI's, not the library's).
 *
 * Each input is parsed as a completions body and as a chat body (srv_parse_request). Either it is
 * accepted, and the request struct must hold what the parser promises (a prompt or messages with
 * role and content, counts in range, a policy kind with every "set" entry), or it is refused with
 * a 4xx and a non-empty message; both are freed (LeakSanitizer checks nothing stays). Then the
 * writer: the input written as a JSON string, and the error reply, must parse back with
 * kvsieve.h's JSON reader and, for the string, give the input back byte for byte (inputs that are not ASCII
 * are written as they are, so only ASCII ones are required to round-trip). Seeds:
 * tests/fuzz/corpus/serve_request (bodies the tests send). */
#include "serve_json.c"

#include <stdint.h>
#include <string.h>

static void check_request(const srv_params *p, int chat) {
    if (chat ? (!p->msgs || p->n_msgs < 1) : !p->prompt) __builtin_trap();
    for (int i = 0; i < p->n_msgs; i++)
        if (!p->msgs[i].role || !p->msgs[i].content) __builtin_trap();
    if (p->n_stop < 0 || p->n_stop > SRV_MAX_STOP || p->n_set < 0 || p->n_set > SRV_MAX_SET) __builtin_trap();
    for (int i = 0; i < p->n_stop; i++)
        if (!p->stop[i] || !p->stop[i][0]) __builtin_trap();
    for (int i = 0; i < p->n_set; i++)
        if (!p->set_key[i] || !p->set_val[i] || !p->policy) __builtin_trap();
    if (p->policy ? p->policy_kind < SRV_POL_NAME || p->policy_kind > SRV_POL_INLINE : p->policy_kind != SRV_POL_NONE)
        __builtin_trap();
    if (!(p->top_p > 0 && p->top_p <= 1) || !(p->temperature >= 0) || p->max_tokens < -1 || p->top_k < 0) __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *text = (const char *)data;
    for (int chat = 0; chat < 2; chat++) {
        srv_params p;
        srv_error e = {0};
        if (srv_parse_request(text, size, chat, &p, &e) == 0) {
            check_request(&p, chat);
            srv_params_free(&p);
        } else {
            if (e.http < 400 || e.http > 499 || !e.msg[0] || !e.type || !e.code) __builtin_trap();
            sj_buf b = {0};
            srv_error_json(&e, &b);
            ks_json *j = b.oom ? NULL : ks_json_parse(b.p, b.n);
            /* the message is cut at a byte count, which may split a UTF-8 sequence of the input:
             * only ASCII messages must parse back */
            int ascii = 1;
            for (const char *c = e.msg; *c; c++) ascii &= (unsigned char)*c < 0x80;
            if (ascii && !b.oom && (!j || !ks_json_get(ks_json_get(j, "error"), "message"))) __builtin_trap();
            ks_json_free(j);
            sj_free(&b);
        }
    }
    sj_buf b = {0};
    sj_strn(&b, text, size);
    int ascii = 1;
    for (size_t i = 0; i < size; i++) ascii &= data[i] < 0x80;
    if (ascii && !b.oom) {
        ks_json *j = ks_json_parse(b.p, b.n);
        size_t n;
        const char *str = ks_json_string(j, &n);
        if (!str || n != size || memcmp(str, text, size)) __builtin_trap();
        ks_json_free(j);
    }
    sj_free(&b);
    return 0;
}
