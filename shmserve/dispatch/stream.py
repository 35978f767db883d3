"""The responses of one request to a decoupled model, on their way from its worker to whoever
reads them.

The worker handle pushes responses as their frames arrive; the reader takes them one at a
time and says when it has handed each to its client (`consumed`), which the worker's sender
waits on once too many are outstanding. Cancelling tells the worker (through the request's
row of the request table) and drops what is buffered, and what still arrives.
"""

import asyncio
import collections
from typing import Optional

from shmserve.errors import ServerError


class ResponseStream:
    __slots__ = ("_loop", "_items", "_waiter", "_table", "_row", "_error", "finished",
                 "cancelled", "cancel_asked", "lone")

    def __init__(self, loop: Optional[asyncio.AbstractEventLoop] = None, lone: bool = False):
        """`loop`: the reader's event loop (found when first waited on, unless given).
        `lone`: no other request was in flight when this one came, so its client is likely
        waiting on it alone; the front and the worker poll for such a client even when its
        reading keeps the machine busy (dispatch/front_spin.py)."""
        self._loop = loop
        self.lone = lone
        self._items: collections.deque = collections.deque()  # (WorkResponse or None, final)
        self._waiter: Optional[asyncio.Future] = None
        self._table = None
        self._row = -1
        self._error: Optional[ServerError] = None
        self.finished = False  # the final response arrived, or the request failed
        self.cancelled = False
        self.cancel_asked = False

    # -- the worker handle's side -------------------------------------------------------------

    def attach(self, table, row: int) -> None:
        """The request now has row `row` of its worker's request table."""
        self._table = table
        self._row = row
        if self.cancelled:
            table.cancel(row)
        elif self.cancel_asked:
            table.ask_cancel(row)

    @property
    def row(self) -> int:
        """Its row of the request table while it has one, else -1."""
        return self._row if self._table is not None else -1

    def push(self, response, final: bool) -> None:
        if self.finished:
            _release(response)
            return
        if final:
            self.finished = True
            self._table = None  # the row goes back to the handle, and may serve another request
        if self.cancelled:
            _release(response)
            return
        self._items.append((response, final))
        self._wake()

    def fail(self, error: ServerError) -> None:
        """The request ended without its final response (rejected, or its worker died)."""
        if self.finished:
            return
        self.finished = True
        self._table = None
        self._error = error
        self._wake()

    # -- the reader's side --------------------------------------------------------------------

    async def get(self):
        """(WorkResponse or None, final); raises the ServerError the request failed with."""
        while not self._items:
            if self._error is not None:
                raise self._error
            if self._loop is None:
                self._loop = asyncio.get_running_loop()
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._items.popleft()

    def consumed(self) -> None:
        if self._table is not None:
            self._table.add_consumed(self._row)

    def ask_cancel(self) -> None:
        """The model is asked to stop (is_cancelled() says so); what it still sends is read,
        to the final response, as a BLS caller's cancel() wants."""
        if self.cancel_asked or self.finished:
            return
        self.cancel_asked = True
        if self._table is not None:
            self._table.ask_cancel(self._row)

    def cancel(self) -> None:
        if self.cancelled:
            return
        self.cancelled = True
        if self._table is not None:
            self._table.cancel(self._row)
        while self._items:
            _release(self._items.popleft()[0])

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


def _release(response) -> None:
    if response is not None and response.release is not None:
        response.release()
