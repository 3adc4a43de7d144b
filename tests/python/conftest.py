"""Shared fixtures of the Python package's tests (run by tests/test_python.c under `make test`, or
by hand: /usr/bin/python3 -m pytest tests/python after `make lib`).

kvsieve is imported as installed; when it is not installed, from the checkout's python/ (which
then loads build/pic/libkvsieve.so.*, or $KVSIEVE_LIBRARY)."""
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
try:
    import kvsieve  # noqa: F401
except ImportError:
    sys.path.insert(0, os.path.join(ROOT, "python"))
    import kvsieve  # noqa: F401

MODEL_DIR = os.path.join(ROOT, "models", "kvsieve-tiny")
# The prompt of tests/test_python.c's reference run too.
PROMPT = "The grass is green. The sky is blue. The sun is bright. The grass is"


@pytest.fixture(scope="session")
def model():
    """The bundled model on the CPU backend (2 threads: results are the same bits for any count)."""
    m = kvsieve.Model(MODEL_DIR, backend="cpu", threads=2)
    yield m
    m.close()


@pytest.fixture(scope="session")
def full_run(model):
    """(ids, text) of a greedy 12-token reply to PROMPT with full attention."""
    r = model.session().generate(PROMPT, max_new_tokens=12)
    return r.ids.copy(), r.text
