"""The worker's FrameReader (one reader of the socket shared by the frame loop and threads
waiting for replies to their calls into the server) and the front's translation of a BLS
call into a request."""

import queue
import threading

import pytest

from shmserve.ipc import messages
from shmserve.server_calls import _infer_request
from workers.server_calls import FrameReader

WAIT_S = 5.0


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


def test_a_bls_call_becomes_a_request_with_its_sequence_and_timeout_as_parameters():
    request = _infer_request({
        "model": "m", "version": 2, "id": "r", "correlation_id": 7, "flags": 3,
        "timeout": 500, "parameters": {"p": 1}, "outputs": ["B"],
        "inputs": [["A", "INT32", [1], b"\0\0\0\0"]]})
    assert (request.model_name, request.model_version, request.id) == ("m", "2", "r")
    assert request.parameters == {"p": 1, "sequence_id": 7, "sequence_start": True,
                                  "sequence_end": True, "timeout": 500}
    assert [(t.name, t.datatype, t.shape, t.data) for t in request.inputs] == \
        [("A", "INT32", [1], b"\0\0\0\0")]
    assert [o.name for o in request.outputs] == ["B"]
    latest = _infer_request({"model": "m", "inputs": []})
    assert (latest.model_version, latest.parameters) == ("", {})
