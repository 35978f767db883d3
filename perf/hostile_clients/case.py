"""What an attack is (Case: its coroutine, time budget, whether it waits 40 s) and the context it
runs in (Ctx: the server's ports, its deadlines, and every connection it opened, which the
runner closes however the attack ended)."""
import collections
import time
from dataclasses import dataclass
from typing import Awaitable, Callable

from .h2 import H2Conn
from .http1 import Http1Conn


class Ctx:
    def __init__(self, server, budget_s: float):
        self.grpc_port, self.http_port = server.grpc_port, server.http_port
        self.budget_s = budget_s
        self.t0 = time.monotonic()
        self.h2conns: list[H2Conn] = []
        self.h1conns: list[Http1Conn] = []
        self.closers: list[Callable[[], None]] = []
        self.details: dict = {}

    def deadline(self, seconds: float | None = None) -> float:
        """Monotonic time `seconds` from now, never past the case's budget."""
        end = self.t0 + self.budget_s
        return end if seconds is None else min(time.monotonic() + seconds, end)

    def now(self) -> float:
        return time.monotonic() - self.t0

    async def h2(self, *, open_timeout: float = 5.0, preface: bool = True, **kw) -> H2Conn:
        c = H2Conn(self.grpc_port, self.t0, **kw)
        self.h2conns.append(c)
        await c.open(open_timeout, preface)
        return c

    async def h1(self) -> Http1Conn:
        c = Http1Conn(self.http_port, self.t0)
        self.h1conns.append(c)
        await c.open()
        return c

    def close_all(self) -> None:
        for c in self.h2conns + self.h1conns:
            c.close()
        for close in self.closers:
            try:
                close()
            except OSError:
                pass

    def summary(self) -> str:
        """What the connections saw, for a case stopped before it could say."""
        ends = collections.Counter(c.events() or "open" for c in self.h2conns)
        ends.update(c.describe() or "open" for c in self.h1conns)
        return ", ".join(f"{n}× {what}" if n > 1 else what for what, n in ends.most_common(3))


@dataclass
class Case:
    name: str
    run: Callable[[Ctx], Awaitable[str]]
    budget_s: float            # the attack's time; the runner stops it 10 s past this
    slow: bool = False         # waits 40 s: skipped with --quick
    raise_nofile: bool = False
