"""Policies written in Python: ks_policy_create_c with Python handlers.

A handler gets an Event: the layer, the rows, the tensors of the event as numpy arrays (q, k, v,
hidden), the KV rows a layer holds; and asks for actions (retain, propagate, restart, attend,
stop, discard_kv) as the C API's ks_action_* do. So a policy can compute its scores in numpy:

    class KeepTopK:
        def prefill_qkv(self, ev):
            q, k = ev.tensor("q"), ev.tensor("k")          # (rows, heads, hd), (rows, kv_heads, hd)
            ...
            ev.retain(np.sort(top))
    policy = kvsieve.Policy.from_python(model, KeepTopK(), name="keep_top_k")

The handlers run on the thread that runs the request (a stream's worker thread too), one event
at a time. An exception in a handler stops the request and comes out of generate() (or, with
session.fallback, becomes result.policy_error and the request goes on with full attention).
"""
import ctypes

import numpy as np

from ._errors import Error, raise_status
from ._lib import BEGIN_FN, POLICY_FN, PolicyHandlers, c_float_p, c_int32_p, lib

__all__ = ["Event", "create_python_policy", "EVENTS"]

EVENTS = ("prefill_qkv", "prefill_layer_end", "prefill_end", "decode_qkv", "token")
_TENSORS = {"q": 0, "k": 1, "v": 2, "hidden": 3}
_KS_ERR_POLICY, _KS_ERR_INTERRUPTED = 9, 10


def _idx(idx, what):
    a = np.asarray(idx)
    if a.ndim != 1 or (a.size and a.dtype.kind not in "iu"):
        raise TypeError("%s: a one-dimensional list of integer indices" % what)
    if a.size and (a.min() < -2 ** 31 or a.max() >= 2 ** 31):
        raise ValueError("%s: an index does not fit int32" % what)
    return np.ascontiguousarray(a, dtype=np.int32)


def _act(st, last_error):
    if st:
        raise_status(st, last_error())


class Event:
    """One engine event, seen by a Python policy's handler. Valid only during that call.

    kind           "prefill_qkv", "prefill_layer_end", "prefill_end", "decode_qkv" or "token"
    layer          the layer (-1 for prefill_end and token)
    pass_index     0, or 1 after a restart
    rows           the event's active rows (decode: 1)
    prompt_tokens  tokens in the prompt as given
    positions, ids (rows,) int32 arrays of the active rows, or None
    token          the sampled id (token events), else -1"""

    def __init__(self, p, kind, model):
        self._p, self.kind, self._model = p, kind, model

    def _ev(self):
        if self._p is None:
            raise Error("this event is over: an Event is valid only during its handler's call")
        return self._p

    @property
    def layer(self):
        return lib.ks_event_layer(self._ev())

    @property
    def pass_index(self):
        return lib.ks_event_pass(self._ev())

    @property
    def rows(self):
        return lib.ks_event_rows(self._ev())

    @property
    def prompt_tokens(self):
        return lib.ks_event_prompt_tokens(self._ev())

    @property
    def token(self):
        return lib.ks_event_token(self._ev())

    def _rows_array(self, fn):
        p = fn(self._ev())
        n = self.rows
        return np.ctypeslib.as_array(p, shape=(n,)).copy() if p and n > 0 else None

    @property
    def positions(self):
        return self._rows_array(lib.ks_event_positions)

    @property
    def ids(self):
        return self._rows_array(lib.ks_event_ids)

    def kv_rows(self, kv_head=0):
        """The positions of the KV rows the event's layer holds for one KV head (decode_qkv: the
        new row included): ks_event_kv_rows. Their indices are what retain() takes."""
        p = c_int32_p()
        n = lib.ks_event_kv_rows(self._ev(), int(kv_head), ctypes.byref(p))
        if n < 0:
            raise IndexError("this event has no layer, or KV head %d is out of range" % kv_head)
        return np.ctypeslib.as_array(p, shape=(n,)).copy() if n and p else np.zeros(n, np.int32)

    def tensor(self, name):
        """A copy of one of the event's tensors as float32: "q" (rows, n_heads, head_dim), "k" and
        "v" (rows, n_kv_heads, head_dim), "hidden" (rows, dim; prefill_layer_end). KeyError for
        a tensor this event does not have."""
        ev = self._ev()
        t = _TENSORS.get(name)
        if t is None:
            raise ValueError("tensor: one of q, k, v, hidden, not %r" % (name,))
        n = lib.ks_event_tensor_size(ev, t)
        if n == 0:
            raise KeyError("a %s event has no %s tensor" % (self.kind, name))
        a = np.empty(n, np.float32)
        _act(lib.ks_event_copy(ev, t, a.ctypes.data_as(c_float_p), n), self._last_error)
        rows = self.rows
        if name == "hidden":
            return a.reshape(rows, -1)
        kvh = self._model.n_kv_heads
        if name == "q":
            hd = lib.ks_event_tensor_size(ev, 1) // max(1, rows * kvh)
            return a.reshape(rows, -1, hd) if hd else a.reshape(rows, -1)
        return a.reshape(rows, kvh, -1)

    @staticmethod
    def _last_error():
        return (lib.ks_last_error() or b"").decode("utf-8", "replace")

    def retain(self, idx):
        """The layer keeps only these KV rows (indices into kv_rows()): ks_action_retain."""
        a = _idx(idx, "retain")
        _act(lib.ks_action_retain(self._ev(), a.ctypes.data_as(c_int32_p), len(a)), self._last_error)

    def retain_heads(self, per_head):
        """retain with one index list per KV head: ks_action_retain_heads."""
        arrs = [_idx(x, "retain_heads") for x in per_head]
        ptrs = (c_int32_p * len(arrs))(*[a.ctypes.data_as(c_int32_p) for a in arrs])
        ks = (ctypes.c_int * len(arrs))(*[len(a) for a in arrs])
        _act(lib.ks_action_retain_heads(self._ev(), ptrs, ks), self._last_error)

    def propagate(self, idx):
        """After this layer only these active rows go on (prefill): ks_action_propagate."""
        a = _idx(idx, "propagate")
        _act(lib.ks_action_propagate(self._ev(), a.ctypes.data_as(c_int32_p), len(a)), self._last_error)

    def restart(self, idx):
        """Prefill again on these prompt rows (prefill_qkv of pass 0): ks_action_restart."""
        a = _idx(idx, "restart")
        _act(lib.ks_action_restart(self._ev(), a.ctypes.data_as(c_int32_p), len(a)), self._last_error)

    def attend(self, idx, renumber=False):
        """This step attends only these rows of the layer: ks_action_attend."""
        a = _idx(idx, "attend")
        _act(lib.ks_action_attend(self._ev(), a.ctypes.data_as(c_int32_p), len(a), 1 if renumber else 0),
             self._last_error)

    def attend_heads(self, per_head, renumber=False):
        """attend with one index list per KV head: ks_action_attend_heads."""
        arrs = [_idx(x, "attend_heads") for x in per_head]
        ptrs = (c_int32_p * len(arrs))(*[a.ctypes.data_as(c_int32_p) for a in arrs])
        ks = (ctypes.c_int * len(arrs))(*[len(a) for a in arrs])
        _act(lib.ks_action_attend_heads(self._ev(), ptrs, ks, 1 if renumber else 0), self._last_error)

    def stop(self):
        """End the forward pass here (prefill events): ks_action_stop."""
        _act(lib.ks_action_stop(self._ev()), self._last_error)

    def discard_kv(self):
        """This pass's KV rows are freed after each layer's attention (prefill_qkv, layer 0,
        pass 0; a restart must follow): ks_action_discard_kv."""
        _act(lib.ks_action_discard_kv(self._ev()), self._last_error)

    def __repr__(self):
        if self._p is None:
            return "<kvsieve.Event %s (over)>" % self.kind
        return "<kvsieve.Event %s layer=%d rows=%d>" % (self.kind, self.layer, self.rows)


