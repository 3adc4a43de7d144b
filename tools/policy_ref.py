#!/usr/bin/env python3
"""Independent PyTorch reference of kvsieve's token-pruning policies, run on Hugging Face
transformers' own decoder layers; dumps JSON fixtures the engine's Lua policies must reproduce.

    python3 tools/policy_ref.py --out DIR --stories PATH     # all models, DIR/policy_fixtures.tar.gz
    python3 tools/policy_ref.py --out DIR --only llama12_gqa # one model (names: stories260K,
                                                             #   llama12_gqa, qwen2_12_bias)
    python3 tools/policy_ref.py --selftest                   # CPU, no transformers needed
    python3 tools/policy_ref.py --out DIR --stories PATH --policies asl --merge tests/fixtures/policies
                                                             # one policy's cases, installed in place

Needs torch, numpy and (except for --selftest) transformers >= 4.48 (written against 5.x) with
safetensors. Never touches the network. The format of every file is in tools/README.md
("Policy fixtures"); the policy semantics are those of shared/POLICIES.md.

How the model runs. The script drives HF's own modules itself: embed_tokens, then every
decoder layer called with (hidden rows, position_ids, position_embeddings), then the final norm
and lm_head on the last row. Inside each layer HF computes the norms, the q/k/v projections,
RoPE and the MLP; the script only replaces the attention *result*: forward hooks on
q_proj/k_proj/v_proj capture the pre-RoPE projections, HF's own apply_rotary_pos_emb (looked up
in the attention module's modeling file) with HF's own rotary_emb cos/sin gives post-RoPE q/k,
and a forward pre-hook on o_proj substitutes the policy's attention output for whatever HF's
attention computed. So the script depends on no attention-dispatch internals (eager vs.
AttentionInterface), and it can gather rows between layers (FastKV / ASL propagation), restart
on selected ids (GemFilter / ASL two-pass), attend to subsets (SnapKV, StreamingLLM decode) and
renumber positions (TokenSelect). Checked on every model: this driver with full attention gives
the same logits as HF's own model(input_ids) (eager, its own causal mask) at the prefill and at
every greedy step, and the same greedy tokens. Every "budget >= n" configuration must give
exactly the full-attention logits and tokens; anything else makes the script exit non-zero.
"""

import argparse
import hashlib
import inspect
import json
import math
import os
import shutil
import sys
import tarfile
import tempfile
import time
import traceback

import numpy as np
import torch
import torch.nn.functional as F

FIXTURE_VERSION = 1
GENERATOR = "tools/policy_ref.py"
REGENERATE = ("python3 tools/policy_ref.py --out DIR --stories PATH "
              "(GPU machine with torch+transformers)")
N_NEW = 8                 # greedy tokens per case (token 0 from the prefill, 1..7 from decode steps)
NEAR_TIE_REL = 1e-5       # boundary gap below this (relative) is flagged near_tie
HF_TOL = 2e-4             # driver-vs-HF logits, relative to max(1, max|logit|)
INV_TOL = 1e-5            # "budget >= n" policy run vs. full run (should be ~bitwise)
SIZE_LIMIT = 8_000_000    # bytes for policy_fixtures.tar.gz
STOP = "stop"

MODELLING = {
    "common": (
        "Scores come from post-RoPE q/k that HF computed (float32, eager-equivalent) in the forward "
        "the policy actually runs. Positions are prompt indices (0-based); kept/selected lists are "
        "sorted ascending and given as original prompt positions. Top-k breaks ties towards the "
        "lower index; every boundary object ('bnd') says whether the k-th and (k+1)-th values tie "
        "exactly (then tie_group lists all candidates with the k-th value, tie_taken how many were "
        "taken: the lowest ones) or nearly (near_tie, relative gap < %g), so kept sets can be "
        "compared as sets. Greedy decoding: argmax, lowest id on ties; step_margins are top1-top2 "
        "logit gaps." % NEAR_TIE_REL),
    "full": "Plain causal attention, full KV; decode positions n, n+1, ...",
    "streamingllm": (
        "Prefill is full attention. Retention at the end of prefill when n >= budget: rows "
        "0..sinks-1 and n-(budget-sinks)..n-1 in every layer (the FastKV repo's baseline). Decode "
        "rows are appended and always attended, original positions. Variant rolling: before each "
        "decode step's attention, once the layer holds more than budget rows (new one included), "
        "only the sinks and the most recent budget-sinks rows are kept (evicted rows never return)."),
    "snapkv": (
        "Prefill is full attention (unchanged); scores come from that full-context forward. "
        "Per layer, when n >= budget: softmax(q_win K^T / sqrt(d)) in fp32 over all n keys with "
        "the causal mask inside the window, summed over the w window queries, restricted to the "
        "prefix 0..n-w-1, 1-D pooled per query head (padding kernel//2, stride 1; avg counts the "
        "zero padding), then (kv_head granularity) summed over the g query heads of each KV head. "
        "Keep top (budget-w) prefix positions + the w window positions per cache head. Decode "
        "attends kept rows + all decode rows at original positions."),
    "gemfilter": (
        "Pass 1 is the full-context forward of layers 0..r (nothing after r runs). At layer r: "
        "score[j] = sum over all H query heads of q_last[h] . K[h//g][j] (post-RoPE, raw: no "
        "softmax, no 1/sqrt(d)); avg_pool1d kernel 5 padding 2 count_include_pad; top-k, "
        "k = min(k, n), sorted. Pass 2 is a fresh full prefill of ids[selected] at positions "
        "0..k-1; decode at positions k, k+1, ..."),
    "fastkv": (
        "One pass. Layers <= t score the full-context rows; after layer t's MLP the TSP rows' "
        "hidden states and position ids are gathered and layers > t run (and score) ONLY those "
        "rows, at their original positions: later layers' scores come from that pruned forward. "
        "Per layer with m active rows: capacity = int(m*retain_rate) for l <= t, "
        "int(m*(retain_rate/tsp_rate)) for l > t (proportional mode) or the fixed capacity "
        "(absolute mode); compress only when m >= capacity: SnapKV scores (w, kernel, pool) "
        "group-summed per KV head -> top (capacity-w) + window per KV head. TSP (layer t, only "
        "when it compresses and m > tsp_len, tsp_len = int(m*tsp_rate) or fixed): the same "
        "group-summed scores summed over KV heads -> top (tsp_len-w) + window, sorted. Prefill "
        "attention is full causal over the active rows; decode attends kept rows + decode rows, "
        "positions n, n+1, ..."),
    "asl": (
        "Pass 1 is the full-context forward. At every layer l (until selection): SnapKV scores "
        "(w, fp32 softmax, window sum, pool) per query head, summed over each KV group and then "
        "over KV heads -> s_l over prefix positions 0..n-w-1; rank 1 = highest (ties: lower "
        "position gets the better rank). kk = k-w (or n-w if smaller). For l >= L_min: U = union "
        "of the top-kk sets of layers l-L_obs+1..l; var = mean over those layers and t in U of "
        "(rank - mean rank of t)^2 (population, computed in float64); var0 = var at L_min, "
        "ratio = 1 at L_min, var/var0 after. First l with ratio < tau is the selection layer; "
        "selected = top-kk(s_l) union the last w positions, sorted. One-pass: gather after that "
        "layer's MLP (original positions, like FastKV), full KV everywhere (no kv_budget), no "
        "selection -> nothing pruned. Two-pass: pass 2 is a fresh prefill of ids[selected] at "
        "positions 0..k'-1; with no selection it falls back to the last layer's top-kk + window. "
        "KV budget B (params.kv_budget, one-pass; the reference's cache_k): at EVERY layer, those "
        "after the selection layer (run on the propagated rows) included, when its m active rows "
        "exceed B, each KV head keeps its top (B-w) prefix rows by its pooled group-summed window "
        "scores over those m rows + the w window rows; prefill attention stays full over the m "
        "rows, decode attends the kept rows + decode rows."),
    "tokenselect": (
        "Every layer, prefill chunks and decode steps; the model runs TokenSelect for real (later "
        "layers/chunks see hidden states produced by sparse attention). Keys kept pre-RoPE. For a "
        "chunk of qo rows ending at N (rows stored so far, chunk included): if n_init+k+n_local "
        ">= N attend all N rows at original positions (dense). Else fingerprint = mean over the "
        "chunk's rows i of RoPE(q_pre_i, n_local+i); per head h: s = fp[h] . k_pre[kvh(h)] over "
        "candidate rows n_init..N-n_local-1 (no scale), softmax over candidates, sum over heads; "
        "optional max pool; top-k, sorted. Attended = [0,n_init) ++ sel ++ [N-n_local, N); key "
        "j of that list is rotated at position j, chunk query i at kv_len-qo+i, causal in that "
        "numbering, scale 1/sqrt(d). kvh(h) = h//g (default) or h%Hkv (reference bug, option; "
        "scoring only — attention always uses h//g). Selection cache (option, decode only): per "
        "layer, reuse the cached sel while cos(fp, cached fp) >= theta; a miss recomputes and "
        "caches sel and fp; the first sparse decode step of a layer always recomputes."),
}


# =========================================================================================
# Small helpers
# =========================================================================================

class RefError(Exception):
    pass


def require(cond, msg):
    if not cond:
        raise RefError(msg)


def f9(x):
    x = float(x)
    if not math.isfinite(x):
        raise RefError("non-finite value in fixture output")
    return float("%.9g" % x)


def f9list(t):
    if isinstance(t, torch.Tensor):
        t = t.detach().float().cpu().reshape(-1).tolist()
    return [f9(v) for v in t]


def ints(xs):
    if isinstance(xs, torch.Tensor):
        xs = xs.detach().cpu().reshape(-1).tolist()
    return [int(v) for v in xs]


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 16), b""):
            h.update(chunk)
    return h.hexdigest()


def _scalar_json(x):
    if isinstance(x, bool):
        return "true" if x else "false"
    if x is None:
        return "null"
    if isinstance(x, float):
        if not math.isfinite(x):
            raise RefError("non-finite float in JSON output")
        return repr(x)
    if isinstance(x, int):
        return str(x)
    return json.dumps(x)


def dump_json(obj, level=0):
    """JSON with every list of scalars on one line (compact, still diffable)."""
    pad, pad1 = " " * level, " " * (level + 1)
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


# =========================================================================================
# Policy math: pure functions over tensors (no model, no transformers)
# =========================================================================================

def stable_order(x):
    """Indices of 1-D x by descending value, ties by ascending index (numpy lexsort: exact)."""
    xs = x.detach().double().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x, np.float64)
    require(np.isfinite(xs).all(), "non-finite score")
    return np.lexsort((np.arange(len(xs)), -xs))


def topk_lower(x, k):
    """(selected indices in selection order, full order) -- the k largest, ties -> lower index."""
    order = stable_order(x)
    return order[:k], order


def ranks_desc(x):
    """rank[i] = 1 + place of i in stable_order(x) (1 = highest)."""
    order = stable_order(x)
    r = np.empty(len(order), dtype=np.int64)
    r[order] = np.arange(1, len(order) + 1)
    return r, order


def boundary(x, order, k, pos_map=None):
    """Describe the top-k boundary of 1-D scores x (None when every candidate is taken)."""
    xs = x.detach().double().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x, np.float64)
    n = len(order)
    if k >= n or k <= 0:
        return None
    kth, nxt = float(xs[order[k - 1]]), float(xs[order[k]])
    pm = (lambda i: int(pos_map[i])) if pos_map is not None else (lambda i: int(i))
    b = {"k": int(k), "n_cand": int(n), "kth": f9(kth), "next": f9(nxt), "gap": f9(kth - nxt)}
    scale = max(abs(kth), abs(nxt), 1e-30)
    b["rel_gap"] = f9((kth - nxt) / scale)
    if kth == nxt:
        group = np.nonzero(xs == kth)[0]
        taken = set(int(i) for i in order[:k])
        b["exact_tie"] = True
        b["tie_group"] = sorted(pm(i) for i in group)
        b["tie_taken"] = int(sum(1 for i in group if int(i) in taken))
        b["near_tie"] = False
    else:
        b["exact_tie"] = False
        b["near_tie"] = bool((kth - nxt) <= NEAR_TIE_REL * scale)
    return b


