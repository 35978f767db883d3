"""ONNX models that tests in several folders build offline with onnx's helper API."""

import numpy as np
from onnx import ModelProto, TensorProto, helper, numpy_helper


def ragged_doubler(x_shape=("E",)) -> ModelProto:
    """A ragged batch's model: Y = 2 X over the flat batch X, and END = INDEX (the batch input
    saying where each request ends) as a column, one row per request. (`x_shape`: another
    shape of X and Y, which a ragged input must not have.)"""
    graph = helper.make_graph(
        [helper.make_node("Add", ["X", "X"], ["Y"]),
         helper.make_node("Unsqueeze", ["INDEX", "axis"], ["END"])], "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, list(x_shape)),
         helper.make_tensor_value_info("INDEX", TensorProto.FLOAT, ["N"])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, list(x_shape)),
         helper.make_tensor_value_info("END", TensorProto.FLOAT, ["N", 1])],
        initializer=[numpy_helper.from_array(np.array([1], np.int64), "axis")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # what every onnxruntime of the last years reads
    return model
