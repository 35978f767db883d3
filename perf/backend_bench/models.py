"""The benchmark's two models, built here with onnx.helper from a fixed seed so that nothing is
downloaded and every run measures the same graphs: `tiny` (one Add, where the server's cost per
request dominates) and `heavy` (blocks of MatMul+Add+Relu, where onnxruntime's compute does);
Model, what a model is to the benchmark, and its config.pbtxt."""
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

MAX_BATCH = 8
TINY_COLS = 16
HEAVY_WIDTH, HEAVY_HIDDEN = 512, 2048
OPSET, IR_VERSION = 17, 8  # old enough for any onnxruntime either venv may hold
SEED = 20261129


def _save(graph, path: Path) -> None:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def build_tiny(path: Path) -> None:
    def fp32(name):
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, ["N", TINY_COLS])

    graph = helper.make_graph([helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"])], "tiny",
                              [fp32("INPUT0"), fp32("INPUT1")], [fp32("OUTPUT0")])
    _save(graph, path)


def build_heavy(path: Path, blocks: int) -> None:
    """blocks x (MatMul+Add+Relu 512 -> 2048, MatMul+Add(+Relu) 2048 -> 512); weights scaled by
    1/sqrt(fan-in) so that activations stay of order 1 through the stack."""
    rng = np.random.default_rng(SEED)
    nodes, weights, x = [], [], "INPUT0"
    layers = [(HEAVY_WIDTH, HEAVY_HIDDEN), (HEAVY_HIDDEN, HEAVY_WIDTH)] * blocks
    for i, (fan_in, fan_out) in enumerate(layers):
        w = (rng.standard_normal((fan_in, fan_out), dtype=np.float32) / np.sqrt(fan_in)).astype(np.float32)
        b = (0.01 * rng.standard_normal(fan_out, dtype=np.float32)).astype(np.float32)
        weights += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        last = i == len(layers) - 1
        nodes += [helper.make_node("MatMul", [x, f"w{i}"], [f"mm{i}"]),
                  helper.make_node("Add", [f"mm{i}", f"b{i}"], ["OUTPUT0" if last else f"add{i}"])]
        if not last:
            nodes.append(helper.make_node("Relu", [f"add{i}"], [f"relu{i}"]))
            x = f"relu{i}"

    def fp32(name):
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, ["N", HEAVY_WIDTH])

    _save(helper.make_graph(nodes, "heavy", [fp32("INPUT0")], [fp32("OUTPUT0")], weights), path)


class Model:
    """A benchmark model: its name, FP32 inputs (name, columns), output, dynamic-batching delay
    and the concurrencies it is measured at."""

    def __init__(self, name: str, inputs: list[tuple[str, int]], output_cols: int, delay_us: int,
                 concurrency: list[int]):
        self.name, self.inputs, self.output_cols = name, inputs, output_cols
        self.delay_us, self.concurrency = delay_us, concurrency

    def config(self, backend: str, threads: int) -> str:
        inputs = ", ".join(f'{{ name: "{n}" data_type: TYPE_FP32 dims: [ {c} ] }}' for n, c in self.inputs)
        delay = f" max_queue_delay_microseconds: {self.delay_us} " if self.delay_us else " "
        return (f'name: "{self.name}"\nbackend: "{backend}"\nmax_batch_size: {MAX_BATCH}\n'
                f"input [ {inputs} ]\n"
                f'output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ {self.output_cols} ] }} ]\n'
                f"dynamic_batching {{{delay}}}\n"
                "instance_group [ { count: 1 kind: KIND_CPU } ]\n"
                f'parameters {{ key: "intra_op_thread_count" value: {{ string_value: "{threads}" }} }}\n')
