"""systemd's service notification protocol (sd_notify), for units of `Type=notify`.

The service manager names a datagram socket in $NOTIFY_SOCKET: a filesystem path, or a Linux
abstract socket when it starts with '@' (which stands for a leading NUL byte). Each
notification is one datagram of newline-separated `KEY=VALUE` assignments: READY=1 once the
service is up, STOPPING=1 when it begins to shut down, WATCHDOG=1 to reset the watchdog. With
`WatchdogSec=` set, systemd passes the interval in $WATCHDOG_USEC (and the pid it expects the
pings from in $WATCHDOG_PID); it recommends pinging at half that interval.

Hand-written rather than taken from PyPI: the whole protocol is one datagram on a Unix socket,
and the packages that wrap it (sdnotify, systemd-python's daemon module, which also needs
libsystemd headers to build) are unmaintained or heavier than what they do.
"""

import asyncio
import logging
import os
import socket
import time
from typing import Optional

log = logging.getLogger("shmserve")

# How long a notification that must arrive (READY=1, STOPPING=1) is retried while the
# manager's socket queue is full; a Unix datagram queue holds only net.unix.max_dgram_qlen
# datagrams (10 by default).
PATIENCE_S = 10.0
_RETRY_S = 0.02


def notify(state: str) -> bool:
    """Send `state` (e.g. "READY=1") to the service manager. False when not run by systemd
    (no $NOTIFY_SOCKET), or when the datagram could not be sent; never raises."""
    try:
        return _send(state)
    except OSError as exc:
        log.debug("systemd notification %r not sent: %s", state, exc)
        return False


async def notify_patiently(state: str, patience_s: float = PATIENCE_S) -> bool:
    """notify() for a state the manager must not miss: while its socket queue is full, the
    datagram is sent again, for up to `patience_s`, without blocking the event loop."""
    deadline = time.monotonic() + patience_s
    while True:
        try:
            return _send(state)
        except BlockingIOError:
            if time.monotonic() >= deadline:
                log.warning("systemd notification %r not sent: the manager's socket stayed "
                            "full for %g s", state, patience_s)
                return False
            await asyncio.sleep(_RETRY_S)
        except OSError as exc:
            log.debug("systemd notification %r not sent: %s", state, exc)
            return False


def _send(state: str) -> bool:
    """One datagram; False when not run by systemd. BlockingIOError when the queue is full."""
    address = os.environ.get("NOTIFY_SOCKET", "")
    if address.startswith("@"):
        address = "\0" + address[1:]
    elif not address.startswith("/"):
        return False  # unset, or a form (vsock:...) that this module does not speak
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
        # Never block the event loop on a manager that does not read its socket.
        sock.setblocking(False)
        sock.sendto(state.encode(), address)
    return True


def watchdog_interval() -> Optional[float]:
    """Seconds between two WATCHDOG=1 pings (half of `WatchdogSec=`), or None when systemd
    watches no process of this service, or another process than this one."""
    pid = os.environ.get("WATCHDOG_PID")
    if pid and pid != str(os.getpid()):
        return None
    try:
        usec = int(os.environ.get("WATCHDOG_USEC", ""))
    except ValueError:
        return None
    return usec / 2e6 if usec > 0 else None


def start_watchdog() -> Optional[asyncio.Task]:
    """Ping systemd's watchdog from the running event loop until the task is cancelled, so a
    loop that stops turning stops the pings and systemd acts on it; None when not asked for."""
    interval = watchdog_interval()
    if interval is None:
        return None
    return asyncio.ensure_future(_ping(interval))


async def _ping(interval: float) -> None:
    while True:
        notify("WATCHDOG=1")
        await asyncio.sleep(interval)
