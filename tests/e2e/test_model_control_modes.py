"""--model-control-mode none and poll, several repositories, ensembles that load and unload
their steps, and load retries: each test on a server of its own."""

import os
import shutil

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import ROOT, start_server, stop_server
from tests.e2e.model_management_helpers import (add_model, add_version, index, infer,
                                                scale_config, wait_until)

# Among the longest modules of the suite (pytest --durations): -m "not slow" skips it.
pytestmark = pytest.mark.slow


def test_none_mode_refuses_load_and_unload(tmp_path):
    repo = str(tmp_path / "repo")
    add_model(repo, "scale")
    server = start_server(repo, str(tmp_path / "none.log"), wait_models=("scale",))
    try:
        http = httpclient.InferenceServerClient(server.http_url)
        grpc = grpcclient.InferenceServerClient(server.grpc_url)
        message = "explicit model load / unload is not allowed if polling is enabled"
        for call in (lambda: http.load_model("scale"), lambda: http.unload_model("scale")):
            with pytest.raises(InferenceServerException, match=message) as info:
                call()
            assert info.value.status() == "503"
        for call in (lambda: grpc.load_model("scale"), lambda: grpc.unload_model("scale")):
            with pytest.raises(InferenceServerException, match=message) as info:
                call()
            assert info.value.status() == "StatusCode.UNAVAILABLE"
        assert http.is_model_ready("scale")
        http.close()
        grpc.close()
    finally:
        stop_server(server)


def test_poll_mode_follows_the_repository(tmp_path):
    repo = str(tmp_path / "repo")
    add_model(repo, "scale")
    add_model(repo, "gone")
    server = start_server(repo, str(tmp_path / "poll.log"), "--model-control-mode=poll",
                          "--repository-poll-secs=1", wait_models=("scale", "gone"))
    try:
        http = httpclient.InferenceServerClient(server.http_url)
        with pytest.raises(InferenceServerException, match="not allowed if polling"):
            http.load_model("scale")
        add_version(repo, "scale", 2)  # latest 1: version 2 replaces version 1
        wait_until(lambda: index(http).get(("scale", "2"), ("",))[0] == "READY",
                   what="version 2")
        assert infer(http, "scale")[1] == 2
        with open(os.path.join(repo, "scale", "config.pbtxt"), "w") as f:
            f.write(scale_config("scale", 5.0))
        wait_until(lambda: infer(http, "scale")[0][0] == 5.0, what="changed config")
        add_model(repo, "added")
        wait_until(lambda: http.is_model_ready("added"), what="added model")
        shutil.rmtree(os.path.join(repo, "gone"))
        wait_until(lambda: index(http).get(("gone", "1")) == ("UNAVAILABLE", "unloaded"),
                   what="removed model unloaded")
        http.close()
    finally:
        stop_server(server)


def test_several_repositories_serve_together_and_a_model_in_two_serves_from_neither(tmp_path):
    first, second = str(tmp_path / "a"), str(tmp_path / "b")
    add_model(first, "scale", factor=2.0)
    add_model(second, "other", factor=3.0)
    add_model(first, "twice")
    add_model(second, "twice")
    log = str(tmp_path / "poll.log")
    server = start_server(first, log, f"--model-repository={second}",
                          "--model-control-mode=poll", "--repository-poll-secs=1",
                          "--exit-on-error=false", wait_models=("scale", "other"))
    try:
        http = httpclient.InferenceServerClient(server.http_url)
        assert infer(http, "scale")[0].tolist() == [2.0, 4.0]
        assert infer(http, "other")[0].tolist() == [3.0, 6.0]
        assert not http.is_model_ready("twice")
        assert {name for name, _ in index(http)} >= {"scale", "other", "twice"}
        message = "failed to poll model 'twice': not unique across all model repositories"
        assert message in server.log()
        # A copy of a loaded model appears in the other repository: it is unloaded, as in
        # Triton; once the copy is gone, it loads again.
        add_model(second, "scale", factor=5.0)
        wait_until(lambda: index(http).get(("scale", "1")) == ("UNAVAILABLE", "unloaded"),
                   what="scale unloaded")
        shutil.rmtree(os.path.join(second, "scale"))
        wait_until(lambda: http.is_model_ready("scale"), what="scale back")
        assert infer(http, "scale")[0].tolist() == [2.0, 4.0]
        http.close()
    finally:
        stop_server(server)


def test_loading_a_model_found_in_two_repositories_fails_as_in_triton(tmp_path):
    first, second = str(tmp_path / "a"), str(tmp_path / "b")
    add_model(first, "twice")
    add_model(second, "twice")
    add_model(second, "other")
    server = start_server(first, str(tmp_path / "explicit.log"), f"--model-repository={second}",
                          "--model-control-mode=explicit")
    try:
        with grpcclient.InferenceServerClient(server.grpc_url) as grpc:
            with pytest.raises(InferenceServerException) as info:
                grpc.load_model("twice")
            assert "failed to load 'twice', failed to poll from model repository" in \
                info.value.message()
            grpc.load_model("other")  # from the second repository
            assert infer(grpc, "other")[0].tolist() == [2.0, 4.0]
        assert "'twice': not unique across all model repositories" in server.log()
    finally:
        stop_server(server)


