"""Exceptions: every failing library call raises one, carrying the library's message
(ks_last_error) and its status (ks_status)."""

__all__ = ["Error", "FileError", "FormatError", "ShapeError", "DtypeError", "UnsupportedError",
           "OutOfMemory", "ArgumentError", "ContextError", "PolicyError", "Interrupted",
           "DeviceError", "InternalError", "raise_status"]


class Error(Exception):
    """A kvsieve library failure. `status` is the ks_status number, `status_name` its short name
    ("io", "policy", ...), str(e) the library's one-line message."""

    status = -1
    status_name = "error"

    def __init__(self, message, status=None, status_name=None):
        super().__init__(message)
        if status is not None:
            self.status = status
        if status_name is not None:
            self.status_name = status_name


class FileError(Error):
    """KS_ERR_IO: a file is missing or unreadable (a model folder, a policy file)."""
    status, status_name = 1, "io"


class FormatError(Error):
    """KS_ERR_FORMAT: a file is malformed (JSON, safetensors, tokenizer)."""
    status, status_name = 2, "format"


class ShapeError(Error):
    """KS_ERR_SHAPE: a tensor's shape disagrees with the config."""
    status, status_name = 3, "shape"


class DtypeError(Error):
    """KS_ERR_DTYPE: an unsupported or mismatched dtype."""
    status, status_name = 4, "dtype"


class UnsupportedError(Error):
    """KS_ERR_UNSUPPORTED: an architecture or feature kvsieve does not implement."""
    status, status_name = 5, "unsupported"


class OutOfMemory(Error):
    """KS_ERR_OOM: host or device memory exhausted."""
    status, status_name = 6, "oom"


class ArgumentError(Error, ValueError):
    """KS_ERR_ARG: an invalid argument (an unknown policy parameter, a bad value, ...)."""
    status, status_name = 7, "arg"


class ContextError(Error):
    """KS_ERR_CONTEXT: the prompt plus the generation exceeds the model's context."""
    status, status_name = 8, "context"


class PolicyError(Error):
    """KS_ERR_POLICY: a policy failed (a script error, an invalid action, a bad parameter value
    found by the policy's own checks)."""
    status, status_name = 9, "policy"


class Interrupted(Error):
    """KS_ERR_INTERRUPTED: the request was interrupted."""
    status, status_name = 10, "interrupted"


class DeviceError(Error):
    """KS_ERR_DEVICE: a GPU / backend runtime error."""
    status, status_name = 11, "device"


class InternalError(Error):
    """KS_ERR_INTERNAL: an invariant of the library was violated (a bug)."""
    status, status_name = 12, "internal"


_BY_STATUS = {c.status: c for c in (FileError, FormatError, ShapeError, DtypeError, UnsupportedError,
                                    OutOfMemory, ArgumentError, ContextError, PolicyError, Interrupted,
                                    DeviceError, InternalError)}


def raise_status(status, message):
    """Raise the exception class of a non-zero ks_status with the library's message."""
    cls = _BY_STATUS.get(status, Error)
    if cls is Error:
        raise Error(message or "kvsieve status %d" % status, status, "status %d" % status)
    raise cls(message or cls.status_name)
