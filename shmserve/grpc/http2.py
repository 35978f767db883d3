"""The server side of HTTP/2 (RFC 9113), as far as gRPC uses it: frames, stream states, flow
control, SETTINGS, PING and GOAWAY. HPACK comes from the hpack library. Sans-IO: bytes go in
through `receive`, what the peer did comes out as calls on a listener, and the frames to write
collect until `data_to_send`.

Why not the h2 library, which the gRPC layer used first: h2 is general (client and server,
push, priorities, every event as an object, a state machine per stream) and pure Python, and
under load it was 57 % of the front's CPU, more than everything else together. This module
does only what a gRPC server needs, in few calls per frame. Two shortcuts keep HPACK cheap:
header blocks we send never use the dynamic table (so they are constants), and a request
block made only of one-byte table references (what a gRPC client sends for every call after
its first) is decoded once and then looked up.

A client may try to make this side work, or hold memory, out of all proportion to what it
sends. Each such way has a bound, and passing it ends the connection with GOAWAY: a header
block longer than the advertised header list size is refused before it is decoded, and one
may begin with at most two table size updates; PINGs follow gRPC's ping policy (strikes for
PINGs that come too often while this side sends nothing); acknowledgements queued and not
yet written are bounded; streams the client resets while this side serves them are rate
limited. A SETTINGS frame is applied once, however many entries it repeats, and a new initial
window costs the same however many streams are open (stream send windows are kept relative
to it). And `receive` stops when its time slice is spent, so that what one connection sent
cannot hold the event loop for long whatever it costs to parse.
"""

import math
import struct
import time

import hpack

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

_FRAME_HEAD = struct.Struct(">IBI")  # (length << 8 | type), flags, stream id
_SETTING = struct.Struct(">HI")
_U32 = struct.Struct(">I")
_DECODED_CACHE_SIZE = 64
# Longer blocks are decoded each time: a client's repeated request blocks are a few dozen
# bytes, and the cache's memory stays small.
_DECODED_CACHE_BLOCK = 128

# Bounds on what a client can make this side do (see the module docstring).
# RFC 7541 §4.2: a block needs at most two (the smallest size since the last one, then the
# final size).
MAX_TABLE_SIZE_UPDATES = 2
# Answers to the client's frames (PING and SETTINGS ACKs, RST_STREAMs) queued and not yet
# taken by data_to_send: as nghttp2's and Go's servers bound them.
MAX_QUEUED_CONTROL_FRAMES = 10000
# Streams the client resets while this side still serves them (HTTP/2 "rapid reset"): a
# burst, then so many a second.
RESET_BURST = 1000
RESET_RATE = 100.0
# `receive` yields once it has parsed this long (looked at after each header block it
# decodes, and every 32 frames).
PARSE_SLICE_S = 0.005
# gRPC's ping policy, with its defaults (tritonserver's --grpc-http2-min-recv-ping-interval-
# without-data and --grpc-http2-max-ping-strikes): a PING sooner than this after the last one,
# with no HEADERS or DATA sent in between, is a strike; one strike more than the maximum ends
# the connection (GOAWAY ENHANCE_YOUR_CALM, "too_many_pings"). While no call is open the
# interval is two hours, unless pings without calls are permitted.
PING_INTERVAL_WITHOUT_DATA_S = 300.0
PING_INTERVAL_WITHOUT_CALLS_S = 7200.0
MAX_PING_STRIKES = 2


