"""The PyTorch backend end to end: TorchScript models scripted or traced here (never
downloaded), bound to their configs by Triton's three naming rules, batched, in an ensemble
with ONNX and Python steps, and the load and execute errors Triton gives. Every output is
compared with the same module run by torch in this process, over HTTP and gRPC."""

import concurrent.futures
import os
import signal
import textwrap
import time
from typing import Dict, List

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

torch = pytest.importorskip("torch")

from tests.conftest import (random_values, run_sequences, start_server, stop_server,  # noqa: E402
                            wait_for_models)

# Among the longest modules of the suite (pytest --durations): -m "not slow" skips it.
pytestmark = pytest.mark.slow

PROTOCOLS = {"http": httpclient, "grpc": grpcclient}


class AddSub(torch.nn.Module):
    """(a + b, a - b); arguments named `a` and `b`."""

    def forward(self, a: torch.Tensor, b: torch.Tensor):
        return a + b, a - b


class Scale(torch.nn.Module):
    """x * 2 + y, from a dict."""

    def forward(self, inputs: Dict[str, torch.Tensor]):
        return inputs["x"] * 2 + inputs["y"]


class Shout(torch.nn.Module):
    """Strings upper-cased, and each one's length."""

    def forward(self, text: List[str]):
        lengths = torch.tensor([len(t) for t in text], dtype=torch.int64)
        return [t.upper() for t in text], lengths


class Identity(torch.nn.Module):
    def forward(self, b: torch.Tensor, u8: torch.Tensor, i8: torch.Tensor, i16: torch.Tensor,
                i32: torch.Tensor, i64: torch.Tensor, f16: torch.Tensor, f32: torch.Tensor,
                f64: torch.Tensor):
        return b, u8, i8, i16, i32, i64, f16, f32, f64


class Modes(torch.nn.Module):
    """Whether forward() ran in inference mode and with gradients on."""

    def forward(self, x: torch.Tensor):
        rows = x.shape[0]
        inference = torch.zeros([1]).is_inference()
        return (torch.full([rows, 1], int(inference), dtype=torch.int32),
                torch.full([rows, 1], int(torch.is_grad_enabled()), dtype=torch.int32))


class Fails(torch.nn.Module):
    def forward(self, x: torch.Tensor):
        if bool(x.sum() < 0):
            raise ValueError("negative input")
        return x.to(torch.int64)


class Negate(torch.nn.Module):
    def forward(self, x: torch.Tensor):
        return -x


class Accumulate(torch.nn.Module):
    """A running sum: the state unless START, plus the input; the sum is kept as the state."""

    def forward(self, x: torch.Tensor, start: torch.Tensor, state: torch.Tensor):
        total = state * (1 - start) + x
        return total, total


