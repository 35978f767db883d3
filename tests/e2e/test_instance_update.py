"""Reloading a model whose config changes only in its instance groups updates its instances in
place, as Triton does (its qa/L0_model_update): the kept instances are neither initialized nor
finalized again, only the added ones start and only the removed ones stop, the version stays
READY, and inference goes on without an error. A change of any other field, or of the model's
files, reloads the whole version. The model, `_instance_life` (tests/models/README.md), records
each instance's initialize and finalize."""

import json
import os
import shutil
import threading
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import ROOT, start_server, stop_server

# Among the longest modules of the suite (pytest --durations): -m "not slow" skips it.
pytestmark = pytest.mark.slow

LIFE = os.path.join(ROOT, "tests", "models", "_instance_life")


def life_config(record_to: str, count: int, batching: str = "", extra: str = "") -> str:
    """`batching`: "" (none), "dynamic" or "sequence"."""
    scheduling = {"": "", "dynamic": "dynamic_batching { }",
                  "sequence": "sequence_batching { max_sequence_idle_microseconds: 60000000 }"}
    return f'''
name: "life"
backend: "python"
max_batch_size: {8 if batching == "dynamic" else 0}
input [ {{ name: "SECONDS" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "INSTANCE" data_type: TYPE_STRING dims: [ 1 ] }} ]
instance_group [ {{ count: {count} kind: KIND_CPU }} ]
parameters {{ key: "record_to" value {{ string_value: "{record_to}" }} }}
{scheduling[batching]}
{extra}
'''


def write_config(repo: str, text: str) -> None:
    path = os.path.join(repo, "life", "config.pbtxt")
    old = os.stat(path).st_mtime_ns if os.path.exists(path) else 0
    with open(path, "w") as f:
        f.write(text)
    # A new mtime, however coarse the file system's clock, for poll mode to see the change.
    os.utime(path, ns=(max(old + 10_000_000, time.time_ns()),) * 2)


@pytest.fixture
def life(tmp_path):
    """(repository, events file): `life` copied from _instance_life, recording to the file."""
    repo = str(tmp_path / "repo")
    os.makedirs(os.path.join(repo, "life"))
    shutil.copytree(os.path.join(LIFE, "1"), os.path.join(repo, "life", "1"))
    return repo, str(tmp_path / "events")


class Events:
    """The lines the instances recorded, read since the last `new()`."""

    def __init__(self, path: str):
        self.path = path
        self.seen = 0

    def all(self) -> list:
        try:
            with open(self.path) as f:
                return [tuple(line.split()) for line in f.read().splitlines()]
        except FileNotFoundError:
            return []

    def new(self) -> list:
        lines = self.all()
        out, self.seen = lines[self.seen:], len(lines)
        return sorted(out)

    def wait(self, expected: list, timeout: float = 30.0) -> None:
        """Until the lines recorded since the last `new()` are `expected` (in any order)."""
        deadline = time.monotonic() + timeout
        while sorted(self.all()[self.seen:]) != sorted(expected):
            if time.monotonic() > deadline:
                raise AssertionError(f"events {self.all()[self.seen:]}, expected {expected}")
            time.sleep(0.05)
        self.new()


def infer(client, seconds: float = 0.0, batching: str = "", **kwargs) -> str:
    """The name of the instance that ran the request."""
    module = grpcclient if isinstance(client, grpcclient.InferenceServerClient) else httpclient
    shape = [1, 1] if batching == "dynamic" else [1]
    inp = module.InferInput("SECONDS", shape, "FP32")
    inp.set_data_from_numpy(np.full(shape, seconds, dtype=np.float32))
    result = client.infer("life", [inp], **kwargs)
    return result.as_numpy("INSTANCE").flat[0].decode()


