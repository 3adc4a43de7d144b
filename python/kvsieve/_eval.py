"""kvsieve.eval: a retrieval grid (the library's ks_eval_*, what `kvsieve eval` runs) as a list of
dicts, one per run, ready for pandas.DataFrame(records)."""
import ctypes
import os
import threading

import numpy as np

from ._core import Model, Policy, _check, _cstr, _last_error, _pystr
from ._errors import raise_status
from ._lib import EVAL_RUN_FN, EvalCell, EvalOpts, lib

__all__ = ["eval", "EvalRuns", "EVAL_SEED"]

EVAL_SEED = 0xF2CB78610A862FCE  # KS_EVAL_SEED: the grids' seed base, held out from the bundled model's training

_FIELDS = ("policy", "length", "depth", "index", "seed", "tokens", "correct", "kept", "value_in", "value_n",
           "value_kept", "needle_begin", "needle_end", "value_begin", "value_end", "prefill_s", "decode_s",
           "answer", "output", "resumed")


def _record(r):
    """A ks_eval_record as a dict (its strings copied)."""
    d = {}
    for f in _FIELDS:
        if f == "policy":
            d[f] = _pystr(r.policy_name)
        elif f in ("answer", "output"):
            d[f] = _pystr(getattr(r, f))
        elif f in ("correct", "resumed"):
            d[f] = bool(getattr(r, f))
        else:
            d[f] = getattr(r, f)
    d["policy_index"], d["length_index"], d["depth_index"] = r.policy, r.length_index, r.depth_index
    return d


class EvalRuns(list):
    """eval()'s result: a list of run records (dicts), with .cells, the per-cell summaries of
    the library (ks_eval_cell_at), one dict per (policy, length, depth) cell with runs: policy,
    length, depth, cases, correct, exact_match, value_kept (NaN when no run had value tokens),
    n_value, tokens_sum, kept_sum, prefill_sum."""
    cells = ()


def _policies(model, policies):
    """[(Policy or None, name or None)] from a list or a dict of Policy / spec / None."""
    if policies is None:
        return []
    items = list(policies.items()) if isinstance(policies, dict) else [(None, p) for p in policies]
    out = []
    for name, p in items:
        if p is None or (isinstance(p, str) and p == "full"):
            out.append((None, name if name is not None else "full"))
        elif isinstance(p, Policy):
            out.append((p, name))
        elif isinstance(p, (str, os.PathLike)):
            out.append((model.policy(p), name))
        else:
            raise TypeError("a policy is a kvsieve.Policy, a spec for model.policy, or None (full attention)")
    return out


