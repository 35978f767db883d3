"""Prepared answers: what the front keeps per connection (shmserve/fastpath/connection_loans.py,
its HTTP layout from shmserve/http/codec.py) and what the worker writes with it
(workers/prepared_answers.py), over real socket pairs."""

import os
import socket

from unittest import mock

import numpy as np
import pytest

from shmserve.fastpath.connection_loans import ConnectionLoans
from shmserve.fastpath.prepared_answers import AnswerLayout
from shmserve.http.codec import prepared_answer
from shmserve.inference import InferResponse, OutputTensor
from shmserve.ipc import messages
from shmserve.ipc.locations import InRegion
from workers.prepared_answers import LentSockets, take_answers, write_answers
from workers.backends.batch import Output, Response

PREFIX = b"HTTP/1.1 200 OK\r\n...\r\n\r\n{json}"
EXPECTED = [["OUT", "FP32", [1, 2], 8]]
INLINE = 4096


def _request(socket_index=0, pieces=(PREFIX, b""), expected=EXPECTED,
             ready=True) -> messages.RequestFrame:
    answer = None if socket_index is None else [socket_index, list(pieces), expected]
    return messages.RequestFrame("", 0, 0, {}, [], [], 0, ready=ready,
                                 prepared_answer=answer)


def _output(name="OUT", datatype="FP32", shape=(1, 2), data=b"12345678") -> Output:
    return Output(name, datatype, list(shape), np.frombuffer(data, np.uint8).view(
        np.float32 if datatype == "FP32" else np.int32).reshape(shape))


def _model_response(error=None, parameters=None, **output) -> Response:
    """The model's response, as the worker has it before it makes frames of it."""
    return Response([] if error else [_output(**output)], error, parameters or {})


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


def _taken(answers: list) -> list:
    """The indices of the requests whose answers take_answers took, in the batch's order."""
    return sorted(i for _, taken in answers for i, _ in taken)


def _take_and_write(responses, requests, fds, backed_up=None, taken=None) -> list:
    """What the worker does with a batch: take the answers it writes (the Result says so),
    then write them; returns what the sockets did not take. `taken`: a list that gets the
    indices of the requests taken."""
    backed_up = set() if backed_up is None else backed_up
    answers = take_answers(responses, requests, fds, backed_up, INLINE)
    if taken is not None:
        taken.extend(_taken(answers))
    return write_answers(answers, backed_up)


def test_a_matching_response_is_taken_and_written(client):
    theirs, fd = client
    taken = []
    assert _take_and_write([_model_response()], [_request()], [fd], taken=taken) == []
    assert _read_all(theirs) == PREFIX + b"12345678"
    assert taken == [0]


class _OnDevice:
    """Stands for a GPU array (a cupy array): the worker places it the usual way."""

    def __init__(self, array):
        self.nbytes = array.nbytes


@pytest.mark.parametrize("response", [
    _model_response(shape=(1, 3), data=b"123456789abc"),
    _model_response(name="OTHER"),
    _model_response(datatype="INT32"),
    _model_response(error=("INVALID_ARG", "bad")),
    _model_response(parameters={"p": 1}),
    _model_response(data=b"1234", shape=(1, 1)),  # not the size announced
    Response([Output("OUT", "FP32", [1, 2], _OnDevice(np.zeros((1, 2), np.float32)))],
                   None, {}),
], ids=["shape", "name", "datatype", "error", "parameters", "size", "on-a-gpu"])
def test_any_other_response_is_left_to_the_front(client, response):
    theirs, fd = client
    assert take_answers([response], [_request()], [fd], set(), INLINE) == []
    assert _read_all(theirs) == b""


def test_an_output_too_large_to_travel_inline_is_left_to_the_front(client):
    theirs, fd = client
    # The front would read it from the output arena, where the worker places it.
    assert take_answers([_model_response()], [_request()], [fd], set(), 4) == []
    assert _read_all(theirs) == b""


