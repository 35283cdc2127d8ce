"""The C library, opened once for the process (like an import), for the system calls
Python's ``os`` does not offer (mount, statx, openat2, fanotify, quotactl_fd).

One handle, so each function's prototype (``argtypes``/``restype``) is set once and holds
wherever it is called from: here for ``syscall``, which several modules call, else by the
module that calls the function.
"""

from __future__ import annotations

import ctypes
import functools


@functools.cache
def libc() -> ctypes.CDLL:
    """The process's C library, with ``errno`` saved after each call (``ctypes.get_errno``)."""
    lib = ctypes.CDLL(None, use_errno=True)
    lib.syscall.restype = ctypes.c_long  # syscall(2) returns a long
    return lib
