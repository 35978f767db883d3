"""The server log: line formats, level switches, runtime settings, worker output relaying."""

import asyncio
import json
import logging
import os
import sys

import pytest

from shmserve.errors import Code, ServerError
from shmserve.observability import logs

CREATED = 1700000000.123456  # 2023-11-14 22:13:20.123456 UTC


@pytest.fixture(autouse=True)
def fresh_settings(monkeypatch):
    monkeypatch.setattr(logs, "SETTINGS", logs.LogSettings())
    monkeypatch.setattr(logs, "_verbose_watchers", [])
    monkeypatch.setattr(logs, "_handler", None)


def _record(level=logging.INFO, message="hello %s", args=("world",), **extra):
    record = logging.LogRecord("shmserve.test", level, "/x/worker.py", 42, message, args, None)
    record.created = CREATED
    record.process = 1234
    record.__dict__.update(extra)
    return record


def _format(record, fmt):
    logs.SETTINGS.log_format = fmt
    return logs.ServerFormatter().format(record)


def test_default_format_is_tritons():
    assert _format(_record(), "default") == "I1114 22:13:20.123456 1234 worker.py:42] hello world"
    assert _format(_record(logging.WARNING), "default").startswith("W1114 22:13:20.123456 ")
    assert _format(_record(logging.ERROR), "default").startswith("E1114 ")
    assert _format(_record(logging.CRITICAL), "default").startswith("E1114 ")
    # Triton prints verbose lines with the INFO letter.
    assert _format(_record(logging.DEBUG), "default").startswith("I1114 ")


def test_iso8601_format_is_tritons():
    assert (_format(_record(logging.WARNING), "ISO8601")
            == "2023-11-14T22:13:20Z W 1234 worker.py:42] hello world")


def test_context_fields_in_text_formats():
    record = _record(**logs.context(model="m", version=1, instance="m_0_0", request_id="r7"))
    assert _format(record, "default").endswith(
        "worker.py:42] [model=m version=1 instance=m_0_0 request_id=r7] hello world")
    assert logs.context(model="m", request_id="") == {"model": "m"}


def test_json_format():
    record = _record(logging.DEBUG, **logs.context(model="m", version=2, instance="m_0_1",
                                                   request_id="r7"))
    line = _format(record, "json")
    assert "\n" not in line
    assert json.loads(line) == {
        "time": "2023-11-14T22:13:20.123456Z", "level": "VERBOSE", "logger": "shmserve.test",
        "pid": 1234, "source": "worker.py:42", "message": "hello world", "model": "m",
        "version": 2, "instance": "m_0_1", "request_id": "r7"}
    assert "model" not in json.loads(_format(_record(), "json"))


def test_traceback_stays_in_the_record():
    try:
        raise ValueError("boom")
    except ValueError:
        record = _record(logging.ERROR)
        record.exc_info = sys.exc_info()
    entry = json.loads(_format(record, "json"))
    assert entry["message"].startswith("hello world\nTraceback")
    assert "ValueError: boom" in entry["message"]


def test_levels_switch_one_by_one():
    s = logs.LogSettings(log_info=False)
    assert [s.enabled(n) for n in (10, 20, 30, 40)] == [False, False, True, True]
    assert s.lowest_level() == logging.WARNING
    s = logs.LogSettings(log_warning=False, log_verbose_level=1)
    assert [s.enabled(n) for n in (10, 20, 30, 40)] == [True, True, False, True]
    assert s.lowest_level() == logging.DEBUG
    s = logs.LogSettings(log_info=False, log_warning=False, log_error=False)
    assert not any(s.enabled(n) for n in (10, 20, 30, 40, 50))
    assert s.lowest_level() > logging.CRITICAL


def test_update_changes_only_what_it_names():
    seen = []
    logs.watch_verbose(seen.append)
    out = logs.update({"log_verbose_level": 2, "log_info": False, "no_such_setting": 1})
    assert out == {"log_file": "", "log_info": False, "log_warning": True, "log_error": True,
                   "log_verbose_level": 2, "log_format": "default"}
    assert seen == [2]
    logs.update({"log_format": "ISO8601"})
    assert seen == [2]  # watchers hear of verbose changes only
    logs.unwatch_verbose(seen.append)
    logs.update({"log_verbose_level": 0})
    assert seen == [2]


@pytest.mark.parametrize("changes,code,message", [
    ({"log_file": "x.log"}, Code.UNSUPPORTED,
     "log file location can not be updated through network protocol"),
    ({"log_info": 1}, Code.INVALID_ARG, "expect boolean for 'log_info'"),
    ({"log_error": None}, Code.INVALID_ARG, "expect boolean for 'log_error'"),
    ({"log_verbose_level": True}, Code.INVALID_ARG, "expect int32 for 'log_verbose_level'"),
    ({"log_verbose_level": -1}, Code.INVALID_ARG, "expect int32 for 'log_verbose_level'"),
    ({"log_format": 3}, Code.INVALID_ARG, "expect string for 'log_format'"),
    ({"log_format": "xml"}, Code.INVALID_ARG, "invalid argument for --log_format, got: xml"),
])
def test_update_refusals(changes, code, message):
    with pytest.raises(ServerError) as e:
        logs.update({"log_warning": False, **changes})
    assert (e.value.code, e.value.message) == (code, message)
    assert logs.SETTINGS == logs.LogSettings()  # nothing took effect


