"""The worker's FrameReader (one reader of the socket shared by the frame loop and threads
waiting for replies to their calls into the server), the front's translation of a BLS call
into a request, and both halves of large BLS tensors going by reference."""

import asyncio
import queue
import re
import socket
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

from shmserve.dispatch.memory_regions import Region, RegionSlice
from shmserve.dispatch.worker import WorkerHandle
from shmserve.inference import InferResponse, OutputTensor
from shmserve.ipc import codec, locations, messages
from shmserve.ipc.channel import SyncChannel
from shmserve.ipc.locations import InCallArena, InRegion
from shmserve.ipc.segments import Segment
from shmserve.model_calls import ServerCalls, _infer_request
from workers import triton_python_backend_utils as pb_utils
from workers.server_calls import CallArena, FrameReader

WAIT_S = 5.0
ARENA = 1 << 20


class QueueChannel:
    """recv() blocks on frames the test pushes; None ends the stream as a closed socket."""

    def __init__(self):
        self.incoming: queue.Queue = queue.Queue()
        self.sent: list = []

    def recv(self):
        return self.incoming.get(timeout=WAIT_S)

    def send(self, message) -> None:
        self.sent.append(message)


def reply(call_id: int, final=True, value=None) -> messages.ServerReply:
    return messages.ServerReply(call_id, final, None, value)


def test_a_reply_the_frame_loop_reads_reaches_the_waiting_caller():
    channel = QueueChannel()
    reader = FrameReader(channel)
    replies = reader.call("ready", {"model": "m"})
    assert channel.sent == [messages.ServerCall(1, "ready", {"model": "m"})]  # sent at once
    got = []
    caller = threading.Thread(target=lambda: got.extend(replies))
    channel.incoming.put(messages.Release([8]))
    channel.incoming.put(reply(1, value=True))
    channel.incoming.put(messages.Shutdown())
    caller.start()
    # Whichever thread read them, the loop sees its frames in order and the caller its reply.
    assert reader.next_frame() == messages.Release([8])
    assert reader.next_frame() == messages.Shutdown()
    caller.join(WAIT_S)
    assert [r.value for r in got] == [True]


def test_a_caller_reading_while_the_loop_is_busy_keeps_the_loops_frames_in_order():
    channel = QueueChannel()
    reader = FrameReader(channel)
    replies = reader.call("infer", {})
    for frame in (messages.Release([1]), messages.CheckReady(), reply(1, final=False),
                  reply(1)):
        channel.incoming.put(frame)
    assert [r.final for r in replies] == [False, True]  # the loop never read: the caller did
    assert reader.next_frame() == messages.Release([1])
    assert reader.next_frame() == messages.CheckReady()


def test_leaving_the_replies_early_cancels_the_call():
    channel = QueueChannel()
    reader = FrameReader(channel)
    replies = reader.call("infer", {"decoupled": True})
    channel.incoming.put(reply(1, final=False))
    next(replies)
    replies.close()
    assert channel.sent[-1] == messages.ServerCall(1, "cancel", {})
    channel.incoming.put(reply(1))  # a late reply to a call nobody waits for is dropped
    channel.incoming.put(messages.Shutdown())
    assert reader.next_frame() == messages.Shutdown()


def test_a_closed_socket_ends_the_loop_and_fails_the_callers():
    channel = QueueChannel()
    reader = FrameReader(channel)
    replies = reader.call("ready", {})
    channel.incoming.put(None)
    assert reader.next_frame() is None
    with pytest.raises(ConnectionError):
        next(replies)


def _send(sock, message) -> None:
    header, body = codec.encode(message)
    sock.sendall(header + body)


