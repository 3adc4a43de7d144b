/* chat.c — llama3 and chatml prompt formats. */
#include "chat.h"

#include <stdlib.h>
#include <string.h>

typedef struct sbuf { char *p; size_t n, cap; int oom; } sbuf;

static void put(sbuf *b, const char *s) {
    size_t k = strlen(s);
    if (b->oom) return;
    if (b->n + k + 1 > b->cap) {
        size_t cap = (b->n + k + 1) * 2;
        char *q = ks_realloc(b->p, cap);
        if (!q) { b->oom = 1; return; }
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, k + 1);
    b->n += k;
}

ks_status ks_chat_format(const char *format, const ks_chat_msg *msgs, int n, char **out) {
    *out = NULL;
    int llama3 = !strcmp(format, "llama3"), chatml = !strcmp(format, "chatml");
    if (!llama3 && !chatml) return ks_errorf(KS_ERR_ARG, "unknown chat format \"%s\" (llama3 or chatml)", format);
    sbuf b = {0};
    put(&b, llama3 ? "<|begin_of_text|>" : "");
    for (int i = 0; i < n; i++) {
        if (!msgs[i].role || !msgs[i].content) { free(b.p); return ks_errorf(KS_ERR_ARG, "chat message %d has no role or content", i); }
        if (llama3) {
            put(&b, "<|start_header_id|>"); put(&b, msgs[i].role); put(&b, "<|end_header_id|>\n\n");
            put(&b, msgs[i].content); put(&b, "<|eot_id|>");
        } else {
            put(&b, "<|im_start|>"); put(&b, msgs[i].role); put(&b, "\n");
            put(&b, msgs[i].content); put(&b, "<|im_end|>\n");
        }
    }
    put(&b, llama3 ? "<|start_header_id|>assistant<|end_header_id|>\n\n" : "<|im_start|>assistant\n");
    if (b.oom) { free(b.p); return KS_ERR_OOM; }
    *out = b.p;
    return KS_OK;
}