def mlp():
    """A traced two-layer network with fixed random weights (seeded)."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    net.eval()
    return torch.jit.trace(net, torch.zeros(1, 16))


def fp32(name, dims):
    return f'{{ name: "{name}" data_type: TYPE_FP32 dims: {dims} }}'


TYPES = [("b", "BOOL", np.bool_), ("u8", "UINT8", np.uint8), ("i8", "INT8", np.int8),
         ("i16", "INT16", np.int16), ("i32", "INT32", np.int32), ("i64", "INT64", np.int64),
         ("f16", "FP16", np.float16), ("f32", "FP32", np.float32), ("f64", "FP64", np.float64)]

MODELS = {
    # By forward() argument name; config order differs from the arguments'; outputs by index.
    "pt_named": (AddSub, f"""
        platform: "pytorch_libtorch" max_batch_size: 8
        dynamic_batching {{ max_queue_delay_microseconds: 300000 }}
        input [ {fp32("b", [4])}, {fp32("a", [4])} ]
        output [ {fp32("DIFF__1", [4])}, {fp32("SUM__0", [4])} ]"""),
    # By <name>__<index>; outputs in config order.
    "pt_indexed": (AddSub, f"""
        backend: "pytorch" max_batch_size: 4
        input [ {fp32("IN__1", [4])}, {fp32("IN__0", [4])} ]
        output [ {fp32("PLUS", [4])}, {fp32("MINUS", [4])} ]"""),
    # Neither: config order is argument order.
    "pt_ordered": (AddSub, f"""
        backend: "pytorch" max_batch_size: 0
        input [ {fp32("first", [2, 2])}, {fp32("second", [2, 2])} ]
        output [ {fp32("o1", [2, 2])}, {fp32("o2", [2, 2])} ]"""),
    "pt_dict": (Scale, f"""
        backend: "pytorch" max_batch_size: 4
        input [ {fp32("y", [3])}, {fp32("x", [3])} ]
        output [ {fp32("OUT__0", [3])} ]"""),
    "pt_strings": (Shout, """
        backend: "pytorch" max_batch_size: 4
        input [ { name: "text" data_type: TYPE_STRING dims: [ 1 ] reshape: { shape: [ ] } } ]
        output [ { name: "LOUD__0" data_type: TYPE_STRING dims: [ 1 ] reshape: { shape: [ ] } },
                 { name: "LEN__1" data_type: TYPE_INT64 dims: [ 1 ] reshape: { shape: [ ] } } ]"""),
    "pt_types": (Identity, "backend: \"pytorch\"\ninput [ " + ", ".join(
        f'{{ name: "{n}" data_type: TYPE_{t} dims: [ 2, 3 ] }}' for n, t, _ in TYPES)
        + " ]\noutput [ " + ", ".join(
        f'{{ name: "OUT_{n}__{i}" data_type: TYPE_{t} dims: [ 2, 3 ] }}'
        for i, (n, t, _) in enumerate(TYPES)) + " ]"),
    "pt_mlp": (mlp, f"""
        backend: "pytorch" max_batch_size: 8
        input [ {fp32("INPUT__0", [16])} ] output [ {fp32("OUTPUT__0", [4])} ]"""),
    "pt_neg": (Negate, f"""
        backend: "pytorch" max_batch_size: 4
        input [ {fp32("x", [-1])} ] output [ {fp32("y", [-1])} ]"""),
    "pt_modes": (Modes, f"""
        backend: "pytorch" max_batch_size: 4
        input [ {fp32("x", [1])} ]
        output [ {{ name: "INFERENCE__0" data_type: TYPE_INT32 dims: [ 1 ] }},
                 {{ name: "GRAD__1" data_type: TYPE_INT32 dims: [ 1 ] }} ]"""),
    "pt_modes_off": (Modes, f"""
        backend: "pytorch" max_batch_size: 4
        parameters {{ key: "INFERENCE_MODE" value: {{ string_value: "false" }} }}
        parameters {{ key: "DISABLE_OPTIMIZED_EXECUTION" value: {{ string_value: "true" }} }}
        parameters {{ key: "INTRA_OP_THREAD_COUNT" value: {{ string_value: "1" }} }}
        parameters {{ key: "INTER_OP_THREAD_COUNT" value: {{ string_value: "1" }} }}
        input [ {fp32("x", [1])} ]
        output [ {{ name: "INFERENCE__0" data_type: TYPE_INT32 dims: [ 1 ] }},
                 {{ name: "GRAD__1" data_type: TYPE_INT32 dims: [ 1 ] }} ]"""),
    # Declares FP32 where the model answers INT64, and fails on negative input.
    "pt_fails": (Fails, f"""
        backend: "pytorch" max_batch_size: 4
        input [ {fp32("x", [2])} ] output [ {fp32("y", [2])} ]"""),
    # Sequence controls and state bound by <name>__<index>, as Triton requires.
    "pt_sequence": (Accumulate, """
        backend: "pytorch" max_batch_size: 4
        sequence_batching {
          control_input [ { name: "START__1" control [ { kind: CONTROL_SEQUENCE_START
                                                         int32_false_true: [ 0, 1 ] } ] } ]
          state [ { input_name: "STATE__2" output_name: "STATE__1" data_type: TYPE_INT32
                    dims: [ 1 ] } ] }
        input [ { name: "INPUT__0" data_type: TYPE_INT32 dims: [ 1 ] } ]
        output [ { name: "OUTPUT__0" data_type: TYPE_INT32 dims: [ 1 ] } ]
        instance_group [ { count: 1 kind: KIND_CPU } ]"""),
    # Models that must not load.
    "pt_sequence_unnamed": (Accumulate, """
        backend: "pytorch" max_batch_size: 4
        sequence_batching {
          control_input [ { name: "START__1" control [ { kind: CONTROL_SEQUENCE_START
                                                         int32_false_true: [ 0, 1 ] } ] } ]
          state [ { input_name: "STATE" output_name: "STATE__1" data_type: TYPE_INT32
                    dims: [ 1 ] } ] }
        input [ { name: "INPUT__0" data_type: TYPE_INT32 dims: [ 1 ] } ]
        output [ { name: "OUTPUT__0" data_type: TYPE_INT32 dims: [ 1 ] } ]"""),
    "pt_too_few": (AddSub, f"""
        backend: "pytorch" max_batch_size: 4
        input [ {fp32("a", [4])} ] output [ {fp32("o", [4])} ]"""),
    "pt_string_tensor": (AddSub, f"""
        backend: "pytorch" max_batch_size: 0
        input [ {{ name: "a" data_type: TYPE_STRING dims: [ 4 ] }}, {fp32("b", [4])} ]
        output [ {fp32("o", [4])} ]"""),
    "pt_uint16": (AddSub, f"""
        backend: "pytorch" max_batch_size: 4
        input [ {{ name: "a" data_type: TYPE_UINT16 dims: [ 4 ] }}, {fp32("b", [4])} ]
        output [ {fp32("o", [4])} ]"""),
    "pt_bad_index": (AddSub, f"""
        backend: "pytorch" max_batch_size: 4
        input [ {fp32("a", [4])}, {fp32("b", [4])} ] output [ {fp32("o__2", [4])} ]"""),
    "pt_bad_param": (AddSub, f"""
        backend: "pytorch" max_batch_size: 4
        parameters {{ key: "INTRA_OP_THREAD_COUNT" value: {{ string_value: "lots" }} }}
        input [ {fp32("a", [4])}, {fp32("b", [4])} ] output [ {fp32("o", [4])} ]"""),
    "pt_no_config": (AddSub, None),
    "pt_not_torchscript": ("not a TorchScript archive", f"""
        platform: "pytorch_libtorch" max_batch_size: 4
        input [ {fp32("a", [4])} ] output [ {fp32("o", [4])} ]"""),
}
SERVING = ("pt_named", "pt_indexed", "pt_ordered", "pt_dict", "pt_strings", "pt_types", "pt_mlp",
           "pt_neg", "pt_modes", "pt_modes_off", "pt_fails", "onnx_double", "ens_three",
           "pt_sequence")

PY_PLUS_ONE = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
                    "OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy() + 1)])
                for r in requests]
"""

