"""Loading libkvsieve.so and declaring its C functions (ctypes).

The library is looked for, in this order:
  1. the path given to kvsieve.load_library(path), or in the KVSIEVE_LIBRARY variable;
  2. the copy bundled into the package by `pip install ./python` (kvsieve/lib/);
  3. when the package is imported from a checkout (python/kvsieve), that checkout's
     build/pic/ (what `make lib` builds);
  4. the loader's path and the usual install prefixes (`make install`: /usr/local/lib, /usr/lib).
The first that exists is loaded; if none does, LibraryNotFound names every place tried.

Every function of include/kvsieve.h that the package uses is declared here with its argument
and result types, so a wrong call is a Python TypeError instead of a crash.
"""
import ctypes
import ctypes.util
import glob
import os
import threading

__all__ = ["lib", "load_library", "library_path", "LibraryNotFound", "libc_free"]

_HERE = os.path.dirname(os.path.abspath(__file__))


class LibraryNotFound(OSError):
    """libkvsieve.so was not found (or could not be loaded); the message lists what was tried."""


# ------------------------------------------------------------------ C types ---------------------

c_int32_p = ctypes.POINTER(ctypes.c_int32)
c_float_p = ctypes.POINTER(ctypes.c_float)


class ModelOpts(ctypes.Structure):
    """struct ks_model_opts"""
    _fields_ = [("backend", ctypes.c_char_p), ("threads", ctypes.c_int), ("device", ctypes.c_int)]


class GenerateOpts(ctypes.Structure):
    """struct ks_generate_opts"""
    _fields_ = [
        ("max_new_tokens", ctypes.c_int),
        ("temperature", ctypes.c_float),
        ("top_p", ctypes.c_float),
        ("seed", ctypes.c_uint64),
        ("add_special", ctypes.c_int),
        ("top_k", ctypes.c_int),
        ("min_p", ctypes.c_float),
        ("repeat_penalty", ctypes.c_float),
        ("stop", ctypes.POINTER(ctypes.c_char_p)),
        ("n_stop", ctypes.c_int),
    ]


class EvalRecord(ctypes.Structure):
    """struct ks_eval_record"""
    _fields_ = [
        ("policy", ctypes.c_int), ("length_index", ctypes.c_int), ("depth_index", ctypes.c_int),
        ("index", ctypes.c_int), ("policy_name", ctypes.c_char_p), ("length", ctypes.c_int),
        ("depth", ctypes.c_double), ("seed", ctypes.c_uint64), ("tokens", ctypes.c_int),
        ("correct", ctypes.c_int), ("kept", ctypes.c_int), ("value_in", ctypes.c_int), ("value_n", ctypes.c_int),
        ("value_kept", ctypes.c_double), ("needle_begin", ctypes.c_int), ("needle_end", ctypes.c_int),
        ("value_begin", ctypes.c_int), ("value_end", ctypes.c_int), ("prefill_s", ctypes.c_double),
        ("decode_s", ctypes.c_double), ("answer", ctypes.c_char_p), ("output", ctypes.c_char_p),
        ("resumed", ctypes.c_int), ("prompt_ids", c_int32_p), ("kept_positions", c_int32_p),
    ]


# int (*ks_eval_run_fn)(void *user, const ks_eval_record *r, long done, long total)
EVAL_RUN_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(EvalRecord), ctypes.c_long,
                               ctypes.c_long)


class EvalOpts(ctypes.Structure):
    """struct ks_eval_opts"""
    _fields_ = [
        ("task", ctypes.c_char_p), ("lengths", ctypes.POINTER(ctypes.c_int)), ("n_lengths", ctypes.c_int),
        ("depths", ctypes.POINTER(ctypes.c_double)), ("n_depths", ctypes.c_int), ("cases", ctypes.c_int),
        ("seed", ctypes.c_uint64), ("policies", ctypes.POINTER(ctypes.c_void_p)),
        ("policy_names", ctypes.POINTER(ctypes.c_char_p)), ("n_policies", ctypes.c_int),
        ("corpora", ctypes.c_char_p), ("model_label", ctypes.c_char_p),
        ("interrupt", ctypes.POINTER(ctypes.c_int)),  # volatile sig_atomic_t * (an int on Linux)
        ("on_run", EVAL_RUN_FN), ("user", ctypes.c_void_p),
    ]


