"""Policies written in Python (Policy.from_python over ks_policy_create_c): events' tensors as
numpy arrays, actions, and a handler's exception coming out of generate()."""
import numpy as np
import pytest

import kvsieve
from conftest import PROMPT

LUA_SINKS = """return { name = 'sinks', prefill_layer_end = function(ev, p)
    local n = ev.n
    if n <= 16 then return end
    local ks = require 'kvsieve'
    ev:retain(ks.concat(ks.arange(0, 4), ks.arange(n - 12, n)))
  end }
"""


class Sinks:
    """The first 4 and the last 12 rows of every layer after its prefill (LUA_SINKS in Python)."""

    def prefill_layer_end(self, ev):
        n = ev.rows
        if n > 16:
            ev.retain(list(range(4)) + list(range(n - 12, n)))


def test_python_policy_keeps_what_the_same_lua_policy_keeps(model):
    py = model.session(kvsieve.Policy.from_python(model, Sinks())).generate(PROMPT, max_new_tokens=8)
    lua = model.session(model.policy(LUA_SINKS)).generate(PROMPT, max_new_tokens=8)
    assert py.policy == "Sinks"
    assert py.ids.tolist() == lua.ids.tolist()
    assert [a.tolist() for l in py.kept_all() for a in l] == [a.tolist() for l in lua.kept_all() for a in l]
    assert py.kept(0).tolist() == [0, 1, 2, 3] + list(range(py.prompt_tokens - 12, py.prompt_tokens + 7))


class TopByScore:
    """Scores each prompt row by the attention of the last prompt query (mean over heads), in
    numpy, and keeps the 8 best per layer."""
    name = "top_by_score"

    def __init__(self):
        self.scores, self.shapes = {}, {}

    def prefill_qkv(self, ev):
        q, k, v = ev.tensor("q"), ev.tensor("k"), ev.tensor("v")
        self.shapes[ev.layer] = (q.shape, k.shape, v.shape)
        kk = np.repeat(k, q.shape[1] // k.shape[1], axis=1)  # GQA: each KV head serves a group
        s = np.einsum("hd,rhd->hr", q[-1].astype(np.float64), kk) / np.sqrt(q.shape[2])
        w = np.exp(s - s.max(axis=1, keepdims=True))
        score = (w / w.sum(axis=1, keepdims=True)).mean(axis=0)
        self.scores[ev.layer] = score
        ev.retain(np.sort(np.argsort(-score, kind="stable")[:8]))

    def prefill_layer_end(self, ev):
        self.shapes["hidden", ev.layer] = ev.tensor("hidden").shape


def test_scores_computed_in_numpy_choose_the_kept_rows(model):
    pol = TopByScore()
    r = model.session(kvsieve.Policy.from_python(model, pol)).generate(PROMPT, max_new_tokens=4)
    n = r.prompt_tokens
    assert sorted(pol.scores) == list(range(model.n_layers))
    for layer in range(model.n_layers):
        q, k, v = pol.shapes[layer]
        assert q[0] == k[0] == v[0] == n and k[1] == model.n_kv_heads and q[1] % k[1] == 0 and q[2] == k[2]
        assert pol.shapes["hidden", layer][0] == n
        score = pol.scores[layer]
        assert score.shape == (n,) and abs(score.sum() - 1) < 1e-6
        want = np.sort(np.argsort(-score, kind="stable")[:8])
        for h in range(model.n_kv_heads):
            kept = r.kept(layer, h)
            assert kept[:8].tolist() == want.tolist()  # then the 3 decode rows
            assert kept[8:].tolist() == [n, n + 1, n + 2]


def test_event_fields_and_token_events(model):
    seen = {"tokens": [], "layers": set()}

    class Watch:
        def prefill_qkv(self, ev):
            seen["layers"].add(ev.layer)
            assert ev.kind == "prefill_qkv" and ev.pass_index == 0 and ev.token == -1
            assert ev.rows == ev.prompt_tokens and ev.positions.tolist() == list(range(ev.rows))
            assert ev.ids.tolist() == model.tokenize(PROMPT).tolist()
            with pytest.raises(KeyError):
                ev.tensor("hidden")
            seen["event"] = ev

        def token(self, ev):
            seen["tokens"].append(ev.token)
    r = model.session(kvsieve.Policy.from_python(model, Watch())).generate(PROMPT, max_new_tokens=6)
    assert seen["tokens"] == r.ids.tolist()
    assert seen["layers"] == set(range(model.n_layers))
    with pytest.raises(kvsieve.Error, match="over"):
        seen["event"].rows  # an event is valid only during its handler's call


class Boom:
    def prefill_qkv(self, ev):
        if ev.layer == 2:
            raise ZeroDivisionError("boom at layer 2")


def test_handler_exception_comes_out_of_generate(model, full_run):
    s = model.session(kvsieve.Policy.from_python(model, Boom()))
    with pytest.raises(ZeroDivisionError, match="boom at layer 2"):
        s.generate(PROMPT, max_new_tokens=4)
    with pytest.raises(ZeroDivisionError, match="boom at layer 2"):
        list(s.generate(PROMPT, stream=True, max_new_tokens=4))
    s.policy = None
    assert s.generate(PROMPT, max_new_tokens=12).ids.tolist() == full_run[0].tolist()


def test_handler_exception_with_fallback(model, full_run):
    s = model.session(kvsieve.Policy.from_python(model, Boom()))
    s.fallback = True
    r = s.generate(PROMPT, max_new_tokens=12)
    assert r.policy_error == "policy Boom: ZeroDivisionError: boom at layer 2"
    assert r.ids.tolist() == full_run[0].tolist()


def test_bad_action_is_the_library_error(model):
    def handler(ev):
        ev.retain([0, 1000])
    s = model.session(kvsieve.Policy.from_python(model, {"prefill_qkv": handler}, name="bad_retain"))
    with pytest.raises(kvsieve.PolicyError, match=r"retain in prefill_qkv \(layer 0\): index 1000 out of range"):
        s.generate(PROMPT, max_new_tokens=2)
    with pytest.raises(TypeError):
        kvsieve.Policy.from_python(model, {})
    with pytest.raises(TypeError):
        kvsieve.Policy.from_python(model, {"prefill_qkv": 3})


def test_python_policy_in_an_eval_grid(model):
    pol = kvsieve.Policy.from_python(model, Sinks(), name="py_sinks")
    runs = kvsieve.eval(model, "passkey", lengths=[128], depths=[0.5], policies=[None, pol])
    assert [r["policy"] for r in runs] == ["full", "py_sinks"]
    assert runs[1]["kept"] == 16 and runs[0]["kept"] == runs[0]["tokens"]
