"""The second pass, in explicit model control: a sequence of loads (unknown models, config
overrides good and bad, model files, models that fail to load, warmup samples good and bad),
unloads (with dependents), indexes, and requests to models not loaded; and the models written
into that pass's copy of the repository only (those that fail to load, those with warmup
samples, one without config.pbtxt)."""
import base64
import json
import struct
import time

import grpc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from .calls import M, grpc_answer, grpc_request, http_call, inp


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

    def grpc_load(name, **params):
        return ("grpc", "RepositoryModelLoad", _load_request(name, params))

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
        *((f"explicit load {name}", ("POST", f"{repo}/models/{name}/load", {}))
          for name in WARMUP_MODELS),
        *((f"explicit stats {name}", ("GET", f"/v2/models/{name}/stats")) for name in WARMUP_MODELS),
        ("explicit index after warmups", ("POST", repo + "/index", {})),
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


def _warmup(data, dims="1", data_type="TYPE_INT32", key="IN", batch_size=1, count=0):
    return (f'model_warmup [ {{ name: "w" batch_size: {batch_size} count: {count} inputs {{ '
            f'key: "{key}" value: {{ data_type: {data_type} dims: [ {dims} ] {data} }} }} }} ]\n')


# Models with model_warmup, written into the explicit pass's copy of the repository too: those
# that load (their statistics count the warmup) and those whose warmup fails or cannot be
# built (the reason). Files as for BROKEN_MODELS; warmup/ holds a sample's data file. Not among
# them: a model whose execute raises on a warmup sample, on which Triton 2.51 now and then dies
# (signal 11, seen in this probe; another run gave the reason that tests/e2e/test_warmup.py's
# failing sample has, with the Python backend's wording of a raise).
WARMUP_MODELS = {
    "warmup_ok": {"extra": _warmup("zero_data: true", count=3)},
    "warmup_file": {"extra": _warmup('input_data_file: "seven.bin"'),
                    "warmup/seven.bin": "\x07\x00\x00\x00"},
    "warmup_short": {"extra": _warmup('input_data_file: "short.bin"'), "warmup/short.bin": "ab"},
    "warmup_no_data": {"extra": _warmup("")},
    "warmup_wild": {"extra": _warmup("zero_data: true", dims="-1")},
    "warmup_type": {"extra": _warmup("zero_data: true", data_type="TYPE_FP32")},
    "warmup_other_input": {"extra": _warmup("zero_data: true", key="OTHER")},
    "warmup_batch": {"extra": _warmup("random_data: true", batch_size=2)},
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
    """BROKEN_MODELS and WARMUP_MODELS, into `repo`."""
    for name, files in {**BROKEN_MODELS, **WARMUP_MODELS}.items():
        folder = repo / name
        folder.mkdir()
        (folder / "config.pbtxt").write_text(_CONFIG.format(name=name, extra=files.get("extra", "")))
        for path, text in files.items():
            if path != "extra":
                (folder / path).parent.mkdir(parents=True, exist_ok=True)
                (folder / path).write_text(text)
        if files.get("extra") is not None and "1/model.py" not in files:
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
    for name, answer in out.items():
        if name.startswith("explicit stats warmup_"):
            out[name] = _without_times(answer)
        elif name == "explicit index after warmups" and isinstance(answer, tuple):
            # The warmup models' entries: the others' are compared in the cases before.
            out[name] = (answer[0], [entry for entry in answer[1]
                                     if entry.get("name", "").startswith("warmup_")])
    return out


def _without_times(answer):
    """Statistics with their durations and last inference time left out, their counts kept."""
    if isinstance(answer, (list, tuple)):
        return type(answer)(_without_times(item) for item in answer)
    if isinstance(answer, dict):
        return {key: 0 if key in ("ns", "last_inference") else _without_times(value)
                for key, value in answer.items()}
    return answer


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
