"""Same requests, same answers? Sends one battery of requests to the real Triton (the anchors)
and to shmserve, both serving a copy of perf/triton_repo (and model_repository/textgen,
tests/models/params_echo, keyword_inputs and sender_misuse) at once, and prints every answer that
differs.

    .venv/bin/python perf/compat_probe.py [--anchors DIR] [--verbose]

The battery: HTTP requests good and bad (status and body), gRPC unary calls (status code and
message, or the reply), every datatype in and out over both protocols (all_types), the
endpoints asked other ways, a model using many config fields (config_features),
ModelStreamInfer streams, sequences over HTTP, the faults of Python models (model_faults,
stream_faults), failed BLS calls (bls_faults), BLS calls from a decoupled model (bls_stream),
ensembles and a faulty step (ens_faults), generate bodies with a key twice and Triton's
generate errors (generate_key_cases), system shared memory over both protocols, the
response headers a client reads, the metadata and config of every model, the repository
index, and the metric families (names, types and label keys; not values). After each request
and stream of the battery, what it added to each model's statistics counts and request
counters (metrics, failures by reason) is compared too ("counted <case>"). Then both servers start again in explicit model control, on a copy of the
repository, for a sequence of loads (unknown models, config overrides good and bad, model
files, models that fail to load), unloads (with dependents), indexes, and requests to models
not loaded. Answers that depend on time or load (durations) are not compared. KNOWN lists the
differences kept on purpose, each with its reason (mostly where ../shared/reference states a
behaviour that Triton 2.51 does not have, or where Triton's answer is a fault of its own); any
other difference makes the exit status 1.
"""
import argparse
import base64
import contextlib
import gzip
import os
import shutil
import socket
import http.client
import json
import re
import struct
import sys
import time
import urllib.request

import grpc
from google.protobuf import json_format
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from servers import (PERF_DIR, REPO_ROOT, ServerError, ShmServer, TritonServer, add_server_arguments,
                     anchors_env)

M = "/v2/models/identity_fp32"
F4 = struct.pack("<4f", 1, 2, 3, 4)

# Case name -> why its answers may differ.
KNOWN = {
    "GET /v2": "server name and version",
    "grpc server metadata": "server name and version",
    "transport pipelined, the first bad": "malformed JSON: 400 as the reference says (Triton 2.51: 500); the "
                                          "request after it gets the same answer",
    "transport lower-case method": "Triton 2.51 closes the connection without an answer; shmserve answers 400",
    "infer empty body": "Triton 2.51 runs the model on no inputs and answers 200",
    "infer gzip label on plain body": "Triton 2.51 ignores the failed inflate and runs the model on no inputs",
    "infer header length not a number": "the reference: 400 for a bad Inference-Header-Content-Length",
    "infer br": "same status; shmserve's message names the encoding",
    "grpc two raw contents for one input": "Triton 2.51 ignores the extra raw_input_contents entry",
    "stream triton_grpc_error": "the reference: the first error ends the stream (Triton 2.51 goes on)",
    "shm register missing key": "same status; shmserve adds the OS's reason",
    "grpc shm register missing key": "same status; shmserve adds the OS's reason",
    "grpc cuda register short handle": "same status; shmserve says what is wrong with the handle",
    "infer bad datatype": "same status; shmserve names the datatype",
    "grpc infer bad datatype": "same status; shmserve names the datatype",
    "config ens_identity2": "the reference's model_config has ensemble_scheduling.max_inflight_requests, Triton 2.51's has not",
    "config ens_identity4": "as ens_identity2",
    "config ens_faults": "as ens_identity2",
    "config ens_repeat": "as ens_identity2",
    "ensemble fault 0": "the same outputs in another order: Triton's ensemble lists them in its hash table's order",
    **{case: "as 'ensemble fault 0' (OUT and IDX: Triton lists IDX first)"
       for case in ("stream ensemble", "stream ensemble sequence fields",
                    "stream ensemble empty final response", "stream ensemble unknown input, then on")},
    "headers ready": "Triton labels an empty body text/plain; shmserve sends no Content-Type for it",
    "headers unknown path": "Triton labels its JSON error body text/plain",
    "shm register past the end": "the reference: INVALID_ARG for a region beyond the object (Triton 2.51: 500 'Invalid shared memory region')",
    "explicit load not json config": "Triton 2.51: 500 'failed to poll from model repository', the reason only in its log; shmserve: 400, Triton's text then the reason",
    "grpc explicit load bad config": "as 'explicit load not json config' (INTERNAL / INVALID_ARGUMENT)",
    "explicit load config of another name": "as 'explicit load not json config'",
    "explicit load file without config": "as 'explicit load not json config'",
    "explicit load unknown_field": "as 'explicit load not json config'; after it, Triton's index lists the model by name only, shmserve's UNAVAILABLE with the reason",
    "explicit infer with loaded files": "Triton 2.51 accepts the model.py sent with the load, yet runs the repository's (identity); shmserve runs the one sent (doubling)",
    "grpc shm register unaligned offset": "Triton mmaps the offset, which must be page-aligned (the reference); shmserve takes any offset",
    "metrics": "shmserve_ histograms Triton lacks; no pinned memory pool; nv_model_load_duration_secs newer than 2.51",
    "model fault 12": "execute returned None without answering: Triton 2.51 never answers, shmserve fails the request",
    "model fault 17": "the class named in the message is shmserve's InferenceResponse",
    "stream fault 8": "send() given a str: the TypeError's text is pybind's in Triton, ours in shmserve",
    "features optional input of another batch": "Triton checks a request's inputs in its hash table's order, "
                                                "shmserve in the request's: each names another input",
    "features required input missing": "Triton 2.51 only counts the inputs of a model with optional ones (2 is "
                                       "between 1 and 3) and runs it without the required one; shmserve refuses "
                                       "the request (400)",
    **{f"counted {case}": "Triton 2.51 counts a failed ensemble request twice in the ensemble's fail "
                          "count; shmserve once"
       for case in ("ensemble fault 1", "ensemble fault 2", "ensemble fault 3", "ensemble fault 10",
                    "ensemble fault 11", "generate ensemble whose step raises", "bls fault 14",
                    "stream bls 6")},
    "counted stream fault 5": "the model raises after its final response: Triton counts the request failed, "
                              "shmserve, whose answer was whole, a success",
    "stream identity triton_grpc_error": "as 'stream triton_grpc_error'",
    "textgen generate_stream no text": "as 'features required input missing' (the model itself says "
                                       "'text_input' is required, as an event)",
    **{f"generate{case}": "the model reads the same parameters: Triton hands a Python model every setting of a "
                          "key given twice ('{\"p\":1,\"p\":1}', the first value each time; at both levels "
                          "'{\"p\":1,\"p\":2}'), shmserve each key once, with the value json.loads takes from "
                          "Triton's (the first at its level, the last set)"
       for case in (" parameter twice", " parameter twice, the second bad", " parameter at both levels",
                    " parameters twice", " id twice")},
    "generate triton_ parameter": "the reference refuses triton_ parameters over HTTP (400); Triton 2.51's "
                                  "generate passes them to the model",
    "generate reserved parameters": "shmserve gives priority, timeout and binary_data_output their meaning "
                                    "in generate too, and keeps them from the model; Triton 2.51's generate "
                                    "passes them to the model as any other parameter",
    "types output listed twice": "Triton since 2.69 refuses an output requested twice ('output ... already "
                                 "exists in request'); Triton 2.51 answers it once",
    **{case: "Triton 2.51 writes the response sent, then an error object, into one 500 body (gRPC: "
             "INTERNAL); shmserve delivers the response sent and logs the failure (issue 59: Triton "
             "delivers the first response and drops the extra)"
       for case in ("response sender misuse twice", "grpc response sender misuse twice")},
    **{f"counted {case}": "the client got the response sent: shmserve counts a success, Triton 2.51 a "
                          "BACKEND failure"
       for case in ("response sender misuse twice", "response sender misuse returned",
                    "grpc response sender misuse twice")},
    **{case: "InferenceResponse(parameters=) is newer than Triton 2.51 (python_backend 2.55): its model "
             "raises TypeError"
       for case in ("response parameters", "grpc response parameters")},
    **{case: "the same reason, and after it the exit the front saw"
       for case in ("explicit load init_exits", "explicit index after broken loads", "grpc explicit index")},
    "bls fault 5": "a BLS response's error keeps its code (INVALID_ARG), as Triton's Python backend since "
                   "2.58; Triton 2.51 made it INTERNAL",
    "HEAD live": "shmserve answers HEAD wherever GET is allowed (RFC 9110); Triton 2.51: 405",
    "logging bad format": "the same message; Triton 2.51 answers 503 (UNAVAILABLE), shmserve 400",
    "metadata, name percent-encoded": "tritonclient percent-encodes model names in URLs and shmserve decodes "
                                      "them; Triton 2.51 looks the encoded name up",
    "trace set bad level": "Triton 2.51 takes an unknown trace level as OFF; shmserve refuses it (400)",
    "batch of 0": "Triton 2.51 words a batch of 0 as a byte size mismatch ('Expected 16, got 0', as "
                  "for a batch of 1); shmserve says the batch size must be at least 1",
    **{f"types {case}": "Triton 2.51 wraps an integer out of its datatype's range (256 as UINT8 is 0); "
                        "shmserve refuses it (400)"
       for case in ("UINT8 256", "INT8 -129", "INT16 40000", "UINT32 2^32")},
}
# shmserve's wording -> Triton 2.51's, where the reference words it as shmserve does.
REWORDED = (
    ("Failed to process the request(s) for model instance '", "Failed to process the request(s) for model '"),
)
# Triton answers 500 where the reference asks for 400 (malformed JSON, bad parameters): only
# the status and message differ, and those cases are recognised by this pattern of its answer.
TRITON_PARSE_500 = re.compile(r"^(Converting keyword: '[^']*': )?(Unable to parse|failed to parse the request JSON "
                              r"buffer|attempt to access JSON|attempt to get members for non-object|Expected JSON "
                              r"object for keyword)")


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
# Two values of each datatype, at the ends of its range where it has ends.
TYPE_VALUES = {
    "BOOL": [True, False], "UINT8": [0, 255], "UINT16": [0, 65535], "UINT32": [0, 2**32 - 1],
    "UINT64": [0, 2**64 - 1], "INT8": [-128, 127], "INT16": [-32768, 32767],
    "INT32": [-2**31, 2**31 - 1], "INT64": [-2**63, 2**63 - 1], "FP16": [0.1, 65504.0],
    "FP32": [0.1, 3.4e38], "FP64": [0.1, 1e308], "BYTES": ["abc", "\u00fc\u0000z"],
}
NUMPY_TYPES = {"BOOL": "?", "UINT8": "<u1", "UINT16": "<u2", "UINT32": "<u4", "UINT64": "<u8",
               "INT8": "<i1", "INT16": "<i2", "INT32": "<i4", "INT64": "<i8", "FP16": "<f2",
               "FP32": "<f4", "FP64": "<f8"}
# ModelInferRequest's typed contents field of each datatype (FP16 has none).
TYPED_FIELDS = {"BOOL": "bool_contents", "UINT8": "uint_contents", "UINT16": "uint_contents",
                "UINT32": "uint_contents", "UINT64": "uint64_contents", "INT8": "int_contents",
                "INT16": "int_contents", "INT32": "int_contents", "INT64": "int64_contents",
                "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents"}


def raw_of(datatype: str, values: list) -> bytes:
    if datatype == "BYTES":
        items = [v.encode() if isinstance(v, str) else v for v in values]
        return b"".join(struct.pack("<I", len(item)) + item for item in items)
    import numpy as np
    return np.array(values, NUMPY_TYPES[datatype]).tobytes()