def eval(model, task, lengths=None, depths=None, cases=1, policies=None, seed=EVAL_SEED, corpora=None,
         resume=None, out=None, model_label=None, on_run=None, keep_positions=False):
    """Run a long-context retrieval grid and return its runs as a list of dicts.

    model      a kvsieve.Model (with a tokenizer)
    task       "passkey", "niah", "multikey" (these two need corpora: a folder of *.txt) or "kv"
    lengths    prompt lengths in tokens (default 512, 1024, 2048, 4096; each + 64 <= context)
    depths     needle depths in [0, 1] (default 0, 0.25, 0.5, 0.75, 1)
    cases      cases per cell
    policies   a list of Policy objects, specs for model.policy (a name, a file, Lua source) or
               None / "full" (full attention), or a dict {name: that} naming them; None: full
               attention only. Each policy runs every case, in the order given.
    seed       the seed base (default EVAL_SEED)
    resume     an earlier `out` file of the same grid: its runs count as done
    out        write the grid as JSON there (ks_eval_write_json; also after an interruption)
    on_run     called as on_run(record, done, total) after each run, on the thread running the
               grid; a true return value stops the grid (kvsieve.Interrupted)
    keep_positions  put the sorted kept prompt positions (numpy int32) of each run in its
               record as "kept_positions" (None for resumed runs)
    Returns an EvalRuns (a list) of records; its .cells are the library's per-cell summaries.
    Each record: policy, length, depth, index, seed, tokens, correct, kept, value_in, value_n,
    value_kept (NaN without value tokens), needle_begin, needle_end, value_begin, value_end,
    prefill_s, decode_s, answer, output, resumed, policy_index, length_index, depth_index.
    Everything but the timings is deterministic. Ctrl-C stops the running case between layers;
    then `out`, if given, holds the finished runs (resume from it), and KeyboardInterrupt is
    raised. Bad options raise ArgumentError, a missing haystack FileError."""
    if not isinstance(model, Model):
        raise TypeError("model must be a kvsieve.Model")
    pols = _policies(model, policies)
    o = EvalOpts()
    lib.ks_eval_opts_default(ctypes.byref(o))
    keep = []  # what the C struct points at, alive until the end
    o.task = _cstr(task, "task")
    if lengths is not None:
        a = (ctypes.c_int * max(1, len(lengths)))(*[int(x) for x in lengths])
        keep.append(a)
        o.lengths, o.n_lengths = a, len(lengths)
    if depths is not None:
        a = (ctypes.c_double * max(1, len(depths)))(*[float(x) for x in depths])
        keep.append(a)
        o.depths, o.n_depths = a, len(depths)
    o.cases = int(cases)
    o.seed = int(seed)
    if pols:
        hs = (ctypes.c_void_p * len(pols))(*[p._handle() if p is not None else None for p, _ in pols])
        names = [_cstr(n, "policy name") if n is not None else None for _, n in pols]
        ns = (ctypes.c_char_p * len(pols))(*names)
        keep += [hs, ns, pols]
        o.policies, o.policy_names, o.n_policies = hs, ns, len(pols)
    if corpora is not None:
        o.corpora = _cstr(os.fspath(corpora), "corpora")
    if model_label is not None:
        o.model_label = _cstr(model_label, "model_label")
    flag = ctypes.c_int(0)
    o.interrupt = ctypes.pointer(flag)
    positions = {}
    caught = []

    def run_cb(user, rp, done, total):
        try:
            r = rp.contents
            if keep_positions and r.kept_positions and r.kept > 0:
                positions[(r.policy, r.length_index, r.depth_index, r.index)] = \
                    np.ctypeslib.as_array(r.kept_positions, shape=(r.kept,)).copy()
            if on_run is not None and on_run(_record(r), int(done), int(total)):
                return 1
            return 0
        except BaseException as e:
            caught.append(e)
            return 1
    cfn = EVAL_RUN_FN(run_cb)
    o.on_run = cfn
    h = ctypes.c_void_p()
    _check(lib.ks_eval_create(model._handle(), ctypes.byref(o), ctypes.byref(h)))
    try:
        if resume is not None:
            _check(lib.ks_eval_resume(h, _cstr(os.fspath(resume), "resume")))
        # The grid runs on a worker thread, so that Ctrl-C (delivered to this one) can raise the
        # library's interrupt flag: the running case stops between layers.
        # The wait is on an Event, not on Thread.join: a join interrupted by KeyboardInterrupt
        # may mark the thread finished while it still runs (CPython gh-90882), and the grid
        # would then be freed under it.
        res = {}
        finished = threading.Event()

        def work():
            try:
                st = lib.ks_eval_run(h)
                res["st"], res["err"] = st, (_last_error() if st else "")
            finally:
                finished.set()
        t = threading.Thread(target=work, name="kvsieve-eval", daemon=True)
        t.start()
        interrupted = None
        while not finished.is_set():
            try:
                finished.wait(0.25)
            except BaseException as e:  # KeyboardInterrupt: stop the grid, then re-raise
                flag.value = 1
                interrupted = interrupted or e
        records = EvalRuns()
        for i in range(lib.ks_eval_n_runs(h)):
            rp = lib.ks_eval_record_at(h, i)
            if not rp:
                continue
            d = _record(rp.contents)
            if keep_positions:
                d["kept_positions"] = positions.get((d["policy_index"], d["length_index"], d["depth_index"], d["index"]))
            records.append(d)
        records.cells = _cells(h, records)
        if out is not None:
            _check(lib.ks_eval_write_json(h, _cstr(os.fspath(out), "out")))
        if interrupted is not None:
            raise interrupted
        if caught:
            raise caught[0]
        for p, _ in pols:  # a Python policy's handler raised: that exception, not the library's text
            pexc = p._pending["exc"] if p is not None and p._pending is not None else None
            if res["st"] and pexc is not None:
                p._pending["exc"] = None
                raise pexc
        if res["st"]:
            raise_status(res["st"], res["err"])
        return records
    finally:
        lib.ks_eval_free(h)


def _cells(h, records):
    """ks_eval_cell_at of every cell that has a finished run, in grid order."""
    seen = {}
    for r in records:
        seen.setdefault((r["policy_index"], r["length_index"], r["depth_index"]), r)
    out = []
    for k in sorted(seen):
        c = EvalCell()
        _check(lib.ks_eval_cell_at(h, k[0], k[1], k[2], ctypes.byref(c)))
        r = seen[k]
        out.append({"policy": r["policy"], "length": r["length"], "depth": r["depth"], "cases": c.cases,
                    "correct": c.correct, "exact_match": c.exact_match, "value_kept": c.value_kept,
                    "n_value": c.n_value, "tokens_sum": c.tokens_sum, "kept_sum": c.kept_sum,
                    "prefill_sum": c.prefill_sum})
    return out
