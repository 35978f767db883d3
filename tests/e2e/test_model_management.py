"""Model management in explicit mode, on one server: the repository index, the load and unload
APIs over both protocols (config overrides, uploaded files, names that are no model), version
policies, reloads without failed requests, and the model's own is_ready()."""

import base64
import glob
import json
import os
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import start_server, stop_server
from tests.e2e.model_management_helpers import (READY_MODEL, SCALE_MODEL, add_model,
                                                config_json, index, infer, post, wait_until)

# Among the longest modules of the suite (pytest --durations): -m "not slow" skips it.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def explicit(tmp_path_factory):
    repo = str(tmp_path_factory.mktemp("mm_explicit"))
    add_model(repo, "scale")
    add_model(repo, "other")
    add_model(repo, "multi", versions=(1, 2, 3), policy="version_policy { latest { num_versions: 2 } }")
    add_model(repo, "not_ready", model=READY_MODEL.replace("DELAY", "0").replace("ANSWER", "False"))
    add_model(repo, "slow_ready", model=READY_MODEL.replace("DELAY", "6").replace("ANSWER", "True"))
    log = str(tmp_path_factory.mktemp("mm_logs") / "explicit.log")
    server = start_server(repo, log, "--model-control-mode=explicit", "--load-model=scale",
                          "--load-model=multi", "--load-model=not_ready",
                          "--load-model=slow_ready", wait_models=("scale", "multi"))
    http = httpclient.InferenceServerClient(server.http_url)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    yield server, repo, http, grpc
    http.close()
    grpc.close()
    stop_server(server)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_index_lists_loaded_versions_and_unloaded_models(explicit, protocol):
    _, _, http, grpc = explicit
    entries = index(http if protocol == "http" else grpc)
    assert entries[("scale", "1")] == ("READY", "")
    assert entries[("other", "")] == ("", "")  # never loaded: its name only
    assert ("other", "1") not in entries


def test_load_and_unload_over_both_protocols(explicit):
    server, _, http, grpc = explicit
    http.load_model("other")
    assert http.is_model_ready("other")
    assert infer(grpc, "other")[0].tolist() == [2.0, 4.0]
    grpc.unload_model("other")
    wait_until(lambda: index(http).get(("other", "1")) == ("UNAVAILABLE", "unloaded"),
               what="unload")
    assert not http.is_model_ready("other")
    with pytest.raises(InferenceServerException, match="has no available versions"):
        infer(http, "other")
    grpc.load_model("other")
    assert index(grpc)[("other", "1")] == ("READY", "")
    http.unload_model("other")
    wait_until(lambda: index(grpc).get(("other", "1")) == ("UNAVAILABLE", "unloaded"),
               what="unload")
    # Triton's lines, which its QA tests count
    wait_until(lambda: server.log().count("successfully unloaded 'other' version 1") == 2,
               what="unload logged")
    assert server.log().count("successfully loaded 'other'") == 2


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_loading_an_unknown_model_fails_as_in_triton(explicit, protocol):
    _, _, http, grpc = explicit
    client = http if protocol == "http" else grpc
    with pytest.raises(InferenceServerException) as info:
        client.load_model("no_such_model")
    assert "failed to load 'no_such_model', failed to poll from model repository" in info.value.message()
    assert info.value.status() in ("500", "StatusCode.INTERNAL")


@pytest.mark.parametrize("name", ["../../etc", "..", " .. ", "a/b", "x\0y", "", "  "])
def test_a_name_that_is_no_model_directory_is_the_clients_mistake(explicit, name):
    """Nothing outside the repository is looked at, over either protocol, and the answer is
    400 / INVALID_ARGUMENT in Triton 2.73's words (its QA L0_input_validation)."""
    server, _, http, grpc = explicit
    if name.strip():
        why = (f"invalid model name '{name}', model name must not contain path traversal "
               "characters")
    else:
        why = "Model name cannot be empty. Please enter a valid name to deploy."
    quoted = urllib.parse.quote(name, safe="")
    if name:  # no URL names an empty model
        status, body = post(server, f"/v2/repository/models/{quoted}/load", {})
        assert (status, body["error"]) == (400, why)
    with pytest.raises(InferenceServerException) as info:
        grpc.load_model(name)
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert info.value.message() == why
    # Unloading a model that is not loaded succeeds, whatever its name (as in Triton).
    grpc.unload_model(name)
    if name:
        assert post(server, f"/v2/repository/models/{quoted}/unload", {})[0] == 200


def test_config_override_replaces_config_pbtxt(explicit):
    _, _, http, grpc = explicit
    grpc.load_model("scale", config=config_json("scale", 3.0))
    assert infer(http, "scale")[0].tolist() == [3.0, 6.0]
    http.load_model("scale", config=config_json("scale", 2.0))
    assert infer(grpc, "scale")[0].tolist() == [2.0, 4.0]


