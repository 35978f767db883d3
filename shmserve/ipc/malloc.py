"""glibc malloc tuning for a process that handles large tensors.

By default glibc serves big allocations with fresh mmaps and gives freed heap tops back to the
kernel, so every multi-megabyte buffer that protobuf, gRPC or numpy makes for a request is
page-faulted in anew, page by page: for a 4 MiB tensor that costs more than copying it. Keeping
big blocks on the heap, and keeping up to RETAIN bytes of freed heap mapped, lets the next
request reuse memory that is already faulted in.

The front also gives its freed heap back every TRIM_INTERVAL_S (`trim_periodically`): a
stream of large requests keeps reusing what it faulted in (it is let go once a second, and
faulted in again once), while what a burst, or a hostile client, made it allocate does not
stay mapped for good. Both that and unmapping large mappings (`release_mapping`) run on a
daemon thread: giving back hundreds of MiB takes a good part of a second, which the event loop
must not wait for (the kernel's per-mapping locks let the loop go on faulting its own pages
meanwhile).
"""

import ctypes
import ctypes.util
import logging
import threading
import time

# What a process may keep mapped after a burst of large requests, beyond what it uses: the
# front, and each worker (there are many of those; their tensors mostly live in arenas).
RETAIN = 1024 * 1024 * 1024
WORKER_RETAIN = 256 * 1024 * 1024

_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4

log = logging.getLogger("shmserve")


TRIM_INTERVAL_S = 1.0
_TICK_S = 0.1  # how often the releasing thread looks for mappings that nothing uses any more


def _libc_function(name: str):
    try:
        return getattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), name)
    except (OSError, AttributeError):
        return None


def keep_large_blocks(retain: int = RETAIN) -> None:
    """Apply the tuning to this process; a no-op (logged) where malloc is not glibc's."""
    mallopt = _libc_function("mallopt")
    if mallopt is None:
        log.info("malloc tuning skipped: this C library has no mallopt")
        return
    if not (mallopt(_M_MMAP_MAX, 0) and mallopt(_M_TRIM_THRESHOLD, retain)):
        log.info("malloc tuning skipped: mallopt refused it")


class _Releaser:
    """The daemon thread that gives memory back: it unmaps the mappings handed to it once no
    memoryview of them is left, and trims the heap every `trim_every` ticks (0: never)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.mappings: list = []
        self.malloc_trim = None
        self.trim_every = 0
        threading.Thread(target=self._run, name="shmserve-release", daemon=True).start()

    def _run(self) -> None:
        ticks = 0
        while True:
            time.sleep(_TICK_S)
            ticks += 1
            with self.lock:
                mappings, self.mappings = self.mappings, []
            kept = []
            for mapping in mappings:
                try:
                    mapping.close()  # munmap, without the GIL
                except BufferError:  # a view of it is still in use: next tick
                    kept.append(mapping)
            if kept:
                with self.lock:
                    self.mappings += kept
            if self.trim_every and not ticks % self.trim_every:
                self.malloc_trim(0)


_releaser: _Releaser | None = None
_releaser_lock = threading.Lock()


def _the_releaser() -> _Releaser:
    global _releaser
    with _releaser_lock:
        if _releaser is None:
            _releaser = _Releaser()
        return _releaser


def release_mapping(mapping) -> None:
    """Unmaps `mapping` (an mmap.mmap) on the releasing thread, once nothing uses it: the
    caller drops its own views of it and need not know when the others go."""
    releaser = _the_releaser()
    with releaser.lock:
        releaser.mappings.append(mapping)


def trim_periodically(interval_s: float = TRIM_INTERVAL_S) -> bool:
    """Gives the freed heap back to the kernel every `interval_s` seconds, on the releasing
    thread (malloc_trim walks the heap without the GIL). False where there is no
    malloc_trim."""
    malloc_trim = _libc_function("malloc_trim")
    if malloc_trim is None:
        return False
    releaser = _the_releaser()
    releaser.malloc_trim = malloc_trim
    releaser.trim_every = max(1, round(interval_s / _TICK_S))
    return True
