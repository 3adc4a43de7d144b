"""Deterministic long-context retrieval task generators (kvsieve).

Four tasks, each case = (prompt text, answer text), scored by exact match of greedy
decoding: the model, given BOS + tokens(prompt), must produce exactly tokens(answer)
as its next len(tokens(answer)) greedy tokens.

    passkey   InfiniteBench-style pass key in a repeated filler
    niah      one needle sentence in a natural-text haystack (the corpora)
    multikey  the needle plus >= 3 distractor needles with other keys (RULER-style)
    kv        a JSON object of UUID-like "key": "value" pairs

Everything random comes from SplitMix64 (below), never from Python's `random`, so that a
C implementation reproduces every case bit for bit from (seed, task, length, depth, index).
The exact specification is in README.md next to this file; keep the two in sync.

Only the standard library is needed here.  A tokenizer is any object with
`encode(text) -> list[int]` (no special tokens added); prompt length in tokens is
1 (BOS) + len(encode(prompt)).
"""

import os

M64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


def mix64(z):
    """SplitMix64 output function (Stafford variant 13)."""
    z &= M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


class SplitMix64:
    """state += GOLDEN; return mix64(state)."""

    __slots__ = ("state",)

    def __init__(self, seed):
        self.state = seed & M64

    def next(self):
        self.state = (self.state + GOLDEN) & M64
        return mix64(self.state)

    def below(self, n):
        """Integer in [0, n): next() % n (the tiny modulo bias is part of the spec)."""
        return self.next() % n

    def uniform(self):
        """Float in [0, 1): (next() >> 11) * 2^-53."""
        return (self.next() >> 11) * (1.0 / 9007199254740992.0)


def derive_seed(*vals):
    """Seed of one case from integers: x = 0; for v: x = mix64(x ^ v) + GOLDEN (mod 2^64)."""
    x = 0
    for v in vals:
        x = (mix64(x ^ (v & M64)) + GOLDEN) & M64
    return x


TASK_IDS = {"passkey": 1, "niah": 2, "multikey": 3, "kv": 4}


def case_seed(base_seed, task, length, depth, index):
    """The seed of eval case `index` of (task, length, depth)."""
    return derive_seed(base_seed, TASK_IDS[task], length, depth_permille(depth), index)


def depth_permille(depth):
    return int(depth * 1000 + 0.5)


def eval_depth(index, n_depths=11):
    """Depth of eval case `index`: (index mod 11) / 10, i.e. 0, 0.1, ..., 1.0 in turn."""
    return (index % n_depths) / (n_depths - 1)


# ------------------------------------------------------------------ fixed texts
PASSKEY_HEADER = ("There is a pass key hidden in the following text. Find it and remember it; "
                  "you will be asked for it at the end.")
PASSKEY_FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
PASSKEY_NEEDLE = "The pass key is {key}. Remember it. {key} is the pass key."
PASSKEY_QUESTION = "What is the pass key? The pass key is"

NIAH_HEADER = ("One or more special magic numbers are hidden in the following text. Remember them; "
               "you will be asked about one of them at the end.")
NIAH_NEEDLE = "The special magic number for {word} is: {num}."
NIAH_QUESTION = "What is the special magic number for {word}? The special magic number for {word} is:"

KV_HEADER = "Extract the value corresponding to the specified key in the JSON object below.\nJSON data:"
KV_QUESTION = 'What is the value of the key "{key}" in the JSON object above?\nAnswer: "{key}": "'

# 128 needle keys (lowercase, letters only, distinct).
WORDS = (
    "apple anchor arrow badge basket beacon bottle bridge bucket button cabin camera candle canvas "
    "carpet castle cellar chair chimney circle cloud compass copper cotton cradle crystal curtain "
    "dagger desert diamond dragon drum eagle engine falcon feather fence fiddle forest fountain "
    "garden garlic glacier goblet granite harbor harvest helmet hammer honey island ivory jacket "
    "jungle kettle ladder lantern lemon letter lizard magnet mango marble meadow mirror monkey "
    "mountain needle nickel oyster paddle palace panther parrot pebble pencil pepper pillow pirate "
    "planet pocket puzzle quartz rabbit radish ribbon river rocket saddle salmon satchel shadow "
    "shovel silver spider spoon statue sugar summit teapot temple thunder ticket tiger timber "
    "tomato tower trumpet tulip tunnel turtle velvet violin wagon walnut wizard window winter "
    "wolf yogurt zebra acorn almond bamboo barrel blanket breeze cactus"
).split()
assert len(WORDS) == 128 and len(set(WORDS)) == 128


