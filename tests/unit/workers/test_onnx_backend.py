"""The ONNX Runtime backend in this process: auto-complete, parameters, load checks, batches."""

import os

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper  # noqa: E402

from workers.backends import AutoCompleteContext, BackendError, Context  # noqa: E402
from workers.backends import onnxruntime as backend  # noqa: E402
from workers.backends import parameters  # noqa: E402
from workers.backends.batch import Input, Request  # noqa: E402


def save(tmp_path, nodes, inputs, outputs, name="m") -> str:
    graph = helper.make_graph(nodes, "g", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    (tmp_path / name / "1").mkdir(parents=True)
    onnx.save(model, str(tmp_path / name / "1" / "model.onnx"))
    return str(tmp_path / name)


def vi(name, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


@pytest.fixture
def add_model(tmp_path):
    return save(tmp_path, [helper.make_node("Add", ["A", "B"], ["C"])],
                [vi("A", ["N", 4]), vi("B", ["N", 4])], [vi("C", ["N", 4])])


def complete(model_dir, config=None, **settings):
    config = dict({"name": "m", "backend": "onnxruntime",
                   "default_model_filename": "model.onnx"}, **(config or {}))
    return backend.auto_complete(AutoCompleteContext(model_dir, "1", config, settings))


def test_auto_complete_of_a_model_that_can_batch(add_model):
    config = complete(add_model, **{"default-max-batch-size": "4"})
    assert config["max_batch_size"] == 4
    assert config["dynamic_batching"] == {}
    assert config["input"] == [{"name": "A", "data_type": "TYPE_FP32", "dims": [4]},
                               {"name": "B", "data_type": "TYPE_FP32", "dims": [4]}]
    assert config["output"] == [{"name": "C", "data_type": "TYPE_FP32", "dims": [4]}]


def test_auto_complete_keeps_a_given_max_batch_size_and_scheduler(add_model):
    config = complete(add_model, {"max_batch_size": 16, "sequence_batching": {}},
                      **{"default-max-batch-size": "4"})
    assert config["max_batch_size"] == 16 and "dynamic_batching" not in config
    assert complete(add_model, **{"default-max-batch-size": "1"}).get("dynamic_batching") is None
    assert complete(add_model, **{"default-max-batch-size": "0"})["input"][0]["dims"] == [-1, 4]


def test_a_config_listing_inputs_and_outputs_is_left_alone(add_model):
    given = {"input": [{"name": "A"}], "output": [{"name": "C"}]}
    assert complete(add_model, given) == dict(
        {"name": "m", "backend": "onnxruntime", "default_model_filename": "model.onnx"}, **given)
    # outputs alone: the inputs are completed, the outputs kept
    partial = complete(add_model, {"output": [{"name": "C"}]}, **{"default-max-batch-size": "2"})
    assert [t["name"] for t in partial["input"]] == ["A", "B"]
    assert partial["output"] == [{"name": "C"}]


def test_a_fixed_shape_model_cannot_batch(tmp_path):
    model = save(tmp_path, [helper.make_node("Neg", ["X"], ["Y"])], [vi("X", [2, 3])],
                 [vi("Y", [2, 3])])
    config = complete(model, {"max_batch_size": 0}, **{"default-max-batch-size": "4"})
    assert config["max_batch_size"] == 0 and "dynamic_batching" not in config
    assert config["input"][0]["dims"] == [2, 3]
    with pytest.raises(BackendError) as err:
        complete(model, {"max_batch_size": 8})
    assert str(err.value) == ("autofill failed for model 'm': model does not support batching "
                              "while non-zero max_batch_size is specified")


def test_a_scalar_of_a_batching_model_is_reshaped(tmp_path):
    model = save(tmp_path, [helper.make_node("Identity", ["X"], ["Y"])], [vi("X", ["N"])],
                 [vi("Y", ["N"])])
    config = complete(model, **{"default-max-batch-size": "4"})
    assert config["input"] == [{"name": "X", "data_type": "TYPE_FP32", "dims": [1],
                                "reshape": {"shape": []}}]


def test_a_bad_default_max_batch_size(add_model):
    with pytest.raises(BackendError, match="'default-max-batch-size': failed to convert 'x'"):
        complete(add_model, **{"default-max-batch-size": "x"})


def test_a_missing_model_file(tmp_path):
    (tmp_path / "m" / "1").mkdir(parents=True)
    with pytest.raises(BackendError, match=r"unable to find '.*/m/1/model.onnx' for model 'm'"):
        complete(str(tmp_path / "m"))


# --- parameters --------------------------------------------------------------------------------


def params(**values) -> dict:
    return {"name": "m", "parameters": {k: {"string_value": v} for k, v in values.items()}}


def test_parameters_reach_the_session_options():
    options, _ = backend.session_options(dict(
        params(intra_op_thread_count="3", inter_op_thread_count="2", execution_mode="1",
               enable_mem_arena="off", enable_mem_pattern="false"),
        optimization={"graph": {"level": 2}}))
    assert options.intra_op_num_threads == 3 and options.inter_op_num_threads == 2
    assert options.execution_mode == ort.ExecutionMode.ORT_PARALLEL
    assert not options.enable_cpu_mem_arena and not options.enable_mem_pattern
    assert options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    levels = {-1: ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
              1: ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
              0: ort.GraphOptimizationLevel.ORT_ENABLE_ALL}
    for level, expected in levels.items():
        options, _ = backend.session_options({"optimization": {"graph": {"level": level}}})
        assert options.graph_optimization_level == expected


@pytest.mark.parametrize("key,value,message", [
    ("intra_op_thread_count", "two", "parameter 'intra_op_thread_count': failed to convert "
                                     "'two' to integral number"),
    ("inter_op_thread_count", "1.5", "parameter 'inter_op_thread_count'"),
    ("execution_mode", "3", "parameter 'execution_mode': expected 0 (sequential) or 1 "
                            "(parallel), got 3"),
    ("enable_mem_arena", "maybe", "parameter 'enable_mem_arena': failed to convert 'maybe' to "
                                  "boolean"),
    ("enable_mem_pattern", "", "parameter 'enable_mem_pattern'"),
])
def test_a_bad_parameter_is_named(key, value, message):
    with pytest.raises(BackendError) as err:
        backend.session_options(params(**{key: value}))
    assert str(err.value).startswith("unable to load model 'm': ")
    assert message in str(err.value)


def test_the_default_intra_op_threads_share_the_cores_among_instances(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    groups = {"instance_group": [{"kind": "KIND_CPU", "count": 2},
                                 {"kind": "KIND_GPU", "count": 1, "gpus": [0, 1]}]}
    assert parameters.instance_count(groups) == 4
    assert parameters.default_intra_op_threads(groups) == 2
    options, _ = backend.session_options(groups)
    assert options.intra_op_num_threads == 2
    many = {"instance_group": [{"kind": "KIND_CPU", "count": 12}]}
    assert parameters.default_intra_op_threads(many) == 1


# --- instances ---------------------------------------------------------------------------------


def context(model_dir, config) -> Context:
    config = dict({"name": "m", "backend": "onnxruntime", "default_model_filename": "model.onnx",
                   "instance_group": [{"kind": "KIND_CPU", "count": 1}]}, **config)
    return Context(model_name="m", model_version=1, model_dir=model_dir, model_config=config,
                   instance_name="m_0_0", instance_kind="CPU", device_id=0,
                   model_repository=model_dir)


BATCHED = {"max_batch_size": 8,
           "input": [{"name": "A", "data_type": "TYPE_FP32", "dims": [4]},
                     {"name": "B", "data_type": "TYPE_FP32", "dims": [4]}],
           "output": [{"name": "C", "data_type": "TYPE_FP32", "dims": [4]}]}


def request(block: memoryview, offsets, rows: int) -> Request:
    nbytes = rows * 16
    return Request("r", 0, 0, {}, [
        Input("A", "FP32", [rows, 4], block[offsets[0]:offsets[0] + nbytes]),
        Input("B", "FP32", [rows, 4], block[offsets[1]:offsets[1] + nbytes])], ["C"])


def test_a_batch_feeds_views_of_its_block_and_splits_the_rows(add_model, monkeypatch):
    model = backend.load(context(add_model, BATCHED))
    # A batch's block: input A of both requests (1 row, then 2), then input B of both.
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = np.full((3, 4), 100, dtype=np.float32)
    block = memoryview(bytearray(a.tobytes() + b.tobytes()))
    fed = {}
    run = model._session.run

    def spy(names, feeds, options=None):
        fed.update(feeds)
        return run(names, feeds, options)

    monkeypatch.setattr(model._session, "run", spy)
    responses, timings = model.execute([request(block, (0, 48), 1), request(block, (16, 64), 2)])
    assert np.shares_memory(fed["A"], np.frombuffer(block, np.uint8))
    assert fed["A"].shape == (3, 4)
    assert [r.error for r in responses] == [None, None]
    np.testing.assert_array_equal(responses[0].outputs[0].array, a[:1] + 100)
    np.testing.assert_array_equal(responses[1].outputs[0].array, a[1:] + 100)
    assert responses[1].outputs[0].shape == [2, 4]
    assert timings.compute_infer_ns > 0


def test_requests_that_do_not_lie_back_to_back_are_concatenated(add_model):
    model = backend.load(context(add_model, BATCHED))
    x = np.ones((1, 4), np.float32)
    one = Request("a", 0, 0, {}, [Input("A", "FP32", [1, 4], memoryview(x.tobytes())),
                                  Input("B", "FP32", [1, 4], memoryview(x.tobytes()))], ["C"])
    two = Request("b", 0, 0, {}, [Input("A", "FP32", [1, 4], memoryview((x * 3).tobytes())),
                                  Input("B", "FP32", [1, 4], memoryview(x.tobytes()))], [])
    responses, _ = model.execute([one, two])
    np.testing.assert_array_equal(responses[0].outputs[0].array, x * 2)
    assert responses[1].outputs == []  # it asked for no output


def fp32(name, dims=(4,), **more) -> dict:
    return dict({"name": name, "data_type": "TYPE_FP32", "dims": list(dims)}, **more)


@pytest.mark.parametrize("config,message", [
    ({"max_batch_size": 0, "input": [fp32("A"), fp32("B", [-1, 4])]},
     "model 'm', tensor 'A': the model expects 2 dimensions (shape [-1,4]) but the model "
     "configuration specifies 1 dimensions (shape [4])"),
    ({"max_batch_size": 4, "input": [fp32("A", [5]), fp32("B")]},
     "model 'm', tensor 'A': the model expects 2 dimensions (shape [-1,4]) but the model "
     "configuration specifies 2 dimensions (an initial batch dimension because max_batch_size "
     "> 0 followed by the explicit tensor shape, making complete shape [-1,5])"),
    ({"max_batch_size": 4, "input": [fp32("B"), fp32("Z")]},
     "unable to load model 'm', unexpected inference input 'Z', allowed inputs are: A, B"),
    ({"max_batch_size": 4, "input": [fp32("A"), fp32("B")],
      "output": [{"name": "C", "data_type": "TYPE_FP16", "dims": [4]}]},
     "unable to load model 'm', configuration expects datatype TYPE_FP16 for output 'C', model "
     "provides TYPE_FP32"),
    # Triton counts the model's required inputs before it looks at their names.
    ({"max_batch_size": 4, "input": [fp32("A")]},
     "unable to load model 'm', configuration expects 1 inputs, model provides 2"),
    ({"max_batch_size": 4, "input": [fp32("A"), fp32("B")], "sequence_batching": {
        "control_input": [{"name": "START", "control": [{"int32_false_true": [0, 1]}]}]}},
     "unable to load model 'm', configuration expects 3 inputs, model provides 2"),
])
def test_a_config_that_does_not_fit_the_model_fails_the_load(add_model, config, message):
    with pytest.raises(BackendError) as err:
        backend.load(context(add_model, config))
    assert message in str(err.value)


def test_an_initializer_a_request_may_override_is_an_optional_input(tmp_path):
    from onnx import numpy_helper
    graph = helper.make_graph([helper.make_node("Add", ["A", "B"], ["C"])], "g",
                              [vi("A", ["N", 4]), vi("B", [4])], [vi("C", ["N", 4])],
                              initializer=[numpy_helper.from_array(np.ones(4, np.float32), "B")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    (tmp_path / "1").mkdir()
    onnx.save(model, str(tmp_path / "1" / "model.onnx"))
    config = {"max_batch_size": 0, "input": [fp32("A", [-1, 4]), fp32("B", optional=True)],
              "output": [fp32("C", [-1, 4])]}
    instance = backend.load(context(str(tmp_path), config))
    a = np.zeros((2, 4), np.float32)
    b = np.full(4, 5, np.float32)
    alone = Request("r", 0, 0, {}, [Input("A", "FP32", [2, 4], memoryview(a.tobytes()))], ["C"])
    both = Request("r", 0, 0, {}, [Input("A", "FP32", [2, 4], memoryview(a.tobytes())),
                                   Input("B", "FP32", [4], memoryview(b.tobytes()))], ["C"])
    responses, _ = instance.execute([alone, both])
    assert [r.outputs[0].array.tolist() for r in responses] == [[[1.0] * 4] * 2, [[5.0] * 4] * 2]
    batching = dict(config, max_batch_size=4, input=[fp32("A"), fp32("B", optional=True)],
                    output=[fp32("C")])
    with pytest.raises(BackendError) as err:
        backend.load(context(str(tmp_path), batching))
    assert str(err.value) == ("unable to load model 'm', optional input 'B' is not supported "
                              "for models that support batching")


def test_a_missing_model_file_names_the_instance(tmp_path):
    (tmp_path / "m" / "1").mkdir(parents=True)
    with pytest.raises(BackendError, match=r"unable to find '.*model.onnx' for model instance "
                                           r"'m_0_0'"):
        backend.load(context(str(tmp_path / "m"), BATCHED))


# --- execution providers -----------------------------------------------------------------------


ALL = ["TensorrtExecutionProvider", "CUDAExecutionProvider", "OpenVINOExecutionProvider",
       "CPUExecutionProvider"]


def accelerated(gpu=(), cpu=(), **parameters) -> dict:
    config = params(**parameters)
    config["optimization"] = {"execution_accelerators": {
        "gpu_execution_accelerator": list(gpu), "cpu_execution_accelerator": list(cpu)}}
    return config


def test_a_cpu_instance_runs_on_the_cpu_whatever_gpu_accelerators_say():
    config = accelerated(gpu=[{"name": "tensorrt"}, {"name": "anything"}])
    assert backend.execution_providers(config, "CPU", 0, ALL) == ["CPUExecutionProvider"]


def test_a_gpu_instance_gets_tensorrt_then_cuda_on_its_device():
    config = accelerated(gpu=[{"name": "tensorrt", "parameters": {
        "precision_mode": "FP16", "max_workspace_size_bytes": "1073741824",
        "trt_engine_cache_enable": "true", "trt_engine_cache_path": "/cache"}}],
        cudnn_conv_algo_search="1", gpu_mem_limit="4096")
    (trt, trt_options), (cuda, cuda_options), cpu = backend.execution_providers(
        config, "GPU", 1, ALL)
    assert (trt, cuda, cpu) == ("TensorrtExecutionProvider", "CUDAExecutionProvider",
                                "CPUExecutionProvider")
    assert trt_options == {"trt_fp16_enable": "1", "trt_max_workspace_size": "1073741824",
                           "trt_engine_cache_enable": "true", "trt_engine_cache_path": "/cache",
                           "device_id": "1"}
    assert cuda_options == {"cudnn_conv_algo_search": "HEURISTIC", "gpu_mem_limit": "4096",
                            "arena_extend_strategy": "kNextPowerOfTwo",
                            "do_copy_in_default_stream": "1", "device_id": "1"}


def test_openvino_on_the_cpu_when_onnxruntime_has_it(caplog):
    config = accelerated(cpu=[{"name": "openvino"}])
    assert backend.execution_providers(config, "CPU", 0, ALL) == [
        ("OpenVINOExecutionProvider", {"device_type": "CPU"}), "CPUExecutionProvider"]
    # This machine's onnxruntime has only the CPU provider: the model runs, and the log says why
    # not with OpenVINO.
    assert backend.execution_providers(config, "CPU", 0, ["CPUExecutionProvider"]) == [
        "CPUExecutionProvider"]
    assert "asks for OpenVINOExecutionProvider, which this onnxruntime does not have" in \
        caplog.text


@pytest.mark.parametrize("config,message", [
    (accelerated(gpu=[{"name": "tpu"}]), "unknown Execution Accelerator 'tpu' is requested"),
    (accelerated(cpu=[{"name": "tensorrt"}]),
     "unknown Execution Accelerator 'tensorrt' is requested"),
    (accelerated(gpu=[{"name": "tensorrt", "parameters": {"precision_mode": "FP8"}}]),
     "unsupported precision mode 'FP8' is requested"),
    (accelerated(gpu=[{"name": "tensorrt", "parameters": {"trt_wings": "1"}}]),
     "unknown parameter 'trt_wings' is provided for TensorRT Execution Accelerator"),
    (accelerated(gpu=[{"name": "tensorrt", "parameters": {"trt_dla_enable": "maybe"}}]),
     "parameter 'trt_dla_enable': failed to convert 'maybe' to boolean"),
    (accelerated(cudnn_conv_algo_search="3"),
     "unsupported cudnn_conv_algo_search value '3' is requested"),
])
def test_accelerators_triton_does_not_know_fail_the_load(config, message):
    with pytest.raises(BackendError) as err:
        backend.execution_providers(config, "GPU", 0, ALL)
    assert message in str(err.value)


def test_a_cpu_session_copies_device_inputs_to_the_host(add_model, monkeypatch):
    """An input in a client's CUDA region reaching an instance that runs on the CPU."""

    class Device(np.ndarray):
        """Stands in for a cupy array (no GPU here)."""

    monkeypatch.setattr(backend.cuda, "is_device_array", lambda a: isinstance(a, Device))
    monkeypatch.setattr(backend.cuda, "to_numpy", lambda a: np.array(a.view(np.ndarray)))
    model = backend.load(context(add_model, BATCHED))
    assert not model._on_gpu
    a = np.ones((1, 4), np.float32).view(Device)
    fed = model._to_ort(model._inputs[0], a)
    assert type(fed) is np.ndarray and fed.tolist() == [[1, 1, 1, 1]]
