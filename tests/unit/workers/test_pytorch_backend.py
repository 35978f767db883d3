"""The PyTorch backend's binding rules, parameters and batches, on TorchScript modules scripted
here and loaded in this process (the end-to-end tests serve them: tests/e2e/
test_pytorch_backend.py)."""

import os
from typing import Dict, List

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from workers.backends import BackendError, Context  # noqa: E402
from workers.backends import pytorch as backend  # noqa: E402
from workers.backends.batch import Input, Request  # noqa: E402


class AddSub(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor):
        return a + b, a - b


class TakesDict(torch.nn.Module):
    def forward(self, d: Dict[str, torch.Tensor]):
        return d["x"]


class TakesInt(torch.nn.Module):
    def forward(self, x: torch.Tensor, n: int):
        return x * n


class TwoDicts(torch.nn.Module):
    def forward(self, x: torch.Tensor, d: Dict[str, torch.Tensor], e: Dict[str, torch.Tensor]):
        return x


class Strings(torch.nn.Module):
    def forward(self, s: List[str]) -> List[str]:
        return s


def arguments(module):
    schema = torch.jit.script(module)._c._get_method("forward").schema
    return list(schema.arguments)[1:]


def fp32(name, dims=(4,)):
    return {"name": name, "data_type": "TYPE_FP32", "dims": list(dims)}


def config(inputs, outputs=(), max_batch_size=4, **more):
    return dict({"name": "m", "max_batch_size": max_batch_size, "input": list(inputs),
                 "output": list(outputs) or [fp32("OUT")]}, **more)


# --- binding -----------------------------------------------------------------------------------


def test_inputs_by_argument_name_in_any_config_order():
    ios, as_dict = backend.bind_inputs("m", config([fp32("b"), fp32("a")]), arguments(AddSub()))
    assert [(io.name, io.index) for io in ios] == [("b", 1), ("a", 0)] and not as_dict


def test_inputs_by_name_index():
    ios, _ = backend.bind_inputs("m", config([fp32("X__1"), fp32("Y__0")]), arguments(AddSub()))
    assert [(io.name, io.index) for io in ios] == [("X__1", 1), ("Y__0", 0)]


def test_inputs_by_config_order_when_names_say_nothing():
    ios, _ = backend.bind_inputs("m", config([fp32("second"), fp32("X__0")]),
                                 arguments(AddSub()))
    assert [(io.name, io.index) for io in ios] == [("second", 0), ("X__0", 1)]


def test_a_dict_input_takes_any_number_of_inputs():
    ios, as_dict = backend.bind_inputs("m", config([fp32("x"), fp32("y"), fp32("z")]),
                                       arguments(TakesDict()))
    assert as_dict and [io.name for io in ios] == ["x", "y", "z"]


@pytest.mark.parametrize("module,inputs,message", [
    (AddSub(), [fp32("a")], "unable to load model 'm', configuration expects 1 inputs, model "
                            "provides 2"),
    (AddSub(), [fp32("a__0"), fp32("b__7")], "input 'b__7' names forward() argument 7, but "
                                             "forward() takes 2 inputs"),
    (AddSub(), [fp32("a__1"), fp32("b__1")], "name the same forward() argument twice"),
    (AddSub(), [], "configuration expects 0 inputs, model provides 2"),
    (TakesDict(), [], "model configuration must contain at least one input, none were "
                      "specified."),
    (TakesInt(), [fp32("x"), fp32("n")], "An input of type 'int' was detected in the model. "
                                         "Only a single input of type Dict(str, Tensor) or "
                                         "input(s) of type Tensor are supported."),
    (TwoDicts(), [fp32("x"), fp32("d"), fp32("e")], "Multiple inputs of kind DictType were "
                                                    "detected."),
    (Strings(), [fp32("s")], "input 's' is TYPE_FP32, but forward() argument 's' is List[str]"),
    (AddSub(), [{"name": "a", "data_type": "TYPE_BF16", "dims": [4]}, fp32("b")],
     "unsupported datatype TYPE_BF16 for input 'a' for model 'm'"),
])
def test_inputs_that_do_not_fit_forward(module, inputs, message):
    with pytest.raises(BackendError) as err:
        backend.bind_inputs("m", config(inputs), arguments(module))
    assert message in str(err.value)


