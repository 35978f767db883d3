"""When the worker tells the front what it wrote of a batch's answers: on the next batch's
Result when that batch is already waiting, else in a Written frame of its own before it waits
(workers/loop.py), over a real socket for the clients' answers; and what the front's worker
handle makes of it, the worker's death included."""

import asyncio
import os
import socket
import textwrap

import numpy as np
import pytest

from shmserve.dispatch.batch_dispatch import SentBatch
from shmserve.dispatch.worker import WorkerHandle
from shmserve.ipc import codec, messages, request_table
from shmserve.ipc.request_table import RequestTable
from shmserve.ipc.segments import Segment
from tests.unit.workers.test_prepared_answers import _read_all as read_all
from workers import loop
from workers.backends import Context
from workers.backends.python import PythonModel
from workers.loop import WorkerLoop
from workers.server_calls import FrameReader

CONFIG = {"name": "ident", "max_batch_size": 8,
          "input": [{"name": "IN", "data_type": "TYPE_FP32", "dims": [2]}],
          "output": [{"name": "OUT", "data_type": "TYPE_FP32", "dims": [2]}]}
# A batch longer than this is told of at once; shorter ones carry (set for the tests, so that
# a loaded machine does not make a short batch long).
CARRY_BELOW_NS = 50_000_000
# Sleeps 60 ms (longer than that) when its first value is negative.
IDENTITY = """
    import time
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            out = []
            for request in requests:
                value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
                if value[0, 0] < 0:
                    time.sleep(0.06)
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", value)]))
            return out
"""
PREFIX = b"HEAD "
EXPECTED = [["OUT", "FP32", [1, 2], 8]]


class QueueChannel:
    """The front's side of the worker's socket: frames waiting for the loop, and what it sent,
    each through the wire codec."""

    def __init__(self, frames):
        self._frames = list(frames)
        self.sent = []

    def recv(self):
        return _through_wire(self._frames.pop(0)) if self._frames else None

    def has_data(self) -> bool:
        return bool(self._frames)  # past the last frame, recv stands for waiting

    def send(self, message):
        self.sent.append(_through_wire(message))


def _through_wire(message):
    return codec.decode_body(codec.encode(message)[1])


@pytest.fixture
def worker(tmp_path, monkeypatch):
    """run(frames, lend=[batch ids], full=False) -> (frames the loop sent, bytes the client
    got, the request table's written mark); `full`: the client's socket takes nothing."""
    model_dir = tmp_path / "ident"
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "1" / "model.py").write_text(textwrap.dedent(IDENTITY))
    runner = PythonModel(Context(model_name="ident", model_version=1, model_dir=str(model_dir),
                         model_config=CONFIG, instance_name="ident_0_0", instance_kind="CPU",
                         device_id=0, model_repository=str(tmp_path)))
    runner.initialize()
    monkeypatch.setattr(loop, "CARRY_WRITTEN_BELOW_NS", CARRY_BELOW_NS)
    segments = [Segment.create(f"/shmtest_written_{os.getpid()}_{tag}", size)
                for tag, size in (("in", 1 << 16), ("out", 1 << 16),
                                  ("rows", request_table.SIZE))]
    client, server = socket.socketpair()
    server.setblocking(False)
    front_end, worker_end = socket.socketpair()

    def run(frames, lend, full=False):
        """Also returns the batch the worker marked as written in full and not yet told."""
        if full:
            try:
                while True:
                    server.send(b"x" * 65536)
            except BlockingIOError:
                pass
        for batch_id in lend:
            socket.send_fds(front_end, [batch_id.to_bytes(8, "little")], [server.fileno()])
        init = messages.Init("ident", 1, "", "", {}, "ident_0_0", "CPU", 0, segments[0].name,
                             segments[1].name, segments[2].name, 1 << 12,
                             loan_fd=os.dup(worker_end.fileno()))
        channel = QueueChannel(frames)
        WorkerLoop(channel, FrameReader(channel), runner, init).run()
        mark = RequestTable(Segment.attach(segments[2].name))
        try:
            return channel.sent, read_all(client), mark.written_mark()
        finally:
            mark.close()

    yield run
    runner.finalize()
    for sock in (client, server, front_end, worker_end):
        sock.close()
    for segment in segments:
        segment.close()
        segment.unlink()


def _execute(batch_id: int, value: float) -> messages.Execute:
    data = np.array([[value, 1.0]], np.float32).tobytes()
    request = messages.RequestFrame(
        f"r{batch_id}", 0, 0, {}, [messages.TensorRef("IN", "FP32", [1, 2], [0, 8])], ["OUT"],
        batch_id, prepared_answer=[0, [PREFIX, b"\n"], EXPECTED])
    return messages.Execute(batch_id, data, [request])


def _answer(value: float) -> bytes:
    return PREFIX + np.array([value, 1.0], np.float32).tobytes() + b"\n"


