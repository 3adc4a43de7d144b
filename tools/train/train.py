#!/usr/bin/env python3
"""Train kvsieve's small long-context Llama (see README.md next to this file).

One run: byte-level BPE tokenizer -> 2-layer model that learns to copy (induction heads) on
short copy / associative-recall rows -> grown to the final depth with identity-initialised
layers -> retrieval tasks mixed with plain text on a length ladder 256 -> 512 -> 1K -> 2K -> 4K
(-> 8K), each step up taken only once retrieval works at the current length -> the final length
until the time budget -> HF-layout model folder, final evaluation table, tar.gz for transport.
--resume DIR continues from such a folder (e.g. to lengthen to 8K).

Usage (GPU machine, repo root):
    python3 tools/train/train.py --corpora .data/corpora --out $OUT --time-budget 500
CPU check of the recipe (no HF packages needed):
    python3 tools/train/train.py --cpu-smoke --corpora ../shared/corpora --out /tmp/smoke
"""

import argparse
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
from model import LlamaLM, config_from_hf, default_config, load_safetensors, save_safetensors  # noqa: E402
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
    args = ap.parse_args()

    if args.cpu_smoke:
        # the recipe at toy scale: byte tokenizer, narrow model (hidden 128: a 2-core CPU forms the copy
        # circuit in a few hundred steps there; width delays it, a large batch brings it back -- see
        # README), copy stage 64-128, growth to 4 layers, a 512 -> 1024 ladder
        d = dict(device="cpu", tokenizer="bytes", hidden=128, heads=2, kv_heads=1, head_dim=64, ffn=256,
                 layers=4, max_len=1024, ladder_start=512, batch_tokens=4096, copy_batch_tokens=8192,
                 gate_cases=16, gate_every=50, stage_min=50, monitor_every=100, eval_cases=22, log_every=25,
                 max_pos=2048, eval_reserve=150.0, time_budget=2700.0)
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
                    gate_every, min_steps, cooldown=None, gate_stops=True):
        """Train until gate_fn() passes (checked every gate_every steps after min_steps), max_steps,
        or the deadline.  lens_fn(rng) -> row length of this step; mix_fn(R) -> kind mix."""
        opt = make_opt(lr)
        layer_fn()
        st = {"name": name, "start_step": run["step"], "t0": round(now(), 1)}
        say("=== stage %s: lr %g, up to %d steps" % (name, lr, max_steps))
        shown = set()
        acc_l, acc_a, acc_c, acc_n, toks, tlog = 0.0, 0.0, 0.0, 0, 0, time.time()
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
                LOG["train"].append(rec)
                say("step %d %s len %d loss_ans %.4f loss_ctx %.3f ans_acc %.3f  %.0f tok/s" % (
                    run["step"], name, R, rec["loss_ans"], rec["loss_ctx"], rec["ans_tok_acc"], rec["tok_s"]))
                acc_l, acc_a, acc_c, acc_n, toks, tlog = 0.0, 0.0, 0.0, 0, 0, time.time()
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
    table = final_eval(model, evals, lens, args, dev, amp)
    LOG["final_eval"] = table
    LOG["parity"] = hf_parity(model_dir, evals, lens, dev)
    LOG["total_s"] = round(now(), 1)
    with open(os.path.join(model_dir, "train_log.json"), "w") as f:
        json.dump(LOG, f, indent=1)
    with open(os.path.join(args.out, "train_log.json"), "w") as f:
        json.dump(LOG, f, indent=1)
    summary = summarize(table, state, LOG)
    print(summary)
    with open(os.path.join(args.out, "summary.txt"), "w") as f:
        f.write(summary)
    if not args.no_tar:
        parts = write_tar(model_dir, args.out, "kvsieve-tiny")
        say("transport:", ", ".join(parts))
    say("done in %.1fs" % now())


# ===================================================================== final eval / summary
def final_eval(model, evals, lens, args, dev, amp):
    table = {}
    end = args.time_budget - 8.0
    for L in lens:
        for task in T.TASKS:
            if now() > end:
                table.setdefault("skipped", []).append("%s@%d" % (task, L))
                continue
            n = args.eval_cases
            left = end - now()
            cells_left = max(1, (len(lens) - lens.index(L)) * 4)
            # shrink the cell when time is short (about 0.02 s per case per 1K tokens is ample)
            if left / cells_left < n * 0.004 * L / 1024 + 1:
                n = max(11, int((left / cells_left - 1) / (0.004 * L / 1024)))
            cases = evals.get(task, L, n)
            ok = exact_match(model, [it for _, it in cases], dev, amp)
            by_depth = {}
            for (c, _), g in zip(cases, ok):
                d = "%.1f" % c.meta["depth"]
                a = by_depth.setdefault(d, [0, 0])
                a[0] += int(g)
                a[1] += 1
            toks = [len(it[0]) for _, it in cases]
            table["%s@%d" % (task, L)] = {"em": round(sum(ok) / len(ok), 4), "n": len(ok),
                                          "prompt_tokens": [min(toks), max(toks)],
                                          "by_depth": {k: round(a / b, 3) for k, (a, b) in sorted(by_depth.items())}}
            say("eval %-8s @%5d: EM %.3f (n=%d)" % (task, L, sum(ok) / len(ok), len(ok)))
    return table


def summarize(table, state, log):
    lens = sorted({int(k.split("@")[1]) for k in table if "@" in k})
    lines = ["kvsieve-tiny: trained_len %s, steps %s, %.0fs" % (state.get("trained_len"), state.get("global_step"),
                                                               now()),
             "exact match (greedy), cases per cell in parentheses",
             "%-9s" % "task" + "".join("%14d" % L for L in lens)]
    for task in T.TASKS:
        row = "%-9s" % task
        for L in lens:
            c = table.get("%s@%d" % (task, L))
            row += "%14s" % ("%.3f (%d)" % (c["em"], c["n"]) if c else "-")
        lines.append(row)
    if table.get("skipped"):
        lines.append("skipped (time): " + ", ".join(table["skipped"]))
    p = log.get("parity")
    if p:
        lines.append("HF parity: " + json.dumps(p))
    return "\n".join(lines) + "\n"


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
