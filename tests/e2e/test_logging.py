"""The log: `/v2/logging` and gRPC LogSettings (Triton's shapes and errors), a model's output
in the server log tagged with its instance, JSON lines, runtime verbose level, --log-file."""

import json
import os
import re
import time
import urllib.error
import urllib.request
import uuid

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import start_server, stop_server

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULTS = {"log_file": "", "log_info": True, "log_warning": True, "log_error": True,
            "log_verbose_level": 0, "log_format": "default"}
TAGGED = "[model=log_probe version=1 instance=log_probe_0_0] "


def _repository(tmp_path_factory):
    repo = tmp_path_factory.mktemp("log_repo")
    os.symlink(os.path.join(ROOT, "models", "log_probe"), repo / "log_probe")
    return str(repo)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = start_server(_repository(tmp_path_factory),
                       str(tmp_path_factory.mktemp("log_logs") / "log"),
                       wait_models=("log_probe",))
    yield srv
    stop_server(srv)


@pytest.fixture
def http(server):
    client = httpclient.InferenceServerClient(server.http_url)
    yield client
    client.update_log_settings({k: v for k, v in DEFAULTS.items() if k != "log_file"})
    client.close()


def _infer(server, tag, request_id=""):
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        inp = httpclient.InferInput("TAG", [1], "BYTES")
        inp.set_data_from_numpy(np.array([tag.encode()], dtype=np.object_))
        return client.infer("log_probe", [inp], request_id=request_id)
    finally:
        client.close()


def _tag(prefix="t"):
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _lines_with(server, needle, count, timeout=10.0):
    """The log lines holding `needle`, once there are `count` of them."""
    deadline = time.monotonic() + timeout
    while True:
        lines = [line for line in server.log().splitlines() if needle in line]
        if len(lines) >= count or time.monotonic() > deadline:
            return lines
        time.sleep(0.05)


def test_http_log_settings(http):
    assert http.get_log_settings() == DEFAULTS
    assert http.update_log_settings({"log_verbose_level": 2, "log_info": False}) == {
        **DEFAULTS, "log_verbose_level": 2, "log_info": False}
    assert http.get_log_settings()["log_verbose_level"] == 2
    # Triton skips null values and unknown names.
    assert http.update_log_settings({"log_info": None, "log_warnings": False})["log_info"] is False


@pytest.mark.parametrize("body,status,message", [
    ({"log_file": "x.log"}, 501, "log file location can not be updated through network protocol"),
    ({"log_info": "yes"}, 400, "expect boolean for 'log_info'"),
    ({"log_verbose_level": -1}, 400, "expect int32 for 'log_verbose_level'"),
    ({"log_format": "xml"}, 400, "invalid argument for --log_format, got: xml"),
])
def test_http_log_settings_refusals(server, http, body, status, message):
    with pytest.raises(InferenceServerException) as e:
        http.update_log_settings({"log_info": False, **body})
    assert e.value.message() == message
    request = urllib.request.Request(f"http://{server.http_url}/v2/logging",
                                     data=json.dumps(body).encode(), method="POST")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(request, timeout=5)
    assert e.value.code == status
    assert json.loads(e.value.read()) == {"error": message}
    assert http.get_log_settings() == DEFAULTS  # nothing took effect


def test_grpc_log_settings(server, http):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        assert client.get_log_settings(as_json=True) == {"settings": {
            "log_file": {"string_param": ""}, "log_info": {"bool_param": True},
            "log_warning": {"bool_param": True}, "log_error": {"bool_param": True},
            "log_verbose_level": {"uint32_param": 0}, "log_format": {"string_param": "default"}}}
        updated = client.update_log_settings({"log_verbose_level": 1, "log_format": "ISO8601",
                                              "log_error": False}, as_json=True)["settings"]
        assert updated["log_verbose_level"] == {"uint32_param": 1}
        assert updated["log_format"] == {"string_param": "ISO8601"}
        assert updated["log_error"] == {"bool_param": False}
        assert http.get_log_settings()["log_format"] == "ISO8601"  # one setting, two transports
        for settings, code, message in (
                ({"log_file": "x.log"}, grpc.StatusCode.UNIMPLEMENTED,
                 "log file location can not be updated through network protocol"),
                ({"log_info": None}, grpc.StatusCode.INVALID_ARGUMENT,
                 "expect boolean for 'log_info'"),
                ({"log_format": "xml"}, grpc.StatusCode.INVALID_ARGUMENT,
                 "invalid argument for --log_format, got: xml")):
            with pytest.raises(InferenceServerException) as e:
                client.update_log_settings(settings)
            assert e.value.status() == str(code) and e.value.message() == message
    finally:
        client.close()


def test_logging_extension_is_announced(http):
    assert "logging" in http.get_server_metadata()["extensions"]


