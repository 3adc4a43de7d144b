"""Streaming (generate(stream=True)), stopping early, on_token, and Ctrl-C: the session must stay
usable and give the same ids as a fresh one afterwards."""
import signal
import threading

import numpy as np
import pytest

import kvsieve
from conftest import PROMPT


def test_stream_yields_the_same_tokens_as_generate(model, full_run):
    st = model.session().generate(PROMPT, stream=True, max_new_tokens=12)
    assert isinstance(st, kvsieve.Stream)
    toks = list(st)
    assert all(isinstance(t, kvsieve.Token) for t in toks)
    assert [t.id for t in toks] == full_run[0].tolist()
    assert "".join(t.text for t in toks) == full_run[1]
    np.testing.assert_array_equal(st.result.ids, full_run[0])
    assert st.result.text == full_run[1]


def test_stream_with_a_policy_keeps_what_generate_keeps(model):
    s = model.session("snapkv", budget=12, window=4, kernel=3)
    want = s.generate(PROMPT, max_new_tokens=8)
    want_kept = [a.tolist() for layer in want.kept_all() for a in layer]
    st = s.generate(PROMPT, stream=True, max_new_tokens=8)
    assert [t.id for t in st] == want.ids.tolist()
    assert [a.tolist() for layer in st.result.kept_all() for a in layer] == want_kept


def test_break_stops_the_request_and_the_session_goes_on(model, full_run):
    s = model.session()
    with s.generate(PROMPT, stream=True, max_new_tokens=200) as st:
        for i, _ in enumerate(st):
            if i == 2:
                break
    assert st.result is not None and 3 <= len(st.result.ids) < 200
    np.testing.assert_array_equal(st.result.ids[:3], full_run[0][:3])
    r = s.generate(PROMPT, max_new_tokens=12)
    np.testing.assert_array_equal(r.ids, full_run[0])


def test_dropped_stream_is_stopped(model, full_run):
    s = model.session()
    st = s.generate(PROMPT, stream=True, max_new_tokens=200)
    next(st)
    del st  # collected: stopped at the next token, the worker joined
    np.testing.assert_array_equal(s.generate(PROMPT, max_new_tokens=12).ids, full_run[0])


def test_generate_while_a_stream_is_open_is_refused(model):
    s = model.session()
    st = s.generate(PROMPT, stream=True, max_new_tokens=50)
    next(st)
    with pytest.raises(RuntimeError, match="busy"):
        s.generate(PROMPT, max_new_tokens=1)
    with pytest.raises(RuntimeError, match="busy"):
        s.policy = None
    st.close()
    assert len(s.generate(PROMPT, max_new_tokens=1).ids) == 1


def test_on_token_can_stop(model, full_run):
    seen = []

    def on_token(tok):
        seen.append(tok.id)
        return len(seen) == 3
    r = model.session().generate(PROMPT, max_new_tokens=12, on_token=on_token)
    assert seen == full_run[0][:3].tolist()
    np.testing.assert_array_equal(r.ids, full_run[0][:3])


def test_exception_in_on_token_propagates(model, full_run):
    s = model.session()

    def boom(tok):
        raise ZeroDivisionError("from the callback")
    with pytest.raises(ZeroDivisionError, match="from the callback"):
        s.generate(PROMPT, max_new_tokens=12, on_token=boom)
    np.testing.assert_array_equal(s.generate(PROMPT, max_new_tokens=12).ids, full_run[0])


def test_ctrl_c_during_generate(model, full_run):
    """SIGINT arrives while the library is generating: KeyboardInterrupt comes out of generate()
    and the session stays usable."""
    s = model.session()
    n = []

    def on_token(tok):
        n.append(tok.id)
        if len(n) == 2:
            signal.raise_signal(signal.SIGINT)  # as if the user pressed Ctrl-C now
    with pytest.raises(KeyboardInterrupt):
        s.generate(PROMPT, max_new_tokens=200, on_token=on_token)
    assert len(n) < 200
    np.testing.assert_array_equal(s.generate(PROMPT, max_new_tokens=12).ids, full_run[0])


def test_ctrl_c_while_streaming(model, full_run):
    """SIGINT while the consumer waits for (or reads) the next token: KeyboardInterrupt comes
    out of the loop, the worker is stopped and joined, and the session goes on."""
    s = model.session()
    st = s.generate(PROMPT, stream=True, max_new_tokens=2000)
    timer = None
    with pytest.raises(KeyboardInterrupt):
        with st:
            for i, _ in enumerate(st):
                if i == 1:
                    timer = threading.Timer(0.05, signal.raise_signal, (signal.SIGINT,))
                    timer.start()
    timer.join()
    assert st.result is not None and len(st.result.ids) < 2000
    np.testing.assert_array_equal(s.generate(PROMPT, max_new_tokens=12).ids, full_run[0])


def test_sessions_on_two_threads_give_the_sequential_ids(model, full_run):
    """Two sessions of one model generating at once, one per thread (ctypes lets go of the GIL
    during the call), give the ids of one run alone."""
    want = model.session("snapkv", budget=12, window=4, kernel=3).generate(PROMPT, max_new_tokens=12).ids.tolist()
    got = {}

    def work(name, spec):
        s = model.session(spec, budget=12, window=4, kernel=3) if spec else model.session()
        got[name] = [s.generate(PROMPT, max_new_tokens=12).ids.tolist() for _ in range(3)]
    ts = [threading.Thread(target=work, args=("full", None)), threading.Thread(target=work, args=("snap", "snapkv"))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert got["full"] == [full_run[0].tolist()] * 3
    assert got["snap"] == [want] * 3
