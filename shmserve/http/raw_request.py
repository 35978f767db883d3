"""HTTP raw binary requests: a body that is the bytes of the model's only input (Triton's
binary tensor extension with an Inference-Header-Content-Length of 0).

Unlike the rest of the HTTP codec (codec.py), decoding one needs the model's signature: it
names the input, and its dims give the shape, with a variable dimension deduced from the
body's length. The request is batch 1, and every output is returned.
"""

from shmserve.admission import check_byte_size
from shmserve.errors import Code, ReadError, ServerError
from shmserve.inference import InferRequest, InputTensor
from shmserve.ipc import datatypes


def decode_raw_request(name: str, version: str, sig, body,
                       max_tensor_bytes: int) -> InferRequest:
    """The request of model `name` (signature `sig`) whose body is the raw bytes of its only
    input; tensors above `max_tensor_bytes` are refused."""
    if len(sig.inputs) != 1:
        raise ServerError(Code.INVALID_ARG, f"[request id: <id_unknown>] Raw request must "
                                            f"only have 1 input (found 1) to be deduced but "
                                            f"got {len(sig.inputs)} inputs in '{name}' model "
                                            f"configuration")
    (spec,) = sig.inputs.values()
    dims = list(spec.dims)
    nbytes = len(body)
    if spec.datatype == "BYTES":
        if len(dims) > 1 or (dims and dims[0] not in (-1, 1)):
            raise ServerError(Code.INVALID_ARG, f"Raw request for BYTES input '{spec.name}' "
                                                f"of model '{name}' must have shape [1]")
        dims = [1] * len(dims)
    elif dims.count(-1) > 1:
        raise ServerError(Code.INVALID_ARG, f"Raw request for model '{name}' cannot deduce "
                                            f"the shape of input '{spec.name}' with more "
                                            f"than one variable-size dimension")
    elif -1 in dims:
        known = datatypes.element_count(d for d in dims if d != -1) * datatypes.element_size(spec.datatype)
        dims[dims.index(-1)] = nbytes // known if known else 0
    shape = ([1] if sig.max_batch_size > 0 else []) + dims
    try:
        # Triton names the body's tensor 'raw_input' in what it finds wrong with its size.
        check_byte_size(InputTensor("raw_input", spec.datatype, shape, body), body, name,
                        max_tensor_bytes)
    except ReadError:
        raise
    except ServerError as exc:
        raise ServerError(exc.code, f"[request id: <id_unknown>] {exc.message}") from None
    return InferRequest(name, version, inputs=[InputTensor(spec.name, spec.datatype, shape, body)])
