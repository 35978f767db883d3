"""The server log: where it goes, what its lines look like, and the settings `/v2/logging` and
gRPC `LogSettings` read and change while the server runs.

Line formats (times in UTC):
- `default`, Triton's: `I1121 10:00:00.123456 1234 worker.py:210] message`: level letter (E, W,
  I; verbose lines are I too, as in Triton), month and day, time, process id, source file:line.
- `ISO8601`, Triton's: `2026-11-21T10:00:00Z I 1234 worker.py:210] message`.
- `json`, shmserve's addition: one JSON object a line with `time`, `level` (ERROR, WARNING,
  INFO, VERBOSE), `logger`, `pid`, `source`, `message`, and the context fields present.

Context: a record about a model, an instance or a request carries the attributes `model`,
`version`, `instance`, `request_id` (pass `extra=context(...)`); text formats show them as
`[model=m version=1 instance=m_0_0 request_id=7] ` before the message.

Levels: Triton switches error, warning and info on and off one by one, and adds verbose
levels; Python's DEBUG is verbose (shown when the verbose level is 1 or more).

Worker output: each worker's stdout and stderr come to the front through pipes (see
`WorkerLog`) and are logged again with the worker's pid and the instance's context. A line
the worker's logging handler wrote (`RECORD_MARK` + JSON `[created, levelno, filename, lineno,
logger, message]`, see workers/__main__.py) keeps its level and source; any other line is
stdout at INFO or stderr at WARNING.
"""

import asyncio
import dataclasses
import functools
import json
import logging
import os
import sys
import time
from typing import Any, Callable, Optional

from shmserve.errors import Code, ServerError

FORMATS = ("default", "ISO8601", "json")
CONTEXT_FIELDS = ("model", "version", "instance", "request_id")
RECORD_MARK = "\x1e"  # starts a line that holds one log record of a worker
MAX_LINE = 64 * 1024  # a longer line of worker output is cut into lines of this size


@dataclasses.dataclass
class LogSettings:
    """Field names and order are those of Triton's `/v2/logging` response."""

    log_file: str = ""
    log_info: bool = True
    log_warning: bool = True
    log_error: bool = True
    log_verbose_level: int = 0
    log_format: str = "default"

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    def enabled(self, levelno: int) -> bool:
        if levelno >= logging.ERROR:
            return self.log_error
        if levelno >= logging.WARNING:
            return self.log_warning
        if levelno >= logging.INFO:
            return self.log_info
        return self.log_verbose_level > 0

    def lowest_level(self) -> int:
        """The lowest level shown: what the root logger lets through."""
        if self.log_verbose_level > 0:
            return logging.DEBUG
        for levelno, on in ((logging.INFO, self.log_info), (logging.WARNING, self.log_warning),
                            (logging.ERROR, self.log_error)):
            if on:
                return levelno
        return logging.CRITICAL + 1


# Process-wide, as Python's logging is.
SETTINGS = LogSettings()
_verbose_watchers: list = []
_handler: Optional[logging.Handler] = None

# The settings /v2/logging may change, with the type each takes (Triton's).
_TYPES: dict[str, tuple[type[Any], str]] = {
    "log_info": (bool, "boolean"), "log_warning": (bool, "boolean"),
    "log_error": (bool, "boolean"), "log_verbose_level": (int, "int32"),
    "log_format": (str, "string")}


_QUIET_LIBRARIES = ("hpack", "h2")


def configure(settings: LogSettings) -> None:
    """Send every record of the process (the root logger's) to `settings.log_file`, appended,
    or to stderr; OSError if the file cannot be opened."""
    global _handler
    handler: logging.Handler
    if settings.log_file:
        handler = logging.FileHandler(settings.log_file, mode="a", encoding="utf-8")
    else:
        handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(ServerFormatter())
    handler.addFilter(_enabled)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    _handler = handler
    # Libraries' own chatter is not the server's: --log-verbose would otherwise log a line for
    # every header block hpack decodes.
    for name in _QUIET_LIBRARIES:
        logging.getLogger(name).setLevel(logging.WARNING)
    _apply(settings)