def _told(sent) -> list:
    """What each frame sent said about written answers: ("result", batch, carried) or
    ("written", batch)."""
    return [("result", m.batch_id, m.written) if isinstance(m, messages.Result)
            else ("written", m.batch_id) for m in sent
            if isinstance(m, (messages.Result, messages.Written))]


def test_a_waiting_batch_carries_what_the_last_one_wrote(worker):
    sent, got, mark = worker([_execute(1, 1.0), _execute(2, 2.0)], lend=[1, 2])
    assert _told(sent) == [("result", 1, []), ("result", 2, [[1, []]]), ("written", 2)]
    assert all(r.written_by_worker for m in sent if isinstance(m, messages.Result)
               for r in m.responses)
    assert got == _answer(1.0) + _answer(2.0)
    assert mark == 2  # each batch was marked whole while its news waited


def test_a_frame_of_another_kind_does_not_carry_it(worker):
    sent, _, _ = worker([_execute(1, 1.0), messages.Release([]), messages.Shutdown()],
                        lend=[1])
    assert _told(sent) == [("result", 1, []), ("written", 1)]
    assert isinstance(sent[-1], messages.Bye)


def test_after_a_long_batch_the_worker_tells_at_once(worker):
    sent, got, mark = worker([_execute(1, 1.0), _execute(2, -1.0), _execute(3, 3.0)],
                             lend=[1, 2, 3])
    assert _told(sent) == [("result", 1, []), ("result", 2, [[1, []]]), ("written", 2),
                           ("result", 3, []), ("written", 3)]
    assert got == _answer(1.0) + _answer(-1.0) + _answer(3.0)
    assert mark == 3


def test_the_long_batch_is_not_marked(worker):
    _, _, mark = worker([_execute(1, 1.0), _execute(2, -1.0)], lend=[1, 2])
    assert mark == 1


def test_what_a_full_socket_did_not_take_goes_to_the_front_at_once(worker):
    sent, _, mark = worker([_execute(1, 1.0), _execute(2, 2.0)], lend=[1, 2], full=True)
    # Its client waits for the rest. The second batch's answer is left to the front.
    assert _told(sent) == [("result", 1, []), ("written", 1), ("result", 2, [])]
    written = [m for m in sent if isinstance(m, messages.Written)][0]
    assert written.unsent == [[0, _answer(1.0)]]
    second = [m for m in sent if isinstance(m, messages.Result)][1]
    assert not second.responses[0].written_by_worker
    assert mark == 0  # never marked: what the front does not have yet is not whole


def test_the_front_is_told_before_the_worker_waits(worker):
    sent, _, _ = worker([_execute(1, 1.0)], lend=[1])
    assert _told(sent) == [("result", 1, []), ("written", 1)]


# --- the front's side ---------------------------------------------------------------------------


class Answer:
    """A lent answer, recording what became of it in a shared log."""

    def __init__(self, name, log):
        self.name = name
        self._log = log

    def returned(self, unsent):
        self._log.append((self.name, unsent))

    def lost(self):
        self._log.append((self.name, "lost"))


@pytest.fixture
def handle():
    """A worker handle whose process is never started, with a request table; and the
    worker's view of that table."""
    segment = Segment.create(f"/shmtest_written_front_{os.getpid()}", request_table.SIZE)
    h = WorkerHandle(model_name="ident", model_version=1, model_dir="", model_repository="",
                     model_config={}, instance_name="ident_0", instance_kind="CPU",
                     device_id=0)
    h._memory.table = RequestTable(segment)
    workers_view = RequestTable(Segment.attach(segment.name))
    yield h, workers_view
    workers_view.close()
    h._memory.table.close()
    segment.unlink()


def test_carried_news_is_handled_before_the_results_own_answers(handle):
    h, _ = handle
    log = []

    async def scenario():
        future = asyncio.get_running_loop().create_future()
        h._loans._writing[1] = [(0, Answer("first", log))]
        h._batches.pending[2] = SentBatch(future, None, [], 1, [(0, Answer("second", log))])
        h._batches.rows = request_table.RowAllocator()
        h._on_message(messages.Result(2, [messages.ResponseFrame(None, [])],
                                      written=[[1, [[0, b"rest"]]]]))
        return future.done()

    assert asyncio.run(scenario())
    # The first batch's rest goes first; the second's answer, not the worker's, is the front's.
    assert log == [("first", b"rest"), ("second", None)]
    assert not h._loans._writing


def test_a_dead_workers_marked_batch_keeps_its_connections(handle):
    h, workers_view = handle
    log = []
    h._loans._writing[1] = [(0, Answer("unmarked", log))]
    h._loans._writing[2] = [(0, Answer("marked", log)), (1, Answer("marked too", log))]
    workers_view.mark_written(2)
    h._fail_pending("exited with signal 9")
    assert sorted(log) == [("marked", b""), ("marked too", b""), ("unmarked", "lost")]
