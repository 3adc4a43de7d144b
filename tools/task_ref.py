#!/usr/bin/env python3
"""task_ref.py — reference cases of tools/train/tasks.py for the C port (core/tasks.c).

Writes tests/fixtures/tasks/cases.json: for each case (task, length, eval index) the seed,
the number of units the length search chose, the token count, the answer, the prompt's byte
length, its 64-bit FNV-1a hash and its first/last 80 characters; plus the haystack
document's size, sentence count and hash. tests/test_tasks.c regenerates every case with
the C generator and compares.

tasks.py is imported unchanged. Its tokenizer is the project's own (core/tokenizer.c, proven
identical to HF `tokenizers` by tests/test_tokenizer*.c): a `kvsieve run` process with a small
Lua loop that reads length-prefixed texts on stdin and answers their ids, so no HF Python
package is needed.

    python3 tools/task_ref.py                      # writes tests/fixtures/tasks/cases.json
    python3 tools/task_ref.py --kvsieve build-x/kvsieve --corpora ../shared/corpora --out FILE
    python3 tools/task_ref.py --check              # compare with the committed fixture, write nothing

Run from the repository root (the defaults are relative to it).
"""

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "train"))
import tasks  # noqa: E402  (tools/train/tasks.py, unchanged)

BASE_SEED = tasks.derive_seed(1234, 0xE7A1)  # the training run's held-out base (README)
# (length, eval indices): depth = (index mod 11) / 10 -> 0, 1 and one inner depth per length
GRID = ((512, (0, 10, 3)), (1024, (0, 10, 5)), (4096, (0, 10)))

LUA_SERVER = r"""
local m = ks.load(arg[1])
while true do
  local line = io.read("l")
  if not line then break end
  local n = tonumber(line)
  local text = n > 0 and io.read(n) or ""
  local ids = m:encode(text, {special = false})
  io.write(#ids, "\n", table.concat(ids, " "), "\n")
  io.flush()
end
"""


class KsTokenizer:
    """encode(text) -> ids through `kvsieve run` (model folder with tokenizer.json)."""

    def __init__(self, kvsieve, model_dir):
        fd, self.script = tempfile.mkstemp(suffix=".lua", prefix="task_ref_")
        with os.fdopen(fd, "w") as f:
            f.write(LUA_SERVER)
        self.p = subprocess.Popen([kvsieve, "run", self.script, model_dir], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE)
        self.calls = 0

    def encode(self, text):
        b = text.encode("utf-8")
        self.p.stdin.write(b"%d\n" % len(b) + b)
        self.p.stdin.flush()
        head = self.p.stdout.readline()
        if not head:
            raise RuntimeError("kvsieve run (tokenizer) exited; see its stderr above")
        n = int(head)
        ids = self.p.stdout.readline().split()
        if len(ids) != n:
            raise RuntimeError("tokenizer answered %d ids, announced %d" % (len(ids), n))
        self.calls += 1
        return [int(x) for x in ids]

    def close(self):
        self.p.stdin.close()
        self.p.wait()
        os.unlink(self.script)


def fnv1a64(data):
    h = 0xCBF29CE484222325
    for c in data:
        h = ((h ^ c) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def make_fixture(gen, doc, n_sentences, tokenizer_path):
    with open(tokenizer_path, "rb") as f:
        tok_sha = hashlib.sha256(f.read()).hexdigest()
    cases = []
    for task in tasks.TASKS:
        for length, indices in GRID:
            for i in indices:
                depth = tasks.eval_depth(i)
                seed = tasks.case_seed(BASE_SEED, task, length, depth, i)
                c = gen.make(task, seed, length, depth)
                units = c.meta["sentences"] if task in ("niah", "multikey") else (
                    c.meta["pairs"] if task == "kv" else c.meta["units"])
                pb = c.prompt.encode("utf-8")
                cases.append({
                    "task": task, "length": length, "index": i, "depth": depth,
                    "seed": "0x%016x" % seed,
                    "n_units": units,
                    "n_tokens": gen.ntokens(c.prompt),
                    "answer": c.answer,
                    "prompt_bytes": len(pb),
                    "prompt_fnv1a64": "0x%016x" % fnv1a64(pb),
                    "head": c.prompt[:80],
                    "tail": c.prompt[-80:],
                })
                print("%-8s L=%-5d i=%-2d depth=%.1f units=%-4d tokens=%-5d answer=%r" % (
                    task, length, i, depth, units, cases[-1]["n_tokens"], c.answer), file=sys.stderr)
    db = doc.encode("utf-8")
    return {
        "version": 1,
        "generator": "tools/task_ref.py",
        "regenerate": "python3 tools/task_ref.py (repo root; needs build/kvsieve and ../shared/corpora)",
        "spec": "tools/train/tasks.py, tools/train/README.md (Task format specification)",
        "tokenizer": "models/kvsieve-tiny/tokenizer.json",
        "tokenizer_sha256": tok_sha,
        "base_seed": "0x%016x" % BASE_SEED,
        "haystack": {"chars": len(doc), "bytes": len(db), "sentences": n_sentences,
                     "fnv1a64": "0x%016x" % fnv1a64(db)},
        "cases": cases,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kvsieve", default="build/kvsieve")
    ap.add_argument("--model", default="models/kvsieve-tiny")
    ap.add_argument("--corpora", default="../shared/corpora")
    ap.add_argument("--out", default="tests/fixtures/tasks/cases.json")
    ap.add_argument("--check", action="store_true", help="compare with --out instead of writing it")
    a = ap.parse_args()

    doc = tasks.load_document(a.corpora)
    sentences = tasks.split_sentences(doc)
    tok = KsTokenizer(a.kvsieve, a.model)
    try:
        gen = tasks.TaskGen(tok, sentences)
        # the README's test vectors first: a wrong tokenizer or corpus shows here
        assert tasks.derive_seed(1, 2, 3) == 0x1A0F71893F2718C4
        c = gen.eval_case(BASE_SEED, "niah", 4096, 0)
        assert (c.meta["word"], c.meta["key"]) == ("copper", "1358853"), c.meta
        fx = make_fixture(gen, doc, len(sentences), os.path.join(a.model, "tokenizer.json"))
    finally:
        tok.close()
    text = json.dumps(fx, indent=1, ensure_ascii=False) + "\n"
    if a.check:
        with open(a.out, encoding="utf-8") as f:
            same = f.read() == text
        print("fixture %s: %s" % (a.out, "identical" if same else "DIFFERS"), file=sys.stderr)
        return 0 if same else 1
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out, "w", encoding="utf-8") as f:
        f.write(text)
    print("wrote %s (%d cases, %d tokenizer calls)" % (a.out, len(fx["cases"]), tok.calls), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