def pool1d(x, kernel, mode):
    """1-D pooling along the last dim, stride 1, padding kernel//2 (odd kernels keep the length).
    avg: count_include_pad=True (edges divided by kernel); max: padding never wins."""
    if kernel is None or kernel <= 1 or mode in (None, "none"):
        return x
    require(kernel % 2 == 1, "pool kernel must be odd")
    shp = x.shape
    x3 = x.reshape(-1, 1, shp[-1]).float()
    if mode == "avg":
        y = F.avg_pool1d(x3, kernel_size=kernel, stride=1, padding=kernel // 2, count_include_pad=True)
    elif mode == "max":
        y = F.max_pool1d(x3, kernel_size=kernel, stride=1, padding=kernel // 2)
    else:
        raise RefError("unknown pool mode %r" % (mode,))
    return y.reshape(shp)


def repeat_heads(k, g):
    """(Hkv, n, d) -> (H, n, d), query head h uses KV head h // g (HF repeat_kv)."""
    return k if g == 1 else k.repeat_interleave(g, dim=0)


def window_scores(q, k, w, g):
    """SnapKV window scores per query head: (H, n-w).
    q (H, n, d) post-RoPE, k (Hkv, n, d) post-RoPE."""
    H, n, d = q.shape
    require(0 < w < n, "window %d must be in (0, n=%d)" % (w, n))
    kr = repeat_heads(k, g)
    a = torch.matmul(q[:, n - w:, :], kr.transpose(1, 2)) / math.sqrt(d)          # (H, w, n)
    mask = torch.full((w, w), torch.finfo(a.dtype).min, dtype=a.dtype, device=a.device)
    cond = torch.arange(w, device=a.device)
    mask.masked_fill_(cond < (cond + 1).view(w, 1), 0)                              # keep j <= i
    a[:, :, n - w:] += mask[None]
    p = torch.softmax(a, dim=-1, dtype=torch.float32)
    return p[:, :, : n - w].sum(dim=1)                                              # (H, n-w)


def snap_scores(q, k, w, g, kernel, pool, group_sum=True):
    """Pooled per query head, then (group_sum) summed over each KV head's g query heads."""
    s = pool1d(window_scores(q, k, w, g), kernel, pool)
    if group_sum:
        H, P = s.shape
        s = s.view(H // g, g, P).sum(dim=1)
    return s


def gemfilter_scores(q, k, g, kernel=5):
    """(raw, pooled), each (n,): sum over H of q_last . K (raw logits), then avg pool."""
    kr = repeat_heads(k, g)
    raw = torch.matmul(q[:, -1:, :], kr.transpose(1, 2))[:, 0, :]                   # (H, n)
    tot = raw.sum(dim=0)
    return tot, pool1d(tot[None], kernel, "avg")[0]


def asl_variance(rank_rows, U):
    """mean over layers and t in U of (rank - mean rank of t)^2, float64."""
    X = np.stack([r[U] for r in rank_rows]).astype(np.float64)                     # (L_obs, |U|)
    mu = X.mean(axis=0)
    return float(((X - mu) ** 2).mean())


def ts_vote(fp, kpre_cand, head_map, Hkv):
    """TokenSelect head soft vote over candidates: fp (H, d), kpre_cand (Hkv, C, d) -> (C,)."""
    H = fp.shape[0]
    g = H // Hkv
    kvh = [(h // g) if head_map == "div" else (h % Hkv) for h in range(H)]
    kk = kpre_cand[kvh]                                                             # (H, C, d)
    s = torch.einsum("hd,hcd->hc", fp, kk)
    p = torch.softmax(s.float(), dim=-1)
    return p.sum(dim=0)


# =========================================================================================
# The driver: HF's decoder layers, the policy's attention
# =========================================================================================

class KV:
    """One layer's rows: post-RoPE k, v, pre-RoPE k (Hkv, N, d); pos, orig (N); keep (Hc, N) or None."""

    def __init__(self, k, v, kpre, pos, orig):
        self.k, self.v, self.kpre = k, v, kpre
        self.pos, self.orig = pos.clone(), orig.clone()
        self.keep = None

    @property
    def n(self):
        return self.k.shape[1]

    def append(self, k, v, kpre, pos, orig):
        self.k = torch.cat([self.k, k], dim=1)
        self.v = torch.cat([self.v, v], dim=1)
        self.kpre = torch.cat([self.kpre, kpre], dim=1)
        self.pos = torch.cat([self.pos, pos])
        self.orig = torch.cat([self.orig, orig])
        if self.keep is not None:
            add = torch.ones(self.keep.shape[0], k.shape[1], dtype=torch.bool, device=self.keep.device)
            self.keep = torch.cat([self.keep, add], dim=1)

    def allow(self, H, g):
        """(H, 1, N) bool or None."""
        if self.keep is None:
            return None
        kp = self.keep
        if kp.shape[0] == H:
            pass
        elif kp.shape[0] * g == H:
            kp = kp.repeat_interleave(g, dim=0)
        elif kp.shape[0] == 1:
            kp = kp.expand(H, -1)
        else:
            raise RefError("keep mask with %d heads" % kp.shape[0])
        return kp[:, None, :]

    def kept_lists(self):
        """Per cache head: sorted original positions kept (None = all)."""
        if self.keep is None:
            return None
        return [ints(self.orig[self.keep[h]]) for h in range(self.keep.shape[0])]


class Runner:
    def __init__(self, model, device):
        inner = model.model
        self.model = model
        self.embed = inner.embed_tokens
        self.layers = list(inner.layers)
        self.norm = inner.norm
        self.rotary = inner.rotary_emb
        self.lm_head = model.lm_head
        cfg = model.config
        self.H = int(cfg.num_attention_heads)
        self.Hkv = int(getattr(cfg, "num_key_value_heads", None) or self.H)
        hd = getattr(cfg, "head_dim", None)
        self.d = int(hd) if hd else int(cfg.hidden_size) // self.H
        require(self.H % self.Hkv == 0, "heads not a multiple of kv heads")
        self.g = self.H // self.Hkv
        self.L = len(self.layers)
        self.device = device
        a0 = self.layers[0].self_attn
        mod = sys.modules[type(a0).__module__]
        require(hasattr(mod, "apply_rotary_pos_emb"),
                "%s has no apply_rotary_pos_emb" % type(a0).__module__)
        self.rope_apply = mod.apply_rotary_pos_emb
        self.scaling = float(getattr(a0, "scaling", self.d ** -0.5))
        require(abs(self.scaling - self.d ** -0.5) < 1e-7, "attention scaling %r != d^-0.5" % self.scaling)
        self.attn_fn = None
        self._cap = {}
        self.hook_calls = 0
        for l, layer in enumerate(self.layers):
            a = layer.self_attn
            for nm in ("q", "k", "v"):
                getattr(a, nm + "_proj").register_forward_hook(self._mk_cap(l, nm))
            a.o_proj.register_forward_pre_hook(self._mk_o(l))
        sig = inspect.signature(self.layers[0].forward)
        self._var_kw = any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values())
        self._params = set(sig.parameters)
        require("position_embeddings" in self._params or self._var_kw,
                "decoder layer takes no position_embeddings")

    # ---- hooks -------------------------------------------------------------------------
    def _mk_cap(self, l, nm):
        def hook(module, inp, out):
            if self.attn_fn is not None:
                self._cap[nm] = (l, out)
        return hook

    def _mk_o(self, l):
        def hook(module, args):
            if self.attn_fn is None:
                return None
            m = self.cur_pos.shape[0]
            caps = {}
            for nm in ("q", "k", "v"):
                require(nm in self._cap and self._cap[nm][0] == l,
                        "layer %d: %s_proj output was not captured" % (l, nm))
                caps[nm] = self._cap[nm][1]
            self._cap = {}
            qp = caps["q"].reshape(m, self.H, self.d).transpose(0, 1)
            kp = caps["k"].reshape(m, self.Hkv, self.d).transpose(0, 1)
            v = caps["v"].reshape(m, self.Hkv, self.d).transpose(0, 1)
            q, k = self.rope_apply(qp[None], kp[None], self.cur_cos, self.cur_sin)
            out = self.attn_fn(l, q[0], k[0], v, qp, kp)                       # (H, m, d)
            new = out.transpose(0, 1).reshape(1, m, self.H * self.d).to(args[0].dtype)
            require(tuple(args[0].shape) == tuple(new.shape),
                    "o_proj input shape %s, substitute %s" % (tuple(args[0].shape), tuple(new.shape)))
            self.hook_calls += 1
            return (new,) + tuple(args[1:])
        return hook

    # ---- pieces ------------------------------------------------------------------------
    def rope(self, x, positions):
        """x (Hx, m, d) rotated at positions (m,) with HF's rotary_emb + apply_rotary_pos_emb."""
        pos = torch.as_tensor(positions, dtype=torch.long, device=self.device).view(1, -1)
        cos, sin = self.rotary(x[None], pos)
        y, _ = self.rope_apply(x[None], x[None], cos, sin)
        return y[0]

    def attend(self, q, K, V, allow):
        """q (H, m, d); K, V (Hkv or H, N, d); allow broadcastable to (H, m, N) or None."""
        if K.shape[0] != q.shape[0]:
            K, V = repeat_heads(K, self.g), repeat_heads(V, self.g)
        w = torch.matmul(q, K.transpose(1, 2)) * self.scaling
        if allow is not None:
            require(bool(allow.any(dim=-1).all()), "a query row has no key to attend")
            w = w.masked_fill(~allow, float("-inf"))
        p = torch.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
        return torch.matmul(p, V)

    def causal(self, q, k, v):
        m = q.shape[1]
        allow = torch.ones(m, m, dtype=torch.bool, device=q.device).tril()[None]
        return self.attend(q, k, v, allow)

    def _call_layer(self, layer, x, pos):
        cos, sin = self.rotary(x, pos.view(1, -1))
        self.cur_cos, self.cur_sin = cos, sin
        kw = {"attention_mask": None, "position_ids": pos.view(1, -1), "position_embeddings": (cos, sin)}
        if not self._var_kw:
            kw = {a: b for a, b in kw.items() if a in self._params}
        out = layer(x, **kw)
        return out[0] if isinstance(out, (tuple, list)) else out

    def run(self, ids, positions, orig, attn_fn, after_layer=None):
        """One forward over rows `ids` at `positions`. Returns (last-row logits or None if a
        policy stopped the pass, final orig rows)."""
        dev = self.device
        ids_t = torch.as_tensor(ids, dtype=torch.long, device=dev).view(1, -1)
        pos = torch.as_tensor(positions, dtype=torch.long, device=dev).view(-1)
        self.cur_orig = torch.as_tensor(orig, dtype=torch.long, device=dev).view(-1)
        self.cur_ids = ids_t[0]
        x = self.embed(ids_t)
        self.attn_fn = attn_fn
        calls0 = self.hook_calls
        try:
            for l, layer in enumerate(self.layers):
                self.cur_pos = pos
                x = self._call_layer(layer, x, pos)
                require(self.hook_calls == calls0 + l + 1,
                        "attention hook did not run at layer %d (o_proj not called?)" % l)
                if after_layer is not None:
                    sel = after_layer(l)
                    if isinstance(sel, str) and sel == STOP:
                        return None, self.cur_orig
                    if sel is not None:
                        sel = torch.as_tensor(sel, dtype=torch.long, device=dev)
                        x = x[:, sel]
                        pos = pos[sel]
                        self.cur_orig = self.cur_orig[sel]
                        self.cur_ids = self.cur_ids[sel]
            x = self.norm(x)
            logits = self.lm_head(x[:, -1:, :])[0, -1].float()
            return logits, self.cur_orig
        finally:
            self.attn_fn = None
            self._cap = {}


def argmax_lower(v):
    v = v.detach().double().cpu().numpy()
    return int(np.flatnonzero(v == v.max())[0])


def margin(v):
    top = torch.topk(v.detach().float().cpu(), 2).values.tolist()
    return float(top[0] - top[1])


def top_pairs(v, k=5):
    vals, idx = torch.topk(v.detach().float().cpu(), k)
    return [[int(i), f9(x)] for i, x in zip(idx.tolist(), vals.tolist())]


def generate(R, pol, ids, positions=None, orig=None, n_new=N_NEW):
    """Prefill with the policy, then greedy decode. Returns None if the pass was stopped."""
    n = len(ids)
    positions = list(range(n)) if positions is None else list(positions)
    orig = list(range(n)) if orig is None else list(orig)
    pol.begin_prefill()
    logits, _ = R.run(ids, positions, orig, pol.prefill, pol.after_layer)
    if logits is None:
        return None
    toks, margins, steps = [], [], [logits]
    first = top_pairs(logits)
    for s in range(n_new):
        t = argmax_lower(logits)
        toks.append(t)
        margins.append(f9(margin(logits)))
        if s == n_new - 1:
            break
        pol.begin_decode(s, t)
        logits, _ = R.run([t], [positions[-1] + 1 + s], [n + s], pol.decode, None)
        steps.append(logits)
    return {"tokens": toks, "margins": margins, "logits": steps, "first_top": first}


# =========================================================================================
# Policies
# =========================================================================================

class FullPolicy:
    """Causal attention, every row kept. Subclasses score at prefill and set keep masks."""

    def __init__(self, R):
        self.R = R
        self.kv = [None] * R.L
        self.step = -1

    def begin_prefill(self):
        self.step = -1

    def begin_decode(self, s, token):
        self.step = s

    def prefill(self, l, q, k, v, qp, kp):
        R = self.R
        self.kv[l] = KV(k, v, kp, R.cur_pos, R.cur_orig)
        self.score(l, q, k)
        return R.causal(q, k, v)

    def score(self, l, q, k):
        pass

    def after_layer(self, l):
        return None

    def decode(self, l, q, k, v, qp, kp):
        R = self.R
        st = self.kv[l]
        st.append(k, v, kp, R.cur_pos, R.cur_orig)
        self.on_decode(l, st)
        return R.attend(q, st.k, st.v, st.allow(R.H, R.g))

    def on_decode(self, l, st):
        pass


class StreamingPolicy(FullPolicy):
    def __init__(self, R, budget, sinks=4, rolling=False):
        super().__init__(R)
        require(budget > sinks, "budget must exceed sinks")
        self.B, self.sinks, self.rolling = budget, sinks, rolling
        self.compressed = None
        self.decode_kept = []

    def _mask(self, n):
        keep = torch.zeros(1, n, dtype=torch.bool, device=self.R.device)
        keep[0, : self.sinks] = True
        keep[0, n - (self.B - self.sinks):] = True
        return keep

    def score(self, l, q, k):
        n = q.shape[1]
        self.compressed = n >= self.B
        if self.compressed:
            self.kv[l].keep = self._mask(n)

    def on_decode(self, l, st):
        if not self.rolling:
            return
        cur = st.keep if st.keep is not None else torch.ones(1, st.n, dtype=torch.bool, device=st.k.device)
        live = torch.nonzero(cur[0]).view(-1)
        if live.numel() > self.B:
            keep = torch.zeros_like(cur)
            keep[0, live[: self.sinks]] = True
            keep[0, live[live.numel() - (self.B - self.sinks):]] = True
            st.keep = keep
        if l == 0:
            self.decode_kept.append(ints(st.orig[st.keep[0]]) if st.keep is not None else None)


class SnapKVPolicy(FullPolicy):
    def __init__(self, R, budget, w, kernel, pool, per_query_head=False, score_layers=()):
        super().__init__(R)
        self.B, self.w, self.kernel, self.pool = budget, w, kernel, pool
        self.pqh = per_query_head
        self.score_layers = set(score_layers)
        self.layers_out = [None] * R.L
        self.scores_out = {}

    def score(self, l, q, k):
        R = self.R
        n = q.shape[1]
        if n < self.B:
            self.layers_out[l] = {"compressed": False, "heads": None, "bnd": None}
            return
        require(self.B > self.w, "budget must exceed window")
        s = snap_scores(q, k, self.w, R.g, self.kernel, self.pool, group_sum=not self.pqh)
        orig = R.cur_orig.cpu().numpy()
        keep = torch.zeros(s.shape[0], n, dtype=torch.bool, device=R.device)
        heads, bnds = [], []
        for h in range(s.shape[0]):
            top, order = topk_lower(s[h], self.B - self.w)
            idx = sorted(int(i) for i in top) + list(range(n - self.w, n))
            keep[h, idx] = True
            heads.append([int(orig[i]) for i in idx])
            bnds.append(boundary(s[h], order, self.B - self.w, orig))
        self.kv[l].keep = keep
        self.layers_out[l] = {"compressed": True, "heads": heads, "bnd": bnds}
        if l in self.score_layers:
            self.scores_out[str(l)] = [f9list(s[h]) for h in range(s.shape[0])]


class GemFilterPolicy(FullPolicy):
    def __init__(self, R, r, k, kernel=5):
        super().__init__(R)
        self.r, self.k, self.kernel = r, k, kernel
        self.out = None

    def score(self, l, q, k):
        if l != self.r:
            return
        n = q.shape[1]
        raw, pooled = gemfilter_scores(q, k, self.R.g, self.kernel)
        kk = min(self.k, n)
        top, order = topk_lower(pooled, kk)
        orig = self.R.cur_orig.cpu().numpy()
        self.out = {"selected": sorted(int(orig[i]) for i in top), "k_eff": kk,
                    "score_raw": f9list(raw), "score_pooled": f9list(pooled),
                    "bnd": boundary(pooled, order, kk, orig)}

    def after_layer(self, l):
        return STOP if l == self.r else None


class FastKVPolicy(FullPolicy):
    def __init__(self, R, mode, t, w, kernel, pool, tsp_rate=None, retain_rate=None,
                 tsp_len=None, capacity=None, score_layers=()):
        super().__init__(R)
        require(mode in ("proportional", "absolute"), "fastkv mode")
        self.mode, self.t, self.w, self.kernel, self.pool = mode, t, w, kernel, pool
        self.tsp_rate, self.retain_rate, self.tsp_len, self.capacity = tsp_rate, retain_rate, tsp_len, capacity
        self.tsp_sel = None
        self.tsp_out = {"layer": t, "propagated": False}
        self.layers_out = [None] * R.L
        self.score_layers = set(score_layers)
        self.scores_out = {}

    def score(self, l, q, k):
        R = self.R
        m = q.shape[1]
        if self.mode == "proportional":
            rate = self.retain_rate if l <= self.t else self.retain_rate / self.tsp_rate
            cap = int(m * rate)
        else:
            cap = int(self.capacity)
        orig = R.cur_orig.cpu().numpy()
        rec = {"n_active": m, "capacity": cap, "compressed": m >= cap, "heads": None, "bnd": None}
        if l == self.t + 1 and self.tsp_sel is not None:
            rec["active_orig"] = ints(orig)
        self.layers_out[l] = rec
        if m < cap:
            return
        require(cap - self.w > 0, "capacity %d must exceed window %d" % (cap, self.w))
        s = snap_scores(q, k, self.w, R.g, self.kernel, self.pool, group_sum=True)   # (Hkv, m-w)
        keep = torch.zeros(R.Hkv, m, dtype=torch.bool, device=R.device)
        heads, bnds = [], []
        for h in range(R.Hkv):
            top, order = topk_lower(s[h], cap - self.w)
            idx = sorted(int(i) for i in top) + list(range(m - self.w, m))
            keep[h, idx] = True
            heads.append([int(orig[i]) for i in idx])
            bnds.append(boundary(s[h], order, cap - self.w, orig))
        self.kv[l].keep = keep
        rec["heads"], rec["bnd"] = heads, bnds
        if l in self.score_layers:
            self.scores_out[str(l)] = [f9list(s[h]) for h in range(R.Hkv)]
        if l == self.t:
            tl = int(m * self.tsp_rate) if self.mode == "proportional" else int(self.tsp_len)
            self.tsp_out["tsp_len"] = tl
            if m > tl:
                require(tl - self.w > 0, "tsp_len must exceed window")
                tot = s.sum(dim=0)
                top, order = topk_lower(tot, tl - self.w)
                idx = sorted(int(i) for i in top) + list(range(m - self.w, m))
                self.tsp_sel = idx
                self.tsp_out.update(propagated=True, positions=[int(orig[i]) for i in idx],
                                    score=f9list(tot), bnd=boundary(tot, order, tl - self.w, orig))

    def after_layer(self, l):
        if l == self.t and self.tsp_sel is not None:
            return self.tsp_sel
        return None


class ASLPolicy(FullPolicy):
    def __init__(self, R, L_min, L_obs, tau, k, w, kernel, pool, two_pass, kv_budget=0, kv_score_layers=()):
        super().__init__(R)
        require(L_min >= L_obs - 1, "ASL needs L_min >= L_obs - 1 (refused, as in POLICIES.md)")
        require(L_min < R.L, "L_min beyond the model")
        require(kv_budget == 0 or kv_budget > w, "ASL kv_budget must be 0 (off) or > w")
        self.L_min, self.L_obs, self.tau, self.k, self.w = L_min, L_obs, tau, k, w
        self.kernel, self.pool, self.two_pass = kernel, pool, two_pass
        self.B = int(kv_budget)
        self.kv_out = [None] * R.L          # with a KV budget: one record per layer that ran
        self.kv_score_layers = set(kv_score_layers)
        self.kv_scores = {}
        self.ranks, self.orders, self.scores = {}, {}, {}
        self.var0 = None
        self.sel_layer = None
        self.selected_rows = None
        self.layers_out = []
        self.kk = None
        self.n_rows = None
        self.orig_np = None

    def budget(self, l, sh, m):
        """KV budget (the reference's cache_k), at every layer of the pass, the layers after the
        selection (the propagated rows) included: when the layer's m active rows exceed B, each KV
        head keeps its top (B-w) prefix rows by its pooled group-summed scores sh[h] + the w window
        rows (m <= B: the reference's top (m-w) of m-w, i.e. every row)."""
        if not self.B:
            return
        R = self.R
        orig = R.cur_orig.cpu().numpy()
        rec = {"layer": l, "n_active": m, "compressed": m > self.B, "heads": None, "bnd": None}
        self.kv_out[l] = rec
        if l in self.kv_score_layers:
            self.kv_scores[str(l)] = [f9list(sh[h]) for h in range(R.Hkv)]
        if m <= self.B:
            return
        keep = torch.zeros(R.Hkv, m, dtype=torch.bool, device=R.device)
        heads, bnds = [], []
        for h in range(R.Hkv):
            top, order = topk_lower(sh[h], self.B - self.w)
            idx = sorted(int(i) for i in top) + list(range(m - self.w, m))
            keep[h, idx] = True
            heads.append([int(orig[i]) for i in idx])
            bnds.append(boundary(sh[h], order, self.B - self.w, orig))
        self.kv[l].keep = keep
        rec["heads"], rec["bnd"] = heads, bnds

    def score(self, l, q, k):
        R = self.R
        n = q.shape[1]
        if self.sel_layer is not None:      # after the selection: one pass runs the propagated rows
            if self.B:
                self.budget(l, snap_scores(q, k, self.w, R.g, self.kernel, self.pool, group_sum=True), n)
            return
        P = n - self.w
        sh = snap_scores(q, k, self.w, R.g, self.kernel, self.pool, group_sum=True)   # (Hkv, P)
        self.budget(l, sh, n)
        s = sh.sum(dim=0)                                                              # (P,)
        r, order = ranks_desc(s)
        self.ranks[l], self.orders[l], self.scores[l] = r, order, s
        kk = self.k - self.w if P > self.k - self.w else P
        self.kk, self.n_rows = kk, n
        self.orig_np = R.cur_orig.cpu().numpy()
        rec = {"layer": l, "top": sorted(int(self.orig_np[i]) for i in order[:kk]),
               "bnd": boundary(s, order, kk, self.orig_np)}
        if l >= self.L_min:
            U = sorted(set(int(i) for j in range(l - self.L_obs + 1, l + 1) for i in self.orders[j][:kk]))
            var = asl_variance([self.ranks[j] for j in range(l - self.L_obs + 1, l + 1)], np.asarray(U))
            if l == self.L_min:
                require(var > 0, "ASL var0 is zero")
                self.var0 = var
                ratio = 1.0
            else:
                ratio = var / self.var0
            rec.update(var=f9(var), ratio=f9(ratio), U_size=len(U))
            if ratio < self.tau:
                self.sel_layer = l
                self.selected_rows = sorted(set(int(i) for i in order[:kk]) | set(range(P, n)))
        self.layers_out.append(rec)

    def fallback(self):
        """Two-pass with no selection: last layer's top-kk + window."""
        last = max(self.orders)
        order = self.orders[last]
        P = self.n_rows - self.w
        return last, sorted(set(int(i) for i in order[: self.kk]) | set(range(P, self.n_rows)))

    def after_layer(self, l):
        if self.sel_layer == l:
            return STOP if self.two_pass else self.selected_rows
        return None


class TokenSelectPolicy(FullPolicy):
    def __init__(self, R, n_init, n_local, k, chunk, head_map="div", pool_kernel=0,
                 prefill_mode="chunked", cache_theta=None, debug_at=()):
        super().__init__(R)
        require(head_map in ("div", "mod"), "head_map")
        require(prefill_mode in ("chunked", "dense"), "prefill_mode")
        require(chunk <= n_init + k + n_local,
                "chunk must not exceed n_init+k+n_local (a chunk's first query would see no key)")
        self.n_init, self.n_local, self.k, self.chunk = n_init, n_local, k, chunk
        self.head_map, self.pool_kernel, self.prefill_mode = head_map, pool_kernel, prefill_mode
        self.theta = cache_theta
        self.cache = [None] * R.L             # (fp_flat, sel) per layer
        self.prefill_out = []                 # per chunk: {"start","end","layers":[...]}
        self.decode_out = []                  # per step: {"N","layers":[...]}
        self.debug_at = set(debug_at)         # {("prefill", chunk, layer) | ("decode", step, layer)}
        self.debug_out = []
        self.cos_seen = []                    # all cosines compared with theta

    def begin_decode(self, s, token):
        super().begin_decode(s, token)
        self.decode_out.append({"step": s, "token": int(token), "layers": []})

    def _select(self, l, qpre, N, where):
        """-> (gathered row indices (LongTensor), record dict)."""
        R = self.R
        dev = R.device
        if self.n_init + self.k + self.n_local >= N:
            return torch.arange(N, device=dev), {"dense": True}
        qo = qpre.shape[1]
        fp = R.rope(qpre, torch.arange(self.n_local, self.n_local + qo)).mean(dim=1)     # (H, d)
        rec = {"dense": False}
        sel = None
        st = self.kv[l]
        if self.theta is not None and where[0] == "decode":
            c = self.cache[l]
            if c is None:
                rec["cache"] = {"first": True, "hit": False}
            else:
                cos = float(F.cosine_similarity(fp.reshape(-1), c[0], dim=0))
                self.cos_seen.append(cos)
                hit = cos >= self.theta
                rec["cache"] = {"first": False, "hit": bool(hit), "cos": f9(cos)}
                if hit:
                    sel = c[1]
        if sel is None:
            cand = st.kpre[:, self.n_init: N - self.n_local]                              # (Hkv, C, d)
            vote = ts_vote(fp, cand, self.head_map, R.Hkv)
            pooled = pool1d(vote[None], self.pool_kernel, "max")[0] if self.pool_kernel > 1 else vote
            top, order = topk_lower(pooled, self.k)
            sel = sorted(int(i) + self.n_init for i in top)
            rec["bnd"] = boundary(pooled, order, self.k, np.arange(self.n_init, N - self.n_local))
            if (where[0], where[1], l) in self.debug_at:
                d = {"where": where[0], "index": where[1], "layer": l, "N": N, "vote": f9list(vote)}
                if self.pool_kernel > 1:
                    d["pooled"] = f9list(pooled)
                self.debug_out.append(d)
            if self.theta is not None and where[0] == "decode":
                self.cache[l] = (fp.reshape(-1).clone(), sel)
        rec["sel"] = list(sel)
        G = list(range(self.n_init)) + list(sel) + list(range(N - self.n_local, N))
        return torch.as_tensor(G, dtype=torch.long, device=dev), rec

    def _attend_gathered(self, qpre, G):
        R = self.R
        st = self.kv[self.cur_layer]
        kv_len, qo = G.numel(), qpre.shape[1]
        require(kv_len >= qo, "gathered list shorter than the chunk")
        kr = R.rope(st.kpre[:, G], torch.arange(kv_len))
        qr = R.rope(qpre, torch.arange(kv_len - qo, kv_len))
        j = torch.arange(kv_len, device=R.device)[None, :]
        i = torch.arange(qo, device=R.device)[:, None]
        allow = (j <= (kv_len - qo + i))[None]
        return R.attend(qr, kr, st.v[:, G], allow)

    def prefill(self, l, q, k, v, qp, kp):
        R = self.R
        n = q.shape[1]
        require(bool((R.cur_pos == torch.arange(n, device=R.device)).all()),
                "tokenselect prefill expects rows 0..n-1")
        self.kv[l] = KV(k, v, kp, R.cur_pos, R.cur_orig)
        self.cur_layer = l
        if self.prefill_mode == "dense":
            return R.causal(q, k, v)
        out = torch.empty_like(q)
        for c, s in enumerate(range(0, n, self.chunk)):
            e = min(n, s + self.chunk)
            if l == 0:
                self.prefill_out.append({"chunk": c, "start": s, "end": e, "layers": []})
            G, rec = self._select(l, qp[:, s:e], e, ("prefill", c))
            self.prefill_out[c]["layers"].append(rec)
            out[:, s:e] = self._attend_gathered(qp[:, s:e], G)
        return out

    def decode(self, l, q, k, v, qp, kp):
        R = self.R
        st = self.kv[l]
        st.append(k, v, kp, R.cur_pos, R.cur_orig)
        self.cur_layer = l
        N = st.n
        G, rec = self._select(l, qp, N, ("decode", self.step))
        rec["N"] = N
        self.decode_out[-1]["layers"].append(rec)
        return self._attend_gathered(qp, G)


# =========================================================================================
# Cases
# =========================================================================================

def close_logits(a_list, b_list):
    worst = 0.0
    for a, b in zip(a_list, b_list):
        scale = max(1.0, float(b.abs().max()))
        worst = max(worst, float((a.float().cpu() - b.float().cpu()).abs().max()) / scale)
    return worst


class ModelCase:
    """A loaded model (driven + reference instances) with its prompt and parameter choices."""

    def __init__(self, name, meta, driven, reference, prompt, plan, device):
        self.name, self.meta, self.plan = name, meta, plan
        self.R = Runner(driven, device)
        self.ref = reference
        self.prompt = list(prompt)
        self.device = device
        self.full = None


def common(mc, policy, variant, params, gen, full_tokens):
    return {
        "version": FIXTURE_VERSION,
        "generator": GENERATOR,
        "regenerate": REGENERATE,
        "case": "%s/%s/%s" % (mc.name, policy, variant),
        "policy": policy,
        "variant": variant,
        "params": params,
        "model": mc.meta,
        "prompt_ids": list(mc.prompt),
        "n_prompt": len(mc.prompt),
        "n_new": N_NEW,
        "generated_ids": gen["tokens"],
        "step_margins": gen["margins"],
        "first_logits_top5": gen["first_top"],
        "full_generated_ids": list(full_tokens),
        "modelling": MODELLING["common"] + " " + MODELLING[policy],
    }


def hf_reference(mc, tokens):
    """HF's own forward (its attention, its causal mask), no KV cache: logits at the prefill and
    at each step s given prompt + tokens[:s]."""
    out = []
    seq = list(mc.prompt)
    for s in range(len(tokens)):
        ids = torch.tensor([seq], dtype=torch.long, device=mc.device)
        lg = mc.ref(input_ids=ids, use_cache=False).logits[0, -1].float()
        out.append(lg)
        seq.append(tokens[s])
    return out


def check_invariant(mc, label, gen, inv_log):
    full = mc.full
    err = close_logits(gen["logits"], full["logits"])
    same = gen["tokens"] == full["tokens"]
    inv_log.append({"model": mc.name, "check": label, "tokens_equal": same, "max_rel_logit_diff": f9(err)})
    require(same and err <= INV_TOL,
            "%s/%s: budget >= n must equal full attention (tokens equal %s, logit diff %.3g)"
            % (mc.name, label, same, err))


def run_full(mc, inv_log):
    R = mc.R
    gen = generate(R, FullPolicy(R), mc.prompt)
    mc.full = gen
    ref = hf_reference(mc, gen["tokens"])
    err = close_logits(gen["logits"], ref)
    ref_tokens = [argmax_lower(x) for x in ref]
    ok_tokens = all(a == b or m < 1e-3 for a, b, m in zip(gen["tokens"], ref_tokens, gen["margins"]))
    inv_log.append({"model": mc.name, "check": "driver(full) vs HF model(input_ids) eager",
                    "tokens_equal": gen["tokens"] == ref_tokens, "max_rel_logit_diff": f9(err)})
    require(err <= HF_TOL and ok_tokens,
            "%s: driver full attention differs from HF's own forward (rel logit diff %.3g, tokens %s vs %s)"
            % (mc.name, err, gen["tokens"], ref_tokens))
    d = common(mc, "full", "base", {}, gen, gen["tokens"])
    d["prefill_logits"] = f9list(gen["logits"][0])
    d["hf_max_rel_logit_diff"] = f9(err)
    return [("full", "base", d)]


def run_streaming(mc, inv_log):
    R, P = mc.R, mc.plan
    out = []
    for rolling in (False, True):
        pol = StreamingPolicy(R, P["B"], 4, rolling)
        gen = generate(R, pol, mc.prompt)
        n = len(mc.prompt)
        params = {"budget": P["B"], "sinks": 4, "rolling": rolling}
        d = common(mc, "streamingllm", "b%d%s" % (P["B"], "_rolling" if rolling else ""), params, gen,
                   mc.full["tokens"])
        kept = ints(torch.nonzero(pol._mask(n)[0]).view(-1)) if pol.compressed else None
        d["kept"] = {"compressed": pol.compressed, "same_for_all_layers": True, "positions": kept}
        if rolling:
            d["decode_kept"] = [{"step": s, "positions": p} for s, p in enumerate(pol.decode_kept)]
            d["decode_kept_note"] = ("positions resident and attended at each decode step (all layers "
                                     "alike), the new token's own row included; null = no eviction yet")
        out.append(("streamingllm", d["variant"], d))
    n = len(mc.prompt)
    for B in (n, n + 16):
        gen = generate(R, StreamingPolicy(R, B, 4, False), mc.prompt)
        check_invariant(mc, "streamingllm budget=%d (n=%d)" % (B, n), gen, inv_log)
    return out


def run_snapkv(mc, inv_log):
    R, P = mc.R, mc.plan
    score_layers = sorted(set([0, R.L // 2, R.L - 1]))
    out = []
    for (B, w, kern, pool, pqh) in P["snapkv"]:
        pol = SnapKVPolicy(R, B, w, kern, pool, pqh, score_layers)
        gen = generate(R, pol, mc.prompt)
        variant = "w%d_k%d_%s_b%d%s" % (w, kern, pool, B, "_pqh" if pqh else "")
        params = {"budget": B, "window": w, "kernel": kern, "pool": pool,
                  "granularity": "query_head" if pqh else "kv_head",
                  "compress_when": "n >= budget"}
        d = common(mc, "snapkv", variant, params, gen, mc.full["tokens"])
        d["kept"] = {"granularity": params["granularity"],
                     "layers": [dict(layer=l, **rec) for l, rec in enumerate(pol.layers_out)]}
        d["scores"] = {"what": "pooled window scores over prefix positions 0..n-w-1, per cache head "
                               "(kv_head: group-summed after pooling), float32",
                       "layers": pol.scores_out}
        for rec in pol.layers_out:
            if rec["compressed"]:
                for h in rec["heads"]:
                    require(len(h) == B and h == sorted(set(h)), "snapkv kept list malformed")
        out.append(("snapkv", variant, d))
    n = len(mc.prompt)
    for B in (n, n + 5):
        B0, w, kern, pool, pqh = P["snapkv"][0]
        gen = generate(R, SnapKVPolicy(R, B, w, kern, pool, pqh), mc.prompt)
        check_invariant(mc, "snapkv budget=%d (n=%d)" % (B, n), gen, inv_log)
    return out


def run_gemfilter(mc, inv_log):
    R, P = mc.R, mc.plan
    out = []
    n = len(mc.prompt)
    for (r, k) in P["gemfilter"] + [(P["gemfilter"][0][0], n)]:
        pol = GemFilterPolicy(R, r, k)
        require(generate(R, pol, mc.prompt) is None, "gemfilter pass 1 did not stop at r")
        sel = pol.out["selected"]
        ids2 = [mc.prompt[i] for i in sel]
        gen = generate(R, FullPolicy(R), ids2)
        if k >= n:
            check_invariant(mc, "gemfilter k=%d (n=%d)" % (k, n), gen, inv_log)
            continue
        params = {"filter_layer": r, "k": k, "kernel": 5, "pool": "avg", "count_include_pad": True,
                  "score": "sum over H heads of q_last . K, raw", "sorted": True}
        d = common(mc, "gemfilter", "r%d_k%d" % (r, k), params, gen, mc.full["tokens"])
        d["filter_layer"] = r
        d["score_raw"] = pol.out["score_raw"]
        d["score_pooled"] = pol.out["score_pooled"]
        d["selected"] = sel
        d["bnd"] = pol.out["bnd"]
        d["pass2"] = {"ids": ids2, "positions": "0..k-1", "decode_first_position": len(ids2)}
        require(len(sel) == min(k, n), "gemfilter selection size")
        out.append(("gemfilter", d["variant"], d))
    return out


def run_fastkv(mc, inv_log):
    R, P = mc.R, mc.plan
    out = []
    score_layers = sorted(set([0, P["fastkv_t"], P["fastkv_t"] + 1, R.L - 1]))
    t = P["fastkv_t"]
    cfgs = [("prop_t%d" % t, dict(mode="proportional", t=t, w=8, kernel=7, pool="max",
                                   tsp_rate=0.2, retain_rate=0.1)),
            ("abs_t%d" % t, dict(mode="absolute", t=t, w=8, kernel=7, pool="avg",
                                  tsp_len=P["fastkv_abs"][0], capacity=P["fastkv_abs"][1]))]
    for variant, kw in cfgs:
        pol = FastKVPolicy(R, score_layers=score_layers, **kw)
        gen = generate(R, pol, mc.prompt)
        params = dict(kw)
        params["tsp_layer"] = params.pop("t")
        d = common(mc, "fastkv", variant, params, gen, mc.full["tokens"])
        d["layers"] = [dict(layer=l, **rec) for l, rec in enumerate(pol.layers_out)]
        d["tsp"] = pol.tsp_out
        d["scores"] = {"what": "pooled window scores over the active rows' prefix (active row order), "
                               "group-summed per KV head, float32", "layers": pol.scores_out}
        require(pol.tsp_out["propagated"], "fastkv fixture did not propagate (params too loose)")
        out.append(("fastkv", variant, d))
    n = len(mc.prompt)
    gen = generate(R, FastKVPolicy(R, "absolute", t, 8, 7, "avg", tsp_len=n // 2, capacity=n + 1), mc.prompt)
    check_invariant(mc, "fastkv capacity=n+1 (n=%d)" % n, gen, inv_log)
    return out


def asl_run(mc, params, two_pass, kv_score_layers=()):
    R = mc.R
    pol = ASLPolicy(R, params["L_min"], params["L_obs"], params["tau"], params["k"], params["w"],
                    params["kernel"], params["pool"], two_pass, params.get("kv_budget", 0), kv_score_layers)
    g1 = generate(R, pol, mc.prompt)
    info = {"selection_layer": pol.sel_layer, "fallback": False}
    if two_pass:
        if pol.sel_layer is None:
            require(g1 is not None, "asl two-pass: pass 1 stopped without a selection")
            last, rows = pol.fallback()
            info.update(fallback=True, fallback_layer=last)
        else:
            require(g1 is None, "asl two-pass: pass 1 did not stop at the selection layer")
            rows = pol.selected_rows
        sel = [int(pol.orig_np[i]) for i in rows]
        ids2 = [mc.prompt[i] for i in sel]
        gen = generate(R, FullPolicy(R), ids2)
        info["pass2"] = {"ids": ids2, "positions": "0..k'-1", "decode_first_position": len(ids2)}
    else:
        gen = g1
        sel = [int(pol.orig_np[i]) for i in pol.selected_rows] if pol.sel_layer is not None else None
    info["selected"] = sel
    return pol, gen, info


def run_asl(mc, inv_log):
    R, P = mc.R, mc.plan
    base = dict(P["asl"])
    base.update(w=32, kernel=7, pool="avg")
    # Probe (tau = -1 never selects, L_min = L_obs - 1): var_l of every layer. var_l does not depend
    # on L_min, so the ratios for any L_min follow; pick an L_min (the planned one if possible) and
    # a tau that select a layer strictly between L_min and the last layer with a clear margin.
    probe, _, _ = asl_run(mc, dict(base, L_min=base["L_obs"] - 1, tau=-1.0), False)
    var = {rec["layer"]: rec["var"] for rec in probe.layers_out if "var" in rec}

    def find_target(Lm, last_ok):
        best = 1.0
        for l in range(Lm + 1, R.L if last_ok else R.L - 1):
            rt = var[l] / var[Lm]
            if rt < best * 0.97:
                return l, round((rt + best) / 2, 6)
            best = min(best, rt)
        return None

    order = sorted(range(base["L_obs"] - 1, R.L - 2), key=lambda x: (abs(x - base["L_min"]), x))
    adapt = None
    for last_ok in (False, True):
        for Lm in order:
            tgt = find_target(Lm, last_ok)
            if tgt is not None:
                adapt = (Lm, tgt[0], tgt[1])
                break
        if adapt is not None:
            break
    taus = []
    if adapt is not None:
        taus.append(("adaptive", adapt[2], adapt[0], adapt[1]))
    taus += [("taugt1", 1.5, base["L_min"], base["L_min"]), ("never", 0.0, base["L_min"], None)]
    out = []
    for tname, tau, L_min, target in taus:
        for two_pass in (False, True):
            params = dict(base, L_min=L_min, tau=tau, variant="two_pass" if two_pass else "one_pass")
            pol, gen, info = asl_run(mc, params, two_pass)
            require(pol.sel_layer == target, "asl %s: tau %g selected layer %r, wanted %r"
                    % (tname, tau, pol.sel_layer, target))
            if tname == "never":
                require(pol.sel_layer is None, "asl tau=0 selected a layer")
                if not two_pass:
                    check_invariant(mc, "asl one-pass with no selection (tau=0)", gen, inv_log)
            variant = "%s_%s" % (tname, "2pass" if two_pass else "1pass")
            d = common(mc, "asl", variant, params, gen, mc.full["tokens"])
            d["layers"] = pol.layers_out
            d["var0"] = f9(pol.var0) if pol.var0 is not None else None
            d["kk"] = pol.kk
            d.update(info)
            sl = pol.sel_layer if pol.sel_layer is not None else (info.get("fallback_layer"))
            if sl is not None:
                d["score_at_layer"] = {"layer": sl, "s": f9list(pol.scores[sl])}
            if tname == "adaptive":
                d["tau_choice"] = ("L_min and tau chosen from a probe run (tau=-1) so that a layer strictly "
                                   "between L_min and the last layer is selected: tau is halfway between "
                                   "its ratio and the lowest ratio before it (1 at L_min)%s"
                                   % ("" if adapt[1] < R.L - 1 else "; only the last layer qualified"))
            out.append(("asl", variant, d))

    # KV budget (kv_budget, the reference's cache_k), one pass, tau 1.5 (selects L_min, so most
    # layers run on the propagated rows); B = (k + w) // 2 lies between w and the k propagated
    # rows, so every layer compresses, those after the selection layer included.
    n = len(mc.prompt)
    kb = (base["k"] + base["w"]) // 2
    sl = base["L_min"]
    params = dict(base, L_min=sl, tau=1.5, kv_budget=kb, variant="one_pass")
    score_layers = sorted(set([min(sl + 1, R.L - 1), R.L - 1]))
    pol, gen, info = asl_run(mc, params, False, score_layers)
    require(pol.sel_layer == sl, "asl kv_budget: tau 1.5 selected layer %r, wanted %d" % (pol.sel_layer, sl))
    require(len(info["selected"]) > kb, "asl kv_budget: %d rows propagated, not more than the budget %d"
            % (len(info["selected"]), kb))
    for l, rec in enumerate(pol.kv_out):
        require(rec is not None and rec["compressed"], "asl kv_budget: layer %d did not compress" % l)
        require(rec["n_active"] == (n if l <= sl else len(info["selected"])), "asl kv_budget: layer %d rows" % l)
        for hl in rec["heads"]:
            require(len(hl) == kb and hl == sorted(set(hl)), "asl kv_budget: layer %d kept list" % l)
            require(l <= sl or set(hl) <= set(info["selected"]), "asl kv_budget: layer %d keeps a pruned row" % l)
    variant = "taugt1_1pass_kv%d" % kb
    d = common(mc, "asl", variant, params, gen, mc.full["tokens"])
    d["layers"] = pol.layers_out
    d["var0"] = f9(pol.var0) if pol.var0 is not None else None
    d["kk"] = pol.kk
    d.update(info)
    d["score_at_layer"] = {"layer": sl, "s": f9list(pol.scores[sl])}
    d["kv"] = {"budget": kb, "layers": pol.kv_out,
               "scores": {"what": "pooled window scores over the active rows' prefix (active row order), "
                                  "group-summed per KV head, float32", "layers": pol.kv_scores}}
    out.append(("asl", variant, d))
    # the budget never bites (kv_budget = n, no selection): exactly full attention
    gen = asl_run(mc, dict(base, L_min=sl, tau=0.0, kv_budget=n), False)[1]
    check_invariant(mc, "asl one-pass kv_budget=n (n=%d), no selection" % n, gen, inv_log)
    return out


def run_tokenselect(mc, inv_log):
    R, P = mc.R, mc.plan
    ts = P["tokenselect"]
    n = len(mc.prompt)
    n_chunks = (n + ts["chunk"] - 1) // ts["chunk"]
    debug_at = {("prefill", n_chunks - 1, 0), ("prefill", n_chunks - 1, R.L - 1), ("decode", 0, 1)}
    out = []

    debug_all = set(debug_at) | {("prefill", n_chunks - 1, l) for l in range(R.L)} | \
        {("decode", 0, l) for l in range(R.L)}

    def one(variant, extra):
        kw = dict(ts)
        kw.update(extra)
        pol = TokenSelectPolicy(R, debug_at=debug_all if variant == "base" else debug_at, **kw)
        gen = generate(R, pol, mc.prompt)
        params = {"n_init": kw["n_init"], "n_local": kw["n_local"], "k": kw["k"], "chunk": kw["chunk"],
                  "head_map": kw.get("head_map", "div"), "pool_kernel": kw.get("pool_kernel", 0),
                  "pool": "max" if kw.get("pool_kernel", 0) > 1 else "none",
                  "prefill_mode": kw.get("prefill_mode", "chunked"),
                  "selection_cache": kw.get("cache_theta") is not None,
                  "cache_theta": kw.get("cache_theta"), "cache_scope": "decode",
                  "query_rotate_at": "n_local + i", "renumber": True}
        d = common(mc, "tokenselect", variant, params, gen, mc.full["tokens"])
        d["prefill"] = pol.prefill_out if kw.get("prefill_mode", "chunked") == "chunked" else None
        d["decode"] = pol.decode_out
        d["debug_scores"] = pol.debug_out
        d["attended_rule"] = ("attended rows = [0, n_init) ++ sel ++ [N - n_local, N) (dense: all N); "
                              "gathered key j at RoPE position j; chunk query i at kv_len - qo + i")
        return pol, d

    for variant, extra in [("base", {}), ("mapmod", {"head_map": "mod"}),
                           ("denseprefill", {"prefill_mode": "dense"}), ("pool3", {"pool_kernel": 3})]:
        pol, d = one(variant, extra)
        out.append(("tokenselect", variant, d))

    # selection cache: theta from a probe that always recomputes (theta = +inf)
    probe, _ = one("probe", {"cache_theta": float("inf")})
    cs = sorted(probe.cos_seen)
    require(len(cs) >= 4, "tokenselect probe saw too few cosines")
    med = cs[len(cs) // 2]
    mids = sorted(((a + b) / 2 for a, b in zip(cs, cs[1:]) if b - a > 4e-3), key=lambda x: abs(x - med))
    chosen = None
    for theta in mids[:40]:
        theta = round(theta, 4)
        pol, d = one("cache", {"cache_theta": theta})
        evals = [rec["cache"] for st in pol.decode_out for rec in st["layers"]
                 if "cache" in rec and not rec["cache"]["first"]]
        hits = sum(1 for c in evals if c["hit"])
        gap = min((abs(c["cos"] - theta) for c in evals), default=0.0)
        if hits >= 1 and hits < len(evals) and gap >= 1e-3:
            d["theta_choice"] = ("theta picked from the probe's cosines so that hits and misses both "
                                 "occur and no cosine is within 1e-3 of theta (min gap %.4g)" % gap)
            chosen = d
            break
    require(chosen is not None, "could not find a selection-cache theta with a clear margin")
    out.append(("tokenselect", "cache", chosen))

    big = n + N_NEW
    pol = TokenSelectPolicy(R, n_init=16, n_local=64, k=big, chunk=ts["chunk"])
    gen = generate(R, pol, mc.prompt)
    check_invariant(mc, "tokenselect n_init+k+n_local >= n+new (always dense)", gen, inv_log)
    return out


RUNNERS = [("full", run_full), ("streamingllm", run_streaming), ("snapkv", run_snapkv),
           ("gemfilter", run_gemfilter), ("fastkv", run_fastkv), ("asl", run_asl),
           ("tokenselect", run_tokenselect)]


def plan_for(L, n):
    """Parameters that make every budget bite on an n-token prompt for an L-layer model."""
    B = 128 if n >= 700 else 64
    mid = max(1, (L - 1) // 2)
    return {
        "B": B,
        "snapkv": [(B, 8, 7, "max", False), (2 * B, 32, 7, "max", False),
                   (2 * B, 32, 5, "avg", False), (B, 8, 7, "max", True)],
        "gemfilter": [(mid, B)],
        "fastkv_t": mid,
        "fastkv_abs": (max(2 * B, n // 4), B // 2 if B >= 96 else 48),
        "asl": {"L_min": max(mid - 1, 3) if L >= 8 else 1,
                "L_obs": 4 if L >= 8 else 2,
                "k": 2 * B if n >= 700 else 96},
        "tokenselect": {"n_init": 16, "n_local": 64, "k": 48, "chunk": 64},
    }


def case_note(d):
    """One line for the summary: what the case exercised."""
    p = d["policy"]
    bnds = []

    def walk(x):
        if isinstance(x, dict):
            if "exact_tie" in x and "rel_gap" in x:
                bnds.append(x)
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)
    walk(d)
    note = "boundaries %d (exact ties %d, near ties %d)" % (
        len(bnds), sum(1 for b in bnds if b["exact_tie"]), sum(1 for b in bnds if b["near_tie"]))
    if p == "asl":
        note = "selection_layer %s%s%s; " % (d["selection_layer"], " (fallback %s)" % d.get("fallback_layer")
                                              if d.get("fallback") else "",
                                              ", kv_budget %d" % d["kv"]["budget"] if d.get("kv") else "") + note
    elif p == "fastkv":
        note = "tsp_len %s; " % d["tsp"].get("tsp_len") + note
    elif p == "tokenselect" and d["params"]["selection_cache"]:
        ev = [r["cache"] for st in d["decode"] for r in st["layers"] if "cache" in r and not r["cache"]["first"]]
        note = "cache hits %d/%d (theta %s); " % (sum(1 for c in ev if c["hit"]), len(ev),
                                                d["params"]["cache_theta"]) + note
    margins = d.get("step_margins") or []
    if margins and min(margins) < 1e-3:
        note += "; SMALL greedy margin %.2g" % min(margins)
    return note


def run_model(mc, outdir, only_policies, inv_log):
    files = []
    t0 = time.time()
    for pname, fn in RUNNERS:
        if pname != "full" and only_policies and pname not in only_policies:
            continue
        t1 = time.time()
        res = fn(mc, inv_log)
        for policy, variant, d in res:
            rel = os.path.join("cases", mc.name, policy, variant + ".json")
            path = os.path.join(outdir, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(dump_json(d) + "\n")
            files.append({"file": rel, "model": mc.name, "policy": policy, "variant": variant,
                          "generated_ids": d["generated_ids"], "note": case_note(d),
                          "sha256": sha256_file(path), "bytes": os.path.getsize(path)})
        print("  %-13s %2d case(s) %6.1fs" % (pname, len(res), time.time() - t1), flush=True)
    print("  %s done in %.1fs" % (mc.name, time.time() - t0), flush=True)
    return files


# =========================================================================================
# Models (transformers)
# =========================================================================================

RANDOM_SPECS = [
    dict(name="llama12_gqa", arch="llama", cls=("LlamaConfig", "LlamaForCausalLM"), hidden=64, layers=12,
         heads=8, kv_heads=2, inter=96, vocab=256, tied=False, theta=10000.0, eps=1e-5, max_pos=4096,
         seed=1234, prompt_len=1024, prompt_seed=11,
         desc="random llama, 12 layers, hidden 64, 8 heads / 2 KV heads (GQA 4:1), head_dim 8, untied"),
    dict(name="qwen2_12_bias", arch="qwen2", cls=("Qwen2Config", "Qwen2ForCausalLM"), hidden=64, layers=12,
         heads=8, kv_heads=2, inter=96, vocab=256, tied=True, theta=1000000.0, eps=1e-6, max_pos=4096,
         seed=4321, prompt_len=777, prompt_seed=22,
         desc="random qwen2 (q/k/v biases), 12 layers, hidden 64, 8 heads / 2 KV heads, tied"),
]
STORIES_PROMPT_LEN = 448
STORIES_SEED = 33


def tf_version_tuple(T):
    out = []
    for p in T.__version__.split("+")[0].split(".")[:3]:
        num = "".join(ch for ch in p if ch.isdigit()) or "0"
        out.append(int(num))
    while len(out) < 3:
        out.append(0)
    return tuple(out)


def build_config(T, spec):
    v5 = tf_version_tuple(T) >= (5, 0, 0)
    kw = dict(vocab_size=spec["vocab"], hidden_size=spec["hidden"], intermediate_size=spec["inter"],
              num_hidden_layers=spec["layers"], num_attention_heads=spec["heads"],
              num_key_value_heads=spec["kv_heads"], hidden_act="silu",
              max_position_embeddings=spec["max_pos"], rms_norm_eps=spec["eps"],
              tie_word_embeddings=spec["tied"], use_cache=True, bos_token_id=None, eos_token_id=None,
              pad_token_id=None, attention_dropout=0.0)
    if v5:
        kw["rope_parameters"] = {"rope_type": "default", "rope_theta": spec["theta"]}
    else:
        kw["rope_theta"] = spec["theta"]
        kw["rope_scaling"] = None
    if spec["arch"] == "llama":
        kw.update(attention_bias=False, mlp_bias=False, head_dim=spec["hidden"] // spec["heads"])
    else:
        kw.update(use_sliding_window=False, sliding_window=None)
    return getattr(T, spec["cls"][0])(**kw)


def reinit(model, seed, hidden):
    """Every parameter random and never zero: norms 1 +- 0.2, biases 0.2 N(0,1), embeddings
    scaled for logits of a few units, matrices for unit-scale activations."""
    gen = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        r = torch.randn(tuple(p.shape), generator=gen, dtype=torch.float32)
        if name.endswith(".bias"):
            vals = 0.2 * r
        elif p.dim() == 1:
            vals = 1.0 + 0.2 * r
        elif "embed_tokens" in name or name.startswith("lm_head"):
            vals = r * (2.0 / math.sqrt(hidden))
        else:
            vals = r / math.sqrt(p.shape[1])
        p.data.copy_(vals.to(p.dtype))


def load_hf(T, cls_name, path, device):
    cls = getattr(T, cls_name)
    dkw = "dtype" if tf_version_tuple(T) >= (4, 56, 0) else "torch_dtype"
    m = cls.from_pretrained(path, **{dkw: torch.float32, "attn_implementation": "eager"})
    m.eval()
    for n_, p in m.named_parameters():
        require(p.dtype == torch.float32, "parameter %s is %s" % (n_, p.dtype))
    return m.to(device)


def model_meta(name, model, arch, rel_dir, weights_path, desc, extra=None):
    cfg = model.config
    H = int(cfg.num_attention_heads)
    hd = getattr(cfg, "head_dim", None)
    rp = getattr(cfg, "rope_parameters", None)
    theta = (rp or {}).get("rope_theta") if isinstance(rp, dict) else None
    if theta is None:
        theta = getattr(cfg, "rope_theta", None)
    meta = {"name": name, "arch": arch, "dir": rel_dir, "desc": desc,
            "n_layers": int(cfg.num_hidden_layers), "n_heads": H,
            "n_kv_heads": int(cfg.num_key_value_heads), "head_dim": int(hd) if hd else int(cfg.hidden_size) // H,
            "hidden": int(cfg.hidden_size), "vocab": int(cfg.vocab_size),
            "rope_theta": float(theta) if theta is not None else None,
            "tie_word_embeddings": bool(getattr(cfg, "tie_word_embeddings", False)),
            "weights_sha256": sha256_file(weights_path) if weights_path else None}
    if extra:
        meta.update(extra)
    return meta


def make_models(T, args, device, outdir):
    cases = []
    wanted = set(args.only.split(",")) if args.only else None
    for spec in RANDOM_SPECS:
        if wanted and spec["name"] not in wanted:
            continue
        rel = os.path.join("models", spec["name"])
        path = os.path.join(outdir, rel)
        os.makedirs(path, exist_ok=True)
        torch.manual_seed(spec["seed"])
        m0 = getattr(T, spec["cls"][1])(build_config(T, spec))
        reinit(m0, spec["seed"], spec["hidden"])
        m0.eval()
        m0.save_pretrained(path)
        wfile = os.path.join(path, "model.safetensors")
        require(os.path.exists(wfile), "save_pretrained wrote no model.safetensors in %s" % path)
        with open(wfile, "rb") as f:
            hdr = json.loads(f.read(int.from_bytes(f.read(8), "little")).decode("utf-8"))
        bad = [k_ for k_, v_ in hdr.items() if k_ != "__metadata__" and v_.get("dtype") != "F32"]
        require(not bad, "non-F32 tensors on disk: %s" % bad[:5])
        driven = load_hf(T, spec["cls"][1], path, device)
        ref = load_hf(T, spec["cls"][1], path, device)
        sd0, sd1 = m0.state_dict(), ref.state_dict()
        require(set(sd0) == set(sd1), "reloaded model has other tensors: %s" % sorted(set(sd0) ^ set(sd1))[:5])
        for k_, v_ in sd1.items():
            require(torch.equal(v_.cpu(), sd0[k_].cpu()), "reloaded %s differs from what was saved" % k_)
        gen = torch.Generator().manual_seed(spec["prompt_seed"])
        prompt = torch.randint(0, spec["vocab"], (spec["prompt_len"],), generator=gen).tolist()
        meta = model_meta(spec["name"], ref, spec["arch"], rel, wfile, spec["desc"],
                          {"prompt": "uniform random ids, torch.Generator seed %d" % spec["prompt_seed"]})
        cases.append(ModelCase(spec["name"], meta, driven, ref, prompt,
                               plan_for(spec["layers"], spec["prompt_len"]), device))
    if args.stories and (not wanted or "stories260K" in wanted):
        path = args.stories
        driven = load_hf(T, "LlamaForCausalLM", path, device)
        ref = load_hf(T, "LlamaForCausalLM", path, device)
        gen = torch.Generator().manual_seed(STORIES_SEED)
        seq = [1]
        vocab = int(ref.config.vocab_size)
        while len(seq) < STORIES_PROMPT_LEN:       # sample a story from the model itself (T = 1)
            lg = ref(input_ids=torch.tensor([seq], device=device), use_cache=False).logits[0, -1].float().cpu()
            lg[:3] = float("-inf")                # no pad/bos/eos inside the prompt
            seq.append(int(torch.multinomial(torch.softmax(lg, -1), 1, generator=gen)))
        wfile = os.path.join(path, "model.safetensors")
        meta = model_meta("stories260K", ref, "llama", "stories260K", wfile if os.path.exists(wfile) else None,
                          "stories260K (shared/models/stories260K; the engine's copy in .data/stories260K)",
                          {"prompt": "BOS + %d tokens sampled from the model (T=1, ids 0-2 excluded), "
                                     "torch.Generator seed %d" % (STORIES_PROMPT_LEN - 1, STORIES_SEED),
                           "vocab": vocab})
        cases.append(ModelCase("stories260K", meta, driven, ref, seq,
                               plan_for(int(ref.config.num_hidden_layers), len(seq)), device))
    elif not args.stories and (not wanted or "stories260K" in wanted):
        print("warning: no --stories PATH given: stories260K fixtures skipped", file=sys.stderr)
    return cases


# =========================================================================================
# Main
# =========================================================================================

def write_all(cases, outdir, only_policies, env):
    inv_log, files = [], []
    for mc in cases:
        print("model %s: %d layers, H %d, Hkv %d, d %d, n %d" % (mc.name, mc.R.L, mc.R.H, mc.R.Hkv,
                                                                 mc.R.d, len(mc.prompt)), flush=True)
        files += run_model(mc, outdir, only_policies, inv_log)
    manifest = {"version": FIXTURE_VERSION, "generator": GENERATOR, "regenerate": REGENERATE,
                "env": env, "n_new": N_NEW, "near_tie_rel": NEAR_TIE_REL,
                "models": {mc.name: mc.meta for mc in cases}, "cases": files,
                "invariant_checks": inv_log, "modelling": MODELLING}
    with open(os.path.join(outdir, "manifest.json"), "w") as f:
        f.write(dump_json(manifest) + "\n")
    return manifest


def make_tar(outdir, name="policy_fixtures.tar.gz"):
    """Deterministic tar.gz (sorted members, zero mtimes and ids) of manifest.json, cases/, models/."""
    import gzip
    tpath = os.path.join(outdir, name)
    paths = ["manifest.json"]
    for top in ("cases", "models"):
        for root, dirs, fs in os.walk(os.path.join(outdir, top)):
            dirs.sort()
            for f in sorted(fs):
                paths.append(os.path.relpath(os.path.join(root, f), outdir))
    with open(tpath, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=9, mtime=0) as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for rel in sorted(paths):
            full = os.path.join(outdir, rel)
            ti = tarfile.TarInfo(rel.replace(os.sep, "/"))
            ti.size, ti.mtime, ti.mode, ti.uid, ti.gid, ti.uname, ti.gname = \
                os.path.getsize(full), 0, 0o644, 0, 0, "", ""
            with open(full, "rb") as f:
                tar.addfile(ti, f)
    return tpath


def merge_into(fixdir, outdir, manifest, only_policies):
    """Install this run's cases of the policies asked for (all when only_policies is None) into
    an existing fixture tree FIXDIR (tests/fixtures/policies): copy their case files, replace their
    manifest entries (in place, same order), update the invariant checks this run repeated and the
    modelling texts of those policies. Refused unless every model of this run is in FIXDIR's
    manifest with the identical model object (weights_sha256 included) and the same torch /
    transformers / device: FIXDIR's models/ folders are not touched. Returns the files written."""
    mpath = os.path.join(fixdir, "manifest.json")
    with open(mpath) as f:
        old = json.load(f)
    require(old.get("version") == manifest["version"], "%s: fixture version %r, this script writes %r"
            % (mpath, old.get("version"), manifest["version"]))
    for key in ("torch", "transformers", "device"):
        require(old["env"].get(key) == manifest["env"].get(key),
                "--merge: %s %r here, %r in %s: regenerate every fixture instead"
                % (key, manifest["env"].get(key), old["env"].get(key), mpath))
    for name, meta in manifest["models"].items():
        require(name in old["models"], "--merge: model %s is not in %s" % (name, mpath))
        require(json.loads(json.dumps(meta)) == old["models"][name],
                "--merge: model %s differs from the one in %s (weights, prompt or config): regenerate "
                "every fixture instead" % (name, mpath))
    ran = set(manifest["models"])
    pols = set(c["policy"] for c in manifest["cases"]) if only_policies is None else set(only_policies)
    group = lambda c: (c["model"], c["policy"])
    new_by_group = {}
    for c in manifest["cases"]:
        if c["policy"] in pols:
            new_by_group.setdefault(group(c), []).append(c)
    replaced = lambda c: c["model"] in ran and c["policy"] in pols
    cases, done = [], set()
    for c in old["cases"]:
        if not replaced(c):
            cases.append(c)
        elif group(c) not in done:
            done.add(group(c))
            cases += new_by_group.get(group(c), [])
    for g, cs in new_by_group.items():
        if g not in done:
            cases += cs
    stale = sorted(set(c["file"] for c in old["cases"] if replaced(c)) - set(c["file"] for c in cases))
    written = []
    for c in manifest["cases"]:
        if c["policy"] in pols:
            dst = os.path.join(fixdir, c["file"])
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            shutil.copyfile(os.path.join(outdir, c["file"]), dst)
            written.append(c["file"])
    for rel in stale:
        os.remove(os.path.join(fixdir, rel))
        print("merge: removed %s (no longer generated)" % rel)
    inv = list(old["invariant_checks"])
    where = {(c["model"], c["check"]): i for i, c in enumerate(inv)}
    for c in manifest["invariant_checks"]:
        k = (c["model"], c["check"])
        if k in where:
            inv[where[k]] = c
        else:
            where[k] = len(inv)
            inv.append(c)
    old["cases"], old["invariant_checks"] = cases, inv
    for p in pols:
        if p in manifest["modelling"]:
            old["modelling"][p] = manifest["modelling"][p]
    with open(mpath, "w") as f:
        f.write(dump_json(old) + "\n")
    written.append("manifest.json")
    return written


def summary(manifest):
    print("\n%-13s %-12s %-20s %-34s %s" % ("model", "policy", "variant", "generated ids", "note"))
    for c in manifest["cases"]:
        print("%-13s %-12s %-20s %-34s %s" % (c["model"], c["policy"], c["variant"],
                                            ",".join(str(t) for t in c["generated_ids"]), c["note"]))
    print("\ninvariant checks:")
    for c in manifest["invariant_checks"]:
        print("  %-12s %-55s tokens_equal=%s max_rel_logit_diff=%.3g"
              % (c["model"], c["check"], c["tokens_equal"], c["max_rel_logit_diff"]))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="output directory (created)")
    ap.add_argument("--stories", help="HF folder of stories260K")
    ap.add_argument("--only", help="comma list of models: stories260K,llama12_gqa,qwen2_12_bias")
    ap.add_argument("--policies", help="comma list of policies (full always runs)")
    ap.add_argument("--device", default="cpu", help="torch device (default cpu: reproducible)")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch default)")
    ap.add_argument("--merge", metavar="FIXDIR",
                    help="after a successful run, install the cases of --policies (e.g. asl) into the "
                         "fixture tree FIXDIR (tests/fixtures/policies): case files + manifest entries; "
                         "refused unless its models and torch/transformers versions are the same")
    ap.add_argument("--selftest", action="store_true",
                    help="CPU self-test on built-in fake HF-like models (keeps its output in --out if given)")
    args = ap.parse_args(argv)
    torch.set_grad_enabled(False)
    if args.threads:
        torch.set_num_threads(args.threads)
    if hasattr(torch.backends, "cuda"):
        torch.backends.cuda.matmul.allow_tf32 = False
    if hasattr(torch.backends, "cudnn"):
        torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    if args.selftest:
        return selftest(args.out)
    if not args.out:
        ap.error("--out DIR is required")
    import transformers as T
    device = torch.device(args.device)
    outdir = os.path.abspath(args.out)
    os.makedirs(outdir, exist_ok=True)
    only_policies = set(args.policies.split(",")) if args.policies else None
    try:
        cases = make_models(T, args, device, outdir)
        require(cases, "no model to run")
        env = {"torch": torch.__version__, "transformers": T.__version__, "device": str(device),
               "python": sys.version.split()[0]}
        manifest = write_all(cases, outdir, only_policies, env)
    except RefError as e:
        traceback.print_exc()
        print("\nFAILED: %s" % e, file=sys.stderr)
        return 1
    tpath = make_tar(outdir)
    size = os.path.getsize(tpath)
    summary(manifest)
    print("\nwrote %d case files, %s (%d bytes)" % (len(manifest["cases"]), tpath, size))
    if size > SIZE_LIMIT:
        print("FAILED: %s is %d bytes, over the %d limit" % (tpath, size, SIZE_LIMIT), file=sys.stderr)
        return 1
    if args.merge:
        try:
            written = merge_into(os.path.abspath(args.merge), outdir, manifest, only_policies)
        except RefError as e:
            print("FAILED: %s" % e, file=sys.stderr)
            return 1
        print("\nmerged into %s: %s" % (args.merge, ", ".join(written)))
    return 0


# =========================================================================================
# Self-test: fake HF-like models in plain torch (same module layout as transformers' Llama)
# =========================================================================================

def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    """Same contract as transformers' (the self-test's fake attention lives in this module)."""
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


class _FakeRotary(torch.nn.Module):
    def __init__(self, d, theta):
        super().__init__()
        self.inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d))

    def forward(self, x, position_ids):
        f = (self.inv_freq[None, :, None] @ position_ids[:, None, :].float()).transpose(1, 2)
        emb = torch.cat((f, f), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


class _FakeNorm(torch.nn.Module):
    def __init__(self, n, eps=1e-5):
        super().__init__()
        self.weight = torch.nn.Parameter(1.0 + 0.2 * torch.randn(n))
        self.eps = eps

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


class _FakeAttn(torch.nn.Module):
    def __init__(self, c, l, bias):
        super().__init__()
        self.layer_idx, self.H, self.Hkv, self.d = l, c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.scaling = self.d ** -0.5
        D = c.hidden_size
        self.q_proj = torch.nn.Linear(D, self.H * self.d, bias=bias)
        self.k_proj = torch.nn.Linear(D, self.Hkv * self.d, bias=bias)
        self.v_proj = torch.nn.Linear(D, self.Hkv * self.d, bias=bias)
        self.o_proj = torch.nn.Linear(self.H * self.d, D, bias=False)

    def forward(self, x, position_embeddings, attention_mask):
        b, m, _ = x.shape
        q = self.q_proj(x).view(b, m, self.H, self.d).transpose(1, 2)
        k = self.k_proj(x).view(b, m, self.Hkv, self.d).transpose(1, 2)
        v = self.v_proj(x).view(b, m, self.Hkv, self.d).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, *position_embeddings)
        g = self.H // self.Hkv
        k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
        w = torch.matmul(q, k.transpose(2, 3)) * self.scaling
        if attention_mask is not None:
            w = w + attention_mask
        p = torch.softmax(w, dim=-1, dtype=torch.float32)
        o = torch.matmul(p, v).transpose(1, 2).reshape(b, m, self.H * self.d)
        return self.o_proj(o)


class _FakeMLP(torch.nn.Module):
    def __init__(self, D, I):
        super().__init__()
        self.gate_proj = torch.nn.Linear(D, I, bias=False)
        self.up_proj = torch.nn.Linear(D, I, bias=False)
        self.down_proj = torch.nn.Linear(I, D, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class _FakeLayer(torch.nn.Module):
    def __init__(self, c, l, bias):
        super().__init__()
        self.input_layernorm = _FakeNorm(c.hidden_size)
        self.self_attn = _FakeAttn(c, l, bias)
        self.post_attention_layernorm = _FakeNorm(c.hidden_size)
        self.mlp = _FakeMLP(c.hidden_size, c.intermediate_size)

    def forward(self, hidden_states, attention_mask=None, position_ids=None, position_embeddings=None, **kw):
        h = hidden_states + self.self_attn(self.input_layernorm(hidden_states), position_embeddings, attention_mask)
        return h + self.mlp(self.post_attention_layernorm(h))


class _FakeCfg:
    def __init__(self, **kw):
        self.__dict__.update(kw)


class _FakeInner(torch.nn.Module):
    def __init__(self, c, bias):
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = torch.nn.ModuleList([_FakeLayer(c, l, bias) for l in range(c.num_hidden_layers)])
        self.norm = _FakeNorm(c.hidden_size)
        self.rotary_emb = _FakeRotary(c.head_dim, c.rope_theta)


class _FakeLM(torch.nn.Module):
    def __init__(self, c, bias):
        super().__init__()
        self.config = c
        self.model = _FakeInner(c, bias)
        self.lm_head = torch.nn.Linear(c.hidden_size, c.vocab_size, bias=False)

    def forward(self, input_ids, use_cache=False):
        x = self.model.embed_tokens(input_ids)
        m = input_ids.shape[1]
        pos = torch.arange(m)[None]
        pe = self.model.rotary_emb(x, pos)
        mask = torch.full((m, m), torch.finfo(torch.float32).min).triu(1)[None, None]
        for layer in self.model.layers:
            x = layer(x, attention_mask=mask, position_ids=pos, position_embeddings=pe)

        class O:
            pass
        o = O()
        o.logits = self.lm_head(self.model.norm(x))
        return o


def _fake_case(name, L, H, Hkv, d, vocab, n, bias, seed):
    torch.manual_seed(seed)
    c = _FakeCfg(num_attention_heads=H, num_key_value_heads=Hkv, head_dim=d, hidden_size=H * d,
                 intermediate_size=2 * H * d, vocab_size=vocab, num_hidden_layers=L, rope_theta=10000.0)
    m = _FakeLM(c, bias).eval()
    with torch.no_grad():
        for nm, p in m.named_parameters():
            if p.dim() == 2:
                s = 2.0 / math.sqrt(H * d) if ("embed" in nm or "lm_head" in nm) else 1.0 / math.sqrt(p.shape[1])
                p.copy_(torch.randn(p.shape) * s)
            elif nm.endswith("bias"):
                p.copy_(0.2 * torch.randn(p.shape))
    prompt = torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed + 1)).tolist()
    meta = {"name": name, "arch": "fake", "dir": None, "n_layers": L, "n_heads": H, "n_kv_heads": Hkv,
            "head_dim": d, "vocab": vocab}
    plan = plan_for(L, n)
    return ModelCase(name, meta, m, m, prompt, plan, torch.device("cpu"))


def _unit_tests():
    # stable top-k: ties to the lower index, boundary description
    x = torch.tensor([1.0, 3.0, 2.0, 3.0, 2.0, 2.0, 0.5])
    top, order = topk_lower(x, 4)
    require(list(order) == [1, 3, 2, 4, 5, 0, 6], "stable_order %s" % list(order))
    b = boundary(x, order, 4)
    require(b["exact_tie"] and b["tie_group"] == [2, 4, 5] and b["tie_taken"] == 2, "boundary %s" % b)
    require(boundary(x, order, 2)["exact_tie"] is False and boundary(x, order, 3)["tie_taken"] == 1, "boundary no tie")
    r, _ = ranks_desc(x)
    require(list(r) == [6, 1, 3, 2, 4, 5, 7], "ranks %s" % list(r))
    # pooling: avg counts padding, max ignores it
    y = pool1d(torch.tensor([[5.0, 0.0, 0.0, 0.0, 0.0, 0.0, 5.0]]), 5, "avg")[0]
    require(abs(float(y[0]) - 1.0) < 1e-7 and abs(float(y[3]) - 0.0) < 1e-7, "avg pool %s" % y)
    y = pool1d(torch.tensor([[-5.0, -1.0, -3.0]]), 3, "max")[0]
    require(y.tolist() == [-1.0, -1.0, -1.0], "max pool %s" % y)
    # window scores against a naive loop
    torch.manual_seed(0)
    H, Hkv, n, d, w = 4, 2, 20, 8, 5
    q, k = torch.randn(H, n, d), torch.randn(Hkv, n, d)
    s = window_scores(q, k, w, 2)
    naive = torch.zeros(H, n - w)
    for h in range(H):
        for i in range(w):
            qi = n - w + i
            logits = torch.tensor([float(q[h, qi] @ k[h // 2, j]) / math.sqrt(d) if j <= qi else -1e30
                                   for j in range(n)])
            naive[h] += torch.softmax(logits, 0)[: n - w]
    require(torch.allclose(s, naive, atol=1e-5), "window_scores vs naive")
    raw, pooled = gemfilter_scores(q, k, 2)
    naive = torch.tensor([sum(float(q[h, -1] @ k[h // 2, j]) for h in range(H)) for j in range(n)])
    require(torch.allclose(raw, naive, atol=1e-4), "gemfilter raw vs naive")
    require(abs(float(pooled[0]) - float(raw[:3].sum()) / 5) < 1e-4, "gemfilter pooled edge")
    # ASL variance
    rr = [np.array([1, 2, 3, 4]), np.array([2, 1, 3, 4])]
    require(abs(asl_variance(rr, np.array([0, 1])) - 0.25) < 1e-12, "asl variance")
    # TokenSelect vote, both head maps
    fp, kc = torch.randn(4, d), torch.randn(2, 6, d)
    v_div, v_mod = ts_vote(fp, kc, "div", 2), ts_vote(fp, kc, "mod", 2)
    nd = sum(torch.softmax(torch.stack([fp[h] @ kc[h // 2, j] for j in range(6)]), 0) for h in range(4))
    nm = sum(torch.softmax(torch.stack([fp[h] @ kc[h % 2, j] for j in range(6)]), 0) for h in range(4))
    require(torch.allclose(v_div, nd, atol=1e-6) and torch.allclose(v_mod, nm, atol=1e-6), "ts_vote")
    print("unit tests ok")


def _check_tokenselect_attention(mc):
    """Gathered attention with renumbering against a per-query naive loop."""
    R = mc.R
    pol = TokenSelectPolicy(R, n_init=4, n_local=8, k=6, chunk=8)
    N = 40
    torch.manual_seed(5)
    kp, v = torch.randn(R.Hkv, N, R.d), torch.randn(R.Hkv, N, R.d)
    pol.kv[0] = KV(kp, v, kp, torch.arange(N), torch.arange(N))
    pol.cur_layer = 0
    qpre = torch.randn(R.H, 3, R.d)
    G = torch.tensor(list(range(4)) + [9, 12, 13, 20, 21, 25] + list(range(32, 40)))
    out = pol._attend_gathered(qpre, G)
    kv_len = len(G)
    for i in range(3):
        qi = R.rope(qpre[:, i:i + 1], torch.tensor([kv_len - 3 + i]))
        for h in range(R.H):
            keys = [R.rope(kp[h // R.g, G[j]][None, None], torch.tensor([j]))[0, 0] for j in range(kv_len - 3 + i + 1)]
            lg = torch.stack([qi[h, 0] @ kk for kk in keys]) * R.scaling
            o = torch.softmax(lg, 0) @ v[h // R.g, G[: len(keys)]]
            require(torch.allclose(o, out[h, i], atol=1e-5), "tokenselect gathered attention vs naive")
    print("tokenselect gathered attention ok")


def selftest(keep_dir=None):
    _unit_tests()
    cases = [_fake_case("fake_llama", 8, 4, 2, 8, 64, 300, False, 7),
             _fake_case("fake_qwen", 6, 4, 1, 8, 64, 233, True, 8)]
    _check_tokenselect_attention(cases[0])
    tmp = os.path.abspath(keep_dir) if keep_dir else tempfile.mkdtemp(prefix="policy_ref_selftest_")
    os.makedirs(tmp, exist_ok=True)
    try:
        manifest = write_all(cases, tmp, None, {"torch": torch.__version__, "selftest": True})
        for c in manifest["cases"]:
            with open(os.path.join(tmp, c["file"])) as f:
                d = json.load(f)
            for key in ("version", "generator", "regenerate", "policy", "params", "model", "prompt_ids",
                        "generated_ids", "full_generated_ids"):
                require(key in d, "%s lacks %s" % (c["file"], key))
        tpath = make_tar(tmp)
        # --merge: installing this run's asl cases into a copy of the same tree changes nothing
        fix = os.path.join(tmp, "merge_check")
        shutil.copytree(os.path.join(tmp, "cases"), os.path.join(fix, "cases"))
        shutil.copyfile(os.path.join(tmp, "manifest.json"), os.path.join(fix, "manifest.json"))
        written = merge_into(fix, tmp, manifest, {"asl"})
        require(len(written) == 1 + sum(1 for c in manifest["cases"] if c["policy"] == "asl"), "merge wrote %s" % written)
        for rel in ["manifest.json"] + [c["file"] for c in manifest["cases"]]:
            require(sha256_file(os.path.join(fix, rel)) == sha256_file(os.path.join(tmp, rel)), "merge changed %s" % rel)
        shutil.rmtree(fix)
        require(any(c["variant"].startswith("taugt1_1pass_kv") for c in manifest["cases"]), "no asl kv_budget case")
        summary(manifest)
        print("\nselftest ok: %d cases, tarball %d bytes" % (len(manifest["cases"]), os.path.getsize(tpath)))
    finally:
        if not keep_dir:
            shutil.rmtree(tmp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
