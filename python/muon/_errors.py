"""Errors: muon.MuonError, the check of a library call's status, and the
turning of an exception raised in a Python callback into a status the
library returns (with its type and text attached).

The bottom of the package: it imports only _lib, and any module may import
it (_comm and _optimizer do; _optimizer imports _comm, never the reverse).
"""

from __future__ import annotations

from . import _lib

_lib_handle = _lib.lib


class MuonError(RuntimeError):
    """A libmuon call failed.

    `status` is the status name ("INVALID_ARGUMENT", "FAILED_PRECONDITION", ...),
    `code` its number (absl::StatusCode numbering), `message` the library's
    detail (muon_last_error_message), which names the parameter and the cause.
    """

    status: str
    code: int
    message: str

    def __init__(self, status: int | str, message: str = "") -> None:
        if isinstance(status, str):
            code = _lib.STATUS_CODES.get(status, 2)
            name = status
        else:
            code = int(status)
            name = _lib.STATUS_NAMES.get(code, "UNRECOGNIZED_STATUS(%d)" % code)
        super().__init__(name, message)
        self.status = name
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return "%s: %s" % (self.status, self.message) if self.message else self.status


def error(status):
    message = _lib_handle.muon_last_error_message()
    return MuonError(status, message.decode("utf-8", "replace") if message else "")


def check(status):
    if status != 0:
        raise error(status)


def status_of(exc):
    """The muon_status_t a Python exception raised in a callback becomes."""
    if isinstance(exc, MuonError):
        return exc.code if exc.code != 0 else _lib.STATUS_CODES["UNKNOWN"]
    if isinstance(exc, KeyboardInterrupt):
        return _lib.STATUS_CODES["CANCELLED"]
    if isinstance(exc, MemoryError):
        return _lib.STATUS_CODES["RESOURCE_EXHAUSTED"]
    if isinstance(exc, NotImplementedError):
        return _lib.STATUS_CODES["UNIMPLEMENTED"]
    return _lib.STATUS_CODES["UNKNOWN"]


def describe(exc):
    """'TypeName: text', the form a callback's exception takes in messages."""
    text = str(exc)
    return "%s: %s" % (type(exc).__name__, text) if text else type(exc).__name__


def callback_failed(exc, where, sink):
    """Records `exc` in `sink` (a list, for step() to chain it), attaches its type
    and text to the status being returned (muon_set_callback_error), and returns
    that status. Never raises: an exception must not cross back into C."""
    try:
        sink.append((where, exc))
        message = "%s (in %s)" % (describe(exc), where)
        _lib_handle.muon_set_callback_error(message.encode("utf-8", "replace"))
        return status_of(exc)
    except BaseException:  # noqa: B902 - nothing may escape into the library
        return _lib.STATUS_CODES["UNKNOWN"]
