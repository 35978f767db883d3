"""A Python model's own execution environment (model parameter EXECUTION_ENV_PATH), as
Triton's Python backend takes it: a folder or a packed archive (here a venv made by the test,
holding a package the server's own environment lacks), `$$TRITON_MODEL_DIRECTORY` for the
model's folder; the model and its auto-complete run in it, a model without it cannot import
its package, an archive is unpacked once and removed when the server stops, and an environment
that cannot serve leaves only its model UNAVAILABLE, with Triton's reason."""

import os
import signal
import subprocess
import sys
import tarfile
import tempfile
import textwrap
import time

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.conftest import alive, start_server, stop_server

# Answers the package's value, sys.prefix and VIRTUAL_ENV; its auto_complete_config takes its
# output's name from the package, so that the config shows where auto-complete ran.
MODEL = '''
import os
import sys

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        import only_in_env
        config.add_input({"name": "IN", "data_type": "TYPE_INT32", "dims": [1]})
        config.add_output({"name": only_in_env.OUTPUT, "data_type": "TYPE_STRING", "dims": [3]})
        return config

    def execute(self, requests):
        import only_in_env
        seen = [str(only_in_env.VALUE), sys.prefix, os.environ.get("VIRTUAL_ENV", "")]
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            only_in_env.OUTPUT, np.array([s.encode() for s in seen], dtype=np.object_))])
            for _ in requests]
'''
# A model without auto-complete, for the environments that cannot serve: their failure is its
# version's, as in Triton.
PLAIN = '''
class TritonPythonModel:
    def execute(self, requests):
        return []
'''
PLAIN_IO = '''
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
'''
SERVING = ("env_folder", "env_archive")


def config(path: str, more: str = "") -> str:
    return textwrap.dedent(f'''
        backend: "python"
        parameters {{ key: "EXECUTION_ENV_PATH" value: {{ string_value: "{path}" }} }}
        ''') + more


@pytest.fixture(scope="module")
def environment(tmp_path_factory):
    """A venv whose site-packages hold `only_in_env`, and a .tar.gz of it."""
    root = tmp_path_factory.mktemp("env")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    package = venv / "lib" / version / "site-packages" / "only_in_env"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text('VALUE = 42\nOUTPUT = "FROM_ENV"\n')
    archive = root / "venv.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(venv, arcname=".")
    return venv, archive


@pytest.fixture(scope="module")
def server(tmp_path_factory, environment):
    venv, archive = environment
    repo = tmp_path_factory.mktemp("repo")
    no_activate = tmp_path_factory.mktemp("no_activate")
    other_python = tmp_path_factory.mktemp("other_python")
    (other_python / "bin").mkdir()
    (other_python / "bin" / "activate").write_text("")
    (other_python / "lib" / "python2.7").mkdir(parents=True)
    models = {
        "env_folder": str(venv),
        "env_archive": "$$TRITON_MODEL_DIRECTORY/venv.tar.gz",
        "env_missing": str(repo / "nowhere"),
        "env_no_activate": str(no_activate),
        "env_other_python": str(other_python),
    }
    for name, path in models.items():
        serves = name in SERVING
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.py").write_text(MODEL if serves else PLAIN)
        (repo / name / "config.pbtxt").write_text(config(path, "" if serves else PLAIN_IO))
    (repo / "env_archive" / "venv.tar.gz").write_bytes(archive.read_bytes())
    # Without the environment: its auto-complete cannot import the package.
    (repo / "no_env" / "1").mkdir(parents=True)
    (repo / "no_env" / "1" / "model.py").write_text(MODEL)
    (repo / "no_env" / "config.pbtxt").write_text('backend: "python"\n')
    srv = start_server(str(repo), str(tmp_path_factory.mktemp("logs") / "shmserve.log"),
                       wait_models=SERVING, timeout=120)
    try:
        yield srv
    finally:
        stop_server(srv)


def ask(clients, model) -> list:
    t = httpclient.InferInput("IN", [1], "INT32")
    t.set_data_from_numpy(np.array([1], np.int32))
    return [v.decode() for v in clients["http"].infer(model, [t]).as_numpy("FROM_ENV")]


def reason(clients, model) -> str:
    entry = {m["name"]: m for m in clients["http"].get_model_repository_index()}[model]
    assert entry["state"] == "UNAVAILABLE", entry
    return entry["reason"]


def test_a_folder_environment_runs_the_model_and_its_auto_complete(clients, environment):
    venv, _ = environment
    # The output's name came from the package, through auto_complete_config.
    assert clients["http"].get_model_config("env_folder")["output"][0]["name"] == "FROM_ENV"
    assert ask(clients, "env_folder") == ["42", str(venv), str(venv)]


def test_environments_that_cannot_serve_fail_only_their_model(clients, server):
    missing = reason(clients, "env_missing")
    assert missing.startswith("Internal: Failed to get the canonical path for /")
    assert missing.endswith("/nowhere.")
    no_activate = reason(clients, "env_no_activate")
    assert no_activate.startswith("Internal: Path ") and no_activate.endswith(
        "/bin/activate does not exist. The Python environment should contain an 'activate' "
        "script.")
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    assert reason(clients, "env_other_python").endswith(
        f"holds python2.7; this server's workers need {version}")
    assert reason(clients, "env_other_python").startswith("Internal: ")
    assert "No module named 'only_in_env'" in reason(clients, "no_env")
    for model in SERVING:
        assert clients["http"].is_model_ready(model)


def test_an_archive_is_unpacked_and_removed_when_the_server_stops(clients, server):
    value, prefix, virtual_env = ask(clients, "env_archive")
    assert value == "42" and prefix == virtual_env
    scratch = os.path.basename(os.path.dirname(prefix))
    assert scratch.startswith(f"shmserve_scratch.{server.process.pid}.")
    assert os.path.exists(os.path.join(prefix, "bin", "activate"))
    for client in clients.values():  # a server stopping waits for open connections
        client.close()
    stop_server(server)  # last of the module: the fixture's stop finds it stopped
    assert not os.path.exists(prefix)


def test_a_killed_front_s_unpacked_environment_goes_with_it(tmp_path, environment):
    _, archive = environment
    (tmp_path / "repo" / "env_archive" / "1").mkdir(parents=True)
    (tmp_path / "repo" / "env_archive" / "1" / "model.py").write_text(MODEL)
    (tmp_path / "repo" / "env_archive" / "config.pbtxt").write_text(
        config("$$TRITON_MODEL_DIRECTORY/venv.tar.gz"))
    (tmp_path / "repo" / "env_archive" / "venv.tar.gz").write_bytes(archive.read_bytes())
    srv = start_server(str(tmp_path / "repo"), str(tmp_path / "shmserve.log"),
                       wait_models=("env_archive",), timeout=120)
    workers = srv.children()
    pid = srv.process.pid
    folders = [os.path.join(tempfile.gettempdir(), n) for n in os.listdir(tempfile.gettempdir())
               if n.startswith(f"shmserve_scratch.{pid}.")]
    try:
        assert len(folders) == 1
        os.kill(pid, signal.SIGKILL)  # the server this test started, by its pid
        srv.process.wait()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (
                os.path.exists(folders[0]) or any(alive(p) for p in workers)):
            time.sleep(0.05)
        assert not os.path.exists(folders[0])  # the worker's or the watchdog's doing
        assert not any(alive(p) for p in workers)
    finally:
        stop_server(srv)
