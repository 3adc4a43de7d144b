#!/usr/bin/env python3
"""Build tiny random-initialised Hugging Face models and dump reference logits.

kvsieve's end-to-end parity tests compare the C engine against HF transformers on
small models of every supported architecture (llama, mistral, qwen2, phi3).  This
script makes those fixtures.  It needs torch, transformers (written against 5.x),
safetensors; it never touches the network.

    python3 tools/hf_fixtures.py --out DIR            # all cases, plus DIR/fixtures.tar.gz
    python3 tools/hf_fixtures.py --out DIR --only llama_gqa_f32,phi3_longrope
    python3 tools/hf_fixtures.py --list

For every case DIR/<case>/ holds what `save_pretrained` wrote (config.json,
model.safetensors or shards + model.safetensors.index.json, generation_config.json),
optionally config.v4.json (the same config in the transformers-4 layout, verified
to load to identical logits), and logits.json (reference numbers, format in
tools/README.md).  DIR/manifest.json lists the cases and the sha256 of every file.
DIR/fixtures.tar.gz holds all of it (not written when any check failed), so that
one file can carry the fixtures off the GPU machine:
    tar -xzf fixtures.tar.gz -C tests/fixtures/hf

All reference numbers come from the saved folder loaded back with
from_pretrained(dtype=float32, attn_implementation="eager") and run on the CPU
(--device to change), so they describe exactly the files on disk.  Greedy
continuations are HF generate()'s; each step is re-checked against a plain KV-cached
forward loop and a full recompute.  Any inconsistency (reload mismatch, generate()
disagreeing with those where no disagreement is expected, all-zero tensors, missing
tensors, wrong dtype on disk...) makes the script exit non-zero.

On the GPU machine, `--tar-only` leaves just fixtures.tar.gz and summary.txt in --out.
"""

import argparse
import copy
import gzip
import hashlib
import inspect
import io
import json
import math
import os
import platform
import shutil
import struct
import sys
import tarfile
import tempfile
import traceback

FIXTURE_VERSION = 1
GENERATOR = "tools/hf_fixtures.py"
REGENERATE = "python3 tools/hf_fixtures.py --out DIR on a machine with torch+transformers"
VOCAB = 256
N_NEW = 8            # greedy tokens generated per prompt
TOPK = 8             # (id, logit) pairs kept per decode step
MIN_MARGIN = 0.01    # wanted gap between the best and second-best logit at every greedy step
MAX_PROMPT_TRIES = 40
RELOAD_TOL = 1e-6    # in-memory model vs. model loaded back from disk (same weights, same code)
CACHE_TOL = 1e-4     # KV-cached decode vs. full recompute, and generate() vs. manual loop
SIZE_BUDGET = 3_000_000

# --------------------------------------------------------------------------------------
# The cases.  Dimensions are tiny on purpose: the whole output stays under ~3 MB.
# --------------------------------------------------------------------------------------

LONGROPE_SHORT = [1.0, 1.05, 1.15, 1.3, 1.5, 1.8, 2.2, 2.7]
LONGROPE_LONG = [1.0, 1.25, 1.7, 2.4, 3.4, 4.8, 6.5, 9.0]

CASES = [
    dict(name="llama_gqa_f32", arch="llama",
         desc="llama, GQA 8 heads / 2 kv heads, head_dim 8 = hidden/heads, untied, float32",
         hidden=64, layers=2, heads=8, kv_heads=2, head_dim=None, inter=96,
         tied=False, theta=10000.0, rope=None, eps=1e-5, max_pos=512,
         dtype="float32", shard=None, prompt_lens=[1, 7, 48]),
    dict(name="llama3_scaling_f32", arch="llama",
         desc="llama, rope_type llama3 (factor 8, low 1, high 4, original_max 64), theta 5e5, "
              "tied embeddings, GQA 4:1, head_dim 16, float32",
         hidden=64, layers=2, heads=4, kv_heads=1, head_dim=None, inter=64,
         tied=True, theta=500000.0,
         rope=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                   original_max_position_embeddings=64),
         eps=1e-5, max_pos=512, dtype="float32", shard=None, prompt_lens=[1, 7, 96]),
    dict(name="llama_bf16", arch="llama",
         desc="llama with bfloat16 weights on disk; reference = those weights upcast to float32, "
              "computed in float32",
         hidden=64, layers=2, heads=4, kv_heads=2, head_dim=None, inter=96,
         tied=False, theta=10000.0, rope=None, eps=1e-5, max_pos=512,
         dtype="bfloat16", shard=None, prompt_lens=[1, 7, 48]),
    dict(name="llama_sharded", arch="llama",
         desc="llama float32 saved with max_shard_size 100KB: >= 3 shards + model.safetensors.index.json",
         hidden=64, layers=2, heads=4, kv_heads=2, head_dim=None, inter=48,
         tied=False, theta=10000.0, rope=None, eps=1e-6, max_pos=512,
         dtype="float32", shard="100KB", prompt_lens=[1, 7, 48]),
    dict(name="mistral_headdim", arch="mistral",
         desc="mistral with explicit head_dim 32 != hidden/heads (64/4), GQA 4:1, sliding_window null",
         hidden=64, layers=2, heads=4, kv_heads=1, head_dim=32, inter=48,
         tied=False, theta=1000000.0, rope=None, eps=1e-5, max_pos=512, sliding=None,
         dtype="float32", shard=None, prompt_lens=[1, 7, 48]),
    dict(name="mistral_sliding", arch="mistral",
         desc="mistral with sliding_window 16; prompts longer than the window and one that crosses "
              "it while decoding",
         hidden=32, layers=2, heads=4, kv_heads=2, head_dim=None, inter=64,
         tied=False, theta=10000.0, rope=None, eps=1e-5, max_pos=512, sliding=16,
         dtype="float32", shard=None, prompt_lens=[1, 7, 13, 40]),
    dict(name="qwen2_bias", arch="qwen2",
         desc="qwen2: q/k/v biases (no o_proj bias), tied embeddings, GQA 2:1, theta 1e6",
         hidden=64, layers=2, heads=4, kv_heads=2, head_dim=None, inter=64,
         tied=True, theta=1000000.0, rope=None, eps=1e-6, max_pos=512,
         dtype="float32", shard=None, prompt_lens=[1, 7, 48]),
    dict(name="phi3_longrope", arch="phi3",
         desc="phi3: fused qkv_proj / gate_up_proj, GQA 3:1, rope_type longrope (8 short + 8 long "
              "factors), original_max_position_embeddings 32, max_position_embeddings 256",
         hidden=48, layers=2, heads=3, kv_heads=1, head_dim=None, inter=64,
         tied=False, theta=10000.0,
         rope=dict(rope_type="longrope", short_factor=LONGROPE_SHORT, long_factor=LONGROPE_LONG),
         original_max=32, eps=1e-5, max_pos=256,
         dtype="float32", shard=None, prompt_lens=[1, 7, 30, 60]),
    dict(name="phi3_plain", arch="phi3",
         desc="phi3: fused qkv_proj / gate_up_proj, MHA, plain RoPE (no scaling), partial_rotary_factor 1",
         hidden=48, layers=2, heads=3, kv_heads=3, head_dim=None, inter=64,
         tied=False, theta=10000.0, rope=None, original_max=256, eps=1e-5, max_pos=256,
         dtype="float32", shard=None, prompt_lens=[1, 7, 48]),
]

