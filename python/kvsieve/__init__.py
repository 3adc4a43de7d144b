"""kvsieve: an LLM inference engine whose KV-cache pruning policies are Lua scripts, from Python.

A thin layer (ctypes) over libkvsieve.so and its C API, include/kvsieve.h:

    import kvsieve
    model = kvsieve.Model("models/kvsieve-tiny")                 # backend="cpu" | "cuda"
    policy = model.policy("streamingllm", budget=6, sinks=2)      # a name, a file or Lua source
    session = model.session(policy)
    r = session.generate("The grass is green. The sky is", max_new_tokens=16)
    r.text, r.ids, r.kept(layer=0)                                # str, int32 arrays
    for tok in session.generate("Once upon a time", stream=True):
        print(tok.text, end="")
    runs = kvsieve.eval(model, "passkey", lengths=[256], depths=[0, 1], cases=2,
                        policies={"full": None, "snap": model.policy("snapkv", budget=64)})
    # a list of dicts, one per run: pandas.DataFrame(runs)

Policy.from_python(model, handlers) makes a policy of Python handlers that see each event's
tensors as numpy arrays (kvsieve.Event); kvsieve.eval(model, task, ...) runs the library's
retrieval grid and returns one dict per run.

Failures raise kvsieve.Error subclasses (FileError, PolicyError, ArgumentError, ...) carrying the
library's message. The library is found as kvsieve._lib describes (KVSIEVE_LIBRARY overrides);
its log messages (a policy's print()) go to the "kvsieve" logger of the logging module
(logging.basicConfig(level=logging.INFO) shows them).
"""
from ._errors import (ArgumentError, ContextError, DeviceError, DtypeError, Error, FileError, FormatError,
                      InternalError, Interrupted, OutOfMemory, PolicyError, ShapeError, UnsupportedError)
from ._lib import LibraryNotFound, library_path, load_library
from ._core import Model, Policy, Result, Session, Stream, Token, policy_search_path, version
from ._eval import EVAL_SEED, EvalRuns, eval
from ._pypolicy import Event

try:  # the installed distribution's version (the library's, from include/kvsieve.h)
    from importlib.metadata import version as _dist_version
    __version__ = _dist_version("kvsieve")
except Exception:  # imported from a checkout without installing
    __version__ = "0+checkout"

for _name in ("Model", "Policy", "EvalRuns", "Event", "Session", "Result", "Stream", "Token", "LibraryNotFound", "Error", "FileError",
              "FormatError", "ShapeError", "DtypeError", "UnsupportedError", "OutOfMemory", "ArgumentError",
              "ContextError", "PolicyError", "Interrupted", "DeviceError", "InternalError"):
    globals()[_name].__module__ = __name__  # kvsieve.PolicyError, not kvsieve._errors.PolicyError
del _name

__all__ = ["Model", "Policy", "Session", "Result", "Stream", "Token", "Event", "eval", "EvalRuns", "EVAL_SEED", "version",
           "load_library", "library_path",
           "policy_search_path", "LibraryNotFound", "Error", "FileError", "FormatError", "ShapeError",
           "DtypeError", "UnsupportedError", "OutOfMemory", "ArgumentError", "ContextError", "PolicyError",
           "Interrupted", "DeviceError", "InternalError"]
