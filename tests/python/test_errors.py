"""Failures become exceptions carrying the library's one-line message."""
import os
import subprocess
import sys

import numpy as np
import pytest

import kvsieve
from conftest import MODEL_DIR, PROMPT, ROOT


def test_missing_model_folder(tmp_path):
    missing = str(tmp_path / "no-such-model")
    with pytest.raises(kvsieve.FileError) as e:
        kvsieve.Model(missing)
    assert missing in str(e.value)
    assert e.value.status == 1 and e.value.status_name == "io"
    assert isinstance(e.value, kvsieve.Error)


def test_malformed_model_config(tmp_path):
    (tmp_path / "config.json").write_text("{")
    with pytest.raises(kvsieve.FormatError, match="config.json"):
        kvsieve.Model(str(tmp_path))


def test_unknown_backend():
    with pytest.raises(kvsieve.Error, match="backend"):
        kvsieve.Model(MODEL_DIR, backend="tpu")


def test_bad_policy_source(model):
    with pytest.raises(kvsieve.PolicyError, match="unexpected symbol"):
        model.policy("return {\n")


def test_policy_not_a_table(model):
    with pytest.raises(kvsieve.Error):
        model.policy("return 42\n")


def test_unknown_policy_name(model):
    with pytest.raises(kvsieve.FileError, match='no policy named "no_such_policy"'):
        model.policy("no_such_policy")


def test_missing_policy_file(model, tmp_path):
    with pytest.raises(kvsieve.FileError, match="policy file"):
        model.policy(str(tmp_path / "nothing.lua"))


def test_unknown_parameter(model):
    with pytest.raises(kvsieve.ArgumentError, match="unknown parameter 'bogus'"):
        model.policy("streamingllm", bogus=3)
    assert issubclass(kvsieve.ArgumentError, ValueError)


def test_parameter_of_the_wrong_type(model):
    with pytest.raises(kvsieve.ArgumentError, match="budget expects an integer"):
        model.policy("streamingllm", budget="lots")
    with pytest.raises(TypeError):
        model.policy("streamingllm", budget=[1, 2])


def test_parameter_the_policy_refuses(model):
    s = model.session("streamingllm", budget=2, sinks=4)
    with pytest.raises(kvsieve.PolicyError, match="must exceed sinks"):
        s.generate(PROMPT, max_new_tokens=2)


def test_fallback_reports_instead_of_raising(model, full_run):
    s = model.session("streamingllm", budget=2, sinks=4)
    s.fallback = True
    r = s.generate(PROMPT, max_new_tokens=12)
    assert r.policy_error and "must exceed sinks" in r.policy_error
    np.testing.assert_array_equal(r.ids, full_run[0])  # full attention after the failure


def test_bad_generate_options(model):
    s = model.session()
    with pytest.raises(kvsieve.ArgumentError, match="temperature"):
        s.generate(PROMPT, temperature=-1.0)
    with pytest.raises(kvsieve.ArgumentError, match="top_p"):
        s.generate(PROMPT, top_p=0.0)
    with pytest.raises(TypeError, match="unexpected keyword"):
        s.generate(PROMPT, max_tokens=3)
    with pytest.raises(ValueError, match="NUL"):
        s.generate("a\0b")


def test_prompt_over_the_context(model):
    with pytest.raises(kvsieve.ContextError, match="exceeds the model's context"):
        model.session().generate(np.zeros(model.max_context + 1, np.int32), max_new_tokens=1)


def test_token_id_out_of_vocabulary(model):
    with pytest.raises(kvsieve.ArgumentError):
        model.detokenize([model.vocab + 5])


def test_closed_objects_refuse(model):
    m = kvsieve.Model(MODEL_DIR, threads=1)
    s = m.session("streamingllm", budget=8)
    m.close()
    assert s.closed and m.closed
    with pytest.raises(kvsieve.Error, match="closed"):
        s.generate(PROMPT)
    with pytest.raises(kvsieve.Error, match="closed"):
        m.tokenize("x")


def test_library_not_found_names_what_it_tried(tmp_path):
    code = "import kvsieve\ntry:\n    kvsieve.version()\nexcept kvsieve.LibraryNotFound as e:\n    print('NF', e)\n"
    env = dict(os.environ, KVSIEVE_LIBRARY=str(tmp_path / "libnothing.so"),
               PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("NF libkvsieve.so not found") and "libnothing.so" in out.stdout