def test_before_waiting_is_called_only_when_the_next_frame_has_yet_to_come():
    front, worker = socket.socketpair()
    # Should the reader wait without telling, the front's end closing fails the test instead.
    guard = threading.Timer(WAIT_S, front.shutdown, [socket.SHUT_WR])
    guard.start()
    try:
        reader = FrameReader(SyncChannel(worker))
        called = []
        _send(front, messages.Release([1]))
        assert reader.next_frame(lambda: called.append("early")) == messages.Release([1])
        assert called == []

        def told():  # what the worker tells before it waits brings the next frame here
            called.append("told")
            _send(front, messages.CheckReady())

        assert reader.next_frame(told) == messages.CheckReady()
        assert called == ["told"]
        # A reply read on the way is not the loop's frame: the loop would wait after it.
        replies = reader.call("ready", {})
        _send(front, reply(1, value=True))
        assert reader.next_frame(told) == messages.CheckReady()
        assert called == ["told", "told"]
        assert [r.value for r in replies] == [True]
        front.shutdown(socket.SHUT_WR)
        assert reader.next_frame(lambda: called.append("late")) is None
        assert called == ["told", "told"]  # the end had come: nothing to wait for
    finally:
        guard.cancel()
        front.close()
        worker.close()


def test_before_waiting_is_called_while_a_caller_waits_in_recv():
    channel = QueueChannel()
    reader = FrameReader(channel)
    replies = reader.call("ready", {})
    caller = threading.Thread(target=lambda: list(replies))
    caller.start()
    deadline = time.monotonic() + WAIT_S
    while not reader._reading and time.monotonic() < deadline:
        time.sleep(0.001)

    def told():
        channel.incoming.put(messages.CheckReady())
        channel.incoming.put(reply(1))

    assert reader.next_frame(told) == messages.CheckReady()
    caller.join(WAIT_S)
    assert not caller.is_alive()


def test_a_bls_call_becomes_a_request_with_its_sequence_and_timeout_as_parameters():
    request = _infer_request({
        "model": "m", "version": 2, "id": "r", "correlation_id": 7, "flags": 3,
        "timeout": 500, "parameters": {"p": 1}, "outputs": ["B"],
        "inputs": [["A", "INT32", [1], b"\0\0\0\0"]]}, None)
    assert (request.model_name, request.model_version, request.id) == ("m", "2", "r")
    assert request.parameters == {"p": 1, "sequence_id": 7, "sequence_start": True,
                                  "sequence_end": True, "timeout": 500}
    assert [(t.name, t.datatype, t.shape, t.data) for t in request.inputs] == \
        [("A", "INT32", [1], b"\0\0\0\0")]
    assert [o.name for o in request.outputs] == ["B"]
    latest = _infer_request({"model": "m", "inputs": []}, None)
    assert (latest.model_version, latest.parameters) == ("", {})


# -- large tensors by reference -----------------------------------------------------------

@pytest.fixture
def target_arena(shm_object):
    """(name, the memory as the target instance sees it, identity) of a 1 MiB object standing
    for a target instance's output arena."""
    return shm_object(ARENA)