class Ragged(torch.nn.Module):
    """Each request's sum, from the flat batch and where each request ends."""

    def forward(self, x: torch.Tensor, ends: torch.Tensor):
        sums = torch.cumsum(x, 0)[ends.long() - 1]
        return x * 2, torch.diff(sums, prepend=torch.zeros(1)).unsqueeze(1)


def test_batch_inputs_bind_as_the_inputs_do():
    targets = [fp32("ends", [-1])]
    ios, _ = backend.bind_inputs("m", config([fp32("x")]), arguments(Ragged()), (), targets)
    assert [(io.name, io.index) for io in ios] == [("x", 0), ("ends", 1)]
    ios, _ = backend.bind_inputs("m", config([fp32("X__0")]), arguments(Ragged()), (),
                                 [fp32("E__1")])
    assert [(io.name, io.index) for io in ios] == [("X__0", 0), ("E__1", 1)]
    ios, _ = backend.bind_inputs("m", config([fp32("first")]), arguments(Ragged()), (),
                                 [fp32("E")])
    assert [(io.name, io.index) for io in ios] == [("first", 0), ("E", 1)]
    with pytest.raises(BackendError, match="batch input 'E' is not an argument of forward()"):
        backend.bind_inputs("m", config([fp32("x")]), arguments(Ragged()), (), [fp32("E")])
    with pytest.raises(BackendError, match="batch input 'E' does not follow the <name>__<index>"):
        backend.bind_inputs("m", config([fp32("X__0")]), arguments(Ragged()), (), [fp32("E")])
    with pytest.raises(BackendError, match="configuration expects 1 inputs, model provides 2"):
        backend.bind_inputs("m", config([fp32("x")]), arguments(Ragged()))


def test_a_ragged_batch_through_a_torchscript_model(tmp_path):
    (tmp_path / "1").mkdir()
    torch.jit.script(Ragged()).save(str(tmp_path / "1" / "model.pt"))
    ragged = config([dict(fp32("x", [-1]), allow_ragged_batch=True)],
                    [fp32("DOUBLED__0", [-1]), fp32("SUM__1", [1])], max_batch_size=8,
                    instance_group=[{"kind": "KIND_CPU", "count": 1}],
                    batch_input=[{"kind": "BATCH_ACCUMULATED_ELEMENT_COUNT",
                                  "target_name": ["ends"], "data_type": "TYPE_INT32",
                                  "source_input": ["x"]}],
                    batch_output=[{"kind": "BATCH_SCATTER_WITH_INPUT_SHAPE",
                                   "target_name": ["DOUBLED__0"], "source_input": ["x"]}])
    model = backend.load(context(str(tmp_path), ragged))
    values = [np.arange(n, dtype=np.float32).reshape(1, n) + n for n in (2, 5, 1)]
    requests = [Request("r", 0, 0, {}, [Input("x", "FP32", [1, v.size], memoryview(v.tobytes()))],
                        ["DOUBLED__0", "SUM__1"]) for v in values]
    responses, _ = model.execute(requests)
    assert [r.error for r in responses] == [None] * 3
    for v, response in zip(values, responses):
        doubled, total = response.outputs
        assert doubled.shape == [1, v.size]
        np.testing.assert_array_equal(doubled.array, v * 2)
        assert total.array.tolist() == [[float(v.sum())]]
    string_output = dict(ragged, output=[{"name": "DOUBLED__0", "data_type": "TYPE_STRING",
                                          "dims": [1], "reshape": {"shape": []}},
                                         fp32("SUM__1", [1])])
    with pytest.raises(BackendError, match="batch output 'DOUBLED__0' is TYPE_STRING"):
        backend.load(context(str(tmp_path), string_output))


def test_strings_are_one_dimensional():
    two_dims = {"name": "s", "data_type": "TYPE_STRING", "dims": [2]}
    with pytest.raises(BackendError, match="Triton only supports 1 dimensional List of String "
                                           "as input for 's' for model 'm'"):
        backend.bind_inputs("m", config([two_dims]), arguments(Strings()))
    flat = dict(two_dims, reshape={"shape": []})
    ios, _ = backend.bind_inputs("m", config([flat]), arguments(Strings()))
    assert ios[0].index == 0
    ios, _ = backend.bind_inputs("m", config([two_dims], max_batch_size=0),
                                 arguments(Strings()))
    assert ios[0].index == 0


class Accumulate(torch.nn.Module):
    def forward(self, x: torch.Tensor, start: torch.Tensor, state: torch.Tensor):
        return x + state * (1 - start), x