def typed(datatype: str, shape, data, binary_output=False) -> dict:
    """An all_types request of one input."""
    request = {"inputs": [{"name": f"IN_{datatype}", "shape": shape, "datatype": datatype, "data": data}]}
    if binary_output:
        request["outputs"] = [{"name": f"OUT_{datatype}", "parameters": {"binary_data": True}}]
    return request


def datatype_cases():
    """all_types: each datatype in and out, as JSON and as binary, and values that do not fit."""
    cases = {}
    for datatype, values in TYPE_VALUES.items():
        cases[f"types json {datatype}"] = ("POST", T, typed(datatype, [2], values))
        cases[f"types binary output {datatype}"] = ("POST", T, typed(datatype, [2], values, True))
        raw = raw_of(datatype, values)
        body, head = binary({"inputs": [{"name": f"IN_{datatype}", "shape": [2], "datatype": datatype,
                                         "parameters": {"binary_data_size": len(raw)}}]}, raw)
        cases[f"types binary input {datatype}"] = ("POST", T, body, head)
        cases[f"types empty {datatype}"] = ("POST", T, typed(datatype, [0], []))
        cases[f"types 2x0 {datatype}"] = ("POST", T, typed(datatype, [2, 0], []))
    cases["types all at once"] = ("POST", T, {"inputs": [
        {"name": f"IN_{d}", "shape": [2], "datatype": d, "data": v} for d, v in TYPE_VALUES.items()]})
    cases["types none"] = ("POST", T, {"inputs": []})
    for name, datatype, data in (
            ("UINT8 256", "UINT8", [256]), ("UINT8 -1", "UINT8", [-1]), ("INT8 -129", "INT8", [-129]),
            ("INT16 40000", "INT16", [40000]), ("UINT32 2^32", "UINT32", [2**32]),
            ("UINT64 -1", "UINT64", [-1]), ("UINT64 2^64", "UINT64", [2**64]),
            ("INT64 2^63", "INT64", [2**63]), ("INT32 1.5", "INT32", [1.5]),
            ("INT32 1.0", "INT32", [1.0]), ("INT32 true", "INT32", [True]),
            ("FP16 1e5", "FP16", [1e5]), ("FP64 integer", "FP64", [3]),
            ("BOOL 1", "BOOL", [1]), ("BOOL string", "BOOL", ["true"]), ("BOOL null", "BOOL", [None]),
            ("BYTES number", "BYTES", [1]), ("BYTES list", "BYTES", [["a"]]),
            ("BYTES bool", "BYTES", [True]), ("INT32 string", "INT32", ["1"]),
            ("INT32 null", "INT32", [None]), ("INT32 object", "INT32", [{"a": 1}])):
        cases[f"types {name}"] = ("POST", T, typed(datatype, [len(data)], data))
    for name, datatype, raw, size in (
            ("BYTES binary truncated length", "BYTES", b"\x03\x00", 2),
            ("BYTES binary length past the end", "BYTES", struct.pack("<I", 9) + b"abc", 7),
            ("BYTES binary one element for two", "BYTES", raw_of("BYTES", ["a"]), 5),
            ("BYTES binary three elements for two", "BYTES", raw_of("BYTES", ["a", "b", "c"]), 15),
            ("BYTES binary five elements for two", "BYTES", raw_of("BYTES", list("abcde")), 25),
            ("BYTES binary two elements and 2 bytes", "BYTES", raw_of("BYTES", ["a", "b"]) + b"\x00\x00", 12),
            ("BYTES binary two elements, the second past the end", "BYTES",
             raw_of("BYTES", ["a"]) + struct.pack("<I", 5) + b"bc", 11),
            ("BYTES binary empty elements", "BYTES", raw_of("BYTES", ["", ""]), 8),
            ("INT64 binary short", "INT64", bytes(12), 12),
            ("BOOL binary 2", "BOOL", b"\x02\x01", 2),
            ("FP16 binary", "FP16", raw_of("FP16", [1.5, -2.0]), 4)):
        body, head = binary({"inputs": [{"name": f"IN_{datatype}", "shape": [2], "datatype": datatype,
                                         "parameters": {"binary_data_size": size}}]}, raw)
        cases[f"types {name}"] = ("POST", T, body, head)
    raw0 = {"Inference-Header-Content-Length": "0"}
    cases.update({
        # Raw binary requests: the body is the only input's bytes, as batch 1.
        "raw binary": ("POST", M + "/infer", F4, raw0),
        "raw binary odd size": ("POST", M + "/infer", F4[:6], raw0),
        "raw binary empty": ("POST", M + "/infer", b"", raw0),
        "raw binary multi-input model": ("POST", T, raw_of("INT32", [1]), raw0),
        "raw binary BYTES model": ("POST", "/v2/models/bls_faults/infer", raw_of("BYTES", ["a"]), raw0),
        # What a request asks of its outputs.
        "types output subset": ("POST", T, {"inputs": [
            {"name": "IN_INT32", "shape": [1], "datatype": "INT32", "data": [1]},
            {"name": "IN_FP64", "shape": [1], "datatype": "FP64", "data": [2]}],
            "outputs": [{"name": "OUT_FP64"}]}),
        "types output not produced": ("POST", T, {"inputs": [
            {"name": "IN_INT32", "shape": [1], "datatype": "INT32", "data": [1]}],
            "outputs": [{"name": "OUT_FP64"}]}),
        "types output listed twice": ("POST", T, {"inputs": [
            {"name": "IN_INT32", "shape": [1], "datatype": "INT32", "data": [1]}],
            "outputs": [{"name": "OUT_INT32"}, {"name": "OUT_INT32", "parameters": {"binary_data": True}}]}),
        "types input listed twice": ("POST", T, {"inputs": [
            {"name": "IN_INT32", "shape": [1], "datatype": "INT32", "data": [1]},
            {"name": "IN_INT32", "shape": [1], "datatype": "INT32", "data": [2]}]}),
        "types binary_data_output with a JSON output listed": ("POST", T, {"inputs": [
            {"name": "IN_INT32", "shape": [1], "datatype": "INT32", "data": [1]},
            {"name": "IN_FP64", "shape": [1], "datatype": "FP64", "data": [2]}],
            "outputs": [{"name": "OUT_FP64", "parameters": {"binary_data": False}}],
            "parameters": {"binary_data_output": True}}),
        "types classification of INT32": ("POST", T, {"inputs": [
            {"name": "IN_INT32", "shape": [3], "datatype": "INT32", "data": [5, 9, 1]}],
            "outputs": [{"name": "OUT_INT32", "parameters": {"classification": 2}}]}),
        # Not among them: classification of a BYTES output, which ends Triton 2.51's process
        # (shmserve: 400 "class result not available ... unsupported type 'BYTES'").
        "types classification of BOOL": ("POST", T, {"inputs": [
            {"name": "IN_BOOL", "shape": [2], "datatype": "BOOL", "data": [False, True]}],
            "outputs": [{"name": "OUT_BOOL", "parameters": {"classification": 1}}]}),
        "types classification past the count": ("POST", T, {"inputs": [
            {"name": "IN_FP64", "shape": [2], "datatype": "FP64", "data": [0.5, 2]}],
            "outputs": [{"name": "OUT_FP64", "parameters": {"classification": 5}}]}),
        "types classification 0": ("POST", T, {"inputs": [
            {"name": "IN_FP64", "shape": [2], "datatype": "FP64", "data": [0.5, 2]}],
            "outputs": [{"name": "OUT_FP64", "parameters": {"classification": 0}}]}),
        "types classification binary": ("POST", T, {"inputs": [
            {"name": "IN_FP64", "shape": [2], "datatype": "FP64", "data": [0.5, 2]}],
            "outputs": [{"name": "OUT_FP64", "parameters": {"classification": 1, "binary_data": True}}]}),
        # Request IDs and parameters of every type.
        "types empty id": ("POST", T, {"id": "", "inputs": []}),
        "types unicode id": ("POST", T, {"id": "r\u00e9q\u2713", "inputs": []}),
        "types parameters of every type": ("POST", T, {"inputs": [], "parameters": {
            "s": "x", "i": -3, "b": True, "f": 1.5}}),
        "types priority 1.5": ("POST", T, {"inputs": [], "parameters": {"priority": 1.5}}),
        "types priority string": ("POST", T, {"inputs": [], "parameters": {"priority": "1"}}),
        "types timeout true": ("POST", T, {"inputs": [], "parameters": {"timeout": True}}),
        "types sequence_id on a model without sequences": ("POST", T, {"inputs": [], "parameters": {
            "sequence_id": 5, "sequence_start": True}}),
        "types null parameter": ("POST", T, {"inputs": [], "parameters": {"x": None}}),
        "types object parameter": ("POST", T, {"inputs": [], "parameters": {"x": {"a": 1}}}),
        # Batched shapes on identity_fp32 (max_batch_size 64, dims [-1]).
        "batch of 3 rows": ("POST", M + "/infer", {"inputs": [inp(shape=[3, 2], data=[1, 2, 3, 4, 5, 6])]}),
        "batch of 0": ("POST", M + "/infer", {"inputs": [inp(shape=[0, 4], data=[])]}),
        "batch rows of 0": ("POST", M + "/infer", {"inputs": [inp(shape=[2, 0], data=[])]}),
        "batch rank 3": ("POST", M + "/infer", {"inputs": [inp(shape=[1, 2, 2])]}),
        "batch scalar": ("POST", M + "/infer", {"inputs": [inp(shape=[], data=[1])]}),
    })
    # config_features: reshapes, labels, priority levels, queue policies, two instances.
    features = "/v2/models/config_features/infer"
    row = {"name": "INPUT", "shape": [1, 4], "datatype": "FP32", "data": [0.5, 3, 1, 2]}
    extra = {"name": "EXTRA", "shape": [1, 3], "datatype": "INT64", "data": [1, 2, 3]}
    more = {"name": "MORE", "shape": [1, 1], "datatype": "BOOL", "data": [True]}
    for name, request in {
            "infer": {"inputs": [row]},
            "batch of 3": {"inputs": [dict(row, shape=[3, 4], data=list(range(12)))]},
            "batch of 9": {"inputs": [dict(row, shape=[9, 4], data=list(range(36)))]},
            "wrong dims": {"inputs": [dict(row, shape=[1, 5], data=list(range(5)))]},
            "reshaped shape": {"inputs": [dict(row, shape=[1, 2, 2])]},
            "optional input": {"inputs": [row, extra]},
            "optional input of another batch": {"inputs": [row, dict(extra, shape=[2, 3], data=list(range(6)))]},
            "required input missing": {"inputs": [extra, more]},
            "labels": {"inputs": [row], "outputs": [{"name": "OUTPUT", "parameters": {"classification": 3}}]},
            **{f"priority {p}": {"inputs": [row], "parameters": {"priority": p}} for p in (0, 1, 3, 4)},
            "timeout override": {"inputs": [row], "parameters": {"timeout": 50000}},
    }.items():
        cases[f"features {name}"] = ("POST", features, request)
    one = struct.pack("<I", 9) + b"abc"
    body, head = binary({"inputs": [{"name": "IN_BYTES", "shape": [1], "datatype": "BYTES",
                                     "parameters": {"binary_data_size": len(one)}}]}, one)
    cases["types BYTES binary one element past the end"] = ("POST", T, body, head)
    return cases