def by_reference_reply(call_id, region_id, offset, nbytes) -> messages.ServerReply:
    return messages.ServerReply(call_id, True, messages.ResponseFrame(None, [
        messages.TensorRef("OUT", "FP32", [nbytes // 4], InRegion(region_id, offset, nbytes))]))


def test_an_output_by_reference_is_copied_out_by_its_reader_and_released(target_arena):
    name, memory, identity = target_arena
    values = np.arange(1024, dtype=np.float32)
    memory[4096:4096 + values.nbytes] = values.tobytes()
    channel = QueueChannel()
    reader = FrameReader(channel)
    replies = reader.call("infer", {})
    # The map comes first on the socket and the caller, not the busy loop, reads it.
    channel.incoming.put(messages.MapSystemRegion(9, name, 0, ARENA, identity))
    channel.incoming.put(by_reference_reply(1, 9, 4096, values.nbytes))
    (got,) = list(replies)
    copy = got.response.outputs[0].location
    assert type(copy) is bytearray and bytes(copy) == values.tobytes()
    assert channel.sent[-1] == messages.ServerCall(1, "release", {})
    memory[4096:4100] = b"\xff" * 4  # the target's slot is reused: the copy stays
    assert bytes(copy) == values.tobytes()
    channel.incoming.put(messages.Shutdown())
    assert reader.next_frame() == messages.Shutdown()  # the map never reached the loop
    reader.close()


def test_an_output_in_a_region_that_cannot_be_mapped_is_an_error_and_still_released():
    channel = QueueChannel()
    reader = FrameReader(channel)
    replies = reader.call("infer", {})
    channel.incoming.put(by_reference_reply(1, 9, 0, 64))  # region 9 was never mapped
    (got,) = list(replies)
    assert got.response.error[0] == "INTERNAL" and "region 9" in got.response.error[1]
    assert got.response.outputs == []
    assert channel.sent[-1] == messages.ServerCall(1, "release", {})


def test_the_call_arena_holds_inputs_until_the_final_reply(target_arena):
    name, memory, _ = target_arena
    arena = CallArena(Segment.attach(name), threshold=64)
    channel = QueueChannel()
    reader = FrameReader(channel, arena=arena)
    array = np.arange(64, dtype=np.int32).reshape(8, 8)[:, ::2]  # not contiguous
    offset = arena.put(array)
    assert memory[offset:offset + array.nbytes] == np.ascontiguousarray(array).tobytes()
    replies = reader.call("infer", {}, [offset])
    channel.incoming.put(reply(1, final=False))
    next(replies)
    assert arena.put(array) != offset  # still taken while the target may read it
    channel.incoming.put(reply(1))
    list(replies)
    assert arena.put(array) == offset  # freed by the final reply
    assert arena.put(np.zeros(ARENA, np.uint8)) is None  # no room: the caller goes inline
    reader.close()


def test_large_bls_inputs_go_into_the_arena_or_by_reference(target_arena):
    name, memory, _ = target_arena
    arena = CallArena(Segment.attach(name), threshold=1024)
    reader = FrameReader(QueueChannel(), arena=arena)
    big = np.arange(1024, dtype=np.float32)
    request = pb_utils.InferenceRequest(
        model_name="m", requested_output_names=["OUT"],
        inputs=[pb_utils.Tensor("BIG", big), pb_utils.Tensor("SMALL", big[:4])])
    pb_utils._set_server_calls(reader)
    try:
        args, blocks = request._call_args(decoupled=False)
        (offset,) = blocks
        assert args["inputs"][0][3] == InCallArena(offset, big.nbytes)
        assert memory[offset:offset + big.nbytes] == big.tobytes()
        assert bytes(args["inputs"][1][3]) == big[:4].tobytes()
        args, blocks = request._call_args(decoupled=True)
        assert blocks == [] and bytes(args["inputs"][0][3]) == big.tobytes()
        # An input the model was given in a region goes on as where it lies, even decoupled.
        given = pb_utils.Tensor._wrap("GIVEN", big, "FP32", origin=InRegion(5, 256, big.nbytes))
        passing = pb_utils.InferenceRequest(model_name="m", requested_output_names=[],
                                            inputs=[given])
        for decoupled in (False, True):
            args, blocks = passing._call_args(decoupled)
            assert blocks == [] and args["inputs"][0][3] == InRegion(5, 256, big.nbytes)
    finally:
        pb_utils._set_server_calls(None)
        reader.close()


class FakeWorker:
    def __init__(self, region):
        self.alive = True
        self.replies: list = []
        self.mapped: list = []
        self._region = region

    def reply(self, msg) -> bool:
        self.replies.append(msg)
        return True

    def map_region(self, region) -> None:
        self.mapped.append(region)

    def bls_slice(self, location):
        location = locations.checked(location)
        return RegionSlice(self._region, location.offset, location.nbytes)


class FakeDataPlane:
    """Answers every request with one output lying in `arena` at offset 128."""

    def __init__(self, arena):
        self.tracer = SimpleNamespace(in_progress=lambda trace_id: None)
        self.arena = arena
        self.requests: list = []
        self.released = 0

    async def infer(self, request):
        self.requests.append(request)

        def release():
            self.released += 1
        out = OutputTensor("OUT", "FP32", [16], memoryview(bytes(64)),
                           place=RegionSlice(self.arena, 128, 64))
        return InferResponse("m", "1", outputs=[out], release=release)


def test_the_front_lends_outputs_by_reference_until_the_caller_releases_them():
    async def scenario():
        caller_arena = Region("caller's BLS arena", 1 << 20)
        target_arena = Region("target's output arena", 1 << 20)
        dp = FakeDataPlane(target_arena)
        calls = ServerCalls(dp)
        worker = FakeWorker(caller_arena)
        # The input's location as a call's frame carries it: an array.
        args = {"model": "m", "inputs": [["IN", "FP32", [16], list(InCallArena(256, 64))]]}
        for call_id in (1, 2):
            calls(worker, messages.ServerCall(call_id, "infer", args))
        await asyncio.sleep(0.01)
        # The input is read where the caller put it; the output goes back as a reference.
        assert dp.requests[0].inputs[0].data == RegionSlice(caller_arena, 256, 64)
        assert worker.mapped == [target_arena, target_arena]
        assert [r.response.outputs[0].location for r in worker.replies] == \
            [InRegion(target_arena.region_id, 128, 64)] * 2
        assert dp.released == 0  # lent until the caller copied it out
        calls(worker, messages.ServerCall(1, "release", {}))
        assert dp.released == 1
        calls.cancel_all_of(worker)  # the caller died: what it held goes back
        assert dp.released == 2
    asyncio.run(scenario())


def test_a_bls_input_outside_what_the_caller_was_given_is_refused():
    handle = WorkerHandle(model_name="m", model_version=1, model_dir="", model_repository="",
                          model_config={}, instance_name="m_0", instance_kind="CPU",
                          device_id=0)
    for location, where in ((InCallArena(1, 2), "the BLS arena"),
                            (InRegion(7, 0, 4), "a region this instance has mapped (id 7)")):
        with pytest.raises(ValueError, match=re.escape(where)):
            handle.bls_slice(location)

    async def scenario():
        worker = FakeWorker(None)
        worker.bls_slice = handle.bls_slice
        calls = ServerCalls(FakeDataPlane(Region("arena", 64)))
        calls(worker, messages.ServerCall(1, "infer",
                                          {"model": "m", "inputs": [["IN", "FP32", [1],
                                                                      list(InCallArena(1, 2))]]}))
        await asyncio.sleep(0.01)
        (answer,) = worker.replies
        assert answer.response.error[0] == "INVALID_ARG"
        assert "outside the BLS arena" in answer.response.error[1]
    asyncio.run(scenario())


def test_a_fault_of_the_server_answers_the_call_with_an_internal_error(caplog):
    """A bug on the front's side of a call (here a dataplane that raises what it should not)
    still answers the model, which would otherwise wait forever."""
    class BrokenDataPlane(FakeDataPlane):
        async def infer(self, request):
            raise AttributeError("'ResponseStream' object has no attribute '_loop'")

        async def model_ready(self, model, version):
            raise RuntimeError("broken")

    async def scenario():
        worker = FakeWorker(Region("arena", 1 << 20))
        calls = ServerCalls(BrokenDataPlane(Region("target", 1 << 20)))
        infer = {"model": "m", "inputs": [["IN", "FP32", [16], list(InCallArena(256, 64))]]}
        calls(worker, messages.ServerCall(1, "infer", infer))
        calls(worker, messages.ServerCall(2, "ready", {"model": "m"}))
        await asyncio.sleep(0.01)
        answers = {r.call_id: r.response.error for r in worker.replies}
        assert answers[1][0] == "INTERNAL" and "_loop" in answers[1][1]
        assert answers[2] == ["INTERNAL", "ready call failed in the server: RuntimeError('broken')"]
        assert all(r.final for r in worker.replies)
    asyncio.run(scenario())
    assert "the infer call of" in caplog.text
