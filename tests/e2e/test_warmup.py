"""Model warmup (`model_warmup`) end to end, as Triton 2.51 does it (each behaviour here was
read off the real Triton with the same models): each instance runs every sample before the
model is ready, a sample's requests run as one batch, the runs count in the statistics, and a
sample that fails or cannot be built leaves the model UNAVAILABLE with Triton's reason while
the rest of the repository serves."""

import json
import os
import signal
import struct
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.conftest import (ROOT, STARTED_PIDS, alive, children_of, free_port, start_server,
                            stop_server)

# Records what each execute got, one JSON line per batch, in the file its parameter names.
MODEL = '''
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.log = config["parameters"]["log_to"]["string_value"]
        self.fail_on_zeros = "fail_on_zeros" in config["parameters"]
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)

    def execute(self, requests):
        batch, responses = [], []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            batch.append({"shape": list(x.shape), "values": [
                v.decode() if isinstance(v, bytes) else float(v) for v in x.reshape(-1)]})
            if self.fail_on_zeros and x.dtype != object and not x.any():
                response = pb_utils.InferenceResponse(
                    error=pb_utils.TritonError("zeros are not welcome"))
            else:
                response = pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)])
            if self.decoupled:  # two responses: the second waits until the first is read
                sender = request.get_response_sender()
                sender.send(response)
                sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            else:
                responses.append(response)
        with open(self.log, "a") as f:
            f.write(json.dumps(batch) + "\\n")
        return None if self.decoupled else responses
'''

FP32 = '''
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
'''


def sample(name, data, batch_size=1, dims="4", data_type="TYPE_FP32", count=0, more=""):
    return (f'{{ name: "{name}" batch_size: {batch_size} count: {count} inputs [ {{ key: '
            f'"INPUT0" value: {{ data_type: {data_type} dims: [ {dims} ] {data} }} }} {more} ] }}')


MODELS = {
    # Triton: 2 executions of 2 requests, then 1 of random bytes, then 1 from a file.
    "warm_ok": ("max_batch_size: 8\ndynamic_batching { }\n" + FP32, [
        sample("zeros", "zero_data: true", batch_size=2, count=2),
        sample("random", "random_data: true"),
        sample("file", 'input_data_file: "in0.bin"'),
        sample("skipped", "zero_data: true", batch_size=0)]),
    "warm_fail": ('max_batch_size: 8\nparameters { key: "fail_on_zeros" value { string_value: '
                  '"1" } }\n' + FP32, [sample("zeros", "zero_data: true", batch_size=3)]),
    "warm_wild": ("max_batch_size: 8\n" + FP32.replace("[ 4 ]", "[ -1 ]"),
                  [sample("w", "zero_data: true", dims="-1")]),
    "warm_strings": ('max_batch_size: 0\ninput [ { name: "INPUT0" data_type: TYPE_STRING '
                     'dims: [ 3 ] } ]\noutput [ { name: "OUTPUT0" data_type: TYPE_STRING '
                     'dims: [ 3 ] } ]\n', [
                         sample("random", "random_data: true", dims="3", data_type="TYPE_STRING"),
                         sample("file", 'input_data_file: "s.bin"', dims="3",
                                data_type="TYPE_STRING")]),
    "warm_short": ("max_batch_size: 8\n" + FP32, [sample("short", 'input_data_file: "tiny.bin"')]),
    "warm_no_file": ("max_batch_size: 8\n" + FP32, [sample("gone", 'input_data_file: "gone"')]),
    "warm_missing": ('max_batch_size: 8\ninput [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] '
                     '}, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]\noutput [ { name: '
                     '"OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]\n',
                     [sample("half", "zero_data: true")]),
    "warm_no_data": ("max_batch_size: 8\n" + FP32, [sample("nodata", "")]),
    "warm_type": ("max_batch_size: 8\n" + FP32,
                  [sample("t", "zero_data: true", data_type="TYPE_INT32")]),
    "warm_too_big": ("max_batch_size: 2\n" + FP32, [sample("b", "zero_data: true", batch_size=5)]),
    "warm_huge": ("max_batch_size: 8\n" + FP32.replace("[ 4 ]", "[ -1 ]"),
                  [sample("h", "zero_data: true", dims="1000000000000")]),
    "warm_decoupled": ("max_batch_size: 8\nmodel_transaction_policy { decoupled: true }\n" + FP32,
                       [sample("d", "zero_data: true", batch_size=2)]),
    "warm_sequence": ('max_batch_size: 4\nsequence_batching { control_input [ { name: "START" '
                      'control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] '
                      '} ] }\n' + FP32,
                      [sample("q", "zero_data: true", more=', { key: "START" value: { '
                              'data_type: TYPE_INT32 dims: [ 1 ] zero_data: true } }')]),
}
REASONS = {
    "warm_fail": "Invalid argument: failed to run warmup sample 'zeros': zeros are not welcome; "
                 "zeros are not welcome; zeros are not welcome; ",
    "warm_wild": "Invalid argument: warmup setting expects all variable-size dimensions are "
                 "specified for input 'INPUT0'",
    "warm_short": "Invalid argument: [request id: <id_unknown>] warmup setting expects 16 bytes, "
                  "but the data provided from tiny.binonly has 5 bytes",
    "warm_missing": "Invalid argument: [request id: <id_unknown>] expected 2 inputs but got 1 "
                    "inputs for model 'warm_missing'. Got input(s) ['INPUT0'], but missing "
                    "required input(s) ['INPUT1']. Please provide all required input(s).",
    "warm_no_data": "Invalid argument: [request id: <id_unknown>] warmup setting expects input "
                    "'INPUT0' to have input_data_type set",
    "warm_type": "Invalid argument: [request id: <id_unknown>] inference input 'INPUT0' "
                 "data-type is 'INT32', but model 'warm_type' expects 'FP32'",
    "warm_too_big": "Invalid argument: failed to run warmup sample 'b': " + "batch size 5 for "
                    "'warm_too_big_0', max allowed is 2; " * 5,
}
READY = ("warm_ok", "warm_strings", "warm_decoupled", "warm_sequence")


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    return tmp_path_factory.mktemp("executions")


