"""The first pass against one server: every case of the battery in order, what each added to the
counts, then the structure of the statistics, the index, the metadata and config of every
model over both protocols, and the metric families (names, types and label keys; not values)."""
import re
import urllib.request

import grpc
from google.protobuf import json_format
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from .calls import grpc_answer, http_call, http_headers, raw_exchange, stream_answer
from .compare import shape_of
from .counts import all_counts, counted
from .datatype_cases import datatype_cases, grpc_datatype_cases
from .grpc_cases import grpc_cases, stream_cases
from .http_cases import header_cases, http_cases, transport_cases
from .shm_cases import shm_answers


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