def update(changes: dict) -> dict:
    """Change some settings (Triton's names; unknown names are ignored, as Triton does);
    the settings after the change. Checked as a whole before any takes effect."""
    if "log_file" in changes:
        raise ServerError(Code.UNSUPPORTED,
                          "log file location can not be updated through network protocol")
    new = dataclasses.replace(SETTINGS)
    for name, (kind, kind_name) in _TYPES.items():
        if name not in changes:
            continue
        value = changes[name]
        if type(value) is not kind or (kind is int and not 0 <= value < 2**31):
            raise ServerError(Code.INVALID_ARG, f"expect {kind_name} for '{name}'")
        if name == "log_format" and value not in FORMATS:
            raise ServerError(Code.INVALID_ARG, f"invalid argument for --log_format, got: {value}")
        setattr(new, name, value)
    _apply(new)
    return SETTINGS.as_dict()


def _apply(new: LogSettings) -> None:
    verbose_changed = new.log_verbose_level != SETTINGS.log_verbose_level
    for field in dataclasses.fields(LogSettings):
        setattr(SETTINGS, field.name, getattr(new, field.name))
    if _handler is not None:
        logging.getLogger().setLevel(SETTINGS.lowest_level())
    if verbose_changed:
        for watcher in list(_verbose_watchers):
            watcher(SETTINGS.log_verbose_level)


def watch_verbose(callback: Callable[[int], None]) -> None:
    """`callback(level)` at every change of the verbose level (workers follow it)."""
    _verbose_watchers.append(callback)


def unwatch_verbose(callback: Callable[[int], None]) -> None:
    if callback in _verbose_watchers:
        _verbose_watchers.remove(callback)


def _enabled(record: logging.LogRecord) -> bool:
    return SETTINGS.enabled(record.levelno)


def context(*, model: Optional[str] = None, version=None, instance: Optional[str] = None,
            request_id: Optional[str] = None) -> dict:
    """The `extra=` of a record about a model, an instance or a request; empty fields left out."""
    fields = {"model": model, "version": version, "instance": instance, "request_id": request_id}
    return {k: v for k, v in fields.items() if v not in (None, "")}


def _level_name(levelno: int) -> str:
    if levelno >= logging.ERROR:
        return "ERROR"
    if levelno >= logging.WARNING:
        return "WARNING"
    return "INFO" if levelno >= logging.INFO else "VERBOSE"


class ServerFormatter(logging.Formatter):
    """Formats records in the format the settings name at the time of the record."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            message = f"{message}\n{record.exc_text}"
        if record.stack_info:
            message = f"{message}\n{self.formatStack(record.stack_info)}"
        source = f"{record.filename}:{record.lineno}" if record.lineno else record.filename
        fields = {k: getattr(record, k) for k in CONTEXT_FIELDS if hasattr(record, k)}
        fmt = SETTINGS.log_format
        seconds = int(record.created)
        utc = time.gmtime(seconds)
        micros = int((record.created - seconds) * 1e6)
        if fmt == "json":
            line = {"time": time.strftime("%Y-%m-%dT%H:%M:%S", utc) + f".{micros:06d}Z",
                    "level": _level_name(record.levelno), "logger": record.name,
                    "pid": record.process, "source": source, "message": message}
            line.update(fields)
            return json.dumps(line, ensure_ascii=False, default=str)
        letter = "I" if record.levelno < logging.WARNING else _level_name(record.levelno)[0]
        if fields:
            message = "[" + " ".join(f"{k}={v}" for k, v in fields.items()) + "] " + message
        if fmt == "ISO8601":
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", utc) + f" {letter}"
        else:
            stamp = letter + time.strftime("%m%d %H:%M:%S", utc) + f".{micros:06d}"
        return f"{stamp} {record.process} {source}] {message}"


# Worker output is logged through this logger, whatever logger name its records carry.
_output_log = logging.getLogger("shmserve.output")


class _OutputRelay(asyncio.Protocol):
    """The lines of one pipe from a worker, logged as they come; `done` resolves at its end."""

    def __init__(self, stream: str, pid: int, extra: dict):
        self._stream = stream
        self._pid = pid
        self._extra = extra
        self._partial = b""
        self.transport = None
        self.done = asyncio.get_running_loop().create_future()

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        for line in lines:
            self._relog_cut(line)
        if len(self._partial) > MAX_LINE:
            cut = len(self._partial) - len(self._partial) % MAX_LINE
            self._relog_cut(self._partial[:cut])
            self._partial = self._partial[cut:]

    def _relog_cut(self, line: bytes) -> None:
        for start in range(0, max(len(line), 1), MAX_LINE):
            self._relog(line[start:start + MAX_LINE])

    def connection_lost(self, exc) -> None:
        if self._partial:
            self._relog(self._partial)
            self._partial = b""
        if not self.done.done():
            self.done.set_result(None)

    def _relog(self, raw: bytes) -> None:
        text = raw.decode("utf-8", "replace").rstrip("\r")
        # A record may follow what the model wrote without a newline.
        written, mark, rest = text.partition(RECORD_MARK)
        record = _worker_record(rest) if mark else None
        if record is None:
            written = text
        if written.strip():
            levelno = logging.INFO if self._stream == "stdout" else logging.WARNING
            self._emit(logging.LogRecord(self._stream, levelno, self._stream, 0, written,
                                         None, None))
        if record is not None:
            self._emit(record)

    def _emit(self, record: logging.LogRecord) -> None:
        if not _output_log.isEnabledFor(record.levelno):
            return
        record.process = self._pid
        record.__dict__.update(self._extra)
        _output_log.handle(record)


def _worker_record(text: str) -> Optional[logging.LogRecord]:
    """The record of a line the worker's handler wrote (after its RECORD_MARK), or None."""
    try:
        created, levelno, filename, lineno, name, message = json.loads(text)
        record = logging.LogRecord(str(name), int(levelno), str(filename), int(lineno),
                                   str(message), None, None)
        record.created = float(created)
    except (ValueError, TypeError):
        return None
    return record


