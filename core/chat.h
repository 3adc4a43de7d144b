/* chat.h — chat prompt formats of four model families, written in C (no Jinja engine):
 *
 *   "llama3"  <|begin_of_text|><|start_header_id|>ROLE<|end_header_id|>\n\nTEXT<|eot_id|> ...
 *             <|start_header_id|>assistant<|end_header_id|>\n\n          (Llama 3 / 3.x instruct;
 *             TEXT is trimmed of surrounding whitespace, as the official template's `| trim`)
 *   "chatml"  <|im_start|>ROLE\nTEXT<|im_end|>\n ... <|im_start|>assistant\n         (Qwen 2/3 ...)
 *   "mistral" <s>[INST] USER [/INST]ANSWER</s>[INST] USER [/INST]    (Mistral 7B instruct, v0.1/v0.2
 *             spacing: one space inside [INST] ... [/INST], none after it; a system message goes
 *             in front of the first user message followed by a blank line, "SYSTEM\n\nUSER")
 *   "phi3"    <|system|>\nTEXT<|end|>\n<|user|>\nTEXT<|end|>\n ... <|assistant|>\n   (Phi-3 instruct)
 *
 * Every rendering ends with the open assistant turn (HF's add_generation_prompt=True). The result
 * already holds any BOS, so it is tokenized with add_special = 0 (like HF's apply_chat_template).
 * Which format a model wants comes from its tokenizer_config.json: ks_chat_detect recognises a
 * Jinja chat_template by the special tokens it writes. ks_chat_check refuses a tokenizer that
 * does not turn each of the format's special-token strings into one token: without it the prompt
 * would be tokenized as plain text and the model would silently produce junk. */
#ifndef KS_CHAT_H
#define KS_CHAT_H
#include "common.h"
#include "tokenizer.h"

typedef struct ks_chat_msg { const char *role, *content; } ks_chat_msg;

/* The names accepted by ks_chat_format, for messages: "llama3, chatml, mistral, phi3". */
extern const char *const ks_chat_formats;

/* Render msgs in `format`; *out is malloc'd. Unknown format -> KS_ERR_ARG. Roles: llama3 and
 * chatml take any role string; mistral takes an optional first "system" then "user" and
 * "assistant" turns alternating from "user"; phi3 takes system, user and assistant. A message
 * outside those rules is KS_ERR_ARG naming it. */
ks_status ks_chat_format(const char *format, const ks_chat_msg *msgs, int n, char **out);

/* The format a Jinja chat_template renders, recognised by its special tokens:
 * "<|start_header_id|>" -> llama3, "<|im_start|>" -> chatml, "<|user|>" with "<|end|>" -> phi3,
 * "[INST]" -> mistral. NULL when it is none of these. */
const char *ks_chat_detect(const char *chat_template);

/* The format of the model in `dir`: its tokenizer_config.json's chat_template (a string, or a
 * list of {name, template} where "default" is taken), else a chat_template.jinja file beside
 * it. *format is a static string. No template, or one that is none of the four: KS_ERR_ARG. */
ks_status ks_chat_from_model_dir(const char *dir, const char **format);

/* Checks that `tok` encodes each special-token string the rendering of msgs in `format` uses as
 * exactly one token. KS_ERR_ARG naming the first missing one, e.g. `the model's tokenizer has no
 * token "<|im_start|>" (needed by the chatml chat format)`. */
ks_status ks_chat_check(const char *format, const ks_tokenizer *tok, const ks_chat_msg *msgs, int n);

#endif
