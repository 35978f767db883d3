"""Prepared answers: what the front keeps per connection (shmserve/http/prepared_answers.py)
and what the worker writes with it (workers/answers.py), over real socket pairs."""

import os
import socket

from unittest import mock

import pytest

from shmserve.http.prepared_answers import AnswerBook
from shmserve.inference import InferResponse, OutputTensor
from shmserve.ipc import messages
from workers.answers import ClientSockets, take_answers, write_answers

PREFIX = b"HTTP/1.1 200 OK\r\n...\r\n\r\n{json}"
EXPECTED = [["OUT", "FP32", [1, 2], 8]]


def _request(socket_index=0, pieces=(PREFIX, b""), expected=EXPECTED,
             ready=True) -> messages.RequestFrame:
    answer = None if socket_index is None else [socket_index, list(pieces), expected]
    return messages.RequestFrame("", 0, 0, {}, [], [], 0, ready=ready, answer=answer)


def _frame(name="OUT", datatype="FP32", shape=(1, 2), data=b"12345678", error=None,
           parameters=None) -> messages.ResponseFrame:
    return messages.ResponseFrame(error, [] if error else [
        messages.TensorRef(name, datatype, list(shape), data)], parameters or {})


@pytest.fixture
def client():
    """(the client's end, a descriptor of the server's end as a worker gets it)."""
    theirs, ours = socket.socketpair()
    ours.setblocking(False)  # as the front's sockets are
    fd = os.dup(ours.fileno())
    yield theirs, fd
    os.close(fd)
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


def _take_and_write(frames, requests, fds, backed_up=None) -> list:
    """What the worker does with a batch: mark the answers it writes (before the Result),
    then write them; returns what the sockets did not take."""
    backed_up = set() if backed_up is None else backed_up
    return write_answers(take_answers(frames, requests, fds, backed_up), backed_up)


def test_a_matching_response_is_written_and_its_frame_says_so(client):
    theirs, fd = client
    frames = [_frame(data=memoryview(b"12345678"))]
    assert _take_and_write(frames, [_request()], [fd]) == []
    assert _read_all(theirs) == PREFIX + b"12345678"
    assert frames[0].by_worker and frames[0].outputs == []


@pytest.mark.parametrize("frame", [
    _frame(shape=(1, 3)),
    _frame(name="OTHER"),
    _frame(datatype="INT32"),
    _frame(error=["INVALID_ARG", "bad"]),
    _frame(parameters={"p": 1}),
    _frame(data=[messages.OUTPUT_ARENA, 0, 8]),  # not inline: the front reads the arena
    _frame(data=b"1234"),  # not the size announced
], ids=["shape", "name", "datatype", "error", "parameters", "in-arena", "size"])
def test_any_other_response_is_left_to_the_front(client, frame):
    theirs, fd = client
    frames = [frame]
    assert take_answers(frames, [_request()], [fd], set()) == []
    assert frames[0] is frame and not frame.by_worker
    assert _read_all(theirs) == b""


def test_extra_or_missing_outputs_are_left_to_the_front(client):
    theirs, fd = client
    frame = _frame()
    frame.outputs.append(messages.TensorRef("MORE", "FP32", [1], b"abcd"))
    assert take_answers([frame], [_request()], [fd], set()) == []
    assert not frame.by_worker and _read_all(theirs) == b""


def test_answers_name_their_sockets_and_a_socket_takes_its_answers_in_one_write():
    pairs = [socket.socketpair() for _ in range(2)]
    try:
        for _, ours in pairs:
            ours.setblocking(False)
        # Two answers on socket 0 (two calls of one HTTP/2 connection), with pieces after
        # the output too; none for the second request; the null request (ready False)
        # names socket 1 but is not answered; socket 1 gets the fourth.
        requests = [_request(0, (b"<a", b"a>")), _request(None), _request(1, ready=False),
                    _request(1), _request(0, (b"<d", b"d>"))]
        frames = [_frame(data=b"AAAAAAAA"), _frame(data=b"BBBBBBBB"), _frame(),
                  _frame(data=b"CCCCCCCC"), _frame(data=b"DDDDDDDD")]
        fds = [ours.fileno() for _, ours in pairs]
        with mock.patch("workers.answers.os.write", wraps=os.write) as write:
            assert _take_and_write(frames, requests, fds) == []
        assert write.call_count == 2
        assert _read_all(pairs[0][0]) == b"<aAAAAAAAAa><dDDDDDDDDd>"
        assert _read_all(pairs[1][0]) == PREFIX + b"CCCCCCCC"
        assert [f.by_worker for f in frames] == [True, False, False, True, True]
    finally:
        for a, b in pairs:
            a.close()
            b.close()


def test_outputs_go_between_the_pieces(client):
    theirs, fd = client
    expected = [["A", "INT32", [1], 4], ["B", "FP32", [2], 8]]
    frame = messages.ResponseFrame(None, [messages.TensorRef("A", "INT32", [1], b"aaaa"),
                                          messages.TensorRef("B", "FP32", [2], b"bbbbbbbb")])
    _take_and_write([frame], [_request(0, (b"1", b"2", b"3"), expected)], [fd])
    assert _read_all(theirs) == b"1aaaa2bbbbbbbb3"


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
    assert _take_and_write(frames, [_request()], [fd]) == [[0, PREFIX + b"12345678"]]


def test_a_socket_that_takes_part_of_its_answers_returns_the_rest_of_each(client):
    theirs, fd = client
    frames = [_frame(data=b"AAAAAAAA"), _frame(data=b"BBBBBBBB"), _frame(data=b"CCCCCCCC")]
    requests = [_request(0, (b"<", b">")) for _ in frames]
    backed_up = set()
    with mock.patch("workers.answers.os.write", side_effect=lambda fd, data: 5):
        unsent = _take_and_write(frames, requests, [fd], backed_up)
    assert unsent == [[0, b"AAAA>"], [1, b"<BBBBBBBB>"], [2, b"<CCCCCCCC>"]]
    # The front writes the rest: a later batch that has the socket leaves it to the front.
    assert backed_up == {os.fstat(fd).st_ino}
    frames = [_frame(data=b"DDDDDDDD")]
    assert take_answers(frames, [_request()], [fd], backed_up) == []
    assert not frames[0].by_worker


def test_a_client_gone_is_not_an_error(client):
    theirs, fd = client
    theirs.close()
    frames = [_frame(data=b"12345678")]
    # Nothing for the front to write to a closed connection: it learns of it itself.
    assert _take_and_write(frames, [_request()], [fd]) == []


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
    assert answer.frame == [[b"HEAD{json}", b""], [["OUT", "FP32", [1, 2], 8]]]
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
