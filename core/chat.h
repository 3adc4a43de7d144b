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
 * would be tokenized as plain text and the model would silently produce junk.
 * The public calls are in kvsieve.h ("chat prompts"); this header adds the tokenizer-level check. */
#ifndef KS_CHAT_H
#define KS_CHAT_H
#include "common.h"
#include "tokenizer.h"

/* ks_chat_msg, ks_chat_format, ks_chat_detect, ks_chat_from_model_dir, ks_chat_check_model and
 * ks_chat_format_names are public (kvsieve.h, where their documentation is); what follows is
 * the library's own. */

/* The names accepted by ks_chat_format, for messages: "llama3, chatml, mistral, phi3"
 * (ks_chat_format_names() returns it). */
extern const char *const ks_chat_formats;

/* Checks that `tok` encodes each special-token string the rendering of msgs in `format` uses as
 * exactly one token. KS_ERR_ARG naming the first missing one, e.g. `the model's tokenizer has no
 * token "<|im_start|>" (needed by the chatml chat format)`. */
ks_status ks_chat_check(const char *format, const ks_tokenizer *tok, const ks_chat_msg *msgs, int n);

#endif