class Hammer:
    """Threads that keep inferring (half over HTTP, half over gRPC) and one that keeps asking
    whether the model is ready, recording every failure and which instances answered."""

    def __init__(self, server, batching: str = "", threads: int = 3):
        self.server = server
        self.batching = batching
        self.failures: list = []
        self.unready = 0
        self.served: dict = {}  # instance name -> requests it answered
        self._done = threading.Event()
        self._threads = [threading.Thread(target=self._infer, args=(i,)) for i in range(threads)]
        self._threads.append(threading.Thread(target=self._ready))

    def __enter__(self):
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self._done.set()
        for t in self._threads:
            t.join()

    @property
    def answered(self) -> int:
        return sum(self.served.values())

    def _infer(self, i: int) -> None:
        module = httpclient if i % 2 else grpcclient
        url = self.server.http_url if i % 2 else self.server.grpc_url
        client = module.InferenceServerClient(url)
        try:
            while not self._done.is_set():
                try:
                    name = infer(client, 0.01, self.batching)
                    self.served[name] = self.served.get(name, 0) + 1
                except Exception as exc:  # any failure is the test's failure
                    self.failures.append(exc)
        finally:
            client.close()

    def _ready(self) -> None:
        client = httpclient.InferenceServerClient(self.server.http_url)
        try:
            while not self._done.is_set():
                if not client.is_model_ready("life"):
                    self.unready += 1
                time.sleep(0.02)
        finally:
            client.close()