@pytest.fixture(scope="module")
def server(tmp_path_factory, logs):
    repo = tmp_path_factory.mktemp("warmup")
    for name, (config, samples) in MODELS.items():
        os.makedirs(repo / name / "1")
        (repo / name / "1" / "model.py").write_text(MODEL)
        (repo / name / "config.pbtxt").write_text(textwrap.dedent(f"""
            backend: "python"
            {config}
            parameters {{ key: "log_to" value {{ string_value: "{logs / name}" }} }}
            model_warmup [ {", ".join(samples)} ]
            """))
    os.makedirs(repo / "warm_ok" / "warmup")
    # More bytes than the sample needs: the first 16 are taken.
    (repo / "warm_ok" / "warmup" / "in0.bin").write_bytes(
        struct.pack("<4f", 1.5, 2.5, 3.5, 4.5) + b"more")
    os.makedirs(repo / "warm_strings" / "warmup")
    (repo / "warm_strings" / "warmup" / "s.bin").write_bytes(
        b"".join(struct.pack("<I", len(s)) + s for s in (b"ab", b"", b"xyz")))
    os.makedirs(repo / "warm_short" / "warmup")
    (repo / "warm_short" / "warmup" / "tiny.bin").write_bytes(b"12345")
    log = str(tmp_path_factory.mktemp("logs") / "shmserve.log")
    srv = start_server(str(repo), log, "--exit-on-error=false", wait_models=READY, timeout=120)
    try:
        yield srv
    finally:
        stop_server(srv)


def executions(logs, model) -> list:
    with open(logs / model) as f:
        return [json.loads(line) for line in f]


def index(clients) -> dict:
    return {m["name"]: m for m in clients["http"].get_model_repository_index()}


