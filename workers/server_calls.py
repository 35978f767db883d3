"""A model's calls into the server (BLS inference, model control), and the one reader of the
worker's socket that makes them possible from any thread.

A call is a ServerCall frame to the front, answered by ServerReply frames with its id: one,
or for a decoupled BLS request one per response, the last one final.

One thread at a time reads the socket: the frame loop between batches, or a thread waiting
for a reply while the frame loop is busy (a model calling BLS from execute() is the usual
case, and then the frame loop is the thread waiting). Whoever reads a frame hands it to its
owner: a reply to the call waiting for it, any other frame to the frame loop, in order.
Whoever reads a region's (un)mapping applies it at once: a reply that follows may need it
while the frame loop waits for that very reply.

Large tensors of a BLS call go by reference (see shmserve/ipc/messages.py): inputs through
the CallArena, outputs copied out of the target's output arena by whoever reads the reply,
who then releases them, so that the target's slots never wait on the model's pace.
"""

import itertools
import threading
from collections import deque

import numpy as np

from shmserve.ipc import messages
from shmserve.ipc.locations import InRegion
from shmserve.ipc.allocator import ArenaAllocator
from shmserve.ipc.segments import Segment
from workers.regions import ClientRegions

_HANDED_OVER = object()
_REGION_FRAMES = (messages.MapSystemRegion, messages.MapCudaRegion, messages.UnmapRegion)


class CallArena:
    """The worker's BLS arena: large inputs of its calls are written here, read in place by
    the target instance, and freed once the call has ended. Any thread may call."""

    def __init__(self, segment: Segment, threshold: int):
        self._segment = segment
        self._alloc = ArenaAllocator(segment.size)
        self._lock = threading.Lock()
        # Smaller tensors go inline: a memcpy into the frame costs less than a slot.
        self.threshold = threshold

    def put(self, array: np.ndarray):
        """Copy `array`'s bytes into a new block: its offset, or None when there is no room
        (the tensor then goes inline)."""
        nbytes = array.nbytes
        with self._lock:
            offset = self._alloc.alloc(nbytes)
            if offset is None:
                return None
            # Memory behind the block first: a full /dev/shm must not SIGBUS the model.
            if not self._segment.reserve(offset + nbytes):
                self._alloc.free(offset)
                return None
        dst = np.frombuffer(self._segment.view(offset, nbytes), dtype=array.dtype)
        np.copyto(dst.reshape(array.shape), array)
        return offset

    def free(self, offsets) -> None:
        with self._lock:
            for offset in offsets:
                self._alloc.free(offset)

    def close(self) -> None:
        self._segment.close()


