"""Calls into the server (BLS, model control) from processes a model forks.

A child of the worker (`multiprocessing.Pool` under the default fork start method) inherits
the worker's socket to the front, which the worker's own threads read: a child that used it
would take frames meant for the worker, and the worker the child's replies. Each fork gets a
socketpair instead. The child makes its calls on its end, as the worker does on its socket;
in the worker, a thread per child forwards each call through the worker's FrameReader and
sends the replies back, their outputs copied inline (the child cannot use the worker's
arenas: its copies of their allocators would hand out blocks the worker also hands out).
"""

import os
import socket
import sys
import threading

from shmserve.ipc import messages
from shmserve.ipc.channel import SyncChannel
from workers.regions import ClientRegions
from workers.server_calls import FrameReader

_pending: list = []  # the socketpair of the fork under way (before the fork, to the hooks)


def follow_forks(reader: FrameReader, front_channel, set_reader) -> None:
    """From now on a forked child calls the server through its parent. `reader`: the
    worker's FrameReader; `front_channel`: the worker's SyncChannel to the front, which the
    child closes; `set_reader(reader)`: installs the child's FrameReader for its calls."""

    def before() -> None:
        _pending[:] = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)

    def in_parent() -> None:
        if not _pending:
            return
        mine, theirs = _pending
        _pending.clear()
        theirs.close()
        threading.Thread(target=_serve_child, args=(SyncChannel(mine), reader),
                         name="shmserve-forked-calls", daemon=True).start()

    def in_child() -> None:
        if not _pending:
            return
        theirs, mine = _pending
        _pending.clear()
        theirs.close()
        # The front must see the worker's end when the worker ends, not when its children do.
        front_channel.close()
        # stdin is the worker's log-level pipe, whose reader thread holds its lock in
        # readline(): a child that closes it (multiprocessing's children do) would wait on
        # that lock for ever, since the thread did not come along.
        sys.stdin = open(os.devnull, encoding="utf-8")
        set_reader(FrameReader(SyncChannel(mine), ClientRegions(gpu_inputs=False), None))

    os.register_at_fork(before=before, after_in_parent=in_parent, after_in_child=in_child)


def _serve_child(channel: SyncChannel, reader: FrameReader) -> None:
    """Reads one child's calls until it exits; each call is forwarded on its own thread, so
    that the child's concurrent calls overlap as the worker's do."""
    cancelled: set = set()
    active: dict = {}  # the child's call id -> its CallReplies, while forwarded
    try:
        while (msg := channel.recv()) is not None:
            if type(msg) is not messages.ServerCall:
                continue
            if msg.kind == "cancel":
                cancelled.add(msg.call_id)
            elif msg.kind == "cancel_request":
                replies = active.get(msg.call_id)
                if replies is not None:
                    replies.cancel()
            elif msg.kind != "release":  # replies reach the child inline: nothing to release
                threading.Thread(target=_forward, args=(channel, reader, msg, cancelled, active),
                                 name="shmserve-forked-call", daemon=True).start()
    except OSError:
        pass
    finally:
        channel.close()


def _forward(channel: SyncChannel, reader: FrameReader, call: messages.ServerCall,
             cancelled: set, active: dict) -> None:
    try:
        replies = active[call.call_id] = reader.call(call.kind, call.args)
    except (OSError, ConnectionError) as exc:
        _send(channel, messages.ServerReply(
            call.call_id, True, messages.ResponseFrame(["UNAVAILABLE", str(exc)], [])))
        return
    try:
        for reply in replies:  # closing early (the child left them) cancels the call
            if call.call_id in cancelled:
                break
            reply.call_id = call.call_id
            if not _send(channel, reply) or reply.final:
                break
    except ConnectionError as exc:
        _send(channel, messages.ServerReply(
            call.call_id, True, messages.ResponseFrame(["UNAVAILABLE", str(exc)], [])))
    finally:
        replies.close()
        cancelled.discard(call.call_id)
        active.pop(call.call_id, None)


def _send(channel: SyncChannel, reply: messages.ServerReply) -> bool:
    try:
        channel.send(reply)
        return True
    except OSError:  # the child is gone
        return False
