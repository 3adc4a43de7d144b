#!/usr/bin/env python3
"""make_corpus.py — writes the seed corpora of the fuzz harnesses, tests/fuzz/corpus/NAME/, from
the project's real files (run from the repository root; idempotent; the output is committed):

  json            real JSON files of the project (configs, a sharded index, a safetensors header,
                  a trimmed tokenizer.json, tokenizer_config.json, a policy fixture manifest's head)
  config          every config.json / config.v4.json of tests/fixtures/hf and models/kvsieve-tiny
  safetensors     real fixture checkpoints trimmed to their small tensors (real header fields and
                  real bytes), single files, a sharded index + shards, loose files
  model           the fixture configs shrunk to tiny dimensions with matching random weights
                  (F32 / BF16, tied / untied, Qwen2 biases, Phi-3 fused, longrope), one with a
                  trimmed real tokenizer
  tokenizer_load  the real tokenizer.json files (kvsieve-tiny; Llama 3, Qwen 3, Mistral when
                  tests/tokenizer/setup.sh has run) trimmed to a few hundred tokens
  encode          texts (prose, chat templates with special tokens, code, several scripts) per
                  tokenizer slot
  decode          ids of real words looked up in the real vocabularies
  policy_set      the --set values of the project's policies and tests
  lua_prims       small programs for the interpreter of fuzz_lua_prims.c doing what the
                  policies of policies/ do (scores, pool1d, topk, retain, attend, ...)

Nothing from ../shared is written (the harnesses read ../shared at run time instead). The
tokenizer slots of encode/decode follow fuzz_tok_common.h: 0 kvsieve-tiny, 1 llama3, 2 qwen3,
3 mistral, 4 stories260K (a slot beyond those loaded wraps around)."""
import json
import os
import random
import shutil
import struct

OUT = "tests/fuzz/corpus"
SEP = b"\n--ks-file--\n"
HF = "tests/fixtures/hf"
TOKS = [("tiny", "models/kvsieve-tiny/tokenizer.json"), ("llama3", "tests/tokenizer/build/llama3.tokenizer.json"),
        ("qwen3", "tests/tokenizer/build/qwen3.tokenizer.json"), ("mistral", "tests/tokenizer/build/mistral.tokenizer.json")]


def put(name, fname, data):
    d = os.path.join(OUT, name)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, fname), "wb") as f:
        f.write(data)


def read(p):
    with open(p, "rb") as f:
        return f.read()


# ---------------------------------------------------------------- safetensors helpers

def st_parse(path):
    b = read(path)
    n = struct.unpack("<Q", b[:8])[0]
    hdr = json.loads(b[8:8 + n])
    return hdr, b[8 + n:]


def st_write(tensors, meta=None):
    """tensors: list of (name, dtype, shape, raw bytes) -> safetensors bytes."""
    hdr, off, blobs = {}, 0, []
    if meta is not None:
        hdr["__metadata__"] = meta
    for name, dt, shape, raw in tensors:
        hdr[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        off += len(raw)
        blobs.append(raw)
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)


def st_trim(path, max_bytes):
    """The tensors of a real file whose data is at most max_bytes, with their real bytes."""
    hdr, data = st_parse(path)
    out = []
    for name, t in hdr.items():
        if name == "__metadata__":
            continue
        b, e = t["data_offsets"]
        if e - b <= max_bytes:
            out.append((name, t["dtype"], t["shape"], data[b:e]))
    return out, hdr.get("__metadata__")


def rand_tensor(rng, dt, shape):
    n = 1
    for s in shape:
        n *= s
    vals = [rng.uniform(0.05, 1.0) * rng.choice((-1, 1)) for _ in range(n)]
    if dt == "F32":
        return struct.pack("<%df" % n, *vals)
    # bf16: the high half of the float32 bits
    return b"".join(struct.pack("<H", struct.unpack("<I", struct.pack("<f", v))[0] >> 16) for v in vals)


# ---------------------------------------------------------------- tokenizers

