"""Ragged batching: Triton's batch input kinds and the batch output scatter, then an ONNX model
run in this process with a ragged input, a batch input and a batch output."""

import numpy as np
import pytest

from workers.backends.batch import Input, Request
from workers.backends.ragged import NONE, BatchInput, BatchOutput, RaggedBatching

# Three requests of a batching model, as in Triton's ragged batching guide.
SHAPES = [(1, 3), (1, 4), (1, 5)]


@pytest.mark.parametrize("kind,want", [
    ("BATCH_ELEMENT_COUNT", [3, 4, 5]),
    ("BATCH_ACCUMULATED_ELEMENT_COUNT", [3, 7, 12]),
    ("BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO", [0, 3, 7, 12]),
    ("BATCH_ITEM_SHAPE", [[3], [4], [5]]),
    ("BATCH_ITEM_SHAPE_FLATTEN", [3, 4, 5]),
])
def test_each_kind_describes_the_batch(kind, want):
    for data_type, dtype in (("TYPE_INT32", np.int32), ("TYPE_FP32", np.float32)):
        array = BatchInput(kind, ("T",), data_type, "X").array(SHAPES)
        assert array.dtype == dtype and array.tolist() == want


def test_the_max_element_count_is_the_shape():
    array = BatchInput("BATCH_MAX_ELEMENT_COUNT_AS_SHAPE", ("T",), "TYPE_INT32", "X").array(
        [(2, 3), (1, 7), (1, 1)])
    assert array.shape == (7,)


def test_item_shapes_repeat_for_each_item_of_a_request():
    # A request of 2 items [2, 3] and one of 1 item [1, 5]; the items' shapes without the
    # batch dimension, one row per item.
    shapes = [(2, 2, 3), (1, 1, 5)]
    items = BatchInput("BATCH_ITEM_SHAPE", ("T",), "TYPE_INT32", "X").array(shapes)
    assert items.tolist() == [[2, 3], [2, 3], [1, 5]]
    flat = BatchInput("BATCH_ITEM_SHAPE_FLATTEN", ("T",), "TYPE_INT32", "X").array(shapes)
    assert flat.tolist() == [2, 3, 2, 3, 1, 5]


def test_a_batch_output_is_scattered_by_its_source_input_shapes():
    output = BatchOutput("Y", "X", (-1, -1))
    parts = output.scatter(np.arange(12), [(1, 3), (1, 4), (1, 5)])
    assert [p.tolist() for p in parts] == [[[0, 1, 2]], [[3, 4, 5, 6]], [[7, 8, 9, 10, 11]]]
    # Fixed dimensions stay as the config gives them.
    assert [p.shape for p in BatchOutput("Y", "X", (-1, 2)).scatter(
        np.zeros(6), [(1, 9), (2, 9)])] == [(1, 2), (2, 2)]
    with pytest.raises(ValueError, match="output 'Y' has 10 elements, fewer than"):
        output.scatter(np.arange(10), SHAPES)


def test_from_a_config():
    ragged = RaggedBatching.from_config({
        "max_batch_size": 8,
        "input": [{"name": "X", "dims": [-1], "allow_ragged_batch": True},
                  {"name": "Z", "dims": [2]}],
        "output": [{"name": "Y", "dims": [-1]}, {"name": "W", "dims": [1]}],
        "batch_input": [{"kind": "BATCH_ACCUMULATED_ELEMENT_COUNT", "target_name": ["I", "J"],
                         "data_type": "TYPE_FP32", "source_input": ["X"]}],
        "batch_output": [{"kind": "BATCH_SCATTER_WITH_INPUT_SHAPE", "target_name": ["Y"],
                          "source_input": ["X"]}]})
    assert ragged.ragged == {"X"}
    assert ragged.batch_outputs == {"Y": BatchOutput("Y", "X", (-1, -1))}
    assert [e["name"] for e in ragged.target_entries()] == ["I", "J"]
    assert RaggedBatching.from_config({"input": [{"name": "X", "dims": [1]}]}) == NONE


# --- an ONNX model in this process ------------------------------------------------------------

CONFIG = {
    "name": "m", "backend": "onnxruntime", "default_model_filename": "model.onnx",
    "instance_group": [{"kind": "KIND_CPU", "count": 1}], "max_batch_size": 8,
    "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [-1], "allow_ragged_batch": True}],
    "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [-1]},
               {"name": "END", "data_type": "TYPE_FP32", "dims": [1]}],
    "batch_input": [{"kind": "BATCH_ACCUMULATED_ELEMENT_COUNT", "target_name": ["INDEX"],
                     "data_type": "TYPE_FP32", "source_input": ["X"]}],
    "batch_output": [{"kind": "BATCH_SCATTER_WITH_INPUT_SHAPE", "target_name": ["Y"],
                      "source_input": ["X"]}],
}


def save_ragged(folder, x_shape=("E",)) -> str:
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from tests.onnx_graphs import ragged_doubler
    (folder / "1").mkdir(parents=True)
    onnx.save(ragged_doubler(x_shape), str(folder / "1" / "model.onnx"))
    return str(folder)


@pytest.fixture
def ragged_onnx(tmp_path):
    return save_ragged(tmp_path)


def load_onnx(model_dir, config):
    from workers.backends import Context
    from workers.backends import onnxruntime as backend
    return backend.load(Context(model_name="m", model_version=1, model_dir=model_dir,
                                model_config=config, instance_name="m_0_0",
                                instance_kind="CPU", device_id=0, model_repository=model_dir))


def ragged_request(values) -> Request:
    x = np.asarray(values, np.float32).reshape(1, -1)
    return Request("r", 0, 0, {}, [Input("X", "FP32", [1, x.size], memoryview(x.tobytes()))],
                   ["Y", "END"])


def test_an_onnx_model_gets_the_batch_flat_and_each_request_its_part(ragged_onnx):
    model = load_onnx(ragged_onnx, CONFIG)
    requests = [ragged_request(np.arange(n) + 10 * n) for n in (3, 4, 5)]
    responses, _ = model.execute(requests)
    assert [r.error for r in responses] == [None] * 3
    for n, end, response in zip((3, 4, 5), (3, 7, 12), responses):
        y, last = response.outputs
        assert (y.name, y.shape) == ("Y", [1, n])
        np.testing.assert_array_equal(y.array, 2 * (np.arange(n) + 10 * n).reshape(1, n))
        assert (last.name, last.array.tolist()) == ("END", [[end]])


def test_an_onnx_ragged_input_must_be_flat_in_the_model(ragged_onnx, tmp_path):
    from workers.backends import BackendError
    with pytest.raises(BackendError) as err:
        load_onnx(save_ragged(tmp_path / "2d", ("E", 2)), CONFIG)
    assert str(err.value) == ("unable to load model 'm', configuration expects model provides "
                              "input with shape [-1]  for ragged input 'X', model provides "
                              "[-1,2]")
    config = dict(CONFIG, batch_input=[dict(CONFIG["batch_input"][0], data_type="TYPE_INT32")])
    with pytest.raises(BackendError, match="configuration expects datatype TYPE_INT32 for "
                                           "input 'INDEX', model provides TYPE_FP32"):
        load_onnx(ragged_onnx, config)
    config = dict(CONFIG, batch_input=[dict(CONFIG["batch_input"][0], target_name=["NOPE"])])
    with pytest.raises(BackendError, match="unexpected inference input 'NOPE'"):
        load_onnx(ragged_onnx, config)
