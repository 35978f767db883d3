"""The request table's waiting sender: the front's consumption or cancellation wakes it through
the eventfd, and a table without one falls back to the timeout."""

import os
import threading
import time

import pytest

from shmserve.ipc import request_table
from shmserve.ipc.request_table import RequestTable
from shmserve.ipc.segments import Segment

ROW = 7
# Far longer than a wake takes: a waiter still asleep after JOIN_S was not woken.
LONG_WAIT_S = 60.0
JOIN_S = 10.0


@pytest.fixture
def tables():
    """(front's table, worker's table) over one segment and one eventfd."""
    segment = Segment.create(f"/shmtest_rows_{os.getpid()}", request_table.SIZE)
    wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
    front = RequestTable(segment, wake_fd)
    worker = RequestTable(Segment.attach(segment.name), wake_fd)
    front.reset(ROW)
    yield front, worker
    worker.close()
    front.close()
    os.close(wake_fd)
    segment.unlink()


def waiter(table: RequestTable, count: int, timeout_s: float = LONG_WAIT_S) -> threading.Thread:
    thread = threading.Thread(target=table.wait_consumed, args=(ROW, count, timeout_s),
                              daemon=True)
    thread.start()
    return thread


def wait_until_waiting(table: RequestTable) -> None:
    deadline = time.monotonic() + JOIN_S
    while not table._rows[ROW, request_table.WAKE_AT]:
        assert time.monotonic() < deadline, "the sender never started waiting"
        time.sleep(0.001)


def test_consumption_reaching_the_count_wakes_the_sender(tables):
    front, worker = tables
    thread = waiter(worker, 2)
    wait_until_waiting(front)
    front.add_consumed(ROW)
    thread.join(0.2)
    assert thread.is_alive()  # one consumed is not enough
    front.add_consumed(ROW)
    thread.join(JOIN_S)
    assert not thread.is_alive()
    assert worker.consumed(ROW) == 2
    assert front._rows[ROW, request_table.WAKE_AT] == 0  # no longer waiting


def test_cancelling_wakes_the_sender(tables):
    front, worker = tables
    thread = waiter(worker, 5)
    wait_until_waiting(front)
    front.cancel(ROW)
    thread.join(JOIN_S)
    assert not thread.is_alive()
    assert worker.cancelled(ROW)


def test_no_wait_when_already_consumed(tables):
    front, worker = tables
    front.add_consumed(ROW)
    thread = waiter(worker, 1)
    thread.join(JOIN_S)
    assert not thread.is_alive()


def test_a_stale_wake_only_makes_the_sender_look_again(tables):
    front, worker = tables
    os.eventfd_write(front.wake_fd, 1)  # left over from an earlier wait
    worker.wait_consumed(ROW, 1, LONG_WAIT_S)  # returns at once, the condition unmet
    thread = waiter(worker, 1)
    wait_until_waiting(front)
    front.add_consumed(ROW)
    thread.join(JOIN_S)
    assert not thread.is_alive()


def test_without_an_eventfd_the_wait_ends_at_the_timeout():
    segment = Segment.create(f"/shmtest_rows_nofd_{os.getpid()}", request_table.SIZE)
    try:
        table = RequestTable(segment)
        table.reset(ROW)
        table.add_consumed(ROW)  # nobody to wake: no error
        table.wait_consumed(ROW, 5, 0.01)
        assert table.consumed(ROW) == 1
        table.close()
    finally:
        segment.unlink()


def test_a_cancel_asked_is_seen_and_keeps_the_responses_going(tables):
    """A BLS caller's cancel(): the model sees is_cancelled(), its responses are still read
    (the sender is not dropped), and a later abandonment overrides it."""
    front, worker = tables
    front.ask_cancel(ROW)
    assert worker.cancelled(ROW) and not worker.abandoned(ROW)
    # A sender waiting for room is not let go by the cancel asked: only by consumption.
    thread = waiter(worker, 1, timeout_s=0.2)
    thread.join(JOIN_S)
    front.cancel(ROW)
    assert worker.cancelled(ROW) and worker.abandoned(ROW)
    front.ask_cancel(ROW)  # never downgrades an abandoned request
    assert worker.abandoned(ROW)
    front.reset(ROW)
    assert not worker.cancelled(ROW)
