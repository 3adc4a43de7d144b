"""kvsieve.eval: the library's retrieval grid (ks_eval_*) as a list of dicts."""
import json
import math
import os
import signal
import subprocess
import time

import numpy as np
import pytest

import kvsieve
from conftest import MODEL_DIR, ROOT

GRID = dict(task="passkey", lengths=[128, 160], depths=[0.0, 1.0], cases=1)
TIMING = ("prefill_s", "decode_s")


def _untimed(runs):
    return [{k: v for k, v in r.items() if k not in TIMING and k != "resumed"} for r in runs]


def _grid(model, **kw):
    pols = {"full": None, "snap": model.policy("snapkv", budget=48, window=8)}
    return kvsieve.eval(model, policies=pols, **dict(GRID, **kw))


def test_eval_returns_one_dict_per_run(model):
    runs = _grid(model, keep_positions=True)
    assert isinstance(runs, list) and len(runs) == 2 * 2 * 1 * 2
    # the library's order: ((length * n_depths + depth) * cases + case) * n_policies + policy
    assert [(r["length"], r["depth"], r["policy"]) for r in runs] == [
        (L, d, p) for L in (128, 160) for d in (0.0, 1.0) for p in ("full", "snap")]
    for r in runs:
        assert r["tokens"] <= r["length"] and r["answer"] and isinstance(r["correct"], bool)
        assert r["correct"] == (r["output"] == r["answer"])
        assert r["value_begin"] < r["value_end"] and r["needle_begin"] <= r["value_begin"]
        k = r["kept_positions"]
        assert k.dtype == np.int32 and len(k) == r["kept"] and np.all(np.diff(k) > 0)
        if r["policy"] == "full":
            assert r["kept"] == r["tokens"] and r["value_kept"] == 1.0
        else:
            assert r["kept"] < r["tokens"]
            inside = np.isin(np.arange(r["value_begin"], r["value_end"]), k).sum()
            assert r["value_in"] == inside and r["value_n"] == r["value_end"] - r["value_begin"]


def test_eval_cells_are_the_sums_of_the_runs(model):
    runs = _grid(model)
    assert len(runs.cells) == 8
    for c in runs.cells:
        mine = [r for r in runs if (r["policy"], r["length"], r["depth"]) == (c["policy"], c["length"], c["depth"])]
        assert c["cases"] == len(mine) and c["correct"] == sum(r["correct"] for r in mine)
        assert c["exact_match"] == c["correct"] / c["cases"]
        assert c["kept_sum"] == sum(r["kept"] for r in mine)
        vk = [r["value_kept"] for r in mine if r["value_n"] > 0]
        assert (math.isnan(c["value_kept"]) and not vk) or c["value_kept"] == pytest.approx(sum(vk) / len(vk))


def test_eval_is_deterministic_and_equals_the_cli(model, tmp_path):
    a = _untimed(_grid(model))
    assert a == _untimed(_grid(model))
    cli = os.environ.get("KS_BIN")
    if not cli:
        pytest.skip("KS_BIN not set: the CLI comparison runs under make test")
    out = tmp_path / "cli.json"
    p = subprocess.run([os.path.join(ROOT, cli) if not os.path.isabs(cli) else cli, "eval", "--model", MODEL_DIR,
                        "--task", "passkey", "--lengths", "128,160", "--depths", "0,1", "--compare", "full,snapkv",
                        "--set", "snapkv.budget=48", "--set", "snapkv.window=8", "--out", str(out), "--quiet"],
                       cwd=ROOT, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stderr
    cases = json.loads(out.read_text())["cases"]
    assert len(cases) == len(a)
    for r, c in zip(a, cases):
        assert (r["length"], r["depth"], r["index"], r["tokens"], r["kept"], r["output"], r["correct"]) == \
            (c["length"], c["depth"], c["index"], c["tokens"], c["kept"], c["output"], c["correct"])


def test_eval_stopped_by_on_run_then_resumed(model, tmp_path):
    out = tmp_path / "grid.json"
    full = _untimed(_grid(model))
    seen = []

    def on_run(rec, done, total):
        seen.append((rec["policy"], done, total))
        return done == 3
    with pytest.raises(kvsieve.Interrupted):
        _grid(model, on_run=on_run, out=str(out))
    assert seen == [(p, i + 1, 8) for i, p in enumerate(("full", "snap", "full"))]
    j = json.loads(out.read_text())
    assert j["complete"] is False and len(j["cases"]) == 3
    runs = _grid(model, resume=str(out))
    assert [r["resumed"] for r in runs] == [True] * 3 + [False] * 5
    assert _untimed(runs) == full


def test_ctrl_c_stops_the_grid(model, tmp_path):
    out = tmp_path / "grid.json"

    def on_run(rec, done, total):
        if done == 1:
            signal.raise_signal(signal.SIGINT)  # Ctrl-C, seen by the main thread
            time.sleep(1.0)  # the main thread raises the library's flag meanwhile
    with pytest.raises(KeyboardInterrupt):
        _grid(model, on_run=on_run, out=str(out))
    j = json.loads(out.read_text())
    assert j["complete"] is False and 1 <= len(j["cases"]) < 8


def test_eval_errors(model, tmp_path):
    with pytest.raises(kvsieve.ArgumentError, match="task"):
        kvsieve.eval(model, "no_such_task", lengths=[128])
    with pytest.raises(kvsieve.ArgumentError):
        kvsieve.eval(model, "passkey", lengths=[model.max_context])
    with pytest.raises(kvsieve.ArgumentError):
        kvsieve.eval(model, "passkey", lengths=[128], depths=[1.5])
    with pytest.raises(kvsieve.FileError):
        kvsieve.eval(model, "niah", lengths=[128], corpora=str(tmp_path / "none"))
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(kvsieve.FormatError):
        kvsieve.eval(model, "passkey", lengths=[128], resume=str(bad))
    with pytest.raises(TypeError):
        kvsieve.eval(model, "passkey", lengths=[128], policies=[42])
