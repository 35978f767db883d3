"""Prepared answers: the worker writes a request's whole answer to its client's socket.

The front's event loop is one thread, and writing each answer is its largest single cost; the
worker, which has the outputs in hand when its batch ends, is mostly idle. So for a request
whose answer the front could predict up to the outputs' bytes (see shmserve/fastpath/
prepared_answers.py), the front lends the worker the client's socket for the batch, and the
worker writes the prepared bytes and the outputs. Anything unexpected in the response (an
error, parameters, other outputs or shapes, an output not inline) leaves the answer to the
front, as for any other request. The protocol is in shmserve/ipc/messages.py.
"""

import array
import logging
import os
import socket

import numpy as np

from shmserve.ipc import messages

log = logging.getLogger("shmserve.worker")

_ANCILLARY_SPACE = socket.CMSG_SPACE(messages.MAX_LENT_SOCKETS * array.array("i").itemsize)
# Or'ed once: or-ing socket's flag enums costs a microsecond each time.
_RECV_FLAGS = int(socket.MSG_DONTWAIT | socket.MSG_CMSG_CLOEXEC)


class LentSockets:
    """The end of the socket the front lends clients' sockets on, one packet per batch."""

    def __init__(self, fd: int):
        self._sock = socket.socket(fileno=fd)
        # The sockets (inode numbers) that took only part of their answers: the front writes
        # the rest, and this side never writes to them again (see write_answers).
        self.backed_up = set()

    def take(self, batch_id: int, count: int) -> list:
        """The `count` sockets (descriptors) lent for batch `batch_id`, or [] when they did
        not come (the front sends them before the batch, so they are waiting if sent)."""
        while True:
            try:
                # Not socket.recv_fds: it drops its flags argument (CPython 3.11).
                data, ancillary, _, _ = self._sock.recvmsg(
                    8, _ANCILLARY_SPACE, _RECV_FLAGS)
            except BlockingIOError:
                return []
            fds = _descriptors(ancillary)
            sent_for = int.from_bytes(data, "little") if len(data) == 8 else -1
            if sent_for == batch_id and len(fds) == count:
                return fds
            # Not whole, or an older batch's that never came to take it: dropped.
            for fd in fds:
                os.close(fd)
            if sent_for >= batch_id or sent_for < 0:
                return []

    def close(self) -> None:
        self._sock.close()


def _descriptors(ancillary: list) -> list:
    fds = array.array("i")
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
    return list(fds)


# Inodes of backed-up sockets remembered at most: the front lends no more to a connection once
# it has heard of one (only the batches lent before then matter), and inodes are reused.
MAX_BACKED_UP = 1024


def take_answers(responses: list, requests: list, fds: list, backed_up: set,
                 inline_threshold: int) -> list:
    """The prepared answers of the batch's `requests` (messages.RequestFrame) whose response
    (batch.Response, in the same order) matches, for write_answers: [(socket, [(request
    index, answer bytes)])], the sockets being `fds` (the batch's distinct sockets, which each
    answer names by index). The Result says these requests are `written_by_worker`. A socket
    in `backed_up` is left to the front: it still has the rest of an earlier answer to write.
    Outputs larger than `inline_threshold` are left to the front, as are their answers."""
    by_socket = {}  # socket index -> [(request index, answer bytes)]
    for i, (request, response) in enumerate(zip(requests, responses)):
        answer = request.prepared_answer
        if answer is None or not request.ready or request.output_regions:
            continue
        data = _answer_bytes(answer, response, inline_threshold)
        if data is not None:
            by_socket.setdefault(answer[0], []).append((i, data))
    taken = []
    for index, answers in by_socket.items():
        fd = fds[index]
        if backed_up and os.fstat(fd).st_ino in backed_up:
            continue
        taken.append((fd, answers))
    return taken


def write_answers(taken: list, backed_up: set) -> list:
    """Write take_answers' answers, a socket's in one write, in request order. Returns what
    the sockets did not take, as [request index, bytes]: the rest of the answer a socket took
    part of, and the whole of those after it. Such a socket joins `backed_up`: the front
    writes the rest, and later batches, which it may have lent the socket before it heard,
    leave the socket to the front."""
    unsent = []
    for fd, answers in taken:
        data = answers[0][1] if len(answers) == 1 else b"".join(d for _, d in answers)
        left = _write(fd, data)
        if not left:
            continue
        if len(backed_up) >= MAX_BACKED_UP:
            backed_up.clear()
        backed_up.add(os.fstat(fd).st_ino)
        written = len(data) - len(left)
        for i, answer in answers:
            if written < len(answer):
                unsent.append([i, answer[written:]])
            written = max(0, written - len(answer))
    return unsent


def _answer_bytes(answer: list, response, inline_threshold: int):
    """The answer's bytes (its pieces with the outputs' bytes between them), or None when the
    response is not the one the pieces announce. Built from the model's arrays: their frames,
    which the Result does not carry, are never made."""
    _, pieces, expected = answer
    outputs = response.outputs
    if response.error is not None or response.parameters or len(outputs) != len(expected):
        return None
    joined = [pieces[0]]
    for out, (name, datatype, shape, nbytes), piece in zip(outputs, expected, pieces[1:]):
        array = out.array
        # The fronts prepare no answer with BYTES outputs, whose sizes vary; an array of
        # another kind (on a GPU) goes the usual way.
        if type(array) is not np.ndarray or out.name != name or out.datatype != datatype \
                or out.shape != shape or array.nbytes != nbytes or nbytes > inline_threshold \
                or datatype == "BYTES":
            return None
        joined.append(array)  # join reads a C-contiguous array's buffer as its bytes
        joined.append(piece)
    return b"".join(joined)


def _write(fd: int, answer: bytes) -> bytes:
    """What of `answer` the socket did not take. The socket is non-blocking (it is the
    front's): a client that does not read gets the rest from the front, in order."""
    try:
        written = os.write(fd, answer)
    except BlockingIOError:
        written = 0
    except OSError as exc:
        # The client went away: the front learns it from its own end and drops the answer.
        log.debug("a prepared answer was not written: %s", exc)
        written = len(answer)
    return answer[written:]