class Http2Error(Exception):
    """A connection error: the connection ends with GOAWAY(code)."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


class _Stream:
    __slots__ = ("send_credit", "recv_window", "remote_open", "local_open")

    def __init__(self, recv_window: int, remote_open: bool):
        # The client's WINDOW_UPDATEs less the DATA sent: the send window is the client's
        # initial window plus this, so a new initial window changes no stream.
        self.send_credit = 0
        self.recv_window = recv_window
        self.remote_open = remote_open
        self.local_open = True


def _frame(ftype: int, flags: int, sid: int, payload: bytes = b"") -> bytes:
    return _FRAME_HEAD.pack(len(payload) << 8 | ftype, flags, sid) + payload


def _hpack_int(value: int, prefix_bits: int, first: int = 0) -> bytes:
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 128:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_STATUS_200 = (b":status", b"200")
# Blocks already encoded: the few constant ones (response headers, OK trailers) are asked for
# on every call. Only short blocks are kept, so that error trailers quoting what a client
# sent cannot fill memory.
_BLOCKS: dict = {}
_BLOCKS_KEPT = 256
_BLOCK_KEPT_BYTES = 512


def encode_headers(headers: tuple) -> bytes:
    """An HPACK block that leaves the dynamic table alone: ':status: 200' as its static index,
    everything else as literals without indexing, so a block depends only on its headers."""
    block = _BLOCKS.get(headers)
    if block is None:
        block = _encode_headers(headers)
        if len(block) <= _BLOCK_KEPT_BYTES:
            if len(_BLOCKS) >= _BLOCKS_KEPT:
                _BLOCKS.clear()
            _BLOCKS[headers] = block
    return block


def _encode_headers(headers: tuple) -> bytes:
    parts = []
    for name, value in headers:
        if (name, value) == _STATUS_200:
            parts.append(b"\x88")
        else:
            parts += (b"\x00", _hpack_int(len(name), 7), name, _hpack_int(len(value), 7), value)
    return b"".join(parts)


class ServerConnection:
    """One HTTP/2 connection, server side. The listener gets:

    - `on_request(sid, headers)`: a new stream, headers as [(name, value)] bytes pairs;
    - `on_data(sid, data, size)`: DATA for an open stream (`size` counts padding, and is what
      `acknowledge_received_data` must eventually give back);
    - `on_end(sid)`: the client has sent all of the stream;
    - `on_reset(sid)`: the stream is gone (the client reset it, or it broke a stream rule);
    - `on_window()`: send windows may have grown;
    - `on_goaway()`: the client is closing the connection;
    - `on_ping_ack(payload)`: the client acknowledged a PING that `send_ping` sent.

    Sending on a stream that is no longer open does nothing: a call may end from both sides
    at once, and the later end has nothing left to say.

    Flow control: the connection's window is given back as DATA arrives (received bytes are
    bounded by the streams' windows instead); a stream's window is the listener's to grow,
    with `ensure_window`, as far as it can take what comes.

    The ping policy: `ping_interval` and `max_ping_strikes` (0: no limit) as gRPC's; with
    `pings_without_calls` the same interval holds while no call is open.
    """

    def __init__(self, listener, *, max_concurrent_streams: int, stream_window: int,
                 connection_window: int, max_frame_size: int, max_header_list_size: int,
                 ping_interval: float = PING_INTERVAL_WITHOUT_DATA_S,
                 max_ping_strikes: int = MAX_PING_STRIKES, pings_without_calls: bool = False,
                 clock=time.monotonic):
        self.listener = listener
        self.streams: dict[int, _Stream] = {}
        # Streams whose whole answer another writer has (lend_stream), until return_stream.
        self._lent: dict[int, _Stream] = {}
        self.last_stream_id = 0
        self.max_frame_size = max_frame_size  # inbound
        self.max_outbound_frame_size = DEFAULT_FRAME_SIZE
        self._max_streams = max_concurrent_streams
        self._stream_window = stream_window
        self._connection_window = connection_window
        self._recv_window = connection_window
        self._credit = 0
        self._send_window = DEFAULT_WINDOW
        self._peer_stream_window = DEFAULT_WINDOW
        self._max_header_list_size = max_header_list_size
        self._decoder = hpack.Decoder(max_header_list_size=max_header_list_size)
        self._decoded: dict = {}
        self._decoding = False  # a block was decoded since the parse slice's clock was read
        self._buf = bytearray()
        self._preface_seen = False
        self.established = False  # the client's preface and first SETTINGS have come
        self._continuing: tuple | None = None  # (sid, end_stream, block so far)
        self._signal_table_size = True
        self._goaway_sent = False
        self._clock = clock
        self._ping_interval = ping_interval
        self._max_ping_strikes = max_ping_strikes
        self._pings_without_calls = pings_without_calls
        self._last_ping = -math.inf  # when the last PING came, since this side last sent
        self._ping_strikes = 0
        self._reset_tokens = float(RESET_BURST)
        self._reset_time = clock()
        self._control_frames = 0  # answers queued since data_to_send last took them
        self._out: list = [_frame(SETTINGS, 0, 0, b"".join(_SETTING.pack(k, v) for k, v in (
            (MAX_CONCURRENT_STREAMS, max_concurrent_streams),
            (INITIAL_WINDOW_SIZE, stream_window),
            (MAX_FRAME_SIZE, max_frame_size),
            (MAX_HEADER_LIST_SIZE, max_header_list_size))))]
        if connection_window > DEFAULT_WINDOW:
            self._out.append(_frame(WINDOW_UPDATE, 0, 0,
                                    _U32.pack(connection_window - DEFAULT_WINDOW)))
        self._handlers = {DATA: self._on_data, HEADERS: self._on_headers,
                          PRIORITY: self._on_priority, RST_STREAM: self._on_rst_stream,
                          SETTINGS: self._on_settings, PUSH_PROMISE: self._on_push_promise,
                          PING: self._on_ping, GOAWAY: self._on_goaway,
                          WINDOW_UPDATE: self._on_window_update, CONTINUATION: self._on_continuation}

    # Input
    def receive(self, data: bytes) -> bool:
        """Parses `data` and calls the listener. Returns False when it stopped early, its
        time slice (PARSE_SLICE_S) spent: the rest waits for the next call (`receive(b"")`
        will do), which the caller makes in a later turn of its loop, without reading more
        meanwhile. Raises Http2Error (with GOAWAY queued) when the client broke the protocol
        or one of the bounds, after which the connection must be closed."""
        buf = self._buf
        if buf:
            buf += data
            src = buf
        else:
            src = data
        try:
            pos, done = self._parse(src)
        except Http2Error as exc:
            self.close_connection(exc.code, str(exc))
            raise
        if src is buf:
            del buf[:pos]
        elif pos < len(src):
            buf += memoryview(src)[pos:]
        return done

    def _parse(self, src) -> tuple[int, bool]:
        pos = 0
        end_of_data = len(src)
        if not self._preface_seen:
            if end_of_data < len(PREFACE):
                if PREFACE[:end_of_data] != src:
                    raise Http2Error(PROTOCOL_ERROR, "not an HTTP/2 connection preface")
                return 0, True
            if src[:len(PREFACE)] != PREFACE:
                raise Http2Error(PROTOCOL_ERROR, "not an HTTP/2 connection preface")
            self._preface_seen = True
            pos = len(PREFACE)
        handlers = self._handlers
        deadline = time.perf_counter() + PARSE_SLICE_S
        frames = 0
        while end_of_data - pos >= 9:
            length = src[pos] << 16 | src[pos + 1] << 8 | src[pos + 2]
            if length > self.max_frame_size:
                raise Http2Error(FRAME_SIZE_ERROR, f"a frame of {length} bytes")
            end = pos + 9 + length
            if end > end_of_data:
                break
            ftype = src[pos + 3]
            flags = src[pos + 4]
            sid = _U32.unpack_from(src, pos + 5)[0] & 0x7FFFFFFF
            payload = src[pos + 9:end]
            pos = end
            if self._continuing is not None and ftype != CONTINUATION:
                raise Http2Error(PROTOCOL_ERROR, "a header block was interrupted")
            if not self.established:
                if ftype != SETTINGS:
                    raise Http2Error(PROTOCOL_ERROR, "the first frame must be SETTINGS")
                self.established = True
            handler = handlers.get(ftype)
            if handler is not None:  # frames of unknown types are ignored (RFC 9113 §5.5)
                handler(flags, sid, payload)
            frames += 1
            if self._decoding or not frames & 31:
                self._decoding = False
                if time.perf_counter() > deadline and end_of_data - pos >= 9:
                    return pos, False
        return pos, True

    def _stream_error(self, sid: int, code: int) -> None:
        if self.streams.pop(sid, None) is not None:
            self._queue_control(_frame(RST_STREAM, 0, sid, _U32.pack(code)))
        self.listener.on_reset(sid)

    def _check_idle(self, sid: int, what: str) -> None:
        if sid == 0 or sid > self.last_stream_id:
            raise Http2Error(PROTOCOL_ERROR, f"{what} on idle stream {sid}")

    def _on_data(self, flags: int, sid: int, payload) -> None:
        self._check_idle(sid, "DATA")
        size = len(payload)
        self._recv_window -= size
        if self._recv_window < 0:
            raise Http2Error(FLOW_CONTROL_ERROR, "DATA beyond the connection's window")
        if size:
            self._credit_connection(size)
        if flags & PADDED:
            payload = _unpad(payload)
        stream = self.streams.get(sid)
        if stream is None or not stream.remote_open:
            # A stream this side closed or reset: its late data is dropped.
            if stream is not None:
                self._stream_error(sid, STREAM_CLOSED)
            return
        stream.recv_window -= size
        if stream.recv_window < 0:
            self._stream_error(sid, FLOW_CONTROL_ERROR)
            return
        end_stream = flags & END_STREAM
        if end_stream:
            stream.remote_open = False
            if not stream.local_open:
                del self.streams[sid]
        if size:
            self.listener.on_data(sid, payload, size)
        if end_stream:
            self.listener.on_end(sid)

    def _on_headers(self, flags: int, sid: int, payload) -> None:
        if sid == 0 or not sid & 1:
            raise Http2Error(PROTOCOL_ERROR, f"HEADERS on stream {sid}")
        if flags & PADDED:
            payload = _unpad(payload)
        if flags & PRIORITY_FLAG:
            if len(payload) < 5:
                raise Http2Error(FRAME_SIZE_ERROR, "HEADERS too short for its priority")
            payload = payload[5:]
        end_stream = bool(flags & END_STREAM)
        self._check_block_size(len(payload))
        if flags & END_HEADERS:
            self._headers(sid, end_stream, bytes(payload))
        else:
            self._continuing = (sid, end_stream, bytearray(payload))

    def _check_block_size(self, size: int) -> None:
        """A header block longer than the header list size this side advertised is not
        decoded (a block never decodes to fewer bytes than it has, near enough: each field
        counts 32 more); with HPACK's table out of step, the connection ends (RFC 9113
        §4.3)."""
        if size > self._max_header_list_size:
            raise Http2Error(COMPRESSION_ERROR, f"a header block longer than the "
                                                f"{self._max_header_list_size} bytes "
                                                f"advertised (SETTINGS_MAX_HEADER_LIST_SIZE)")

    def _on_continuation(self, flags: int, sid: int, payload) -> None:
        if self._continuing is None or self._continuing[0] != sid:
            raise Http2Error(PROTOCOL_ERROR, "CONTINUATION without its HEADERS")
        _, end_stream, block = self._continuing
        block += payload
        self._check_block_size(len(block))
        if flags & END_HEADERS:
            self._continuing = None
            self._headers(sid, end_stream, bytes(block))

    def _headers(self, sid: int, end_stream: bool, block: bytes) -> None:
        headers = self._decode(block)  # always, to keep HPACK's table in step with the client
        stream = self.streams.get(sid)
        if stream is None:
            if sid <= self.last_stream_id:
                return  # trailers of a stream this side already ended
            self.last_stream_id = sid
            if len(self.streams) >= self._max_streams:
                self._queue_control(_frame(RST_STREAM, 0, sid, _U32.pack(REFUSED_STREAM)))
                return
            self.streams[sid] = _Stream(self._stream_window, not end_stream)
            self.listener.on_request(sid, headers)
            if end_stream:
                self.listener.on_end(sid)
        elif not stream.remote_open:
            self._stream_error(sid, STREAM_CLOSED)
        elif not end_stream:
            self._stream_error(sid, PROTOCOL_ERROR)  # trailers must end the stream
        else:
            stream.remote_open = False
            if not stream.local_open:
                del self.streams[sid]
            self.listener.on_end(sid)

    def _decode(self, block: bytes) -> list:
        headers = self._decoded.get(block)
        if headers is not None:
            return headers
        _check_table_size_updates(block)
        self._decoding = True
        try:
            headers = self._decoder.decode(block, raw=True)
        except hpack.HPACKError as exc:
            raise Http2Error(COMPRESSION_ERROR, f"cannot decode a header block: {exc}") from None
        # One-byte indexed fields (every byte >= 0x80) change nothing in the table, so the
        # same bytes decode the same way until a block that may change it comes in.
        if block and min(block) >= 0x80:
            if len(block) <= _DECODED_CACHE_BLOCK:
                if len(self._decoded) >= _DECODED_CACHE_SIZE:
                    self._decoded.clear()
                self._decoded[block] = headers
        elif self._decoded:
            self._decoded.clear()
        return headers

    def _on_priority(self, flags: int, sid: int, payload) -> None:
        if sid == 0:
            raise Http2Error(PROTOCOL_ERROR, "PRIORITY on stream 0")
        if len(payload) != 5:
            raise Http2Error(FRAME_SIZE_ERROR, "PRIORITY of the wrong size")

    def _on_rst_stream(self, flags: int, sid: int, payload) -> None:
        if len(payload) != 4:
            raise Http2Error(FRAME_SIZE_ERROR, "RST_STREAM of the wrong size")
        self._check_idle(sid, "RST_STREAM")
        if self.streams.pop(sid, None) is not None or sid in self._lent:
            self._spend_reset()
            self.listener.on_reset(sid)

    def _spend_reset(self) -> None:
        """A stream this side was serving was reset: one token of the bucket (RESET_BURST,
        filled at RESET_RATE a second)."""
        now = self._clock()
        tokens = min(RESET_BURST, self._reset_tokens + (now - self._reset_time) * RESET_RATE)
        self._reset_time = now
        if tokens < 1:
            raise Http2Error(ENHANCE_YOUR_CALM, f"more than {RESET_BURST} streams reset at "
                                                f"once, or {RESET_RATE:g} a second")
        self._reset_tokens = tokens - 1

    def _on_settings(self, flags: int, sid: int, payload) -> None:
        if sid != 0:
            raise Http2Error(PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & ACK:
            if payload:
                raise Http2Error(FRAME_SIZE_ERROR, "a SETTINGS ACK with a payload")
            return
        if len(payload) % 6:
            raise Http2Error(FRAME_SIZE_ERROR, "SETTINGS of the wrong size")
        # Each entry is checked; only the last value of each setting is applied, once.
        last = {}
        for key, value in _SETTING.iter_unpack(payload):
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
        if INITIAL_WINDOW_SIZE in last:
            # Streams' send windows follow (see _Stream.send_credit). One pushed past 2^31-1
            # is not looked for: send_window never offers more than the connection's.
            self._peer_stream_window = last[INITIAL_WINDOW_SIZE]
        if MAX_FRAME_SIZE in last:
            self.max_outbound_frame_size = last[MAX_FRAME_SIZE]
        if HEADER_TABLE_SIZE in last:
            # Our blocks use no dynamic table; its size is restated as 0 next time.
            self._signal_table_size = True
        self._queue_control(_frame(SETTINGS, ACK, 0))
        self.listener.on_window()

    def _on_push_promise(self, flags: int, sid: int, payload) -> None:
        raise Http2Error(PROTOCOL_ERROR, "a client sent PUSH_PROMISE")

    def _on_ping(self, flags: int, sid: int, payload) -> None:
        if sid != 0:
            raise Http2Error(PROTOCOL_ERROR, "PING on a stream")
        if len(payload) != 8:
            raise Http2Error(FRAME_SIZE_ERROR, "PING of the wrong size")
        if flags & ACK:
            self.listener.on_ping_ack(bytes(payload))
            return
        if self._max_ping_strikes:
            now = self._clock()
            interval = self._ping_interval
            if not (self.streams or self._lent or self._pings_without_calls):
                interval = PING_INTERVAL_WITHOUT_CALLS_S
            if now < self._last_ping + interval:
                self._ping_strikes += 1
                if self._ping_strikes > self._max_ping_strikes:
                    raise Http2Error(ENHANCE_YOUR_CALM, "too_many_pings")
            self._last_ping = now
        self._queue_control(_frame(PING, ACK, 0, bytes(payload)))

    def _sent(self) -> None:
        """HEADERS or DATA go out: the ping policy starts over (as gRPC's does)."""
        self._last_ping = -math.inf
        self._ping_strikes = 0

    def _queue_control(self, frame: bytes) -> None:
        """An answer the client's frames asked for (an ACK, a reset), bounded: a client that
        sends them faster than they are written is cut off."""
        self._control_frames += 1
        if self._control_frames > MAX_QUEUED_CONTROL_FRAMES:
            raise Http2Error(ENHANCE_YOUR_CALM, f"more than {MAX_QUEUED_CONTROL_FRAMES} "
                                                f"frames to answer are waiting to be written")
        self._out.append(frame)

    def send_ping(self, payload: bytes) -> None:
        """A PING (8 bytes of payload) the client must acknowledge."""
        self._out.append(_frame(PING, 0, 0, payload))

    def _on_goaway(self, flags: int, sid: int, payload) -> None:
        if sid != 0:
            raise Http2Error(PROTOCOL_ERROR, "GOAWAY on a stream")
        self.listener.on_goaway()

    def _on_window_update(self, flags: int, sid: int, payload) -> None:
        if len(payload) != 4:
            raise Http2Error(FRAME_SIZE_ERROR, "WINDOW_UPDATE of the wrong size")
        increment = _U32.unpack(payload)[0] & 0x7FFFFFFF
        if sid == 0:
            if increment == 0:
                raise Http2Error(PROTOCOL_ERROR, "a connection WINDOW_UPDATE of 0")
            self._send_window += increment
            if self._send_window > MAX_WINDOW:
                raise Http2Error(FLOW_CONTROL_ERROR, "the connection window over 2^31-1")
        else:
            self._check_idle(sid, "WINDOW_UPDATE")
            stream = self.streams.get(sid)
            if stream is None:
                return
            if increment == 0:
                self._stream_error(sid, PROTOCOL_ERROR)
                return
            stream.send_credit += increment
            if self._peer_stream_window + stream.send_credit > MAX_WINDOW:
                self._stream_error(sid, FLOW_CONTROL_ERROR)
                return
        self.listener.on_window()

    # Output
    def send_window(self, sid: int) -> int:
        """How many bytes of DATA `sid` may send now."""
        stream = self.streams.get(sid)
        if stream is None:
            return 0
        return min(self._peer_stream_window + stream.send_credit, self._send_window)

    def send_headers(self, sid: int, headers: tuple, end_stream: bool = False) -> None:
        stream = self.streams.get(sid)
        if stream is None or not stream.local_open:
            return
        block = encode_headers(headers)
        self._sent()
        if self._signal_table_size:
            block = b"\x20" + block  # dynamic table size update: 0
            self._signal_table_size = False
        flags = END_STREAM if end_stream else 0
        limit = self.max_outbound_frame_size
        if len(block) <= limit:
            self._out.append(_frame(HEADERS, flags | END_HEADERS, sid, block))
        else:
            self._out.append(_frame(HEADERS, flags, sid, block[:limit]))
            for start in range(limit, len(block), limit):
                last = start + limit >= len(block)
                self._out.append(_frame(CONTINUATION, END_HEADERS if last else 0, sid,
                                        block[start:start + limit]))
        if end_stream:
            self._close_local(sid, stream)

    def send_data(self, sid: int, data, end_stream: bool = False) -> None:
        """One DATA frame; `data` must fit send_window(sid) and max_outbound_frame_size."""
        stream = self.streams.get(sid)
        if stream is None or not stream.local_open:
            return
        size = len(data)
        stream.send_credit -= size
        self._send_window -= size
        self._sent()
        self._out.append(_FRAME_HEAD.pack(size << 8 | DATA, END_STREAM if end_stream else 0, sid))
        self._out.append(data)
        if end_stream:
            self._close_local(sid, stream)

    def lend_stream(self, sid: int, headers: tuple, data_size: int,
                    trailers: tuple) -> tuple[bytes, bytes] | None:
        """Hand the whole answer of stream `sid` (whose client has sent all of it) to another
        writer: HEADERS with `headers`, one DATA frame of `data_size` bytes, then `trailers`,
        which end the stream. Returns the frames before the DATA frame's payload and those
        after it, for that writer to write; None when they cannot go so now (the window or
        the frame size is too small, or the next header block owes a table size update).

        From now on the stream is closed on this side, and its DATA counts against the
        windows: nothing this side sends can slip into it, and nothing sent after it can
        overdraw them. `return_stream` ends the loan."""
        stream = self.streams.get(sid)
        if stream is None or not stream.local_open or stream.remote_open \
                or self._signal_table_size:
            return None
        limit = self.max_outbound_frame_size
        if data_size > min(self._peer_stream_window + stream.send_credit, self._send_window,
                           limit):
            return None
        head_block = encode_headers(headers)
        trailer_block = encode_headers(trailers)
        if len(head_block) > limit or len(trailer_block) > limit:
            return None
        stream.send_credit -= data_size
        self._send_window -= data_size
        self._sent()
        self._close_local(sid, stream)
        self._lent[sid] = stream
        return (_frame(HEADERS, END_HEADERS, sid, head_block)
                + _FRAME_HEAD.pack(data_size << 8 | DATA, 0, sid),
                _frame(HEADERS, END_STREAM | END_HEADERS, sid, trailer_block))

    def return_stream(self, sid: int, data_size: int, written: bool, reopen: bool) -> None:
        """The end of `lend_stream`'s loan. When the other writer did not write the answer,
        its window comes back, and with `reopen` the stream is open again on this side, for
        this side to answer (not for a call that ended meanwhile)."""
        stream = self._lent.pop(sid, None)
        if stream is None or written:
            return
        self._send_window += data_size
        if reopen:
            stream.send_credit += data_size
            stream.local_open = True
            self.streams[sid] = stream

    def _close_local(self, sid: int, stream: _Stream) -> None:
        stream.local_open = False
        if not stream.remote_open:
            del self.streams[sid]

    def reset_stream(self, sid: int, code: int = NO_ERROR) -> None:
        if self.streams.pop(sid, None) is not None:
            self._out.append(_frame(RST_STREAM, 0, sid, _U32.pack(code)))

    def _credit_connection(self, size: int) -> None:
        """`size` bytes of DATA came: the connection's window goes back to the client once
        half of it is owed."""
        self._credit += size
        if self._credit >= self._connection_window // 2:
            self._recv_window += self._credit
            self._out.append(_frame(WINDOW_UPDATE, 0, 0, _U32.pack(self._credit)))
            self._credit = 0

    def ensure_window(self, sid: int, target: int) -> None:
        """Lets the client send `target` more bytes on `sid` (while it is open): a
        WINDOW_UPDATE when the stream's window is under half of that."""
        stream = self.streams.get(sid)
        if stream is None or not stream.remote_open:
            return
        window = stream.recv_window
        if 2 * window < target:
            self._out.append(_frame(WINDOW_UPDATE, 0, sid, _U32.pack(target - window)))
            stream.recv_window = target

    def close_connection(self, code: int = NO_ERROR, debug: str = "") -> None:
        """GOAWAY: streams up to the last one begun are still served, no new ones expected.
        `debug`: why, for the client's logs."""
        if not self._goaway_sent:
            self._goaway_sent = True
            self._out.append(_frame(GOAWAY, 0, 0, _U32.pack(self.last_stream_id)
                                    + _U32.pack(code) + debug.encode()[:256]))

    def has_output(self) -> bool:
        """Frames are queued that data_to_send has not taken yet."""
        return bool(self._out)

    def data_to_send(self) -> list:
        """The frames queued since the last call, as chunks to write in order."""
        out = self._out
        self._out = []
        self._control_frames = 0
        return out


def _check_table_size_updates(block: bytes) -> None:
    """The table size updates a block begins with (hpack refuses them anywhere else) are
    counted before it is decoded: a block of nothing else would cost a decode step a byte."""
    count = 0
    pos = 0
    end = len(block)
    while pos < end and block[pos] & 0xE0 == 0x20:
        count += 1
        if count > MAX_TABLE_SIZE_UPDATES:
            raise Http2Error(COMPRESSION_ERROR, "a header block with more than "
                                                f"{MAX_TABLE_SIZE_UPDATES} table size updates")
        if block[pos] & 0x1F == 0x1F:  # the size goes on in the next bytes
            pos += 1
            while pos < end and block[pos] & 0x80:
                pos += 1
        pos += 1


def _unpad(payload):
    if not payload:
        raise Http2Error(PROTOCOL_ERROR, "a padded frame without its pad length")
    pad = payload[0]
    if pad >= len(payload):
        raise Http2Error(PROTOCOL_ERROR, "padding longer than the frame")
    return payload[1:len(payload) - pad]
