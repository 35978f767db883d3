"""The shared memory of one model instance's worker process: the segments the front creates
for it at each start and destroys when it ends, all together.

- the input arena, whose slots the front allocates for batches' input blocks;
- the output arena, whose slots the worker allocates for outputs and the front releases; as a
  Region, other instances read outputs there in place (an ensemble's next step);
- the BLS arena, where the model's large BLS inputs go; as a Region, the target instances map
  it (see model_calls.py);
- the request table (ipc/request_table.py) and its wake-up eventfd;
- the sequence state arena, for a model with implicit state.

Regions made of these segments are retired, not unmapped at once, when the instance's memory
is destroyed: instances that read them in place unmap them once no request uses them.
"""

import errno
import os
from typing import Optional

from shmserve.dispatch.arena import InputArena, new_segment
from shmserve.dispatch.memory_regions import Region, segment_region
from shmserve.ipc.request_table import SIZE as REQUEST_TABLE_BYTES
from shmserve.ipc.request_table import RequestTable
from shmserve.ipc.segments import Segment

ARENA_BYTES = 256 * 1024 * 1024  # sparse: pages cost memory only once touched


class InstanceMemory:
    """The segments of an instance's current process; none between its processes."""

    def __init__(self):
        self.input_arena: Optional[InputArena] = None
        self._output_arena: Optional[Segment] = None
        self.output_buf: Optional[memoryview] = None
        self.output_region: Optional[Region] = None
        self._bls_arena: Optional[Segment] = None
        self.bls_region: Optional[Region] = None
        self._state_arena: Optional[Segment] = None
        self.table: Optional[RequestTable] = None

    def create(self, tag: str, with_state: bool) -> None:
        """Create the segments, named for `tag` (the instance's name), the state arena only
        `with_state`. OSError (ENOSPC when /dev/shm is full, EMFILE, ...) once those made
        before the one that failed are destroyed."""
        try:
            self._create(tag, with_state)
        except BaseException:
            self.destroy()
            raise

    def _create(self, tag: str, with_state: bool) -> None:
        self.input_arena = InputArena(f"{tag}.in", ARENA_BYTES)
        self._output_arena = new_segment(f"{tag}.out", ARENA_BYTES)
        self.output_buf = self._output_arena.buffer
        self.output_region = segment_region(f"{tag} output arena", self._output_arena.name,
                                            ARENA_BYTES)
        self._bls_arena = new_segment(f"{tag}.bls", ARENA_BYTES)
        self.bls_region = segment_region(f"{tag} BLS arena", self._bls_arena.name, ARENA_BYTES)
        wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        try:
            self.table = RequestTable(new_segment(f"{tag}.req", REQUEST_TABLE_BYTES), wake_fd)
        except BaseException:
            os.close(wake_fd)
            raise
        # Both sides write to it with no way to fail a request instead: reserved whole.
        if not self.table.segment.reserve(REQUEST_TABLE_BYTES):
            raise OSError(errno.ENOSPC, "no room in /dev/shm for the request table")
        if with_state:
            self._state_arena = new_segment(f"{tag}.state", ARENA_BYTES)

    def init_fields(self) -> dict:
        """The segments' fields of the Init frame that hands them to the worker."""
        input_arena, output_arena, table = self.input_arena, self._output_arena, self.table
        bls_arena = self._bls_arena
        assert input_arena is not None and output_arena is not None  # create() made them
        assert table is not None and bls_arena is not None
        return dict(input_arena=input_arena.name, output_arena=output_arena.name,
                    request_table=table.segment.name,
                    state_arena=self._state_arena.name if self._state_arena is not None else "",
                    wake_fd=table.wake_fd, bls_arena=bls_arena.name)

    def free_block(self, slot: Optional[int]) -> None:
        """A batch's input block is done with: its input-arena slot, if it had one, is free
        (unless the arena is gone already)."""
        if slot is not None and self.input_arena is not None:
            self.input_arena.free(slot)

    def destroy(self) -> None:
        """Unlink every segment there is (nothing is left to destroy after)."""
        if self.input_arena is not None:
            self.input_arena.destroy()
            self.input_arena = None
        if self.output_region is not None:
            self.output_region.retire_when_unused()
            self.output_region = None
        self.output_buf = None
        _unlink(self._output_arena)
        self._output_arena = None
        if self.bls_region is not None:
            self.bls_region.retire_when_unused()
            self.bls_region = None
        _unlink(self._bls_arena)
        self._bls_arena = None
        _unlink(self._state_arena)
        self._state_arena = None
        if self.table is not None:
            segment = self.table.segment
            os.close(self.table.wake_fd)
            self.table.close()
            segment.unlink()
            self.table = None


def _unlink(segment: Optional[Segment]) -> None:
    if segment is not None:
        segment.close()
        segment.unlink()
