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


class FrameSplitter:
    """Accumulates stream bytes and yields complete frame bodies."""

    __slots__ = ("_buf",)

    def __init__(self):
        self._buf = bytearray()

    def feed(self, data) -> list:
        buf = self._buf
        buf += data
        bodies = []
        pos = 0
        end = len(buf)
        while end - pos >= 4:
            (n,) = HEADER.unpack_from(buf, pos)
            if n >= MAX_FRAME:
                raise ValueError(f"control frame of {n} bytes exceeds the limit")
            if end - pos - 4 < n:
                break
            bodies.append(buf[pos + 4:pos + 4 + n])
            pos += 4 + n
        if pos:
            del buf[:pos]
        return bodies
