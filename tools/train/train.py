#!/usr/bin/env python3
"""Train kvsieve's small long-context Llama (see README.md next to this file).

One run: byte-level BPE tokenizer -> 2-layer model that learns to copy (induction heads) on
short copy / associative-recall rows -> grown to the final depth with identity-initialised
layers -> retrieval tasks mixed with plain text on a length ladder 256 -> 512 -> 1K -> 2K -> 4K
(-> 8K), each step up taken only once retrieval works at the current length -> the final length
until the time budget -> HF-layout model folder, final evaluation table, tar.gz for transport.
--resume DIR continues from such a folder (e.g. to lengthen to 8K).  --resume DIR --gemfilter-ft
fine-tunes it at its trained length on the normal rows plus prompts compressed by the model's own
GemFilter selection, and the final table gains GemFilter columns (README: "GemFilter fine-tuning").

Usage (GPU machine, repo root):
    python3 tools/train/train.py --corpora .data/corpora --out $OUT --time-budget 500
GemFilter fine-tuning of the committed model (GPU machine, one call):
    python3 tools/train/train.py --resume models/kvsieve-tiny --gemfilter-ft --corpora .data/corpora --out $OUT --time-budget 450
CPU check of the recipe (no HF packages needed):
    python3 tools/train/train.py --cpu-smoke --corpora ../shared/corpora --out /tmp/smoke
"""

import argparse
import contextlib
import gzip
import io
import json
import math
import os
import sys
import tarfile
import time

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import tasks as T  # noqa: E402
from model import (LlamaLM, config_from_hf, default_config, gemfilter_select, load_safetensors,  # noqa: E402
                   save_safetensors)
from tok import BOS, EOS, PAD, ByteTok, HFBPE, load_tokenizer  # noqa: E402

T0 = time.time()
LOG = {"events": [], "train": [], "gates": [], "stages": []}


def now():
    return time.time() - T0


def say(*a):
    msg = " ".join(str(x) for x in a)
    print("[%7.1fs] %s" % (now(), msg), flush=True)


def event(kind, **kw):
    kw["t"] = round(now(), 2)
    kw["kind"] = kind
    LOG["events"].append(kw)


# ===================================================================== training rows
# A row is (ids, codes), both of length R; code of position i says how the prediction of
# token i (from tokens < i) is trained: 0 = not at all, 1 = context LM loss, 2 = answer loss.
C_NONE, C_CTX, C_ANS = 0, 1, 2


