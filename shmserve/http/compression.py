"""HTTP body compression as Triton accepts it: gzip and deflate (zlib format), both ways."""

import zlib

from shmserve.errors import Code, ServerError

# wbits for zlib: 16+ = gzip framing, plain = zlib framing ("deflate" in HTTP).
_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


def decompress(body: bytes, encoding: str, limit: int) -> bytes:
    """Inflate a request body, refusing to grow it past `limit` bytes (a small body may
    claim to inflate to gigabytes)."""
    wbits = _WBITS.get(encoding.strip().lower())
    if wbits is None:
        raise ServerError(Code.UNSUPPORTED, f"unsupported Content-Encoding '{encoding}'")
    inflater = zlib.decompressobj(wbits)
    try:
        out = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise ServerError(Code.INVALID_ARG, f"failed to decompress the request body: {exc}") from None
    if len(out) > limit or inflater.unconsumed_tail:
        raise ServerError(Code.INVALID_ARG,
                          f"decompressed request body exceeds the maximum input size of {limit} bytes")
    if not inflater.eof:
        raise ServerError(Code.INVALID_ARG, "failed to decompress the request body: truncated data")
    return out


def choose(accept_encoding: str):
    """The encoding to answer with for an Accept-Encoding header, or None."""
    offered = [part.split(";")[0].strip().lower() for part in accept_encoding.split(",")]
    for name in ("gzip", "deflate"):
        if name in offered:
            return name
    return None


def compress(body, encoding: str) -> bytes:
    """Compress a bytes-like body (bytes or memoryview) with the chosen encoding."""
    deflater = zlib.compressobj(6, zlib.DEFLATED, _WBITS[encoding])
    return deflater.compress(body) + deflater.flush()