def test_model_output_reaches_the_log_tagged_with_the_instance(server, http):
    tag = _tag()
    assert _infer(server, tag).as_numpy("OUT")[0] == tag.encode()
    expected = {f"print {tag}": "I", f"stderr {tag}": "W", f"logging {tag}": "W",
                f"traceback {tag}": "E", f"info {tag}": "I", f"warn {tag}": "W",
                f"error {tag}": "E", f"leveled {tag}": "W"}
    lines = _lines_with(server, tag, len(expected))
    found = {}
    for line in lines:
        head, message = line.split("] ", 1)
        assert message.startswith(TAGGED), line
        found[message[len(TAGGED):]] = head
    assert set(found) == set(expected)  # no verbose line: the verbose level is 0
    for message, letter in expected.items():
        assert re.match(rf"{letter}\d{{4}} \d\d:\d\d:\d\d\.\d{{6}} \d+ ", found[message])
    # pb_utils.Logger and logging keep the model's source line; prints are named by stream.
    assert found[f"info {tag}"].endswith(" model.py:28")
    assert found[f"logging {tag}"].endswith(" model.py:23")
    assert found[f"print {tag}"].endswith(" stdout")
    # A traceback stays with its record.
    log = server.log()
    assert "ZeroDivisionError: division by zero" in log.split(f"traceback {tag}", 1)[1]


def test_runtime_verbose_level_reaches_the_model(server, http):
    tag = _tag("v")
    http.update_log_settings({"log_verbose_level": 1})
    _infer(server, tag)
    assert len(_lines_with(server, f"verbose {tag}", 1)) == 1
    http.update_log_settings({"log_verbose_level": 0})
    tag = _tag("q")
    _infer(server, tag)
    assert _lines_with(server, f"leveled {tag}", 1)  # the model's last line of the request
    assert f"verbose {tag}" not in server.log()


def test_verbose_logs_the_servers_records_not_its_libraries(server, http):
    """hpack logs every header block it decodes at DEBUG: not in the server's log."""
    http.update_log_settings({"log_verbose_level": 1})
    try:
        client = grpcclient.InferenceServerClient(server.grpc_url)  # a new connection
        assert client.is_server_live()
        client.close()
    finally:
        http.update_log_settings({"log_verbose_level": 0})
    assert "Decoding b" not in server.log() and "hpack.py" not in server.log()


def test_runtime_level_switches(server, http):
    http.update_log_settings({"log_warning": False, "log_info": False})
    tag = _tag("s")
    _infer(server, tag)
    lines = _lines_with(server, f"error {tag}", 1)
    assert lines and f"warn {tag}" not in server.log() and f"info {tag}" not in server.log()


def test_json_lines_and_failed_request_carry_context(server, http):
    http.update_log_settings({"log_format": "json"})
    tag = _tag("fail")
    with pytest.raises(InferenceServerException, match="failing on purpose"):
        _infer(server, tag, request_id="rid-42")
    lines = _lines_with(server, "rid-42", 1)
    entries = [json.loads(line) for line in server.log().splitlines()
               if line.startswith("{") and tag in line]
    by_message = {e["message"].split("\n", 1)[0]: e for e in entries}
    info = by_message[f"info {tag}"]
    assert info["level"] == "INFO" and info["logger"] == "shmserve.model"
    assert info["source"] == "model.py:28" and info["instance"] == "log_probe_0_0"
    assert info["model"] == "log_probe" and info["version"] == 1
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", info["time"])
    assert "ZeroDivisionError" in by_message[f"traceback {tag}"]["message"]
    (failure,) = [json.loads(line) for line in lines]
    assert failure["request_id"] == "rid-42" and failure["model"] == "log_probe"
    assert failure["level"] == "WARNING" and "failing on purpose" in failure["message"]


def test_last_lines_of_a_crashing_worker_are_kept(server, http):
    tag = _tag("crash")
    with pytest.raises(InferenceServerException):
        _infer(server, tag)
    (last,) = _lines_with(server, f"last words {tag}", 1)
    assert TAGGED in last
    log = server.log()
    assert "exited with code 3" in log.split(f"last words {tag}", 1)[1]
    deadline = time.monotonic() + 30
    while not http.is_model_ready("log_probe"):  # restarted by the supervisor
        assert time.monotonic() < deadline, server.log()
        time.sleep(0.1)


def test_log_file_and_iso8601(tmp_path_factory, tmp_path):
    path = tmp_path / "server.log"
    path.write_text("kept\n")
    srv = start_server(_repository(tmp_path_factory), str(tmp_path / "console"),
                       f"--log-file={path}", "--log-format=ISO8601", "--log-verbose=1",
                       wait_models=("log_probe",))
    try:
        tag = _tag("f")
        _infer(srv, tag)
        deadline = time.monotonic() + 10
        while f"verbose {tag}" not in path.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        lines = path.read_text().splitlines()
        assert lines[0] == "kept"
        (info,) = [line for line in lines if line.endswith(f"] {TAGGED}info {tag}")]
        assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ I \d+ model\.py:28\] ", info)
        assert any(line.endswith(f"verbose {tag}") for line in lines)
        client = httpclient.InferenceServerClient(srv.http_url)
        assert client.get_log_settings() == {**DEFAULTS, "log_file": str(path),
                                             "log_format": "ISO8601", "log_verbose_level": 1}
        client.close()
    finally:
        stop_server(srv)
    assert tag not in srv.log()  # the console got none of it