class RowGen:
    """Training rows at the token level.  The retrieval rows use exactly the templates of tasks.py
    (one question in the eval format first, then, for dense supervision, more questions about
    the other needles / pairs), built by concatenating cached token lists of units that the
    pre-tokenizer always splits apart, so they equal the tokenization of the text."""

    def __init__(self, tok, sentences, doc_ids):
        self.tok = tok
        self.S = sentences
        self.ns = len(sentences)
        self.doc = doc_ids                      # 1-D int64 tensor: tokens of " ".join(sentences)
        self.V = tok.vocab_size
        self._enc = {}
        t = now()
        self.sent_sp = tok.encode_batch([" " + s for s in sentences])
        self.sent_len = [len(x) for x in self.sent_sp]
        say("row generator: %d sentences tokenized in %.1fs" % (self.ns, now() - t))

    def enc(self, s, cache=True):
        r = self._enc.get(s)
        if r is None:
            r = self.tok.encode(s)
            if cache:
                self._enc[s] = r
        return r

    def rand_tokens(self, rng, n):
        return [3 + rng.below(self.V - 3) for _ in range(n)]

    @staticmethod
    def finish(ids, codes, R):
        if len(ids) > R:
            ids, codes = ids[:R], codes[:R]
        pad = R - len(ids)
        return ids + [PAD] * pad, codes + [C_NONE] * pad

    # ------------------------------------------------------------ synthetic (token level)
    def copy_short(self, rng, R, P=None):
        """A random block repeated 2-4 times with a variable period, then random tail."""
        lo = max(4, R // 8)
        if P is None:
            P = lo + rng.below(max(1, (R - 1) // 2 - lo + 1))
        rep = min(4, (R - 1) // P)
        block = self.rand_tokens(rng, P)
        ids, codes = [BOS], [C_NONE]
        for r in range(rep):
            ids += block
            codes += [C_NONE] * P if r == 0 else [C_NONE] + [C_ANS] * (P - 1)
        tail = R - len(ids)
        ids += self.rand_tokens(rng, tail)
        codes += [C_NONE] * tail
        return ids, codes

    def mqar(self, rng, R):
        """k1 v1 k2 v2 ... then queries k v (value supervised); keys distinct random tokens."""
        n = max(2, (R - 1) // 4 - rng.below(max(1, R // 16)))
        keys = []
        seen = set()
        while len(keys) < n:
            k = 3 + rng.below(self.V - 3)
            if k not in seen:
                seen.add(k)
                keys.append(k)
        vals = self.rand_tokens(rng, n)
        ids, codes = [BOS], [C_NONE]
        for k, v in zip(keys, vals):
            ids += [k, v]
            codes += [C_NONE, C_NONE]
        while len(ids) + 2 <= R:
            j = rng.below(n)
            ids += [keys[j], vals[j]]
            codes += [C_NONE, C_ANS]
        return self.finish(ids, codes, R)

    def text(self, rng, R):
        s = rng.below(len(self.doc) - R)
        ids = [BOS] + self.doc[s:s + R - 1].tolist()
        return ids, [C_NONE] + [C_CTX] * (R - 1)

    def copy_long(self, rng, R):
        """Text, a random block, more text, the block again (supervised), text."""
        P = 8 + rng.below(57)
        gap_total = R - 1 - 2 * P
        a = rng.below(max(1, gap_total // 2))
        b = rng.below(max(1, gap_total - a))
        c = gap_total - a - b
        s = rng.below(len(self.doc) - R)
        d = self.doc[s:s + gap_total].tolist()
        block = self.rand_tokens(rng, P)
        ids = [BOS] + d[:a] + block + d[a:a + b] + block + d[a + b:]
        codes = [C_NONE] + [C_CTX] * a + [C_NONE] * P + [C_CTX] * b + [C_NONE] + [C_ANS] * (P - 1) + [C_CTX] * c
        return self.finish(ids, codes, R)

    # ------------------------------------------------------------ retrieval rows
    def _assemble(self, R, head, units, qa, fill):
        """head: tokens after BOS; units: list of token lists in context order (first one already
        without its leading space); qa: list of (question ids, answer ids); fill: unused."""
        ids, codes = [BOS], [C_NONE]
        ids += head
        codes += [C_CTX] * len(head)
        for u in units:
            ids += u
            codes += [C_CTX] * len(u)
        for q, a in qa:
            ids += q
            codes += [C_CTX] * len(q)
            ids += a
            codes += [C_ANS] * len(a)
        ids.append(EOS)
        codes.append(C_ANS)
        return self.finish(ids, codes, R)

    def _fill_sentences(self, start, budget):
        out, i = [], 0
        while i < self.ns:
            L = self.sent_len[(start + i) % self.ns]
            if L > budget:
                break
            budget -= L
            out.append((start + i) % self.ns)
            i += 1
        return out

    def _interleave(self, n, needle_pos, needles, unit_of):
        order = sorted(range(len(needles)), key=lambda j: (needle_pos[j], j))
        out, j = [], 0
        for i in range(n + 1):
            while j < len(order) and needle_pos[order[j]] == i:
                out.append(("n", order[j]))
                j += 1
            if i < n:
                out.append(("s", i))
        return out

    def _first_nospace(self, units_tok, first_text):
        units_tok[0] = self.enc(first_text, cache=False)
        return units_tok

    def niah(self, rng, R, n_needles, n_questions):
        words, nums = [], []
        for _ in range(n_needles):
            w = T.WORDS[rng.below(len(T.WORDS))]
            while w in words:
                w = T.WORDS[rng.below(len(T.WORDS))]
            words.append(w)
            nums.append(str(1000000 + rng.below(9000000)))
        depths = [rng.uniform() for _ in range(n_needles)]
        start = rng.below(self.ns)
        qorder = [0] + [1 + j for j in self._perm(rng, n_needles - 1)][:max(0, n_questions - 1)]
        needle_txt = [T.NIAH_NEEDLE.format(word=w, num=x) for w, x in zip(words, nums)]
        needles = [self.enc(" " + t, cache=False) for t in needle_txt]
        qa = [(self.enc("\n" + T.NIAH_QUESTION.format(word=words[j])),
               self.enc(" " + nums[j], cache=False) + self.enc(".")) for j in qorder]
        head = self.enc(T.NIAH_HEADER + "\n")
        fixed = 2 + len(head) + sum(map(len, needles)) + sum(len(q) + len(a) for q, a in qa)
        sents = self._fill_sentences(start, R - fixed - 1)
        n = len(sents)
        pos = [T.insert_index(d, n) for d in depths]
        seq = self._interleave(n, pos, needles, None)
        units, texts = [], []
        for kind, i in seq:
            if kind == "n":
                units.append(needles[i])
                texts.append(needle_txt[i])
            else:
                units.append(self.sent_sp[sents[i]])
                texts.append(self.S[sents[i]])
        if units:
            units[0] = self.enc(texts[0], cache=False)
        return self._assemble(R, head, units, qa, None)

    def passkey(self, rng, R):
        key = str(10000 + rng.below(90000))
        depth = rng.uniform()
        needle_txt = T.PASSKEY_NEEDLE.format(key=key)
        head = self.enc(T.PASSKEY_HEADER + "\n")
        fsp = self.enc(" " + T.PASSKEY_FILLER)
        qa = [(self.enc("\n" + T.PASSKEY_QUESTION), self.enc(" " + key, cache=False) + self.enc("."))]
        needle = self.enc(" " + needle_txt, cache=False)
        fixed = 2 + len(head) + len(needle) + sum(len(q) + len(a) for q, a in qa)
        n = max(0, (R - fixed - 1) // len(fsp))
        k = T.insert_index(depth, n)
        units = [fsp] * k + [needle] + [fsp] * (n - k)
        units[0] = self.enc(T.PASSKEY_FILLER) if k > 0 else self.enc(needle_txt, cache=False)
        return self._assemble(R, head, units, qa, None)

    def kv(self, rng, R, n_questions):
        head = self.enc(T.KV_HEADER + "\n")
        open_, sep, close = self.enc('{"'), self.enc('", "'), self.enc('"}')
        pairs, ptok = [], []
        budget = R - 2 - len(head) - len(open_) - len(close) - 1
        # questions cost about 2 keys + 2 values + fixed words each; reserve before filling
        qfix = len(self.enc("\n" + T.KV_QUESTION.format(key=""))) + 1
        while True:
            k, v = T.uuid_like(rng), T.uuid_like(rng)
            t = self.enc(k + '": "' + v, cache=False)
            kl = len(self.enc(k, cache=False))
            vl = len(t) - kl - 2
            need = len(t) + (len(sep) if ptok else 0)
            qcost = n_questions * (qfix + 2 * kl + vl + 4)
            if need + qcost > budget and ptok:
                break
            if need > budget:
                break
            pairs.append((k, v))
            ptok.append(t)
            budget -= need
        n = len(pairs)
        if n == 0:
            return self.passkey(rng, R)
        t0 = T.insert_index(rng.uniform(), n - 1)
        others = [j for j in self._perm(rng, n) if j != t0]
        qidx = [t0] + others[:max(0, n_questions - 1)]
        units = [open_]
        for i, t in enumerate(ptok):
            if i:
                units.append(sep)
            units.append(t)
        units.append(close)
        qa, used = [], sum(map(len, units)) + len(head) + 2
        for j in qidx:
            q = self.enc("\n" + T.KV_QUESTION.format(key=pairs[j][0]), cache=False)
            a = self.enc(pairs[j][1], cache=False) + self.enc('"')
            if used + len(q) + len(a) > R - 1 and qa:
                break
            used += len(q) + len(a)
            qa.append((q, a))
        return self._assemble(R, head, units, qa, None)

    @staticmethod
    def _perm(rng, n):
        p = list(range(n))
        for i in range(n - 1, 0, -1):
            j = rng.below(i + 1)
            p[i], p[j] = p[j], p[i]
        return p

    def gf_prompt(self, kind, seed, R):
        """A one-question retrieval prompt of at most about R tokens for GemFilter rows:
        (prompt ids with BOS, ending with the eval-format question; answer ids = the answer, its
        "." / '"' and EOS), or None if the row came out without an answer.  multikey: 3..7
        distractors, the target asked."""
        rng = T.SplitMix64(seed)
        if kind == "passkey":
            ids, codes = self.passkey(rng, R)
        elif kind == "niah":
            ids, codes = self.niah(rng, R, 1, 1)
        elif kind == "multikey":
            ids, codes = self.niah(rng, R, 4 + rng.below(5), 1)
        elif kind == "kv":
            ids, codes = self.kv(rng, R, 1)
        else:
            raise ValueError("GemFilter rows: unknown task %r" % kind)
        if C_ANS not in codes:
            return None
        i = codes.index(C_ANS)
        j = i
        while j < len(codes) and codes[j] == C_ANS:
            j += 1
        return ids[:i], ids[i:j]

    # ------------------------------------------------------------ dispatch
    def row(self, kind, seed, R):
        rng = T.SplitMix64(seed)
        if kind == "copy":
            return self.copy_short(rng, R) if R <= 256 else self.copy_long(rng, R)
        if kind == "mqar":
            return self.mqar(rng, R)
        if kind == "text":
            return self.text(rng, R)
        if kind == "passkey":
            return self.passkey(rng, R)
        if kind == "niah":
            return self.niah(rng, R, 1, 1)
        if kind == "multikey":
            n = 4 + rng.below(5)                     # 3..7 distractors
            return self.niah(rng, R, n, n)
        if kind == "kv":
            return self.kv(rng, R, 4)
        raise ValueError(kind)


def pick(rng, mix):
    u = rng.uniform() * sum(w for _, w in mix)
    for k, w in mix:
        u -= w
        if u < 0:
            return k
    return mix[-1][0]


def show_row(tok, ids, codes, head=40, tail=80):
    """Decoded row with the supervised (code 2) spans in [[ ]]; the middle elided."""
    n = len(ids)
    while n > 0 and ids[n - 1] == PAD:
        n -= 1

    def seg(a, b):
        out, cur, cc = [], [], None
        for i in range(a, b):
            c = 2 if codes[i] == C_ANS else 0
            if c != cc and cur:
                txt = tok.decode([t for t in cur if t > 2]) + ("<eos>" if EOS in cur else "")
                out.append("[[" + txt + "]]" if cc == 2 else txt)
                cur = []
            cc = c
            cur.append(ids[i])
        if cur:
            txt = tok.decode([t for t in cur if t > 2]) + ("<eos>" if EOS in cur else "")
            out.append("[[" + txt + "]]" if cc == 2 else txt)
        return "".join(out)

    if n <= head + tail:
        return seg(0, n)
    return seg(0, head) + " ... " + seg(n - tail, n)


# ===================================================================== GemFilter (the model's own selection)
# GemFilter as shared/POLICIES.md "gemfilter" defines it: pass 1 runs layers 0..r on the whole prompt;
# at layer r (after RoPE) score[j] = sum over the H query heads of q_last . k_j (raw logits), average
# pool (kernel 5, padding 2, zeros counted), top-k sorted ascending; pass 2 is a fresh prefill of the
# k selected ids at positions 0..k-1 (BOS only if it was selected).  The scoring pass is
# LlamaLM.filter_scores, the pooling and top-k model.gemfilter_select.

@contextlib.contextmanager
def exact_fp32(dev):
    """float32 without TF32 (CUDA), so that a selection matches the engine's float32 reference as
    closely as PyTorch can (autocast is simply not entered)."""
    if dev.type != "cuda":
        yield
        return
    a, b = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = a, b


@torch.no_grad()
def gf_select(model, prompts, rs, ks, device, amp, fp32, max_tokens=131072, kernel=5):
    """GemFilter selections for many prompts.  prompts: lists of ids (with BOS, ending with the
    question), rs: filter layer per prompt, ks: k (or a list of k's) per prompt.  Batched by
    length (at most max_tokens padded tokens per forward); fp32: exact float32 scoring, else the
    bf16 autocast of training.  Returns the sorted index list(s) per prompt."""
    was = model.training
    model.eval()
    out = [None] * len(prompts)
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    i = 0
    while i < len(order):
        j = i
        while j < len(order) and (j - i + 1) * len(prompts[order[j]]) <= max_tokens:
            j += 1
        j = max(j, i + 1)
        idx = order[i:j]
        W = max(len(prompts[b]) for b in idx)
        ids = torch.tensor([prompts[b] + [PAD] * (W - len(prompts[b])) for b in idx], dtype=torch.long)
        n = [len(prompts[b]) for b in idx]
        ids = ids.to(device)
        last = torch.tensor([x - 1 for x in n], dtype=torch.long, device=device)
        lay = torch.tensor([rs[b] for b in idx], dtype=torch.long, device=device)
        if fp32:
            with exact_fp32(device):
                raw = model.filter_scores(ids, last, lay)
        else:
            with amp():
                raw = model.filter_scores(ids, last, lay)
        sel = gemfilter_select(raw, n, [ks[b] for b in idx], kernel)
        for b, s_ in zip(idx, sel):
            out[b] = s_
        i = j
    if was:
        model.train()
    return out


class ValueFinder:
    """Where a needle's value sits in a prompt: the answer's tokens less leading / trailing tokens
    without a letter or digit (the space before a number, the "." or '"' after it, EOS), found
    as a token subsequence of the prompt (every occurrence: the pass key's needle holds it
    twice).  Prompts and answers are tokenized apart, so a value that tokenizes differently in
    context is not found (reported as such, never guessed)."""

    def __init__(self, tok):
        self.tok = tok
        self._alnum = {}

    def alnum(self, t):
        r = self._alnum.get(t)
        if r is None:
            r = t > 2 and any(ch.isalnum() for ch in self.tok.decode([t]))
            self._alnum[t] = r
        return r

    def value(self, answer):
        a = list(answer)
        while a and not self.alnum(a[0]):
            a.pop(0)
        while a and not self.alnum(a[-1]):
            a.pop()
        return a

    def spans(self, prompt, answer):
        v = self.value(answer)
        if not v:
            return []
        out, m, f, i = [], len(v), v[0], 0
        while True:
            try:
                i = prompt.index(f, i)
            except ValueError:
                return out
            if prompt[i:i + m] == v:
                out.append(range(i, i + m))
            i += 1

    @staticmethod
    def kept(spans, sel):
        """True if some occurrence is wholly selected, False if none is, None if not found."""
        if not spans:
            return None
        s = set(sel)
        return any(all(i in s for i in sp) for sp in spans)


def gemfilter_eval(model, items, r, ks, vf, device, amp):
    """Exact match after GemFilter (layer r, each k in ks) on eval items (prompt ids with BOS,
    answer ids), the selection in exact float32, the teacher-forced check as in exact_match.
    Returns {k: (ok list, kept list)}: kept[i] True/False/None as ValueFinder.kept."""
    prompts = [p for p, _ in items]
    sels = gf_select(model, prompts, [r] * len(items), [list(ks)] * len(items), device, amp, fp32=True,
                     max_tokens=32768)
    out = {}
    for ki, k in enumerate(ks):
        comp = [([p[i] for i in sel[ki]], a) for (p, a), sel in zip(items, sels)]
        ok = exact_match(model, comp, device, amp)
        kept = [vf.kept(vf.spans(p, a), sel[ki]) for (p, a), sel in zip(items, sels)]
        out[k] = (ok, kept)
    return out


def parse_dist(spec, name, cast=str):
    """"a:0.5,b:0.25" (or "a,b": equal weights) -> [(a, 0.5), (b, 0.25)]."""
    out = []
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        key, _, w = part.partition(":")
        try:
            out.append((cast(key), float(w) if w else 1.0))
        except ValueError:
            raise SystemExit("%s: cannot parse %r (expected NAME:WEIGHT,...)" % (name, part))
    if not out or sum(w for _, w in out) <= 0 or any(w < 0 for _, w in out):
        raise SystemExit("%s: %r needs at least one entry and positive weights" % (name, spec))
    return out


class GemFilterRows:
    """Training rows made of GemFilter-compressed prompts.  Per step: one prompt length R drawn
    log-uniformly in [lo, hi]; per row: a task (mix), a filter layer r (distribution), a one-
    question prompt of about R tokens (RowGen.gf_prompt), a k drawn from ks among those < the
    prompt length.  The model itself selects (one batched no-grad pass 1 for all rows), and each
    row becomes ids[selected] + answer + EOS at positions 0..: only the answer (with its "." /
    '"' and the EOS) is supervised.  Rows whose needle value was not selected are dropped unless
    keep_missing (their answer cannot be read from the context)."""

    def __init__(self, rows, tok, n_rows, tasks, layers, ks, lo, hi, keep_missing, fp32):
        self.rows, self.tok = rows, tok
        self.n_rows, self.tasks, self.layers, self.ks = n_rows, tasks, layers, ks
        self.lo, self.hi = lo, hi
        self.keep_missing, self.fp32 = keep_missing, fp32
        self.vf = ValueFinder(tok)

    def batch(self, model, seed, device, amp):
        """-> (ids list, codes list, stats dict) of the surviving rows, unpadded."""
        srng = T.SplitMix64(T.derive_seed(seed, 0x6F11))
        R = int(round(self.lo * (self.hi / self.lo) ** srng.uniform())) if self.hi > self.lo else self.lo
        prompts, answers, rs, ks = [], [], [], []
        for b in range(self.n_rows):
            rs_ = T.derive_seed(seed, 0x6F12, b)
            rng = T.SplitMix64(rs_ ^ 0xA5A5)
            kind = pick(rng, self.tasks)
            r = pick(rng, self.layers)
            pa = self.rows.gf_prompt(kind, rs_, R)
            if pa is None:
                continue
            p, a = pa
            can = [k for k in self.ks if k < len(p)]
            if not can:
                continue
            prompts.append(p)
            answers.append(a)
            rs.append(r)
            ks.append(can[rng.below(len(can))])
        sels = gf_select(model, prompts, rs, ks, device, amp, self.fp32)
        out_ids, out_codes, kept_n, found_n = [], [], 0, 0
        for p, a, sel in zip(prompts, answers, sels):
            kept = self.vf.kept(self.vf.spans(p, a), sel)
            found_n += kept is not None
            kept_n += bool(kept)
            if kept is False and not self.keep_missing:
                continue
            out_ids.append([p[i] for i in sel] + a)
            out_codes.append([C_NONE] * len(sel) + [C_ANS] * len(a))
        st = {"len": R, "rows": len(prompts), "used": len(out_ids), "kept": kept_n, "found": found_n,
              "tokens_in": sum(map(len, prompts)), "prompts": prompts, "answers": answers}
        return out_ids, out_codes, st


def gf_log(x):
    """Log record of summed GemFilter-row stats (GemFilterRows.batch + the loss)."""
    n = max(1, x.get("steps", 0))
    nl = max(1, x.get("loss_steps", 0))
    return {"rows_per_step": round(x.get("used", 0) / n, 2), "drawn_per_step": round(x.get("rows", 0) / n, 2),
            "kept": round(x.get("kept", 0) / max(1, x.get("found", 0)), 4),
            "not_found": x.get("rows", 0) - x.get("found", 0),
            "loss_ans": round(float(x.get("loss", 0.0)) / nl, 4),
            "ans_tok_acc": round(float(x.get("acc", 0.0)) / nl, 4),
            "loss_sel": round(float(x.get("sel_loss", 0.0)) / max(1, x.get("sel_steps", 0)), 4),
            "prompt_tokens_per_step": int(x.get("tokens_in", 0) / n)}


# ===================================================================== evaluation
def encode_case(tok, case):
    return [BOS] + tok.encode(case.prompt), tok.encode(case.answer)


@torch.no_grad()
def exact_match(model, items, device, amp, max_tokens=131072):
    """items: list of (prompt ids incl. BOS, answer ids).  Greedy decoding reproduces the answer iff
    the argmax after prompt + answer[:j] is answer[j] for every j: one teacher-forced pass."""
    model.eval()
    order = sorted(range(len(items)), key=lambda i: len(items[i][0]) + len(items[i][1]))
    ok = [False] * len(items)
    i = 0
    while i < len(order):
        Lmax = len(items[order[i]][0]) + len(items[order[i]][1])
        j = i
        while j < len(order):
            L = len(items[order[j]][0]) + len(items[order[j]][1])
            if (j - i + 1) * max(L, Lmax) > max_tokens and j > i:
                break
            Lmax = max(Lmax, L)
            j += 1
        idx = order[i:j]
        rows = [items[k][0] + items[k][1][:-1] for k in idx]
        W = max(map(len, rows))
        ids = torch.tensor([r + [PAD] * (W - len(r)) for r in rows], dtype=torch.long, device=device)
        with amp():
            h = model.hidden(ids)
        bi, pi, tgt = [], [], []
        for b, k in enumerate(idx):
            p0 = len(items[k][0]) - 1
            for jj, a in enumerate(items[k][1]):
                bi.append(b)
                pi.append(p0 + jj)
                tgt.append(a)
        hs = h[torch.tensor(bi, device=device), torch.tensor(pi, device=device)]
        with amp():
            pred = model.logits(hs).argmax(-1).tolist()
        c = 0
        for b, k in enumerate(idx):
            good = True
            for _ in items[k][1]:
                good = good and pred[c] == tgt[c]
                c += 1
            ok[k] = good
        i = j
    model.train()
    return ok


@torch.no_grad()
def copy_accuracy(model, rows, device, amp):
    model.eval()
    ids = torch.tensor([r[0] for r in rows], dtype=torch.long, device=device)
    codes = torch.tensor([r[1] for r in rows], dtype=torch.long, device=device)
    with amp():
        logits = model(ids[:, :-1])
    pred = logits.argmax(-1)
    m = codes[:, 1:] == C_ANS
    acc = ((pred == ids[:, 1:]) & m).sum().item() / max(1, m.sum().item())
    model.train()
    return acc


class EvalSets:
    """Held-out cases in the exact eval format of tasks.py (new seeds), cached per length."""

    def __init__(self, gen, tok, base_seed):
        self.gen, self.tok, self.base = gen, tok, base_seed
        self.cache = {}

    def get(self, task, length, n):
        key = (task, length)
        have = self.cache.setdefault(key, [])
        while len(have) < n:
            c = self.gen.eval_case(self.base, task, length, len(have))
            have.append((c, encode_case(self.tok, c)))
        return have[:n]


# ===================================================================== stages
def ladder(max_len, start_len=256):
    out, L = [], start_len
    while L <= max_len:
        out.append(L)
        L *= 2
    if out[-1] != max_len:
        out.append(max_len)
    return out


TASK_MIX = [("passkey", 0.12), ("niah", 0.16), ("multikey", 0.22), ("kv", 0.22), ("copy", 0.10), ("text", 0.18)]
SHORT_MIX = [("copy", 0.20), ("mqar", 0.15), ("passkey", 0.10), ("niah", 0.12), ("multikey", 0.15),
             ("kv", 0.13), ("text", 0.15)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpora", default=None, help="folder of *.txt corpora (default .data/corpora, else ../shared/corpora)")
    ap.add_argument("--out", required=True, help="folder for the transport files (tar.gz parts, train_log.json, summary.txt)")
    ap.add_argument("--model-dir", default=None, help="where the model folder is written (default OUT/../kvsieve-tiny-model or .data/train/model)")
    ap.add_argument("--resume", default=None, help="model folder of an earlier run to continue from")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--time-budget", type=float, default=500.0, help="seconds for the whole run (default 500)")
    ap.add_argument("--eval-reserve", type=float, default=70.0, help="seconds kept for save + final eval")
    ap.add_argument("--max-len", type=int, default=4096, help="longest training length (default 4096)")
    ap.add_argument("--ladder-start", type=int, default=256, help="first length of the ladder (then doubling)")
    ap.add_argument("--final-steps", type=int, default=0, help="steps at --max-len (0: until the time budget)")
    ap.add_argument("--steps-scale", type=float, default=1.0, help="multiply every stage's step caps")
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--start-layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--ffn", type=int, default=1024)
    ap.add_argument("--theta", type=float, default=500000.0, help="RoPE theta (whole run)")
    ap.add_argument("--theta-copy", type=float, default=None, help="RoPE theta of the 2-layer copy stage (default: --theta)")
    ap.add_argument("--max-pos", type=int, default=16384)
    ap.add_argument("--lr", type=float, default=1.5e-3)
    ap.add_argument("--lr-copy", type=float, default=2e-3)
    ap.add_argument("--ctx-weight", type=float, default=0.3, help="weight of the context LM loss vs the answer loss")
    ap.add_argument("--batch-tokens", type=int, default=65536)
    ap.add_argument("--copy-batch-tokens", type=int, default=32768)
    ap.add_argument("--copy-lens", default="64,128")
    ap.add_argument("--copy-gate", type=float, default=0.95)
    ap.add_argument("--copy-max-steps", type=int, default=2500)
    ap.add_argument("--gate", default="passkey:0.9,niah:0.9,multikey:0.5", help="per-task EM to step up the length")
    ap.add_argument("--gate-cases", type=int, default=32)
    ap.add_argument("--gate-every", type=int, default=100)
    ap.add_argument("--stage-min", type=int, default=100)
    ap.add_argument("--monitor-every", type=int, default=400, help="held-out EM printout interval in the final stage")
    ap.add_argument("--eval-cases", type=int, default=110, help="final eval cases per (task, length); 110 = 10 per depth")
    ap.add_argument("--eval-lens", default=None, help="final eval lengths (default 512..trained length)")
    ap.add_argument("--log-every", type=int, default=50)
    ap.add_argument("--compile", action="store_true", help="torch.compile the layers (off by default)")
    ap.add_argument("--device", default=None)
    ap.add_argument("--tokenizer", choices=["bpe", "bytes"], default="bpe")
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny CPU run of the recipe (copy stage, growth, a short ladder)")
    ap.add_argument("--no-tar", action="store_true")
    g = ap.add_argument_group("GemFilter fine-tuning (README: \"GemFilter fine-tuning\")")
    g.add_argument("--gemfilter-ft", action="store_true",
                   help="with --resume: train at the trained length on the normal rows plus GemFilter rows "
                        "(prompts compressed by the model's own GemFilter selection), then the usual save/eval")
    g.add_argument("--ft-lr", type=float, default=4e-4, help="peak AdamW lr of the fine-tuning (default 4e-4)")
    g.add_argument("--gf-rows", type=int, default=24, help="GemFilter rows drawn per step, next to the normal batch")
    g.add_argument("--gf-weight", type=float, default=1.0, help="weight of the GemFilter rows' answer loss")
    g.add_argument("--gf-layers", default="1:0.25,2:0.5,3:0.25", help="filter layer r distribution (r:weight,...)")
    g.add_argument("--gf-ks", default="64,128,256,512", help="k choices (uniform among those < the prompt length)")
    g.add_argument("--gf-tasks", default="passkey:0.2,niah:0.2,multikey:0.3,kv:0.3", help="task mix of GemFilter rows")
    g.add_argument("--gf-lens", default="512,0", help="MIN,MAX prompt length, log-uniform per step (0 = trained length)")
    g.add_argument("--gf-keep-missing", action="store_true",
                   help="also train rows whose needle value was not selected (default: dropped)")
    g.add_argument("--gf-select-fp32", action="store_true",
                   help="training selections in exact float32 (default: bf16 autocast, as the training forward)")
    g.add_argument("--sel-weight", type=float, default=0.0,
                   help="weight of the selection objective: GemFilter's layer --sel-layer score trained to put "
                        "its mass on the needle's value (README: \"GemFilter fine-tuning\"); 0 = off")
    g.add_argument("--sel-layer", type=int, default=2, help="filter layer the selection objective trains")
    g.add_argument("--sel-temp", type=float, default=32.0, help="temperature dividing the raw summed scores")
    g.add_argument("--sel-rows", type=int, default=12, help="GemFilter-row prompts per step that also train the selection")
    g.add_argument("--gf-eval", default="2:256,2:128",
                   help="GemFilter configurations r:k of the final table (exact float32 selection); '' = none")
    g.add_argument("--gf-baseline-cases", type=int, default=22,
                   help="cases per cell of the GemFilter eval of the starting model (fine-tuning; 0 = skip)")
    args = ap.parse_args()
    if args.gemfilter_ft and not args.resume:
        ap.error("--gemfilter-ft needs --resume DIR (the trained model folder to fine-tune)")
    if args.gemfilter_ft and args.eval_reserve == ap.get_default("eval_reserve"):
        args.eval_reserve = 110.0                  # the GemFilter columns of the final table

    if args.cpu_smoke:
        # the recipe at toy scale: byte tokenizer, narrow model (hidden 128: a 2-core CPU forms the copy
        # circuit in a few hundred steps there; width delays it, a large batch brings it back -- see
        # README), copy stage 64-128, growth to 4 layers, a 512 -> 1024 ladder
        d = dict(device="cpu", tokenizer="bytes", hidden=128, heads=2, kv_heads=1, head_dim=64, ffn=256,
                 layers=4, max_len=1024, ladder_start=512, batch_tokens=4096, copy_batch_tokens=8192,
                 gate_cases=16, gate_every=50, stage_min=50, monitor_every=100, eval_cases=22, log_every=25,
                 max_pos=2048, eval_reserve=150.0, time_budget=2700.0)
        if args.gemfilter_ft:
            d.update(gf_rows=8, monitor_every=10, eval_reserve=120.0, gf_baseline_cases=11)
        for k, v in d.items():
            if getattr(args, k) == ap.get_default(k):
                setattr(args, k, v)
    dev = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    cuda = dev.type == "cuda"
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    class Amp:
        enabled = cuda

        def __call__(self):
            if cuda:
                return torch.autocast("cuda", dtype=torch.bfloat16)
            return _Null()

    class _Null:
        def __enter__(self):
            return self

        def __exit__(self, *a):
            return False

    amp = Amp()
    deadline = args.time_budget - args.eval_reserve
    os.makedirs(args.out, exist_ok=True)
    model_dir = args.model_dir or os.path.join(".data", "train", "model")
    os.makedirs(model_dir, exist_ok=True)
    LOG["args"] = vars(args)
    LOG["torch"] = torch.__version__
    LOG["device"] = torch.cuda.get_device_name(0) if cuda else "cpu"
    say("device", LOG["device"], "torch", torch.__version__, "budget %.0fs" % args.time_budget)

    # ------------------------------------------------------------ data + tokenizer
    corpora = args.corpora
    if corpora is None:
        corpora = os.path.join(".data", "corpora") if os.path.isdir(os.path.join(".data", "corpora")) else \
            os.path.join("..", "shared", "corpora")
    doc = T.load_document(corpora)
    sentences = T.split_sentences(doc)
    say("corpora: %d chars, %d sentences" % (len(doc), len(sentences)))

    state = {"session": 0, "global_step": 0, "trained_len": 0, "history": []}
    if args.resume:
        tok = load_tokenizer(args.resume)
        with open(os.path.join(args.resume, "config.json")) as f:
            cfg = config_from_hf(json.load(f))
        sp = os.path.join(args.resume, "train_state.json")
        if os.path.exists(sp):
            with open(sp) as f:
                state = json.load(f)
        state["session"] = state.get("session", 0) + 1
        say("resume from", args.resume, "trained_len", state.get("trained_len"), "session", state["session"])
    else:
        if args.tokenizer == "bytes":
            tok = ByteTok()
        else:
            t = now()
            # tokenizer text: the corpora in 64 KB chunks plus task templates (so their words merge)
            chunks = [doc[i:i + 65536] for i in range(0, len(doc), 65536)]
            g0 = T.TaskGen(ByteTok(), sentences)
            chunks += [g0.eval_case(args.seed + 99, task, 1200, i).prompt for task in T.TASKS for i in range(8)]
            tok = HFBPE.train(chunks, args.vocab)
            say("tokenizer: BPE vocab %d trained in %.1fs" % (tok.vocab_size, now() - t))
        cfg = default_config(vocab_size=tok.vocab_size, hidden_size=args.hidden, intermediate_size=args.ffn,
                             num_hidden_layers=args.start_layers, num_attention_heads=args.heads,
                             num_key_value_heads=args.kv_heads, head_dim=args.head_dim,
                             rope_theta=args.theta_copy or args.theta, max_position_embeddings=args.max_pos)
    sample = "The special magic number for wizard is: 4417302. \"a1b2-c3\": \"ff09\"}"
    say("tokenizer sample:", [tok.decode([i]) for i in tok.encode(sample)])

    t = now()
    doc_ids = torch.tensor(tok.encode(doc[:len(doc)]) if tok.kind == "bytes" else
                           [i for part in tok.encode_batch([doc[i:i + 200000] for i in range(0, len(doc), 200000)])
                            for i in part], dtype=torch.long)
    say("corpus: %d tokens (%.2f chars/token) in %.1fs" % (len(doc_ids), len(doc) / len(doc_ids), now() - t))
    rows = RowGen(tok, sentences, doc_ids)
    gen = T.TaskGen(tok, sentences)
    evals = EvalSets(gen, tok, T.derive_seed(args.seed, 0xE7A1))

    # self-check: retrieval rows decode + re-encode to the same tokens (unit concatenation is exact)
    bad = 0
    for kind in ("passkey", "niah", "multikey", "kv"):
        for i in range(4):
            ids, codes = rows.row(kind, T.derive_seed(args.seed, 0xC4EC, i), 512)
            body = [x for x in ids if x > 2]
            if tok.encode(tok.decode(body)) != body:
                bad += 1
    say("row self-check: %d/16 rows differ from the tokenization of their text" % bad)
    LOG["row_selfcheck_mismatch"] = bad

    # ------------------------------------------------------------ model
    torch.manual_seed(args.seed)
    gen_init = torch.Generator().manual_seed(args.seed)
    model = LlamaLM(cfg)
    if args.resume:
        sd = load_safetensors(os.path.join(args.resume, "model.safetensors"))
        missing = model.load_state_dict({k: v.float() for k, v in sd.items()}, strict=False)
        say("loaded weights; missing", [k for k in missing.missing_keys if k != "lm_head.weight"])
    else:
        model.init_weights(gen=gen_init)
    model.to(dev)
    say("model: %d layers, %.2fM params, theta %g" % (len(model.model.layers), model.n_params() / 1e6,
                                                      model.c["rope_theta"]))

    # GemFilter settings (checked before any training; layers must exist in the final model)
    n_final = args.layers if not args.resume else len(model.model.layers)
    gf_eval = {}
    for r, k in parse_dist(args.gf_eval, "--gf-eval", int) if args.gf_eval.strip() else []:
        gf_eval.setdefault(r, []).append(int(k))
    gf_eval = sorted(gf_eval.items())
    gf_layers = parse_dist(args.gf_layers, "--gf-layers", int)
    gf_ks = [int(x) for x in args.gf_ks.split(",") if x.strip()]
    gf_tasks = parse_dist(args.gf_tasks, "--gf-tasks")
    for r in [r for r, _ in gf_eval] + ([r for r, _ in gf_layers] if args.gemfilter_ft else []):
        if not 0 <= r < n_final:
            raise SystemExit("GemFilter layer %d is out of range: the model has %d layers (0..%d)" % (
                r, n_final, n_final - 1))
    if any(k < 1 for k in gf_ks + [k for _, ks in gf_eval for k in ks]) or not gf_ks:
        raise SystemExit("GemFilter k values must be >= 1 (--gf-ks %r, --gf-eval %r)" % (args.gf_ks, args.gf_eval))
    try:
        gf_lens = [int(x) for x in args.gf_lens.split(",")]
        if len(gf_lens) != 2 or gf_lens[0] < 16 or gf_lens[1] < 0:
            raise ValueError
    except ValueError:
        raise SystemExit("--gf-lens %r: expected MIN,MAX with MIN >= 16 (MAX 0 = the trained length)" % args.gf_lens)
    for t_, _ in gf_tasks:
        if t_ not in T.TASKS:
            raise SystemExit("--gf-tasks: unknown task %r (tasks: %s)" % (t_, ", ".join(T.TASKS)))
    # the starting model's final table (same held-out cases when the seed is the same): the
    # summary flags full-attention cells that dropped
    baseline = None
    if args.resume and os.path.exists(os.path.join(args.resume, "train_log.json")):
        try:
            with open(os.path.join(args.resume, "train_log.json")) as f:
                bl = json.load(f)
            if bl.get("args", {}).get("seed") == args.seed:
                baseline = bl.get("final_eval")
        except (OSError, ValueError) as e:
            say("WARNING: cannot read %s/train_log.json (%s): no comparison with the starting model" % (
                args.resume, e))

    def make_opt(lr):
        decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
        nodecay = [p for n, p in model.named_parameters() if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": 0.1}, {"params": nodecay, "weight_decay": 0.0}]
        try:
            return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8, fused=cuda)
        except TypeError:
            return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8)

    run = {"step": state.get("global_step", 0), "stop": False}
    fwd_cache = {}

    def layer_fn():
        if args.compile and cuda and "c" not in fwd_cache:
            fwd_cache["c"] = True
            for i, L in enumerate(model.model.layers):
                model.model.layers[i] = torch.compile(L, dynamic=True)
        return None

    def train_steps(name, stage_id, lens_fn, mix_fn, batch_tokens, lr, max_steps, warmup, gate_fn,
                    gate_every, min_steps, cooldown=None, gate_stops=True, extra=None):
        """Train until gate_fn() passes (checked every gate_every steps after min_steps), max_steps,
        or the deadline.  lens_fn(rng) -> row length of this step; mix_fn(R) -> kind mix.
        extra(step, seed) -> (loss or None, stats): a second batch of the same step (GemFilter
        rows), its gradient added to the main batch's before the optimizer step."""
        opt = make_opt(lr)
        layer_fn()
        st = {"name": name, "start_step": run["step"], "t0": round(now(), 1)}
        say("=== stage %s: lr %g, up to %d steps" % (name, lr, max_steps))
        shown = set()
        acc_l, acc_a, acc_c, acc_n, toks, tlog = 0.0, 0.0, 0.0, 0, 0, time.time()
        xacc = {}
        passed = False
        step = 0
        t_stage = now()
        for step in range(1, max_steps + 1):
            if now() > deadline:
                say("time budget reached in stage", name)
                run["stop"] = True
                break
            srng = T.SplitMix64(T.derive_seed(args.seed, state["session"], stage_id, step))
            R = lens_fn(srng)
            B = max(1, batch_tokens // R)
            batch_ids, batch_codes = [], []
            for b in range(B):
                seed = T.derive_seed(args.seed, state["session"], stage_id, step, b)
                kind = pick(T.SplitMix64(seed ^ 0x5A5A), mix_fn(R))
                ids, codes = rows.row(kind, seed, R)
                if kind not in shown:
                    shown.add(kind)
                    say("example %s @%d: %s" % (kind, R, show_row(tok, ids, codes)))
                batch_ids.append(ids)
                batch_codes.append(codes)
            ids = torch.tensor(batch_ids, dtype=torch.long)
            codes = torch.tensor(batch_codes, dtype=torch.long)
            if cuda:
                ids = ids.pin_memory().to(dev, non_blocking=True)
                codes = codes.pin_memory().to(dev, non_blocking=True)
            # lr: linear warmup, constant, optional linear cooldown to 10%
            f = min(1.0, step / max(1, warmup))
            if cooldown is not None:
                f *= cooldown(step)
            for g in opt.param_groups:
                g["lr"] = lr * f
            with amp():
                h = model.hidden(ids[:, :-1])
                logits = model.logits(h)
            tgt = ids[:, 1:]
            c = codes[:, 1:]
            ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), tgt.reshape(-1),
                                 reduction="none").view_as(tgt)
            ma = (c == C_ANS).float()
            mc = (c == C_CTX).float()
            la = (ce * ma).sum() / ma.sum().clamp(min=1)
            lc = (ce * mc).sum() / mc.sum().clamp(min=1)
            loss = la + args.ctx_weight * lc
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if extra is not None:
                # built after the main backward is queued, so that the CPU work overlaps the GPU's
                xl, xs = extra(step, T.derive_seed(args.seed, state["session"], stage_id, step, 0x6F))
                if xl is not None:
                    xl.backward()
                for kk, vv in xs.items():
                    xacc[kk] = xacc.get(kk, 0) + vv
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            run["step"] += 1
            with torch.no_grad():
                acc = ((logits.argmax(-1) == tgt).float() * ma).sum() / ma.sum().clamp(min=1)
            acc_l = acc_l + la.detach()
            acc_c = acc_c + lc.detach()
            acc_a = acc_a + acc
            acc_n += 1
            toks += ids.numel()
            if step % args.log_every == 0:
                dt = time.time() - tlog
                rec = {"step": run["step"], "stage": name, "len": R, "loss_ans": round(float(acc_l) / acc_n, 4),
                       "loss_ctx": round(float(acc_c) / acc_n, 4), "ans_tok_acc": round(float(acc_a) / acc_n, 4),
                       "tok_s": int(toks / dt), "lr": opt.param_groups[0]["lr"], "t": round(now(), 1)}
                msg = ""
                if xacc:
                    rec["gf"] = gf_log(xacc)
                    msg = "  | GF: %(rows_per_step).1f rows/step, value kept %(kept).3f, loss_ans %(loss_ans).4f, " \
                          "ans_acc %(ans_tok_acc).3f, loss_sel %(loss_sel).3f" % rec["gf"]
                LOG["train"].append(rec)
                say("step %d %s len %d loss_ans %.4f loss_ctx %.3f ans_acc %.3f  %.0f tok/s%s" % (
                    run["step"], name, R, rec["loss_ans"], rec["loss_ctx"], rec["ans_tok_acc"], rec["tok_s"], msg))
                acc_l, acc_a, acc_c, acc_n, toks, tlog = 0.0, 0.0, 0.0, 0, 0, time.time()
                xacc = {}
            if gate_fn is not None and step >= min_steps and step % gate_every == 0:
                ok, info = gate_fn()
                LOG["gates"].append({"stage": name, "step": run["step"], "pass": ok, **info})
                say("gate %s step %d: %s -> %s" % (name, run["step"], info, "PASS" if ok else "not yet"))
                if ok and gate_stops:
                    passed = True
                    break
        st.update({"end_step": run["step"], "steps": run["step"] - st["start_step"], "passed": passed,
                   "t1": round(now(), 1), "s_per_step": round((now() - t_stage) / max(1, step), 4)})
        LOG["stages"].append(st)
        say("stage %s done: %d steps, passed=%s, %.3f s/step" % (name, st["steps"], passed, st["s_per_step"]))
        return passed

    gate_spec = [(k, float(v)) for k, v in (x.split(":") for x in args.gate.split(",") if x)]

    def task_gate(length):
        def fn():
            info, ok = {}, True
            for task in T.TASKS:
                items = [it for _, it in evals.get(task, length, args.gate_cases)]
                em = sum(exact_match(model, items, dev, amp)) / len(items)
                info[task] = round(em, 3)
            for k, v in gate_spec:
                ok = ok and info.get(k, 0) >= v
            return ok, info
        return fn

    # ------------------------------------------------------------ stage A: copy circuit, 2 layers
    seed_rows = [rows.row("copy", T.derive_seed(args.seed, 0xC0B1, i), 128) for i in range(64)]
    # held-out long periods: 32..64 of 128 tokens (2-4 repeats)
    long_rows = [rows.copy_short(T.SplitMix64(T.derive_seed(args.seed, 0xC0B2, i)), 128, 32 + i % 33)
                 for i in range(64)]
    mq_rows = [rows.row("mqar", T.derive_seed(args.seed, 0xC0B3, i), 128) for i in range(64)]

    def copy_gate():
        a = copy_accuracy(model, long_rows, dev, amp)
        b = copy_accuracy(model, seed_rows, dev, amp)
        m = copy_accuracy(model, mq_rows, dev, amp)
        return a >= args.copy_gate and m >= 0.5, {"copy_long": round(a, 3), "copy": round(b, 3), "mqar": round(m, 3)}

    copy_lens = [int(x) for x in args.copy_lens.split(",")]
    if not args.resume:
        passed = train_steps("A-copy-%dL" % len(model.model.layers), 1,
                             lambda r: copy_lens[r.below(len(copy_lens))],
                             lambda R: [("copy", 0.6), ("mqar", 0.4)],
                             args.copy_batch_tokens, args.lr_copy, int(args.copy_max_steps * args.steps_scale),
                             100, copy_gate, 50, args.stage_min)
        ok, info = copy_gate()
        event("copy_stage", passed=passed, **info)
        # ------------------------------------------------------------ growth
        if args.theta_copy and args.theta_copy != args.theta:
            model.set_theta(args.theta)
            say("RoPE theta -> %g" % args.theta)
        model.grow(args.layers, gen=gen_init)
        model.to(dev)
        ok, info = copy_gate()
        say("grown to %d layers (%.2fM params): %s" % (len(model.model.layers), model.n_params() / 1e6, info))
        event("grown", layers=len(model.model.layers), **info)
        # a short consolidation at 128-256 with all layers
        if not run["stop"]:
            train_steps("A2-copy-%dL" % len(model.model.layers), 2, lambda r: [128, 256][r.below(2)],
                        lambda R: [("copy", 0.5), ("mqar", 0.3), ("text", 0.2)],
                        args.copy_batch_tokens * 2, args.lr, int(600 * args.steps_scale), 50, copy_gate, 50,
                        50)

    # ------------------------------------------------------------ the length ladder
    full = ladder(args.max_len, args.ladder_start)
    lad = [L for L in full if L > state.get("trained_len", 0)] or [args.max_len]
    if args.gemfilter_ft:
        lad = []                                   # the fine-tuning stage below instead
    caps = {256: 600, 512: 800, 1024: 600, 2048: 500, 4096: 500, 8192: 400}
    for li, L in enumerate(lad):
        if run["stop"]:
            break
        final = li == len(lad) - 1
        shorter = [x for x in full if x < L][-3:]

        def lens_fn(r, L=L, shorter=shorter):
            if shorter and r.uniform() < 0.3:
                return shorter[r.below(len(shorter))]
            return L

        def mix_fn(R):
            return SHORT_MIX if R <= 256 else TASK_MIX

        if final:
            steps = args.final_steps or 10 ** 9
            t_start = now()
            s0 = run["step"]

            def cooldown(step, t_start=t_start):
                if args.final_steps:
                    frac = step / args.final_steps
                else:
                    frac = (now() - t_start) / max(1.0, deadline - t_start)
                return 1.0 if frac < 0.7 else max(0.1, 1.0 - (frac - 0.7) / 0.3 * 0.9)

            train_steps("L%d-final" % L, 100 + L, lens_fn, mix_fn, args.batch_tokens, args.lr, steps, 50,
                        task_gate(L), args.monitor_every, args.monitor_every, cooldown, gate_stops=False)
            if run["step"] > s0:
                state["trained_len"] = max(state.get("trained_len", 0), L)
        else:
            passed = train_steps("L%d" % L, 100 + L, lens_fn, mix_fn, args.batch_tokens, args.lr,
                                 int(caps.get(L, 500) * args.steps_scale), 50, task_gate(L), args.gate_every,
                                 args.stage_min)
            state["trained_len"] = max(state.get("trained_len", 0), L)
            if not passed:
                say("WARNING: gate not passed at %d; moving on (step cap)" % L)

    # ------------------------------------------------------------ GemFilter fine-tuning
    vf = ValueFinder(tok)
    if args.gemfilter_ft:
        L = state.get("trained_len") or args.max_len
        gf_hi = gf_lens[1] or L
        gf_lo = min(gf_lens[0], gf_hi)
        gfr = GemFilterRows(rows, tok, args.gf_rows, gf_tasks, gf_layers, gf_ks, gf_lo, gf_hi,
                            args.gf_keep_missing, args.gf_select_fp32)
        say("GemFilter fine-tuning at %d: %d GemFilter rows a step (prompts %d..%d, r %s, k %s, tasks %s), "
            "lr %g" % (L, args.gf_rows, gf_lo, gf_hi, gf_layers, gf_ks, gf_tasks, args.ft_lr))
        full = ladder(L, args.ladder_start)
        shorter = [x for x in full if x < L][-3:]
        if gf_eval and args.gf_baseline_cases > 0:
            t = now()
            lens0 = [x for x in ladder(L, 512) if x <= L]
            LOG["gf_baseline"] = final_eval(model, evals, lens0, args, dev, amp, gf=gf_eval, vf=vf, full=False,
                                            n_cases=args.gf_baseline_cases, end=now() + 60.0)
            say("GemFilter eval of the starting model done in %.1fs" % (now() - t))
        shown_gf = []

        def gf_fn(step, seed):
            ids_l, codes_l, st = gfr.batch(model, seed, dev, amp)
            x = {"steps": 1, "rows": st["rows"], "used": st["used"], "kept": st["kept"], "found": st["found"],
                 "tokens_in": st["tokens_in"]}
            sel_loss = selection_loss(st["prompts"], st["answers"]) if args.sel_weight > 0 else None
            if sel_loss is not None:
                x.update(sel_loss=sel_loss.detach(), sel_steps=1)
            if not ids_l:
                return (None if sel_loss is None else sel_loss * args.sel_weight), x
            if not shown_gf:
                shown_gf.append(1)
                say("example GemFilter row (prompts of ~%d tokens; this row %d tokens with the answer): %s" % (
                    st["len"], len(ids_l[0]), show_row(tok, ids_l[0], codes_l[0], 60, 60)))
            W = max(map(len, ids_l))
            ids = torch.tensor([r + [PAD] * (W - len(r)) for r in ids_l], dtype=torch.long).to(dev)
            codes = torch.tensor([c + [C_NONE] * (W - len(c)) for c in codes_l], dtype=torch.long).to(dev)
            with amp():
                logits = model(ids[:, :-1])
            tgt, c = ids[:, 1:], codes[:, 1:]
            ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), tgt.reshape(-1),
                                 reduction="none").view_as(tgt)
            ma = (c == C_ANS).float()
            la = (ce * ma).sum() / ma.sum().clamp(min=1)
            with torch.no_grad():
                acc = ((logits.argmax(-1) == tgt).float() * ma).sum() / ma.sum().clamp(min=1)
            x.update(loss=la.detach(), acc=acc, loss_steps=1)
            total = la * args.gf_weight
            if sel_loss is not None:
                total = total + sel_loss * args.sel_weight
            return total, x

        def selection_loss(prompts, answers):
            """The selection objective (--sel-weight > 0): at filter layer --sel-layer, GemFilter's
            own score of each prompt (last query, raw q.k summed over heads, post-RoPE) divided by
            --sel-temp, as a distribution over the prompt's positions; loss = -log of the mass on
            the needle's value tokens (every occurrence). Large LLMs show this early-layer retrieval
            without being asked (the GemFilter paper's observation); a 20M model does not, so it is
            trained for here, and that is stated wherever the model's GemFilter figures appear."""
            items = []
            for p, a in zip(prompts, answers):
                pos = sorted({i for sp in vf.spans(p, a) for i in sp})
                if pos:
                    items.append((p, pos))
            items = items[:args.sel_rows]
            if not items:
                return None
            W = max(len(p) for p, _ in items)
            ids = torch.tensor([p + [PAD] * (W - len(p)) for p, _ in items], dtype=torch.long).to(dev)
            last = torch.tensor([len(p) - 1 for p, _ in items], dtype=torch.long, device=dev)
            lay = torch.full((len(items),), args.sel_layer, dtype=torch.long, device=dev)
            with amp():
                raw = model.filter_scores_grad(ids, last, lay)
            z = raw.float() / args.sel_temp
            valid = torch.arange(W, device=dev)[None, :] <= last[:, None]
            z = z.masked_fill(~valid, float("-inf"))
            tgt = torch.zeros_like(valid)
            for b, (_, pos) in enumerate(items):
                tgt[b, torch.tensor(pos, device=dev)] = True
            lse_all = torch.logsumexp(z, dim=1)
            lse_val = torch.logsumexp(z.masked_fill(~tgt, float("-inf")), dim=1)
            return (lse_all - lse_val).mean()

        def ft_monitor():
            info = {}
            for task in T.TASKS:
                items = [it for _, it in evals.get(task, L, args.gate_cases)]
                info[task] = round(sum(exact_match(model, items, dev, amp)) / len(items), 3)
                for r, ks in gf_eval[:1]:
                    ok, kept = gemfilter_eval(model, items, r, ks[:1], vf, dev, amp)[ks[0]]
                    info["%s_gf_r%d_k%d" % (task, r, ks[0])] = round(sum(ok) / len(ok), 3)
            return False, info

        steps = args.final_steps or 10 ** 9
        t_start = now()

        def cooldown(step, t_start=t_start):
            frac = step / args.final_steps if args.final_steps else \
                (now() - t_start) / max(1.0, deadline - t_start)
            return 1.0 if frac < 0.7 else max(0.1, 1.0 - (frac - 0.7) / 0.3 * 0.9)

        def lens_fn(r, L=L, shorter=shorter):
            if shorter and r.uniform() < 0.3:
                return shorter[r.below(len(shorter))]
            return L

        train_steps("GF-ft-L%d" % L, 0x6F00 + L, lens_fn, lambda R: SHORT_MIX if R <= 256 else TASK_MIX,
                    args.batch_tokens, args.ft_lr, steps, 50, ft_monitor, args.monitor_every,
                    args.monitor_every, cooldown, gate_stops=False, extra=gf_fn)
        state.setdefault("gemfilter_ft", []).append({"session": state["session"], "steps": run["step"] - state.get(
            "global_step", 0), "layers": args.gf_layers, "ks": args.gf_ks, "tasks": args.gf_tasks,
            "lens": [gf_lo, gf_hi], "rows_per_step": args.gf_rows, "lr": args.ft_lr})

    # ------------------------------------------------------------ save
    state["global_step"] = run["step"]
    state["history"] = state.get("history", []) + [{"session": state["session"], "steps": run["step"],
                                                    "trained_len": state["trained_len"], "t": round(now(), 1)}]
    state["theta"] = model.c["rope_theta"]
    state["seed"] = args.seed
    save_model(model, tok, model_dir, state, args)
    say("saved model folder", model_dir)

    # ------------------------------------------------------------ final evaluation
    trained = state["trained_len"] or args.max_len
    lens = [int(x) for x in args.eval_lens.split(",")] if args.eval_lens else \
        [x for x in ladder(trained, 512) if x <= trained]
    table = final_eval(model, evals, lens, args, dev, amp, gf=gf_eval, vf=vf)
    LOG["final_eval"] = table
    LOG["parity"] = hf_parity(model_dir, evals, lens, dev)
    LOG["total_s"] = round(now(), 1)
    with open(os.path.join(model_dir, "train_log.json"), "w") as f:
        json.dump(LOG, f, indent=1)
    with open(os.path.join(args.out, "train_log.json"), "w") as f:
        json.dump(LOG, f, indent=1)
    summary = summarize(table, state, LOG, baseline)
    print(summary)
    with open(os.path.join(args.out, "summary.txt"), "w") as f:
        f.write(summary)
    if not args.no_tar:
        parts = write_tar(model_dir, args.out, "kvsieve-tiny")
        say("transport:", ", ".join(parts))
    say("done in %.1fs" % now())


# ===================================================================== final eval / summary
def final_eval(model, evals, lens, args, dev, amp, gf=None, vf=None, full=True, n_cases=None, end=None):
    """The table: per (task, length) cell the greedy EM with full attention (full=True) and, for
    each GemFilter configuration (r, [k, ...]) of gf, the EM after the model's own GemFilter
    selection and the fraction of cases whose needle value was wholly selected.  Cells shrink
    (never below 11 cases) when the time left before `end` (default: the budget less 8 s) is
    short; skipped cells are listed."""
    table = {}
    end = args.time_budget - 8.0 if end is None else end
    gf = gf or []
    cost = (1.0 if full else 0.0) + 2.5 * len(gf)       # relative to one full-attention pass
    for L in lens:
        for task in T.TASKS:
            if now() > end:
                table.setdefault("skipped", []).append("%s@%d" % (task, L))
                continue
            n = n_cases or args.eval_cases
            left = end - now()
            cells_left = max(1, (len(lens) - lens.index(L)) * 4)
            # shrink the cell when time is short (about 0.02 s per case per 1K tokens is ample)
            per = 0.004 * L / 1024 * cost
            if left / cells_left < n * per + 1:
                n = max(11, int((left / cells_left - 1) / per))
            cases = evals.get(task, L, n)
            items = [it for _, it in cases]
            depths = ["%.1f" % c.meta["depth"] for c, _ in cases]

            def by_depth(ok):
                acc = {}
                for d, g in zip(depths, ok):
                    if g is None:
                        continue
                    a = acc.setdefault(d, [0, 0])
                    a[0] += int(g)
                    a[1] += 1
                return {k: round(a / b, 3) for k, (a, b) in sorted(acc.items())}

            toks = [len(it[0]) for it in items]
            cell = {"n": len(items), "prompt_tokens": [min(toks), max(toks)]}
            msg = ""
            if full:
                ok = exact_match(model, items, dev, amp)
                cell.update(em=round(sum(ok) / len(ok), 4), by_depth=by_depth(ok))
                msg = "EM %.3f" % cell["em"]
            for r, ks in gf:
                res = gemfilter_eval(model, items, r, ks, vf, dev, amp)
                for k in ks:
                    ok, kept = res[k]
                    found = [x for x in kept if x is not None]
                    cell.setdefault("gemfilter", {})["r%d_k%d" % (r, k)] = {
                        "em": round(sum(ok) / len(ok), 4),
                        "value_kept": round(sum(found) / len(found), 4) if found else None,
                        "value_found": len(found), "by_depth": by_depth(ok), "kept_by_depth": by_depth(kept)}
                    msg += "  GF r%d k%d EM %.3f kept %s" % (r, k, sum(ok) / len(ok),
                                                            "%.3f" % (sum(found) / len(found)) if found else "-")
            table["%s@%d" % (task, L)] = cell
            say("eval %-8s @%5d: %s (n=%d)" % (task, L, msg.strip(), len(items)))
    return table


def _gf_keys(table):
    keys = []
    for k, c in table.items():
        if "@" in k:
            for g in c.get("gemfilter", {}):
                if g not in keys:
                    keys.append(g)
    return sorted(keys, key=lambda g: (int(g.split("_")[0][1:]), -int(g.split("_k")[1])))


def summarize(table, state, log, baseline=None):
    lens = sorted({int(k.split("@")[1]) for k in table if "@" in k})
    lines = ["kvsieve-tiny: trained_len %s, steps %s, %.0fs" % (state.get("trained_len"), state.get("global_step"),
                                                               now()),
             "exact match (greedy), cases per cell in parentheses",
             "%-9s" % "task" + "".join("%14d" % L for L in lens)]
    drops = []
    for task in T.TASKS:
        row = "%-9s" % task
        for L in lens:
            key = "%s@%d" % (task, L)
            c = table.get(key)
            b = (baseline or {}).get(key)
            mark = " "
            if c and "em" in c and b and "em" in b and c["em"] < b["em"] - 0.01:
                mark = "!"
                drops.append("%s %.3f -> %.3f" % (key, b["em"], c["em"]))
            row += "%14s" % ("%.3f (%d)%s" % (c["em"], c["n"], mark) if c and "em" in c else "-")
        lines.append(row)
    if baseline:
        lines.append("vs the starting model (same held-out cases): " +
                     ("dropped by more than one case (marked !): " + ", ".join(drops) if drops else
                      "no cell dropped by more than one case"))
    if lens and any("em" in table.get("%s@%d" % (t, L), {}) for t in T.TASKS for L in lens):
        miss = []
        for t in T.TASKS:
            for L in lens:
                c = table.get("%s@%d" % (t, L))
                want = 1.0 if t in ("passkey", "niah") else (0.95 if L == lens[-1] else None)
                if want is not None and (not c or "em" not in c or c["em"] < want):
                    miss.append("%s@%d %s" % (t, L, "%.3f" % c["em"] if c and "em" in c else "missing"))
        lines.append("full-attention targets (passkey/niah 1.000 at every length, multikey/kv >= 0.95 at %d): %s"
                     % (lens[-1], "met" if not miss else "NOT met: " + ", ".join(miss)))
    gks = _gf_keys(table)
    if gks:
        lines += _gf_table(table, lens, gks, "after GemFilter", True)
        bl = log.get("gf_baseline")
        if bl:
            lines += _gf_table(bl, lens, gks, "the starting model (before fine-tuning) after GemFilter", False)
    if table.get("skipped"):
        lines.append("skipped (time): " + ", ".join(table["skipped"]))
    ft = state.get("gemfilter_ft")
    if ft:
        lines.append("GemFilter fine-tuning: " + json.dumps(ft[-1]))
    p = log.get("parity")
    if p:
        lines.append("HF parity: " + json.dumps(p))
    return "\n".join(lines) + "\n"


def _gf_table(table, lens, gks, title, with_full):
    """Cells 'full EM | GF EM per configuration | value kept per configuration (cases)'."""
    names = [g.replace("_", " ") for g in gks]
    cells = {}
    for task in T.TASKS:
        for L in lens:
            c = table.get("%s@%d" % (task, L))
            if not c or "gemfilter" not in c:
                cells[task, L] = "-"
                continue
            gf = c["gemfilter"]
            em = " ".join("%.3f" % gf[g]["em"] if g in gf else "-" for g in gks)
            kept = " ".join("%.2f" % gf[g]["value_kept"] if g in gf and gf[g]["value_kept"] is not None else "-"
                            for g in gks)
            cells[task, L] = ("%.3f | " % c["em"] if with_full and "em" in c else "") + em + " | " + kept + \
                " (%d)" % c["n"]
    w = max(len(x) for x in cells.values()) + 3
    out = ["", "%s (the model's own selection, then a fresh prefill of the k kept tokens at positions 0..k-1):"
           % title,
           "cell = %sEM %s | needle value wholly selected, %s (cases)" % (
               "full EM | " if with_full else "", ", ".join(names), ", ".join(names)),
           "%-9s" % "task" + "".join("%*d" % (w, L) for L in lens)]
    for task in T.TASKS:
        out.append("%-9s" % task + "".join("%*s" % (w, cells[task, L]) for L in lens))
    return out


def hf_parity(model_dir, evals, lens, dev):
    """Load the saved folder with HF transformers (when installed): logits vs our model on one
    prompt (both float32 from the bf16 file), tokenizer equality, and greedy generate on a few cases."""
    try:
        import transformers
        from transformers import AutoTokenizer, LlamaForCausalLM
    except Exception as e:  # noqa: BLE001
        return {"skipped": "transformers not importable: %s" % type(e).__name__}
    out = {"transformers": transformers.__version__}
    try:
        try:
            hf = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        except TypeError:
            hf = LlamaForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
        hf.to(dev).eval()
        with open(os.path.join(model_dir, "config.json")) as f:
            mine = LlamaLM(config_from_hf(json.load(f)))
        sd = load_safetensors(os.path.join(model_dir, "model.safetensors"))
        mine.load_state_dict({k: v.float() for k, v in sd.items()}, strict=False)
        mine.to(dev).eval()
        L = min(2048, max(lens))
        case, (pids, aids) = evals.get("multikey", L, 1)[0]
        ids = torch.tensor([pids + aids], device=dev)
        with torch.no_grad():
            a = hf(ids).logits.float()
            b = mine(ids).float()
        out["max_logit_diff"] = float((a - b).abs().max())
        out["argmax_agree"] = float((a.argmax(-1) == b.argmax(-1)).float().mean())
        hft = AutoTokenizer.from_pretrained(model_dir)
        out["tokenizer_equal"] = hft(case.prompt)["input_ids"] == pids
        gen_ok = 0
        items = evals.get("niah", min(1024, max(lens)), 8)
        for c, (p, ans) in items:
            g = hf.generate(torch.tensor([p], device=dev), max_new_tokens=len(ans), do_sample=False,
                            pad_token_id=PAD)
            gen_ok += int(g[0, len(p):].tolist() == ans)
        out["hf_generate_em_niah"] = "%d/%d" % (gen_ok, len(items))
    except Exception as e:  # noqa: BLE001
        out["error"] = "%s: %s" % (type(e).__name__, str(e)[:300])
    return out


# ===================================================================== files
def save_model(model, tok, d, state, args):
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(model.hf_config(), f, indent=2)
    with open(os.path.join(d, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": BOS, "eos_token_id": EOS, "pad_token_id": PAD, "do_sample": False}, f, indent=2)
    save_safetensors(os.path.join(d, "model.safetensors"), model.hf_state(), dtype=torch.bfloat16)
    tok.save(d, max_len=model.c["max_position_embeddings"])
    with open(os.path.join(d, "train_state.json"), "w") as f:
        json.dump(state, f, indent=1)
    for n in ("tasks.py", "train.py", "model.py", "tok.py"):
        pass  # the scripts live in the repo; the folder records the state, not the code


def write_tar(src, out, name, part_bytes=15 * 1024 * 1024):
    """Deterministic tar.gz of the folder (sorted names, zero mtimes, uid 0), split into parts
    of at most part_bytes: NAME.tar.gz or NAME.tar.gz.part00, .part01, ... (cat them back)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        for fn in sorted(os.listdir(src)):
            p = os.path.join(src, fn)
            if not os.path.isfile(p):
                continue
            with open(p, "rb") as f:
                data = f.read()
            ti = tarfile.TarInfo(name + "/" + fn)
            ti.size, ti.mtime, ti.mode, ti.uid, ti.gid = len(data), 0, 0o644, 0, 0
            tf.addfile(ti, io.BytesIO(data))
    gz = io.BytesIO()
    with gzip.GzipFile(fileobj=gz, mode="wb", compresslevel=6, mtime=0, filename="") as g:
        g.write(buf.getvalue())
    blob = gz.getvalue()
    if len(blob) <= part_bytes:
        p = os.path.join(out, name + ".tar.gz")
        with open(p, "wb") as f:
            f.write(blob)
        return [os.path.basename(p)]
    names = []
    for i in range(0, len(blob), part_bytes):
        p = os.path.join(out, "%s.tar.gz.part%02d" % (name, i // part_bytes))
        with open(p, "wb") as f:
            f.write(blob[i:i + part_bytes])
        names.append(os.path.basename(p))
    return names


if __name__ == "__main__":
    main()