def create_python_policy(model, handlers, name, pre_rope_keys, prefill_chunk):
    """(handle, keep, pending): the C policy, what must stay alive with it, and the holder of the
    first exception a handler raised during the current request."""
    def get(n):
        return handlers.get(n) if isinstance(handlers, dict) else getattr(handlers, n, None)
    pending = {"exc": None}

    def wrap(kind, fn):
        def tramp(user, evp):
            ev = Event(evp, kind, model)
            try:
                fn(ev)
                return 0
            except BaseException as e:  # never unwind into C: keep it for generate() to raise
                if pending["exc"] is None:
                    pending["exc"] = e
                return _KS_ERR_INTERRUPTED if isinstance(e, KeyboardInterrupt) else _KS_ERR_POLICY
            finally:
                ev._p = None
        return POLICY_FN(tramp)

    h = PolicyHandlers()
    keep = [h]
    found = False
    for kind in EVENTS:
        fn = get(kind)
        if fn is not None:
            if not callable(fn):
                raise TypeError("handler %s is not callable" % kind)
            cf = wrap(kind, fn)
            keep.append(cf)
            setattr(h, kind, cf)
            found = True
    b = get("begin")
    if b is not None:
        def begin(user, sess):
            pending["exc"] = None
            try:
                b()
                return 0
            except BaseException as e:
                pending["exc"] = e
                return _KS_ERR_INTERRUPTED if isinstance(e, KeyboardInterrupt) else _KS_ERR_POLICY
        cb = BEGIN_FN(begin)
        keep.append(cb)
        h.begin = cb
        found = True
    if not found:
        raise TypeError("a Python policy needs at least one handler: begin or one of " + ", ".join(EVENTS))
    nm = (name or getattr(handlers, "name", None) or type(handlers).__name__ or "python_policy")
    if not isinstance(nm, str):
        nm = "python_policy"
    h.name = nm.encode("utf-8")
    keep.append(h.name)
    h.pre_rope_keys = 1 if pre_rope_keys else 0
    h.prefill_chunk = int(prefill_chunk)
    out = ctypes.c_void_p()
    st = lib.ks_policy_create_c(ctypes.byref(h), ctypes.byref(out))
    if st:
        raise_status(st, Event._last_error())
    return out.value, keep, pending