ARCH_CLASSES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "mistral": ("MistralConfig", "MistralForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "phi3": ("Phi3Config", "Phi3ForCausalLM"),
}


class CaseFailure(Exception):
    pass


# --------------------------------------------------------------------------------------
# Small helpers
# --------------------------------------------------------------------------------------

def require(cond, msg):
    if not cond:
        raise CaseFailure(msg)


def f32list(t):
    """float32 tensor -> list of Python floats that print with <= 9 significant digits and
    read back (strtof) to exactly the same float32."""
    out = []
    for v in t.detach().to("cpu").float().reshape(-1).tolist():
        if not math.isfinite(v):
            raise CaseFailure("non-finite value in reference logits")
        out.append(float("%.9g" % v))
    return out


def _scalar_json(x):
    if isinstance(x, bool):
        return "true" if x else "false"
    if x is None:
        return "null"
    if isinstance(x, float):
        if not math.isfinite(x):
            raise ValueError("non-finite float in JSON output")
        return repr(x)
    if isinstance(x, int):
        return str(x)
    return json.dumps(x)


def dump_json(obj, level=0):
    """JSON with one line per scalar list (keeps logits vectors compact, diffs readable)."""
    pad = " " * level
    pad1 = " " * (level + 1)
    if isinstance(obj, dict):
        if not obj:
            return "{}"
        items = [pad1 + json.dumps(str(k)) + ": " + dump_json(v, level + 1) for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(obj, (list, tuple)):
        if all(not isinstance(v, (dict, list, tuple)) for v in obj):
            return "[" + ",".join(_scalar_json(v) for v in obj) + "]"
        return "[\n" + ",\n".join(pad1 + dump_json(v, level + 1) for v in obj) + "\n" + pad + "]"
    return _scalar_json(obj)


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 16), b""):
            h.update(chunk)
    return h.hexdigest()


def read_safetensors_header(path):
    """Parse a safetensors header ourselves (8-byte little-endian length + JSON)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n).decode("utf-8"))
    hdr.pop("__metadata__", None)
    return hdr


def version_tuple(s):
    parts = []
    for p in s.split("+")[0].split("."):
        num = ""
        for ch in p:
            if ch.isdigit():
                num += ch
            else:
                break
        parts.append(int(num) if num else 0)
    while len(parts) < 3:
        parts.append(0)
    return tuple(parts[:3])


# --------------------------------------------------------------------------------------
# Model construction
# --------------------------------------------------------------------------------------

class Env:
    def __init__(self, torch, transformers, device):
        self.torch = torch
        self.T = transformers
        self.device = torch.device(device)
        self.tf_version = transformers.__version__
        self.v5 = version_tuple(self.tf_version) >= (5, 0, 0)
        self.dtype_kw = "dtype" if version_tuple(self.tf_version) >= (4, 56, 0) else "torch_dtype"


def build_config(env, spec, layers=None):
    arch = spec["arch"]
    cfg_name, _ = ARCH_CLASSES[arch]
    kw = dict(
        vocab_size=VOCAB,
        hidden_size=spec["hidden"],
        intermediate_size=spec["inter"],
        num_hidden_layers=layers if layers is not None else spec["layers"],
        num_attention_heads=spec["heads"],
        num_key_value_heads=spec["kv_heads"],
        hidden_act="silu",
        max_position_embeddings=spec["max_pos"],
        rms_norm_eps=float(spec["eps"]),
        tie_word_embeddings=bool(spec["tied"]),
        use_cache=True,
        bos_token_id=None,
        eos_token_id=None,   # no EOS: generate() always produces N_NEW tokens
        pad_token_id=None,
        attn_implementation="eager",
    )
    rope = dict(spec["rope"]) if spec["rope"] else {"rope_type": "default"}
    if env.v5:
        rp = {"rope_type": rope["rope_type"], "rope_theta": float(spec["theta"])}
        rp.update({k: v for k, v in rope.items() if k != "rope_type"})
        kw["rope_parameters"] = rp
    else:  # transformers 4.x layout
        kw["rope_theta"] = float(spec["theta"])
        if rope["rope_type"] == "default":
            kw["rope_scaling"] = None
        elif arch == "phi3":
            kw["rope_scaling"] = {"type": rope["rope_type"], "short_factor": rope["short_factor"],
                                  "long_factor": rope["long_factor"]}
        else:
            kw["rope_scaling"] = dict(rope)
    if arch == "llama":
        kw.update(attention_bias=False, mlp_bias=False)
        if spec["head_dim"] is not None:
            kw["head_dim"] = spec["head_dim"]
    elif arch == "mistral":
        kw["sliding_window"] = spec.get("sliding")
        if spec["head_dim"] is not None:
            kw["head_dim"] = spec["head_dim"]
    elif arch == "qwen2":
        kw.update(use_sliding_window=False, sliding_window=None)
    elif arch == "phi3":
        kw.update(original_max_position_embeddings=int(spec["original_max"]), resid_pdrop=0.0,
                  embd_pdrop=0.0, attention_dropout=0.0, sliding_window=None)
    cls = getattr(env.T, cfg_name)
    try:
        return cls(**kw)
    except TypeError:
        # a config class that refuses the attn_implementation kwarg: set it afterwards
        kw.pop("attn_implementation")
        cfg = cls(**kw)
        cfg._attn_implementation = "eager"
        return cfg


def model_class(env, spec):
    return getattr(env.T, ARCH_CLASSES[spec["arch"]][1])


def ensure_eager(model):
    cur = getattr(model.config, "_attn_implementation", None)
    if cur != "eager":
        if hasattr(model, "set_attn_implementation"):
            model.set_attn_implementation("eager")
        else:
            model.config._attn_implementation = "eager"
    cur = getattr(model.config, "_attn_implementation", None)
    require(cur == "eager", "could not select eager attention (got %r)" % (cur,))


def reinit(env, model, seed, hidden):
    """Every parameter random, none all-zero, norms 1 +- noise, biases non-zero.  A private
    generator keeps the weights independent of how many draws HF's own init made."""
    torch = env.torch
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():  # tied parameters are listed once
            shape = tuple(p.shape)
            r = torch.randn(shape, generator=gen, dtype=torch.float32)
            if name.endswith(".bias"):
                vals = 0.2 * r
            elif p.dim() == 1:                                   # RMSNorm weights
                vals = 1.0 + 0.2 * r
            elif "embed_tokens" in name or name.startswith("lm_head"):
                vals = r * (2.0 / math.sqrt(hidden))             # logits ~ N(0, 2^2)
            else:
                vals = r / math.sqrt(shape[1])                   # unit-scale activations
            p.copy_(vals.to(p.dtype))


