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
from typing import Optional

log = logging.getLogger("shmserve")


def notify(state: str) -> bool:
    """Send `state` (e.g. "READY=1") to the service manager. False when not run by systemd
    (no $NOTIFY_SOCKET), or when the datagram could not be sent; never raises."""
    address = os.environ.get("NOTIFY_SOCKET", "")
    if address.startswith("@"):
        address = "\0" + address[1:]
    elif not address.startswith("/"):
        return False  # unset, or a form (vsock:...) that this module does not speak
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            # Never block the event loop on a manager that does not read its socket.
            sock.setblocking(False)
            sock.sendto(state.encode(), address)
    except OSError as exc:
        log.debug("systemd notification %r not sent: %s", state, exc)
        return False
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
