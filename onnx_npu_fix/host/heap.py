"""The process's heap: memory freed in C and C++ handed back to the system.

glibc keeps what large freed allocations leave in its heap once its mmap threshold has risen past them, and the
many small blocks of a parsed or checked graph (the onnx checker's C++ copy of a model, shape inference's) with
them: what came next (a session's weights, a candidate's bytes, the next pass's index) came on top. A trim after
each session, after the checker and after strict shape inference hands that memory back before the next
allocation comes, which lowers a validated run's peak.
"""

from __future__ import annotations

import ctypes
import functools
import sys
from typing import Any


def release_freed_memory() -> None:
    """Hand what was freed back to the system (glibc's ``malloc_trim``; nothing on another C library)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.lru_cache(maxsize=1)
def _malloc_trim() -> Any:
    """glibc's ``malloc_trim``, or None (another C library, another system)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None