class EvalCell(ctypes.Structure):
    """struct ks_eval_cell"""
    _fields_ = [
        ("cases", ctypes.c_int), ("correct", ctypes.c_int), ("n_value", ctypes.c_int),
        ("value_kept_sum", ctypes.c_double), ("prefill_sum", ctypes.c_double),
        ("tokens_sum", ctypes.c_longlong), ("kept_sum", ctypes.c_longlong),
        ("exact_match", ctypes.c_double), ("value_kept", ctypes.c_double),
    ]


# ks_status (*ks_policy_fn)(void *user, ks_event *ev); ks_status (*begin)(void *user, ks_session *s)
POLICY_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
BEGIN_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
FREE_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class PolicyHandlers(ctypes.Structure):
    """struct ks_policy_handlers"""
    _fields_ = [
        ("name", ctypes.c_char_p), ("user", ctypes.c_void_p),
        ("prefill_qkv", POLICY_FN), ("prefill_layer_end", POLICY_FN), ("prefill_end", POLICY_FN),
        ("decode_qkv", POLICY_FN), ("token", POLICY_FN),
        ("begin", BEGIN_FN), ("free_user", FREE_FN),
        ("pre_rope_keys", ctypes.c_int), ("prefill_chunk", ctypes.c_int),
    ]


# int (*ks_stream_fn)(void *ud, int32_t id, const char *piece)
STREAM_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int32, ctypes.c_char_p)
# void (*ks_log_fn)(void *user, ks_log_level level, const char *msg)
LOG_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p)

