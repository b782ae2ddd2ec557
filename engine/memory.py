"""Hand memory that loading freed, or no longer reads, back to the operating system.

Loading dequantizes and packs tensor by tensor. glibc's malloc keeps freed temporaries in its heaps for
reuse, and torch's worker threads allocate from several heaps, so a loaded process keeps a large share of
its resident memory unused, and the peak during loading varies from run to run. `malloc_trim` returns free
heap pages; loading calls it after reading the checkpoint, after packing each weight and at the end.
Elsewhere (macOS, Windows, musl) this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import sys
from functools import cache


@cache
def _malloc_trim():
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None


def release_freed_memory() -> bool:
    """Return freed heap memory to the OS where the C library can; whether it could."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


MADV_DONTNEED = 4  # Linux's number


@cache
def _madvise():
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int), ctypes.c_int
    return fn


def release_mapped_pages(address: int, num_bytes: int) -> bool:
    """Drop the pages of a read-only file mapping at [address, address + num_bytes) from this process's
    resident memory, once what they held has been copied (a weight repacked at load): the file keeps them in
    the page cache, so a later read faults them back in unchanged. Only whole pages inside the range go, so a
    neighbour's bytes are never touched. Whether it could."""
    madvise = _madvise()
    if madvise is None:
        return False
    page = mmap.PAGESIZE
    start, end = -(-address // page) * page, (address + num_bytes) // page * page
    return end <= start or madvise(start, end - start, MADV_DONTNEED) == 0
