"""Backends end to end: ONNX models built here with onnx's helper API (never downloaded), served
beside Python models, an ensemble mixing both, and models whose backend cannot run. Every ONNX
output is compared with onnxruntime run in this process, over HTTP and gRPC."""

import concurrent.futures
import os
import textwrap

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from tests.conftest import (random_values, run_sequences, start_server, stop_server,  # noqa: E402
                            wait_for_models)

PROTOCOLS = {"http": httpclient, "grpc": grpcclient}
SERVING = ("onnx_add", "onnx_types", "onnx_strings", "onnx_batched", "py_double", "ens_mixed",
           "onnx_folder", "onnx_neg", "onnx_bf16", "onnx_sequence")


def onnx_model(nodes, inputs, outputs, initializers=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # what every onnxruntime of the last years reads
    onnx.checker.check_model(model)
    return model


def tensor(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def add_sub_model():
    """SUM = A + B, DIFF = A - B, [batch, 16] FP32: it can batch."""
    return onnx_model(
        [helper.make_node("Add", ["A", "B"], ["SUM"]), helper.make_node("Sub", ["A", "B"], ["DIFF"])],
        [tensor("A", TensorProto.FLOAT, ["N", 16]), tensor("B", TensorProto.FLOAT, ["N", 16])],
        [tensor("SUM", TensorProto.FLOAT, ["N", 16]), tensor("DIFF", TensorProto.FLOAT, ["N", 16])])


# Config type, wire type, ONNX element type, numpy dtype of the test's values.
TYPES = [
    ("BOOL", TensorProto.BOOL, np.bool_), ("INT8", TensorProto.INT8, np.int8),
    ("INT16", TensorProto.INT16, np.int16), ("INT32", TensorProto.INT32, np.int32),
    ("INT64", TensorProto.INT64, np.int64), ("UINT8", TensorProto.UINT8, np.uint8),
    ("UINT16", TensorProto.UINT16, np.uint16), ("UINT32", TensorProto.UINT32, np.uint32),
    ("UINT64", TensorProto.UINT64, np.uint64), ("FP16", TensorProto.FLOAT16, np.float16),
    ("FP32", TensorProto.FLOAT, np.float32), ("FP64", TensorProto.DOUBLE, np.float64),
]


def types_model():
    """OUT_<type> = IN_<type> through Identity for each type; fixed shape [2, 3]: no batching."""
    nodes, inputs, outputs = [], [], []
    for wire, elem, _ in TYPES:
        nodes.append(helper.make_node("Identity", [f"IN_{wire}"], [f"OUT_{wire}"]))
        inputs.append(tensor(f"IN_{wire}", elem, [2, 3]))
        outputs.append(tensor(f"OUT_{wire}", elem, [2, 3]))
    return onnx_model(nodes, inputs, outputs)


def strings_model():
    """TEXT_OUT = TEXT (strings), LEN_OUT = its shape: [N] strings, batching."""
    return onnx_model(
        [helper.make_node("Identity", ["TEXT"], ["TEXT_OUT"]),
         helper.make_node("Shape", ["TEXT"], ["SHAPE"])],
        [tensor("TEXT", TensorProto.STRING, ["N", 2])],
        [tensor("TEXT_OUT", TensorProto.STRING, ["N", 2]),
         tensor("SHAPE", TensorProto.INT64, [2])])


def scaled_model():
    """Y = X * 3 + [0, 1, ..., 7] with its weights in an external-data file."""
    # numpy_helper stores raw bytes, the only form onnx moves to an external file
    weights = numpy_helper.from_array(np.arange(8, dtype=np.float32), "W")
    three = numpy_helper.from_array(np.array(3.0, dtype=np.float32), "K")
    return onnx_model(
        [helper.make_node("Mul", ["X", "K"], ["T"]), helper.make_node("Add", ["T", "W"], ["Y"])],
        [tensor("X", TensorProto.FLOAT, ["N", 8])], [tensor("Y", TensorProto.FLOAT, ["N", 8])],
        [weights, three])


def neg_model():
    """Y = -X, [batch, any]: large tensors go through the shared-memory arenas."""
    return onnx_model([helper.make_node("Neg", ["X"], ["Y"])],
                      [tensor("X", TensorProto.FLOAT, ["N", "D"])],
                      [tensor("Y", TensorProto.FLOAT, ["N", "D"])])


def bf16_model():
    """SAME = X, WIDE = X as FP32: BF16 in and out."""
    return onnx_model(
        [helper.make_node("Identity", ["X"], ["SAME"]),
         helper.make_node("Cast", ["X"], ["WIDE"], to=TensorProto.FLOAT)],
        [tensor("X", TensorProto.BFLOAT16, ["N", 4])],
        [tensor("SAME", TensorProto.BFLOAT16, ["N", 4]), tensor("WIDE", TensorProto.FLOAT, ["N", 4])])


def accumulator_model():
    """OUTPUT = STATE_IN * (1 - START) + INPUT, kept as STATE_OUT; CORRID_OUT = CORRID: a
    sequence model with a START control, a CORRID control and an implicit state."""
    one = numpy_helper.from_array(np.array(1, dtype=np.int32), "ONE")
    return onnx_model(
        [helper.make_node("Sub", ["ONE", "START"], ["KEEP"]),
         helper.make_node("Mul", ["STATE_IN", "KEEP"], ["KEPT"]),
         helper.make_node("Add", ["KEPT", "INPUT"], ["OUTPUT"]),
         helper.make_node("Identity", ["OUTPUT"], ["STATE_OUT"]),
         helper.make_node("Identity", ["CORRID"], ["CORRID_OUT"])],
        [tensor("INPUT", TensorProto.INT32, ["N", 1]), tensor("START", TensorProto.INT32, ["N", 1]),
         tensor("STATE_IN", TensorProto.INT32, ["N", 1]),
         tensor("CORRID", TensorProto.UINT64, ["N", 1])],
        [tensor("OUTPUT", TensorProto.INT32, ["N", 1]),
         tensor("STATE_OUT", TensorProto.INT32, ["N", 1]),
         tensor("CORRID_OUT", TensorProto.UINT64, ["N", 1])], [one])


def fixed_model():
    """[2, 3] in and out: cannot batch."""
    return onnx_model([helper.make_node("Neg", ["X"], ["Y"])],
                      [tensor("X", TensorProto.FLOAT, [2, 3])],
                      [tensor("Y", TensorProto.FLOAT, [2, 3])])


PY_DOUBLE = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x * 2)]))
        return out
