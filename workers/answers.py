"""Prepared answers: the worker writes a request's whole answer to its client's socket.

The front's event loop is one thread, and writing each answer is its largest single cost; the
worker, which has the outputs in hand when its batch ends, is mostly idle. So for a request
whose answer the front could predict up to the outputs' bytes (see shmserve/http/
prepared_answers.py), the front lends the worker the client's socket for the batch, and the
worker writes the prepared bytes and the outputs. Anything unexpected in the response (an
error, parameters, other outputs or shapes, an output not inline) leaves the answer to the
front, as for any other request. The protocol is in shmserve/ipc/messages.py.
"""

import array
import logging
import os
import socket

from shmserve.ipc import messages

log = logging.getLogger("shmserve.worker")

_ANCILLARY_SPACE = socket.CMSG_SPACE(messages.MAX_LENT_SOCKETS * array.array("i").itemsize)


class ClientSockets:
    """The end of the socket the front lends clients' sockets on, one packet per batch."""

    def __init__(self, fd: int):
        self._sock = socket.socket(fileno=fd)

    def take(self, batch_id: int, count: int) -> list:
        """The `count` sockets (descriptors) lent for batch `batch_id`, or [] when they did
        not come (the front sends them before the batch, so they are waiting if sent)."""
        while True:
            try:
                # Not socket.recv_fds: it drops its flags argument (CPython 3.11).
                data, ancillary, _, _ = self._sock.recvmsg(
                    8, _ANCILLARY_SPACE, socket.MSG_DONTWAIT | socket.MSG_CMSG_CLOEXEC)
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


def write_prepared(frames: list, requests: list, fds: list) -> None:
    """Write the prepared answers of the batch's `requests` (messages.RequestFrame) whose
    response frame matches, to the sockets `fds` (one per request with an answer, in order),
    replacing those frames by answered ones; then close the sockets."""
    try:
        sockets = iter(fds)
        for i, request in enumerate(requests):
            if request.answer is None:
                continue
            fd = next(sockets)
            answer = _answer_bytes(request.answer, frames[i]) if request.ready else None
            if answer is not None:
                frames[i] = messages.ResponseFrame(None, [], unsent=_write(fd, answer))
    finally:
        for fd in fds:
            os.close(fd)


def _answer_bytes(answer: list, frame: messages.ResponseFrame):
    """The answer's prefix and outputs as one bytes object, or None when the frame is not
    the response the prefix announces."""
    prefix, expected = answer
    outputs = frame.outputs
    if frame.error is not None or frame.parameters or len(outputs) != len(expected):
        return None
    pieces = [prefix]
    for out, (name, datatype, shape) in zip(outputs, expected):
        location = out.location
        if out.name != name or out.datatype != datatype or list(out.shape) != shape \
                or not isinstance(location, (bytes, memoryview)):
            return None
        pieces.append(location)
    return b"".join(pieces)


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