class FrameReader:
    def __init__(self, channel, regions: ClientRegions = None, arena: CallArena = None):
        """`regions`: the worker's mapped regions; `arena`: where large BLS inputs go (None:
        they go inline)."""
        self._channel = channel
        self.regions = regions if regions is not None else ClientRegions(gpu_inputs=False)
        self.arena = arena
        self._cv = threading.Condition()
        self._reading = False  # a thread is in recv()
        self._closed = False  # the front is gone
        self._for_loop: deque = deque()  # frames for the frame loop read by a waiting caller
        self._calls: dict = {}  # call id -> deque of its replies not yet taken
        self._ids = itertools.count(1)

    def next_frame(self, before_waiting=None):
        """The frame loop's next frame; None once the front is gone. `before_waiting`: called
        before this thread waits for a frame that has yet to come (perhaps more than once)."""
        while True:
            with self._cv:
                while self._reading and not (self._for_loop or self._closed) \
                        and before_waiting is None:
                    self._cv.wait()
                if self._for_loop:
                    return self._for_loop.popleft()
                if self._closed:
                    return None
                mine = not self._reading
                if mine:
                    self._reading = True
            if not mine:  # another thread is in recv: what comes, it hands over
                before_waiting()
                before_waiting = None
                continue
            msg = self._read(for_loop=True, before_waiting=before_waiting)
            if msg is not _HANDED_OVER:
                return msg

    def call(self, kind: str, args: dict, blocks=()):
        """Send a ServerCall now; its CallReplies, an iterator of its replies ending after
        the final one. Leaving it early tells the front to stop the call. `blocks`: the call's inputs in
        the CallArena, freed once the target can no longer read them."""
        with self._cv:
            call_id = next(self._ids)
            replies: deque = deque()
            self._calls[call_id] = replies
        try:
            self._channel.send(messages.ServerCall(call_id, kind, args))
        except BaseException:
            with self._cv:
                self._calls.pop(call_id, None)
            if blocks:
                self.arena.free(blocks)
            raise
        return CallReplies(self, call_id, self._replies(call_id, replies, blocks))

    def cancel_request(self, call_id: int) -> None:
        """Ask the model a call runs to stop; its replies still come, to the final one."""
        try:
            self._channel.send(messages.ServerCall(call_id, "cancel_request", {}))
        except OSError:
            pass

    def _replies(self, call_id: int, replies: deque, blocks):
        final = False
        try:
            while not final:
                reply = self._next_reply(replies)
                final = reply.final
                yield reply
        finally:
            with self._cv:
                self._calls.pop(call_id, None)
            if blocks and (final or self._closed):
                self.arena.free(blocks)
            # else the target may read them yet: they stay taken (only decoupled calls,
            # which never have blocks, are left early)
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

    def _read(self, for_loop: bool, before_waiting=None):
        """Read one frame, as the thread that took the reading turn, and give the turn back.
        Returns the frame if it is the frame loop's and `for_loop`, else _HANDED_OVER."""
        msg = None
        try:
            if before_waiting is not None and not self._channel.has_data():
                before_waiting()
            msg = self._channel.recv()
            if type(msg) is messages.ServerReply:
                self._copy_out(msg)
            elif type(msg) in _REGION_FRAMES:
                self._apply(msg)
        finally:
            with self._cv:
                self._reading = False
                if msg is None:
                    self._closed = True
                elif type(msg) in _REGION_FRAMES:
                    msg = _HANDED_OVER
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

    def _copy_out(self, reply: messages.ServerReply) -> None:
        """Replace the outputs the reply holds by reference with copies the model owns (and
        may write to), then release the target's slots."""
        frame = reply.response
        if frame is None or not any(type(t.location) is InRegion for t in frame.outputs):
            return
        try:
            for t in frame.outputs:
                if type(t.location) is InRegion:
                    t.location = bytearray(self.regions.input(t.location, t.datatype))
        except ValueError as exc:  # the region could not be mapped here
            frame.error = ["INTERNAL", f"cannot read the BLS response's outputs: {exc}"]
            frame.outputs = []
        finally:
            try:
                self._channel.send(messages.ServerCall(reply.call_id, "release", {}))
            except OSError:
                pass  # the front is gone, and with it the lease

    def _apply(self, msg) -> None:
        if type(msg) is messages.MapSystemRegion:
            self.regions.map_system(msg)
        elif type(msg) is messages.MapCudaRegion:
            self.regions.map_cuda(msg)
        else:
            self.regions.unmap(msg.region_id)

    def close(self) -> None:
        self.regions.close()
        if self.arena is not None:
            self.arena.close()


class CallReplies:
    """The replies of one ServerCall, an iterator; `close()` leaves them (the front stops the
    call), `cancel()` asks the model to stop while its replies are still read."""

    __slots__ = ("_reader", "call_id", "_replies")

    def __init__(self, reader: FrameReader, call_id: int, replies):
        self._reader = reader
        self.call_id = call_id
        self._replies = replies

    def __iter__(self):
        return self

    def __next__(self):
        return next(self._replies)

    def close(self) -> None:
        self._replies.close()

    def cancel(self) -> None:
        self._reader.cancel_request(self.call_id)