# ------------------------------------------------------------------ the haystack
def load_document(corpora_dir):
    """The haystack document: every *.txt file of corpora_dir in byte order of its name, each
    decoded as UTF-8 with U+FEFF removed and every run of whitespace (str.split()) turned into one
    space, the files joined with one space."""
    names = sorted(n for n in os.listdir(corpora_dir) if n.endswith(".txt"))
    if not names:
        raise FileNotFoundError("no *.txt corpora in %s" % corpora_dir)
    parts = []
    for n in names:
        with open(os.path.join(corpora_dir, n), encoding="utf-8") as f:
            parts.append(" ".join(f.read().replace("\ufeff", "").split()))
    return " ".join(parts)


def split_sentences(doc):
    """Sentences: cut at every space whose previous character is '.', '!' or '?'; the space is
    dropped (text = sentences joined with one space)."""
    out, start = [], 0
    for i in range(1, len(doc)):
        if doc[i] == " " and doc[i - 1] in ".!?":
            out.append(doc[start:i])
            start = i + 1
    out.append(doc[start:])
    return out


# ------------------------------------------------------------------ helpers
def uuid_like(rng):
    """Two draws a, b -> '%016x%016x' % (a, b) cut as 8-4-4-4-12 (lowercase hex)."""
    h = "%016x%016x" % (rng.next(), rng.next())
    return "%s-%s-%s-%s-%s" % (h[0:8], h[8:12], h[12:16], h[16:20], h[20:32])


def insert_index(depth, n):
    """Where a needle of the given depth goes among n units: floor(depth * n + 0.5), in [0, n]."""
    k = int(depth * n + 0.5)
    return min(max(k, 0), n)


class Case:
    __slots__ = ("task", "prompt", "answer", "meta")

    def __init__(self, task, prompt, answer, meta):
        self.task, self.prompt, self.answer, self.meta = task, prompt, answer, meta

    def __repr__(self):
        return "Case(%s, %r)" % (self.task, self.meta)


