"""Shared-memory arenas the front owns: it creates them, and it unlinks them.

Each worker gets two: an input arena whose slots the front allocates, and an output arena
whose slots the worker allocates (it alone knows output sizes) and the front releases.
"""

import itertools
import os

from shmserve.ipc import segments
from shmserve.ipc.allocator import ArenaAllocator

_serial = itertools.count()


def new_segment(tag: str, size: int) -> segments.Segment:
    name = segments.segment_name(os.getpid(), f"{tag}.{next(_serial)}")
    return segments.Segment.create(name, size)


class InputArena:
    """A segment plus the allocator of its slots."""

    def __init__(self, tag: str, size: int):
        self.segment = new_segment(tag, size)
        self._alloc = ArenaAllocator(size)
        self._buf = self.segment.buffer

    @property
    def name(self) -> str:
        return self.segment.name

    def put(self, pieces: list, nbytes: int) -> int | None:
        """Copy the bytes-like `pieces` back to back into a fresh slot of `nbytes`; its offset,
        or None when the arena, or /dev/shm, is full. Written piece by piece: joining them
        first would copy every byte twice."""
        offset = self._alloc.alloc(nbytes)
        if offset is None:
            return None
        if not self.segment.reserve(offset + nbytes):  # /dev/shm is full
            self._alloc.free(offset)
            return None
        buf = self._buf
        pos = offset
        for piece in pieces:
            end = pos + (piece.nbytes if isinstance(piece, memoryview) else len(piece))
            buf[pos:end] = piece
            pos = end
        return offset

    def free(self, offset: int) -> None:
        self._alloc.free(offset)

    def destroy(self) -> None:
        # Drops the view so that the segment can unmap; a destroyed arena takes no more puts,
        # so put keeps the view's type (no None check on the hot path).
        self._buf = None  # type: ignore[assignment]
        self.segment.close()
        self.segment.unlink()
