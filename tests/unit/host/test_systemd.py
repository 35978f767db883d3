"""systemd's notify protocol: datagrams to $NOTIFY_SOCKET (path or abstract), the watchdog."""

import asyncio
import os
import socket

import pytest

from shmserve.host import systemd


@pytest.fixture
def manager(tmp_path, monkeypatch):
    """A datagram socket standing for systemd, named by a filesystem path in NOTIFY_SOCKET."""
    path = str(tmp_path / "notify")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(5)
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    yield sock
    sock.close()


def test_notify_sends_one_datagram(manager):
    assert systemd.notify("READY=1")
    assert systemd.notify("STATUS=loading models\nMAINPID=1")
    assert manager.recv(4096) == b"READY=1"
    assert manager.recv(4096) == b"STATUS=loading models\nMAINPID=1"


def test_notify_to_an_abstract_socket(monkeypatch):
    name = f"shmserve-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(5)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        assert systemd.notify("STOPPING=1")
        assert sock.recv(4096) == b"STOPPING=1"


@pytest.mark.parametrize("address", [None, "", "relative/path", "vsock:2:1234"])
def test_not_under_systemd_is_false(address, monkeypatch):
    if address is None:
        monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    else:
        monkeypatch.setenv("NOTIFY_SOCKET", address)
    assert systemd.notify("READY=1") is False


def test_a_socket_nobody_listens_on_is_false_not_an_error(tmp_path, monkeypatch):
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "gone"))
    assert systemd.notify("READY=1") is False
    monkeypatch.setenv("NOTIFY_SOCKET", "@shmserve-test-nobody-listens-here")
    assert systemd.notify("READY=1") is False


@pytest.mark.parametrize("usec,pid,expected", [
    ("4000000", None, 2.0),
    ("4000000", "self", 2.0),
    ("4000000", "other", None),
    (None, None, None),
    ("0", None, None),
    ("soon", None, None),
])
def test_watchdog_interval_is_half_of_watchdog_usec(usec, pid, expected, monkeypatch):
    for name, value in (("WATCHDOG_USEC", usec),
                        ("WATCHDOG_PID", {"self": str(os.getpid()), "other": "1"}.get(pid))):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    assert systemd.watchdog_interval() == expected


def test_watchdog_pings_from_the_loop_until_cancelled(manager, monkeypatch):
    monkeypatch.setenv("WATCHDOG_USEC", "100000")  # pings every 0.05 s

    async def go():
        task = systemd.start_watchdog()
        await asyncio.sleep(0.3)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(go())
    manager.setblocking(False)
    pings = []
    while True:
        try:
            pings.append(manager.recv(4096))
        except BlockingIOError:
            break
    assert set(pings) == {b"WATCHDOG=1"}
    assert 3 <= len(pings) <= 8


def test_no_watchdog_unless_asked(manager):
    async def go():
        return systemd.start_watchdog()

    assert asyncio.run(go()) is None


def test_a_state_that_must_arrive_waits_for_room_in_a_full_queue(manager):
    # A Unix datagram queue is short (net.unix.max_dgram_qlen, 10 by default): fill it, as
    # watchdog pings do while the manager is busy, and READY=1 must still get through.
    filled = 0
    while systemd.notify("WATCHDOG=1"):
        filled += 1
    assert filled > 0

    async def go():
        ready = asyncio.ensure_future(systemd.notify_patiently("READY=1", patience_s=5))
        await asyncio.sleep(0.2)
        assert not ready.done()  # retrying, the loop free meanwhile
        received = [await asyncio.to_thread(manager.recv, 4096) for _ in range(filled + 1)]
        return await ready, received

    sent, received = asyncio.run(go())
    assert sent and received[-1] == b"READY=1"


def test_a_full_queue_gives_up_after_the_patience(manager):
    while systemd.notify("WATCHDOG=1"):
        pass
    assert asyncio.run(systemd.notify_patiently("READY=1", patience_s=0.1)) is False
