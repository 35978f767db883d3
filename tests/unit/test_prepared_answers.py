"""Prepared answers: what the front keeps per connection (shmserve/http/prepared_answers.py)
and what the worker writes with it (workers/answers.py), over real socket pairs."""

import os
import socket

import pytest

from shmserve.http.prepared_answers import AnswerBook
from shmserve.inference import InferResponse, OutputTensor
from shmserve.ipc import messages
from workers.answers import ClientSockets, write_prepared

PREFIX = b"HTTP/1.1 200 OK\r\n...\r\n\r\n{json}"
EXPECTED = [["OUT", "FP32", [1, 2]]]


def _request(answer=(PREFIX, EXPECTED), ready=True) -> messages.RequestFrame:
    return messages.RequestFrame("", 0, 0, {}, [], [], 0, ready=ready,
                                 answer=None if answer is None else [answer[0], answer[1]])


def _frame(name="OUT", datatype="FP32", shape=(1, 2), data=b"12345678", error=None,
           parameters=None) -> messages.ResponseFrame:
    return messages.ResponseFrame(error, [] if error else [
        messages.TensorRef(name, datatype, list(shape), data)], parameters or {})


@pytest.fixture
def client():
    """(the client's end, a descriptor of the server's end as a worker gets it)."""
    theirs, ours = socket.socketpair()
    ours.setblocking(False)  # as the front's sockets are
    yield theirs, os.dup(ours.fileno())
    theirs.close()
    ours.close()


def _read_all(sock: socket.socket) -> bytes:
    sock.settimeout(0.2)
    out = b""
    try:
        while chunk := sock.recv(65536):
            out += chunk
    except TimeoutError:
        pass
    return out


def _closed(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return True
    return False


def test_a_matching_response_is_written_and_its_frame_emptied(client):
    theirs, fd = client
    frames = [_frame(data=memoryview(b"12345678"))]
    write_prepared(frames, [_request()], [fd])
    assert _read_all(theirs) == PREFIX + b"12345678"
    assert frames[0].unsent == b"" and frames[0].outputs == []
    assert _closed(fd)


@pytest.mark.parametrize("frame", [
    _frame(shape=(1, 3)),
    _frame(name="OTHER"),
    _frame(datatype="INT32"),
    _frame(error=["INVALID_ARG", "bad"]),
    _frame(parameters={"p": 1}),
    _frame(data=[messages.OUTPUT_ARENA, 0, 8]),  # not inline: the front reads the arena
], ids=["shape", "name", "datatype", "error", "parameters", "in-arena"])
def test_any_other_response_is_left_to_the_front(client, frame):
    theirs, fd = client
    frames = [frame]
    write_prepared(frames, [_request()], [fd])
    assert frames[0] is frame and frame.unsent is None
    assert _read_all(theirs) == b""
    assert _closed(fd)


def test_extra_or_missing_outputs_are_left_to_the_front(client):
    theirs, fd = client
    frame = _frame()
    frame.outputs.append(messages.TensorRef("MORE", "FP32", [1], b"abcd"))
    write_prepared([frame], [_request()], [fd])
    assert frame.unsent is None and _read_all(theirs) == b""


def test_sockets_pair_with_the_requests_that_have_answers():
    pairs = [socket.socketpair() for _ in range(2)]
    try:
        for _, ours in pairs:
            ours.setblocking(False)
        requests = [_request(), _request(answer=None), _request(ready=False), _request()]
        frames = [_frame(data=b"AAAAAAAA"), _frame(data=b"BBBBBBBB"), _frame(),
                  _frame(data=b"DDDDDDDD")]
        # The null request (ready False) still holds a socket of the batch, unused.
        spare_theirs, spare_ours = socket.socketpair()
        fds = [os.dup(pairs[0][1].fileno()), os.dup(spare_ours.fileno()),
               os.dup(pairs[1][1].fileno())]
        write_prepared(frames, requests, fds)
        assert _read_all(pairs[0][0]) == PREFIX + b"AAAAAAAA"
        assert _read_all(spare_theirs) == b""
        assert _read_all(pairs[1][0]) == PREFIX + b"DDDDDDDD"
        assert frames[1].unsent is None and frames[2].unsent is None
        assert all(_closed(fd) for fd in fds)
        spare_theirs.close()
        spare_ours.close()
    finally:
        for a, b in pairs:
            a.close()
            b.close()


def test_what_a_full_socket_does_not_take_goes_back_to_the_front(client):
    theirs, fd = client
    theirs.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    filler = socket.socket(fileno=os.dup(fd))
    try:
        while True:  # fill the socket until it takes nothing more
            filler.send(b"x" * 4096)
    except BlockingIOError:
        pass
    finally:
        filler.close()
    frames = [_frame(data=b"12345678")]
    write_prepared(frames, [_request()], [fd])
    assert frames[0].unsent == PREFIX + b"12345678"


def test_a_client_gone_is_not_an_error(client):
    theirs, fd = client
    theirs.close()
    frames = [_frame(data=b"12345678")]
    write_prepared(frames, [_request()], [fd])
    assert frames[0].unsent == b""  # nothing for the front to write to a closed connection


def test_client_sockets_arrive_per_batch_and_stale_ones_are_dropped():
    lender, lent = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    a, b = socket.socketpair()
    received = ClientSockets(os.dup(lent.fileno()))
    try:
        assert received.take(1, 1) == []  # none sent: the front answers
        socket.send_fds(lender, [(1).to_bytes(8, "little")], [a.fileno()])  # never taken
        socket.send_fds(lender, [(2).to_bytes(8, "little")], [a.fileno(), b.fileno()])
        fds = received.take(2, 2)
        assert len(fds) == 2
        os.write(fds[1], b"hello")
        assert a.recv(5) == b"hello"
        for fd in fds:
            os.close(fd)
        socket.send_fds(lender, [(4).to_bytes(8, "little")], [a.fileno()])
        assert received.take(3, 1) == []  # a later batch's: not this one's
        assert received.take(4, 1) == []  # and it was dropped
    finally:
        received.close()
        for s in (lender, lent, a, b):
            s.close()


def _response(outputs, parameters=None):
    return InferResponse("m", "1", "", parameters or {}, outputs)


def test_the_book_keeps_binary_answers_and_forgets_others():
    book = AnswerBook()
    out = OutputTensor("OUT", "FP32", [1, 2], b"12345678")
    key = ("/v2/models/m/infer", b"{}")
    assert book.lookup(key, None) is None
    book.learn(key, b"HEAD", [b"{json}", b"12345678"], _response([out]))
    answer = book.lookup(key, None)
    assert answer.frame == [b"HEAD{json}", [["OUT", "FP32", [1, 2]]]]
    assert answer.model_version == "1"
    assert book.lookup(("/v2/models/m/infer", b"{other}"), None) is None
    # An output in the JSON header (not binary) cannot be prepared: forgotten.
    book.learn(key, b"HEAD", [b"{json}"], _response([out]))
    assert book.lookup(key, None) is None
    for response in (_response([out], {"p": 1}),
                     _response([OutputTensor("S", "BYTES", [1], b"\0\0\0\0")]),
                     _response([OutputTensor("OUT", "FP32", [1], b"1234", {"q": 1})])):
        book.learn(key, b"HEAD", [b"{json}", b"1234"], response)
        assert book.lookup(key, None) is None
