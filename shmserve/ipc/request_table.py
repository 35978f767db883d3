"""One row per request a worker holds, in shared memory: what the front tells the model about
it without a control frame.

A worker's main thread is inside `execute` when it matters most (a model streaming from a loop
there), so it cannot be reading frames; a row it can read at any time can. Each row holds:
- `cancelled`: set by the front when the client went away; `is_cancelled()` reads it.
- `consumed`: how many of the request's responses the front has handed to the client; a
  streaming sender waits while too many are still unconsumed, so a slow reader bounds what
  is buffered for it (backpressure).

The front owns the rows: it hands one to each request it sends to the worker, resets it then,
and takes it back after the request's final response. Each field has a single writer.
"""

import numpy as np

from shmserve.ipc.shm import Segment

ROWS = 65536
_FIELDS = 2  # cancelled, consumed (uint32 each)
CANCELLED, CONSUMED = 0, 1
SIZE = ROWS * _FIELDS * 4


class RequestTable:
    def __init__(self, segment: Segment):
        self.segment = segment
        self._rows = np.frombuffer(segment.buffer, dtype=np.uint32, count=ROWS * _FIELDS)
        self._rows = self._rows.reshape(ROWS, _FIELDS)

    # -- the front's side --------------------------------------------------------------------

    def reset(self, row: int) -> None:
        self._rows[row] = 0

    def cancel(self, row: int) -> None:
        self._rows[row, CANCELLED] = 1

    def add_consumed(self, row: int) -> None:
        self._rows[row, CONSUMED] += 1

    # -- the worker's side -------------------------------------------------------------------

    def cancelled(self, row: int) -> bool:
        return bool(self._rows[row, CANCELLED])

    def consumed(self, row: int) -> int:
        return int(self._rows[row, CONSUMED])

    def close(self) -> None:
        self._rows = None
        self.segment.close()


class RowAllocator:
    """The front's free rows of one table; the latest row given back is taken first, which
    keeps the pages of the table in use few."""

    def __init__(self, rows: int = ROWS):
        self._free = list(range(rows - 1, -1, -1))

    def take(self) -> int | None:
        return self._free.pop() if self._free else None

    def give_back(self, row: int) -> None:
        self._free.append(row)
