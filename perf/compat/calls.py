"""How the probe asks a server and takes its answer: the requests' parts (tensors, binary bodies,
ModelInferRequests), and each way of sending one (HTTP, HTTP on a raw socket, the response
headers, a gRPC call, a ModelStreamInfer stream), each answer in a form two servers' answers can
be compared in (JSON parsed, since key order may differ; status codes by name)."""
import http.client
import json
import socket
import struct

import grpc
from tritonclient.grpc import service_pb2 as pb


M = "/v2/models/identity_fp32"
F4 = struct.pack("<4f", 1, 2, 3, 4)


def http_call(port, method, path, body=None, headers=None, timeout=10):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    if isinstance(body, (dict, list)):
        body = json.dumps(body).encode()
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        data = resp.read()
    except TimeoutError:
        return f"no answer within {timeout} s"
    finally:
        conn.close()
    head_length = resp.getheader("Inference-Header-Content-Length")
    if head_length is not None and head_length.isdigit():
        # Binary outputs: the JSON header compared as JSON (its key order may differ), then
        # the bytes after it.
        try:
            return resp.status, json.loads(data[:int(head_length)]), data[int(head_length):]
        except ValueError:
            pass
    try:
        return resp.status, json.loads(data)
    except ValueError:
        return resp.status, data[:400].decode(errors="replace")


def inp(**kw):
    tensor = {"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}
    tensor.update(kw)
    return {key: value for key, value in tensor.items() if value is not None}


def binary(header: dict, raw: bytes, length=None):
    head = json.dumps(header).encode()
    return head + raw, {"Inference-Header-Content-Length": str(len(head) if length is None else length)}


T = "/v2/models/all_types/infer"
NUMPY_TYPES = {"BOOL": "?", "UINT8": "<u1", "UINT16": "<u2", "UINT32": "<u4", "UINT64": "<u8",
               "INT8": "<i1", "INT16": "<i2", "INT32": "<i4", "INT64": "<i8", "FP16": "<f2",
               "FP32": "<f4", "FP64": "<f8"}


def raw_of(datatype: str, values: list) -> bytes:
    if datatype == "BYTES":
        items = [v.encode() if isinstance(v, str) else v for v in values]
        return b"".join(struct.pack("<I", len(item)) + item for item in items)
    import numpy as np
    return np.array(values, NUMPY_TYPES[datatype]).tobytes()


def raw_exchange(port, data: bytes, responses: int):
    """What a server answers to `data` written as it is on one connection: each of the
    `responses` answers' status and body, in order."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(data)
        stream = sock.makefile("rb")

        class Kept:  # HTTPResponse closes its stream at the end of a body: not this one
            def __getattr__(self, name):
                return getattr(stream, name)

            def close(self):
                pass

        class OneStream:  # every response read from the same buffered stream
            def makefile(self, *args, **kwargs):
                return Kept()
        answers = []
        try:
            for _ in range(responses):
                resp = http.client.HTTPResponse(OneStream())
                resp.begin()
                body = resp.read()
                try:
                    answers.append((resp.status, json.loads(body)))
                except ValueError:
                    answers.append((resp.status, body[:200].decode(errors="replace")))
        except (OSError, ValueError, http.client.HTTPException) as exc:
            answers.append(type(exc).__name__)
        return answers


HEADERS_COMPARED = ("content-type", "inference-header-content-length", "content-encoding")


def http_headers(port, method, path, body=None, headers=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        if isinstance(body, dict):
            body = json.dumps(body).encode()
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        resp.read()
    finally:
        conn.close()
    return resp.status, {key: resp.getheader(key) for key in HEADERS_COMPARED if resp.getheader(key)}


def grpc_request(model="identity_fp32", version="", name="INPUT0", datatype="FP32", shape=(1, 4), raw=(F4,),
                 outputs=(), params=None):
    request = pb.ModelInferRequest(model_name=model, model_version=version)
    request.inputs.add(name=name, datatype=datatype, shape=list(shape))
    request.raw_input_contents.extend(raw)
    for output in outputs:
        request.outputs.add(name=output)
    for key, value in (params or {}).items():
        if isinstance(value, bool):
            request.parameters[key].bool_param = value
        elif isinstance(value, int):
            request.parameters[key].int64_param = value
        else:
            request.parameters[key].string_param = value
    return request


def grpc_answer(stub, method, request):
    try:
        reply = getattr(stub, method)(request, timeout=30)
    except grpc.RpcError as e:
        return e.code().name, e.details()
    return "OK", str(reply)


def stream_answer(channel, requests, metadata):
    call = channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer",
                                 request_serializer=pb.ModelInferRequest.SerializeToString,
                                 response_deserializer=pb.ModelStreamInferResponse.FromString)
    answers = []
    try:
        for reply in call(iter(requests), metadata=metadata, timeout=30):
            response = reply.infer_response
            answers.append(("error", reply.error_message, response.id, response.model_name,
                            response.model_version,
                            sorted((k, str(v)) for k, v in response.parameters.items()))
                           if reply.error_message else
                           ("response", response.id, response.model_name, response.model_version,
                            [(o.name, o.datatype, list(o.shape), sorted(
                                (k, str(v)) for k, v in o.parameters.items()))
                             for o in response.outputs],
                            _contents(response),
                            sorted((k, str(v)) for k, v in response.parameters.items())))
    except grpc.RpcError as e:
        answers.append(("status", e.code().name, e.details()))
    return answers


def _contents(response) -> list:
    """Each output's raw bytes; a BYTES output's as its elements' text, so that REWORDED
    applies to what a model wrote."""
    contents = []
    for output, raw in zip(response.outputs, response.raw_output_contents):
        if output.datatype != "BYTES":
            contents.append(raw)
            continue
        elements, pos = [], 0
        while pos < len(raw):
            size = struct.unpack_from("<I", raw, pos)[0]
            elements.append(raw[pos + 4:pos + 4 + size].decode(errors="replace"))
            pos += 4 + size
        contents.append(elements)
    return contents
