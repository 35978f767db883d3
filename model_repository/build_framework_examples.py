"""Writes the framework examples' model files: `add_sub_onnx/1/model.onnx` (with the `onnx`
package) and `add_sub_torchscript/1/model.pt` (with `torch`). Both are committed; run this
after changing them:

    .venv/bin/python model_repository/build_framework_examples.py

Both compute what `add_sub` computes (OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1,
FP32), with a batch dimension.
"""

import os

HERE = os.path.dirname(os.path.abspath(__file__))


def build_onnx(path: str) -> None:
    import onnx
    from onnx import TensorProto, helper

    def fp32(name):
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", 4])

    graph = helper.make_graph(
        [helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
         helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"])],
        "add_sub", [fp32("INPUT0"), fp32("INPUT1")], [fp32("OUTPUT0"), fp32("OUTPUT1")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              producer_name="shmserve")
    model.ir_version = 8  # readable by every onnxruntime of recent years
    onnx.checker.check_model(model)
    onnx.save(model, path)


def build_torchscript(path: str) -> None:
    import torch

    class AddSub(torch.nn.Module):
        # Argument names are the config's input names: Triton binds inputs by them.
        def forward(self, INPUT0: torch.Tensor, INPUT1: torch.Tensor):
            return INPUT0 + INPUT1, INPUT0 - INPUT1

    torch.jit.script(AddSub()).save(path)


if __name__ == "__main__":
    build_onnx(os.path.join(HERE, "add_sub_onnx", "1", "model.onnx"))
    build_torchscript(os.path.join(HERE, "add_sub_torchscript", "1", "model.pt"))
