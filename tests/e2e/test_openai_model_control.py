"""The OpenAI routes' model control, as Triton's OpenAI frontend has it in explicit model
control mode: POST /v1/models/{model}/load answers once the model serves (its /v1/models
entry), /unload takes it away, each refused with Triton's texts for a model already loaded,
unknown or failing, and both behind --openai-restricted-api's model-repository group. Driven
with the official openai client and raw HTTP."""

import httpx
import openai
import pytest

from tests.conftest import ROOT, start_server, stop_server

HEADER = {"model-key": "secret"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("openai_repo")
    (repo / "openai_echo").symlink_to(f"{ROOT}/tests/models/openai_echo")
    (repo / "broken" / "1").mkdir(parents=True)
    (repo / "broken" / "1" / "model.py").write_text("raise ImportError('broken on purpose')\n")
    (repo / "broken" / "config.pbtxt").write_text('backend: "python"\n')
    srv = start_server(str(repo), str(tmp_path_factory.mktemp("logs") / "shmserve.log"),
                       "--model-control-mode=explicit",
                       "--openai-restricted-api", "model-repository", "model-key", "secret")
    try:
        yield srv
    finally:
        stop_server(srv)


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=f"http://{server.http_url}", timeout=120,
                      headers=HEADER) as c:
        yield c


def listed(http) -> list:
    return [m["id"] for m in http.get("/v1/models").json()["data"]]


def test_a_model_loads_serves_and_unloads(server, http):
    assert listed(http) == []
    response = http.post("/v1/models/openai_echo/load")
    assert response.status_code == 200, response.text
    entry = response.json()
    assert (entry["id"], entry["object"], entry["owned_by"]) == (
        "openai_echo", "model", "Triton Inference Server")
    assert listed(http) == ["openai_echo"]
    with openai.OpenAI(base_url=f"http://{server.http_url}/v1", api_key="unused",
                       max_retries=0, default_headers=HEADER) as client:
        assert client.models.retrieve("openai_echo").id == "openai_echo"
        text = client.completions.create(model="openai_echo", prompt="hello there",
                                         max_tokens=4).choices[0].text
        assert text
    again = http.post("/v1/models/openai_echo/load")
    assert (again.status_code, again.json()) == (
        400, {"detail": "Model 'openai_echo' is already loaded"})
    response = http.post("/v1/models/openai_echo/unload")
    assert (response.status_code, response.json()) == (
        200, {"status": "success", "model": "openai_echo"})
    assert "openai_echo" not in listed(http)
    again = http.post("/v1/models/openai_echo/unload")
    assert (again.status_code, again.json()) == (400, {"detail": "Unknown model: openai_echo"})


def test_a_model_that_cannot_load_says_why(http):
    # As Triton's frontend maps the server's errors: a load that fails is the client's (400),
    # a model the repository lacks the server's (500: Triton's code for it is INTERNAL).
    for name, status in (("broken", 400), ("no_such_model", 500)):
        response = http.post(f"/v1/models/{name}/load")
        assert response.status_code == status, response.text
        assert response.json()["detail"].startswith(f"Failed to load model '{name}': ")
    assert "broken on purpose" in http.post("/v1/models/broken/load").json()["detail"]


def test_load_and_unload_are_model_repository_apis(server):
    with httpx.Client(base_url=f"http://{server.http_url}", timeout=30) as bare:
        for action in ("load", "unload"):
            response = bare.post(f"/v1/models/openai_echo/{action}")
            assert response.status_code == 401
            assert response.json()["error"]["message"] == (
                "This API is restricted, expecting header 'model-key' with valid value")
