"""POSIX shared-memory segments mapped into this process, and the names the server gives its own.

The front creates every segment it uses and unlinks them; workers attach by name. Only when
the front has died without doing so do the processes it started unlink them in its place
(workers/front_watch.py). posix_ipc is used directly rather than multiprocessing.shared_memory,
whose resource tracker may unlink segments this process merely attached to.
"""

import mmap
import os
import re

import posix_ipc

_SERVER_PREFIX = "shmserve."
# The granularity of Segment.reserve: few calls, little memory reserved ahead of use.
RESERVE_STEP = 8 * 1024 * 1024
# shmserve.<pid>.<tag>, as segment_name builds it (a pid never has a leading zero)
_SERVER_NAME = re.compile(r"shmserve\.([1-9][0-9]*)\.[^/\x00]+")


def _posix_name(name: str) -> str:
    # glibc's shm_open skips every leading '/', so "//x" and "x" both open "/x"
    bare = name.lstrip("/")
    if not bare or "/" in bare or "\x00" in bare:
        raise ValueError(f"invalid shared-memory name {name!r}")
    return "/" + bare


class Segment:
    """A shared-memory object mapped read-write; `create` makes one, `attach` opens one.
    Offsets are relative to `start` bytes into the mapping."""

    __slots__ = ("_name", "_size", "_mmap", "_buffer", "_owner", "_start", "_reserved")

    def __init__(self, name: str, mapping: mmap.mmap, owner: bool, start: int = 0) -> None:
        self._name = name
        self._size = len(mapping) - start
        self._start = start
        self._reserved = 0  # bytes from `start` known to have memory behind them
        self._mmap: mmap.mmap | None = mapping
        # Every view handed out is a slice of this one memoryview, so the mapping has a single
        # export to account for when it is closed.
        whole = memoryview(mapping)
        self._buffer: memoryview | None = whole[start:] if start else whole
        if start:
            whole.release()  # its slice keeps the export
        self._owner = owner

    @classmethod
    def create(cls, name: str, size: int) -> "Segment":
        """Create a segment (FileExistsError if the name is taken), open to this user only."""
        name = _posix_name(name)
        if size <= 0:
            raise ValueError(f"segment size must be positive, got {size}")
        try:
            shm = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=0o600, size=size)
        except posix_ipc.ExistentialError:
            raise FileExistsError(f"shared-memory segment {name} already exists") from None
        try:
            mapping = mmap.mmap(shm.fd, size)
        except BaseException:
            shm.unlink()
            raise
        finally:
            shm.close_fd()
        return cls(name, mapping, owner=True)

    @classmethod
    def attach(cls, name: str) -> "Segment":
        """Map an existing segment whole (FileNotFoundError if there is none)."""
        name = _posix_name(name)
        try:
            shm = posix_ipc.SharedMemory(name)
        except posix_ipc.ExistentialError:
            raise FileNotFoundError(f"no shared-memory segment {name}") from None
        except posix_ipc.PermissionsError as exc:
            raise PermissionError(f"shared-memory segment {name}: {exc}") from None
        try:
            size = os.fstat(shm.fd).st_size
            if size == 0:
                # also what a reader sees between its creator's shm_open and ftruncate
                raise ValueError(f"shared-memory segment {name} is empty")
            mapping = mmap.mmap(shm.fd, size)
        finally:
            shm.close_fd()
        return cls(name, mapping, owner=False)

    @property
    def name(self) -> str:
        """The POSIX name, with its leading '/'."""
        return self._name

    @property
    def size(self) -> int:
        return self._size

    @property
    def closed(self) -> bool:
        return self._buffer is None

    @property
    def buffer(self) -> memoryview:
        """A writable view of the whole mapping; the caller may release it when done."""
        return self.view(0, self._size)

    def view(self, offset: int, nbytes: int) -> memoryview:
        """A writable view of `nbytes` at `offset`; ValueError when out of bounds or closed."""
        buffer = self._buffer
        if buffer is None:
            raise ValueError(f"shared-memory segment {self._name} is closed")
        if offset < 0 or nbytes < 0 or offset + nbytes > self._size:
            raise ValueError(
                f"range [{offset}, {offset}+{nbytes}) is outside segment {self._name} "
                f"of {self._size} bytes"
            )
        return buffer[offset : offset + nbytes]

    def reserve(self, end: int) -> bool:
        """Make sure memory backs the first `end` bytes, so that writing there cannot fault;
        False when /dev/shm has no room for them.

        A segment is sparse: its pages are allocated when first touched, and a touch that
        finds /dev/shm full is a SIGBUS, which kills the process instead of failing a request.
        Writers call this before writing past what they reserved; it reserves whole
        RESERVE_STEP chunks, so the cost (an open, a fallocate, a close) is rare.
        """
        if end <= self._reserved:
            return True
        start = self._start + self._reserved
        stop = self._start + min(self._size, -(-end // RESERVE_STEP) * RESERVE_STEP)
        try:
            shm = posix_ipc.SharedMemory(self._name)
        except posix_ipc.Error:
            return False
        try:
            os.posix_fallocate(shm.fd, start, stop - start)
        except OSError:
            return False
        finally:
            shm.close_fd()
        self._reserved = stop - self._start
        return True

    def close(self) -> None:
        """Stop handing out views and unmap; safe to call again, and while views are alive.

        Unmapping under a live view would turn its next access into a segfault, which is why
        mmap.close raises BufferError while views exist. In that case the mapping is left to
        them: each view keeps the mmap object alive, and when the last one is released or
        collected the mmap object is freed and that unmaps. Nothing leaks for longer than the
        caller's views live, and close never fails.
        """
        buffer, mapping = self._buffer, self._mmap
        if buffer is None:
            return
        assert mapping is not None  # set and cleared together with _buffer
        self._buffer = self._mmap = None
        buffer.release()
        try:
            mapping.close()
        except BufferError:
            pass

    def unlink(self) -> None:
        """Remove the name (the creator's job); mappings stay valid. A missing name is fine."""
        if not self._owner:
            raise RuntimeError(f"segment {self._name} was attached here; its creator unlinks it")
        try:
            posix_ipc.unlink_shared_memory(self._name)
        except posix_ipc.ExistentialError:
            pass

    def __enter__(self) -> "Segment":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def segment_name(server_pid: int, tag: str) -> str:
    """The name of a segment owned by the server process `server_pid`: /shmserve.<pid>.<tag>."""
    if server_pid <= 0:
        raise ValueError(f"invalid server pid {server_pid}")
    if not tag or "/" in tag or "\x00" in tag:
        raise ValueError(f"invalid segment tag {tag!r}")
    return f"/{_SERVER_PREFIX}{server_pid}.{tag}"


def is_server_segment(key: str) -> bool:
    """Whether a name a client gave us opens a segment some shmserve server owns."""
    return _SERVER_NAME.fullmatch(key.lstrip("/")) is not None


def sweep_dead_segments(shm_dir: str = "/dev/shm") -> list[str]:
    """Unlink the segments of shmserve servers that no longer run; returns their POSIX names.

    A pid reused by an unrelated process keeps its dead server's segments until that process
    exits too: the sweep errs on the side of leaking, never of removing a live server's memory.
    It cannot tell pids of another pid namespace sharing this shm_dir, so containers that share
    /dev/shm must not share it with a server in a different pid namespace.
    """
    return _unlink_where(lambda pid: not pid_alive(pid), shm_dir)


def unlink_segments_of(server_pid: int, shm_dir: str = "/dev/shm") -> list[str]:
    """Unlink every segment named for the server process `server_pid` (/shmserve.<pid>.*),
    whoever created it; returns their POSIX names. Only for a caller that knows that process
    has exited: a live server's segments would go (see workers/front_watch.py).

    A client's own region is never named so (SharedMemoryManager refuses to register such a
    name), so none is touched. Several processes may call this at once: a name another one
    unlinked first is skipped.
    """
    return _unlink_where(lambda pid: pid == server_pid, shm_dir)


def _unlink_where(wanted, shm_dir: str) -> list[str]:
    """Unlink the server segments in `shm_dir` whose server pid satisfies `wanted`."""
    removed = []
    with os.scandir(shm_dir) as entries:
        for entry in entries:
            match = _SERVER_NAME.fullmatch(entry.name)
            if match is None or not entry.is_file(follow_symlinks=False):
                continue
            if not wanted(int(match.group(1))):
                continue
            try:
                os.unlink(entry.path)
            except FileNotFoundError:  # its server or another sweep got there first
                continue
            removed.append("/" + entry.name)
    return removed


def pid_alive(pid: int) -> bool:
    """Whether a process `pid` may still run (one of another user counts as running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    except OverflowError:  # cannot be a pid, so no server of ours made this name: leave it
        return True
    return True
