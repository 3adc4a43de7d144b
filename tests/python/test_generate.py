"""generate(): results, options, policies from a name, a file or a string, logits."""
import os

import numpy as np

import kvsieve
from conftest import PROMPT, ROOT


def test_generate_returns_result(model, full_run):
    s = model.session()
    r = s.generate(PROMPT, max_new_tokens=12)
    assert isinstance(r, kvsieve.Result)
    assert r.ids.dtype == np.int32 and r.ids.shape == (12,)
    assert r.prompt_tokens == len(model.tokenize(PROMPT))
    assert r.text == model.detokenize(r.ids)
    assert r.prefill_seconds >= 0 and r.decode_seconds >= 0
    assert r.policy is None and r.reports == {} and r.policy_error is None
    np.testing.assert_array_equal(r.ids, full_run[0])  # greedy: the same ids every run


def test_generate_from_ids_equals_from_text(model, full_run):
    ids = model.tokenize(PROMPT)
    r = model.session().generate(ids, max_new_tokens=12)
    np.testing.assert_array_equal(r.ids, full_run[0])
    r = model.session().generate(list(map(int, ids)), max_new_tokens=12)
    np.testing.assert_array_equal(r.ids, full_run[0])


def test_tokenize_round_trip(model):
    ids = model.tokenize(PROMPT, add_special=False)
    assert ids.dtype == np.int32 and len(ids) > 5
    assert model.detokenize(ids) == PROMPT


def test_greedy_token_is_argmax_of_logits(model):
    r = model.session().generate(PROMPT, max_new_tokens=5)
    lg = r.logits()
    assert lg.dtype == np.float32 and lg.shape == (model.vocab,)
    assert int(np.argmax(lg)) == int(r.ids[-1])
    ids, lp = r.top_logprobs(3)
    assert int(ids[0]) == int(r.ids[-1])
    ref = lg.astype(np.float64) - np.log(np.sum(np.exp(lg.astype(np.float64) - lg.max()))) - lg.max()
    # float32 log-softmax in the library against float64 here: a few ulps of a value near 1
    np.testing.assert_allclose(lp, ref[ids], atol=1e-4)


def test_seeded_sampling_repeats(model):
    s = model.session()
    a = s.generate(PROMPT, max_new_tokens=10, temperature=0.8, top_p=0.9, seed=7).ids
    b = s.generate(PROMPT, max_new_tokens=10, temperature=0.8, top_p=0.9, seed=7).ids
    np.testing.assert_array_equal(a, b)


def test_stop_string_cuts_text(model, full_run):
    ids, text = full_run
    stop = text[3:8]
    assert stop.strip()
    r = model.session().generate(PROMPT, max_new_tokens=12, stop=[stop])
    assert stop not in r.text
    assert text.startswith(r.text)


def test_policy_from_name_file_and_string_keep_the_same_rows(model):
    path = os.path.join(ROOT, "policies", "snapkv.lua")
    with open(path) as f:
        source = f.read()
    kw = dict(budget=12, window=4, kernel=3)
    kept = []
    for pol in (model.policy("snapkv", **kw), model.policy(path, **kw), model.policy(source, **kw),
                kvsieve.Policy.from_string(model, source, chunkname="snapkv_inline.lua", **kw)):
        assert pol.name == "snapkv"
        assert pol.params["budget"] == 12 and pol.params["window"] == 4
        r = model.session(pol).generate(PROMPT, max_new_tokens=6)
        assert r.policy == "snapkv" and r.reports.get("compressed") == "true"
        kept.append([a.tolist() for layer in r.kept_all() for a in layer])
    assert kept[0] == kept[1] == kept[2] == kept[3]
    # 12 rows after the prefill, then the 6 decode rows less the last token's (never fed back)
    assert all(len(k) == 12 + 5 for k in kept[0])


def test_policy_parameters_as_keyword_arguments(model):
    p = model.policy("streamingllm", budget=16, sinks=4, rolling=False)
    assert p.params == {"budget": 16, "sinks": 4, "rolling": False}
    p.set(budget=10)
    assert p.get("budget") == "10"
    s = model.session(p)
    r = s.generate(PROMPT, max_new_tokens=4)
    prompt_n = r.prompt_tokens
    k = r.kept(0)
    assert k.dtype == np.int32
    # the 4 sinks, the 6 most recent prompt rows, and 3 decode rows
    assert k.tolist() == [0, 1, 2, 3] + list(range(prompt_n - 6, prompt_n + 3))


def test_session_from_spec_and_reattach(model, full_run):
    s = model.session("streamingllm", budget=8, sinks=2)
    assert s.policy.name == "streamingllm"
    assert len(s.generate(PROMPT, max_new_tokens=3).kept(1, 1)) == 8 + 2
    s.policy = None
    r = s.generate(PROMPT, max_new_tokens=12)
    np.testing.assert_array_equal(r.ids, full_run[0])
    assert len(r.kept(0)) == r.prompt_tokens + 11


def test_restart_indices_of_gemfilter(model):
    r = model.session("gemfilter", layer=3, k=8).generate(PROMPT, max_new_tokens=4)
    assert r.restart is not None and r.restart.dtype == np.int32 and len(r.restart) == 8
    assert r.reports["selected"] == "8"


def test_result_goes_stale_after_the_next_request(model):
    s = model.session()
    r1 = s.generate(PROMPT, max_new_tokens=2)
    r1.kept(0)
    s.generate(PROMPT, max_new_tokens=2)
    try:
        r1.kept(0)
    except kvsieve.Error as e:
        assert "stale" in str(e)
    else:
        raise AssertionError("a stale result read the session")
    assert len(r1.ids) == 2  # what was copied stays


def test_policy_print_goes_to_logging(model, caplog):
    src = "return { name = 'talker', prefill_end = function(ev) print('hello from lua') end }\n"
    with caplog.at_level("INFO", logger="kvsieve"):
        model.session(model.policy(src)).generate(PROMPT, max_new_tokens=1)
    assert any("hello from lua" in m for m in caplog.messages)
