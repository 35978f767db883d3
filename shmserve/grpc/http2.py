"""The server side of HTTP/2 (RFC 9113), as far as gRPC uses it: the connection's state
machine, which parses frames and keeps stream states, flow control, SETTINGS, PING and GOAWAY.
Sans-IO: bytes go in through `receive`, what the peer did comes out as calls on a listener, and
the frames to write collect until `data_to_send`. Beside it: the frames' vocabulary
(http2_frames.py), header blocks and HPACK (hpack_blocks.py), and the rate limits on PINGs and
resets (http2_rate_limits.py).

Why not the h2 library, which the gRPC layer used first: h2 is general (client and server,
push, priorities, every event as an object, a state machine per stream) and pure Python, and
it cost more CPU per call than the rest of the front (perf/findings/2026-11-transports.md).
This module does only what a gRPC server needs, in few calls per frame.

A client may try to make this side work, or hold memory, out of all proportion to what it
sends. Each such way has a bound, and passing it ends the connection with GOAWAY: header
blocks are bounded before they are decoded (hpack_blocks.py); PINGs follow gRPC's ping policy
and streams the client resets while this side serves them are rate limited
(http2_rate_limits.py); acknowledgements queued and not yet written are bounded. A SETTINGS
frame is applied once, however many entries it repeats, and a new initial window costs the
same however many streams are open (stream send windows are kept relative to it). And
`receive` stops when its time slice is spent, so that what one connection sent cannot hold
the event loop for long whatever it costs to parse.
"""

import time

from shmserve.grpc.hpack_blocks import TABLE_SIZE_ZERO, HeaderBlocks, encode_headers
from shmserve.grpc.http2_frames import (ACK, CONTINUATION, DATA, DEFAULT_FRAME_SIZE,
                                        DEFAULT_WINDOW, END_HEADERS, END_STREAM,
                                        ENHANCE_YOUR_CALM, FLOW_CONTROL_ERROR,
                                        FRAME_SIZE_ERROR, GOAWAY, HEADER_TABLE_SIZE, HEADERS,
                                        INITIAL_WINDOW_SIZE, MAX_CONCURRENT_STREAMS,
                                        MAX_FRAME_SIZE, MAX_HEADER_LIST_SIZE, MAX_WINDOW,
                                        NO_ERROR, PADDED, PING, PREFACE, PRIORITY,
                                        PROTOCOL_ERROR, PUSH_PROMISE, REFUSED_STREAM,
                                        RST_STREAM, SETTINGS, STREAM_CLOSED, WINDOW_UPDATE,
                                        Http2Error, header_frames, parse_settings,
                                        settings_frame, unpad)
from shmserve.grpc.http2_frames import FRAME_HEAD as _FRAME_HEAD
from shmserve.grpc.http2_frames import U32 as _U32
from shmserve.grpc.http2_frames import frame as _frame
from shmserve.grpc.http2_rate_limits import (MAX_PING_STRIKES, PING_INTERVAL_WITHOUT_DATA_S,
                                             PingPolicy, ResetRateLimit)

# Answers to the client's frames (PING and SETTINGS ACKs, RST_STREAMs) queued and not yet
# taken by data_to_send: as nghttp2's and Go's servers bound them.
MAX_QUEUED_CONTROL_FRAMES = 10000
# `receive` yields once it has parsed this long (looked at after each header block it
# decodes, and every 32 frames).
PARSE_SLICE_S = 0.005


class _Stream:
    __slots__ = ("send_credit", "recv_window", "remote_open", "local_open")

    def __init__(self, recv_window: int, remote_open: bool):
        # The client's WINDOW_UPDATEs less the DATA sent: the send window is the client's
        # initial window plus this, so a new initial window changes no stream.
        self.send_credit = 0
        self.recv_window = recv_window
        self.remote_open = remote_open
        self.local_open = True


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

    The ping policy: `ping_interval`, `max_ping_strikes` and `pings_without_calls`, as
    http2_rate_limits.PingPolicy takes them.
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
        self._blocks = HeaderBlocks(max_header_list_size)
        self._buf = bytearray()
        self._preface_seen = False
        self.established = False  # the client's preface and first SETTINGS have come
        self._signal_table_size = True
        self._goaway_sent = False
        self._pings = PingPolicy(ping_interval, max_ping_strikes, pings_without_calls, clock)
        # HEADERS or DATA go out: the ping policy starts over (as gRPC's does).
        self._sent = self._pings.sent
        self._resets = ResetRateLimit(clock)
        self._control_frames = 0  # answers queued since data_to_send last took them
        self._out: list = [settings_frame((
            (MAX_CONCURRENT_STREAMS, max_concurrent_streams),
            (INITIAL_WINDOW_SIZE, stream_window),
            (MAX_FRAME_SIZE, max_frame_size),
            (MAX_HEADER_LIST_SIZE, max_header_list_size)))]
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
        blocks = self._blocks
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
            if blocks.continuing is not None and ftype != CONTINUATION:
                raise Http2Error(PROTOCOL_ERROR, "a header block was interrupted")
            if not self.established:
                if ftype != SETTINGS:
                    raise Http2Error(PROTOCOL_ERROR, "the first frame must be SETTINGS")
                self.established = True
            handler = handlers.get(ftype)
            if handler is not None:  # frames of unknown types are ignored (RFC 9113 §5.5)
                handler(flags, sid, payload)
            frames += 1
            if blocks.decoded or not frames & 31:
                blocks.decoded = False
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
            payload = unpad(payload)
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
        headers = self._blocks.first(flags, sid, payload)
        if headers is not None:
            self._headers(sid, bool(flags & END_STREAM), headers)

    def _on_continuation(self, flags: int, sid: int, payload) -> None:
        whole = self._blocks.more(flags, sid, payload)
        if whole is not None:
            self._headers(sid, whole[1], whole[0])

    def _headers(self, sid: int, end_stream: bool, headers: list) -> None:
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
            self._resets.spend()
            self.listener.on_reset(sid)

    def _on_settings(self, flags: int, sid: int, payload) -> None:
        if sid != 0:
            raise Http2Error(PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & ACK:
            if payload:
                raise Http2Error(FRAME_SIZE_ERROR, "a SETTINGS ACK with a payload")
            return
        last = parse_settings(payload)
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
        self._pings.received(self.streams or self._lent)
        self._queue_control(_frame(PING, ACK, 0, bytes(payload)))

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
            block = TABLE_SIZE_ZERO + block
            self._signal_table_size = False
        flags = END_STREAM if end_stream else 0
        limit = self.max_outbound_frame_size
        if len(block) <= limit:
            self._out.append(_frame(HEADERS, flags | END_HEADERS, sid, block))
        else:
            self._out += header_frames(sid, flags, block, limit)
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

