import gc
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from shmserve.ipc.segments import (
    Segment,
    is_server_segment,
    segment_name,
    sweep_dead_segments,
    unlink_segments_of,
)

SHM_DIR = "/dev/shm"
REPO_ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(autouse=True)
def token():
    """A string in the name of every segment a test creates; none may be left behind."""
    tok = uuid.uuid4().hex
    yield tok
    leftovers = [entry for entry in os.listdir(SHM_DIR) if tok in entry]
    for entry in leftovers:
        os.unlink(os.path.join(SHM_DIR, entry))
    assert not leftovers, f"test left segments behind: {leftovers}"


@pytest.fixture
def name(token):
    return f"/shmserve-test.{token}"


@pytest.fixture
def segment(name):
    seg = Segment.create(name, 4096)
    yield seg
    seg.close()
    seg.unlink()


def mapped_here(name: str) -> bool:
    target = f"{SHM_DIR}/{name.lstrip('/')}"
    with open("/proc/self/maps") as maps:
        return any(target in line for line in maps)


def test_second_process_sees_and_writes_the_same_bytes(segment):
    segment.view(0, 5)[:] = b"hello"
    child = (
        "import sys\n"
        "from shmserve.ipc.segments import Segment\n"
        "seg = Segment.attach(sys.argv[1])\n"
        "data = bytes(seg.view(0, 5))\n"
        "seg.view(100, 5)[:] = data.upper()\n"
        "seg.close()\n"
        "print(seg.size, data.decode())\n"
    )
    env = {**os.environ,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT),
                                                      os.environ.get("PYTHONPATH")]))}
    result = subprocess.run(
        [sys.executable, "-c", child, segment.name],
        env=env, capture_output=True, text=True, timeout=30, check=True,
    )
    assert result.stdout.split() == ["4096", "hello"]
    assert bytes(segment.view(100, 5)) == b"HELLO"
    # the child's exit must not have unlinked what it attached to
    with Segment.attach(segment.name) as again:
        assert bytes(again.view(100, 5)) == b"HELLO"


def test_names_with_and_without_leading_slash_are_one_segment(token, segment):
    assert segment.name.startswith("/")
    with Segment.attach(segment.name.lstrip("/")) as same:
        assert same.name == segment.name
        assert same.size == 4096
        same.buffer[4095] = 7
    assert segment.buffer[4095] == 7


@pytest.mark.parametrize("bad", ["", "/", "//", "/a/b", "a\x00b"])
def test_invalid_names_are_rejected(bad):
    with pytest.raises(ValueError):
        Segment.create(bad, 64)
    with pytest.raises(ValueError):
        Segment.attach(bad)


def test_create_refuses_an_existing_name_and_a_bad_size(name, segment):
    with pytest.raises(FileExistsError):
        Segment.create(name, 64)
    with pytest.raises(ValueError):
        Segment.create(name + ".zero", 0)


def test_attach_to_a_missing_segment(name):
    with pytest.raises(FileNotFoundError):
        Segment.attach(name)


@pytest.mark.parametrize(
    "offset, nbytes", [(-1, 1), (0, -1), (0, 4097), (4096, 1), (4095, 2), (10**12, 0)]
)
def test_view_bounds(segment, offset, nbytes):
    with pytest.raises(ValueError):
        segment.view(offset, nbytes)


def test_view_edges(segment):
    assert len(segment.view(0, 4096)) == 4096
    assert len(segment.view(4096, 0)) == 0
    assert len(segment.buffer) == 4096
    assert not segment.view(0, 1).readonly


def test_unlink_is_idempotent_and_for_the_creator_only(name):
    seg = Segment.create(name, 64)
    attached = Segment.attach(name)
    with pytest.raises(RuntimeError):
        attached.unlink()
    seg.unlink()
    seg.unlink()
    with pytest.raises(FileNotFoundError):
        Segment.attach(name)
    # unlinking removes the name only: existing mappings keep working
    seg.view(0, 3)[:] = b"abc"
    assert bytes(attached.view(0, 3)) == b"abc"
    seg.close()
    attached.close()


