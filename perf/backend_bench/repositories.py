"""The two repositories of a run, with the same .onnx files: shmserve's serves them with its
native onnxruntime backend, Triton's through TRITON_MODEL_PY, the session in a Python-backend
model (what a Triton user without an ONNX backend writes)."""
import os
from pathlib import Path

from .models import Model, build_heavy, build_tiny


# What a Triton user without an onnxruntime backend writes: the session in a Python-backend
# model, a dynamic batch run as one session.run, each request given its rows.
TRITON_MODEL_PY = '''\
"""onnxruntime inside Triton's Python backend, written by perf/bench_backends.py: the session
options as shmserve's onnxruntime backend builds them from this config."""
import json
import os

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        parameters = {key: value.get("string_value", "") for key, value in (config.get("parameters") or {}).items()}
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.intra_op_num_threads = int(parameters["intra_op_thread_count"])
        path = os.path.join(args["model_repository"], args["model_version"], "model.onnx")
        self.session = ort.InferenceSession(path, sess_options=options, providers=["CPUExecutionProvider"])
        self.inputs = [entry["name"] for entry in config["input"]]
        self.outputs = [entry["name"] for entry in config["output"]]

    def execute(self, requests):
        parts = {name: [pb_utils.get_input_tensor_by_name(r, name).as_numpy() for r in requests]
                 for name in self.inputs}
        rows = [array.shape[0] for array in parts[self.inputs[0]]]
        feeds = {name: arrays[0] if len(arrays) == 1 else np.concatenate(arrays) for name, arrays in parts.items()}
        results = self.session.run(self.outputs, feeds)
        responses, start = [], 0
        for n in rows:
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor(name, result[start:start + n]) for name, result in zip(self.outputs, results)]))
            start += n
        return responses
'''


def write_repositories(out_dir: Path, models: list[Model], args) -> tuple[Path, Path, dict[str, Path]]:
    """(shmserve's repository, Triton's, model name -> its .onnx). Both repositories hold the
    same .onnx files (hard links where the file system allows)."""
    onnx_dir, shm_repo, triton_repo = out_dir / "models", out_dir / "repo_shmserve", out_dir / "repo_triton"
    onnx_dir.mkdir()
    files = {}
    for model in models:
        path = onnx_dir / f"{model.name}.onnx"
        build_tiny(path) if model.name == "tiny" else build_heavy(path, args.heavy_blocks)
        files[model.name] = path
        for repo, backend in ((shm_repo, "onnxruntime"), (triton_repo, "python")):
            version = repo / model.name / "1"
            version.mkdir(parents=True)
            (repo / model.name / "config.pbtxt").write_text(model.config(backend, args.threads))
            try:
                os.link(path, version / "model.onnx")
            except OSError:
                (version / "model.onnx").write_bytes(path.read_bytes())
        (triton_repo / model.name / "1" / "model.py").write_text(TRITON_MODEL_PY)
    return shm_repo, triton_repo, files


def remove_model_files(out_dir: Path) -> None:
    for path in out_dir.glob("**/*.onnx"):
        path.unlink()
    try:
        (out_dir / "models").rmdir()
    except OSError:
        pass

