"""--front-nice (shmserve/ipc/priority.py): the front's thread moves, the workers go back."""

import logging
import os

from shmserve.ipc import priority


def test_the_front_moves_and_tells_the_workers_where_it_started(monkeypatch):
    calls = []
    monkeypatch.setattr(os, "getpriority", lambda which, who: 3)
    monkeypatch.setattr(os, "setpriority", lambda which, who, value: calls.append(value))
    monkeypatch.delenv(priority.WORKER_NICE_ENV, raising=False)
    priority.set_front_nice(-7)
    assert calls == [-7] and os.environ[priority.WORKER_NICE_ENV] == "3"
    priority.restore_worker_nice()
    assert calls == [-7, 3]


def test_without_the_privilege_the_front_says_so_and_stays(monkeypatch, caplog):
    def refuse(which, who, value):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "getpriority", lambda which, who: 0)
    monkeypatch.setattr(os, "setpriority", refuse)
    monkeypatch.delenv(priority.WORKER_NICE_ENV, raising=False)
    with caplog.at_level(logging.WARNING, logger="shmserve"):
        priority.set_front_nice(-10)
    assert "--front-nice -10 is not permitted (it needs CAP_SYS_NICE)" in caplog.text
    assert priority.WORKER_NICE_ENV not in os.environ
    priority.restore_worker_nice()  # nothing to go back to: no call, no error


def test_a_worker_that_may_not_go_back_runs_on(monkeypatch):
    def refuse(which, who, value):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "setpriority", refuse)
    monkeypatch.setenv(priority.WORKER_NICE_ENV, "-5")
    priority.restore_worker_nice()  # raises nothing: the worker serves at the front's value
