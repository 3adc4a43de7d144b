"""Tokenizers for the training script.

HFBPE      byte-level BPE trained with HF `tokenizers` (GPU machine): special tokens
           <|bos|>=0 <|eos|>=1 <|pad|>=2, pre-tokenizer Sequence[Digits(individual), ByteLevel(no
           prefix space, GPT-2 regex)], ByteLevel decoder, TemplateProcessing post-processor that
           prepends <|bos|>.
ByteTok    fallback without any dependency (CPU smoke test): the same specials, then the 256
           bytes (id = 3 + byte); it writes an equivalent HF tokenizer.json (BPE, no merges), so
           even a smoke-test model folder loads like any HF checkpoint.

Both expose: vocab_size, bos/eos/pad, encode(text) -> ids (no specials), encode_batch(texts),
decode(ids), save(dir) (tokenizer.json + tokenizer_config.json).
"""

import json
import os

SPECIALS = ["<|bos|>", "<|eos|>", "<|pad|>"]
BOS, EOS, PAD = 0, 1, 2


def byte_alphabet():
    """GPT-2 byte -> printable unicode character map (the ByteLevel alphabet)."""
    keep = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return out


def _pre_tokenizer_json():
    return {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]}


def _post_processor_json():
    return {"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<|bos|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": "<|bos|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": "<|bos|>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<|bos|>": {"id": "<|bos|>", "ids": [BOS], "tokens": ["<|bos|>"]}}}


def tokenizer_config(max_len):
    added = {str(i): {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                      "single_word": False, "special": True} for i, s in enumerate(SPECIALS)}
    return {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|bos|>", "eos_token": "<|eos|>",
            "pad_token": "<|pad|>", "unk_token": None, "add_bos_token": True, "add_eos_token": False,
            "clean_up_tokenization_spaces": False, "model_max_length": max_len,
            "added_tokens_decoder": added}


class ByteTok:
    kind = "bytes"

    def __init__(self):
        self.vocab_size = 259
        self.bos, self.eos, self.pad = BOS, EOS, PAD

    def encode(self, text):
        return [3 + b for b in text.encode("utf-8")]

    def encode_batch(self, texts):
        return [self.encode(t) for t in texts]

    def decode(self, ids):
        return bytes(i - 3 for i in ids if i >= 3).decode("utf-8", errors="replace")

    def save(self, d, max_len=16384):
        alpha = byte_alphabet()
        vocab = {s: i for i, s in enumerate(SPECIALS)}
        for b in range(256):
            vocab[alpha[b]] = 3 + b
        j = {"version": "1.0", "truncation": None, "padding": None,
             "added_tokens": [{"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
                               "normalized": False, "special": True} for i, s in enumerate(SPECIALS)],
             "normalizer": None, "pre_tokenizer": _pre_tokenizer_json(), "post_processor": _post_processor_json(),
             "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
             "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                       "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                       "ignore_merges": False, "vocab": vocab, "merges": []}}
        with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
            json.dump(j, f, ensure_ascii=False, indent=1)
        with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
            json.dump(tokenizer_config(max_len), f, indent=2)


class HFBPE:
    kind = "bpe"

    def __init__(self, tk):
        self.tk = tk
        self.vocab_size = tk.get_vocab_size(with_added_tokens=True)
        for i, s in enumerate(SPECIALS):
            assert tk.token_to_id(s) == i, "special token %s must have id %d" % (s, i)
        self.bos, self.eos, self.pad = BOS, EOS, PAD

    @staticmethod
    def train(texts, vocab_size):
        """texts: an iterable of strings (deterministic order)."""
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
        tk = Tokenizer(models.BPE())
        tk.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
        tk.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                      special_tokens=list(SPECIALS),
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tk.train_from_iterator(texts, trainer=trainer)
        tk.post_processor = processors.TemplateProcessing(
            single="<|bos|> $A", pair="<|bos|> $A <|bos|>:1 $B:1", special_tokens=[("<|bos|>", BOS)])
        return HFBPE(tk)

    @staticmethod
    def load(path):
        from tokenizers import Tokenizer
        return HFBPE(Tokenizer.from_file(path))

    def encode(self, text):
        return self.tk.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts):
        return [e.ids for e in self.tk.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids):
        return self.tk.decode(list(ids), skip_special_tokens=True)

    def save(self, d, max_len=16384):
        self.tk.save(os.path.join(d, "tokenizer.json"))
        with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
            json.dump(tokenizer_config(max_len), f, indent=2)


def load_tokenizer(d):
    """Load the tokenizer of a model folder (HF tokenizers if present, else a ByteTok json)."""
    p = os.path.join(d, "tokenizer.json")
    with open(p, encoding="utf-8") as f:
        j = json.load(f)
    if not j["model"].get("merges") and len(j["model"]["vocab"]) == 259:
        return ByteTok()
    return HFBPE.load(p)