def save_model(model, path, max_shard_size):
    kw = {}
    params = inspect.signature(model.save_pretrained).parameters
    if "safe_serialization" in params:          # removed in transformers 5 (always safetensors)
        kw["safe_serialization"] = True
    if max_shard_size:
        kw["max_shard_size"] = max_shard_size
    model.save_pretrained(path, **kw)


def load_model(env, spec, path):
    cls = model_class(env, spec)
    kw = {env.dtype_kw: env.torch.float32, "attn_implementation": "eager", "output_loading_info": True}
    res = cls.from_pretrained(path, **kw)
    model, info = res if isinstance(res, tuple) else (res, {})
    for key in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        vals = info.get(key) if isinstance(info, dict) else getattr(info, key, None)
        vals = list(vals or [])
        if key == "missing_keys" and spec["tied"]:
            vals = [v for v in vals if v != "lm_head.weight"]   # tied: rebuilt from embed_tokens
        vals = [v for v in vals if "rotary_emb" not in str(v)]
        require(not vals, "from_pretrained(%s) reported %s: %s" % (os.path.basename(path), key, vals))
    model.eval()
    ensure_eager(model)
    for n, p in model.named_parameters():
        require(p.dtype == env.torch.float32, "reloaded parameter %s has dtype %s, wanted float32" % (n, p.dtype))
    return model.to(env.device)


# --------------------------------------------------------------------------------------
# Runs
# --------------------------------------------------------------------------------------

def ids_tensor(env, ids):
    return env.torch.tensor([list(ids)], dtype=env.torch.long, device=env.device)


def forward_last(env, model, ids):
    out = model(input_ids=ids_tensor(env, ids), use_cache=False)
    return out.logits[0, -1].float().cpu()


def forward_all(env, model, ids):
    out = model(input_ids=ids_tensor(env, ids), use_cache=False)
    return out.logits[0].float().cpu()


def margin(v):
    top = v.topk(2).values.tolist()
    return float(top[0] - top[1])


def topk_pairs(v, k):
    vals, idx = v.topk(k)
    return [[int(i), float("%.9g" % x)] for i, x in zip(idx.tolist(), vals.tolist())]


def cached_loop(env, model, ids, forced):
    """Plain model forward with a KV cache, one token per call, explicit position ids, fed the
    given tokens (teacher forcing).  Returns N_NEW logits: [s] = logits after the prompt plus
    forced[:s] (step 0 = prefill)."""
    torch = env.torch
    out = model(input_ids=ids_tensor(env, ids), use_cache=True)
    past = out.past_key_values
    logits = [out.logits[0, -1].float().cpu()]
    pos = len(ids)
    for s in range(N_NEW - 1):
        out = model(input_ids=ids_tensor(env, [forced[s]]), past_key_values=past, use_cache=True,
                    position_ids=torch.tensor([[pos]], dtype=torch.long, device=env.device))
        past = out.past_key_values
        pos += 1
        logits.append(out.logits[0, -1].float().cpu())
    return logits


def greedy_generate(env, model, ids):
    """HF generate(), greedy, default (KV) cache.  Returns the N_NEW new ids and the N_NEW raw
    logits vectors: [s] = logits after the prompt plus ids[:s] (step 0 = prefill)."""
    torch = env.torch
    inp = ids_tensor(env, ids)
    g = model.generate(input_ids=inp, attention_mask=torch.ones_like(inp), max_new_tokens=N_NEW,
                       do_sample=False, num_beams=1, return_dict_in_generate=True,
                       output_logits=True, pad_token_id=0)
    seq = g.sequences[0, len(ids):].tolist()
    require(len(seq) == N_NEW, "generate produced %d tokens, wanted %d" % (len(seq), N_NEW))
    glog = getattr(g, "logits", None)
    require(glog is not None and len(glog) == N_NEW, "generate(output_logits=True) returned no per-step logits")
    logits = [x[0].float().cpu() for x in glog]
    for s in range(N_NEW):
        require(int(logits[s].argmax()) == seq[s], "generate: id %d at step %d is not the argmax of its logits" % (seq[s], s))
    return seq, logits


def longrope_switch_steps(spec, prompt_len):
    """Decode steps s >= 1 at which the sequence length prompt_len + s has just gone past
    original_max_position_embeddings while the prefill (length prompt_len) was at or below it.
    A forward call uses long factors iff max(position)+1 > original_max, and a plain KV cache
    keeps the keys it rotated with short factors, so there a plain cached loop, a full recompute
    and generate() (which may drop its cache at the switch) can legitimately disagree."""
    if not spec["rope"] or spec["rope"]["rope_type"] != "longrope":
        return []
    om = spec["original_max"]
    return [s for s in range(1, N_NEW) if prompt_len <= om < prompt_len + s]


