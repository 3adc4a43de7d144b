"""Models, policies, sessions, results and streams: the Python face of include/kvsieve.h.

Lifetimes. A Session and a Policy keep their Model alive; a Session keeps its Policy alive.
Each object frees its C handle when it is garbage-collected, or at once with close() (or a
`with` block). Model.close() closes the model's sessions and policies first; using a closed
object raises kvsieve.Error.

Threads. One session runs one request at a time: a second generate() on a session whose stream
is still open raises RuntimeError. Different sessions may run on different threads. A policy
should be attached to one session at a time (it keeps per-request state in its Lua state).
"""
import collections
import ctypes
import os
import queue
import threading
import weakref

import numpy as np

from . import _lib
from ._errors import Error, raise_status
from ._lib import GenerateOpts, ModelOpts, STREAM_FN, c_float_p, c_int32_p, lib

__all__ = ["Model", "Policy", "Session", "Result", "Stream", "Token", "version"]

Token = collections.namedtuple("Token", "id text")
Token.__doc__ = """One generated token: its id and the text it completed (may be "": a piece of a
multi-byte character, or text held back while it may still become a stop string)."""


def version():
    """The version of the loaded libkvsieve ("MAJOR.MINOR.PATCH")."""
    return lib.ks_version().decode()


def _last_error():
    return (lib.ks_last_error() or b"").decode("utf-8", "replace")


def _check(status):
    if status:
        raise_status(status, _last_error())


def _cstr(s, what):
    if isinstance(s, os.PathLike):
        s = os.fspath(s)
    if not isinstance(s, str):
        raise TypeError("%s must be a str, not %s" % (what, type(s).__name__))
    if "\0" in s:
        raise ValueError("%s contains a NUL character" % what)
    return s.encode("utf-8")


def _pystr(b):
    return b.decode("utf-8", "replace") if b else ""


class _Handle:
    """An owned C handle: _h is the pointer (None once closed)."""
    _h = None
    _what = "object"

    def _handle(self):
        if self._h is None:
            raise Error("this %s is closed" % self._what)
        return self._h

    @property
    def closed(self):
        """True once close() has run."""
        return self._h is None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


# ------------------------------------------------------------------ Model ------------------------

class Model(_Handle):
    """A model folder (config.json, tokenizer.json, *.safetensors) opened on one backend.

    Model(path, backend="cpu", threads=0, device=0)
      backend  "cpu" or "cuda" (a library built with CUDA)
      threads  CPU worker threads, the caller included; 0 = one per CPU (results are the same
               bits for every count)
      device   CUDA device index
    Raises FileError for a missing folder, FormatError for a malformed one, ArgumentError for a
    bad option (ks_model_open_ex)."""
    _what = "model"

    def __init__(self, path, backend="cpu", threads=0, device=0):
        self.path = os.fspath(path)
        self.backend = backend
        self._children = weakref.WeakSet()
        o = ModelOpts()
        lib.ks_model_opts_default(ctypes.byref(o))
        bk = _cstr(backend, "backend")
        o.backend, o.threads, o.device = bk, int(threads), int(device)
        h = ctypes.c_void_p()
        _check(lib.ks_model_open_ex(_cstr(self.path, "path"), ctypes.byref(o), ctypes.byref(h)))
        self._h = h.value

    def close(self):
        """Close the model, after closing its sessions and policies (idempotent)."""
        if self._h is None:
            return
        kids = list(self._children)
        for k in kids:
            if isinstance(k, Session):
                k.close()
        for k in kids:
            k.close()
        lib.ks_model_close(self._h)
        self._h = None

    @property
    def n_layers(self):
        """Transformer layers."""
        return lib.ks_model_n_layers(self._handle())

    @property
    def n_kv_heads(self):
        """KV heads per layer."""
        return lib.ks_model_n_kv_heads(self._handle())

    @property
    def vocab(self):
        """Vocabulary size (the length of a logits vector)."""
        return lib.ks_model_vocab(self._handle())

    @property
    def max_context(self):
        """The longest sequence (prompt + generation) the model takes."""
        return lib.ks_model_max_context(self._handle())

    def tokenize(self, text, add_special=True):
        """Token ids of text, as an int32 numpy array (add_special: BOS etc. as the tokenizer's
        post-processor says)."""
        ids = c_int32_p()
        n = ctypes.c_int()
        _check(lib.ks_tokenize(self._handle(), _cstr(text, "text"), int(bool(add_special)), ctypes.byref(ids),
                               ctypes.byref(n)))
        try:
            return np.ctypeslib.as_array(ids, shape=(n.value,)).copy() if n.value else np.zeros(0, np.int32)
        finally:
            _lib.libc_free(ids)

    def detokenize(self, ids, special=False):
        """Text of token ids (special=False drops special tokens, as HF's
        skip_special_tokens=True). An id outside the vocabulary raises ArgumentError."""
        a = np.ascontiguousarray(ids, dtype=np.int32)
        if a.ndim != 1:
            raise ValueError("ids must be one-dimensional")
        text = ctypes.c_void_p()
        _check(lib.ks_detokenize_ex(self._handle(), a.ctypes.data_as(c_int32_p), len(a), 1 if special else 0,
                                    ctypes.byref(text)))
        try:
            return _pystr(ctypes.string_at(text.value)) if text.value else ""
        finally:
            _lib.libc_free(text)

    def policy(self, spec, **params):
        """A policy for this model, from a name ("streamingllm"), a file ("my.lua", "dir/p.lua")
        or Lua source (any text with a newline in it), with parameters as keyword arguments:
            model.policy("streamingllm", budget=64, sinks=4)
        See Policy."""
        return Policy(self, spec, **params)

    def session(self, policy=None, fallback=False, **params):
        """A new Session on this model. policy: a Policy, a spec for model.policy (then the
        keyword arguments are its parameters), or None (full attention)."""
        if isinstance(policy, (str, os.PathLike)):
            policy = self.policy(policy, **params)
        elif params:
            raise TypeError("policy parameters given without a policy spec: %s" % ", ".join(sorted(params)))
        return Session(self, policy=policy, fallback=fallback)

    def __repr__(self):
        if self._h is None:
            return "<kvsieve.Model %r (closed)>" % self.path
        return "<kvsieve.Model %r backend=%s layers=%d kv_heads=%d vocab=%d>" % (
            self.path, self.backend, self.n_layers, self.n_kv_heads, self.vocab)


