"""A model's calls into the server (BLS inference, model control), and the one reader of the
worker's socket that makes them possible from any thread.

A call is a ServerCall frame to the front, answered by ServerReply frames with its id: one,
or for a decoupled BLS request one per response, the last one final.

One thread at a time reads the socket: the frame loop between batches, or a thread waiting
for a reply while the frame loop is busy (a model calling BLS from execute() is the usual
case, and then the frame loop is the thread waiting). Whoever reads a frame hands it to its
owner: a reply to the call waiting for it, any other frame to the frame loop, in order.
"""

import itertools
import threading
from collections import deque

from shmserve.ipc import messages

_HANDED_OVER = object()


class FrameReader:
    def __init__(self, channel):
        self._channel = channel
        self._cv = threading.Condition()
        self._reading = False  # a thread is in recv()
        self._closed = False  # the front is gone
        self._for_loop: deque = deque()  # frames for the frame loop read by a waiting caller
        self._calls: dict = {}  # call id -> deque of its replies not yet taken
        self._ids = itertools.count(1)

    def next_frame(self):
        """The frame loop's next frame; None once the front is gone."""
        while True:
            with self._cv:
                while True:
                    if self._for_loop:
                        return self._for_loop.popleft()
                    if self._closed:
                        return None
                    if not self._reading:
                        self._reading = True
                        break
                    self._cv.wait()
            msg = self._read(for_loop=True)
            if msg is not _HANDED_OVER:
                return msg

    def call(self, kind: str, args: dict):
        """Send a ServerCall now; an iterator of its replies, ending after the final one.
        Leaving it early tells the front to stop the call."""
        with self._cv:
            call_id = next(self._ids)
            replies: deque = deque()
            self._calls[call_id] = replies
        try:
            self._channel.send(messages.ServerCall(call_id, kind, args))
        except BaseException:
            with self._cv:
                self._calls.pop(call_id, None)
            raise
        return self._replies(call_id, replies)

    def _replies(self, call_id: int, replies: deque):
        final = False
        try:
            while not final:
                reply = self._next_reply(replies)
                final = reply.final
                yield reply
        finally:
            with self._cv:
                self._calls.pop(call_id, None)
            if not final and not self._closed:
                try:
                    self._channel.send(messages.ServerCall(call_id, "cancel", {}))
                except OSError:
                    pass

    def _next_reply(self, replies: deque) -> messages.ServerReply:
        while True:
            with self._cv:
                while True:
                    if replies:
                        return replies.popleft()
                    if self._closed:
                        raise ConnectionError("the server closed the worker's connection")
                    if not self._reading:
                        self._reading = True
                        break
                    self._cv.wait()
            self._read(for_loop=False)

    def _read(self, for_loop: bool):
        """Read one frame, as the thread that took the reading turn, and give the turn back.
        Returns the frame if it is the frame loop's and `for_loop`, else _HANDED_OVER."""
        msg = None
        try:
            msg = self._channel.recv()
        finally:
            with self._cv:
                self._reading = False
                if msg is None:
                    self._closed = True
                elif type(msg) is messages.ServerReply:
                    replies = self._calls.get(msg.call_id)
                    if replies is not None:  # else its caller left: dropped
                        replies.append(msg)
                    msg = _HANDED_OVER
                elif not for_loop:
                    self._for_loop.append(msg)
                    msg = _HANDED_OVER
                self._cv.notify_all()
        return msg
