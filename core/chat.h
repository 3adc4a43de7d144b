/* chat.h — chat-template helper for the two formats we need, no Jinja:
 *   "llama3": <|begin_of_text|><|start_header_id|>ROLE<|end_header_id|>\n\nTEXT<|eot_id|> ...
 *             ending with an open assistant header;
 *   "chatml" (Qwen): <|im_start|>ROLE\nTEXT<|im_end|>\n ... ending with <|im_start|>assistant\n.
 * The result already holds any BOS, so tokenize it with add_special = 0. */
#ifndef KS_CHAT_H
#define KS_CHAT_H
#include "common.h"

typedef struct ks_chat_msg { const char *role, *content; } ks_chat_msg;

/* *out is malloc'd. Unknown format -> KS_ERR_ARG. */
ks_status ks_chat_format(const char *format, const ks_chat_msg *msgs, int n, char **out);

#endif
