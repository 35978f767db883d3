"""HPACK header blocks (RFC 7541) on the server side of an HTTP/2 connection: the blocks it
sends, encoded without the dynamic table, and the client's, gathered from a HEADERS frame and
its CONTINUATIONs, bounded and decoded (with the hpack library).

Two shortcuts keep HPACK cheap (see http2.py for why it must be): header blocks we send never
use the dynamic table, so they are constants, cached; and a request block made only of one-byte
table references (what a gRPC client sends for every call after its first) is decoded once and
then looked up.

Two bounds keep a client from making decoding cost out of proportion to what it sends: a block
longer than the advertised header list size is refused before it is decoded, and one may begin
with at most two table size updates.
"""

import hpack

from shmserve.grpc.http2_frames import (COMPRESSION_ERROR, END_HEADERS, END_STREAM,
                                        FRAME_SIZE_ERROR, PADDED, PRIORITY_FLAG, PROTOCOL_ERROR,
                                        Http2Error, unpad)

# A dynamic table size update to 0: what our first block after the client's
# SETTINGS_HEADER_TABLE_SIZE begins with, since our blocks use no dynamic table.
TABLE_SIZE_ZERO = b"\x20"
# RFC 7541 §4.2: a block needs at most two (the smallest size since the last one, then the
# final size).
MAX_TABLE_SIZE_UPDATES = 2

_DECODED_CACHE_SIZE = 64
# Longer blocks are decoded each time: a client's repeated request blocks are a few dozen
# bytes, and the cache's memory stays small.
_DECODED_CACHE_BLOCK = 128

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


class HeaderBlocks:
    """The client's header blocks on one connection: `first` takes a HEADERS frame's
    fragment, `more` a CONTINUATION's; once the block is whole they return its headers, as
    [(name, value)] bytes pairs (None before). Every block is decoded, whatever
    becomes of its stream, to keep HPACK's table in step with the client's. A block that
    breaks a bound raises Http2Error: with the table out of step, the connection ends (RFC
    9113 §4.3)."""

    __slots__ = ("continuing", "decoded", "_max_size", "_decoder", "_cache")

    def __init__(self, max_header_list_size: int):
        self.continuing: tuple | None = None  # (sid, end_stream, block so far)
        self.decoded = False  # a block was decoded since the parse slice's clock was read
        self._max_size = max_header_list_size
        self._decoder = hpack.Decoder(max_header_list_size=max_header_list_size)
        self._cache: dict = {}

    def first(self, flags: int, sid: int, payload) -> list | None:
        """A HEADERS frame's payload: its padding and priority go, the rest begins a block."""
        if flags & PADDED:
            payload = unpad(payload)
        if flags & PRIORITY_FLAG:
            if len(payload) < 5:
                raise Http2Error(FRAME_SIZE_ERROR, "HEADERS too short for its priority")
            payload = payload[5:]
        if len(payload) > self._max_size:
            raise self._too_long()
        if flags & END_HEADERS:
            return self._decode(bytes(payload))
        self.continuing = (sid, bool(flags & END_STREAM), bytearray(payload))
        return None

    def more(self, flags: int, sid: int, payload) -> tuple | None:
        """A CONTINUATION frame's payload, which goes on the block its HEADERS began; once the
        block is whole, (its headers, whether that HEADERS frame ended the stream)."""
        if self.continuing is None or self.continuing[0] != sid:
            raise Http2Error(PROTOCOL_ERROR, "CONTINUATION without its HEADERS")
        _, end_stream, block = self.continuing
        block += payload
        if len(block) > self._max_size:
            raise self._too_long()
        if flags & END_HEADERS:
            self.continuing = None
            return self._decode(bytes(block)), end_stream
        return None

    def _too_long(self) -> Http2Error:
        """A header block longer than the header list size this side advertised is not
        decoded: a block never decodes to fewer bytes than it has, near enough (each field
        counts 32 more)."""
        return Http2Error(COMPRESSION_ERROR, f"a header block longer than the {self._max_size} "
                                             f"bytes advertised (SETTINGS_MAX_HEADER_LIST_SIZE)")

    def _decode(self, block: bytes) -> list:
        headers = self._cache.get(block)
        if headers is not None:
            return headers
        _check_table_size_updates(block)
        self.decoded = True
        try:
            headers = self._decoder.decode(block, raw=True)
        except hpack.HPACKError as exc:
            raise Http2Error(COMPRESSION_ERROR, f"cannot decode a header block: {exc}") from None
        # One-byte indexed fields (every byte >= 0x80) change nothing in the table, so the
        # same bytes decode the same way until a block that may change it comes in.
        if block and min(block) >= 0x80:
            if len(block) <= _DECODED_CACHE_BLOCK:
                if len(self._cache) >= _DECODED_CACHE_SIZE:
                    self._cache.clear()
                self._cache[block] = headers
        elif self._cache:
            self._cache.clear()
        return headers


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
