"""Frame codec: a 4-byte little-endian length, then a msgpack body."""

import struct

import msgpack

from shmserve.ipc import messages

HEADER = struct.Struct("<I")
MAX_FRAME = 1 << 31  # frames carry at most the inline tensors, far below this


def encode(message) -> tuple:
    """(header, body): written with one gather call, without joining them first."""
    body = msgpack.packb(message.to_wire(), use_bin_type=True)
    return HEADER.pack(len(body)), body


def decode_body(body) -> object:
    return messages.from_wire(msgpack.unpackb(body, raw=False, use_list=True))


# A frame body at least this large is read into a buffer of its own size as it arrives
# (BLS tensors travel inline): growing the shared buffer chunk by chunk and slicing the body
# out of it would copy every byte two or three more times.
LARGE_BODY = 1 << 20


class FrameSplitter:
    """Accumulates stream bytes and yields complete frame bodies."""

    __slots__ = ("_buf", "_body", "_filled")

    def __init__(self):
        self._buf = bytearray()
        self._body = None  # the large body being filled, if any
        self._filled = 0

    def feed(self, data) -> list:
        bodies: list = []
        if self._body is not None:
            data = self._fill(memoryview(data), bodies)
            if not data:
                return bodies
        buf = self._buf
        buf += data
        pos = 0
        end = len(buf)
        while end - pos >= 4:
            (n,) = HEADER.unpack_from(buf, pos)
            if n >= MAX_FRAME:
                raise ValueError(f"control frame of {n} bytes exceeds the limit")
            if end - pos - 4 < n:
                if n >= LARGE_BODY:
                    self._body = bytearray(n)
                    rest = memoryview(buf)[pos + 4:end]
                    self._body[:len(rest)] = rest
                    self._filled = len(rest)
                    rest.release()
                    pos = end
                break
            bodies.append(buf[pos + 4:pos + 4 + n])
            pos += 4 + n
        if pos:
            del buf[:pos]
        return bodies

    def _fill(self, data: memoryview, bodies: list) -> memoryview:
        """Copy into the large body; when it is complete, hand it over. Returns the bytes
        after it."""
        body = self._body
        take = min(len(body) - self._filled, len(data))
        body[self._filled:self._filled + take] = data[:take]
        self._filled += take
        if self._filled == len(body):
            bodies.append(body)
            self._body = None
            self._filled = 0
        return data[take:]
