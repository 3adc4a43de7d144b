# %% [markdown]
# # kvsieve from Python
#
# A notebook-style tour of the Python package (python/): each `# %%` cell runs on its own in
# Jupyter or VS Code, or run the whole file from the repository root (after installing the
# package as README.md says):
#
#     build/venv/bin/python examples/python_demo.py [MODEL_DIR]
#
# It uses the bundled model on the CPU backend: a tiny model, so its text is not meant to be good.

# %%
import os
import sys

import numpy as np

import kvsieve

here = os.path.dirname(os.path.abspath(__file__))
model_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "models", "kvsieve-tiny")
model = kvsieve.Model(model_dir, backend="cpu")
print("libkvsieve", kvsieve.version(), "from", kvsieve.library_path())
print(model)
prompt = "The grass is green. The sky is blue. The sun is bright. The grass is"

# %% [markdown]
# ## Generate with full attention
# `session.generate` returns a Result: the text, the ids (a numpy int32 array), timings.

# %%
session = model.session()
full = session.generate(prompt, max_new_tokens=16)
print(repr(full.text))
print("ids:", full.ids, "prompt tokens:", full.prompt_tokens)
print("rows resident at layer 0: %d (every prompt token and the generated ones but the last)" % len(full.kept(0)))

# %% [markdown]
# ## A pruning policy, by name, with its parameters as keyword arguments
# SnapKV keeps, per layer, the prompt rows that the last few queries attend to most, within a
# budget. `kept(layer, kv_head)` gives the positions of the rows still in the KV cache.

# %%
snap = model.policy("snapkv", budget=12, window=4, kernel=3)
print(snap, "reports of the last request:", snap.reports)
session.policy = snap
r = session.generate(prompt, max_new_tokens=16)
print(repr(r.text), "reports:", r.reports)
kept = r.kept_all()  # [layer][kv_head] -> int32 positions
for layer in range(model.n_layers):
    k = kept[layer][0]
    prompt_kept = k[k < r.prompt_tokens]
    print("layer %d: %2d of %d prompt rows kept: %s" % (layer, len(prompt_kept), r.prompt_tokens, prompt_kept))

# which prompt tokens survived in layer 0, as text
toks = model.tokenize(prompt)
print([model.detokenize([toks[p]]) for p in kept[0][0] if p < len(toks)])

# %% [markdown]
# ## Streaming
# `stream=True` returns an iterator of Token(id, text); breaking out of it stops the request.

# %%
for i, tok in enumerate(session.generate("Once upon a time", stream=True, max_new_tokens=64)):
    print(tok.text, end="", flush=True)
    if i == 15:
        break
print()

# %% [markdown]
# ## A policy written here, as a Lua string
# Keeps the first `sinks` and the last `recent` prompt rows of every layer (a tiny StreamingLLM);
# parameters declared in `params` are set from Python.

# %%
source = """
return {
  name = 'sinks_and_recent',
  params = { sinks = 4, recent = 8 },
  prefill_layer_end = function(ev, p)
    local n = ev.n
    if n <= p.sinks + p.recent then return end
    local ks = require 'kvsieve'
    ev:retain(ks.concat(ks.arange(0, p.sinks), ks.arange(n - p.recent, n)))
    ev:report('kept', p.sinks + p.recent)
  end,
}
"""
mine = model.policy(source, recent=6)
r = model.session(mine).generate(prompt, max_new_tokens=8)
print(mine.params, r.reports, "layer 3 keeps", r.kept(3))

# %% [markdown]
# ## A policy written in Python, scoring rows in numpy
# Handlers get each event's tensors as numpy arrays: here every layer scores the prompt rows by
# the attention of the last prompt token's queries and keeps the 8 best.

# %%
class TopByAttention:
    def __init__(self):
        self.scores = {}

    def prefill_qkv(self, ev):
        q, k = ev.tensor("q"), ev.tensor("k")  # (rows, heads, head_dim), (rows, kv_heads, head_dim)
        k = np.repeat(k, q.shape[1] // k.shape[1], axis=1)
        s = np.einsum("hd,rhd->hr", q[-1], k) / np.sqrt(q.shape[2])
        w = np.exp(s - s.max(axis=1, keepdims=True))
        self.scores[ev.layer] = score = (w / w.sum(axis=1, keepdims=True)).mean(axis=0)
        ev.retain(np.sort(np.argsort(-score, kind="stable")[:8]))


top = TopByAttention()
r = model.session(kvsieve.Policy.from_python(model, top)).generate(prompt, max_new_tokens=8)
print(repr(r.text))
print("layer 0 scores:", np.round(top.scores[0], 3))
print("layer 0 keeps:", r.kept(0))

# %% [markdown]
# ## The logits behind the last token

# %%
ids, logprobs = r.top_logprobs(5)
print("top 5 after the last step:", [(model.detokenize([i]), round(float(lp), 3)) for i, lp in zip(ids, logprobs)])
print("greedy picked the argmax:", int(np.argmax(r.logits())) == int(r.ids[-1]))

# %% [markdown]
# ## A retrieval grid
# `kvsieve.eval` runs the library's long-context grid (what `kvsieve eval` runs): a 5-digit pass
# key hidden in filler text, at several lengths and depths, under each policy. It returns one
# dict per run (pandas.DataFrame(runs) takes it as is); `.cells` sums them per cell.

# %%
runs = kvsieve.eval(model, "passkey", lengths=[128, 256], depths=[0.0, 0.5, 1.0], cases=1,
                    policies={"full": None, "snapkv": model.policy("snapkv", budget=48, window=8)})
print("%d runs; the first: %s" % (len(runs), {k: runs[0][k] for k in ("policy", "length", "depth", "answer", "output")}))
print("policy  length  depth  exact  value kept")
for c in runs.cells:
    print("%-7s %6d %6.2f %6.2f %11.2f" % (c["policy"], c["length"], c["depth"], c["exact_match"], c["value_kept"]))

# %% [markdown]
# ## Errors are exceptions with the library's message

# %%
for bad in (lambda: model.policy("snapkv", budget="lots"),
            lambda: model.policy("return {"),
            lambda: kvsieve.Model("no/such/model")):
    try:
        bad()
    except kvsieve.Error as e:
        print("%s (%s): %s" % (type(e).__name__, e.status_name, e))

model.close()