def trim_tokenizer(path, keep):
    """A real tokenizer.json with its vocab cut to the first `keep` ids, the merges among them,
    and its added tokens renumbered right after."""
    t = json.loads(read(path))
    m = t["model"]
    vocab = {k: v for k, v in m["vocab"].items() if v < keep}
    merges = []
    for mg in m.get("merges", []):
        a, b = mg.split(" ", 1) if isinstance(mg, str) else mg
        if a in vocab and b in vocab and a + b in vocab:
            merges.append(mg)
        if len(merges) >= 200:
            break
    m["vocab"] = vocab
    m["merges"] = merges
    added = []
    for i, a in enumerate(t.get("added_tokens", [])[:8]):
        a = dict(a)
        if a["id"] >= keep:
            a["id"] = keep + i
        added.append(a)
    t["added_tokens"] = added
    # post-processor ids follow the renumbering
    ids = {a["content"]: a["id"] for a in added}
    pp = t.get("post_processor")

    def fix(pp):
        if isinstance(pp, dict):
            if "special_tokens" in pp:
                for k, v in pp["special_tokens"].items():
                    if k in ids:
                        v["ids"] = [ids[k]]
            for p in pp.get("processors", []) or []:
                fix(p)
    fix(pp)
    return json.dumps(t, ensure_ascii=False, separators=(",", ":"))


