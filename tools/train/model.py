"""A small Llama (HF LlamaForCausalLM layout) in plain PyTorch, plus a minimal safetensors
reader/writer.  Works with torch 1.13 (CPU smoke tests) and torch 2.x (GPU, SDPA/flash).

Parameter names are exactly the HF ones:
    model.embed_tokens.weight
    model.layers.{i}.input_layernorm.weight
    model.layers.{i}.self_attn.{q,k,v,o}_proj.weight
    model.layers.{i}.post_attention_layernorm.weight
    model.layers.{i}.mlp.{gate,up,down}_proj.weight
    model.norm.weight
    lm_head.weight            (only when embeddings are not tied)
Numerics follow HF: RMSNorm in float32 then cast back before the weight multiply, RoPE
"rotate_half" (non-interleaved) with inv_freq = theta^(-2i/d) computed in float32, cos/sin cast
to the activation dtype, GQA head h uses KV head h // (n_heads / n_kv_heads), SiLU-gated MLP.
"""

import json
import math
import struct

import torch
import torch.nn as nn
import torch.nn.functional as F

_HAS_SDPA = hasattr(F, "scaled_dot_product_attention")


def default_config(**over):
    c = dict(vocab_size=4096, hidden_size=512, intermediate_size=1024, num_hidden_layers=8,
             num_attention_heads=8, num_key_value_heads=2, head_dim=64, rms_norm_eps=1e-5,
             rope_theta=500000.0, max_position_embeddings=16384, tie_word_embeddings=True,
             bos_token_id=0, eos_token_id=1, pad_token_id=2)
    c.update(over)
    return c


class RMSNorm(nn.Module):
    def __init__(self, d, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        dt = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dt)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        d, hd = c["hidden_size"], c["head_dim"]
        self.nh, self.nkv, self.hd = c["num_attention_heads"], c["num_key_value_heads"], hd
        self.q_proj = nn.Linear(d, self.nh * hd, bias=False)
        self.k_proj = nn.Linear(d, self.nkv * hd, bias=False)
        self.v_proj = nn.Linear(d, self.nkv * hd, bias=False)
        self.o_proj = nn.Linear(self.nh * hd, d, bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.nh, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = self.nh // self.nkv
        if rep > 1:
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        if _HAS_SDPA:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # torch 1.13 (CPU smoke test)
            s = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.hd)
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
            s = s.masked_fill(mask, float("-inf"))
            o = torch.matmul(torch.softmax(s.float(), dim=-1).to(v.dtype), v)
        return self.o_proj(o.transpose(1, 2).reshape(B, T, self.nh * self.hd))


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        d, f = c["hidden_size"], c["intermediate_size"]
        self.gate_proj = nn.Linear(d, f, bias=False)
        self.up_proj = nn.Linear(d, f, bias=False)
        self.down_proj = nn.Linear(f, d, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.input_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.mlp = MLP(c)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Inner(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList([Layer(c) for _ in range(c["num_hidden_layers"])])
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])