def test_a_request_with_output_regions_is_left_to_the_front(client):
    theirs, fd = client
    request = _request()
    request.output_regions = {"OUT": InRegion(1, 0, 8)}
    assert take_answers([_model_response()], [request], [fd], set(), INLINE) == []
    assert _read_all(theirs) == b""


def test_extra_or_missing_outputs_are_left_to_the_front(client):
    theirs, fd = client
    response = _model_response()
    response.outputs.append(_output("MORE", shape=(1, 1), data=b"abcd"))
    assert take_answers([response], [_request()], [fd], set(), INLINE) == []
    assert take_answers([_model_response()], [_request(expected=EXPECTED * 2)], [fd], set(),
                        INLINE) == []
    assert _read_all(theirs) == b""


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
        responses = [_model_response(data=data)
                     for data in (b"AAAAAAAA", b"BBBBBBBB", b"12345678", b"CCCCCCCC", b"DDDDDDDD")]
        fds = [ours.fileno() for _, ours in pairs]
        taken = []
        with mock.patch("workers.prepared_answers.os.write", wraps=os.write) as write:
            assert _take_and_write(responses, requests, fds, taken=taken) == []
        assert write.call_count == 2
        assert _read_all(pairs[0][0]) == b"<aAAAAAAAAa><dDDDDDDDDd>"
        assert _read_all(pairs[1][0]) == PREFIX + b"CCCCCCCC"
        assert taken == [0, 3, 4]
    finally:
        for a, b in pairs:
            a.close()
            b.close()


def test_outputs_go_between_the_pieces(client):
    theirs, fd = client
    expected = [["A", "INT32", [1], 4], ["B", "FP32", [2], 8]]
    response = Response([_output("A", "INT32", (1,), b"aaaa"),
                            _output("B", "FP32", (2,), b"bbbbbbbb")], None, {})
    _take_and_write([response], [_request(0, (b"1", b"2", b"3"), expected)], [fd])
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
    responses = [_model_response(data=b"12345678")]
    assert _take_and_write(responses, [_request()], [fd]) == [[0, PREFIX + b"12345678"]]


def test_a_socket_that_takes_part_of_its_answers_returns_the_rest_of_each(client):
    theirs, fd = client
    responses = [_model_response(data=data) for data in (b"AAAAAAAA", b"BBBBBBBB", b"CCCCCCCC")]
    requests = [_request(0, (b"<", b">")) for _ in responses]
    backed_up = set()
    with mock.patch("workers.prepared_answers.os.write", side_effect=lambda fd, data: 5):
        unsent = _take_and_write(responses, requests, [fd], backed_up)
    assert unsent == [[0, b"AAAA>"], [1, b"<BBBBBBBB>"], [2, b"<CCCCCCCC>"]]
    # The front writes the rest: a later batch that has the socket leaves it to the front.
    assert backed_up == {os.fstat(fd).st_ino}
    assert take_answers([_model_response(data=b"DDDDDDDD")], [_request()], [fd], backed_up,
                        INLINE) == []


def test_a_client_gone_is_not_an_error(client):
    theirs, fd = client
    theirs.close()
    responses = [_model_response(data=b"12345678")]
    # Nothing for the front to write to a closed connection: it learns of it itself.
    assert _take_and_write(responses, [_request()], [fd]) == []


def test_client_sockets_arrive_per_batch_and_stale_ones_are_dropped():
    lender, lent = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    a, b = socket.socketpair()
    received = LentSockets(os.dup(lent.fileno()))
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


class _Hooks:
    """A connection's side of its loans (fastpath/connection_loans.LoanHooks), which frames
    each answer as `framing` says and records what it was asked."""

    def __init__(self, framing=(b"", b"")):
        self.framing = framing
        self.log = []

    def lend_stream(self, stream, size, first):
        self.log.append(("lend", stream, size, first))
        return self.framing

    def stream_returned(self, stream, written):
        self.log.append(("returned", stream, written))

    def write_now(self, data):
        self.log.append(("write", data))

    def loans_over(self):
        self.log.append(("over",))

    def loan_lost(self, last):
        self.log.append(("lost", last))


