"""HTTP/2's wire vocabulary (RFC 9113 §4, §6, §7): frame types, flags, error codes and
settings, the connection error, and the frames the server side builds and the payloads it
takes apart.

Kept apart from the connection's state machine (http2.py) so that it reads as the rules of
the protocol, and the frame bytes the tests build and check have one source. The state machine
reads a frame's 9-byte head itself, inline in its parse loop: that loop is the hot path.
"""

import struct

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# Frame types.
DATA = 0x0
HEADERS = 0x1
PRIORITY = 0x2
RST_STREAM = 0x3
SETTINGS = 0x4
PUSH_PROMISE = 0x5
PING = 0x6
GOAWAY = 0x7
WINDOW_UPDATE = 0x8
CONTINUATION = 0x9

# Flags.
END_STREAM = 0x1
ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20

# Error codes.
NO_ERROR = 0x0
PROTOCOL_ERROR = 0x1
FLOW_CONTROL_ERROR = 0x3
STREAM_CLOSED = 0x5
FRAME_SIZE_ERROR = 0x6
REFUSED_STREAM = 0x7
COMPRESSION_ERROR = 0x9
ENHANCE_YOUR_CALM = 0xB

# SETTINGS parameters.
HEADER_TABLE_SIZE = 0x1
ENABLE_PUSH = 0x2
MAX_CONCURRENT_STREAMS = 0x3
INITIAL_WINDOW_SIZE = 0x4
MAX_FRAME_SIZE = 0x5
MAX_HEADER_LIST_SIZE = 0x6

DEFAULT_WINDOW = 65535
DEFAULT_FRAME_SIZE = 16384
MAX_WINDOW = 2**31 - 1
MAX_FRAME_SIZE_LIMIT = 2**24 - 1

FRAME_HEAD = struct.Struct(">IBI")  # (length << 8 | type), flags, stream id
SETTING = struct.Struct(">HI")
U32 = struct.Struct(">I")


class Http2Error(Exception):
    """A connection error: the connection ends with GOAWAY(code)."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


def frame(ftype: int, flags: int, sid: int, payload: bytes = b"") -> bytes:
    return FRAME_HEAD.pack(len(payload) << 8 | ftype, flags, sid) + payload


def settings_frame(settings: tuple) -> bytes:
    """A SETTINGS frame of (parameter, value) pairs."""
    return frame(SETTINGS, 0, 0, b"".join(SETTING.pack(k, v) for k, v in settings))


def header_frames(sid: int, flags: int, block: bytes, limit: int) -> list:
    """A header block longer than `limit` (the client's largest frame) as HEADERS with `flags`
    and then CONTINUATION frames, the last one ending the block."""
    frames = [frame(HEADERS, flags, sid, block[:limit])]
    for start in range(limit, len(block), limit):
        last = start + limit >= len(block)
        frames.append(frame(CONTINUATION, END_HEADERS if last else 0, sid,
                            block[start:start + limit]))
    return frames


def parse_settings(payload) -> dict:
    """The settings a SETTINGS frame (not an ACK) changes: each entry is checked, and only the
    last value of each setting counts, so that a frame repeating one costs one change."""
    if len(payload) % 6:
        raise Http2Error(FRAME_SIZE_ERROR, "SETTINGS of the wrong size")
    last = {}
    for key, value in SETTING.iter_unpack(payload):
        if key == INITIAL_WINDOW_SIZE:
            if value > MAX_WINDOW:
                raise Http2Error(FLOW_CONTROL_ERROR, "INITIAL_WINDOW_SIZE over 2^31-1")
        elif key == MAX_FRAME_SIZE:
            if not DEFAULT_FRAME_SIZE <= value <= MAX_FRAME_SIZE_LIMIT:
                raise Http2Error(PROTOCOL_ERROR, f"MAX_FRAME_SIZE {value}")
        elif key == ENABLE_PUSH:
            if value > 1:
                raise Http2Error(PROTOCOL_ERROR, f"ENABLE_PUSH {value}")
        last[key] = value
    return last


def unpad(payload):
    """A padded frame's payload without its pad length and padding."""
    if not payload:
        raise Http2Error(PROTOCOL_ERROR, "a padded frame without its pad length")
    pad = payload[0]
    if pad >= len(payload):
        raise Http2Error(PROTOCOL_ERROR, "padding longer than the frame")
    return payload[1:len(payload) - pad]