class LlamaLM(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = dict(c)
        self.model = Inner(c)
        if not c["tie_word_embeddings"]:
            self.lm_head = nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)
        self._rope = {}

    # ---------------------------------------------------------------- init / growth
    def init_weights(self, std=0.02, gen=None):
        for name, p in self.named_parameters():
            if name.endswith("layernorm.weight") or name == "model.norm.weight":
                nn.init.ones_(p)
            else:
                with torch.no_grad():
                    p.copy_(torch.randn(p.shape, generator=gen) * std)

    def grow(self, n_layers, std=0.02, gen=None):
        """Append identity-initialised layers (o_proj and down_proj zero) up to n_layers."""
        dev = self.model.embed_tokens.weight.device
        while len(self.model.layers) < n_layers:
            L = Layer(self.c).to(dev)
            with torch.no_grad():
                for name, p in L.named_parameters():
                    if name.endswith("layernorm.weight"):
                        p.fill_(1.0)
                    elif name in ("self_attn.o_proj.weight", "mlp.down_proj.weight"):
                        p.zero_()
                    else:
                        p.copy_((torch.randn(p.shape, generator=gen) * std).to(dev))
            self.model.layers.append(L)
        self.c["num_hidden_layers"] = len(self.model.layers)

    def set_theta(self, theta):
        self.c["rope_theta"] = float(theta)
        self._rope = {}

    # ---------------------------------------------------------------- forward
    def rope(self, T, device):
        key = (T, str(device))
        r = self._rope.get(key)
        if r is None:
            hd = self.c["head_dim"]
            inv = 1.0 / (self.c["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.int64).float().to(device) / hd))
            pos = torch.arange(T, device=device).float()
            fr = torch.outer(pos, inv)
            emb = torch.cat((fr, fr), dim=-1)
            r = (emb.cos(), emb.sin())
            self._rope = {key: r}
        return r

    def hidden(self, ids):
        cos, sin = self.rope(ids.shape[1], ids.device)
        x = self.model.embed_tokens(ids)
        for L in self.model.layers:
            x = L(x, cos, sin)
        return self.model.norm(x)

    def head_weight(self):
        return self.model.embed_tokens.weight if self.c["tie_word_embeddings"] else self.lm_head.weight

    def logits(self, h):
        return F.linear(h, self.head_weight())

    def forward(self, ids):
        return self.logits(self.hidden(ids))

    def n_params(self):
        return sum(p.numel() for p in self.parameters())

    # ---------------------------------------------------------------- HF files
    def hf_config(self):
        c = self.c
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "attention_bias": False,
            "attention_dropout": 0.0,
            "bos_token_id": c["bos_token_id"],
            "eos_token_id": c["eos_token_id"],
            "pad_token_id": c["pad_token_id"],
            "head_dim": c["head_dim"],
            "hidden_act": "silu",
            "hidden_size": c["hidden_size"],
            "initializer_range": 0.02,
            "intermediate_size": c["intermediate_size"],
            "max_position_embeddings": c["max_position_embeddings"],
            "mlp_bias": False,
            "num_attention_heads": c["num_attention_heads"],
            "num_hidden_layers": c["num_hidden_layers"],
            "num_key_value_heads": c["num_key_value_heads"],
            "pretraining_tp": 1,
            "rms_norm_eps": c["rms_norm_eps"],
            "rope_theta": c["rope_theta"],
            "rope_parameters": {"rope_theta": c["rope_theta"], "rope_type": "default"},
            "tie_word_embeddings": c["tie_word_embeddings"],
            "torch_dtype": "bfloat16",
            "dtype": "bfloat16",
            "use_cache": True,
            "vocab_size": c["vocab_size"],
        }

    def hf_state(self):
        sd = {k.replace("_orig_mod.", ""): v for k, v in self.state_dict().items()}
        if self.c["tie_word_embeddings"]:
            sd.pop("lm_head.weight", None)
        return sd


def config_from_hf(hf):
    theta = hf.get("rope_theta")
    rp = hf.get("rope_parameters")
    if isinstance(rp, dict) and rp.get("rope_theta"):
        theta = rp["rope_theta"]
    return default_config(
        vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"], intermediate_size=hf["intermediate_size"],
        num_hidden_layers=hf["num_hidden_layers"], num_attention_heads=hf["num_attention_heads"],
        num_key_value_heads=hf.get("num_key_value_heads", hf["num_attention_heads"]),
        head_dim=hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"],
        rms_norm_eps=hf.get("rms_norm_eps", 1e-5), rope_theta=float(theta or 10000.0),
        max_position_embeddings=hf.get("max_position_embeddings", 16384),
        tie_word_embeddings=hf.get("tie_word_embeddings", True),
        bos_token_id=hf.get("bos_token_id", 0), eos_token_id=hf.get("eos_token_id", 1),
        pad_token_id=hf.get("pad_token_id", 2))


# -------------------------------------------------------------------- safetensors
_ST_DT = {torch.float32: ("F32", 4), torch.bfloat16: ("BF16", 2), torch.float16: ("F16", 2)}
_ST_RV = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


def _raw_bytes(t):
    t = t.detach().contiguous().cpu()
    if t.dtype in (torch.bfloat16, torch.float16):
        return t.view(torch.int16).numpy().tobytes()
    return t.numpy().tobytes()


def save_safetensors(path, tensors, dtype=torch.bfloat16, metadata=None):
    """Write tensors (name -> tensor) as one safetensors file, names sorted, all cast to dtype."""
    names = sorted(tensors)
    header, blobs, off = {}, [], 0
    tag, _ = _ST_DT[dtype]
    for n in names:
        b = _raw_bytes(tensors[n].to(dtype))
        header[n] = {"dtype": tag, "shape": list(tensors[n].shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    header["__metadata__"] = metadata or {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def load_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dt = _ST_RV[info["dtype"]]
        a, b = info["data_offsets"]
        buf = bytearray(data[a:b])
        if dt == torch.float32:
            t = torch.frombuffer(buf, dtype=torch.float32) if hasattr(torch, "frombuffer") else \
                torch.tensor(struct.unpack("<%df" % ((b - a) // 4), buf))
        else:
            t = torch.frombuffer(buf, dtype=torch.int16).view(dt)
        out[name] = t.reshape(info["shape"]).clone()
    return out