def wait_until(predicate, timeout: float = 30.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def start(repo: str, tmp_path, *extra):
    return start_server(repo, str(tmp_path / "server.log"), *extra, wait_models=("life",))


@pytest.mark.parametrize("batching", ["", "dynamic"])
def test_instance_count_changes_update_the_instances_in_place(life, tmp_path, batching):
    repo, record = life
    write_config(repo, life_config(record, 2, batching))
    server = start(repo, tmp_path, "--model-control-mode=explicit", "--load-model=life")
    events = Events(record)
    http = httpclient.InferenceServerClient(server.http_url)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        assert events.new() == [("initialize", "life_0_0"), ("initialize", "life_0_1")]
        with Hammer(server, batching) as hammer:
            wait_until(lambda: hammer.answered > 10, what="requests before the update")
            # 2 -> 3 by config.pbtxt: one instance starts, the two serving are kept.
            write_config(repo, life_config(record, 3, batching))
            http.load_model("life")
            assert events.new() == [("initialize", "life_0_2")]
            wait_until(lambda: "life_0_2" in hammer.served, what="the new instance serving")
            # 3 -> 1 through the load API, with the config the server shows (as Triton's
            # test_load_api_with_config). As Triton, the instance kept is the last one of its
            # list, which is the kept ones as they were claimed, then the new: life_0_2. The
            # load returns once the removed ones are finalized.
            config = grpc.get_model_config("life", as_json=True)["config"]
            assert config["instance_group"][0]["count"] == 3
            config["instance_group"][0]["count"] = 1
            grpc.load_model("life", config=json.dumps(config))
            assert events.new() == [("finalize", "life_0_0"), ("finalize", "life_0_1")]
            assert {infer(http, 0, batching) for _ in range(4)} == {"life_0_2"}
            answered = hammer.answered
            wait_until(lambda: hammer.answered > answered + 10, what="requests after it")
        assert not hammer.failures, hammer.failures[:3]
        assert hammer.unready == 0
        assert set(hammer.served) == {"life_0_0", "life_0_1", "life_0_2"}
        config = http.get_model_config("life")
        assert [(g["name"], g["count"]) for g in config["instance_group"]] == [("life_0", 1)]
        # The statistics count on through the updates.
        stats = grpc.get_inference_statistics("life", as_json=True)["model_stats"][0]
        assert int(stats["inference_stats"]["success"]["count"]) >= hammer.answered + 4
        # Loading again what serves changes nothing (Triton skips an unmodified model).
        write_config(repo, life_config(record, 1, batching))
        http.load_model("life")
        assert infer(grpc, 0, batching) == "life_0_2"
        assert events.new() == []
        http.unload_model("life")
        events.wait([("finalize", "life_0_2")])
    finally:
        http.close()
        grpc.close()
        stop_server(server)


def test_updates_wait_for_no_request_and_removed_instances_finish_theirs(life, tmp_path):
    repo, record = life
    write_config(repo, life_config(record, 2))
    server = start(repo, tmp_path, "--model-control-mode=explicit", "--load-model=life")
    events = Events(record)
    http = httpclient.InferenceServerClient(server.http_url)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        events.new()
        long_answer = []
        long_request = threading.Thread(
            target=lambda: long_answer.append((infer(grpc, 4.0), time.monotonic())))
        long_request.start()  # on life_0_0, the first idle instance
        time.sleep(0.5)
        # Adding an instance does not wait for the request in flight (Triton's
        # test_update_while_inferencing).
        write_config(repo, life_config(record, 3))
        began = time.monotonic()
        http.load_model("life")
        assert time.monotonic() - began < 3.0
        assert events.new() == [("initialize", "life_0_2")]
        # Removing the instance that runs it waits until the request is answered.
        write_config(repo, life_config(record, 1))
        http.load_model("life")
        returned = time.monotonic()
        long_request.join()
        assert long_answer[0][0] == "life_0_0" and long_answer[0][1] <= returned
        assert events.new() == [("finalize", "life_0_0"), ("finalize", "life_0_1")]
        # Requests are not held up by an instance that is slow to start (Triton's
        # test_infer_while_updating).
        with open(record + ".init_delay", "w") as f:
            f.write("3")
        write_config(repo, life_config(record, 2))
        loading = threading.Thread(target=grpc.load_model, args=("life",))
        loading.start()
        time.sleep(0.5)
        for _ in range(5):
            began = time.monotonic()
            assert infer(grpc) == "life_0_2"
            assert time.monotonic() - began < 1.0
        assert http.is_model_ready("life")
        loading.join()
        os.remove(record + ".init_delay")
        assert events.new() == [("initialize", "life_0_1")]
        # An instance that fails to start fails the load; the version serves on as it was.
        # (Serving: life_0_2, then life_0_1. The third instance wanted is new, and named by its
        # place in the group as Triton names it: life_0_2 too.)
        open(record + ".init_fail", "w").close()
        write_config(repo, life_config(record, 3))
        with pytest.raises(InferenceServerException) as failed:
            http.load_model("life")
        assert failed.value.message().startswith(
            "load failed for model 'life': version 1 is at READY state: ")
        assert "life_0_2 was told to fail" in failed.value.message()
        assert http.is_model_ready("life")
        assert [g["count"] for g in http.get_model_config("life")["instance_group"]] == [2]
        assert {infer(grpc) for _ in range(6)} <= {"life_0_1", "life_0_2"}
        assert events.new() == []
        os.remove(record + ".init_fail")
        http.load_model("life")
        assert events.new() == [("initialize", "life_0_2")]
    finally:
        http.close()
        grpc.close()
        stop_server(server)


def test_another_field_changing_reloads_the_whole_version(life, tmp_path):
    repo, record = life
    write_config(repo, life_config(record, 2))
    server = start(repo, tmp_path, "--model-control-mode=explicit", "--load-model=life")
    events = Events(record)
    http = httpclient.InferenceServerClient(server.http_url)
    try:
        events.new()
        with Hammer(server) as hammer:
            wait_until(lambda: hammer.answered > 10, what="requests before the reload")
            write_config(repo, life_config(
                record, 3, extra='parameters { key: "flavor" value { string_value: "new" } }'))
            http.load_model("life")
            # The new version is up before the old one goes: its instances all start; the
            # old ones all stop once they have answered what they hold.
            events.wait([("initialize", "life_0_0"), ("initialize", "life_0_1"),
                         ("initialize", "life_0_2"), ("finalize", "life_0_0"),
                         ("finalize", "life_0_1")])
            answered = hammer.answered
            wait_until(lambda: hammer.answered > answered + 10, what="requests after it")
        assert not hammer.failures, hammer.failures[:3]
        assert hammer.unready == 0
    finally:
        http.close()
        stop_server(server)


def test_poll_mode_updates_in_place_and_reloads_when_a_model_file_changes(life, tmp_path):
    repo, record = life
    write_config(repo, life_config(record, 1, "dynamic"))
    server = start(repo, tmp_path, "--model-control-mode=poll", "--repository-poll-secs=1")
    events = Events(record)
    http = httpclient.InferenceServerClient(server.http_url)
    try:
        assert events.new() == [("initialize", "life_0_0")]
        with Hammer(server, "dynamic") as hammer:
            write_config(repo, life_config(record, 2, "dynamic"))
            events.wait([("initialize", "life_0_1")])
            time.sleep(2.5)  # polls that see nothing new change nothing
            assert events.new() == []
            # A file of the version changes: the version loads anew.
            with open(os.path.join(repo, "life", "1", "model.py"), "a") as f:
                f.write("\n# changed\n")
            events.wait([("initialize", "life_0_0"), ("initialize", "life_0_1"),
                         ("finalize", "life_0_0"), ("finalize", "life_0_1")])
            answered = hammer.answered
            wait_until(lambda: hammer.answered > answered + 10, what="requests after it")
        assert not hammer.failures, hammer.failures[:3]
        assert hammer.unready == 0
    finally:
        http.close()
        stop_server(server)


def test_a_removed_instance_keeps_its_sequences_until_they_end(life, tmp_path):
    """As Triton's _test_scheduler_update_with_ongoing_sequences: a sequence goes on on the
    instance it started on after an update removed it; the instance stops when it ends."""
    repo, record = life
    write_config(repo, life_config(record, 2, "sequence"))
    server = start(repo, tmp_path, "--model-control-mode=explicit", "--load-model=life")
    events = Events(record)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        events.new()
        assert infer(grpc, sequence_id=1, sequence_start=True) == "life_0_0"
        # 2 -> 1 keeps life_0_1, the last: life_0_0, which holds sequence 1, stays until it ends.
        write_config(repo, life_config(record, 1, "sequence"))
        grpc.load_model("life")
        time.sleep(0.5)
        assert events.new() == []
        assert infer(grpc, sequence_id=1) == "life_0_0"
        assert infer(grpc, sequence_id=2, sequence_start=True) == "life_0_1"
        assert events.new() == []
        assert infer(grpc, sequence_id=1, sequence_end=True) == "life_0_0"
        events.wait([("finalize", "life_0_0")])
        assert infer(grpc, sequence_id=2, sequence_end=True) == "life_0_1"
        assert infer(grpc, sequence_id=3, sequence_start=True, sequence_end=True) == "life_0_1"
    finally:
        grpc.close()
        stop_server(server)


def test_an_added_instance_warms_up_before_it_serves(life, tmp_path):
    repo, record = life
    warmup = ('model_warmup [ { name: "w" batch_size: 1 inputs { key: "SECONDS" value: '
              '{ data_type: TYPE_FP32 dims: [ 1 ] zero_data: true } } } ]')
    write_config(repo, life_config(record, 1, extra=warmup))
    server = start(repo, tmp_path, "--model-control-mode=explicit", "--load-model=life")
    http = httpclient.InferenceServerClient(server.http_url)

    def executions() -> int:
        return http.get_inference_statistics("life")["model_stats"][0]["execution_count"]

    try:
        assert executions() == 1  # life_0_0's warmup, before the model was ready
        write_config(repo, life_config(record, 2, extra=warmup))
        http.load_model("life")
        assert executions() == 2  # life_0_1's, before it joined
        assert [g["count"] for g in http.get_model_config("life")["instance_group"]] == [2]
    finally:
        http.close()
        stop_server(server)
