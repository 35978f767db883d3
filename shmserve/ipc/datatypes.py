"""Triton wire datatypes: element sizes, numpy dtypes, config enum names.

Shared by the front and the workers (it lives in `ipc` because tensor references carry a
datatype). All fixed-size types are little-endian on the wire. BYTES elements are a 4-byte
little-endian length followed by the bytes. BF16 has no numpy dtype: its bytes travel as
uint16 storage.
"""

import numpy as np

# wire name -> (numpy dtype used for the bytes, element size in bytes; 0 = variable)
_TABLE = {
    "BOOL": (np.dtype(np.bool_), 1),
    "UINT8": (np.dtype("<u1"), 1),
    "UINT16": (np.dtype("<u2"), 2),
    "UINT32": (np.dtype("<u4"), 4),
    "UINT64": (np.dtype("<u8"), 8),
    "INT8": (np.dtype("<i1"), 1),
    "INT16": (np.dtype("<i2"), 2),
    "INT32": (np.dtype("<i4"), 4),
    "INT64": (np.dtype("<i8"), 8),
    "FP16": (np.dtype("<f2"), 2),
    "FP32": (np.dtype("<f4"), 4),
    "FP64": (np.dtype("<f8"), 8),
    "BF16": (np.dtype("<u2"), 2),
    "BYTES": (np.dtype(np.object_), 0),
}

WIRE_TYPES = frozenset(_TABLE)

# config.pbtxt enum name (TYPE_*) <-> wire name
_CONFIG_TO_WIRE = {
    "TYPE_BOOL": "BOOL",
    "TYPE_UINT8": "UINT8",
    "TYPE_UINT16": "UINT16",
    "TYPE_UINT32": "UINT32",
    "TYPE_UINT64": "UINT64",
    "TYPE_INT8": "INT8",
    "TYPE_INT16": "INT16",
    "TYPE_INT32": "INT32",
    "TYPE_INT64": "INT64",
    "TYPE_FP16": "FP16",
    "TYPE_FP32": "FP32",
    "TYPE_FP64": "FP64",
    "TYPE_STRING": "BYTES",
    "TYPE_BF16": "BF16",
}
_WIRE_TO_CONFIG = {v: k for k, v in _CONFIG_TO_WIRE.items()}


def element_size(datatype: str) -> int:
    """Bytes per element; 0 for BYTES (variable). KeyError for unknown types."""
    return _TABLE[datatype][1]


def numpy_dtype(datatype: str) -> np.dtype:
    return _TABLE[datatype][0]


def config_to_wire(config_type: str) -> str:
    return _CONFIG_TO_WIRE[config_type]


def wire_to_config(datatype: str) -> str:
    return _WIRE_TO_CONFIG[datatype]


def wire_from_numpy(dtype: np.dtype) -> str:
    """Wire datatype for a numpy dtype (object/bytes/str arrays are BYTES)."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return "BOOL"
    if dtype.kind in "OSU":
        return "BYTES"
    little = dtype.newbyteorder("<") if dtype.byteorder == ">" else dtype
    for name, (dt, _) in _TABLE.items():
        if name not in ("BF16", "BYTES", "BOOL") and dt == little:
            return name
    raise ValueError(f"unsupported numpy dtype {dtype}")


def byte_length(data) -> int:
    """The length in bytes of tensor bytes held as bytes, bytearray or a memoryview (whose
    len() counts items, not bytes)."""
    return data.nbytes if type(data) is memoryview else len(data)


def element_count(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def serialize_bytes(values) -> bytes:
    """Encode an iterable of bytes/str as Triton BYTES (4-byte LE length + data each)."""
    parts = []
    for v in values:
        if isinstance(v, str):
            v = v.encode("utf-8")
        elif not isinstance(v, (bytes, bytearray, memoryview)):
            v = str(v).encode("utf-8")
        parts.append(len(v).to_bytes(4, "little"))
        parts.append(bytes(v))
    return b"".join(parts)


def deserialize_bytes(buffer, count: int = -1) -> list:
    """Decode Triton BYTES into a list of `bytes`. Raises ValueError on a malformed buffer.

    With count >= 0 the buffer must hold exactly `count` elements.
    """
    mv = memoryview(buffer).cast("B")
    out = []
    pos = 0
    end = len(mv)
    while pos < end:
        if pos + 4 > end:
            raise ValueError("truncated BYTES element length")
        n = int.from_bytes(mv[pos:pos + 4], "little")
        pos += 4
        if pos + n > end:
            raise ValueError("BYTES element length exceeds the buffer")
        out.append(bytes(mv[pos:pos + n]))
        pos += n
    if count >= 0 and len(out) != count:
        raise ValueError(f"expected {count} BYTES elements, found {len(out)}")
    return out


class BytesLayoutError(ValueError):
    """The bytes of a BYTES tensor do not hold its elements. `problem`, in the order Triton
    looks for them: "length" (fewer than 4 bytes left for an element's length), "many" (an
    element past the count: `found` is its number), "data" (the last element runs past the
    end: `size` its length), "few" (`found` elements, fewer than the count). `available`:
    the bytes left where the problem was found."""

    def __init__(self, problem: str, found: int = 0, size: int = 0, available: int = 0):
        super().__init__(f"{problem}: element {found}, length {size}, {available} bytes left")
        self.problem = problem
        self.found = found
        self.size = size
        self.available = available

    def describe(self, name: str, model: str, count: int) -> str:
        """Triton's words for it, for input `name` of `count` elements. All but "data" follow
        the request's ID in Triton's answer: its Python backend finds that one, as it reads
        the elements of a request that passed validation."""
        if self.problem == "length":
            return (f"incomplete string length indicator for inference input '{name}' for "
                    f"model '{model}', expecting 4 bytes but only {self.available} bytes "
                    f"available. Please make sure the string length indicator is in one buffer.")
        if self.problem == "many":
            return (f"unexpected number of string elements {self.found} for inference input "
                    f"'{name}' for model '{model}', expecting {count}")
        if self.problem == "data":
            return (f"incomplete string data for inference input '{name}', expecting string of "
                    f"length {self.size} but only {self.available} bytes available")
        return (f"expected {count} string elements for inference input '{name}' for model "
                f"'{model}', got {self.found}")


def check_bytes(buffer, count: int) -> None:
    """Check that `buffer` holds exactly `count` well-formed BYTES elements (BytesLayoutError)."""
    mv = memoryview(buffer).cast("B") if isinstance(buffer, memoryview) else memoryview(buffer)
    end = len(mv)
    pos = 0
    found = 0
    from_bytes = int.from_bytes
    while pos < end:
        if pos + 4 > end:
            raise BytesLayoutError("length", found, available=end - pos)
        size = from_bytes(mv[pos:pos + 4], "little")
        pos += 4
        found += 1
        if found > count:
            raise BytesLayoutError("many", found)
        if pos + size > end:
            # Triton counts an element cut short; only when the count is right does it say
            # the element is cut short.
            if found == count:
                raise BytesLayoutError("data", found, size, end - pos)
            break
        pos += size
    if found != count:
        raise BytesLayoutError("few", found)