def grpc_datatype_cases():
    """all_types over gRPC: each datatype as raw bytes and in its typed contents field."""
    cases = {}
    for datatype, values in TYPE_VALUES.items():
        cases[f"grpc types raw {datatype}"] = ("ModelInfer", grpc_request(
            model="all_types", name=f"IN_{datatype}", datatype=datatype, shape=(2,),
            raw=(raw_of(datatype, values),)))
        field = TYPED_FIELDS.get(datatype, "fp32_contents")  # FP16: no field of its own
        request = grpc_request(model="all_types", name=f"IN_{datatype}", datatype=datatype,
                               shape=(2,), raw=())
        contents = [v.encode() for v in values] if datatype == "BYTES" else values
        getattr(request.inputs[0].contents, field).extend(contents)
        cases[f"grpc types typed {datatype}"] = ("ModelInfer", request)
    wrong = grpc_request(model="all_types", name="IN_INT32", datatype="INT32", shape=(2,), raw=())
    wrong.inputs[0].contents.fp32_contents.extend([1.0, 2.0])
    both = grpc_request(model="all_types", name="IN_INT32", datatype="INT32", shape=(2,),
                        raw=(raw_of("INT32", [1, 2]),))
    both.inputs[0].contents.int_contents.extend([1, 2])
    many = grpc_request(model="all_types", name="IN_INT32", datatype="INT32", shape=(2,), raw=())
    many.inputs[0].contents.int_contents.extend([1, 2, 3])
    def typed_request(datatype, shape, field, values):
        request = grpc_request(model="all_types", name=f"IN_{datatype}", datatype=datatype,
                               shape=shape, raw=())
        getattr(request.inputs[0].contents, field).extend(values)
        return request
    for name, request in {
            "too few": typed_request("INT32", (3,), "int_contents", [1, 2]),
            "BYTES too few": typed_request("BYTES", (3,), "bytes_contents", [b"a"]),
            "BYTES too many": typed_request("BYTES", (1,), "bytes_contents", [b"a", b"b"]),
            "BOOL too many": typed_request("BOOL", (1,), "bool_contents", [True, False]),
            "empty shape, no contents": typed_request("INT32", (0,), "int_contents", []),
            "UINT8 300": typed_request("UINT8", (1,), "uint_contents", [300]),
            "FP64 in fp32_contents": typed_request("FP64", (1,), "fp32_contents", [1.5]),
            "INT64 in int_contents": typed_request("INT64", (1,), "int_contents", [5]),
    }.items():
        cases[f"grpc types typed {name}"] = ("ModelInfer", request)
    int8 = grpc_request(model="all_types", name="IN_INT8", datatype="INT8", shape=(1,), raw=())
    int8.inputs[0].contents.int_contents.append(300)
    classify = grpc_request(model="all_types", name="IN_FP64", datatype="FP64", shape=(3,),
                            raw=(raw_of("FP64", [0.5, 2, 1]),))
    classify.outputs.add(name="OUT_FP64").parameters["classification"].int64_param = 2
    subset = grpc_request(model="all_types", name="IN_INT32", datatype="INT32", shape=(1,),
                          raw=(raw_of("INT32", [7]),), outputs=("OUT_FP64",))
    def with_parameter(key, choice, value, where="request"):
        request = grpc_request(model="all_types", name="IN_INT32", datatype="INT32", shape=(1,),
                               raw=(raw_of("INT32", [7]),), outputs=("OUT_INT32",))
        target = {"request": request, "input": request.inputs[0], "output": request.outputs[0]}[where]
        setattr(target.parameters[key], choice, value)
        return request
    for key, choice, value, where in (
            ("d", "double_param", 1.5, "request"), ("u", "uint64_param", 2**64 - 1, "request"),
            ("i", "int64_param", -2, "request"), ("priority", "uint64_param", 1, "request"),
            ("priority", "int64_param", 1, "request"), ("timeout", "uint64_param", 5, "request"),
            ("timeout", "int64_param", 5000000, "request"), ("timeout", "double_param", 5.0, "request"),
            ("sequence_id", "uint64_param", 3, "request"), ("d", "double_param", 1.5, "input"),
            ("u", "uint64_param", 1, "input"), ("d", "double_param", 1.5, "output"),
            ("binary_data", "bool_param", True, "output"),
            ("triton_enable_empty_final_response", "int64_param", 1, "request"),
            ("triton_enable_empty_final_response", "string_param", "true", "request")):
        cases[f"grpc types {where} parameter {key} {choice}"] = ("ModelInfer", with_parameter(key, choice, value, where))
    params = grpc_request(model="all_types", name="IN_INT32", datatype="INT32", shape=(1,),
                          raw=(raw_of("INT32", [7]),))
    params.id = "r\u00e9q"
    params.parameters["s"].string_param = "x"
    shaped = grpc_request(model="all_types", name="IN_INT32", datatype="INT32", shape=(2, 0), raw=(b"",))
    scalar = grpc_request(model="all_types", name="IN_INT32", datatype="INT32", shape=(), raw=(raw_of("INT32", [1]),))
    def step(value, sequence_id, choice="int64_param", **flags):
        request = grpc_request(model="accumulate", name="INPUT", datatype="INT32", shape=(1, 1),
                               raw=(raw_of("INT32", [value]),))
        setattr(request.parameters["sequence_id"], choice, sequence_id)
        for flag, on in flags.items():
            request.parameters[flag].bool_param = on
        return request
    cases.update({
        "grpc sequence step 1": ("ModelInfer", step(2, 92, sequence_start=True)),
        "grpc sequence step 2": ("ModelInfer", step(3, 92)),
        "grpc sequence step 3": ("ModelInfer", step(4, 92, sequence_end=True)),
        "grpc sequence string id": ("ModelInfer", step(1, "g1", "string_param", sequence_start=True, sequence_end=True)),
        "grpc sequence flag as int": ("ModelInfer", step(1, 93, sequence_start=True)),
    })
    cases["grpc sequence flag as int"][1].parameters["sequence_end"].int64_param = 1
    cases.update({
        "grpc types classification": ("ModelInfer", classify),
        "grpc types output not produced": ("ModelInfer", subset),
        "grpc types parameters": ("ModelInfer", params),
        "grpc types shape 2x0": ("ModelInfer", shaped),
        "grpc types scalar": ("ModelInfer", scalar),
        "grpc types typed in the wrong field": ("ModelInfer", wrong),
        "grpc types typed and raw": ("ModelInfer", both),
        "grpc types typed too many": ("ModelInfer", many),
        "grpc types typed INT8 300": ("ModelInfer", int8),
        "grpc types BYTES raw truncated": ("ModelInfer", grpc_request(
            model="all_types", name="IN_BYTES", datatype="BYTES", shape=(2,), raw=(b"\x01\x00\x00\x00a\x05",))),
    })
    return cases


