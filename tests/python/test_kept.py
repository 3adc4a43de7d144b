"""The kept positions seen from Python equal those of the C API (ks_result_kept) read by
tests/test_python.c from the same requests: it writes them to the file $KS_PY_REFERENCE,
blocks of
    policy NAME key=value ...
    ids ID ...
    restart IDX ...
    kept LAYER HEAD POS ...
    end
for PROMPT and max_new_tokens 12 on the bundled model. Also: which kvsieve is under test."""
import os

import numpy as np
import pytest

import kvsieve
from conftest import PROMPT


def _value(v):
    for conv in (int, float):
        try:
            return conv(v)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(v, v)


def _reference():
    path = os.environ.get("KS_PY_REFERENCE")
    if not path:
        pytest.skip("KS_PY_REFERENCE not set: tests/test_python.c (make test) writes the C API's reference")
    blocks, cur = [], None
    with open(path) as f:
        for line in f:
            w = line.split()
            if not w:
                continue
            if w[0] == "policy":
                cur = {"name": w[1], "params": {k: _value(v) for k, v in (x.split("=", 1) for x in w[2:])},
                       "kept": {}}
            elif w[0] == "ids":
                cur["ids"] = [int(x) for x in w[1:]]
            elif w[0] == "restart":
                cur["restart"] = [int(x) for x in w[1:]]
            elif w[0] == "kept":
                cur["kept"][(int(w[1]), int(w[2]))] = [int(x) for x in w[3:]]
            elif w[0] == "end":
                blocks.append(cur)
    assert blocks, "empty reference file"
    return blocks


def test_kept_arrays_equal_the_c_api(model):
    ref = _reference()
    prompt_tokens = len(model.tokenize(PROMPT))
    for b in ref:
        s = model.session(b["name"], **b["params"])
        r = s.generate(PROMPT, max_new_tokens=12)
        assert r.ids.tolist() == b["ids"], b["name"]
        assert (r.restart.tolist() if r.restart is not None else []) == b["restart"], b["name"]
        assert len(b["kept"]) == model.n_layers * model.n_kv_heads
        for (layer, head), want in b["kept"].items():
            got = r.kept(layer, head)
            assert got.dtype == np.int32
            assert got.tolist() == want, "%s layer %d head %d" % (b["name"], layer, head)
        # and through the stream
        st = s.generate(PROMPT, stream=True, max_new_tokens=12)
        assert [t.id for t in st] == b["ids"]
        for (layer, head), want in b["kept"].items():
            assert st.result.kept(layer, head).tolist() == want
    # the reference has a pruning policy: some layer keeps fewer rows than the full run
    assert any(len(v) < prompt_tokens + len(b["ids"]) - 1 for b in ref for v in b["kept"].values())


def test_installed_package_is_the_one_tested():
    venv = os.environ.get("KS_PY_VENV")
    if not venv:
        pytest.skip("KS_PY_VENV not set: run by tests/test_python.c after pip install ./python")
    here = os.path.realpath(kvsieve.__file__)
    assert here.startswith(os.path.realpath(venv) + os.sep), here
    lib = os.path.realpath(kvsieve.library_path())
    assert lib == os.path.join(os.path.dirname(here), "lib", "libkvsieve.so"), lib
    assert kvsieve.version() == kvsieve.__version__
    pol = os.path.join(os.path.dirname(here), "policies", "snapkv.lua")
    assert os.path.isfile(pol)