# --------------------------------------------------------------------------------------
# RoPE bookkeeping: what HF computed, and an independent re-derivation
# --------------------------------------------------------------------------------------

def rope_dim(spec):
    hd = spec["head_dim"] or spec["hidden"] // spec["heads"]
    return hd


def independent_inv_freq(spec, long=False):
    d = rope_dim(spec)
    theta = spec["theta"]
    base = [theta ** (-(2.0 * i) / d) for i in range(d // 2)]
    rope = spec["rope"]
    if not rope:
        return base, 1.0
    if rope["rope_type"] == "llama3":
        f, lo, hi, om = (rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"],
                         rope["original_max_position_embeddings"])
        lo_wl, hi_wl = om / lo, om / hi
        out = []
        for inv in base:
            wl = 2 * math.pi / inv
            if wl < hi_wl:
                out.append(inv)
            elif wl > lo_wl:
                out.append(inv / f)
            else:
                sm = (om / wl - lo) / (hi - lo)
                out.append((1 - sm) * inv / f + sm * inv)
        return out, 1.0
    if rope["rope_type"] == "longrope":
        fac = rope["long_factor"] if long else rope["short_factor"]
        out = [inv / fac[i] for i, inv in enumerate(base)]
        scale = spec["max_pos"] / spec["original_max"]
        att = 1.0 if scale <= 1.0 else math.sqrt(1 + math.log(scale) / math.log(spec["original_max"]))
        return out, att
    raise CaseFailure("unknown rope type %r" % rope["rope_type"])


def rope_info(env, model, spec, warnings):
    torch = env.torch
    info = {"rope_type": spec["rope"]["rope_type"] if spec["rope"] else "default",
            "rope_theta": spec["theta"], "rotary_dim": rope_dim(spec)}
    mod = None
    for m in model.modules():
        if type(m).__name__.endswith("RotaryEmbedding"):
            mod = m
            break
    if mod is None:
        warnings.append("no *RotaryEmbedding module found; rope info not recorded")
        return info
    inv = getattr(mod, "original_inv_freq", None)
    if inv is None:
        inv = getattr(mod, "inv_freq", None)
    if inv is not None:
        info["inv_freq"] = [float(x) for x in inv.float().cpu().tolist()]
    att = getattr(mod, "attention_scaling", None)
    info["attention_scaling"] = float(att) if att is not None else None
    if info["rope_type"] == "longrope":
        try:
            from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
            lf, _ = ROPE_INIT_FUNCTIONS["longrope"](model.config, torch.device("cpu"),
                                                     seq_len=spec["original_max"] + 1)
            info["inv_freq_long"] = [float(x) for x in lf.float().cpu().tolist()]
        except Exception as e:  # diagnostic only
            warnings.append("could not compute HF longrope long inv_freq: %r" % (e,))
    # Independent check of our reading of HF's formulas (a warning, not a failure: HF is the
    # reference whatever it does; the warning tells the C side to look closer).
    exp, exp_att = independent_inv_freq(spec)
    worst = 0.0
    if "inv_freq" in info:
        worst = max(abs(a - b) / abs(b) for a, b in zip(info["inv_freq"], exp))
    if "inv_freq_long" in info:
        exp_l, _ = independent_inv_freq(spec, long=True)
        worst = max(worst, max(abs(a - b) / abs(b) for a, b in zip(info["inv_freq_long"], exp_l)))
    info["independent_formula_max_rel_err"] = worst
    ok = worst < 1e-5
    if info["attention_scaling"] is not None:
        ok = ok and abs(info["attention_scaling"] - exp_att) < 1e-6
    info["independent_formula_agrees"] = ok
    info["independent_attention_scaling"] = exp_att
    if not ok:
        warnings.append("HF RoPE frequencies/attention scaling differ from the documented formula "
                        "(max rel err %.3g, HF scaling %r, formula %r)" % (worst, info["attention_scaling"], exp_att))
    return info


def attention_scales(model):
    vals = []
    for m in model.modules():
        if type(m).__name__.endswith("Attention") and hasattr(m, "scaling"):
            vals.append(float(m.scaling))
    return sorted(set(vals))


# --------------------------------------------------------------------------------------
# Disk checks
# --------------------------------------------------------------------------------------

def weight_files(case_dir):
    idx = os.path.join(case_dir, "model.safetensors.index.json")
    if os.path.exists(idx):
        with open(idx) as f:
            wm = json.load(f)["weight_map"]
        return sorted(set(wm.values())), wm
    single = os.path.join(case_dir, "model.safetensors")
    require(os.path.exists(single), "no model.safetensors nor index in %s" % case_dir)
    return ["model.safetensors"], None


def check_disk(env, spec, case_dir, ref_model):
    from safetensors.torch import load_file
    torch = env.torch
    files, wmap = weight_files(case_dir)
    want = "BF16" if spec["dtype"] == "bfloat16" else "F32"
    tensors = {}
    on_disk = {}
    for fn in files:
        hdr = read_safetensors_header(os.path.join(case_dir, fn))
        data = load_file(os.path.join(case_dir, fn))
        for name, meta in sorted(hdr.items()):
            require(meta["dtype"] == want, "%s: %s stored as %s, wanted %s" % (fn, name, meta["dtype"], want))
            require(name not in tensors, "tensor %s stored twice" % name)
            if wmap is not None:
                require(wmap.get(name) == fn, "index says %s is in %r, found in %s" % (name, wmap.get(name), fn))
            tensors[name] = {"dtype": meta["dtype"], "shape": list(meta["shape"]), "file": fn}
            t = data[name].float()
            require(bool((t != 0).any()), "tensor %s is all zeros" % name)
            if t.dim() == 1 and name.endswith("norm.weight"):
                require(not bool((t == 1).all()), "norm %s is all ones" % name)
            on_disk[name] = t
    if wmap is not None:
        require(set(wmap) == set(tensors), "index weight_map does not match the shards' contents")
    sd = {k: v.float().cpu() for k, v in ref_model.state_dict().items()}
    for name, t in on_disk.items():
        require(name in sd, "tensor %s on disk is not a parameter of the loaded model" % name)
        require(torch.equal(sd[name], t), "tensor %s on disk differs from the loaded model" % name)
    missing = sorted(k for k in set(sd) - set(on_disk) if "rotary_emb" not in k)
    allowed = {"lm_head.weight"} if spec["tied"] else set()
    require(set(missing) <= allowed, "parameters not stored on disk: %s" % missing)
    if spec["tied"]:
        emb = ref_model.get_input_embeddings().weight
        head = ref_model.get_output_embeddings().weight
        require(torch.equal(emb.float().cpu(), head.float().cpu()), "tied model: lm_head != embed_tokens after load")
    # Expected names of the layouts the C loader reads.
    need = ["model.embed_tokens.weight", "model.norm.weight",
            "model.layers.0.input_layernorm.weight", "model.layers.0.post_attention_layernorm.weight",
            "model.layers.0.self_attn.o_proj.weight", "model.layers.0.mlp.down_proj.weight"]
    if spec["arch"] == "phi3":
        need += ["model.layers.0.self_attn.qkv_proj.weight", "model.layers.0.mlp.gate_up_proj.weight"]
    else:
        need += ["model.layers.0.self_attn.%s_proj.weight" % x for x in "qkv"]
        need += ["model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight"]
    if spec["arch"] == "qwen2":
        need += ["model.layers.0.self_attn.%s_proj.bias" % x for x in "qkv"]
        require("model.layers.0.self_attn.o_proj.bias" not in tensors, "qwen2: unexpected o_proj bias")
    if not spec["tied"]:
        need.append("lm_head.weight")
    for n in need:
        require(n in tensors, "expected tensor %s not on disk" % n)
    n_layers = spec["layers"]
    require(not any(k.startswith("model.layers.%d." % n_layers) for k in tensors), "more layers on disk than configured")
    hd = spec["head_dim"] or spec["hidden"] // spec["heads"]
    if spec["arch"] == "phi3":
        want_shape = [(spec["heads"] + 2 * spec["kv_heads"]) * hd, spec["hidden"]]
        require(tensors["model.layers.0.self_attn.qkv_proj.weight"]["shape"] == want_shape, "phi3 qkv_proj shape")
    else:
        require(tensors["model.layers.0.self_attn.q_proj.weight"]["shape"] == [spec["heads"] * hd, spec["hidden"]],
                "q_proj shape")
        require(tensors["model.layers.0.self_attn.k_proj.weight"]["shape"] == [spec["kv_heads"] * hd, spec["hidden"]],
                "k_proj shape")
    return files, tensors


def v4_style_config(cfg, arch):
    """The same model described the way transformers 4.x (and most Hub checkpoints) write it:
    rope_theta at top level, scaling under rope_scaling, torch_dtype instead of dtype."""
    v4 = {k: v for k, v in cfg.items() if k != "rope_parameters"}
    if "dtype" in v4:
        v4["torch_dtype"] = v4.pop("dtype")
    rp = cfg.get("rope_parameters")
    if isinstance(rp, dict):
        v4["rope_theta"] = rp.get("rope_theta", v4.get("rope_theta"))
        rt = rp.get("rope_type", rp.get("type", "default"))
        if rt == "default":
            v4["rope_scaling"] = None
        elif arch == "phi3":
            v4["rope_scaling"] = {"type": rt, "short_factor": rp["short_factor"], "long_factor": rp["long_factor"]}
            if "original_max_position_embeddings" in rp:
                v4["original_max_position_embeddings"] = rp["original_max_position_embeddings"]
        else:
            v4["rope_scaling"] = {k: v for k, v in rp.items() if k not in ("rope_theta", "partial_rotary_factor")}
        prf = rp.get("partial_rotary_factor")
        if prf is not None and float(prf) != 1.0:
            v4["partial_rotary_factor"] = prf
    v4.pop("transformers_version", None)
    return v4


# --------------------------------------------------------------------------------------
# Sliding-window probe: which keys does the last query of a 1-layer model depend on?
# --------------------------------------------------------------------------------------

def sliding_probe(env, spec, seed):
    torch = env.torch
    cfg = build_config(env, spec, layers=1)
    m = model_class(env, spec)(cfg)
    m.eval()
    ensure_eager(m)
    reinit(env, m, seed, spec["hidden"])
    m = m.to(env.device)
    n = 40
    gen = torch.Generator().manual_seed(seed + 7)
    ids = torch.randint(0, VOCAB, (n,), generator=gen).tolist()
    base = forward_all(env, m, ids)
    queries = [n // 2, n - 1]
    attended = {q: [q] for q in queries}
    for j in range(n - 1):
        ids2 = list(ids)
        ids2[j] = (ids2[j] + 1) % VOCAB
        out = forward_all(env, m, ids2)
        for q in queries:
            if j < q and float((out[q] - base[q]).abs().max()) > 0.0:
                attended[q].append(j)
    res = []
    w = spec["sliding"]
    for q in queries:
        a = sorted(attended[q])
        res.append({"query_pos": q, "first_key_pos": a[0], "last_key_pos": a[-1], "n_keys": len(a),
                    "contiguous": a == list(range(a[0], a[-1] + 1)),
                    "matches_rule_kv_gt_q_minus_w": a == list(range(max(0, q - w + 1), q + 1))})
    return res


# --------------------------------------------------------------------------------------
# One case
# --------------------------------------------------------------------------------------

def run_case(env, idx, spec, out_root):
    torch = env.torch
    name = spec["name"]
    seed = 1234 + idx
    warnings = []
    notes = []
    case_dir = os.path.join(out_root, name)
    if os.path.exists(case_dir):
        shutil.rmtree(case_dir)

    # 1. build, randomise, save
    torch.manual_seed(seed)
    cfg = build_config(env, spec)
    model = model_class(env, spec)(cfg)
    model.eval()
    ensure_eager(model)
    shared = lambda: model.get_input_embeddings().weight.data_ptr() == model.get_output_embeddings().weight.data_ptr()
    if spec["tied"] and not shared() and hasattr(model, "tie_weights"):
        model.tie_weights()
    reinit(env, model, seed, spec["hidden"])
    if spec["tied"]:
        require(model.get_input_embeddings().weight.data_ptr() == model.get_output_embeddings().weight.data_ptr(),
                "tie_word_embeddings=True but lm_head is not tied to embed_tokens")
    else:
        require(model.get_input_embeddings().weight.data_ptr() != model.get_output_embeddings().weight.data_ptr(),
                "tie_word_embeddings=False but lm_head shares embed_tokens")
    if spec["dtype"] == "bfloat16":
        model = model.to(torch.bfloat16)
    save_model(model, case_dir, spec["shard"])
    with open(os.path.join(case_dir, "config.json")) as f:
        saved_cfg = json.load(f)
    print("---- %s: config.json as saved by transformers %s" % (name, env.tf_version))
    print(json.dumps(saved_cfg, indent=1, sort_keys=True))
    require(saved_cfg.get("model_type") == spec["arch"], "config.json model_type %r" % saved_cfg.get("model_type"))
    require(saved_cfg.get("architectures") == [ARCH_CLASSES[spec["arch"]][1]],
            "config.json architectures %r" % saved_cfg.get("architectures"))

    # 2. load back: this is the reference model
    ref = load_model(env, spec, case_dir)
    files, tensors = check_disk(env, spec, case_dir, ref)
    if spec["shard"]:
        require(len(files) >= 3, "wanted >= 3 shards, got %d" % len(files))
    if spec["dtype"] == "bfloat16":
        # model.to(bfloat16) also rounded the non-persistent RoPE buffers (inv_freq), which a
        # float32 load recomputes; so compare against a fresh float32 model holding the same
        # bf16-rounded weights rather than against the cast-back in-memory one.
        torch.manual_seed(seed)
        orig = model_class(env, spec)(build_config(env, spec))
        ensure_eager(orig)
        sd16 = {k: v.float() for k, v in model.state_dict().items()}
        orig.load_state_dict(sd16, strict=True)
    else:
        orig = model
    orig = orig.to(env.device)
    orig.eval()
    osd = {k: v.float().cpu() for k, v in orig.state_dict().items()}
    for k, v in ref.state_dict().items():
        require(k in osd and torch.equal(osd[k], v.float().cpu()), "reloaded %s differs from the saved model" % k)

    rope = rope_info(env, ref, spec, warnings)   # before any forward (longrope swaps buffers)
    scales = attention_scales(ref)
    hd = spec["head_dim"] or spec["hidden"] // spec["heads"]
    require(len(scales) == 1 and abs(scales[0] - hd ** -0.5) < 1e-7,
            "attention softmax scale %r, wanted head_dim**-0.5 = %r" % (scales, hd ** -0.5))

    # 3. prompts (chosen so every greedy step has a clear winner) and the greedy runs.
    #    The reference is generate(); a plain cached loop and a full recompute check it.
    pgen = torch.Generator().manual_seed(4321 + idx)
    prompts, runs = [], []
    for L in spec["prompt_lens"]:
        best = None
        for _ in range(MAX_PROMPT_TRIES):
            ids = torch.randint(0, VOCAB, (L,), generator=pgen).tolist()
            toks, logits = greedy_generate(env, ref, ids)
            mm = min(margin(v) for v in logits)
            if best is None or mm > best[0]:
                best = (mm, ids, toks, logits)
            if mm >= MIN_MARGIN:
                break
        if best[0] < MIN_MARGIN:
            warnings.append("prompt of length %d: smallest greedy margin only %.3g" % (L, best[0]))
        prompts.append(best[1])
        runs.append((best[2], best[3]))

    checks = {"reload_max_abs_diff": [], "plain_cache_step_max_abs_diff": [],
              "nocache_step_max_abs_diff": [], "f64_max_abs_diff": [], "min_greedy_margin": [],
              "longrope_switch_steps": []}
    greedy, greedy_top, greedy_margin, last_logits, last_top = [], [], [], [], []
    switch_vs_recompute, switch_vs_plain = [], []
    m64 = copy.deepcopy(ref).to(torch.float64)
    m64.eval()
    for pi, ids in enumerate(prompts):
        toks, logits = runs[pi]
        switch = longrope_switch_steps(spec, len(ids))
        checks["longrope_switch_steps"].append(switch)
        # a plain KV-cached forward loop fed the same tokens
        plain = cached_loop(env, ref, ids, toks)
        # a full recompute (no cache) of every step
        full = [forward_last(env, ref, ids + toks[:s]) for s in range(N_NEW)]
        dp = [float((a - b).abs().max()) for a, b in zip(plain, logits)]
        dn = [float((a - b).abs().max()) for a, b in zip(full, logits)]
        checks["plain_cache_step_max_abs_diff"].append(dp)
        checks["nocache_step_max_abs_diff"].append(dn)
        for s in range(N_NEW):
            if s in switch:
                switch_vs_recompute.append(dn[s] <= CACHE_TOL)
                switch_vs_plain.append(dp[s] <= CACHE_TOL)
                continue
            require(dp[s] <= CACHE_TOL, "prompt %d step %d: generate() and a plain KV-cache loop differ by %.3g"
                    % (pi, s, dp[s]))
            require(dn[s] <= CACHE_TOL, "prompt %d step %d: generate() and a full recompute differ by %.3g"
                    % (pi, s, dn[s]))
        # the in-memory model and the reloaded one must agree exactly
        d_reload = float((forward_last(env, orig, ids) - forward_last(env, ref, ids)).abs().max())
        require(d_reload <= RELOAD_TOL, "prompt %d: reloaded model differs from in-memory model by %.3g" % (pi, d_reload))
        checks["reload_max_abs_diff"].append(d_reload)
        # rounding-noise scale: the same model cast to float64
        l64 = m64(input_ids=ids_tensor(env, ids), use_cache=False).logits[0, -1].double().cpu()
        checks["f64_max_abs_diff"].append(float((l64 - logits[0].double()).abs().max()))

        margins = [margin(v) for v in logits]
        checks["min_greedy_margin"].append(min(margins))
        greedy.append(toks)
        greedy_margin.append([float("%.6g" % x) for x in margins])
        last_logits.append(f32list(logits[0]))
        steps = [topk_pairs(v, TOPK) for v in logits]
        greedy_top.append(steps)
        last_top.append(steps[0])
    if switch_vs_recompute:
        checks["generate_matches_recompute_after_longrope_switch"] = all(switch_vs_recompute)
        checks["generate_matches_plain_cache_after_longrope_switch"] = all(switch_vs_plain)
        if not (all(switch_vs_recompute) or all(switch_vs_plain)):
            # transformers 5.17 does something else again; keep the prefill logits (which are exact)
            # and tell the C side not to compare greedy steps past the switch
            warnings.append("after the longrope switch generate() matches neither a full recompute nor a plain "
                            "KV cache; compare greedy only for prompts that never cross original_max")
            checks["greedy_past_longrope_switch_comparable"] = False
        elif all(switch_vs_recompute):
            notes.append("longrope switch in generate(): when prompt+generated first exceeds original_max, HF "
                         "generate() drops its KV cache and recomputes the whole sequence with long factors, so "
                         "greedy/greedy_top equal a full recompute at every step (checks.nocache_step_max_abs_diff); "
                         "a plain KV cache that keeps short-rotated keys differs there "
                         "(checks.plain_cache_step_max_abs_diff at checks.longrope_switch_steps).")
        else:
            notes.append("longrope switch in generate(): HF generate() kept its KV cache (short-rotated keys) "
                         "after the sequence exceeded original_max; greedy/greedy_top equal the plain KV-cache "
                         "loop, not a full recompute, at checks.longrope_switch_steps.")

    all_idx = 1 if len(prompts) > 1 else 0
    all_logits_t = forward_all(env, ref, prompts[all_idx])
    require(float((all_logits_t[-1] - runs[all_idx][1][0]).abs().max()) <= CACHE_TOL,
            "all-position logits disagree with the prefill's last row")
    all_logits = [f32list(row) for row in all_logits_t]

    # 4. the transformers-4 style config must describe the same model
    v4_written = False
    try:
        v4 = v4_style_config(saved_cfg, spec["arch"])
        with tempfile.TemporaryDirectory() as td:
            for fn in os.listdir(case_dir):
                if fn != "config.json":
                    shutil.copy(os.path.join(case_dir, fn), os.path.join(td, fn))
            with open(os.path.join(td, "config.json"), "w") as f:
                json.dump(v4, f, indent=2)
            m4 = load_model(env, spec, td)
            d4 = max(float((forward_last(env, m4, ids) - forward_last(env, ref, ids)).abs().max()) for ids in prompts)
        if d4 <= RELOAD_TOL:
            with open(os.path.join(case_dir, "config.v4.json"), "w") as f:
                f.write(json.dumps(v4, indent=2, sort_keys=True) + "\n")
            v4_written = True
        else:
            warnings.append("config.v4.json not written: it loads to logits differing by %.3g" % d4)
    except Exception as e:
        warnings.append("config.v4.json not written: %r" % (e,))
    checks["config_v4_verified"] = v4_written

    probe = None
    if spec["arch"] == "mistral" and spec.get("sliding"):
        probe = sliding_probe(env, spec, seed + 100)
        if all(p["matches_rule_kv_gt_q_minus_w"] for p in probe):
            notes.append("sliding window W: a query at position q attends keys kv with q-W < kv <= q (W keys, "
                         "itself included); verified by sliding_window_probe on a 1-layer copy")
        else:
            warnings.append("sliding window probe does not match 'key kv visible iff q-W < kv <= q': %s" % probe)
            notes.append("sliding window: HF did NOT follow q-W < kv <= q; sliding_window_probe shows what it did")
    if spec["rope"] and spec["rope"]["rope_type"] == "longrope":
        notes.append("longrope: a forward call uses long_factor iff max(position_ids)+1 > "
                     "original_max_position_embeddings, else short_factor, for all its tokens; keys already in "
                     "a KV cache are not re-rotated by the model itself.")
        notes.append("longrope attention scaling (rope.attention_scaling) multiplies cos and sin, i.e. q and k "
                     "are each scaled by it; it is computed once from factor = max_position_embeddings / "
                     "original_max_position_embeddings: sqrt(1 + ln(factor)/ln(original_max)), for short and long alike.")
    if spec["dtype"] == "bfloat16":
        notes.append("weights are bfloat16 on disk; the reference is HF in float32 after from_pretrained("
                     "dtype=float32) upcast them exactly")
    if spec["tied"]:
        if "lm_head.weight" in tensors:
            notes.append("tied embeddings: lm_head.weight is stored too (equal to model.embed_tokens.weight)")
        else:
            notes.append("tied embeddings: lm_head.weight is not stored; logits use model.embed_tokens.weight")

    try:
        full_cfg = json.loads(ref.config.to_json_string(use_diff=False))
    except Exception as e:
        full_cfg = None
        warnings.append("could not serialise the effective config: %r" % (e,))

    doc = {
        "version": FIXTURE_VERSION,
        "generator": GENERATOR,
        "regenerate": REGENERATE,
        "case": name,
        "arch": spec["arch"],
        "description": spec["desc"],
        "transformers": env.tf_version,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "device": str(env.device),
        "attn_implementation": "eager",
        "weights_dtype": spec["dtype"],
        "compute_dtype": "float32",
        "reference_model": "this folder loaded back with from_pretrained(dtype=float32, attn_implementation='eager')",
        "seed": seed,
        "vocab_size": VOCAB,
        "n_layers": spec["layers"],
        "hidden_size": spec["hidden"],
        "n_heads": spec["heads"],
        "n_kv_heads": spec["kv_heads"],
        "head_dim": hd,
        "intermediate_size": spec["inter"],
        "tied_embeddings": bool(spec["tied"]),
        "lm_head_stored": "lm_head.weight" in tensors,
        "rms_norm_eps": spec["eps"],
        "sliding_window": spec.get("sliding"),
        "attention_scale": scales[0],
        "rope": rope,
        "files": files,
        "tensors": tensors,
        "n_new_tokens": N_NEW,
        "prompts": prompts,
        "last_logits": last_logits,
        "last_top": last_top,
        "greedy": greedy,
        "greedy_margin": greedy_margin,
        "greedy_top": greedy_top,
        "all_logits_prompt": all_idx,
        "all_logits": all_logits,
        "checks": checks,
        "notes": notes,
        "warnings": warnings,
    }
    if probe is not None:
        doc["sliding_window_probe"] = probe
    doc["hf_config_full"] = full_cfg
    with open(os.path.join(case_dir, "logits.json"), "w") as f:
        f.write(dump_json(doc) + "\n")

    size = sum(os.path.getsize(os.path.join(case_dir, fn)) for fn in os.listdir(case_dir))
    nocache_worst = max((d for pi, ds in enumerate(checks["nocache_step_max_abs_diff"]) for s, d in enumerate(ds)
                         if s not in checks["longrope_switch_steps"][pi]), default=0.0)
    return {
        "name": name, "arch": spec["arch"], "dtype": spec["dtype"], "files": len(files), "bytes": size,
        "min_margin": min(checks["min_greedy_margin"]), "reload": max(checks["reload_max_abs_diff"]),
        "nocache": nocache_worst, "f64": max(checks["f64_max_abs_diff"]),
        "rope_ok": rope.get("independent_formula_agrees"), "v4": v4_written, "warnings": warnings,
    }


# --------------------------------------------------------------------------------------
# Output packaging
# --------------------------------------------------------------------------------------

def write_manifest(env, out_root, results):
    cases = []
    for r in results:
        d = os.path.join(out_root, r["name"])
        cases.append({"name": r["name"], "arch": r["arch"], "weights_dtype": r["dtype"],
                      "files": {fn: sha256_file(os.path.join(d, fn)) for fn in sorted(os.listdir(d))}})
    doc = {"version": FIXTURE_VERSION, "generator": GENERATOR, "regenerate": REGENERATE,
           "transformers": env.tf_version, "torch": env.torch.__version__, "cases": cases}
    with open(os.path.join(out_root, "manifest.json"), "w") as f:
        f.write(dump_json(doc) + "\n")


def write_tar(out_root, names, tar_path):
    """Deterministic tar.gz: sorted members, zero mtimes/owners."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        def add(rel, is_dir):
            ti = tarfile.TarInfo(rel)
            ti.mtime = 0
            ti.uid = ti.gid = 0
            ti.uname = ti.gname = ""
            if is_dir:
                ti.type = tarfile.DIRTYPE
                ti.mode = 0o755
                tar.addfile(ti)
            else:
                p = os.path.join(out_root, rel)
                ti.size = os.path.getsize(p)
                ti.mode = 0o644
                with open(p, "rb") as f:
                    tar.addfile(ti, f)
        add("manifest.json", False)
        for n in sorted(names):
            add(n, True)
            for fn in sorted(os.listdir(os.path.join(out_root, n))):
                add(n + "/" + fn, False)
    with open(tar_path, "wb") as raw:
        with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz:
            gz.write(buf.getvalue())


def summary_table(results, failures):
    lines = []
    hdr = "%-20s %-8s %-9s %5s %9s %9s %9s %9s %9s %6s %3s %4s" % (
        "case", "arch", "weights", "files", "bytes", "minmargin", "reload", "nocache", "f64diff",
        "rope", "v4", "warn")
    lines.append(hdr)
    lines.append("-" * len(hdr))
    for r in results:
        lines.append("%-20s %-8s %-9s %5d %9d %9.4f %9.2g %9.2g %9.2g %6s %3s %4d" % (
            r["name"], r["arch"], r["dtype"], r["files"], r["bytes"], r["min_margin"], r["reload"],
            r["nocache"], r["f64"], {True: "ok", False: "DIFF", None: "?"}[r["rope_ok"]],
            "yes" if r["v4"] else "no", len(r["warnings"])))
    for name, msg in failures:
        lines.append("%-20s FAILED: %s" % (name, msg.strip().splitlines()[-1] if msg.strip() else "?"))
    total = sum(r["bytes"] for r in results)
    lines.append("total case bytes: %d" % total)
    return "\n".join(lines), total


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="output directory (created)")
    ap.add_argument("--only", default="", help="comma-separated case names (default: all)")
    ap.add_argument("--device", default="cpu", help="torch device for the reference runs (default cpu)")
    ap.add_argument("--tar-only", action="store_true",
                    help="leave only fixtures.tar.gz and summary.txt in --out (cases built in a temp dir)")
    ap.add_argument("--size-budget", type=int, default=SIZE_BUDGET, help="warn when the cases exceed this many bytes")
    ap.add_argument("--list", action="store_true", help="list the cases and exit")
    args = ap.parse_args()

    if args.list:
        for c in CASES:
            print("%-20s %s" % (c["name"], c["desc"]))
        return 0
    if not args.out:
        ap.error("--out is required")
    only = [s for s in args.only.split(",") if s]
    unknown = set(only) - {c["name"] for c in CASES}
    if unknown:
        ap.error("unknown case(s): %s" % ", ".join(sorted(unknown)))

    import torch
    import transformers
    torch.set_grad_enabled(False)
    if args.device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    env = Env(torch, transformers, args.device)
    print("transformers %s, torch %s, python %s, device %s" % (
        env.tf_version, torch.__version__, platform.python_version(), env.device))
    if not env.v5:
        print("WARNING: written for transformers 5.x; running on %s (4.x config layout used)" % env.tf_version)

    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    build_root = tempfile.mkdtemp(prefix="hf_fixtures_") if args.tar_only else out

    results, failures = [], []
    for idx, spec in enumerate(CASES):
        if only and spec["name"] not in only:
            continue
        print("==== case %d: %s" % (idx, spec["name"]))
        try:
            r = run_case(env, idx, spec, build_root)
            results.append(r)
            for w in r["warnings"]:
                print("WARNING [%s]: %s" % (spec["name"], w))
        except Exception:
            tb = traceback.format_exc()
            print(tb)
            failures.append((spec["name"], tb))

    table, total = summary_table(results, failures)
    print("\n" + table)
    tar_path = os.path.join(out, "fixtures.tar.gz")
    if os.path.exists(tar_path):
        os.remove(tar_path)
    if not failures:
        write_manifest(env, build_root, results)
        write_tar(build_root, [r["name"] for r in results], tar_path)
        print("wrote %s (%d bytes)" % (tar_path, os.path.getsize(tar_path)))
    if total > args.size_budget:
        print("WARNING: cases take %d bytes, over the %d-byte budget" % (total, args.size_budget))
    with open(os.path.join(out, "summary.txt"), "w") as f:
        f.write(table + "\n")
        for name, tb in failures:
            f.write("\n==== %s\n%s\n" % (name, tb))
    if args.tar_only:
        shutil.rmtree(build_root, ignore_errors=True)
    if failures:
        print("FAILED: %d case(s): %s" % (len(failures), ", ".join(n for n, _ in failures)))
        return 1
    print("OK: %d case(s)" % len(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