def test_sequence_controls_and_states_bind_by_name_index():
    int32 = {"data_type": "TYPE_INT32", "dims": [1]}
    extras = [dict(int32, name="START__2"), dict(int32, name="STATE__1")]
    ios, _ = backend.bind_inputs("m", config([dict(int32, name="X__0")]),
                                 arguments(Accumulate()), extras)
    assert [(io.name, io.index) for io in ios] == [("X__0", 0), ("START__2", 2), ("STATE__1", 1)]
    # Config inputs may follow any convention; the controls must have an index.
    with pytest.raises(BackendError, match="input 'START' does not follow the <name>__<index>"):
        backend.bind_inputs("m", config([dict(int32, name="x")]), arguments(Accumulate()),
                            [dict(int32, name="START"), dict(int32, name="STATE__1")])
    with pytest.raises(BackendError, match="configuration expects 2 inputs, model provides 3"):
        backend.bind_inputs("m", config([dict(int32, name="x")]), arguments(Accumulate()),
                            [dict(int32, name="START__1")])
    outs = backend.bind_outputs("m", config([], [dict(int32, name="Y__0")]),
                                returns(Accumulate()), [dict(int32, name="NEXT__1")])
    assert [(io.name, io.index, io.state) for io in outs] == [("Y__0", 0, False),
                                                              ("NEXT__1", 1, True)]


def returns(module):
    return torch.jit.script(module)._c._get_method("forward").schema.returns[0].type


def test_outputs_by_name_index_or_order():
    outs = backend.bind_outputs("m", config([], [fp32("B__1"), fp32("A__0")]), returns(AddSub()))
    assert [(io.name, io.index) for io in outs] == [("B__1", 1), ("A__0", 0)]
    outs = backend.bind_outputs("m", config([], [fp32("x"), fp32("y__0")]), returns(AddSub()))
    assert [(io.name, io.index) for io in outs] == [("x", 0), ("y__0", 1)]


def test_an_output_index_past_the_returned_tuple_fails_the_load():
    with pytest.raises(BackendError, match="the output C__2 in the model configuration refers "
                                           "to an output index which doesn't exist. This model "
                                           "has 2 outputs"):
        backend.bind_outputs("m", config([], [fp32("C__2")]), returns(AddSub()))
    with pytest.raises(BackendError, match="must contain at least one output"):
        backend.bind_outputs("m", {"name": "m", "output": []}, returns(AddSub()))


# --- parameters ------------------------------------------------------------------------------


def params(**values) -> dict:
    return {"name": "m", "parameters": {k: {"string_value": v} for k, v in values.items()},
            "instance_group": [{"kind": "KIND_CPU", "count": 1}]}