ENSEMBLE = f"""
    platform: "ensemble" max_batch_size: 4
    input [ {fp32("X", [4])} ]
    output [ {fp32("SUM", [4])}, {fp32("DIFF", [4])} ]
    ensemble_scheduling {{ step [
      {{ model_name: "onnx_double" model_version: -1
         input_map {{ key: "X" value: "X" }} output_map {{ key: "Y" value: "doubled" }} }},
      {{ model_name: "py_plus_one" model_version: -1
         input_map {{ key: "IN" value: "X" }} output_map {{ key: "OUT" value: "plus_one" }} }},
      {{ model_name: "pt_named" model_version: -1
         input_map [ {{ key: "a" value: "doubled" }}, {{ key: "b" value: "plus_one" }} ]
         output_map [ {{ key: "SUM__0" value: "SUM" }}, {{ key: "DIFF__1" value: "DIFF" }} ] }}
    ] }}"""


def write(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(textwrap.dedent(text))


def build_repository(repo: str) -> None:
    for name, (module, config) in MODELS.items():
        model_file = os.path.join(repo, name, "1", "model.pt")
        os.makedirs(os.path.dirname(model_file))
        if isinstance(module, str):
            write(model_file, module)
        else:
            scripted = module() if module is mlp else torch.jit.script(module())
            scripted.save(model_file)
        if config is not None:
            write(os.path.join(repo, name, "config.pbtxt"), config)
    write(os.path.join(repo, "py_plus_one", "1", "model.py"), PY_PLUS_ONE)
    write(os.path.join(repo, "py_plus_one", "config.pbtxt"), f"""
        backend: "python" max_batch_size: 4
        input [ {fp32("IN", [4])} ] output [ {fp32("OUT", [4])} ]""")
    write(os.path.join(repo, "ens_three", "config.pbtxt"), ENSEMBLE)
    os.makedirs(os.path.join(repo, "ens_three", "1"))
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper
    graph = helper.make_graph(
        [helper.make_node("Add", ["X", "X"], ["Y"])], "double",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    os.makedirs(os.path.join(repo, "onnx_double", "1"))
    onnx.save(model, os.path.join(repo, "onnx_double", "1", "model.onnx"))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = str(tmp_path_factory.mktemp("torch_models"))
    build_repository(repo)
    log = str(tmp_path_factory.mktemp("logs") / "shmserve.log")
    srv = start_server(repo, log, "--backend-config=onnxruntime,default-max-batch-size=4")
    try:
        # Each instance imports its framework: on a busy 2-core machine that takes a while.
        wait_for_models(srv, SERVING, timeout=180)
        yield srv
    finally:
        stop_server(srv, timeout=90)


def infer(client, lib, model, arrays: dict, outputs=None):
    inputs = []
    for name, (datatype, array) in arrays.items():
        t = lib.InferInput(name, list(array.shape), datatype)
        t.set_data_from_numpy(array)
        inputs.append(t)
    requested = [lib.InferRequestedOutput(n) for n in outputs] if outputs else None
    return client.infer(model, inputs, outputs=requested)


def run(clients, protocol, model, arrays, outputs=None):
    return infer(clients[protocol], PROTOCOLS[protocol], model, arrays, outputs)


def reference(module, *args):
    """The module's outputs in this process, as numpy arrays."""
    with torch.no_grad():
        result = module(*[torch.from_numpy(a) for a in args])
    results = result if isinstance(result, tuple) else (result,)
    return [r.numpy() for r in results]


def rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# --- binding by name, index and order ----------------------------------------------------------


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_inputs_bound_by_forward_argument_name(clients, protocol):
    a, b = rand(3, 4, seed=1), rand(3, 4, seed=2)
    total, diff = reference(AddSub(), a, b)
    result = run(clients, protocol, "pt_named", {"b": ("FP32", b), "a": ("FP32", a)})
    np.testing.assert_array_equal(result.as_numpy("SUM__0"), total)
    np.testing.assert_array_equal(result.as_numpy("DIFF__1"), diff)
    only = run(clients, protocol, "pt_named", {"b": ("FP32", b), "a": ("FP32", a)},
               outputs=["DIFF__1"])
    assert only.as_numpy("SUM__0") is None
    np.testing.assert_array_equal(only.as_numpy("DIFF__1"), diff)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_inputs_bound_by_name_index_and_outputs_by_order(clients, protocol):
    first, second = rand(2, 4, seed=3), rand(2, 4, seed=4)
    total, diff = reference(AddSub(), first, second)  # IN__0 is forward()'s first argument
    result = run(clients, protocol, "pt_indexed", {"IN__1": ("FP32", second),
                                                   "IN__0": ("FP32", first)})
    np.testing.assert_array_equal(result.as_numpy("PLUS"), total)
    np.testing.assert_array_equal(result.as_numpy("MINUS"), diff)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_inputs_bound_by_config_order(clients, protocol):
    first, second = rand(2, 2, seed=5), rand(2, 2, seed=6)
    total, diff = reference(AddSub(), first, second)
    result = run(clients, protocol, "pt_ordered", {"second": ("FP32", second),
                                                   "first": ("FP32", first)})
    np.testing.assert_array_equal(result.as_numpy("o1"), total)
    np.testing.assert_array_equal(result.as_numpy("o2"), diff)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_dict_input_gets_the_config_names_as_keys(clients, protocol):
    x, y = rand(2, 3, seed=7), rand(2, 3, seed=8)
    want = Scale()({"x": torch.from_numpy(x), "y": torch.from_numpy(y)}).numpy()
    result = run(clients, protocol, "pt_dict", {"x": ("FP32", x), "y": ("FP32", y)})
    np.testing.assert_array_equal(result.as_numpy("OUT__0"), want)


# --- datatypes, strings, sizes -----------------------------------------------------------------


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_every_datatype_torch_has(clients, protocol):
    rng = np.random.default_rng(9)
    arrays = {}
    for name, wire, dtype in TYPES:
        arrays[name] = (wire, random_values(rng, dtype, (2, 3)))
    result = run(clients, protocol, "pt_types", arrays)
    for index, (name, _, dtype) in enumerate(TYPES):
        got = result.as_numpy(f"OUT_{name}__{index}")
        assert got.dtype == np.dtype(dtype), name
        np.testing.assert_array_equal(got, arrays[name][1])


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_strings_are_lists_of_str(clients, protocol):
    # [3, 1] on the wire, reshaped to the List[str] of 3 that forward() takes, and back.
    text = np.array([["grüße".encode()], [b""], [b"torch"]], dtype=np.object_)
    result = run(clients, protocol, "pt_strings", {"text": ("BYTES", text)})
    # TorchScript's str: upper() of ASCII letters, len() in UTF-8 bytes
    loud, lengths = torch.jit.script(Shout())(["grüße", "", "torch"])
    assert result.as_numpy("LOUD__0").tolist() == [[t.encode()] for t in loud]
    assert result.as_numpy("LEN__1").tolist() == [[n] for n in lengths.tolist()] == [[7], [0], [5]]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_traced_network(clients, protocol):
    x = rand(5, 16, seed=10)
    want, = reference(mlp(), x)
    result = run(clients, protocol, "pt_mlp", {"INPUT__0": ("FP32", x)})
    np.testing.assert_allclose(result.as_numpy("OUTPUT__0"), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_large_tensors_through_shared_memory_arenas(clients, protocol):
    x = rand(2, 200_000, seed=11)  # 1.6 MB: not inline
    for _ in range(2):
        result = run(clients, protocol, "pt_neg", {"x": ("FP32", x)})
        np.testing.assert_array_equal(result.as_numpy("y"), -x)


def test_requests_are_batched_and_each_gets_its_rows(clients, server):
    pairs = [(rand(n, 4, seed=20 + n), rand(n, 4, seed=30 + n)) for n in (1, 3, 2, 1)]
    before = clients["http"].get_inference_statistics("pt_named")["model_stats"][0]

    def one(pair):
        with httpclient.InferenceServerClient(server.http_url) as client:
            return infer(client, httpclient, "pt_named",
                         {"a": ("FP32", pair[0]), "b": ("FP32", pair[1])})

    with concurrent.futures.ThreadPoolExecutor(len(pairs)) as pool:
        results = list(pool.map(one, pairs))
    for (a, b), result in zip(pairs, results):
        total, diff = reference(AddSub(), a, b)
        np.testing.assert_array_equal(result.as_numpy("SUM__0"), total)
        np.testing.assert_array_equal(result.as_numpy("DIFF__1"), diff)
    after = clients["http"].get_inference_statistics("pt_named")["model_stats"][0]
    assert after["inference_count"] - before["inference_count"] == 7
    assert after["execution_count"] - before["execution_count"] < len(pairs)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_an_ensemble_of_onnx_python_and_torchscript_steps(clients, protocol):
    x = rand(2, 4, seed=12)
    total, diff = reference(AddSub(), x + x, x + 1)
    result = run(clients, protocol, "ens_three", {"X": ("FP32", x)})
    np.testing.assert_array_equal(result.as_numpy("SUM"), total)
    np.testing.assert_array_equal(result.as_numpy("DIFF"), diff)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_sequence_controls_and_implicit_state(clients, protocol):
    sequences = {11: [1, 2, 3], 22: [100, -1], 33: [4]}
    got = run_sequences(clients[protocol], PROTOCOLS[protocol], "pt_sequence", sequences,
                        "INPUT__0", ("OUTPUT__0",))
    for sequence_id, values in sequences.items():
        assert [r["OUTPUT__0"].tolist() for r in got[sequence_id]] == [
            [[int(v)]] for v in np.cumsum(values)], sequence_id


def instance_workers(server, model: str) -> list:
    """The worker processes of `model`'s instances: those mapping its instances' segments."""
    found = []
    for pid in server.workers():
        try:
            with open(f"/proc/{pid}/maps") as f:
                if f".{model}_" in f.read():
                    found.append(pid)
        except OSError:
            pass
    return found


def test_a_killed_instance_restarts_and_serves_again(clients, server):
    x = rand(2, 16, seed=13)
    want, = reference(mlp(), x)
    victims = instance_workers(server, "pt_mlp")
    assert victims
    os.kill(victims[0], signal.SIGKILL)  # a worker of the server this module started
    deadline = time.monotonic() + 120
    while True:
        try:
            result = run(clients, "grpc", "pt_mlp", {"INPUT__0": ("FP32", x)})
            if victims[0] not in instance_workers(server, "pt_mlp"):
                break
        except InferenceServerException:
            pass
        assert time.monotonic() < deadline, server.log()[-3000:]
        time.sleep(0.2)
    np.testing.assert_allclose(result.as_numpy("OUTPUT__0"), want, rtol=1e-6, atol=1e-6)
    assert "died; restarting" in server.log()


# --- parameters ------------------------------------------------------------------------------


def test_inference_mode_is_on_unless_the_parameter_turns_it_off(clients):
    x = np.zeros((1, 1), np.float32)
    on = run(clients, "http", "pt_modes", {"x": ("FP32", x)})
    assert (on.as_numpy("INFERENCE__0").item(), on.as_numpy("GRAD__1").item()) == (1, 0)
    off = run(clients, "http", "pt_modes_off", {"x": ("FP32", x)})
    # Without inference mode, gradients stay off as in Triton (a no_grad guard).
    assert (off.as_numpy("INFERENCE__0").item(), off.as_numpy("GRAD__1").item()) == (0, 0)


# --- errors ----------------------------------------------------------------------------------


def reason(clients, model) -> str:
    entry = {m["name"]: m for m in clients["http"].get_model_repository_index()}[model]
    assert entry["state"] == "UNAVAILABLE", entry
    return entry["reason"]


@pytest.mark.parametrize("model,message", [
    ("pt_too_few", "unable to load model 'pt_too_few', configuration expects 1 inputs, model "
                   "provides 2"),
    ("pt_string_tensor", "input 'a' is TYPE_STRING, but forward() argument 'a' is Tensor"),
    ("pt_uint16", "unsupported datatype TYPE_UINT16 for input 'a' for model 'pt_uint16'"),
    ("pt_bad_index", "the output o__2 in the model configuration refers to an output index "
                     "which doesn't exist. This model has 2 outputs"),
    ("pt_bad_param", "parameter 'INTRA_OP_THREAD_COUNT': failed to convert 'lots' to integral "
                     "number"),
    ("pt_no_config", "unable to load model 'pt_no_config', configuration expects 0 inputs, "
                     "model provides 2"),
    ("pt_not_torchscript", "failed to load model 'pt_not_torchscript': "),
    ("pt_sequence_unnamed", "PyTorch model 'pt_sequence_unnamed' is using sequence batching "
                            "but input 'STATE' does not follow the <name>__<index> naming "
                            "convention."),
])
def test_models_that_do_not_fit_their_config_fail_to_load_saying_why(clients, model, message):
    assert message in reason(clients, model)
    assert clients["http"].is_model_ready("pt_named")


def test_the_served_config_is_not_auto_completed(clients):
    cfg = clients["http"].get_model_config("pt_named")
    assert (cfg["platform"], cfg["backend"]) == ("pytorch_libtorch", "pytorch")
    assert [t["name"] for t in cfg["input"]] == ["b", "a"]
    # Triton fills in the platform and file name of a config that names only the backend.
    indexed = clients["http"].get_model_config("pt_indexed")
    assert (indexed["platform"], indexed["default_model_filename"]) == (
        "pytorch_libtorch", "model.pt")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_execute_errors_are_triton_s(clients, protocol):
    with pytest.raises(InferenceServerException) as err:
        run(clients, protocol, "pt_fails", {"x": ("FP32", np.ones((1, 2), np.float32))})
    assert ("configuration expects datatype TYPE_FP32 for output 'y', model provides "
            "TYPE_INT64") in str(err.value)
    with pytest.raises(InferenceServerException) as err:
        run(clients, protocol, "pt_fails", {"x": ("FP32", -np.ones((1, 2), np.float32))})
    assert "PyTorch execute failure: " in str(err.value)
    assert "negative input" in str(err.value)
    assert clients[protocol].is_model_ready("pt_fails")
