"""Models, configs and calls the model-management tests share (test_model_management.py,
test_model_control_modes.py)."""

import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

SCALE_MODEL = '''
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.factor = float(config["parameters"]["factor"]["string_value"])
        self.version = int(args["model_version"])

    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", (x * self.factor).astype(np.float32)),
                pb_utils.Tensor("VERSION", np.array([self.version], dtype=np.int32))]))
        return out
'''

READY_MODEL = '''
import time
from scale_model import TritonPythonModel as Scale


class TritonPythonModel(Scale):
    def is_ready(self):
        time.sleep(DELAY)
        return ANSWER
'''


def scale_config(name: str, factor: float = 2.0, policy: str = "") -> str:
    return f'''
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }},
         {{ name: "VERSION" data_type: TYPE_INT32 dims: [ 1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
parameters {{ key: "factor" value {{ string_value: "{factor}" }} }}
{policy}
'''


def config_json(name: str, factor: float, policy: dict = None) -> str:
    config = {
        "name": name, "backend": "python", "max_batch_size": 0,
        "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]},
                   {"name": "VERSION", "data_type": "TYPE_INT32", "dims": [1]}],
        "instance_group": [{"count": 1, "kind": "KIND_CPU"}],
        "parameters": {"factor": {"string_value": str(factor)}},
    }
    if policy:
        config["version_policy"] = policy
    return json.dumps(config)


def add_model(repo: str, name: str, versions=(1,), factor: float = 2.0, policy: str = "",
              model: str = SCALE_MODEL) -> None:
    path = os.path.join(repo, name)
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.pbtxt"), "w") as f:
        f.write(scale_config(name, factor, policy))
    for v in versions:
        add_version(repo, name, v, model)


def add_version(repo: str, name: str, version: int, model: str = SCALE_MODEL) -> None:
    vdir = os.path.join(repo, name, str(version))
    os.makedirs(vdir, exist_ok=True)
    with open(os.path.join(vdir, "model.py"), "w") as f:
        f.write(model)
    with open(os.path.join(vdir, "scale_model.py"), "w") as f:
        f.write(SCALE_MODEL)


def infer(client, name: str, version: str = ""):
    module = grpcclient if isinstance(client, grpcclient.InferenceServerClient) else httpclient
    inp = module.InferInput("INPUT0", [2], "FP32")
    inp.set_data_from_numpy(np.array([1.0, 2.0], dtype=np.float32))
    result = client.infer(name, [inp], model_version=version)
    return result.as_numpy("OUTPUT0"), int(result.as_numpy("VERSION")[0])


def index(client) -> dict:
    """{(name, version): (state, reason)} from either protocol's index."""
    out = {}
    if isinstance(client, grpcclient.InferenceServerClient):
        for m in client.get_model_repository_index().models:
            out[(m.name, m.version)] = (m.state, m.reason)
    else:
        for m in client.get_model_repository_index():
            out[(m["name"], m.get("version", ""))] = (m.get("state", ""), m.get("reason", ""))
    return out


def wait_until(predicate, timeout: float = 30.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def post(server, path: str, body: dict):
    """(status, parsed body) of a POST to the server's HTTP endpoint."""
    req = urllib.request.Request(f"http://{server.http_url}{path}",
                                 data=json.dumps(body).encode(), method="POST")
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")