def test_config_override_may_give_a_repeated_field_as_one_object(explicit):
    """Triton's JSON parser takes `"input": {...}` for `"input": [{...}]`."""
    _, _, http, _ = explicit
    config = json.loads(config_json("scale", 4.0))
    config["input"] = config["input"][0]
    config["instance_group"] = config["instance_group"][0]
    http.load_model("scale", config=json.dumps(config))
    assert infer(http, "scale")[0].tolist() == [4.0, 8.0]
    http.load_model("scale", config=config_json("scale", 2.0))


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_bad_config_override_is_refused_and_the_model_keeps_serving(explicit, protocol):
    _, _, http, grpc = explicit
    client = http if protocol == "http" else grpc
    with pytest.raises(InferenceServerException) as refused:
        client.load_model("scale", config='{"max_batch_size": "many"}')
    # Triton's words (its repository poll fails), then why
    assert refused.value.message().startswith(
        "failed to load 'scale', failed to poll from model repository: ")
    assert refused.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")
    with pytest.raises(InferenceServerException) as refused:
        client.load_model("scale", config=config_json("other", 3.0))
    assert refused.value.message() == (
        "failed to load 'scale', failed to poll from model repository: unexpected directory "
        "name 'scale' for model 'other', directory name must equal model name")
    assert infer(http, "scale")[0].tolist() == [2.0, 4.0]


def test_file_upload_over_grpc_then_http(explicit):
    server, _, http, grpc = explicit
    files = {"file:1/model.py": SCALE_MODEL.encode()}
    grpc.load_model("uploaded", config=config_json("uploaded", 5.0), files=files)
    assert infer(http, "uploaded")[0].tolist() == [5.0, 10.0]
    uploads = glob.glob(os.path.join(tempfile.gettempdir(), "shmserve-uploaded-*"))
    assert uploads
    # tritonclient's HTTP load_model cannot serialize files (bytes in json): post it directly.
    status, _ = post(server, "/v2/repository/models/uploaded/load", {"parameters": {
        "config": config_json("uploaded", 7.0),
        "file:1/model.py": base64.b64encode(SCALE_MODEL.encode()).decode()}})
    assert status == 200
    assert infer(grpc, "uploaded")[0].tolist() == [7.0, 14.0]
    http.unload_model("uploaded")
    wait_until(lambda: not any(os.path.exists(p) for p in uploads)
               and not glob.glob(os.path.join(tempfile.gettempdir(), "shmserve-uploaded-*")),
               what="upload directories removed")


def test_a_config_that_does_not_validate_fails_its_versions_as_in_triton(explicit):
    server, repo, http, _ = explicit
    add_model(repo, "invalid", versions=(1, 2, 3))
    config = json.loads(config_json("invalid", 1.0, policy={"specific": {"versions": [1, 3]}}))
    config["output"][1]["dims"] = [-2]
    status, body = post(server, "/v2/repository/models/invalid/load",
                        {"parameters": {"config": json.dumps(config)}})
    why = ("Invalid argument: model output 'VERSION' dimension must be integer >= 1, or -1 to "
           "indicate a variable-size dimension for invalid")
    # Each version the policy selects fails, in Triton's words.
    assert (status, body["error"]) == (
        400, f"load failed for model 'invalid': version 1 is at UNAVAILABLE state: {why};"
             f"version 3 is at UNAVAILABLE state: {why};\n")
    index = [m for m in http.get_model_repository_index() if m["name"] == "invalid"]
    assert index == [{"name": "invalid", "version": str(v), "state": "UNAVAILABLE",
                      "reason": why} for v in (1, 3)]
    for version, message in (
            ("", "Request for unknown model: 'invalid' has no available versions"),
            ("3", "Request for unknown model: 'invalid' version 3 is not at ready state")):
        with pytest.raises(InferenceServerException) as refused:
            infer(http, "invalid", version)
        assert refused.value.message() == message