def test_close_unmaps_and_is_idempotent(segment):
    assert mapped_here(segment.name)
    segment.close()
    segment.close()
    assert segment.closed
    assert not mapped_here(segment.name)
    with pytest.raises(ValueError):
        segment.view(0, 1)
    with pytest.raises(ValueError):
        _ = segment.buffer


def test_close_with_live_views_defers_the_unmap_to_them(segment):
    view = segment.view(10, 4)
    whole = segment.buffer
    segment.close()
    assert segment.closed
    # the mapping outlives close for as long as the caller's views do
    view[:] = b"live"
    assert bytes(whole[10:14]) == b"live"
    assert mapped_here(segment.name)
    whole.release()
    del view
    gc.collect()
    assert not mapped_here(segment.name)


def test_segment_name_and_is_server_segment():
    name = segment_name(1234, "arena0")
    assert name == "/shmserve.1234.arena0"
    for key in (name, name.lstrip("/"), "//" + name.lstrip("/"), "/shmserve.1.a.b"):
        assert is_server_segment(key)
    for key in ("/shmserve", "/shmserve.1234", "/shmserve.x.arena", "/myshmserve.1.a", "/input0"):
        assert not is_server_segment(key)


@pytest.mark.parametrize("pid, tag", [(0, "a"), (-5, "a"), (1, ""), (1, "a/b")])
def test_segment_name_rejects_bad_parts(pid, tag):
    with pytest.raises(ValueError):
        segment_name(pid, tag)


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", ""])
    child.wait()
    return child.pid


def test_sweep_removes_only_segments_of_dead_servers(token):
    dead = dead_pid()
    doomed = Segment.create(segment_name(dead, f"{token}.arena"), 64)
    alive = Segment.create(segment_name(os.getpid(), token), 64)
    bystanders = [
        Segment.create(f"/shmserve-test.{dead}.{token}", 64),  # not our prefix
        Segment.create(f"/shmserve.{dead}{token}", 64),  # no tag separator after the pid
        Segment.create(f"/shmserve.{10**30}.{token}", 64),  # cannot be a pid
    ]
    doomed.close()
    try:
        removed = sweep_dead_segments()
        assert doomed.name in removed
        assert not any(token in name and name != doomed.name for name in removed)
        with pytest.raises(FileNotFoundError):
            Segment.attach(doomed.name)
        for kept in (alive, *bystanders):
            Segment.attach(kept.name).close()
    finally:
        for seg in (alive, *bystanders):
            seg.close()
            seg.unlink()


def test_sweep_keeps_segments_whose_pid_belongs_to_someone_else(token, monkeypatch):
    dead = dead_pid()
    seg = Segment.create(segment_name(dead, token), 64)
    try:

        def not_ours(pid, sig):
            raise PermissionError

        monkeypatch.setattr(os, "kill", not_ours)
        assert seg.name not in sweep_dead_segments()
        Segment.attach(seg.name).close()
    finally:
        seg.close()
        seg.unlink()


def test_unlink_segments_of_one_server_takes_all_its_names_and_nothing_else(token):
    gone = dead_pid()
    other = dead_pid()
    doomed = [Segment.create(segment_name(gone, f"{token}.{tag}"), 64)
              for tag in ("in.0", "out.1", "req.2")]
    bystanders = [
        Segment.create(segment_name(other, token), 64),  # another (dead) server's
        Segment.create(segment_name(os.getpid(), token), 64),  # a live server's
        Segment.create(f"/shmserve-test.{gone}.{token}", 64),  # a client's region, say
        Segment.create(f"/shmserve.{gone}{token}", 64),  # no tag separator after the pid
    ]
    try:
        removed = unlink_segments_of(gone)
        assert sorted(n for n in removed if token in n) == sorted(s.name for s in doomed)
        for seg in doomed:
            with pytest.raises(FileNotFoundError):
                Segment.attach(seg.name)
        for kept in bystanders:
            Segment.attach(kept.name).close()
        # A second cleaner finds nothing left, and says so without failing.
        assert not [n for n in unlink_segments_of(gone) if token in n]
    finally:
        for seg in (*doomed, *bystanders):
            seg.close()
            seg.unlink()