def _learn(loans, key, head, chunks, response):
    """What the HTTP infer route keeps of an answer it wrote."""
    loans.learn(key, response.model_version, prepared_answer(head, chunks, response))


def test_the_connection_keeps_binary_answers_and_forgets_others():
    loans = ConnectionLoans(_Hooks())
    loans.fd = 7
    out = OutputTensor("OUT", "FP32", [1, 2], b"12345678")
    key = ("/v2/models/m/infer", b"{}")
    assert loans.prepared(key, None) is None
    _learn(loans, key, b"HEAD", [b"{json}", b"12345678"], _response([out]))
    answer = loans.prepared(key, None)
    assert answer.model_version == "1"
    assert answer.lend("w") == 7
    assert answer.frame == [[b"HEAD{json}", b""], [["OUT", "FP32", [1, 2], 8]]]
    assert loans.prepared(("/v2/models/m/infer", b"{other}"), None) is None
    # An output in the JSON header (not binary) cannot be prepared: forgotten.
    _learn(loans, key, b"HEAD", [b"{json}"], _response([out]))
    assert loans.prepared(key, None) is None
    for response in (_response([out], {"p": 1}),
                     _response([OutputTensor("S", "BYTES", [1], b"\0\0\0\0")]),
                     _response([OutputTensor("OUT", "FP32", [1], b"1234", {"q": 1})])):
        _learn(loans, key, b"HEAD", [b"{json}", b"1234"], response)
        assert loans.prepared(key, None) is None


def test_a_connection_is_lent_to_one_worker_at_a_time_and_framed_per_stream():
    hooks = _Hooks((b"<", b">"))
    loans = ConnectionLoans(hooks)
    loans.learn("key", "1", AnswerLayout([b"a", b"b"], 10, [["OUT", "FP32", [2], 8]]))
    assert loans.prepared("key", 1).lend("w") == -1  # no socket to lend (TLS, say)
    loans.fd = 7
    first, second, other = (loans.prepared("key", sid) for sid in (1, 3, 5))
    assert first.lend("w") == 7 and first.frame == [[b"<a", b"b>"], [["OUT", "FP32", [2], 8]]]
    assert second.lend("w") == 7  # the same worker's next batch: in turn
    assert other.lend("v") == -1  # another worker could write at the same time
    first.returned(None)
    second.returned(b"")
    assert hooks.log == [("lend", 1, 10, True), ("lend", 3, 10, False), ("returned", 1, False),
                         ("returned", 3, True), ("over",)]
    assert other.lend("v") == 7  # the loans are over: any worker may have it


def test_a_socket_that_took_part_of_an_answer_is_never_lent_again():
    hooks = _Hooks()
    loans = ConnectionLoans(hooks)
    loans.fd = 7
    loans.learn("key", "1", AnswerLayout([b"a", b""], 9, []))
    answer = loans.prepared("key", None)
    answer.lend("w")
    answer.returned(b"rest")
    assert hooks.log[-2:] == [("write", b"rest"), ("over",)]
    assert not loans.lendable and loans.prepared("key", None).lend("w") == -1


def test_a_worker_that_dies_while_it_writes_loses_the_connection():
    hooks = _Hooks()
    loans = ConnectionLoans(hooks)
    loans.fd = 7
    loans.learn("key", "1", AnswerLayout([b"a", b""], 9, []))
    loans.prepared("key", 1).lend("w")
    loans.prepared("key", 3).lend("w")
    loans.prepared("key", 1).lost()
    loans.prepared("key", 3).lost()
    assert hooks.log[-2:] == [("lost", False), ("lost", True)]
    assert loans.lent == 0 and loans.holder is None