class TaskGen:
    """Generators bound to a tokenizer (for lengths) and the haystack sentences."""

    def __init__(self, tok, sentences):
        self.tok = tok
        self.sentences = sentences
        self._cost = {}

    # token count of a text as it appears after a separator (cached for repeated units)
    def cost(self, text):
        c = self._cost.get(text)
        if c is None:
            c = len(self.tok.encode(text))
            if len(self._cost) < 200000:
                self._cost[text] = c
        return c

    def ntokens(self, prompt):
        return 1 + len(self.tok.encode(prompt))

    def _largest(self, build, estimate, length):
        """Largest n >= 0 with ntokens(build(n)) <= length, searched from the estimate
        (prompt length is non-decreasing in n)."""
        n = max(0, estimate)
        while n > 0 and self.ntokens(build(n)) > length:
            n -= 1
        while self.ntokens(build(n + 1)) <= length:
            n += 1
        return n

    # -------------------------------------------------------------- passkey
    def passkey(self, seed, length, depth):
        rng = SplitMix64(seed)
        key = str(10000 + rng.below(90000))
        needle = PASSKEY_NEEDLE.format(key=key)

        def build(n):
            k = insert_index(depth, n)
            units = [PASSKEY_FILLER] * k + [needle] + [PASSKEY_FILLER] * (n - k)
            return PASSKEY_HEADER + "\n" + " ".join(units) + "\n" + PASSKEY_QUESTION

        fixed = self.ntokens(build(0))
        n = self._largest(build, (length - fixed) // max(1, self.cost(" " + PASSKEY_FILLER)), length)
        return Case("passkey", build(n), " " + key,
                    {"seed": seed, "length": length, "depth": depth, "key": key, "units": n})

    # -------------------------------------------------------------- NIAH (single and multi-key)
    def _needles(self, rng, n_needles):
        """n_needles distinct words (first = the target) and 7-digit numbers, drawn in turn:
        word by rejection (below(128) until unused), then number 1000000 + below(9000000)."""
        words, nums = [], []
        for _ in range(n_needles):
            w = WORDS[rng.below(len(WORDS))]
            while w in words:
                w = WORDS[rng.below(len(WORDS))]
            words.append(w)
            nums.append(str(1000000 + rng.below(9000000)))
        return words, nums

    def niah(self, seed, length, depth, n_distractors=0, task="niah"):
        rng = SplitMix64(seed)
        words, nums = self._needles(rng, 1 + n_distractors)
        dist_u = [rng.uniform() for _ in range(n_distractors)]   # distractor depths
        start = rng.below(len(self.sentences))
        needles = [NIAH_NEEDLE.format(word=w, num=x) for w, x in zip(words, nums)]
        question = NIAH_QUESTION.format(word=words[0])
        S = self.sentences
        ns = len(S)

        def units_of(n):
            pos = [insert_index(depth, n)] + [insert_index(u, n) for u in dist_u]
            order = sorted(range(len(needles)), key=lambda j: (pos[j], j))
            out, j = [], 0
            for i in range(n + 1):
                while j < len(order) and pos[order[j]] == i:
                    out.append(needles[order[j]])
                    j += 1
                if i < n:
                    out.append(S[(start + i) % ns])
            return out

        def build(n):
            return NIAH_HEADER + "\n" + " ".join(units_of(n)) + "\n" + question

        fixed = self.ntokens(build(0))
        budget, est = length - fixed, 0
        while budget > 0 and est < ns:
            budget -= self.cost(" " + S[(start + est) % ns])
            if budget >= 0:
                est += 1
        n = self._largest(build, est, length)
        return Case(task, build(n), " " + nums[0],
                    {"seed": seed, "length": length, "depth": depth, "word": words[0], "key": nums[0],
                     "distractors": list(zip(words[1:], nums[1:])), "start": start, "sentences": n})

    def multikey(self, seed, length, depth, n_distractors=3):
        return self.niah(seed, length, depth, n_distractors=n_distractors, task="multikey")

    # -------------------------------------------------------------- KV retrieval
    def kv(self, seed, length, depth):
        rng = SplitMix64(seed)
        pairs = []

        def pair_text(i):
            while len(pairs) <= i:
                pairs.append((uuid_like(rng), uuid_like(rng)))
            k, v = pairs[i]
            return '"%s": "%s"' % (k, v)

        def build(n):
            t = insert_index(depth, n - 1) if n > 0 else 0
            key = pairs[t][0] if n > 0 else ""
            body = "{" + ", ".join(pair_text(i) for i in range(n)) + "}"
            return KV_HEADER + "\n" + body + "\n" + KV_QUESTION.format(key=key), t

        pair_text(0)
        fixed = self.ntokens(build(0)[0]) + 2 * self.cost(pairs[0][0])  # the key, twice in the question
        budget, est = length - fixed, 0
        while budget > 0:
            budget -= self.cost(", " + pair_text(est))
            if budget >= 0:
                est += 1
        est = max(1, est)

        def build_n(n):
            for i in range(n):
                pair_text(i)
            return build(n)[0]

        n = max(1, self._largest(build_n, est, length))
        for i in range(n):
            pair_text(i)
        prompt, t = build(n)
        return Case("kv", prompt, pairs[t][1],
                    {"seed": seed, "length": length, "depth": depth, "key": pairs[t][0], "target": t, "pairs": n})

    # -------------------------------------------------------------- dispatch
    def make(self, task, seed, length, depth):
        if task == "passkey":
            return self.passkey(seed, length, depth)
        if task == "niah":
            return self.niah(seed, length, depth)
        if task == "multikey":
            return self.multikey(seed, length, depth)
        if task == "kv":
            return self.kv(seed, length, depth)
        raise ValueError(task)

    def eval_case(self, base_seed, task, length, index):
        depth = eval_depth(index)
        return self.make(task, case_seed(base_seed, task, length, depth, index), length, depth)


TASKS = ("passkey", "niah", "multikey", "kv")