def test_file_paths_are_joined_to_the_model_folder_and_must_stay_in_it(explicit):
    """As Triton: "file:/1/model.py" is 1/model.py of the model's folder; a path that leaves
    the folder once normalized is refused, in Triton's words."""
    server, _, http, _ = explicit
    model = base64.b64encode(SCALE_MODEL.encode()).decode()
    status, _ = post(server, "/v2/repository/models/rooted/load", {"parameters": {
        "config": config_json("rooted", 3.0), "file:/1/model.py": model}})
    assert status == 200
    assert infer(http, "rooted")[0].tolist() == [3.0, 6.0]
    http.unload_model("rooted")
    for key in ("file:../1/model.py", "file:1/../../x.py", "file:"):
        status, body = post(server, "/v2/repository/models/leaving/load", {"parameters": {
            "config": config_json("leaving", 3.0), key: model}})
        assert status == 400, key
        assert body["error"].startswith(f"Invalid file parameter '{key}' with normalized path '")
        assert body["error"].endswith("' must stay within model directory.")
    status, body = post(server, "/v2/repository/models/leaving/load", {"parameters": {
        "config": config_json("leaving", 3.0), "file:1": model, "file:1/model.py": model}})
    assert (status, body["error"]) == (
        400, "Invalid file parameter 'file:1/model.py', directory has been created as a file")
    status, body = post(server, "/v2/repository/models/leaving/load", {"parameters": {
        "config": config_json("leaving", 3.0), "file:1/mo\u0000del.py": model}})
    assert status == 400 and body["error"].startswith("Invalid file parameter")


@pytest.mark.parametrize("name", ["model;test", "model$test", "model(test)", "model!test"])
def test_python_model_names_a_shell_would_read_are_refused(explicit, name):
    """Triton's Python backend refuses to start a process named after such a model."""
    server, _, http, _ = explicit
    status, body = post(server, f"/v2/repository/models/{urllib.parse.quote(name)}/load", {
        "parameters": {"config": config_json(name, 3.0),
                       "file:1/model.py": base64.b64encode(SCALE_MODEL.encode()).decode()}})
    why = "Invalid argument: Invalid stub name: contains invalid characters"
    assert (status, body["error"]) == (
        400, f"load failed for model '{name}': version 1 is at UNAVAILABLE state: {why};\n")
    assert not http.is_model_ready(name)


def test_files_without_config_are_refused(explicit):
    server, _, _, _ = explicit
    status, body = post(server, "/v2/repository/models/scale/load", {"parameters": {
        "file:1/model.py": base64.b64encode(b"x").decode()}})
    assert status == 400 and "'config'" in body["error"]


def test_repository_name_segment_is_unsupported(explicit):
    server, _, _, _ = explicit
    status, body = post(server, "/v2/repository/myrepo/index", {})
    assert (status, body) == (501, {"error": "'repository_name' specification is not supported"})
    status, _ = post(server, "/v2/repository/myrepo/models/scale/load", {})
    assert status == 501


def test_version_policies_decide_which_versions_serve(explicit):
    _, _, http, grpc = explicit
    entries = index(http)
    assert ("multi", "1") not in entries
    assert entries[("multi", "2")][0] == entries[("multi", "3")][0] == "READY"
    assert infer(http, "multi")[1] == 3
    assert infer(grpc, "multi", "2")[1] == 2
    http.load_model("multi", config=config_json("multi", 2.0, {"specific": {"versions": [1]}}))
    assert infer(http, "multi")[1] == 1
    entries = wait_until(lambda: (lambda e: e if e[("multi", "3")][0] == "UNAVAILABLE" else None)(
        index(grpc)), what="versions 2 and 3 unloaded")
    assert entries[("multi", "1")] == ("READY", "")
    assert entries[("multi", "2")] == entries[("multi", "3")] == ("UNAVAILABLE", "unloaded")
    http.load_model("multi", config=config_json("multi", 2.0, {"all": {}}))
    assert {v for (n, v), (s, _) in index(http).items() if n == "multi" and s == "READY"} == {
        "1", "2", "3"}


def test_reload_under_load_fails_no_request(explicit):
    server, _, http, _ = explicit
    failures, done, outputs = [], threading.Event(), set()

    def hammer():
        client = httpclient.InferenceServerClient(server.http_url)
        try:
            while not done.is_set():
                try:
                    outputs.add(infer(client, "scale")[0][0])
                except Exception as exc:  # any failure is the test's failure
                    failures.append(exc)
        finally:
            client.close()

    threads = [threading.Thread(target=hammer) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        for factor in (3.0, 4.0, 2.0):
            http.load_model("scale", config=config_json("scale", factor))
            time.sleep(0.3)
    finally:
        done.set()
        for t in threads:
            t.join()
    assert not failures, failures[:3]
    assert {3.0, 4.0, 2.0} <= outputs


def test_is_ready_false_makes_the_model_not_ready(explicit):
    _, _, http, grpc = explicit
    assert index(http)[("not_ready", "1")] == ("READY", "")
    assert not http.is_model_ready("not_ready")
    assert not grpc.is_model_ready("not_ready")
    assert infer(http, "not_ready")[0].tolist() == [2.0, 4.0]  # it still serves


def test_is_ready_that_hangs_counts_as_not_ready_after_5_seconds(explicit):
    _, _, http, _ = explicit
    started = time.monotonic()
    assert not http.is_model_ready("slow_ready")
    assert 4.5 < time.monotonic() - started < 6.0