_P = ctypes.c_void_p  # every handle is opaque
_S = ctypes.c_int     # ks_status
_PROTOS = {
    "ks_version": (ctypes.c_char_p, []),
    "ks_last_error": (ctypes.c_char_p, []),
    "ks_status_name": (ctypes.c_char_p, [ctypes.c_int]),
    "ks_set_log": (None, [LOG_FN, ctypes.c_void_p]),
    "ks_model_opts_default": (None, [ctypes.POINTER(ModelOpts)]),
    "ks_model_open_ex": (_S, [ctypes.c_char_p, ctypes.POINTER(ModelOpts), ctypes.POINTER(_P)]),
    "ks_model_close": (None, [_P]),
    "ks_tokenize": (_S, [_P, ctypes.c_char_p, ctypes.c_int, ctypes.POINTER(c_int32_p), ctypes.POINTER(ctypes.c_int)]),
    "ks_detokenize_ex": (_S, [_P, c_int32_p, ctypes.c_int, ctypes.c_uint, ctypes.POINTER(ctypes.c_void_p)]),
    "ks_session_create": (_S, [_P, ctypes.POINTER(_P)]),
    "ks_session_free": (None, [_P]),
    "ks_session_set_policy": (_S, [_P, _P]),
    "ks_session_set_fallback": (None, [_P, ctypes.c_int]),
    "ks_generate_opts_default": (None, [ctypes.POINTER(GenerateOpts)]),
    "ks_generate": (_S, [_P, ctypes.c_char_p, ctypes.POINTER(GenerateOpts), STREAM_FN, ctypes.c_void_p]),
    "ks_generate_ids": (_S, [_P, c_int32_p, ctypes.c_int, ctypes.POINTER(GenerateOpts), STREAM_FN, ctypes.c_void_p]),
    "ks_result_ids": (c_int32_p, [_P, ctypes.POINTER(ctypes.c_int)]),
    "ks_result_text": (ctypes.c_char_p, [_P]),
    "ks_result_prompt_tokens": (ctypes.c_int, [_P]),
    "ks_result_prefill_seconds": (ctypes.c_double, [_P]),
    "ks_result_decode_seconds": (ctypes.c_double, [_P]),
    "ks_result_kept": (ctypes.c_int, [_P, ctypes.c_int, ctypes.c_int, ctypes.POINTER(c_int32_p)]),
    "ks_result_restart": (ctypes.c_int, [_P, ctypes.POINTER(c_int32_p)]),
    "ks_result_policy_error": (ctypes.c_char_p, [_P]),
    "ks_session_logits": (_S, [_P, ctypes.POINTER(c_float_p), ctypes.POINTER(ctypes.c_int)]),
    "ks_session_top_logprobs": (_S, [_P, ctypes.c_int, c_int32_p, c_float_p]),
    "ks_policy_load_path": (_S, [_P, ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(_P)]),
    "ks_policy_load_string": (_S, [_P, ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(_P)]),
    "ks_policy_set": (_S, [_P, ctypes.c_char_p, ctypes.c_char_p]),
    "ks_policy_get": (_S, [_P, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]),
    "ks_policy_n_params": (ctypes.c_int, [_P]),
    "ks_policy_param_name": (ctypes.c_char_p, [_P, ctypes.c_int]),
    "ks_policy_name": (ctypes.c_char_p, [_P]),
    "ks_policy_report": (ctypes.c_char_p, [_P, ctypes.c_char_p]),
    "ks_policy_n_reports": (ctypes.c_int, [_P]),
    "ks_policy_report_key": (ctypes.c_char_p, [_P, ctypes.c_int]),
    "ks_policy_free": (None, [_P]),
    "ks_eval_opts_default": (None, [ctypes.POINTER(EvalOpts)]),
    "ks_eval_create": (_S, [_P, ctypes.POINTER(EvalOpts), ctypes.POINTER(_P)]),
    "ks_eval_resume": (_S, [_P, ctypes.c_char_p]),
    "ks_eval_run": (_S, [_P]),
    "ks_eval_free": (None, [_P]),
    "ks_eval_n_runs": (ctypes.c_long, [_P]),
    "ks_eval_n_done": (ctypes.c_long, [_P]),
    "ks_eval_record_at": (ctypes.POINTER(EvalRecord), [_P, ctypes.c_long]),
    "ks_eval_cell_at": (_S, [_P, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.POINTER(EvalCell)]),
    "ks_eval_write_json": (_S, [_P, ctypes.c_char_p]),
    "ks_policy_create_c": (_S, [ctypes.POINTER(PolicyHandlers), ctypes.POINTER(_P)]),
    "ks_event_layer": (ctypes.c_int, [_P]),
    "ks_event_pass": (ctypes.c_int, [_P]),
    "ks_event_rows": (ctypes.c_int, [_P]),
    "ks_event_prompt_tokens": (ctypes.c_int, [_P]),
    "ks_event_positions": (c_int32_p, [_P]),
    "ks_event_ids": (c_int32_p, [_P]),
    "ks_event_token": (ctypes.c_int32, [_P]),
    "ks_event_kv_rows": (ctypes.c_int, [_P, ctypes.c_int, ctypes.POINTER(c_int32_p)]),
    "ks_event_tensor_size": (ctypes.c_size_t, [_P, ctypes.c_int]),
    "ks_event_copy": (_S, [_P, ctypes.c_int, c_float_p, ctypes.c_size_t]),
    "ks_action_restart": (_S, [_P, c_int32_p, ctypes.c_int]),
    "ks_action_propagate": (_S, [_P, c_int32_p, ctypes.c_int]),
    "ks_action_retain": (_S, [_P, c_int32_p, ctypes.c_int]),
    "ks_action_retain_heads": (_S, [_P, ctypes.POINTER(c_int32_p), ctypes.POINTER(ctypes.c_int)]),
    "ks_action_attend": (_S, [_P, c_int32_p, ctypes.c_int, ctypes.c_int]),
    "ks_action_attend_heads": (_S, [_P, ctypes.POINTER(c_int32_p), ctypes.POINTER(ctypes.c_int), ctypes.c_int]),
    "ks_action_stop": (_S, [_P]),
    "ks_action_discard_kv": (_S, [_P]),
    "ks_model_n_layers": (ctypes.c_int, [_P]),
    "ks_model_n_kv_heads": (ctypes.c_int, [_P]),
    "ks_model_vocab": (ctypes.c_int, [_P]),
    "ks_model_max_context": (ctypes.c_int, [_P]),
}

