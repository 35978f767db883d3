"""The datatype cases, on all_types (one input and output of each datatype): every datatype in
and out as JSON and as binary over HTTP, and as raw bytes and typed contents over gRPC, values
that do not fit, raw binary bodies, what a request asks of its outputs, parameters of every
type, batched shapes on identity_fp32, and config_features (a model that uses many config
fields). grpc_datatype_cases also holds the gRPC steps of a sequence on accumulate."""
import struct

from .calls import F4, M, T, binary, grpc_request, inp, raw_of


# Two values of each datatype, at the ends of its range where it has ends.
TYPE_VALUES = {
    "BOOL": [True, False], "UINT8": [0, 255], "UINT16": [0, 65535], "UINT32": [0, 2**32 - 1],
    "UINT64": [0, 2**64 - 1], "INT8": [-128, 127], "INT16": [-32768, 32767],
    "INT32": [-2**31, 2**31 - 1], "INT64": [-2**63, 2**63 - 1], "FP16": [0.1, 65504.0],
    "FP32": [0.1, 3.4e38], "FP64": [0.1, 1e308], "BYTES": ["abc", "\u00fc\u0000z"],
}


# ModelInferRequest's typed contents field of each datatype (FP16 has none).
TYPED_FIELDS = {"BOOL": "bool_contents", "UINT8": "uint_contents", "UINT16": "uint_contents",
                "UINT32": "uint_contents", "UINT64": "uint64_contents", "INT8": "int_contents",
                "INT16": "int_contents", "INT32": "int_contents", "INT64": "int64_contents",
                "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents"}


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