def main():
    if os.path.isdir(OUT):
        shutil.rmtree(OUT)
    rng = random.Random(1234)
    fixtures = sorted(d for d in os.listdir(HF) if os.path.isdir(os.path.join(HF, d)))

    # ---- config + json
    for d in fixtures:
        for f in ("config.json", "config.v4.json"):
            p = os.path.join(HF, d, f)
            if os.path.exists(p):
                put("config", "%s.%s" % (d, f), read(p))
        put("json", d + ".config.json", read(os.path.join(HF, d, "config.json")))
    put("config", "kvsieve-tiny.config.json", read("models/kvsieve-tiny/config.json"))
    put("json", "generation_config.json", read("models/kvsieve-tiny/generation_config.json"))
    put("json", "tokenizer_config.json", read("models/kvsieve-tiny/tokenizer_config.json"))
    put("json", "model.safetensors.index.json", read(os.path.join(HF, "llama_sharded/model.safetensors.index.json")))
    hdr, _ = st_parse(os.path.join(HF, "llama_bf16/model.safetensors"))
    put("json", "safetensors_header.json", json.dumps(hdr))
    put("json", "train_state.json", read("models/kvsieve-tiny/train_state.json"))
    put("json", "escapes.json", '{"a":"\\u00e9\\ud83d\\ude00\\n\\t\\"","b":[1,-0,2.5e-3,1E+2,true,false,null],"c":{}}')

    # ---- tokenizers (trimmed real files)
    trimmed = {}
    for name, p in TOKS:
        if not os.path.exists(p):
            continue
        keep = 300
        trimmed[name] = trim_tokenizer(p, keep)
        put("tokenizer_load", name + ".tokenizer.json", trimmed[name])
    put("json", "tokenizer.json", trimmed["tiny"])

    # ---- safetensors: mode byte + parts
    single = os.path.join(HF, "llama_bf16/model.safetensors")
    ts, meta = st_trim(single, 512)
    put("safetensors", "single_bf16", b"\x00" + st_write(ts, meta))
    ts, meta = st_trim(os.path.join(HF, "qwen2_bias/model.safetensors"), 384)
    put("safetensors", "single_qwen2", b"\x00" + st_write(ts, meta))
    ts, meta = st_trim(os.path.join(HF, "llama3_scaling_f32/model.safetensors"), 256)
    put("safetensors", "single_f32", b"\x00" + st_write(ts[:6], meta))
    # sharded: the real index, keeping names whose shard keeps them
    idx = json.loads(read(os.path.join(HF, "llama_sharded/model.safetensors.index.json")))
    shards = sorted(set(idx["weight_map"].values()))
    parts, wm = [], {}
    for i, sh in enumerate(shards):
        ts, meta = st_trim(os.path.join(HF, "llama_sharded", sh), 256)
        ts = ts[:4]
        parts.append(st_write(ts, meta))
        for t in ts:
            wm[t[0]] = "model-%05d-of-%05d.safetensors" % (i + 1, len(shards))
    idx["weight_map"] = wm
    idx["metadata"] = {"total_size": sum(len(p) for p in parts)}
    put("safetensors", "sharded", b"\x01" + SEP.join([json.dumps(idx, indent=2).encode()] + parts))
    put("safetensors", "loose", b"\x02" + SEP.join(parts[:2]))

    # ---- model: fixture configs shrunk to tiny dimensions with matching weights
    for d in fixtures:
        cfg = json.loads(read(os.path.join(HF, d, "config.json")))
        H, Hkv = 2, 2 if cfg.get("num_key_value_heads") == cfg.get("num_attention_heads") else 1
        hd = 4
        D = 8 if "head_dim" not in cfg else 12  # mistral_headdim: head_dim != hidden / heads
        F, V, nl = 8, 16, 1
        cfg.update(hidden_size=D, num_attention_heads=H, num_key_value_heads=Hkv, intermediate_size=F,
                   vocab_size=V, num_hidden_layers=nl, max_position_embeddings=64)
        if "head_dim" in cfg:
            cfg["head_dim"] = hd
        for key in ("rope_scaling", "rope_parameters"):
            rs = cfg.get(key)
            if isinstance(rs, dict):
                for fk in ("short_factor", "long_factor"):
                    if fk in rs:
                        rs[fk] = [1.0 + 0.5 * i for i in range(hd // 2)]
                if "original_max_position_embeddings" in rs:
                    rs["original_max_position_embeddings"] = 32
        if "original_max_position_embeddings" in cfg:
            cfg["original_max_position_embeddings"] = 32
        if cfg.get("sliding_window"):
            cfg["sliding_window"] = 4
        for k in ("bos_token_id", "eos_token_id", "pad_token_id"):
            if isinstance(cfg.get(k), int):
                cfg[k] = min(cfg[k], V - 1)
        dt = "BF16" if "bf16" in d else "F32"
        qd, kd = H * hd, Hkv * hd
        phi3 = cfg["model_type"] == "phi3"
        qwen = cfg["model_type"] == "qwen2" or cfg.get("attention_bias")
        ts = [("model.embed_tokens.weight", (V, D)), ("model.norm.weight", (D,))]
        if not cfg.get("tie_word_embeddings"):
            ts.append(("lm_head.weight", (V, D)))
        for l in range(nl):
            p = "model.layers.%d." % l
            ts += [(p + "input_layernorm.weight", (D,)), (p + "post_attention_layernorm.weight", (D,)),
                   (p + "self_attn.o_proj.weight", (D, qd)), (p + "mlp.down_proj.weight", (D, F))]
            if phi3:
                ts += [(p + "self_attn.qkv_proj.weight", (qd + 2 * kd, D)), (p + "mlp.gate_up_proj.weight", (2 * F, D))]
            else:
                ts += [(p + "self_attn.q_proj.weight", (qd, D)), (p + "self_attn.k_proj.weight", (kd, D)),
                       (p + "self_attn.v_proj.weight", (kd, D)), (p + "mlp.gate_proj.weight", (F, D)),
                       (p + "mlp.up_proj.weight", (F, D))]
            if qwen:
                ts += [(p + "self_attn.q_proj.bias", (qd,)), (p + "self_attn.k_proj.bias", (kd,)),
                       (p + "self_attn.v_proj.bias", (kd,))]
        st = st_write([(n, dt, s, rand_tensor(rng, dt, s)) for n, s in ts], {"format": "pt"})
        put("model", d, json.dumps(cfg, indent=1).encode() + SEP + st)
        if d == "llama_gqa_f32":  # one with a (tiny, real-shaped) tokenizer: vocab must cover it
            tok = json.loads(trimmed["tiny"])
            tok["model"]["vocab"] = {k: v for k, v in tok["model"]["vocab"].items() if v < 13}
            tok["model"]["merges"] = []
            tok["added_tokens"] = [a for a in tok["added_tokens"] if a["id"] < 13]
            put("model", d + "_tok", json.dumps(cfg).encode() + SEP + st + SEP + json.dumps(tok).encode())

    # ---- encode / decode
    texts = [
        "Once upon a time, there was a little girl named Lily. She loved to play outside.",
        "kvsieve is a C11 LLM inference engine with Lua 5.4 token-pruning policies.",
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHello!<|eot_id|>",
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n<|endoftext|>",
        "<s>[INST] Summarise this. [/INST]</s>",
        "int main(void) {\n\tprintf(\"%d\\n\", 42);\n    return 0;\n}\n",
        "\u00c9t\u00e9 \u00e0 Paris \u2014 \u4e2d\u6587\u6d4b\u8bd5 \u65e5\u672c\u8a9e \ud55c\uad6d\uc5b4 \u0645\u0631\u062d\u0628\u0627 \U0001F600\U0001F44D\u200d",
        "   leading spaces,\ttabs\r\nand  double  spaces   ",
        "1234567890 3.14159 1e-9 0x7fffffff 2024-01-01",
        "e\u0301 vs \u00e9 (NFC), \ufb01 ligature, \u2126 ohm",
    ]
    for slot in range(5):
        for i, t in enumerate(texts):
            if (i + slot) % 2 == 0 or slot == 0:
                put("encode", "s%d_%d" % (slot, i), bytes([slot | (0x80 if i % 3 == 0 else 0)]) + t.encode())
    words = "Once upon a time there was a little girl named Lily She loved to play outside the hello world".split()
    for slot, (name, p) in enumerate(TOKS):
        if not os.path.exists(p):
            continue
        vocab = json.loads(read(p))["model"]["vocab"]
        ids = []
        for i, w in enumerate(words):
            for cand in (("\u0120" if i else "") + w, "\u2581" + w, w, w.lower()):
                if cand in vocab:
                    ids.append(vocab[cand])
                    break
        for skip in (0, 1):
            b = bytes([slot | (0x80 * skip)])
            b += b"".join(struct.pack("<I", x)[:3] for x in ids)
            if skip:
                b += bytes([0, 0, 0x80, 3, 0, 0x80])  # an edge id: -1, then vocab (out of range)
            put("decode", "%s_%d" % (name, skip), b)

    # ---- policy_set: byte 0 = key index (fuzz_policy_set.c's kKeys) or >= 0xf0: "key=value"
    sets = [(0, "12"), (0, "1e3"), (0, "-5"), (1, "0.125"), (1, "inf"), (2, "off"), (2, "yes"), (3, "mean"),
            (4, "1,2"), (5, "13"), (6, "-1"), (7, "64"), (7, "0"), (8, "100000000"), (9, "30"), (9, "0.5"),
            (10, "emulate"), (10, "host"), (11, "1024"), (12, "1")]
    for i, (k, v) in enumerate(sets):
        put("policy_set", "key%02d" % i, bytes([k]) + v.encode())
    for i, kv in enumerate(["k=1024", "layer=13", "ratio=0.05", "_memory_mb=256", "_instructions=0", "mode=sum", "on=false"]):
        put("policy_set", "cli%02d" % i, b"\xf0" + kv.encode())

    # ---- lua_prims: header (8 bytes) + program parts (see fuzz_lua_prims.c)
    FN = ['scores', 'pool1d', 'topk', 'sort', 'argsort', 'rank', 'unique', 'union', 'concat', 'arange', 'gather',
          'softmax', 'sum', 'mean', 'var', 'cosine', 'tensor', 'zeros', 'stack', 'rope', 'report', 'unhook', '_upload',
          'page_reduce', 'bound_scores', 'page_rows', 'ge', 'where', 'add']
    TM = ['numel', 'tolist', 'item', 'slice', 'row', 'clone', 'float', 'int', 'reshape', 'size']
    EM = ['restart', 'propagate', 'retain', 'attend', 'stop', 'discard_kv', 'report', 'kv_pos', 'kv_keys', 'kv_values',
          'release']
    EF = ['event', 'layer', 'pass', 'n', 'n_prompt', 'n_heads', 'n_kv_heads', 'head_dim', 'dim', 'n_layers', 'token',
          'q', 'k', 'v', 'k_pre', 'hidden', 'pos', 'ids', 'orig', 'kv_rows', 'nope', 'held_steps']
    K = [0, 1, 2, 3, -1, -2, 4, 5, 8, 16]
    S = ['', 'ab', 'rows', 'qpos', 'kpos', 'scale', 'causal', 'softmax', 'key_range', 'out', 'reduce', 'gqa', 'threads',
         'sorted', 'descending', 'ddof', 'renumber', 'none', 'sum', 'max', 'mean', 'avg', 'last', 'group', 'div', 'mod',
         'index', 'value', 'rsqrt_d', 'sqrt_d', 'theta', 'max_pos', 'prefill_qkv', 'decode_qkv', 'token', 'x',
         'pages', 'before', 'after', 'check', 'min', 'minmax', 'group_max', 'group_sum', 'rope', 'base', 'values', 'hold',
         'skip', 'into']
    OPT = ['rows', 'qpos', 'kpos', 'scale', 'causal', 'softmax', 'key_range', 'out', 'reduce', 'gqa', 'threads', 'sorted',
           'descending', 'ddof', 'renumber', 'theta', 'max_pos', 'bogus', 'pages', 'before', 'after', 'check', 'rope',
           'base', 'values', 'hold', 'skip', 'into']
    TOP = lambda k=0: 200 + k  # noqa: E731  the k-th latest value

    def field(f): return [11, EF.index(f)]
    def call(f, *a): return [7, FN.index(f), len(a)] + list(a)
    def meth(m, *a, recv=None): return [8, TOP() if recv is None else recv, TM.index(m), len(a)] + list(a)
    def evm(m, *a): return [10, EM.index(m), len(a)] + list(a)
    def const(v): return [0, K.index(v)]
    def s(v): return [2, S.index(v)]
    def opts(*kv): return [6, len(kv)] + sum(([OPT.index(k), a] for k, a in kv), [])

    progs = {
        # SnapKV-like: scores of the last queries against the keys, pooled, top-k, retain
        "snapkv": field("q") + field("k") + s("sum") + opts(("reduce", TOP())) + call("scores", TOP(3), TOP(2), TOP())
        + const(3) + s("max") + call("pool1d", TOP(2), TOP(1), TOP()) + const(2) + call("topk", TOP(1), TOP())
        + evm("retain", TOP()),
        # StreamingLLM-like: arange of sinks + window, concat, retain / attend
        "streaming": const(2) + call("arange", TOP()) + const(4) + const(8) + call("arange", TOP(1), TOP())
        + call("concat", TOP(3), TOP()) + evm("retain", TOP()) + evm("attend", TOP(1)),
        # tensors: build, reshape, arithmetic, row, conversion, tostring, clone
        "tensor": [4, 6, 100, 104, 108, 112, 116, 120] + call("tensor", TOP()) + const(2) + const(3)
        + meth("reshape", TOP(1), TOP(0), recv=TOP(2)) + const(0) + meth("row", TOP(), recv=TOP(1))
        + [9, TOP(), TOP(), 0] + meth("tolist") + meth("int", recv=TOP(3)) + [9, TOP(), TOP(), 6] + meth("clone", recv=TOP(5)),
        # the event: fields, kv views, per-head lists, report
        "event": field("kv_rows") + field("n_kv_heads") + evm("kv_keys") + const(0) + evm("kv_pos", TOP())
        + evm("kv_values", TOP(1)) + field("pos") + field("ids") + s("ab") + evm("report", TOP(), TOP(1))
        + [3, 2, TOP(3), TOP(3)] + evm("retain", TOP()),
        # sorting family and reductions
        "sort": field("hidden") + const(0) + meth("row", TOP(), recv=TOP(1)) + call("sort", TOP()) + call("argsort", TOP(1))
        + call("rank", TOP(2)) + call("softmax", TOP(3)) + call("sum", TOP()) + call("mean", TOP(4)) + call("var", TOP(5))
        + call("unique", TOP(4)) + call("union", TOP(), TOP()) + call("gather", TOP(8), TOP(5)),
        # views kept for the next event: stale there
        "stale": field("k") + [12, 0, TOP()] + [0xfe, 0xfe] + [13, 0] + meth("numel") + meth("tolist", recv=TOP(1)),
        # issue 12's reproducers: {{1,2},"ab"}, tensor + zeros(0), maxinteger, kv_pos(0):clone()
        "hostile": [4, 2, 104, 108] + s("ab") + [3, 2, TOP(1), TOP()] + call("tensor", TOP())
        + [4, 1, 104] + call("tensor", TOP()) + const(0) + call("zeros", TOP()) + [9, TOP(1), TOP(), 0]
        + [0, 16] + [9, TOP(2), TOP(), 0] + const(0) + evm("kv_pos", TOP()) + meth("clone"),
        # ks.concat / stack with many arguments
        "many": const(1) + call("arange", TOP()) + [15, FN.index("concat"), TOP(), 80] + [15, FN.index("stack"), TOP(1), 40],
        # masks: ge of a hidden row, where of it and its softmax, a one-value mask skipping scores and topk
        "masks": field("hidden") + const(0) + meth("row", TOP(), recv=TOP(1)) + const(1) + call("ge", TOP(1), TOP())
        + call("softmax", TOP(1)) + call("where", TOP(1), TOP(2), TOP()) + [4, 1, 104] + call("tensor", TOP())
        + opts(("skip", TOP())) + const(2) + call("topk", TOP(5), TOP(), TOP(1)) + field("q") + field("k")
        + [2, S.index("sum")] + opts(("reduce", TOP()), ("skip", TOP(6))) + call("scores", TOP(3), TOP(2), TOP()),
        # in place: a hidden row cloned, where and add into it (and into a view of it, refused), read again
        "into": field("hidden") + const(0) + meth("row", TOP(), recv=TOP(1)) + meth("clone") + const(1)
        + call("ge", TOP(1), TOP()) + opts(("into", TOP(1))) + call("where", TOP(1), TOP(2), TOP(3), TOP())
        + call("add", TOP(3), TOP(3), TOP(1)) + meth("tolist", recv=TOP(4)) + opts(("into", TOP(5)))
        + call("add", TOP(6), TOP(6), TOP()) + meth("item", TOP(8), recv=TOP(6)),
        # begin part: unhook + report, then an event
        "begin": s("decode_qkv") + call("unhook", TOP()) + s("ab") + const(1) + call("report", TOP(1), TOP())
        + [0xfe, 0xfe] + field("n") + call("arange", TOP()) + evm("propagate", TOP()),
    }
    # headers: [Hkv idx | group, head_dim | special, rows | layer | pass | backend, pos offset | token, seed,
    #           kv rows | differ | extra, kv pos step | k_pre, event kinds | device mode]
    headers = {
        "snapkv": [1, 3, 5, 0, 7, 4, 0, 0], "streaming": [0, 1, 7, 0, 3, 7, 0, 3], "tensor": [2, 2, 2, 0, 1, 2, 0, 1],
        "event": [9, 3, 3, 1, 9, 0x0b, 2, 0], "sort": [0, 4, 4, 0, 5, 3, 0, 1], "stale": [1, 2, 3, 0, 2, 3, 0, 3 << 3],
        "hostile": [0, 0, 2, 0, 0, 0, 0, 0], "many": [4, 1, 1, 0, 0, 1, 0, 3], "begin": [2, 2, 3, 0, 0, 2, 0, 0],
        "masks": [1, 3, 5, 0, 7, 4, 0, 0], "into": [1, 3, 5, 0, 7, 4, 0, 0],
    }
    for name, prog in progs.items():
        for dev in (0, 1):
            h = list(headers[name])
            h[7] = (h[7] & 0x7f) | (0x80 * dev)
            if dev:
                h[2] |= 0x40  # the CPU backend on the event (the emulated device needs one)
            put("lua_prims", "%s_%s" % (name, "emu" if dev else "host"), bytes(h) + bytes(x & 0xff for x in prog))

    total = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(OUT) for f in fs)
    print("tests/fuzz/make_corpus.py: %d files, %d bytes" % (sum(len(fs) for _, _, fs in os.walk(OUT)), total))


if __name__ == "__main__":
    main()