class WorkerLog:
    """The log side of one worker process: its stdout and stderr relayed to the server log with
    the instance's context (`extra`), and its stdin fed the verbose level, once before it
    starts and at every change. Give `child_fds` to the process as its stdin, stdout, stderr;
    then call `started`, and `close` once it ended (or could not start)."""

    def __init__(self, extra: dict):
        self._extra = extra
        self._relays: list = []
        level_read, level_write = os.pipe()
        self._level_write: int | None = level_write
        out_read, out_write = os.pipe()
        err_read, err_write = os.pipe()
        self.child_fds: tuple[int, ...] = (level_read, out_write, err_write)
        self._read_fds = [out_read, err_read]
        self._send_level(SETTINGS.log_verbose_level)
        # Never wait on a worker that does not read its stdin: a level it misses is dropped.
        os.set_blocking(level_write, False)
        watch_verbose(self._send_level)

    async def started(self, pid: int) -> None:
        self._close_child_fds()
        loop = asyncio.get_running_loop()
        for stream in ("stdout", "stderr"):
            pipe = os.fdopen(self._read_fds.pop(0), "rb", buffering=0)
            try:
                _, relay = await loop.connect_read_pipe(
                    functools.partial(_OutputRelay, stream, pid, self._extra), pipe)
            except BaseException:
                pipe.close()
                raise
            self._relays.append(relay)

    async def close(self, timeout: float = 1.0) -> None:
        """Log the last lines of the process's pipes, then release them (again: nothing more).
        A process that inherited a pipe may hold it open: after `timeout` it is closed anyway."""
        unwatch_verbose(self._send_level)
        self._close_child_fds()
        for fd in self._read_fds:
            os.close(fd)
        self._read_fds = []
        if self._level_write is not None:
            os.close(self._level_write)
            self._level_write = None
        pending = [r.done for r in self._relays if not r.done.done()]
        if pending:
            await asyncio.wait(pending, timeout=timeout)
        for relay in self._relays:
            relay.transport.close()

    def _send_level(self, level: int) -> None:
        if self._level_write is None:
            return  # closed: the worker is gone
        try:
            os.write(self._level_write, b"%d\n" % level)
        except (BlockingIOError, BrokenPipeError):
            pass  # a worker that does not read its stdin, or is gone

    def _close_child_fds(self) -> None:
        for fd in self.child_fds:
            os.close(fd)
        self.child_fds = ()
