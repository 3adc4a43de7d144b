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

    def last_query_scores(self, x, last, cos, sin):
        """GemFilter's raw score of one layer: x (B, T, d) is the layer's normed input, last (B,)
        the index of each row's last prompt token.  Returns (B, T) float32: sum over all H query
        heads of q_last[h] . k[h // g][j], post-RoPE, no 1/sqrt(d), no softmax (keys j > last are
        garbage: the caller masks them)."""
        B, T, _ = x.shape
        ar = torch.arange(B, device=x.device)
        k = self.k_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)          # (B, nkv, T, hd)
        q = self.q_proj(x[ar, last]).view(B, self.nh, self.hd)                      # (B, H, hd)
        cos, sin = cos.to(k.dtype), sin.to(k.dtype)
        k = k * cos + rotate_half(k) * sin
        cl, sl = cos[last].to(q.dtype)[:, None, :], sin[last].to(q.dtype)[:, None, :]
        q = q * cl + rotate_half(q) * sl
        g = self.nh // self.nkv
        # query head h uses KV head h // g: group the H heads as (nkv, g); the dot products in
        # float32 even under autocast (bf16 logits would tie often and move the top-k)
        with torch.autocast(device_type=x.device.type, enabled=False):
            raw = torch.einsum("bcgd,bctd->bcgt", q.float().view(B, self.nkv, g, self.hd), k.float())
        return raw.sum(dim=(1, 2))


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

    @torch.no_grad()
    def filter_scores(self, ids, last, layers):
        """The batched GemFilter pass 1 without gradients (see filter_scores_grad)."""
        return self.filter_scores_grad(ids, last, layers)

    def filter_scores_grad(self, ids, last, layers):
        """GemFilter pass 1 for a batch (differentiable; filter_scores is the no-grad call).  ids (B, T) right-padded (each row starts at
        position 0), last (B,) long: index of each row's last prompt token, layers (B,) long: the
        filter layer r of each row (0-based, < num_hidden_layers).  Runs layers 0..r-1 in full and
        layer r's input norm + q/k projections + RoPE only; a row leaves the batch once its layer
        is scored.  Returns raw (B, T) float32 scores (Attention.last_query_scores), exactly 0 at
        j > last (so that a following zero-padded pool sees the row's true end)."""
        B, T = ids.shape
        nl = len(self.model.layers)
        if int(layers.min()) < 0 or int(layers.max()) >= nl:
            raise ValueError("filter layer out of range 0..%d: %s" % (nl - 1, layers.tolist()))
        if int(last.min()) < 0 or int(last.max()) >= T:
            raise ValueError("last index out of range 0..%d" % (T - 1))
        cos, sin = self.rope(T, ids.device)
        out = torch.zeros(B, T, dtype=torch.float32, device=ids.device)
        rows = torch.arange(B, device=ids.device)                                   # batch rows still active
        x = self.model.embed_tokens(ids)
        for li in range(int(layers.max()) + 1):
            L = self.model.layers[li]
            here = layers[rows] == li
            if bool(here.any()):
                xs = L.input_layernorm(x[here])
                out[rows[here]] = L.self_attn.last_query_scores(xs, last[rows[here]], cos, sin)
            go = layers[rows] > li
            if not bool(go.any()):
                break
            if not bool(go.all()):
                rows, x = rows[go], x[go]
            x = L(x, cos, sin)
        pad = torch.arange(T, device=ids.device)[None, :] > last[:, None]
        return out.masked_fill(pad, 0.0)

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


def gemfilter_select(raw, n, ks, kernel=5):
    """GemFilter's selection from raw scores (shared/POLICIES.md "gemfilter"): 1-D average pool
    (kernel, padding kernel // 2, zero padding counted), top-k (ties to the lower index), indices
    sorted ascending.  raw (B, T) float32 with zeros past each row's end (filter_scores), n: list
    of B prompt lengths, ks: list of B k's, or a list of B lists of k's (several selections from
    one pooling).  A k >= n keeps every index (GemFilter does not restart then).  Returns, per
    row, a sorted index list (or a list of them, in the shape of ks)."""
    pooled = F.avg_pool1d(raw[:, None, :].float(), kernel, stride=1, padding=kernel // 2,
                          count_include_pad=True)[:, 0]
    T = raw.shape[1]
    pad = torch.arange(T, device=raw.device)[None, :] >= torch.tensor(n, device=raw.device)[:, None]
    pooled = pooled.masked_fill(pad, float("-inf"))
    # a stable descending sort keeps equal values in index order: ties go to the lower index
    order = torch.sort(pooled, dim=1, descending=True, stable=True)[1].cpu()
    out = []
    for b in range(raw.shape[0]):
        kb = ks[b]
        one = not isinstance(kb, (list, tuple))
        sels = []
        for k in ([kb] if one else kb):
            if k >= n[b]:
                sels.append(list(range(n[b])))
            else:
                sels.append(sorted(order[b, :k].tolist()))
        out.append(sels[0] if one else sels)
    return out


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
