"""Python-based backends (Triton's `<backend directory>/<name>/model.py`): models whose backend
shmserve does not run itself, or whose config says `runtime: "model.py"`, run that model.py,
with the model's own name, folder, parameters and auto-completed config."""

import os
import textwrap

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.conftest import start_server, stop_server, wait_for_models

# A backend that scales its input by the number in the model's version folder (weights.txt),
# and completes the config of models that give none.
SCALER = """
import json
import os
import numpy as np
import triton_python_backend_utils as pb_utils

LOADED_AS = __name__


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        if not config.as_dict().get("input"):
            config.add_input({"name": "X", "data_type": "TYPE_FP32", "dims": [-1]})
            config.add_output({"name": "Y", "data_type": "TYPE_FP32", "dims": [-1]})
            config.add_output({"name": "WHO", "data_type": "TYPE_STRING", "dims": [1]})
            config.set_max_batch_size(4)
        return config

    def initialize(self, args):
        with open(os.path.join(pb_utils.get_model_dir(), "weights.txt")) as f:
            self.scale = float(f.read())
        config = json.loads(args["model_config"])
        offset = config["parameters"].get("offset", {}).get("string_value", "0")
        self.offset = float(offset)
        self.who = "|".join([args["model_name"], args["model_version"],
                             os.path.basename(args["model_repository"]), LOADED_AS,
                             config["runtime"]]).encode()

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            who = np.array([[self.who]] * x.shape[0], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("Y", (x * self.scale + self.offset).astype(np.float32)),
                pb_utils.Tensor("WHO", who)]))
        return responses
"""

# A stand-in for Triton's PyTorch 2 runtime (backend "pytorch", runtime "model.py"): it finds
# the model's own file in its version folder, as that runtime does.
TORCH_RUNTIME = """
import os
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        path = os.path.join(pb_utils.get_model_dir(), "model.txt")
        with open(path) as f:
            self.add = float(f.read())

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
                    "OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy() + self.add)])
                for r in requests]
"""

NOT_TO_BE_IMPORTED = "raise RuntimeError('the version folder\\'s model.py was imported')\n"


def write(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(textwrap.dedent(text))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("python_based")
    backends, repo = str(root / "backends"), str(root / "models")
    write(os.path.join(backends, "scaler", "model.py"), SCALER)
    write(os.path.join(backends, "pytorch", "model.py"), TORCH_RUNTIME)
    # No config.pbtxt can name the backend of a model without one: a config naming only it.
    write(os.path.join(repo, "triple", "config.pbtxt"), 'backend: "scaler"\n')
    write(os.path.join(repo, "triple", "1", "weights.txt"), "3")
    write(os.path.join(repo, "half", "config.pbtxt"), """
        backend: "scaler"
        parameters { key: "offset" value: { string_value: "10" } }""")
    write(os.path.join(repo, "half", "1", "weights.txt"), "0.5")
    write(os.path.join(repo, "half", "1", "model.py"), NOT_TO_BE_IMPORTED)
    write(os.path.join(repo, "torch2", "config.pbtxt"), """
        backend: "pytorch" runtime: "model.py" max_batch_size: 0
        input [ { name: "IN" data_type: TYPE_FP32 dims: [ 2 ] } ]
        output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 2 ] } ]""")
    write(os.path.join(repo, "torch2", "1", "model.txt"), "7")
    write(os.path.join(repo, "no_runtime", "config.pbtxt"),
          'backend: "absent" runtime: "model.py"\n')
    os.makedirs(os.path.join(repo, "no_runtime", "1"))
    write(os.path.join(repo, "no_backend", "config.pbtxt"), 'backend: "absent"\n')
    os.makedirs(os.path.join(repo, "no_backend", "1"))
    write(os.path.join(repo, "escapes", "config.pbtxt"), 'backend: "../backends/scaler"\n')
    os.makedirs(os.path.join(repo, "escapes", "1"))
    write(os.path.join(repo, "bad_lib", "config.pbtxt"),
          'backend: "onnxruntime" runtime: "libtriton_other.so"\n')
    os.makedirs(os.path.join(repo, "bad_lib", "1"))
    log = str(tmp_path_factory.mktemp("logs") / "shmserve.log")
    srv = start_server(repo, log, f"--backend-directory={backends}")
    srv.backends = backends
    try:
        wait_for_models(srv, ("triple", "half", "torch2"))
        yield srv
    finally:
        stop_server(srv)


def infer(client, lib, model, name, array, datatype="FP32"):
    t = lib.InferInput(name, list(array.shape), datatype)
    t.set_data_from_numpy(array)
    return client.infer(model, [t])


@pytest.mark.parametrize("lib", [httpclient, grpcclient], ids=["http", "grpc"])
def test_each_model_runs_the_backend_s_model_py_with_its_own_files(server, lib):
    url = server.http_url if lib is httpclient else server.grpc_url
    client = lib.InferenceServerClient(url)
    try:
        x = np.array([[1.0, 2.0, 4.0]], np.float32)
        triple = infer(client, lib, "triple", "X", x)
        np.testing.assert_array_equal(triple.as_numpy("Y"), x * 3)
        assert triple.as_numpy("WHO").tolist() == [[b"triple|1|triple|model|model.py"]]
        half = infer(client, lib, "half", "X", x)  # its own model.py is never imported
        np.testing.assert_array_equal(half.as_numpy("Y"), x * 0.5 + 10)
        torch2 = infer(client, lib, "torch2", "IN", np.array([1.0, -1.0], np.float32))
        np.testing.assert_array_equal(torch2.as_numpy("OUT"), [8.0, 6.0])
    finally:
        client.close()


def test_the_backend_s_auto_complete_and_runtime_show_in_the_config(server):
    with httpclient.InferenceServerClient(server.http_url) as client:
        config = client.get_model_config("triple")
        assert (config["backend"], config["runtime"], config["max_batch_size"]) == (
            "scaler", "model.py", 4)
        assert [t["name"] for t in config["input"]] == ["X"]
        assert [t["name"] for t in config["output"]] == ["Y", "WHO"]
        assert client.get_model_config("torch2")["runtime"] == "model.py"


def test_backends_that_cannot_be_found(server):
    with httpclient.InferenceServerClient(server.http_url) as client:
        index = {m["name"]: m for m in client.get_model_repository_index()}
    searched = os.path.join(server.backends, "absent", "model.py")
    assert index["no_runtime"]["reason"].endswith(
        "unable to find Python backend based backend library 'model.py' for model "
        f"'no_runtime', searched: '{searched}'")
    assert index["no_backend"]["reason"].endswith(
        "unable to find backend library for backend 'absent', try specifying runtime on the "
        "model configuration.")
    assert "backend name '../backends/scaler' of model 'escapes' is not the name of a folder " \
        "in backend directory" in index["escapes"]["reason"]
    assert "unable to find backend library 'libtriton_other.so' for model 'bad_lib'" in \
        index["bad_lib"]["reason"]
    assert all(index[m]["state"] == "UNAVAILABLE"
               for m in ("no_runtime", "no_backend", "escapes", "bad_lib"))