def test_parameters_as_triton_reads_them(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    options = backend.Options(params())
    assert options.inference_mode and options.optimized_execution and options.cudnn
    assert not options.cache_cleaning and options.intra_op_threads == 8
    assert options.tensor_fuser is options.jit_profiling is options.jit_executor is None
    options = backend.Options(params(INFERENCE_MODE="false", DISABLE_OPTIMIZED_EXECUTION="on",
                                     ENABLE_CACHE_CLEANING="1", DISABLE_CUDNN="true",
                                     ENABLE_TENSOR_FUSER="false", ENABLE_JIT_PROFILING="off",
                                     ENABLE_JIT_EXECUTOR="true", INTRA_OP_THREAD_COUNT="3",
                                     INTER_OP_THREAD_COUNT="2"))
    assert not options.inference_mode and not options.optimized_execution
    assert options.cache_cleaning and not options.cudnn
    assert (options.tensor_fuser, options.jit_profiling, options.jit_executor) == (
        False, False, True)
    assert (options.intra_op_threads, options.inter_op_threads) == (3, 2)
    four = dict(params(), instance_group=[{"kind": "KIND_CPU", "count": 4}])
    assert backend.Options(four).intra_op_threads == 2


@pytest.mark.parametrize("key,value,message", [
    ("INFERENCE_MODE", "sometimes", "parameter 'INFERENCE_MODE': failed to convert 'sometimes' "
                                    "to boolean"),
    ("INTRA_OP_THREAD_COUNT", "1.5", "parameter 'INTRA_OP_THREAD_COUNT': failed to convert "
                                     "'1.5' to integral number"),
])
def test_a_bad_parameter_is_named(key, value, message):
    with pytest.raises(BackendError) as err:
        backend.Options(params(**{key: value}))
    assert str(err.value) == f"unable to load model 'm': {message}"


# --- an instance -------------------------------------------------------------------------------


@pytest.fixture
def add_sub_dir(tmp_path):
    (tmp_path / "1").mkdir()
    torch.jit.script(AddSub()).save(str(tmp_path / "1" / "model.pt"))
    return str(tmp_path)


BATCHED = config([fp32("a"), fp32("b")], [fp32("SUM__0"), fp32("DIFF__1")], max_batch_size=8,
                 instance_group=[{"kind": "KIND_CPU", "count": 1}],
                 parameters={"INTRA_OP_THREAD_COUNT": {"string_value": "1"}})


def context(model_dir, model_config) -> Context:
    return Context(model_name="m", model_version=1, model_dir=model_dir,
                   model_config=model_config, instance_name="m_0_0", instance_kind="CPU",
                   device_id=0, model_repository=model_dir)


def request(block: memoryview, offsets, rows: int, outputs=("SUM__0", "DIFF__1")) -> Request:
    nbytes = rows * 16
    return Request("r", 0, 0, {}, [
        Input("a", "FP32", [rows, 4], block[offsets[0]:offsets[0] + nbytes]),
        Input("b", "FP32", [rows, 4], block[offsets[1]:offsets[1] + nbytes])], list(outputs))


def test_a_batch_runs_on_views_of_its_block_and_each_request_gets_its_rows(add_sub_dir):
    model = backend.load(context(add_sub_dir, BATCHED))
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = np.full((3, 4), 100, dtype=np.float32)
    block = memoryview(bytearray(a.tobytes() + b.tobytes()))
    one, two = request(block, (0, 48), 1), request(block, (16, 64), 2, outputs=("DIFF__1",))
    # The tensors forward() gets share the block's memory.
    stacked, sizes = model._stack([{t.name: np.ndarray(t.shape, np.float32, t.buffer)
                                    for t in r.inputs} for r in (one, two)])
    feeds = model._feeds(stacked)
    base = np.frombuffer(block, np.uint8).ctypes.data
    assert sizes == [1, 2] and [f.data_ptr() for f in feeds] == [base, base + 48]
    responses, timings = model.execute([one, two])
    assert [r.error for r in responses] == [None, None]
    assert [(o.name, o.shape) for o in responses[0].outputs] == [("SUM__0", [1, 4]),
                                                                 ("DIFF__1", [1, 4])]
    np.testing.assert_array_equal(responses[0].outputs[0].array, a[:1] + 100)
    assert [o.name for o in responses[1].outputs] == ["DIFF__1"]
    np.testing.assert_array_equal(responses[1].outputs[0].array, a[1:] - 100)
    assert timings.compute_infer_ns > 0


def test_requests_whose_shapes_differ_run_one_at_a_time(add_sub_dir):
    free = config([fp32("a", [-1]), fp32("b", [-1])], [fp32("SUM__0", [-1])],
                  max_batch_size=8, instance_group=[{"kind": "KIND_CPU", "count": 1}])
    model = backend.load(context(add_sub_dir, free))
    short, long = np.ones((1, 2), np.float32), np.ones((1, 3), np.float32)

    def req(x):
        data = memoryview(x.tobytes())
        return Request("r", 0, 0, {}, [Input("a", "FP32", list(x.shape), data),
                                       Input("b", "FP32", list(x.shape), data)], ["SUM__0"])

    responses, _ = model.execute([req(short), req(long)])
    assert [r.outputs[0].shape for r in responses] == [[1, 2], [1, 3]]


def test_a_missing_or_broken_model_file(tmp_path):
    (tmp_path / "1").mkdir()
    with pytest.raises(BackendError, match=r"unable to find '.*model.pt' for model instance "
                                           r"'m'"):
        backend.load(context(str(tmp_path), BATCHED))
    (tmp_path / "1" / "model.pt").write_bytes(b"not a zip")
    with pytest.raises(BackendError, match="failed to load model 'm': "):
        backend.load(context(str(tmp_path), BATCHED))


def test_a_decoupled_model_fails_the_load(add_sub_dir):
    decoupled = dict(BATCHED, model_transaction_policy={"decoupled": True})
    with pytest.raises(BackendError, match="does not support decoupled models"):
        backend.load(context(add_sub_dir, decoupled))