def test_each_sample_runs_as_one_batch_before_the_model_serves(clients, logs):
    batches = executions(logs, "warm_ok")
    # zeros twice (two requests each), random bytes, the file's first 16 bytes; no batch of 0
    assert [len(b) for b in batches] == [2, 2, 1, 1]
    assert all(r["shape"] == [1, 4] for b in batches for r in b)
    assert all(r["values"] == [0.0] * 4 for b in batches[:2] for r in b)
    assert batches[3][0]["values"] == [1.5, 2.5, 3.5, 4.5]
    assert clients["http"].is_model_ready("warm_ok")
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    t = httpclient.InferInput("INPUT0", [1, 4], "FP32")
    t.set_data_from_numpy(x)
    np.testing.assert_array_equal(
        clients["http"].infer("warm_ok", [t]).as_numpy("OUTPUT0"), x)


def test_warmup_counts_in_the_statistics_as_in_triton(clients):
    stats = clients["http"].get_inference_statistics("warm_ok")["model_stats"][0]
    warm = {b["batch_size"]: b["compute_infer"]["count"] for b in stats["batch_stats"]}
    assert warm[1] >= 2 and warm[2] == 2  # the request the first test sent may add a 1
    assert stats["execution_count"] - warm[1] == 2
    assert stats["inference_count"] - warm[1] == 4


def test_strings_get_empty_elements_or_the_file_s_bytes(logs):
    assert [b[0]["values"] for b in executions(logs, "warm_strings")] == [
        ["", "", ""], ["ab", "", "xyz"]]


def test_decoupled_and_sequence_models_warm_up(clients, logs):
    assert [len(b) for b in executions(logs, "warm_decoupled")] == [2]
    # The sample's START is the worker's to make, as the sequence batcher's is.
    assert executions(logs, "warm_sequence") == [[{"shape": [1, 4], "values": [0.0] * 4}]]
    for model in ("warm_decoupled", "warm_sequence"):
        assert clients["http"].is_model_ready(model)


@pytest.mark.parametrize("model", sorted(REASONS))
def test_a_sample_that_fails_leaves_the_model_unavailable_with_triton_s_reason(clients, model):
    entry = index(clients)[model]
    assert (entry["state"], entry["reason"]) == ("UNAVAILABLE", REASONS[model])


def test_samples_that_cannot_be_built_are_refused_before_anything_is_allocated(clients):
    entries = index(clients)
    assert entries["warm_huge"]["reason"].startswith(
        "Invalid argument: warmup sample 'h': input 'INPUT0' would take 4000000000000 bytes, "
        "more than the")
    reason = entries["warm_no_file"]["reason"]
    assert reason.startswith("Invalid argument: failed to open text file for read ")
    assert reason.endswith(os.path.join("warm_no_file", "warmup", "gone") +
                           ": No such file or directory")
    for model in READY:
        assert clients["http"].is_model_ready(model)



def test_a_stop_signal_during_a_warmup_that_hangs_stops_the_server(tmp_path):
    began = tmp_path / "began"
    (tmp_path / "repo" / "warm_hang" / "1").mkdir(parents=True)
    (tmp_path / "repo" / "warm_hang" / "1" / "model.py").write_text(textwrap.dedent(f"""
        import time


        class TritonPythonModel:
            def execute(self, requests):
                open({str(began)!r}, "w").close()
                time.sleep(600)
        """))
    (tmp_path / "repo" / "warm_hang" / "config.pbtxt").write_text(
        'backend: "python"\nmax_batch_size: 8\n' + FP32 + "model_warmup [ "
        + sample("forever", "zero_data: true") + " ]\n")
    # Not start_server: the server is not live until its models have loaded.
    log = tmp_path / "shmserve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "shmserve.cli", "--model-repository", str(tmp_path / "repo"),
             "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1",
             "--metrics-address", "127.0.0.1", "--http-port", str(free_port()),
             "--grpc-port", str(free_port()), "--metrics-port", str(free_port())],
            stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
            env=dict(os.environ, PYTHONPATH=ROOT))
    STARTED_PIDS.add(proc.pid)
    try:
        deadline = time.monotonic() + 60
        while not began.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert began.exists(), log.read_text()
        children = children_of(proc.pid)
        proc.send_signal(signal.SIGTERM)  # the server this test started, by its pid
        assert proc.wait(15) == 0
        deadline = time.monotonic() + 10
        while any(alive(p) for p in children) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(alive(p) for p in children)  # the worker ended with its front
        assert "the loads still running are abandoned" in log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