PIPELINE_CONFIG = '''
name: "pipeline"
platform: "ensemble"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
ensemble_scheduling { step [
  { model_name: "scale" model_version: -1
    input_map { key: "INPUT0" value: "INPUT0" } output_map { key: "OUTPUT0" value: "MID" } },
  { model_name: "scale" model_version: -1
    input_map { key: "INPUT0" value: "MID" } output_map { key: "OUTPUT0" value: "OUTPUT0" } }
] }
'''


def test_ensembles_load_their_steps_and_unload_with_them(tmp_path):
    repo = str(tmp_path / "repo")
    add_model(repo, "scale")
    os.makedirs(os.path.join(repo, "pipeline", "1"))
    with open(os.path.join(repo, "pipeline", "config.pbtxt"), "w") as f:
        f.write(PIPELINE_CONFIG)
    server = start_server(repo, str(tmp_path / "server.log"), "--model-control-mode=explicit",
                          "--load-model=pipeline", wait_models=("pipeline",))
    http = httpclient.InferenceServerClient(server.http_url)
    try:
        x = np.array([1.0, 2.0], dtype=np.float32)

        def pipeline():
            inp = httpclient.InferInput("INPUT0", [2], "FP32")
            inp.set_data_from_numpy(x)
            return http.infer("pipeline", [inp]).as_numpy("OUTPUT0").tolist()

        # The step model came up with the ensemble, though not named.
        assert http.is_model_ready("scale")
        assert pipeline() == [4.0, 8.0]
        unloaded = ("UNAVAILABLE", "unloaded")
        # Unloading the ensemble leaves its step serving...
        http.unload_model("pipeline")
        wait_until(lambda: index(http).get(("pipeline", "1")) == unloaded, what="unload")
        assert index(http)[("scale", "1")] == ("READY", "")
        with pytest.raises(InferenceServerException):
            pipeline()
        # ...unloading a step takes the ensemble down with it...
        http.load_model("pipeline")
        assert pipeline() == [4.0, 8.0]
        http.unload_model("scale")
        wait_until(lambda: index(http).get(("pipeline", "1")) == unloaded
                   and index(http).get(("scale", "1")) == unloaded, what="unload")
        # ...and unload_dependents also takes the steps it loaded along.
        http.load_model("pipeline")
        assert http.is_model_ready("scale") and pipeline() == [4.0, 8.0]
        http.unload_model("pipeline", unload_dependents=True)
        wait_until(lambda: index(http).get(("scale", "1")) == unloaded, what="unload")
    finally:
        http.close()
        stop_server(server)


def test_poll_mode_loads_a_new_ensemble_after_its_new_steps(tmp_path):
    """An ensemble and the model its steps use, added together, are found by one poll: the
    step loads first, or the ensemble would fail for want of it and never be retried."""
    repo = str(tmp_path / "repo")
    add_model(repo, "other")
    server = start_server(repo, str(tmp_path / "poll.log"), "--model-control-mode=poll",
                          "--repository-poll-secs=1", wait_models=("other",))
    http = httpclient.InferenceServerClient(server.http_url)
    try:
        staging = str(tmp_path / "staging")
        add_model(staging, "scale")
        os.makedirs(os.path.join(staging, "pipeline", "1"))
        with open(os.path.join(staging, "pipeline", "config.pbtxt"), "w") as f:
            f.write(PIPELINE_CONFIG)
        # The step first: a poll between the two moves would then load it alone, and the
        # ensemble next time, which is right too.
        for name in ("scale", "pipeline"):
            os.rename(os.path.join(staging, name), os.path.join(repo, name))
        wait_until(lambda: http.is_model_ready("pipeline"), what="the ensemble ready")
        inp = httpclient.InferInput("INPUT0", [2], "FP32")
        inp.set_data_from_numpy(np.array([1.0, 2.0], dtype=np.float32))
        assert http.infer("pipeline", [inp]).as_numpy("OUTPUT0").tolist() == [4.0, 8.0]
    finally:
        http.close()
        stop_server(server)


# -- --model-load-retry-count --------------------------------------------------------------------

@pytest.mark.parametrize("retries, ready", [(2, True), (1, False)])
def test_a_version_that_fails_to_load_is_retried(tmp_path, retries, ready):
    """flaky_init fails its first two initializations (tests/models/_flaky_init)."""
    repo = tmp_path / "repo"
    shutil.copytree(os.path.join(ROOT, "tests", "models", "_flaky_init"), repo / "flaky_init")
    server = start_server(str(repo), str(tmp_path / "s.log"),
                          f"--model-load-retry-count={retries}")
    try:
        with httpclient.InferenceServerClient(server.http_url) as client:
            assert client.is_model_ready("flaky_init") == ready
        attempts = int((repo / "flaky_init" / "attempts").read_text())
        assert attempts == retries + 1
    finally:
        stop_server(server)