# ------------------------------------------------------------------ Policy -----------------------

_HERE = os.path.dirname(os.path.abspath(__file__))


def policy_search_path():
    """Folders searched for a policy given by name, in order: $KVSIEVE_POLICY_PATH (colon-
    separated), ./policies, the policies bundled into the package, and the checkout's policies/
    when the package is imported from a checkout."""
    dirs = [d for d in os.environ.get("KVSIEVE_POLICY_PATH", "").split(":") if d]
    dirs.append("policies")
    dirs.append(os.path.join(_HERE, "policies"))
    checkout = os.path.dirname(os.path.dirname(_HERE))
    if os.path.exists(os.path.join(checkout, "include", "kvsieve.h")):
        dirs.append(os.path.join(checkout, "policies"))
    return dirs


def _is_source(spec):
    return "\n" in spec or spec.lstrip().startswith("return")


def _param_text(key, v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    if isinstance(v, (float, np.floating)):
        return repr(float(v))
    if isinstance(v, str):
        return v
    raise TypeError("parameter %s: a bool, int, float or str, not %s" % (key, type(v).__name__))


def _param_value(text):
    if text in ("true", "false"):
        return text == "true"
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text


class Policy(_Handle):
    """A token-pruning policy: a Lua script run in the library's sandbox.

    Policy(model, spec, **params)
      spec    Lua source when it holds a newline (or starts with "return"); else a file path
              when it has a "/" or ends in ".lua"; else a name looked up in policy_search_path()
      params  parameters, set as with ks_policy_set: bool, int, float or str values, each parsed
              by the type of the parameter's default
    model may be None (the policy then sees no model config).
    Raises FileError (no such policy or file), PolicyError (the script fails to load) or
    ArgumentError (an unknown parameter or a value its type refuses). A policy's own checks of
    its parameters (say budget > sinks) run when a request begins: PolicyError from generate()."""
    _what = "policy"

    def __init__(self, model, spec, chunkname=None, **params):
        if isinstance(spec, os.PathLike):
            spec = os.fspath(spec)
        if not isinstance(spec, str):
            raise TypeError("spec must be a str (a name, a path or Lua source)")
        self._load(model, spec, _is_source(spec), chunkname, params)

    _pending = None  # Python policies: {"exc": the first exception a handler raised this request}

    @classmethod
    def from_python(cls, model, handlers, name=None, pre_rope_keys=False, prefill_chunk=0):
        """A policy whose handlers are Python callables (ks_policy_create_c): handlers is an object
        or a dict with any of begin(), prefill_qkv(ev), prefill_layer_end(ev), prefill_end(ev),
        decode_qkv(ev), token(ev); each ev is a kvsieve.Event (tensors as numpy arrays, actions
        as methods). name: the policy's name in messages (default: handlers.name or its class
        name). pre_rope_keys, prefill_chunk: as in ks_policy_handlers. Such a policy has no
        parameters or reports (its handlers keep their own state). An exception in a handler
        stops the request and comes out of generate()."""
        from ._pypolicy import create_python_policy
        if not isinstance(model, Model):
            raise TypeError("model must be a kvsieve.Model (the events' shapes come from it)")
        self = cls.__new__(cls)
        self._model, self._sessions, self.source = model, weakref.WeakSet(), "python"
        model._handle()  # not closed
        self._h, self._keep, self._pending = create_python_policy(model, handlers, name, pre_rope_keys,
                                                                  prefill_chunk)
        model._children.add(self)
        return self

    @classmethod
    def from_string(cls, model, source, chunkname="<string>", **params):
        """A policy from Lua source text, whatever it looks like; chunkname names it in messages."""
        self = cls.__new__(cls)
        self._load(model, source, True, chunkname, params)
        return self

    def _load(self, model, spec, is_source, chunkname, params):
        if model is not None and not isinstance(model, Model):
            raise TypeError("model must be a kvsieve.Model or None")
        self._model = model
        self._sessions = weakref.WeakSet()
        mh = model._handle() if model is not None else None
        h = ctypes.c_void_p()
        if is_source:
            self.source = "string"
            _check(lib.ks_policy_load_string(mh, _cstr(chunkname or "<string>", "chunkname"), _cstr(spec, "source"),
                                             ctypes.byref(h)))
        else:
            self.source = spec
            _check(lib.ks_policy_load_path(mh, _cstr(spec, "spec"), _cstr(":".join(policy_search_path()), "path"),
                                           ctypes.byref(h)))
        self._h = h.value
        if model is not None:
            model._children.add(self)
        try:
            self.set(**params)
        except BaseException:
            self.close()
            raise

    def close(self):
        """Detach the policy from its sessions and free it (idempotent)."""
        if self._h is None:
            return
        for s in list(self._sessions):
            if s._policy is self and s._h is not None:
                s.policy = None
        lib.ks_policy_free(self._h)
        self._h = None

    @property
    def name(self):
        """The policy's name (its `name` field)."""
        return _pystr(lib.ks_policy_name(self._handle()))

    def set(self, **params):
        """Set parameters: policy.set(budget=64, rolling=True). Unknown keys and values their
        type refuses raise ArgumentError."""
        h = self._handle()
        for k, v in params.items():
            _check(lib.ks_policy_set(h, _cstr(k, "parameter name"), _cstr(_param_text(k, v), "value")))

    def get(self, key):
        """A parameter's current value as the library formats it (text)."""
        buf = ctypes.create_string_buffer(4096)
        _check(lib.ks_policy_get(self._handle(), _cstr(key, "parameter name"), buf, len(buf)))
        return _pystr(buf.value)

    @property
    def params(self):
        """{name: value} of every parameter (bool, int, float or str as the text reads)."""
        h = self._handle()
        names = [_pystr(lib.ks_policy_param_name(h, i)) for i in range(lib.ks_policy_n_params(h))]
        return {n: _param_value(self.get(n)) for n in names}

    @property
    def reports(self):
        """{key: text} of what the policy reported (ev:report) during the last request."""
        h = self._handle()
        out = {}
        for i in range(lib.ks_policy_n_reports(h)):
            k = lib.ks_policy_report_key(h, i)
            out[_pystr(k)] = _pystr(lib.ks_policy_report(h, k))
        return out

    def __repr__(self):
        if self._h is None:
            return "<kvsieve.Policy (closed)>"
        return "<kvsieve.Policy %s %r>" % (self.name, self.params)


# ------------------------------------------------------------------ Session -----------------------

class Session(_Handle):
    """One conversation on a model: KV cache, positions, an optional policy.

    Session(model, policy=None, fallback=False); usually model.session(...).
      policy    a Policy (None: full attention); settable later with session.policy = p
      fallback  on a policy failure, True finishes the request with full attention and puts the
                failure in result.policy_error; False (default) raises PolicyError."""
    _what = "session"

    def __init__(self, model, policy=None, fallback=False):
        if not isinstance(model, Model):
            raise TypeError("model must be a kvsieve.Model")
        self._model = model
        self._policy = None
        self._busy = False
        self._busy_lock = threading.Lock()  # _busy is tested and set by one thread at a time
        self._generation = 0
        h = ctypes.c_void_p()
        _check(lib.ks_session_create(model._handle(), ctypes.byref(h)))
        self._h = h.value
        model._children.add(self)
        self.policy = policy
        self.fallback = fallback

    def close(self):
        """Free the session (idempotent). A stream still open on it is stopped first."""
        if self._h is None:
            return
        st = getattr(self, "_stream", None)
        s = st() if st is not None else None
        if s is not None:
            s.close()
        lib.ks_session_free(self._h)
        self._h = None
        self._policy = None

    @property
    def model(self):
        return self._model

    @property
    def policy(self):
        """The attached Policy, or None (full attention)."""
        return self._policy

    @policy.setter
    def policy(self, p):
        if p is not None and not isinstance(p, Policy):
            raise TypeError("policy must be a kvsieve.Policy or None (model.policy(spec, ...) makes one)")
        self._not_busy()
        _check(lib.ks_session_set_policy(self._handle(), p._handle() if p is not None else None))
        self._policy = p
        if p is not None:
            p._sessions.add(self)

    @property
    def fallback(self):
        """Whether a policy failure falls back to full attention (see the class)."""
        return self._fallback

    @fallback.setter
    def fallback(self, on):
        lib.ks_session_set_fallback(self._handle(), 1 if on else 0)
        self._fallback = bool(on)

    def _not_busy(self):
        if self._busy:
            raise RuntimeError("session is busy: a request on it is still running (a stream not finished or "
                               "closed, or a generate() on another thread)")

    def _claim(self):
        """Mark the session busy for one request (RuntimeError if it already is)."""
        with self._busy_lock:
            self._not_busy()
            self._busy = True
            self._generation += 1

    def _opts(self, kw):
        o = GenerateOpts()
        lib.ks_generate_opts_default(ctypes.byref(o))
        keep = []
        for k, v in kw.items():
            if k == "stop":
                if v is None:
                    continue
                if isinstance(v, str):
                    v = [v]
                enc = [_cstr(x, "stop string") for x in v]
                arr = (ctypes.c_char_p * max(1, len(enc)))(*enc)
                keep.append(arr)
                o.stop, o.n_stop = ctypes.cast(arr, ctypes.POINTER(ctypes.c_char_p)), len(enc)
            elif k == "add_special":
                o.add_special = 1 if v else 0
            elif k in ("max_new_tokens", "top_k", "seed"):
                if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                    raise TypeError("%s must be an int" % k)
                if k == "seed" and not 0 <= v < 2 ** 64:
                    raise ValueError("seed must be in [0, 2**64)")
                if k != "seed" and not -2 ** 31 <= v < 2 ** 31:
                    raise ValueError("%s = %d does not fit a C int" % (k, v))
                setattr(o, k, int(v))
            elif k in ("temperature", "top_p", "min_p", "repeat_penalty"):
                setattr(o, k, float(v))
            else:
                raise TypeError("generate() got an unexpected keyword argument %r" % k)
        return o, keep

    def _runner(self, prompt, opts):
        """fn(cb) -> status running one ks_generate* call on prompt with opts."""
        h = self._handle()
        if isinstance(prompt, str):
            p = _cstr(prompt, "prompt")
            return lambda cb: lib.ks_generate(h, p, ctypes.byref(opts), cb, None)
        ids = np.ascontiguousarray(prompt, dtype=np.int64)
        if ids.ndim != 1:
            raise ValueError("prompt ids must be one-dimensional")
        if ids.size and (ids.min() < -2 ** 31 or ids.max() >= 2 ** 31):
            raise ValueError("prompt ids must fit int32")
        ids = ids.astype(np.int32)
        return lambda cb: lib.ks_generate_ids(h, ids.ctypes.data_as(c_int32_p), len(ids), ctypes.byref(opts), cb, None)

    def generate(self, prompt, stream=False, on_token=None, **options):
        """Generate a reply to prompt from a fresh state (the session is reset first).

        prompt   a str (tokenized with add_special) or a sequence of token ids
        stream   False: run to the end and return a Result. True: return a Stream, an iterator
                 of Token(id, text) that runs the request on a worker thread; its .result is
                 the Result once it is exhausted. Breaking out of it (or close()) stops the
                 request at the next token and leaves the session usable.
        on_token (stream=False) called with each Token; a true return value stops generation;
                 an exception it raises stops generation and propagates (so does Ctrl-C).
        options  max_new_tokens=64, temperature=0.0 (greedy), top_p=1.0, seed=0, top_k=0,
                 min_p=0.0, repeat_penalty=1.0, stop=None (a str or list of str),
                 add_special=True: ks_generate_opts; out-of-range values raise ArgumentError.
        Failures raise the library's error: ContextError, PolicyError, ArgumentError, ..."""
        opts, keep = self._opts(options)
        run = self._runner(prompt, opts)
        if stream and on_token is not None:
            raise TypeError("on_token is for stream=False (iterate the stream instead)")
        self._claim()
        if stream:
            return Stream(self, run, (opts, keep))
        caught = []

        def cb(ud, tid, piece):
            try:
                if on_token is not None and on_token(Token(tid, _pystr(piece))):
                    return 1
                return 0
            except BaseException as e:  # KeyboardInterrupt included: stop, re-raise after
                caught.append(e)
                return 1
        cfn = STREAM_FN(cb)
        pending = self._policy._pending if self._policy is not None else None
        if pending is not None:
            pending["exc"] = None
        try:
            st = run(cfn)
            err = _last_error() if st else ""
        finally:
            self._busy = False
        if caught:
            raise caught[0]
        return _outcome(self, st, err, pending)

    def logits(self):
        """The logits of the last position computed (a float32 copy, length vocab): after
        generate, those the last generated token was drawn from."""
        p = c_float_p()
        n = ctypes.c_int()
        self._not_busy()
        _check(lib.ks_session_logits(self._handle(), ctypes.byref(p), ctypes.byref(n)))
        return np.ctypeslib.as_array(p, shape=(n.value,)).copy()

    def top_logprobs(self, k):
        """(ids, logprobs): the k most likely next tokens after the last position computed, as
        int32 and float32 arrays, most likely first."""
        self._not_busy()
        ids = np.zeros(int(k) if int(k) > 0 else 1, np.int32)
        lp = np.zeros(len(ids), np.float32)
        _check(lib.ks_session_top_logprobs(self._handle(), int(k), ids.ctypes.data_as(c_int32_p),
                                           lp.ctypes.data_as(c_float_p)))
        return ids, lp

    def __repr__(self):
        return "<kvsieve.Session policy=%s%s>" % (self._policy.name if self._policy and self._policy._h else None,
                                                   " (closed)" if self._h is None else "")


def _outcome(session, st, err, pending):
    """The Result of a finished request, or its failure raised: a Python policy's exception as
    itself; with fallback on, it becomes the result's policy_error."""
    pexc = pending["exc"] if pending is not None else None
    if pending is not None:
        pending["exc"] = None
    if st and pexc is not None:
        raise pexc
    if st > 0:
        raise_status(st, err)
    if st:
        raise Error(err)
    r = Result(session)
    if pexc is not None:
        r.policy_error = "policy %s: %s: %s" % (r.policy, type(pexc).__name__, pexc)
    return r


# ------------------------------------------------------------------ Result -----------------------

class Result:
    """The outcome of one request, read from the session when it finished.

    ids, text, prompt_tokens, prefill_seconds, decode_seconds, policy_error (None if the policy
    did not fail), restart (prompt indices kept by a restart, or None), reports (the policy's,
    {} without one) are copied at once. kept(), kept_all(), logits() and top_logprobs() read the
    session and are valid until it runs again (then they raise Error)."""

    def __init__(self, session):
        h = session._handle()
        self._session = session
        self._generation = session._generation
        n = ctypes.c_int()
        p = lib.ks_result_ids(h, ctypes.byref(n))
        self.ids = np.ctypeslib.as_array(p, shape=(n.value,)).copy() if n.value and p else np.zeros(0, np.int32)
        self.text = _pystr(lib.ks_result_text(h))
        self.prompt_tokens = lib.ks_result_prompt_tokens(h)
        self.prefill_seconds = lib.ks_result_prefill_seconds(h)
        self.decode_seconds = lib.ks_result_decode_seconds(h)
        pe = _pystr(lib.ks_result_policy_error(h))
        self.policy_error = pe or None
        rp = c_int32_p()
        k = lib.ks_result_restart(h, ctypes.byref(rp))
        self.restart = np.ctypeslib.as_array(rp, shape=(k,)).copy() if k > 0 else None
        pol = session.policy
        self.policy = pol.name if pol is not None else None
        self.reports = pol.reports if pol is not None else {}

    def _live(self):
        s = self._session
        if s._h is None:
            raise Error("the session of this result is closed")
        if s._generation != self._generation or s._busy:
            raise Error("this result is stale: its session has run another request since")
        return s._h

    def kept(self, layer, kv_head=0):
        """The token positions of the KV rows resident at a layer and KV head (int32 numpy
        array, a copy) - what the policy kept. ks_result_kept."""
        h = self._live()
        p = c_int32_p()
        n = lib.ks_result_kept(h, int(layer), int(kv_head), ctypes.byref(p))
        if n < 0:
            raise IndexError("layer %d, KV head %d is out of range" % (layer, kv_head))
        return np.ctypeslib.as_array(p, shape=(n,)).copy() if n else np.zeros(0, np.int32)

    def kept_all(self):
        """kept() of every layer and KV head: a list (layers) of lists (KV heads) of arrays."""
        m = self._session.model
        return [[self.kept(l, h) for h in range(m.n_kv_heads)] for l in range(m.n_layers)]

    def logits(self):
        """Session.logits() of this request (the logits the last token was drawn from)."""
        self._live()
        return self._session.logits()

    def top_logprobs(self, k):
        """Session.top_logprobs(k) of this request."""
        self._live()
        return self._session.top_logprobs(k)

    def __repr__(self):
        return "<kvsieve.Result %d prompt tokens, %d generated, policy=%s: %r>" % (
            self.prompt_tokens, len(self.ids), self.policy, self.text[:40])


# ------------------------------------------------------------------ Stream -----------------------

_DONE = object()


def _stream_worker(run, q, stop):
    """The worker thread: one ks_generate* call whose callback feeds the queue. It holds no
    reference to the Stream, so a dropped stream is collected (and stopped)."""
    def cb(ud, tid, piece):
        if stop.is_set():
            return 1
        q.put(Token(tid, _pystr(piece)))
        return 1 if stop.is_set() else 0
    cfn = STREAM_FN(cb)
    try:
        st = run(cfn)
        err = _last_error() if st else ""  # ks_last_error is per thread: read it here
    except BaseException as e:  # not expected from ctypes; never lose the end marker
        st, err = -1, "%s: %s" % (type(e).__name__, e)
    q.put((_DONE, st, err))


class Stream:
    """An iterator of Token(id, text), one per generated token, from session.generate(...,
    stream=True). The request runs on a worker thread; the library calls back into it per token.

    After the last token, .result is the Result (None if the request failed: the failure is
    raised from the iteration). close() (also at the end of a `with` block, on `break` when the
    stream is garbage-collected, or on Ctrl-C while waiting for a token) stops the request at
    the next token and waits for the worker; the session is then free for the next request.
    Only a prefill already under way runs to its end first."""

    def __init__(self, session, run, keep):
        self._session = session
        self._keep = keep
        self._q = queue.SimpleQueue()
        self._stop = threading.Event()
        self.result = None
        self._finished = False
        session._stream = weakref.ref(self)  # the session was claimed by generate()
        self._pending = session._policy._pending if session._policy is not None else None
        if self._pending is not None:
            self._pending["exc"] = None
        self._thread = threading.Thread(target=_stream_worker, args=(run, self._q, self._stop), daemon=True,
                                        name="kvsieve-stream")
        self._thread.start()

    def __iter__(self):
        return self

    def __next__(self):
        if self._finished:
            raise StopIteration
        try:
            item = self._q.get()
        except BaseException:  # Ctrl-C while waiting
            self.close()
            raise
        if isinstance(item, Token):
            return item
        self._finish(item)
        raise StopIteration

    def _finish(self, item):
        _, st, err = item
        self._thread.join()
        self._finished = True
        self._session._busy = False
        self._keep = None
        self.result = _outcome(self._session, st, err, self._pending)

    def close(self):
        """Stop the request at the next token and wait for it to end (idempotent). The tokens
        not yet read are dropped; .result holds what was generated up to the stop."""
        if self._finished:
            return
        self._stop.set()
        while True:
            item = self._q.get()
            if not isinstance(item, Token):
                break
        try:
            self._finish(item)
        except Exception:  # the request failed after all (a policy, say): close() only stops it
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self):
        return "<kvsieve.Stream %s>" % ("finished" if self._finished else "running")
