"""glibc malloc tuning for a process that handles large tensors.

By default glibc serves big allocations with fresh mmaps and gives freed heap tops back to the
kernel, so every multi-megabyte buffer that protobuf, gRPC or numpy makes for a request is
page-faulted in anew, page by page: for a 4 MiB tensor that costs more than copying it. Keeping
big blocks on the heap, and keeping up to RETAIN bytes of freed heap mapped, lets the next
request reuse memory that is already faulted in.
"""

import ctypes
import ctypes.util
import logging

# What a process may keep mapped after a burst of large requests, beyond what it uses: the
# front, and each worker (there are many of those; their tensors mostly live in arenas).
RETAIN = 1024 * 1024 * 1024
WORKER_RETAIN = 256 * 1024 * 1024

_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4

log = logging.getLogger("shmserve")


def keep_large_blocks(retain: int = RETAIN) -> None:
    """Apply the tuning to this process; a no-op (logged) where malloc is not glibc's."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        log.info("malloc tuning skipped: this C library has no mallopt")
        return
    if not (mallopt(_M_MMAP_MAX, 0) and mallopt(_M_TRIM_THRESHOLD, retain)):
        log.info("malloc tuning skipped: mallopt refused it")