@pytest.fixture
def root_logger():
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    yield root
    for h in root.handlers[:]:
        root.removeHandler(h)
        h.close()
    root.handlers[:] = saved[0]
    root.setLevel(saved[1])


def test_configure_appends_to_the_file_and_follows_updates(tmp_path, root_logger):
    path = tmp_path / "server.log"
    path.write_text("before\n")
    logs.configure(logs.LogSettings(log_file=str(path), log_format="ISO8601"))
    log = logging.getLogger("shmserve.test")
    log.info("one")
    log.debug("hidden")
    logs.update({"log_verbose_level": 1, "log_info": False})
    log.info("hidden too")
    log.debug("two")
    assert root_logger.level == logging.DEBUG
    lines = path.read_text().splitlines()
    assert lines[0] == "before"
    assert [line.split("] ", 1)[1] for line in lines[1:]] == ["one", "two"]
    assert lines[1].split(" ", 1)[1].startswith("I ")
    assert logs.update({})["log_file"] == str(path)


def test_configure_refuses_a_file_it_cannot_open(tmp_path, root_logger):
    with pytest.raises(OSError):
        logs.configure(logs.LogSettings(log_file=str(tmp_path / "no" / "such" / "dir.log")))


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records = []

    def emit(self, record):
        self.records.append(record)


@pytest.fixture
def collected():
    out = logging.getLogger("shmserve.output")
    handler = _Collect()
    out.addHandler(handler)
    out.setLevel(logging.DEBUG)
    yield handler.records
    out.removeHandler(handler)
    out.setLevel(logging.NOTSET)


# A stand-in for a worker: the verbose level it reads on stdin, echoed on stdout; a record line
# on stderr; a partial last line.
CHILD = r"""
import sys, json
sys.stdout.reconfigure(line_buffering=True)
print("level " + sys.stdin.readline().strip())
sys.stderr.write("\x1e" + json.dumps([1.5, 30, "model.py", 7, "probe", "a\nrecord"]) + "\n")
sys.stderr.write("\x1enot json\n")
sys.stderr.write("unfinished")
sys.stderr.write("\x1e" + json.dumps([2.5, 20, "model.py", 8, "probe", "after"]) + "\n")
print("level " + sys.stdin.readline().strip())
sys.stdout.write("x" * 70000 + "\n")
sys.stdout.write("no newline at the end")
"""


def test_worker_log_relays_output_and_feeds_the_verbose_level(collected):
    extra = logs.context(model="m", version=1, instance="m_0_0")

    async def run():
        logs.update({"log_verbose_level": 3})
        worker_log = logs.WorkerLog(extra)
        stdin, stdout, stderr = worker_log.child_fds
        proc = await asyncio.create_subprocess_exec(sys.executable, "-c", CHILD, stdin=stdin,
                                                    stdout=stdout, stderr=stderr)
        await worker_log.started(proc.pid)
        assert worker_log.child_fds == ()
        while not any(r.getMessage() == "level 3" for r in collected):
            await asyncio.sleep(0.01)
        logs.update({"log_verbose_level": 1})
        assert await proc.wait() == 0
        await worker_log.close()
        assert logs._verbose_watchers == []
        return proc.pid

    pid = asyncio.run(run())
    by_message = {r.getMessage(): r for r in collected}
    assert all(r.process == pid and r.instance == "m_0_0" and r.model == "m" for r in collected)
    assert by_message["level 3"].levelno == logging.INFO
    assert by_message["level 3"].name == "stdout"
    assert by_message["level 1"].levelno == logging.INFO
    record = by_message["a\nrecord"]
    assert (record.levelno, record.filename, record.lineno, record.name, record.created) == (
        30, "model.py", 7, "probe", 1.5)
    assert by_message["\x1enot json"].levelno == logging.WARNING  # raw stderr
    assert by_message["unfinished"].levelno == logging.WARNING
    assert (by_message["after"].levelno, by_message["after"].lineno) == (logging.INFO, 8)
    cut = [len(m) for m in by_message if m.startswith("xx")]
    assert cut == [logs.MAX_LINE, 70000 - logs.MAX_LINE]
    assert "no newline at the end" in by_message


def test_worker_log_close_releases_every_pipe_when_the_process_never_started():
    async def run():
        before = len(os.listdir("/proc/self/fd"))
        worker_log = logs.WorkerLog({})
        await worker_log.close()
        assert len(os.listdir("/proc/self/fd")) == before
        assert logs._verbose_watchers == []

    asyncio.run(run())