"""

CONFIGS = {
    "onnx_batched": """
        max_batch_size: 8
        dynamic_batching { max_queue_delay_microseconds: 300000 }
        instance_group [ { count: 1 kind: KIND_CPU } ]
        model_warmup [ { name: "full" batch_size: 8 inputs [
          { key: "A" value: { data_type: TYPE_FP32 dims: [ 16 ] random_data: true } },
          { key: "B" value: { data_type: TYPE_FP32 dims: [ 16 ] zero_data: true } } ] } ]""",
    "onnx_fixed_claims_batching": "max_batch_size: 8",
    "onnx_mismatch": 'backend: "onnxruntime" platform: "pytorch_libtorch"',
    "onnx_bad_param": """
        parameters { key: "intra_op_thread_count" value: { string_value: "many" } }""",
    "onnx_bad_mode": """
        parameters { key: "execution_mode" value: { string_value: "2" } }""",
    "onnx_wrong_type": """
        backend: "onnxruntime" max_batch_size: 4
        input [ { name: "A" data_type: TYPE_INT32 dims: [ 16 ] },
                { name: "B" data_type: TYPE_FP32 dims: [ 16 ] } ]
        output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 16 ] } ]""",
    "unknown_backend": 'backend: "nosuchbackend"',
    "onnx_sequence": """
        backend: "onnxruntime" max_batch_size: 4
        sequence_batching {
          max_sequence_idle_microseconds: 5000000
          control_input [
            { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
            { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] } ]
          state [ { input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_INT32
                    dims: [ 1 ] } ] }
        input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
        output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] },
                 { name: "CORRID_OUT" data_type: TYPE_UINT64 dims: [ 1 ] } ]
        instance_group [ { count: 1 kind: KIND_CPU } ]""",
    "py_double": """
        backend: "python" max_batch_size: 8
        input [ { name: "IN" data_type: TYPE_FP32 dims: [ 16 ] } ]
        output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 16 ] } ]""",
    "ens_mixed": """
        platform: "ensemble" max_batch_size: 8
        input [ { name: "X" data_type: TYPE_FP32 dims: [ 16 ] } ]
        output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 16 ] },
                 { name: "DIFF" data_type: TYPE_FP32 dims: [ 16 ] } ]
        ensemble_scheduling { step [
          { model_name: "py_double" model_version: -1
            input_map { key: "IN" value: "X" } output_map { key: "OUT" value: "doubled" } },
          { model_name: "onnx_add" model_version: -1
            input_map [ { key: "A" value: "doubled" }, { key: "B" value: "X" } ]
            output_map [ { key: "SUM" value: "SUM" }, { key: "DIFF" value: "DIFF" } ] } ] }""",
}


def write_model(repo, name, files: dict, config: str | None = None):
    version = os.path.join(repo, name, "1")
    os.makedirs(version)
    for filename, content in files.items():
        path = os.path.join(version, filename)
        if isinstance(content, onnx.ModelProto):
            onnx.save(content, path)
        else:
            with open(path, "w") as f:
                f.write(textwrap.dedent(content))
    if config is not None:
        with open(os.path.join(repo, name, "config.pbtxt"), "w") as f:
            f.write(textwrap.dedent(config))


def build_repository(repo: str) -> None:
    # No config.pbtxt: the backend comes from model.onnx, the rest from the model.
    write_model(repo, "onnx_add", {"model.onnx": add_sub_model()})
    write_model(repo, "onnx_types", {"model.onnx": types_model()})
    write_model(repo, "onnx_strings", {"model.onnx": strings_model()})
    write_model(repo, "onnx_neg", {"model.onnx": neg_model()})
    write_model(repo, "onnx_bf16", {"model.onnx": bf16_model()})
    write_model(repo, "onnx_batched", {"model.onnx": add_sub_model()}, CONFIGS["onnx_batched"])
    write_model(repo, "onnx_sequence", {"model.onnx": accumulator_model()},
                CONFIGS["onnx_sequence"])
    # model.onnx as a folder: the graph and its external weights side by side.
    folder = os.path.join(repo, "onnx_folder", "1", "model.onnx")
    os.makedirs(folder)
    onnx.save(scaled_model(), os.path.join(folder, "model.onnx"), save_as_external_data=True,
              all_tensors_to_one_file=True, location="weights.bin", size_threshold=0)
    assert os.path.exists(os.path.join(folder, "weights.bin"))
    for name in ("onnx_fixed_claims_batching",):
        write_model(repo, name, {"model.onnx": fixed_model()}, CONFIGS[name])
    for name in ("onnx_mismatch", "onnx_bad_param", "onnx_bad_mode", "onnx_wrong_type"):
        write_model(repo, name, {"model.onnx": add_sub_model()}, CONFIGS[name])
    write_model(repo, "unknown_backend", {"model.py": PY_DOUBLE}, CONFIGS["unknown_backend"])
    write_model(repo, "py_double", {"model.py": PY_DOUBLE}, CONFIGS["py_double"])
    os.makedirs(os.path.join(repo, "ens_mixed", "1"))
    with open(os.path.join(repo, "ens_mixed", "config.pbtxt"), "w") as f:
        f.write(textwrap.dedent(CONFIGS["ens_mixed"]))


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("backends"))
    build_repository(path)
    return path


@pytest.fixture(scope="module")
def server(repo, tmp_path_factory):
    log = str(tmp_path_factory.mktemp("logs") / "shmserve.log")
    srv = start_server(repo, log, "--backend-config=onnxruntime,default-max-batch-size=8")
    try:
        # Each instance imports its framework: on a busy 2-core machine that takes a while.
        wait_for_models(srv, SERVING, timeout=180)
        yield srv
    finally:
        stop_server(srv, timeout=90)


def reference(model: onnx.ModelProto, feeds: dict) -> dict:
    """What onnxruntime in this process makes of `feeds`."""
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds)))


def infer(clients, protocol, model, arrays: dict, outputs=None):
    lib = PROTOCOLS[protocol]
    inputs = []
    for name, (datatype, array) in arrays.items():
        t = lib.InferInput(name, list(array.shape), datatype)
        t.set_data_from_numpy(array)
        inputs.append(t)
    requested = [lib.InferRequestedOutput(n) for n in outputs] if outputs else None
    return clients[protocol].infer(model, inputs, outputs=requested)


def index(clients) -> dict:
    return {m["name"]: m for m in clients["http"].get_model_repository_index()}


# --- auto-complete -------------------------------------------------------------------------


def test_the_served_config_is_the_one_auto_complete_made(clients):
    cfg = clients["http"].get_model_config("onnx_add")
    assert (cfg["name"], cfg["platform"], cfg["backend"], cfg["default_model_filename"]) == (
        "onnx_add", "onnxruntime_onnx", "onnxruntime", "model.onnx")
    # --backend-config=onnxruntime,default-max-batch-size=8, and dynamic batching with it
    assert cfg["max_batch_size"] == 8
    assert cfg["dynamic_batching"]["preferred_batch_size"] == [8]
    assert [(t["name"], t["data_type"], t["dims"]) for t in cfg["input"]] == [
        ("A", "TYPE_FP32", [16]), ("B", "TYPE_FP32", [16])]
    assert [(t["name"], t["data_type"], t["dims"]) for t in cfg["output"]] == [
        ("SUM", "TYPE_FP32", [16]), ("DIFF", "TYPE_FP32", [16])]
    # Triton runs two CPU instances of an ONNX model by default.
    assert [(g["kind"], g["count"]) for g in cfg["instance_group"]] == [("KIND_CPU", 2)]
    grpc_cfg = clients["grpc"].get_model_config("onnx_add").config
    assert grpc_cfg.max_batch_size == 8 and grpc_cfg.HasField("dynamic_batching")
    assert [list(t.dims) for t in grpc_cfg.input] == [[16], [16]]


def test_a_model_that_cannot_batch_completes_to_max_batch_size_0(clients):
    cfg = clients["http"].get_model_config("onnx_types")
    assert cfg["max_batch_size"] == 0 and "dynamic_batching" not in cfg
    assert [(t["name"], t["data_type"], t["dims"]) for t in cfg["input"]] == [
        (f"IN_{wire}", "TYPE_BOOL" if wire == "BOOL" else f"TYPE_{wire}", [2, 3])
        for wire, _, _ in TYPES]


# --- inference -------------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_outputs_match_onnxruntime(clients, protocol):
    rng = np.random.default_rng(3)
    a, b = rng.random((3, 16), np.float32), rng.random((3, 16), np.float32)
    want = reference(add_sub_model(), {"A": a, "B": b})
    result = infer(clients, protocol, "onnx_add", {"A": ("FP32", a), "B": ("FP32", b)})
    np.testing.assert_array_equal(result.as_numpy("SUM"), want["SUM"])
    np.testing.assert_array_equal(result.as_numpy("DIFF"), want["DIFF"])
    only = infer(clients, protocol, "onnx_add", {"A": ("FP32", a), "B": ("FP32", b)},
                 outputs=["DIFF"])
    assert only.as_numpy("SUM") is None
    np.testing.assert_array_equal(only.as_numpy("DIFF"), want["DIFF"])


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_large_tensors_through_shared_memory_arenas(clients, protocol):
    x = np.random.default_rng(4).random((3, 100_000), np.float32)  # 1.2 MB: not inline
    for _ in range(3):
        result = infer(clients, protocol, "onnx_neg", {"X": ("FP32", x)})
        np.testing.assert_array_equal(result.as_numpy("Y"), reference(neg_model(), {"X": x})["Y"])
    cfg = clients["http"].get_model_config("onnx_neg")
    assert [(t["name"], t["dims"]) for t in cfg["input"]] == [("X", [-1])]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_bf16(clients, protocol):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    x = np.array([[1.5, -2.0, 3.25, 0.0], [1e10, -1e-3, 7.0, 8.0]], dtype=ml_dtypes.bfloat16)
    session = ort.InferenceSession(bf16_model().SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    value = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(x.view(np.uint16),
                                                            TensorProto.BFLOAT16)
    want = session.run_with_ort_values(["WIDE"], {"X": value})[0].numpy()
    result = infer(clients, protocol, "onnx_bf16", {"X": ("BF16", x)})
    np.testing.assert_array_equal(result.as_numpy("WIDE"), want)
    same = result.as_numpy("SAME")
    assert same.view(np.uint16).tolist() == x.view(np.uint16).tolist()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_every_fixed_size_datatype(clients, protocol):
    rng = np.random.default_rng(5)
    arrays = {}
    for wire, _, dtype in TYPES:
        arrays[f"IN_{wire}"] = (wire, random_values(rng, dtype, (2, 3)))
    want = reference(types_model(), {name: v for name, (_, v) in arrays.items()})
    result = infer(clients, protocol, "onnx_types", arrays)
    for wire, _, dtype in TYPES:
        got = result.as_numpy(f"OUT_{wire}")
        assert got.dtype == np.dtype(dtype), wire
        np.testing.assert_array_equal(got, want[f"OUT_{wire}"])


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_bytes_tensors(clients, protocol):
    text = np.array([[b"hello", "grüße".encode()], [b"", b"x" * 300]], dtype=np.object_)
    want = reference(strings_model(), {"TEXT": np.array(
        [[v.decode() for v in row] for row in text], dtype=np.object_)})
    result = infer(clients, protocol, "onnx_strings", {"TEXT": ("BYTES", text)})
    got = result.as_numpy("TEXT_OUT")
    assert got.tolist() == [[v.encode() for v in row] for row in want["TEXT_OUT"]]
    assert got.tolist() == text.tolist()
    np.testing.assert_array_equal(result.as_numpy("SHAPE"), want["SHAPE"])


def test_invalid_utf8_fails_only_its_request(clients):
    text = np.array([[b"\xff\xfe", b"ok"]], dtype=np.object_)
    with pytest.raises(InferenceServerException, match="utf-8"):
        infer(clients, "http", "onnx_strings", {"TEXT": ("BYTES", text)})
    assert clients["http"].is_model_ready("onnx_strings")
    fine = np.array([[b"a", b"b"]], dtype=np.object_)
    result = infer(clients, "http", "onnx_strings", {"TEXT": ("BYTES", fine)})
    assert result.as_numpy("TEXT_OUT").tolist() == [[b"a", b"b"]]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_model_folder_with_external_weights(clients, protocol):
    x = np.arange(16, dtype=np.float32).reshape(2, 8)
    result = infer(clients, protocol, "onnx_folder", {"X": ("FP32", x)})
    np.testing.assert_array_equal(result.as_numpy("Y"), x * 3 + np.arange(8, dtype=np.float32))


def test_requests_are_batched_and_each_gets_its_rows(clients, server):
    rng = np.random.default_rng(6)
    batches = [(rng.random((n, 16), np.float32), rng.random((n, 16), np.float32))
               for n in (1, 2, 3, 1)]
    before = clients["http"].get_inference_statistics("onnx_batched")["model_stats"][0]

    def one(pair):
        with httpclient.InferenceServerClient(server.http_url) as client:
            inputs = []
            for name, array in zip("AB", pair):
                t = httpclient.InferInput(name, list(array.shape), "FP32")
                t.set_data_from_numpy(array)
                inputs.append(t)
            return client.infer("onnx_batched", inputs)

    with concurrent.futures.ThreadPoolExecutor(len(batches)) as pool:
        results = list(pool.map(one, batches))
    for (a, b), result in zip(batches, results):
        want = reference(add_sub_model(), {"A": a, "B": b})
        np.testing.assert_array_equal(result.as_numpy("SUM"), want["SUM"])
        np.testing.assert_array_equal(result.as_numpy("DIFF"), want["DIFF"])
    after = clients["http"].get_inference_statistics("onnx_batched")["model_stats"][0]
    inferred = after["inference_count"] - before["inference_count"]
    executions = after["execution_count"] - before["execution_count"]
    assert inferred == 7  # rows
    assert executions < len(batches), (executions, inferred)


def test_a_warmup_sample_runs_as_one_batch_of_its_size(clients):
    stats = clients["http"].get_inference_statistics("onnx_batched")["model_stats"][0]
    full = [b for b in stats["batch_stats"] if b["batch_size"] == 8]
    assert full and full[0]["compute_infer"]["count"] == 1  # no client sends 8 rows


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_sequence_controls_and_implicit_state(clients, protocol):
    sequences = {101: [1, 2, 3, 4], 202: [10, 20, 30], 303: [5]}
    got = run_sequences(clients[protocol], PROTOCOLS[protocol], "onnx_sequence", sequences,
                        "INPUT", ("OUTPUT", "CORRID_OUT"))
    for sequence_id, values in sequences.items():
        assert [r["OUTPUT"].tolist() for r in got[sequence_id]] == [
            [[int(v)]] for v in np.cumsum(values)], sequence_id
        assert {r["CORRID_OUT"].item() for r in got[sequence_id]} == {sequence_id}
    # A new sequence under an old id starts from the initial state again.
    again = run_sequences(clients[protocol], PROTOCOLS[protocol], "onnx_sequence", {101: [7]},
                          "INPUT", ("OUTPUT",))
    assert again[101][0]["OUTPUT"].tolist() == [[7]]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_an_ensemble_mixing_python_and_onnx_steps(clients, protocol):
    x = np.random.default_rng(8).random((2, 16), np.float32)
    want = reference(add_sub_model(), {"A": x * 2, "B": x})
    result = infer(clients, protocol, "ens_mixed", {"X": ("FP32", x)})
    np.testing.assert_array_equal(result.as_numpy("SUM"), want["SUM"])
    np.testing.assert_array_equal(result.as_numpy("DIFF"), want["DIFF"])


# --- models that do not load, and the rest that serves ----------------------------------------


def reason(clients, model) -> str:
    entry = index(clients)[model]
    assert entry["state"] == "UNAVAILABLE", entry
    return entry["reason"]


def test_an_unknown_backend_fails_only_its_model(clients):
    assert "unable to find backend library for backend 'nosuchbackend'" in reason(
        clients, "unknown_backend")
    for name in SERVING:
        assert clients["http"].is_model_ready(name), name


def test_a_backend_platform_mismatch_is_triton_s_error(clients):
    assert "unexpected 'platform' and 'backend' pair, got:pytorch_libtorch, onnxruntime" in \
        reason(clients, "onnx_mismatch")


def test_claiming_batching_for_a_model_that_cannot_batch(clients):
    assert ("autofill failed for model 'onnx_fixed_claims_batching': model does not support "
            "batching while non-zero max_batch_size is specified") in reason(
                clients, "onnx_fixed_claims_batching")


def test_bad_parameters_name_the_parameter(clients):
    assert ("parameter 'intra_op_thread_count': failed to convert 'many' to integral number"
            in reason(clients, "onnx_bad_param"))
    assert "parameter 'execution_mode': expected 0 (sequential) or 1 (parallel), got 2" in \
        reason(clients, "onnx_bad_mode")


def test_a_config_that_contradicts_the_model(clients):
    assert ("unable to load model 'onnx_wrong_type', configuration expects datatype TYPE_INT32 "
            "for input 'A', model provides TYPE_FP32") in reason(clients, "onnx_wrong_type")