def http_cases():
    plain = json.dumps({"inputs": [inp()]}).encode()
    body4, head4 = binary({"inputs": [inp(data=None, parameters={"binary_data_size": 16})]}, F4)
    cases = {
        "GET /v2": ("GET", "/v2"), "live": ("GET", "/v2/health/live"), "ready": ("GET", "/v2/health/ready"),
        "model metadata": ("GET", M), "version metadata": ("GET", M + "/versions/1"),
        "unknown version metadata": ("GET", M + "/versions/2"), "unknown model metadata": ("GET", "/v2/models/nope"),
        "model ready": ("GET", M + "/ready"), "ready unknown model": ("GET", "/v2/models/nope/ready"),
        "ready unknown version": ("GET", M + "/versions/7/ready"),
        "stats unknown model": ("GET", "/v2/models/nope/stats"),
        "stats unknown version": ("GET", M + "/versions/9/stats"),
        "index ready": ("POST", "/v2/repository/index", {"ready": True}),
        "load in none mode": ("POST", "/v2/repository/models/identity_fp32/load", {}),
        "unload in none mode": ("POST", "/v2/repository/models/identity_fp32/unload", {}),
        "infer": ("POST", M + "/infer", {"inputs": [inp()]}),
        **{f"response sender misuse {misuse}": ("POST", "/v2/models/sender_misuse/infer", {
            "inputs": [inp(shape=[4])], "parameters": {"misuse": misuse}})
           for misuse in ("twice", "returned")},
        "response parameters": ("POST", "/v2/models/params_echo/infer", {
            "inputs": [{"name": "INPUT0", "shape": [1], "datatype": "INT32", "data": [1]}],
            "parameters": {"reply_s": "x", "reply_n": 7, "reply_b": True}}),
        "infer id and output": ("POST", M + "/infer", {"id": "abc", "inputs": [inp()], "outputs": [{"name": "OUTPUT0"}]}),
        "infer unknown output": ("POST", M + "/infer", {"inputs": [inp()], "outputs": [{"name": "NOPE"}]}),
        "infer no inputs": ("POST", M + "/infer", {"inputs": []}),
        "infer no inputs key": ("POST", M + "/infer", {}),
        "infer empty body": ("POST", M + "/infer", b""),
        "infer not json": ("POST", M + "/infer", b"{not json"),
        "infer json array": ("POST", M + "/infer", b"[1,2]"),
        "infer unknown input": ("POST", M + "/infer", {"inputs": [inp(name="X")]}),
        "infer input twice": ("POST", M + "/infer", {"inputs": [inp(), inp()]}),
        "infer wrong datatype": ("POST", M + "/infer", {"inputs": [inp(datatype="INT32")]}),
        "infer bad datatype": ("POST", M + "/infer", {"inputs": [inp(datatype="FLOAT")]}),
        "infer no batch dim": ("POST", M + "/infer", {"inputs": [inp(shape=[4])]}),
        "infer batch too large": ("POST", M + "/infer", {"inputs": [inp(shape=[65, 1], data=[1.0] * 65)]}),
        "infer too few elements": ("POST", M + "/infer", {"inputs": [inp(shape=[1, 5])]}),
        "infer negative dim": ("POST", M + "/infer", {"inputs": [inp(shape=[1, -4])]}),
        "infer nested data": ("POST", M + "/infer", {"inputs": [inp(data=[[1, 2], [3, 4]])]}),
        "infer strings as FP32": ("POST", M + "/infer", {"inputs": [inp(data=["a", "b", "c", "d"])]}),
        "infer true as FP32": ("POST", M + "/infer", {"inputs": [inp(data=[1, 2, 3, True])]}),
        "infer FP32 overflow": ("POST", M + "/infer", {"inputs": [inp(data=[1e40, 2, 3, 4])]}),
        "infer NaN and infinities": ("POST", M + "/infer", b'{"inputs":[{"name":"INPUT0","shape":[1,3],'
                                     b'"datatype":"FP32","data":[NaN,Infinity,-Infinity]}]}'),
        "infer no data": ("POST", M + "/infer", {"inputs": [inp(data=None)]}),
        "infer no name": ("POST", M + "/infer", {"inputs": [{"shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}),
        "infer binary_data_output": ("POST", M + "/infer", {"inputs": [inp()], "parameters": {"binary_data_output": True}}),
        "infer priority": ("POST", M + "/infer", {"inputs": [inp()], "parameters": {"priority": 5}}),
        "infer negative timeout": ("POST", M + "/infer", {"inputs": [inp()], "parameters": {"timeout": -1}}),
        "infer list parameter": ("POST", M + "/infer", {"inputs": [inp()], "parameters": {"x": [1]}}),
        "infer number id": ("POST", M + "/infer", {"inputs": [inp()], "id": 5}),
        "infer classification": ("POST", M + "/infer", {"inputs": [inp()], "outputs": [
            {"name": "OUTPUT0", "parameters": {"classification": 2}}]}),
        "infer version 1": ("POST", M + "/versions/1/infer", {"inputs": [inp()]}),
        "infer version 3": ("POST", M + "/versions/3/infer", {"inputs": [inp()]}),
        "infer version x": ("POST", M + "/versions/x/infer", {"inputs": [inp()]}),
        "infer unknown model": ("POST", "/v2/models/nope/infer", {"inputs": [inp()]}),
        "GET infer": ("GET", M + "/infer"),
        "unknown path": ("GET", "/v2/nothing"),
        "infer binary": ("POST", M + "/infer", body4, head4),
        "infer header length not a number": ("POST", M + "/infer", body4, {"Inference-Header-Content-Length": "abc"}),
        "infer header length too large": ("POST", M + "/infer", body4, {"Inference-Header-Content-Length": "9999"}),
        "infer gzip label on plain body": ("POST", M + "/infer", plain, {"Content-Encoding": "gzip"}),
        "infer br": ("POST", M + "/infer", plain, {"Content-Encoding": "br"}),
        "infer decoupled model": ("POST", "/v2/models/repeat/infer", {"inputs": [
            {"name": "IN", "shape": [2], "datatype": "INT32", "data": [1, 2]}]}),
        "generate": ("POST", M + "/generate", {"INPUT0": [1, 2, 3, 4]}),
        "generate FP32 values": ("POST", M + "/generate", {"INPUT0": [0.1, 3.4e38]}),
        "generate one FP32 value": ("POST", M + "/generate", {"INPUT0": 0.1}),
        "generate decoupled model": ("POST", "/v2/models/repeat/generate", {"IN": [1, 2]}),
        "generate decoupled model sending none": ("POST", "/v2/models/repeat/generate", {"IN": []}),
        "generate_stream key order": ("POST", "/v2/models/repeat/generate_stream", {"IN": [1, 2]}),
        "generate not json": ("POST", M + "/generate", b"nope"),
        "shm status": ("GET", "/v2/systemsharedmemory/status"),
        "shm status unknown": ("GET", "/v2/systemsharedmemory/region/nope/status"),
        "shm unregister unknown": ("POST", "/v2/systemsharedmemory/region/nope/unregister"),
        "shm register missing key": ("POST", "/v2/systemsharedmemory/region/r1/register",
                                     {"key": "/shmserve_probe_absent", "offset": 0, "byte_size": 64}),
        "cuda shm status": ("GET", "/v2/cudasharedmemory/status"),
        "logging": ("GET", "/v2/logging"),
        "logging bad level": ("POST", "/v2/logging", {"log_verbose_level": "x"}),
        "trace setting": ("GET", "/v2/trace/setting"),
        "model trace setting": ("GET", M + "/trace/setting"),
    }
    cases.update({  # the endpoints asked another way
        "HEAD live": ("HEAD", "/v2/health/live"), "POST live": ("POST", "/v2/health/live"),
        "live with a trailing slash": ("GET", "/v2/health/live/"),
        "metadata with a trailing slash": ("GET", M + "/"),
        "metadata, versions without one": ("GET", M + "/versions/"),
        "metadata, name percent-encoded": ("GET", "/v2/models/identity%5Ffp32"),
        "metadata, name in other case": ("GET", "/v2/models/Identity_fp32"),
        "metadata, version 01": ("GET", M + "/versions/01"),
        "metadata, version -1": ("GET", M + "/versions/-1"),
        "metadata, query string": ("GET", M + "?x=1"),
        "DELETE model": ("DELETE", M), "PUT infer": ("PUT", M + "/infer", {"inputs": [inp()]}),
        "version config": ("GET", M + "/versions/1/config"),
        "GET index": ("GET", "/v2/repository/index"),
        "index ready not bool": ("POST", "/v2/repository/index", {"ready": "yes"}),
        "index not json": ("POST", "/v2/repository/index", b"{"),
        "logging set": ("POST", "/v2/logging", {"log_verbose_level": 0, "log_info": True}),
        "logging unknown setting": ("POST", "/v2/logging", {"log_colour": True}),
        "logging format": ("POST", "/v2/logging", {"log_format": "ISO8601"}),
        "logging bad format": ("POST", "/v2/logging", {"log_format": "xml"}),
        "logging format back": ("POST", "/v2/logging", {"log_format": "default"}),
        "logging not json": ("POST", "/v2/logging", b"nope"),
        "trace set": ("POST", "/v2/trace/setting", {"trace_rate": "1000"}),
        "trace set number": ("POST", "/v2/trace/setting", {"trace_rate": 1000}),
        "trace set bad level": ("POST", "/v2/trace/setting", {"trace_level": ["LOUD"]}),
        "trace set unknown": ("POST", "/v2/trace/setting", {"trace_colour": "1"}),
        "model trace set": ("POST", M + "/trace/setting", {"trace_count": "5"}),
        "model trace clear": ("POST", M + "/trace/setting", {"trace_count": None}),
        "unknown model trace setting": ("GET", "/v2/models/nope/trace/setting"),
        "infer charset content type": ("POST", M + "/infer", {"inputs": [inp()]},
                                       {"Content-Type": "application/json; charset=utf-8"}),
        "infer text content type": ("POST", M + "/infer", {"inputs": [inp()]}, {"Content-Type": "text/plain"}),
    })
    for mode in range(19):  # model_faults: what a Python model can do wrong
        cases[f"model fault {mode}"] = ("POST", "/v2/models/model_faults/infer", {"inputs": [
            {"name": "MODE", "shape": [1], "datatype": "INT32", "data": [mode]}]})
    for number, (start, end, value) in enumerate(((True, False, 1), (None, None, 2), (None, True, 3),
                                                  (None, True, 3))):
        params = {"sequence_id": 78}
        if start is not None:
            params["sequence_start"] = start
        if end is not None:
            params["sequence_end"] = end
        cases[f"sequence step {number}"] = ("POST", "/v2/models/accumulate/infer", {
            "inputs": [{"name": "INPUT", "shape": [1, 1], "datatype": "INT32", "data": [value]}],
            "parameters": params})
    for name, params in (("sequence no id", {}), ("sequence id 0", {"sequence_id": 0}),
                         ("sequence without start", {"sequence_id": 77}),
                         ("sequence string id", {"sequence_id": "abc", "sequence_start": True, "sequence_end": True}),
                         ("sequence start not bool", {"sequence_id": 9, "sequence_start": "yes"})):
        cases[name] = ("POST", "/v2/models/accumulate/infer", {
            "inputs": [{"name": "INPUT", "shape": [1, 1], "datatype": "INT32", "data": [1]}], "parameters": params})
    def step(model, value, rows=1, **params):
        return ("POST", f"/v2/models/{model}/infer", {"inputs": [
            {"name": "INPUT", "shape": [rows, 1], "datatype": "INT32", "data": [value] * rows}],
            "parameters": params})
    cases.update({  # more of the sequence batcher, each step in order
        "sequence restart 1": step("accumulate", 5, sequence_id=79, sequence_start=True),
        "sequence restart 2": step("accumulate", 7, sequence_id=79, sequence_start=True),
        "sequence restart 3": step("accumulate", 1, sequence_id=79, sequence_end=True),
        "sequence two rows": step("accumulate", 1, rows=2, sequence_id=80, sequence_start=True),
        "sequence end without start": step("accumulate", 1, sequence_id=81, sequence_end=True),
        "sequence start false": step("accumulate", 1, sequence_id=82, sequence_start=False),
        "sequence string id": step("accumulate", 1, sequence_id="s1", sequence_start=True, sequence_end=True),
        "sequence largest id": step("accumulate", 2, sequence_id=2**64 - 1, sequence_start=True, sequence_end=True),
        "sequence negative id": step("accumulate", 2, sequence_id=-5, sequence_start=True, sequence_end=True),
        "sequence id 1.5": step("accumulate", 2, sequence_id=1.5, sequence_start=True, sequence_end=True),
        "oldest step 1": step("accumulate_oldest", 3, sequence_id=90, sequence_start=True),
        "oldest step 2": step("accumulate_oldest", 4, sequence_id=90),
        "oldest other sequence": step("accumulate_oldest", 10, sequence_id=91, sequence_start=True, sequence_end=True),
        "oldest step 3": step("accumulate_oldest", 5, sequence_id=90, sequence_end=True),
        "oldest after its end": step("accumulate_oldest", 5, sequence_id=90),
    })
    for mode in range(16):  # bls_faults: BLS calls that go wrong, as the calling model sees them
        cases[f"bls fault {mode}"] = ("POST", "/v2/models/bls_faults/infer", {"inputs": [
            {"name": "MODE", "shape": [1], "datatype": "INT32", "data": [mode]}]})
    for mode in (0, 1, 2, 3, 10, 11, 13, 14, 15, 16):  # ens_faults: a step that misbehaves
        cases[f"ensemble fault {mode}"] = ("POST", "/v2/models/ens_faults/infer", {"inputs": [
            {"name": "MODE", "shape": [1], "datatype": "INT32", "data": [mode]}]})
    ens = "/v2/models/ens_identity2/infer"
    ens_in = {"name": "INPUT", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}
    cases.update({
        "ensemble": ("POST", ens, {"inputs": [ens_in]}),
        "ensemble no inputs": ("POST", ens, {"inputs": []}),
        "ensemble unknown input": ("POST", ens, {"inputs": [dict(ens_in, name="X")]}),
        "ensemble wrong datatype": ("POST", ens, {"inputs": [dict(ens_in, datatype="INT32")]}),
        "ensemble no batch dim": ("POST", ens, {"inputs": [dict(ens_in, shape=[2])]}),
        "ensemble unknown output": ("POST", ens, {"inputs": [ens_in], "outputs": [{"name": "NOPE"}]}),
        "ensemble inner tensor as output": ("POST", ens, {"inputs": [ens_in], "outputs": [{"name": "MID1"}]}),
        "ensemble binary output": ("POST", ens, {"inputs": [ens_in], "outputs": [
            {"name": "OUTPUT", "parameters": {"binary_data": True}}]}),
        "generate ensemble": ("POST", "/v2/models/ens_faults/generate", {"MODE": [0]}),
        "generate ensemble whose step raises": ("POST", "/v2/models/ens_faults/generate", {"MODE": [1]}),
        "generate_stream decoupled ensemble": ("POST", "/v2/models/ens_repeat/generate_stream", {"IN": [4, 5]}),
        # textgen: a decoupled model of BYTES, integer, float, boolean and list inputs.
        "textgen generate_stream": ("POST", "/v2/models/textgen/generate_stream", {
            "text_input": "It was", "max_tokens": 6, "seed": 3, "temperature": 0.8}),
        "textgen generate_stream with parameters": ("POST", "/v2/models/textgen/generate_stream", {
            "text_input": "The ", "parameters": {"max_tokens": 4, "seed": 5, "top_p": 0.5}, "id": "t1"}),
        "textgen generate_stream stop": ("POST", "/v2/models/textgen/generate_stream", {
            "text_input": "It was", "max_tokens": 20, "seed": 3, "stop": ["e", "a"]}),
        "textgen generate whole": ("POST", "/v2/models/textgen/generate", {
            "text_input": "It was", "max_tokens": 5, "seed": 3, "stream": False}),
        "textgen generate streaming model": ("POST", "/v2/models/textgen/generate", {
            "text_input": "It was", "max_tokens": 5, "seed": 3}),
        "textgen generate_stream bad seed": ("POST", "/v2/models/textgen/generate_stream", {
            "text_input": "It was", "seed": -1}),
        "textgen generate_stream no text": ("POST", "/v2/models/textgen/generate_stream", {"max_tokens": 2}),
        "textgen generate_stream text as list": ("POST", "/v2/models/textgen/generate_stream", {
            "text_input": ["It", "was"], "max_tokens": 2}),
        **{f"generate model fault {mode}": ("POST", "/v2/models/model_faults/generate", {"MODE": [mode]})
           for mode in (1, 3, 4, 5, 11)},
        "generate_stream model fault 1": ("POST", "/v2/models/model_faults/generate_stream", {"MODE": [1]}),
    })
    cases.update(generate_key_cases())
    return cases


def generate_key_cases():
    """generate bodies with a key twice (as bytes: a dict cannot hold one), the keys "id" and
    "parameters", and the errors whose texts are Triton's; on params_echo and keyword_inputs
    of tests/models/ (tests/e2e/test_generate.py asserts the same answers)."""
    echo, keys = "/v2/models/params_echo/generate", "/v2/models/keyword_inputs/generate"
    echo_stream = "/v2/models/params_echo/generate_stream"
    gzipped = gzip.compress(b'{"INPUT0":[1]}')
    return {f"generate{name if name[0] == '_' else ' ' + name}": ("POST", *case)
            for name, case in {
        "input twice": (echo, b'{"INPUT0":[1],"INPUT0":[2]}'),
        "input twice with an id": (echo, b'{"id":"r1","INPUT0":[1],"INPUT0":[2]}'),
        "input twice, escaped": (echo, b'{"INPUT0":[1],"INPUT\\u0030":[2]}'),
        "input twice, the second bad": (echo, b'{"INPUT0":[1],"INPUT0":"x"}'),
        "input at both levels": (echo, b'{"INPUT0":[1],"parameters":{"INPUT0":[2]}}'),
        "input twice in parameters": (echo, b'{"parameters":{"INPUT0":[1],"INPUT0":[2]}}'),
        "input in parameters, then at the top": (echo, b'{"parameters":{"INPUT0":[1]},"INPUT0":[2]}'),
        "parameters twice with an input": (echo, b'{"parameters":{"INPUT0":[1]},"parameters":{"b":2}}'),
        "_stream input twice": (echo_stream, b'{"INPUT0":[1],"INPUT0":[2]}'),
        "_stream textgen input twice": ("/v2/models/textgen/generate_stream",
                                        b'{"text_input":"a","text_input":"b","max_tokens":1}'),
        "unknown model, input twice": ("/v2/models/nope/generate", b'{"INPUT0":[1],"INPUT0":[2]}'),
        "parameter twice": (echo, b'{"INPUT0":[1],"p":1,"p":2}'),
        "parameter twice, the second bad": (echo, b'{"INPUT0":[1],"p":1,"p":[2]}'),
        "parameter twice, the first bad": (echo, b'{"INPUT0":[1],"p":[1],"p":2}'),
        "parameter at both levels": (echo, b'{"INPUT0":[1],"p":1,"parameters":{"p":2}}'),
        "parameters twice": (echo, b'{"INPUT0":[1],"parameters":{"a":1},"parameters":{"b":2}}'),
        "parameters twice, the first no object": (echo, b'{"INPUT0":[1],"parameters":3,"parameters":{}}'),
        "id twice": (echo, b'{"id":"a","id":5,"INPUT0":[1]}'),
        "id twice, the first no string": (echo, b'{"id":5,"id":"a","INPUT0":[1]}'),
        "id": (echo, b'{"INPUT0":[1],"id":"q"}'),
        "id in parameters": (echo, b'{"INPUT0":[1],"parameters":{"id":"n"}}'),
        "id as an input": (keys, b'{"id":"abc","X":[1]}'),
        "input named parameters": (keys, b'{"parameters":[1,2]}'),
        "input named parameters, an object": (keys, b'{"parameters":{"X":[1]}}'),
        "parameter of another type": (echo, b'{"INPUT0":[1],"p":[1,2]}'),
        "parameter of another type in parameters": (echo, b'{"INPUT0":[1],"parameters":{"p":null}}'),
        "parameters no object": (echo, b'{"INPUT0":[1],"parameters":[1]}'),
        "parameters null": (echo, b'{"INPUT0":[1],"parameters":null}'),
        "error in parameters": ("/v2/models/textgen/generate_stream",
                                b'{"parameters":{"text_input":["a","b"]}}'),
        "body no object": (echo, b'[1]'),
        "_stream body no object": (echo_stream, b'null'),
        "missing input": (echo, b'{"p":1}'),
        "value of another type": (echo, b'{"INPUT0":"x"}'),
        "triton_ parameter": (echo, b'{"INPUT0":[1],"triton_x":1}'),
        "reserved parameters": (echo, b'{"INPUT0":[1],"priority":1,"timeout":5000000,"binary_data_output":true}'),
        "gzip": (echo, gzipped, {"Content-Encoding": "gzip"}),
        "_stream gzip": (echo_stream, gzipped, {"Content-Encoding": "gzip"}),
        "unknown model, gzip": ("/v2/models/nope/generate", gzipped, {"Content-Encoding": "gzip"}),
        "Identity encoding": (echo, b'{"INPUT0":[1]}', {"Content-Encoding": "Identity"}),
        "identity encoding": (echo, b'{"INPUT0":[1]}', {"Content-Encoding": "identity"}),
    }.items()}


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


def transport_cases():
    """HTTP/1.1 as a client may write it: chunked bodies, pipelining, 100-continue, 1.0."""
    body = json.dumps({"inputs": [inp()]}).encode()
    head = f"POST {M}/infer HTTP/1.1\r\nHost: x\r\n".encode()
    sized = head + b"Content-Length: %d\r\n\r\n" % len(body) + body
    chunked = head + b"Transfer-Encoding: chunked\r\n\r\n" + b"".join(
        b"%x\r\n%s\r\n" % (len(part), part) for part in (body[:10], body[10:])) + b"0\r\n\r\n"
    return {
        "transport chunked body": (chunked, 1),
        "transport two pipelined": (sized + sized, 2),
        "transport pipelined, the first bad": (head + b"Content-Length: 2\r\n\r\n{]" + sized, 2),
        "transport 100-continue": (head + b"Expect: 100-continue\r\nContent-Length: %d\r\n\r\n" % len(body)
                                   + body, 1),
        "transport HTTP/1.0": (f"GET {M} HTTP/1.0\r\n\r\n".encode(), 1),
        "transport connection close": (b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
                                       + sized, 2),
        "transport lower-case method": (f"get {M} HTTP/1.1\r\nHost: x\r\n\r\n".encode(), 1),
        "transport no Host": (f"GET {M} HTTP/1.1\r\n\r\n".encode(), 1),
        "transport binary header length in another case": (
            head + b"inference-header-content-length: %d\r\nContent-Length: %d\r\n\r\n" % (len(body), len(body))
            + body, 1),
    }


def header_cases():
    """Requests whose response headers are compared (those a client reads)."""
    body4, head4 = binary({"inputs": [inp(data=None, parameters={"binary_data_size": 16})],
                           "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]}, F4)
    plain = json.dumps({"inputs": [inp()]}).encode()
    return {
        "headers ready": ("GET", "/v2/health/ready"),
        "headers metadata": ("GET", M),
        "headers infer json": ("POST", M + "/infer", plain),
        "headers infer binary": ("POST", M + "/infer", body4, head4),
        "headers infer gzip accepted": ("POST", M + "/infer", plain, {"Accept-Encoding": "gzip"}),
        "headers infer deflate accepted": ("POST", M + "/infer", plain, {"Accept-Encoding": "deflate"}),
        "headers infer error": ("POST", M + "/infer", {"inputs": [inp(name="X")]}),
        "headers unknown model": ("GET", "/v2/models/nope"),
        "headers unknown path": ("GET", "/v2/nothing"),
    }


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


SHM_IN, SHM_OUT, SHM_STR = "/shmserve_probe_in", "/shmserve_probe_out", "/shmserve_probe_str"
# SHM_STR: two BYTES elements at 0 (11 bytes), one whose length runs past its 6 bytes at 32.
STR_REGION = (struct.pack("<I", 2) + b"ab" + struct.pack("<I", 1) + b"c").ljust(32, b"\0") + \
    (struct.pack("<I", 9) + b"ab").ljust(32, b"\0")


def shm_answers(http_port, grpc_port):
    """Register, use and unregister system shared memory regions over both protocols, in
    order: each answer, and what the outputs placed in the regions hold."""
    import posix_ipc
    regions = []
    try:
        for key, data in ((SHM_IN, F4), (SHM_OUT, bytes(64)), (SHM_STR, STR_REGION)):
            shm = posix_ipc.SharedMemory(key, posix_ipc.O_CREX, size=len(data))
            with open(f"/dev/shm{key}", "r+b") as f:
                f.write(data)
            shm.close_fd()
            regions.append(shm)
        return _shm_answers(http_port, grpc_port)
    finally:
        for shm in regions:
            shm.unlink()


def _shm_answers(http_port, grpc_port):
    out = {}
    base = "/v2/systemsharedmemory"

    def region_bytes():
        with open(f"/dev/shm{SHM_OUT}", "rb") as f:
            return f.read(32).hex()

    def strings(input_region, in_size, shape, output_region, out_size, in_offset=0):
        return {"inputs": [{"name": "IN_BYTES", "shape": shape, "datatype": "BYTES", "parameters": {
                    "shared_memory_region": input_region, "shared_memory_byte_size": in_size,
                    "shared_memory_offset": in_offset}}],
                "outputs": [{"name": "OUT_BYTES", "parameters": {
                    "shared_memory_region": output_region, "shared_memory_byte_size": out_size}}]}

    def infer(input_region, output_region, out_size=16, in_size=16, in_offset=0):
        return {"inputs": [inp(data=None, parameters={
                    "shared_memory_region": input_region, "shared_memory_byte_size": in_size,
                    "shared_memory_offset": in_offset})],
                "outputs": [{"name": "OUTPUT0", "parameters": {
                    "shared_memory_region": output_region, "shared_memory_byte_size": out_size}}]}

    steps = [
        ("shm register in", "POST", base + "/region/in/register", {"key": SHM_IN, "offset": 0, "byte_size": 16}),
        ("shm register in again", "POST", base + "/region/in/register", {"key": SHM_IN, "offset": 0, "byte_size": 16}),
        ("shm register out", "POST", base + "/region/out/register", {"key": SHM_OUT, "offset": 0, "byte_size": 64}),
        ("shm register past the end", "POST", base + "/region/far/register", {"key": SHM_OUT, "offset": 100, "byte_size": 16}),
        ("shm register no key", "POST", base + "/region/nokey/register", {"offset": 0, "byte_size": 16}),
        ("shm status after register", "GET", base + "/status", None),
        ("shm status of in", "GET", base + "/region/in/status", None),
        ("shm infer", "POST", M + "/infer", infer("in", "out")),
        ("shm infer input larger than region", "POST", M + "/infer", infer("in", "out", in_size=32)),
        ("shm infer input offset past region", "POST", M + "/infer", infer("in", "out", in_offset=8)),
        ("shm infer output region too small", "POST", M + "/infer", infer("in", "out", out_size=8)),
        ("shm infer unknown region", "POST", M + "/infer", infer("nope", "out")),
        ("shm unregister in", "POST", base + "/region/in/unregister", None),
        ("shm infer after unregister", "POST", M + "/infer", infer("in", "out")),
        ("shm unregister all", "POST", base + "/unregister", None),
        ("shm status after unregister", "GET", base + "/status", None),
        # BYTES in and out of regions (all_types).
        ("shm register str", "POST", base + "/region/str/register", {"key": SHM_STR, "offset": 0, "byte_size": 64}),
        ("shm register out2", "POST", base + "/region/out2/register", {"key": SHM_OUT, "offset": 0, "byte_size": 64}),
        ("shm infer BYTES", "POST", T, strings("str", 11, [2], "out2", 64)),
        ("shm infer BYTES output region too small", "POST", T, strings("str", 11, [2], "out2", 8)),
        ("shm infer BYTES past the end", "POST", T, strings("str", 6, [1], "out2", 64, in_offset=32)),
        ("shm infer BYTES fewer elements", "POST", T, strings("str", 11, [3], "out2", 64)),
        ("shm infer BYTES elements beyond its bytes", "POST", T, strings("str", 4, [2], "out2", 64)),
        ("shm infer size 0", "POST", T, strings("str", 0, [0], "out2", 64)),
        ("shm infer with data too", "POST", T, {"inputs": [{
            "name": "IN_BYTES", "shape": [1], "datatype": "BYTES", "data": ["x"], "parameters": {
                "shared_memory_region": "str", "shared_memory_byte_size": 11}}]}),
        ("shm infer output in a region and binary", "POST", T, {"inputs": [
            {"name": "IN_INT32", "shape": [1], "datatype": "INT32", "data": [1]}],
            "outputs": [{"name": "OUT_INT32", "parameters": {
                "shared_memory_region": "out2", "shared_memory_byte_size": 4, "binary_data": True}}]}),
        ("shm infer output offset", "POST", T, {"inputs": [
            {"name": "IN_INT32", "shape": [1], "datatype": "INT32", "data": [0x01020304]}],
            "outputs": [{"name": "OUT_INT32", "parameters": {
                "shared_memory_region": "out2", "shared_memory_byte_size": 4, "shared_memory_offset": 20}}]}),
        ("shm unregister all again", "POST", base + "/unregister", None),
    ]
    for name, method, path, body in steps:
        out[name] = http_call(http_port, method, path, body)
        if "infer" in name:
            out[name + ": region"] = region_bytes()
    channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
    stub = pb_grpc.GRPCInferenceServiceStub(channel)
    request = grpc_request(raw=())
    request.inputs[0].parameters["shared_memory_region"].string_param = "gin"
    request.inputs[0].parameters["shared_memory_byte_size"].int64_param = 16
    wanted = request.outputs.add(name="OUTPUT0")
    wanted.parameters["shared_memory_region"].string_param = "gout"
    wanted.parameters["shared_memory_byte_size"].int64_param = 16
    calls = [
        ("grpc shm register in", "SystemSharedMemoryRegister", pb.SystemSharedMemoryRegisterRequest(
            name="gin", key=SHM_IN, byte_size=16)),
        ("grpc shm register in again", "SystemSharedMemoryRegister", pb.SystemSharedMemoryRegisterRequest(
            name="gin", key=SHM_IN, byte_size=16)),
        ("grpc shm register out", "SystemSharedMemoryRegister", pb.SystemSharedMemoryRegisterRequest(
            name="gout", key=SHM_OUT, byte_size=64)),
        ("grpc shm status", "SystemSharedMemoryStatus", pb.SystemSharedMemoryStatusRequest()),
        ("grpc shm register unaligned offset", "SystemSharedMemoryRegister",
         pb.SystemSharedMemoryRegisterRequest(name="gmid", key=SHM_OUT, offset=16, byte_size=48)),
        ("grpc shm infer", "ModelInfer", request),
        ("grpc shm unregister all", "SystemSharedMemoryUnregister", pb.SystemSharedMemoryUnregisterRequest()),
        ("grpc shm infer after unregister", "ModelInfer", request),
    ]
    for name, method, message in calls:
        if "unregister" in name:
            # Triton holds a region until it has released the last request that used it,
            # a moment after answering; unregistered before then, it refuses ("Failed to
            # unregister").
            time.sleep(0.1)
        out[name] = grpc_answer(stub, method, message)
        if "infer" in name:
            out[name + ": region"] = region_bytes()
    channel.close()
    return out


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


def grpc_cases():
    return {
        "grpc ServerReady": ("ServerReady", pb.ServerReadyRequest()),
        "grpc ModelReady unknown model": ("ModelReady", pb.ModelReadyRequest(name="nope")),
        "grpc ModelReady unknown version": ("ModelReady", pb.ModelReadyRequest(name="identity_fp32", version="7")),
        "grpc metadata unknown model": ("ModelMetadata", pb.ModelMetadataRequest(name="nope")),
        "grpc metadata version x": ("ModelMetadata", pb.ModelMetadataRequest(name="identity_fp32", version="x")),
        "grpc config unknown model": ("ModelConfig", pb.ModelConfigRequest(name="nope")),
        "grpc stats unknown model": ("ModelStatistics", pb.ModelStatisticsRequest(name="nope")),
        "grpc stats unknown version": ("ModelStatistics", pb.ModelStatisticsRequest(name="identity_fp32", version="4")),
        "grpc load in none mode": ("RepositoryModelLoad", pb.RepositoryModelLoadRequest(model_name="identity_fp32")),
        "grpc shm status unknown": ("SystemSharedMemoryStatus", pb.SystemSharedMemoryStatusRequest(name="nope")),
        "grpc shm register missing key": ("SystemSharedMemoryRegister", pb.SystemSharedMemoryRegisterRequest(
            name="r", key="/shmserve_probe_absent", byte_size=16)),
        "grpc shm unregister unknown": ("SystemSharedMemoryUnregister", pb.SystemSharedMemoryUnregisterRequest(name="nope")),
        "grpc cuda register short handle": ("CudaSharedMemoryRegister", pb.CudaSharedMemoryRegisterRequest(
            name="r", raw_handle=b"xx", byte_size=16)),
        "grpc infer": ("ModelInfer", grpc_request()),
        "grpc response parameters": ("ModelInfer", grpc_request(
            model="params_echo", datatype="INT32", shape=(1,), raw=(struct.pack("<i", 1),),
            params={"reply_s": "x", "reply_n": 7, "reply_b": True})),
        "grpc response sender misuse twice": ("ModelInfer", grpc_request(
            model="sender_misuse", shape=(4,), params={"misuse": "twice"})),
        "grpc infer unknown model": ("ModelInfer", grpc_request(model="nope")),
        "grpc infer unknown version": ("ModelInfer", grpc_request(version="2")),
        "grpc infer version x": ("ModelInfer", grpc_request(version="x")),
        "grpc infer unknown input": ("ModelInfer", grpc_request(name="X")),
        "grpc infer wrong datatype": ("ModelInfer", grpc_request(datatype="INT32")),
        "grpc infer bad datatype": ("ModelInfer", grpc_request(datatype="FLOAT")),
        "grpc infer no batch dim": ("ModelInfer", grpc_request(shape=(4,))),
        "grpc infer too few bytes": ("ModelInfer", grpc_request(shape=(1, 5))),
        "grpc infer no contents": ("ModelInfer", grpc_request(raw=())),
        "grpc two raw contents for one input": ("ModelInfer", grpc_request(raw=(F4, F4))),
        "grpc infer unknown output": ("ModelInfer", grpc_request(outputs=("NOPE",))),
        "grpc infer negative priority": ("ModelInfer", grpc_request(params={"priority": -1})),
        "grpc infer timeout as string": ("ModelInfer", grpc_request(params={"timeout": "x"})),
        "grpc infer triton_ parameter": ("ModelInfer", grpc_request(params={"triton_x": 1})),
        **{f"grpc model fault {mode}": ("ModelInfer", grpc_request(
            model="model_faults", name="MODE", datatype="INT32", shape=(1,), raw=(struct.pack("<i", mode),)))
           for mode in (1, 3, 4, 5, 6, 7, 8, 9, 11, 13)},
        "grpc infer decoupled model": ("ModelInfer", grpc_request(model="repeat", name="IN", datatype="INT32",
                                                                 shape=(2,), raw=(struct.pack("<2i", 1, 2),))),
    }


def stream_cases():
    def repeat(count=2, model="repeat", name="IN", request_id="", params=None):
        request = grpc_request(model=model, name=name, datatype="INT32", shape=(count,),
                               raw=(struct.pack(f"<{count}i", *range(count)),), params=params)
        request.id = request_id
        return request
    final = {"triton_enable_empty_final_response": True}

    def identity(request_id, shape=(1, 4), params=None, model="identity_fp32", name="INPUT0"):
        request = grpc_request(model=model, name=name, shape=shape,
                               raw=(bytes(4 * shape[0] * shape[1]),), params=params)
        request.id = request_id
        return request
    cases = {  # ModelStreamInfer on models that are not decoupled
        "stream identity": ([identity("i1"), identity("i2", (2, 4)), identity("i3")], None),
        "stream identity, a bad one between": ([identity("b1"), identity("b2", (65, 1)), identity("b3")], None),
        "stream identity, unknown input between": ([identity("u1"), identity("u2", name="X"), identity("u3")], None),
        "stream identity empty final response": ([identity("f1", params=final)], None),
        "stream identity empty final response as an int": (
            [identity("n1", params={"triton_enable_empty_final_response": 1}), identity("n2")], None),
        # Not among them: a stream mixing identity_fp32 and repeat, whose responses Triton 2.51
        # orders differently from run to run and which once ended its process ("ASSERTION
        # FAILED: !byte_buffer->Valid()").
        "stream identity triton_grpc_error": ([identity("e1"), identity("e2", (65, 1)), identity("e3")],
                                              (("triton_grpc_error", "true"),)),
        "stream model fault 3": ([grpc_request(model="model_faults", name="MODE", datatype="INT32", shape=(1,),
                                               raw=(struct.pack("<i", 3),)), identity("after")], None),
        "stream no requests": ([], None),
    }
    text = pb.ModelInferRequest(model_name="textgen", id="tg")
    for name, datatype, raw in (("text_input", "BYTES", raw_of("BYTES", ["It was"])),
                                ("max_tokens", "INT32", raw_of("INT32", [5])),
                                ("seed", "UINT64", raw_of("UINT64", [3])),
                                ("temperature", "FP32", raw_of("FP32", [0.8]))):
        text.inputs.add(name=name, datatype=datatype, shape=[1])
        text.raw_input_contents.append(raw)
    cases["stream textgen"] = ([text], None)
    return {**cases,
        "stream": ([repeat(request_id="a")], None),
        "stream unknown model, then on": ([repeat(1, model="nope", request_id="x"), repeat(1, request_id="y")], None),
        "stream unknown input, then on": ([repeat(1, name="X", request_id="x"), repeat(1, request_id="y")], None),
        "stream empty final response": ([repeat(request_id="e", params=final)], None),
        "stream no responses": ([repeat(0, request_id="z", params=final)], None),
        "stream triton_grpc_error": ([repeat(1, model="nope"), repeat(1)], (("triton_grpc_error", "true"),)),
        # A decoupled ensemble (ens_repeat: one step, repeat).
        "stream ensemble": ([repeat(3, model="ens_repeat", request_id="en")], None),
        "stream ensemble empty final response": ([repeat(2, model="ens_repeat", request_id="ef",
                                                         params=final)], None),
        "stream ensemble unknown input, then on": ([repeat(1, model="ens_repeat", name="X", request_id="x"),
                                                    repeat(1, model="ens_repeat", request_id="y")], None),
        "stream ensemble no responses": ([repeat(0, model="ens_repeat", request_id="e0",
                                                 params=final)], None),
        "stream ensemble sequence fields": ([repeat(1, model="ens_repeat", request_id="es",
                                                    params={"sequence_id": 7, "sequence_start": True})], None),
        # stream_faults: what a decoupled Python model can do wrong; then a good request.
        **{f"stream fault {mode}": ([
            grpc_request(model="stream_faults", name="MODE", datatype="INT32", shape=(1,),
                         raw=(struct.pack("<i", value),), params=final) for value in (mode, 0)], None)
           for mode in range(1, 9)},
        # bls_stream: BLS calls from a decoupled model, forwarded, from a thread, awaited.
        **{f"stream bls {mode}": ([
            grpc_request(model="bls_stream", name="MODE", datatype="INT32", shape=(1,),
                         raw=(struct.pack("<i", mode),), params=final)], None)
           for mode in range(9)},
    }


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


def metric_families(port):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
    families = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            families.setdefault(name, [kind, set()])
        elif line and not line.startswith("#"):
            name = re.match(r"[a-zA-Z_:]+", line).group(0)
            base = re.sub(r"_(bucket|count|sum)$", "", name) if name not in families else name
            labels = tuple(sorted(re.findall(r'(\w+)="', line)))
            families.setdefault(base, ["untyped", set()])[1].add(labels)
    return {name: (kind, sorted(labels)) for name, (kind, labels) in families.items()}


def answers(ports):
    """Every case's answer from the server on (http, grpc, metrics) ports."""
    http_port, grpc_port, metrics_port = ports
    out = {}
    counts = all_counts(ports)

    def ask(name, how, *args, settle_s=0.0):
        """The case's answer, and (as "counted <case>") what it added to the statistics."""
        nonlocal counts
        out[name] = how(*args)
        now = all_counts(ports, settle_s)
        added = counted(counts, now)
        if name.startswith("stream identity"):
            # Requests in flight together are batched as they arrive, differently each run.
            added = {model: {key: value for key, value in delta.items()
                             if not key.startswith(("batch ", "execution_count", "metric nv_inference_exec"))}
                     for model, delta in added.items()}
        out[f"counted {name}"] = added
        counts = now

    for name, case in {**http_cases(), **datatype_cases()}.items():
        ask(name, http_call, http_port, *case,
            settle_s=0.1 if "generate" in case[1] or "sender_misuse" in case[1] else 0.0)
    for name, case in header_cases().items():
        out[name] = http_headers(http_port, *case)
    for name, (data, responses) in transport_cases().items():
        out[name] = raw_exchange(http_port, data, responses)
    out.update(shm_answers(http_port, grpc_port))
    counts = all_counts(ports)
    channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
    stub = pb_grpc.GRPCInferenceServiceStub(channel)
    for name, (method, request) in {**grpc_cases(), **grpc_datatype_cases()}.items():
        ask(name, grpc_answer, stub, method, request)
    for name, (requests, metadata) in stream_cases().items():
        ask(name, stream_answer, channel, requests, metadata, settle_s=0.1)
    channel.close()
    for model in ("identity_fp32", "ens_identity2", "repeat", "accumulate", "bls_faults", "config_features"):
        answer = http_call(http_port, "GET", f"/v2/models/{model}/stats")
        out[f"stats shape {model}"] = (answer[0], shape_of(answer[1])) if isinstance(answer, tuple) else answer
        out[f"grpc stats shape {model}"] = grpc_stats(grpc_port, model)
    answer = http_call(http_port, "GET", "/v2/models/stats")
    out["stats shape all"] = (answer[0], shape_of(answer[1])) if isinstance(answer, tuple) else answer
    index = http_call(http_port, "POST", "/v2/repository/index", {})
    out["index"] = index
    channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
    stub = pb_grpc.GRPCInferenceServiceStub(channel)
    for entry in index[1] if isinstance(index, tuple) and isinstance(index[1], list) else []:
        out[f"metadata {entry['name']}"] = http_call(http_port, "GET", f"/v2/models/{entry['name']}")
        out[f"config {entry['name']}"] = http_call(http_port, "GET", f"/v2/models/{entry['name']}/config")
        out[f"grpc metadata {entry['name']}"] = grpc_answer(stub, "ModelMetadata",
                                                            pb.ModelMetadataRequest(name=entry["name"]))
        out[f"grpc config {entry['name']}"] = grpc_answer(stub, "ModelConfig",
                                                          pb.ModelConfigRequest(name=entry["name"]))
    out["grpc server metadata"] = grpc_answer(stub, "ServerMetadata", pb.ServerMetadataRequest())
    channel.close()
    out["metrics"] = metric_families(metrics_port)
    return out


def management_cases():
    """Model control in explicit mode, in order: (name, how to ask). Nothing is loaded at
    start; each case sees what the ones before it loaded and unloaded."""
    repo = "/v2/repository"
    infer_id = ("POST", M + "/infer", {"inputs": [inp()]})
    doubled = base64.b64encode(DOUBLING_MODEL.encode()).decode()
    override = json.dumps({"name": "identity_fp32", "backend": "python", "max_batch_size": 8,
                           "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
                           "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}]})
    # A repeated field given as one object, an enum name in lower case: Triton's JSON parser
    # takes both.
    single = json.dumps({"name": "identity_fp32", "backend": "python", "max_batch_size": 8,
                         "input": {"name": "INPUT0", "data_type": "type_fp32", "dims": [-1]},
                         "output": {"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]},
                         "instance_group": {"kind": "KIND_CPU", "count": 1}})
    grpc_load = lambda name, **params: ("grpc", "RepositoryModelLoad", _load_request(name, params))
    return [
        ("explicit index at start", ("POST", repo + "/index", {})),
        ("explicit ready index at start", ("POST", repo + "/index", {"ready": True})),
        ("explicit infer before load", infer_id),
        ("explicit metadata before load", ("GET", M)),
        ("explicit model ready before load", ("GET", M + "/ready")),
        ("explicit load unknown", ("POST", repo + "/models/nope/load", {})),
        ("explicit load", ("POST", repo + "/models/identity_fp32/load", {})),
        ("explicit infer after load", infer_id),
        ("explicit index after load", ("POST", repo + "/index", {"ready": True})),
        ("explicit load not json config", ("POST", repo + "/models/identity_fp32/load",
                                           {"parameters": {"config": "{nope"}})),
        ("explicit load config of another name", ("POST", repo + "/models/identity_fp32/load", {
            "parameters": {"config": json.dumps({"name": "other", "backend": "python"})}})),
        ("explicit load config override", ("POST", repo + "/models/identity_fp32/load",
                                           {"parameters": {"config": override}})),
        ("explicit config after override", ("GET", M + "/config")),
        ("explicit load config with single objects", ("POST", repo + "/models/identity_fp32/load",
                                                      {"parameters": {"config": single}})),
        ("explicit config after single objects", ("GET", M + "/config")),
        ("explicit load without config.pbtxt", ("POST", repo + "/models/no_config/load", {})),
        ("explicit config without config.pbtxt", ("GET", "/v2/models/no_config/config")),
        ("explicit infer without config.pbtxt", ("POST", "/v2/models/no_config/infer", {
            "inputs": [{"name": "IN", "shape": [1], "datatype": "INT32", "data": [3]}]})),
        ("explicit load file without config", ("POST", repo + "/models/identity_fp32/load",
                                               {"parameters": {"file:1/model.py": doubled}})),
        ("explicit load files", ("POST", repo + "/models/identity_fp32/load", {
            "parameters": {"config": override, "file:1/model.py": doubled}})),
        ("explicit infer with loaded files", infer_id),
        ("explicit unload", ("POST", repo + "/models/identity_fp32/unload", {})),
        ("explicit unload again", ("POST", repo + "/models/identity_fp32/unload", {})),
        ("explicit unload unknown", ("POST", repo + "/models/nope/unload", {})),
        ("explicit index after unload", ("POST", repo + "/index", {})),
        ("explicit infer after unload", infer_id),
        ("explicit model ready after unload", ("GET", M + "/ready")),
        ("explicit load ensemble", ("POST", repo + "/models/ens_identity2/load", {})),
        ("explicit index with ensemble", ("POST", repo + "/index", {"ready": True})),
        ("explicit unload a step of a loaded ensemble", ("POST", repo + "/models/identity_fp32/unload", {})),
        ("explicit ensemble without its step", ("POST", "/v2/models/ens_identity2/infer", {"inputs": [
            {"name": "INPUT", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]})),
        ("explicit load ensemble again", ("POST", repo + "/models/ens_identity2/load", {})),
        ("explicit unload ensemble and dependents", ("POST", repo + "/models/ens_identity2/unload",
                                                     {"parameters": {"unload_dependents": True}})),
        ("explicit index after unload with dependents", ("POST", repo + "/index", {})),
        ("explicit load BLS caller alone", ("POST", repo + "/models/bls_faults/load", {})),
        ("explicit BLS to an unloaded model", ("POST", "/v2/models/bls_faults/infer", {"inputs": [
            {"name": "MODE", "shape": [1], "datatype": "INT32", "data": [0]}]})),
        *((f"explicit load {name}", ("POST", f"{repo}/models/{name}/load", {}))
          for name in BROKEN_MODELS if name not in LOADED_LAST),
        *((f"explicit ready {name}", ("GET", f"/v2/models/{name}/ready")) for name in BROKEN_MODELS),
        *((f"explicit {what} {name}", (method, f"/v2/models/{name}{path}", body))
          for name in ("init_raises", "bad_dims")
          for what, method, path, body in (
              ("metadata", "GET", "", None), ("config", "GET", "/config", None),
              ("stats", "GET", "/stats", None),
              ("infer", "POST", "/infer", {"inputs": [
                  {"name": "IN", "shape": [1], "datatype": "INT32", "data": [1]}]}))),
        ("explicit index after broken loads", ("POST", repo + "/index", {})),
        ("grpc explicit load unknown", grpc_load("nope")),
        ("grpc explicit load init_raises", grpc_load("init_raises")),
        ("grpc explicit load bad_dims", grpc_load("bad_dims")),
        ("grpc explicit metadata init_raises", ("grpc", "ModelMetadata", pb.ModelMetadataRequest(name="init_raises"))),
        ("grpc explicit infer bad_dims", ("grpc", "ModelInfer", grpc_request(
            model="bad_dims", name="IN", datatype="INT32", shape=(1,), raw=(struct.pack("<i", 1),)))),
        ("grpc explicit load bad config", grpc_load("identity_fp32", config="{nope")),
        ("grpc explicit load", grpc_load("identity_fp32")),
        ("grpc explicit index", ("grpc", "RepositoryIndex", pb.RepositoryIndexRequest())),
        ("grpc explicit unload unknown", ("grpc", "RepositoryModelUnload",
                                          pb.RepositoryModelUnloadRequest(model_name="nope"))),
        ("grpc explicit unload", ("grpc", "RepositoryModelUnload",
                                  pb.RepositoryModelUnloadRequest(model_name="identity_fp32"))),
        ("grpc explicit ready index", ("grpc", "RepositoryIndex", pb.RepositoryIndexRequest(ready=True))),
        *((f"explicit load {name}", ("POST", f"{repo}/models/{name}/load", {})) for name in LOADED_LAST),
    ]


# Broken models whose failed load leaves the index differing (see KNOWN): loaded after the
# index cases.
LOADED_LAST = ("unknown_field", "no_versions")


# Models that fail to load, written into the explicit pass's copy of the repository only (the
# first pass loads every model at start): name -> {file: text}. Not among them: a version
# folder without model.py, on which Triton 2.51's load never answers.
_CONFIG = """name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
{extra}"""
_MODEL = """import triton_python_backend_utils as pb_utils


class TritonPythonModel:
{body}
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.get_input_tensor_by_name(r, "IN")])
                for r in requests]
"""
BROKEN_MODELS = {
    "init_raises": {"1/model.py": _MODEL.format(body="    def initialize(self, args):\n"
                                                     "        raise ValueError(\"init_raises refuses\")\n")},
    "syntax_error": {"1/model.py": "def execute(self, requests)\n    return []\n"},
    "import_error": {"1/model.py": "import no_such_module_anywhere\n"},
    "no_class": {"1/model.py": "X = 1\n"},
    "unknown_field": {"extra": "no_such_field: 1\n"},
    "bad_dims": {"extra": 'output [ { name: "OUT2" data_type: TYPE_INT32 dims: [ -2 ] } ]\n'},
    "no_versions": {},
    "init_exits": {"1/model.py": _MODEL.format(body="    def initialize(self, args):\n"
                                                    "        import os\n"
                                                    "        os._exit(1)\n")},
}


# A model with no config.pbtxt at all: Triton takes its backend from 1/model.py, and its
# auto_complete_config the rest.
NO_CONFIG_MODEL = """import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        config.add_input({"name": "IN", "data_type": "TYPE_INT32", "dims": [1]})
        config.add_output({"name": "OUT", "data_type": "TYPE_INT32", "dims": [1]})
        return config

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())]) for r in requests]
"""


def write_broken_models(repo):
    for name, files in BROKEN_MODELS.items():
        folder = repo / name
        folder.mkdir()
        (folder / "config.pbtxt").write_text(_CONFIG.format(name=name, extra=files.get("extra", "")))
        for path, text in files.items():
            if path != "extra":
                (folder / path).parent.mkdir(parents=True, exist_ok=True)
                (folder / path).write_text(text)
        if files.get("extra") is not None and not any(p != "extra" for p in files):
            (folder / "1").mkdir()
            (folder / "1" / "model.py").write_text(_MODEL.format(body=""))


# What `explicit load files` sends as 1/model.py: OUTPUT0 = 2 * INPUT0.
DOUBLING_MODEL = """import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", 2 * pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
            for r in requests]
"""


def _load_request(name, params):
    request = pb.RepositoryModelLoadRequest(model_name=name)
    for key, value in params.items():
        request.parameters[key].string_param = value
    return request


def management_answers(ports):
    http_port, grpc_port, _ = ports
    out = {}
    with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        for name, case in management_cases():
            if case[0] == "grpc":
                out[name] = grpc_answer(stub, case[1], case[2])
            else:  # loads wait for the model's instances to start: slow on a busy machine
                if "index after" in name:
                    settle(http_port)
                out[name] = http_call(http_port, *case, timeout=120)
    return out


def settle(http_port, timeout_s=60):
    """Wait until no model is loading or unloading (an unload answers before it is done, and
    how long it takes is no part of the comparison)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        index = http_call(http_port, "POST", "/v2/repository/index", {})
        if not (isinstance(index, tuple) and isinstance(index[1], list)) or not any(
                entry.get("state") in ("LOADING", "UNLOADING") for entry in index[1]):
            return
        time.sleep(0.2)


def grpc_stats(port, model):
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        try:
            reply = stub.ModelStatistics(pb.ModelStatisticsRequest(name=model), timeout=30)
        except grpc.RpcError as e:
            return e.code().name, e.details()
    # Zeros printed: which counts are zero depends on what the battery did before.
    return shape_of(json_format.MessageToDict(reply, preserving_proto_field_name=True,
                                              always_print_fields_with_no_presence=True))


def shape_of(answer):
    """An answer's structure without the values that depend on time and load: numbers become
    0, and a list keeps the shape of its first item (batch sizes seen vary from run to run)."""
    if isinstance(answer, bool):
        return answer
    if isinstance(answer, (int, float)):
        return 0
    if isinstance(answer, str) and answer.isdigit():
        return "0"  # MessageToDict writes 64-bit integers as strings
    if isinstance(answer, dict):
        return {key: shape_of(value) for key, value in answer.items()}
    if isinstance(answer, list):
        return [shape_of(answer[0])] if answer else []
    return answer


def counts_of(stats: dict) -> dict:
    """A model's statistics without the times (durations, last_inference, memory), flat."""
    counts = {"inference_count": stats["inference_count"], "execution_count": stats["execution_count"]}
    counts.update({key: value["count"] for key, value in stats["inference_stats"].items()})
    counts.update({f"batch {b['batch_size']}": b["compute_infer"]["count"] for b in stats["batch_stats"]})
    for key, value in stats.get("response_stats", {}).items():
        counts.update({f"response {key} {k}": v["count"] for k, v in value.items()})
    return counts


# The counters of the metrics endpoint that count requests, by model.
COUNTED_METRICS = re.compile(r'^(nv_inference_request_success|nv_inference_request_failure|nv_inference_count|'
                             r'nv_inference_exec_count)\{(.*)\} (\S+)$', re.M)


def metric_counts(metrics_port) -> dict:
    """{model: {counter (with its reason): value}}."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=30).read().decode()
    counts = {}
    for name, labels, value in COUNTED_METRICS.findall(text):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        key = f"metric {name}" + (f" {labels['reason']}" if "reason" in labels else "")
        counts.setdefault(labels["model"], {})[key] = float(value)
    return counts


def all_counts(ports, settle_s: float = 0.0) -> dict:
    """Every model's counts, in its statistics and its metrics, after `settle_s` and once two
    readings in a row agree (a server may count a request a moment after it answered it:
    Triton a decoupled one, when it releases it)."""
    http_port, _, metrics_port = ports
    time.sleep(settle_s)
    last = None
    for _ in range(20):
        answer = http_call(http_port, "GET", "/v2/models/stats")
        counts = {e["name"]: counts_of(e) for e in answer[1]["model_stats"]} if answer[0] == 200 else {}
        for model, metrics in metric_counts(metrics_port).items():
            counts.setdefault(model, {}).update(metrics)
        if counts == last:
            return counts
        last = counts
        time.sleep(0.005)
    return last


def counted(before: dict, after: dict) -> dict:
    """What one case added to each model's counts, the models it left alone left out."""
    added = {}
    for model, counts in after.items():
        earlier = before.get(model, {})
        delta = {key: value - earlier.get(key, 0) for key, value in counts.items()
                 if value != earlier.get(key, 0)}
        if delta:
            added[model] = delta
    return added


def reworded(answer):
    if isinstance(answer, str):
        for ours, theirs in REWORDED:
            answer = answer.replace(ours, theirs)
        return answer
    if isinstance(answer, (list, tuple)):
        return type(answer)(reworded(item) for item in answer)
    if isinstance(answer, dict):
        return {key: reworded(value) for key, value in answer.items()}
    return answer


def differs(triton, shmserve) -> bool:
    shmserve = reworded(shmserve)
    if triton == shmserve:
        return False
    # Triton's 500 for a malformed body or parameter, where the reference asks for 400.
    if (isinstance(triton, tuple) and triton[0] == 500 and shmserve[0] == 400 and
            isinstance(triton[1], dict) and TRITON_PARSE_500.match(triton[1].get("error", ""))):
        return False
    return True


@contextlib.contextmanager
def extra_args(flags: str):
    """Both servers started inside get `flags` (the anchors' TRITON_EXTRA_ARGS, shmserve's
    SHMSERVE_EXTRA_ARGS)."""
    saved = {key: os.environ.get(key) for key in ("TRITON_EXTRA_ARGS", "SHMSERVE_EXTRA_ARGS")}
    for key, value in saved.items():
        os.environ[key] = f"{value or ''} {flags}".strip()
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def remove_triton_leftovers(before: set) -> None:
    """Triton's Python backend can leave its segments behind when a stub dies (a model that
    fails to load, say): remove those this run's Triton made."""
    for name in set(os.listdir("/dev/shm")) - before:
        if name.startswith("triton_python_backend_shm_region_"):
            print(f"removed /dev/shm/{name}, left by Triton", file=sys.stderr)
            os.unlink(f"/dev/shm/{name}")


def shown_difference(triton, shmserve) -> list:
    """Two lines, one per server: the answers; of two lists (an index) the items only one
    has, of two objects (a config) the keys whose values differ."""
    if (isinstance(triton, tuple) and isinstance(shmserve, tuple) and len(triton) == len(shmserve) == 2
            and type(triton[1]) is type(shmserve[1])):
        theirs, ours = triton[1], shmserve[1]
        if isinstance(theirs, list):
            triton, shmserve = ((triton[0], [item for item in theirs if item not in ours]),
                                (shmserve[0], [item for item in ours if item not in theirs]))
        elif isinstance(theirs, dict):
            keys = [key for key in theirs.keys() | ours.keys() if theirs.get(key) != ours.get(key)]
            triton, shmserve = ((triton[0], {key: theirs.get(key) for key in keys}),
                                (shmserve[0], {key: ours.get(key) for key in keys}))
    return [f"  triton   {str(triton)[:600]}", f"  shmserve {str(shmserve)[:600]}"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_server_arguments(ap)
    ap.add_argument("--verbose", action="store_true", help="print the known differences too")
    args = ap.parse_args()
    log_dir = PERF_DIR / "results" / time.strftime("compat-%Y%m%d-%H%M%S")
    log_dir.mkdir(parents=True)
    # triton_repo, the streaming text model of model_repository/, and the test models that
    # show what generate makes of a body's keys.
    repo = log_dir / "repo"
    shutil.copytree(PERF_DIR / "triton_repo", repo, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO_ROOT / "model_repository" / "textgen", repo / "textgen",
                    ignore=shutil.ignore_patterns("__pycache__", "corpus.txt", "train.py"))
    for name in ("params_echo", "keyword_inputs", "sender_misuse"):
        shutil.copytree(REPO_ROOT / "tests" / "models" / name, repo / name,
                        ignore=shutil.ignore_patterns("__pycache__"))
    segments_before = set(os.listdir("/dev/shm"))
    triton = TritonServer(args.anchors, anchors_env(args.anchors), repo, log_dir / "triton.log")
    shmserve = ShmServer(repo, tuple(args.shmserve_ports), log_dir / "shmserve.log")
    try:
        triton.start()
        shmserve.start()
        theirs = answers(triton.ports)
        ours = answers(shmserve.ports)
        for server in (shmserve, triton):
            server.stop()
        # Again in explicit model control, on a copy of the repository (loads with files
        # must not write into it, but a bug might).
        explicit = log_dir / "explicit_repo"
        shutil.copytree(repo, explicit, ignore=shutil.ignore_patterns("__pycache__"))
        write_broken_models(explicit)
        (explicit / "no_config" / "1").mkdir(parents=True)
        (explicit / "no_config" / "1" / "model.py").write_text(NO_CONFIG_MODEL)
        triton = TritonServer(args.anchors, anchors_env(args.anchors), explicit,
                              log_dir / "triton_explicit.log")
        shmserve = ShmServer(explicit, tuple(args.shmserve_ports), log_dir / "shmserve_explicit.log")
        with extra_args("--model-control-mode=explicit"):
            triton.start()
            shmserve.start()
        theirs.update(management_answers(triton.ports))
        ours.update(management_answers(shmserve.ports))
    except (ServerError, OSError) as e:
        print(f"ERROR: {e}", file=sys.stderr)
        return 1
    finally:
        for server in (shmserve, triton):
            server.stop()
        remove_triton_leftovers(segments_before)
    new = 0
    for name in theirs.keys() | ours.keys():
        if not differs(theirs.get(name), ours.get(name)):
            continue
        known = KNOWN.get(name)
        if known is None and name.startswith("counted ") and name[8:] in KNOWN:
            known = "what it answers differs (above), and with it what it counts"
        new += known is None
        if known is None or args.verbose:
            print(f"{'known' if known else 'NEW'}: {name}" + (f"  ({known})" if known else ""))
            for line in shown_difference(theirs.get(name), ours.get(name)):
                print(line)
    same = sorted(name for name in KNOWN if name in theirs and not differs(theirs[name], ours.get(name)))
    if same:  # a difference kept on purpose that is gone: its entry is stale
        print("known differences that did not show: " + ", ".join(same))
    print(f"{len(theirs)} cases, {new} unexpected differences; logs in {log_dir}")
    return 1 if new else 0


if __name__ == "__main__":
    sys.exit(main())