# ------------------------------------------------------------------ finding the library ---------

_lock = threading.Lock()
_lib = None
_path = None
_log_cb = None  # keeps the C callback object alive for as long as the library may call it


def _candidates():
    env = os.environ.get("KVSIEVE_LIBRARY")
    if env:
        return [("KVSIEVE_LIBRARY", env)]
    out = []
    for p in sorted(glob.glob(os.path.join(_HERE, "lib", "libkvsieve.so*"))):
        out.append(("bundled", p))
    checkout = os.path.dirname(os.path.dirname(_HERE))  # python/kvsieve -> the checkout
    if os.path.exists(os.path.join(checkout, "include", "kvsieve.h")):
        for p in sorted(glob.glob(os.path.join(checkout, "build", "pic", "libkvsieve.so.*"))):
            out.append(("checkout build", p))
    found = ctypes.util.find_library("kvsieve")
    if found:
        out.append(("loader path", found))
    for d in ("/usr/local/lib", "/usr/lib", "/usr/lib/x86_64-linux-gnu"):
        out.append(("prefix", os.path.join(d, "libkvsieve.so")))
    return out


def _declare(lib):
    for name, (res, args) in _PROTOS.items():
        f = getattr(lib, name)
        f.restype = res
        f.argtypes = args


def load_library(path=None):
    """Load libkvsieve.so and return the ctypes handle (once per process).

    path: an explicit file to load (overrides KVSIEVE_LIBRARY and the search). Calling it again
    after the library is loaded returns the loaded one; asking then for another path raises
    LibraryNotFound (one process holds one kvsieve library)."""
    global _lib, _path
    with _lock:
        if _lib is not None:
            if path and os.path.realpath(path) != os.path.realpath(_path):
                raise LibraryNotFound("libkvsieve is already loaded from %s; cannot load %s too" % (_path, path))
            return _lib
        tried = []
        for how, p in ([("argument", path)] if path else _candidates()):
            if os.sep in p and not os.path.exists(p):
                tried.append("%s (%s: no such file)" % (p, how))
                continue
            try:
                lib = ctypes.CDLL(p)
                _declare(lib)
            except (OSError, AttributeError) as e:
                tried.append("%s (%s: %s)" % (p, how, e))
                continue
            _lib, _path = lib, p
            _install_log_forwarder(lib)
            return lib
        raise LibraryNotFound(
            "libkvsieve.so not found: build it with `make lib` and `pip install ./python`, or run `make install`, "
            "or set KVSIEVE_LIBRARY to its path. Tried: " + "; ".join(tried))


def library_path():
    """The file libkvsieve was loaded from (loading it first if needed)."""
    load_library()
    return _path


def _install_log_forwarder(lib):
    """The library never prints: its messages (a policy's print(), the first failure of a kind
    in a policy) go to the Python logger "kvsieve" (policy prints at INFO). As any library's,
    that logger shows nothing until the program configures logging, e.g.
    logging.basicConfig(level=logging.INFO)."""
    global _log_cb
    import logging
    log = logging.getLogger("kvsieve")
    log.addHandler(logging.NullHandler())
    levels = {0: logging.ERROR, 1: logging.WARNING, 2: logging.INFO, 3: logging.DEBUG}

    def forward(user, level, msg):
        try:
            log.log(levels.get(level, logging.INFO), "%s", msg.decode("utf-8", "replace"))
        except BaseException:  # never let an exception unwind into C
            pass
    _log_cb = LOG_FN(forward)
    lib.ks_set_log(_log_cb, None)


class _Lazy:
    """`lib.ks_x(...)` loads the library on first use."""

    def __getattr__(self, name):
        return getattr(load_library(), name)


lib = _Lazy()

_libc = ctypes.CDLL(None)
_libc.free.argtypes = [ctypes.c_void_p]
_libc.free.restype = None


def libc_free(p):
    """free() a buffer the library malloc'd for the caller (ks_tokenize, ks_detokenize)."""
    _libc.free(p)
