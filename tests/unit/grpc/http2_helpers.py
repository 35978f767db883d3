"""What the HTTP/2 test modules (test_http2_*.py) share: hand-made frames (`frame`, the
client's PREFACE and EMPTY_SETTINGS), a server side (`server`, or `started`: past the preface
and SETTINGS) whose Listener records the events it is told of, and the frames it wrote
(`frames_of`)."""

import struct

from shmserve.grpc import http2


PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
EMPTY_SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def frame(ftype: int, flags: int, sid: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes((ftype, flags)) + struct.pack(">I", sid) + payload


class Listener:
    def __init__(self):
        self.events = []

    def on_request(self, sid, headers):
        self.events.append(("request", sid, [(bytes(k), bytes(v)) for k, v in headers]))

    def on_data(self, sid, data, size):
        self.events.append(("data", sid, bytes(data), size))

    def on_end(self, sid):
        self.events.append(("end", sid))

    def on_reset(self, sid):
        self.events.append(("reset", sid))

    def on_window(self):
        self.events.append(("window",))

    def on_goaway(self):
        self.events.append(("goaway",))

    def on_ping_ack(self, payload):
        self.events.append(("ping_ack", payload))


def server(**overrides) -> tuple:
    options = dict(max_concurrent_streams=100, stream_window=1 << 20, connection_window=1 << 22,
                   max_frame_size=1 << 16, max_header_list_size=65536)
    options.update(overrides)
    listener = Listener()
    return http2.ServerConnection(listener, **options), listener


def frames_of(chunks: list) -> list:
    """(type, flags, stream id, payload) of each frame in what the server wrote."""
    data = b"".join(bytes(c) for c in chunks)
    out, pos = [], 0
    while pos < len(data):
        length = int.from_bytes(data[pos:pos + 3], "big")
        out.append((data[pos + 3], data[pos + 4],
                    int.from_bytes(data[pos + 5:pos + 9], "big"), data[pos + 9:pos + 9 + length]))
        pos += 9 + length
    return out


def started(**overrides) -> tuple:
    conn, listener = server(**overrides)
    conn.receive(PREFACE + EMPTY_SETTINGS)
    conn.data_to_send()
    listener.events.clear()
    return conn, listener
