"""One row per request a worker holds, in shared memory: what the front tells the model about
it without a control frame.

A worker's main thread is inside `execute` when it matters most (a model streaming from a loop
there), so it cannot be reading frames; a row it can read at any time can. Each row holds:
- `cancelled`: set by the front when the client went away (ABANDONED: what the model still
  sends is dropped) or when the caller asked to cancel and still reads (CANCEL_ASKED: a BLS
  caller's `cancel()`, the responses go on to it); `is_cancelled()` reads either.
- `consumed`: how many of the request's responses the front has handed to the client; a
  streaming sender waits while too many are still unconsumed, so a slow reader bounds what
  is buffered for it (backpressure).
- `wake_at`: set by a sender while it waits: the `consumed` count it waits for. The front
  writes the worker's eventfd when it gets there (or cancels the request), so the sender
  sleeps in the kernel rather than polling, and starts again as soon as there is room.

The front owns the rows: it hands one to each request it sends to the worker, resets it then,
and takes it back after the request's final response. Each field has a single writer.

After the rows, one word goes the other way: the batch whose answers the worker has written to
their clients in full but not yet told the front of (see Result.written in messages.py). The
front reads it only when the worker dies or is killed, to tell a connection that holds that
batch's whole answer (it stays open) from one that may hold part of one (it closes).
"""

import os
import select
import threading

import numpy as np

from shmserve.ipc.segments import Segment

ROWS = 65536
_FIELDS = 3  # cancelled, consumed, wake_at (uint32 each)
CANCELLED, CONSUMED, WAKE_AT = 0, 1, 2
ABANDONED, CANCEL_ASKED = 1, 2  # values of `cancelled`
_MARK_OFFSET = ROWS * _FIELDS * 4
SIZE = _MARK_OFFSET + 8
_ROW_BYTES = _FIELDS * 4
_ZERO_ROW = bytes(_ROW_BYTES)


class RequestTable:
    def __init__(self, segment: Segment, wake_fd: int = -1):
        """`wake_fd`: the eventfd that wakes waiting senders (-1: none, they poll)."""
        self.segment = segment
        self.wake_fd = wake_fd
        self._rows = np.frombuffer(segment.buffer, dtype=np.uint32, count=ROWS * _FIELDS)
        self._rows = self._rows.reshape(ROWS, _FIELDS)
        self._mark = np.frombuffer(segment.buffer, dtype=np.uint64, count=1,
                                   offset=_MARK_OFFSET)
        self._bytes = segment.buffer.cast("B")  # reset writes a row through it: no numpy call
        self._pollers = threading.local()  # a poll object may serve one thread at a time

    # -- the front's side --------------------------------------------------------------------

    def reset(self, row: int) -> None:
        start = row * _ROW_BYTES
        self._bytes[start:start + _ROW_BYTES] = _ZERO_ROW

    def cancel(self, row: int) -> None:
        """Nobody reads the request's responses any more."""
        self._rows[row, CANCELLED] = ABANDONED
        if self._rows[row, WAKE_AT]:
            self._wake()

    def ask_cancel(self, row: int) -> None:
        """The model is asked to stop; its responses are still read."""
        if not self._rows[row, CANCELLED]:
            self._rows[row, CANCELLED] = CANCEL_ASKED

    def add_consumed(self, row: int) -> None:
        rows = self._rows
        rows[row, CONSUMED] += 1
        wake_at = rows[row, WAKE_AT]
        if wake_at and rows[row, CONSUMED] >= wake_at:
            self._wake()

    def written_mark(self) -> int:
        """The batch the worker last marked with mark_written (0 for none)."""
        return int(self._mark[0])

    def _wake(self) -> None:
        if self.wake_fd >= 0:
            os.eventfd_write(self.wake_fd, 1)

    # -- the worker's side -------------------------------------------------------------------

    def mark_written(self, batch_id: int) -> None:
        """The answers of batch `batch_id` are written in full (the sockets took them all),
        and the front has not been told yet."""
        self._mark[0] = batch_id

    def cancelled(self, row: int) -> bool:
        return bool(self._rows[row, CANCELLED])

    def abandoned(self, row: int) -> bool:
        return self._rows[row, CANCELLED] == ABANDONED

    def consumed(self, row: int) -> int:
        return int(self._rows[row, CONSUMED])

    def wait_consumed(self, row: int, count: int, timeout_s: float) -> None:
        """Sleeps until the front has consumed `count` responses of `row` or cancelled it, or
        for `timeout_s` at most. A wake may be for another row's sender (one eventfd serves the
        worker), and a wake can be missed (neither side fences between its write and its read
        of the row), so callers check their condition again, and the timeout bounds a miss."""
        rows = self._rows
        rows[row, WAKE_AT] = count
        try:
            if rows[row, CONSUMED] >= count or rows[row, CANCELLED] == ABANDONED:
                return
            if self.wake_fd < 0:
                select.select([], [], [], timeout_s)
                return
            poller = getattr(self._pollers, "poll", None)
            if poller is None:
                poller = self._pollers.poll = select.poll()
                poller.register(self.wake_fd, select.POLLIN)
            if poller.poll(timeout_s * 1000.0):
                try:
                    os.eventfd_read(self.wake_fd)
                except BlockingIOError:
                    pass  # another sender took this wake
        finally:
            rows[row, WAKE_AT] = 0

    def close(self) -> None:
        # Drops the numpy views so that the segment can unmap; a closed table is never used
        # again, so its methods keep the views' type (no None check on the hot path).
        self._rows = self._mark = None  # type: ignore[assignment]
        self._bytes.release()
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
