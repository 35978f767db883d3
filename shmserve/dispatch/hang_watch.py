"""Finding a model instance that hangs: it holds work (a batch not yet answered, or a stream
still open) and has sent no frame for `timeout` seconds (`--model-instance-timeout-secs`).

Once told to look (`start`), the check costs one timer per instance, armed while it holds
work; frames only note the time they came (`last_frame`). A stream whose reader has not yet
handed over all its responses does not count as silent: the model's sender may be waiting on
that reader (see workers/loop.py). What a hung instance comes to (it is killed) is its
handle's to say (dispatch/worker.py).
"""

import asyncio
from typing import Callable, Optional


class HangWatch:
    def __init__(self, busy: Callable[[], bool], readers_behind: Callable[[], bool],
                 hung: Callable[[], None]):
        """`busy()`: the instance is alive and holds work; `readers_behind()`: some open
        stream has responses its reader has not handed over yet; `hung()`: the instance is
        hung."""
        self._busy = busy
        self._readers_behind = readers_behind
        self._hung = hung
        self.timeout = 0.0  # seconds; 0: hangs are not looked for
        self.last_frame = 0.0  # loop time of the last frame, or of the start of work
        self.loop: Optional[asyncio.AbstractEventLoop] = None  # the instance's, once started
        self._timer: Optional[asyncio.TimerHandle] = None

    def start(self, timeout: float) -> None:
        """Look for hangs of `timeout` seconds from now on."""
        self.timeout = timeout

    def work_sent(self, idle: bool) -> None:
        """A batch is about to be sent to an instance that held nothing (`idle`) or some:
        silence counts from now if it was idle."""
        loop = self.loop
        assert loop is not None  # work is sent only to a started instance
        if idle:
            self.last_frame = loop.time()
        if self._timer is None:
            self._timer = loop.call_at(self.last_frame + self.timeout, self._check)

    def _check(self) -> None:
        self._timer = None
        if not self._busy():
            return  # disarmed until work comes again
        loop = self.loop
        assert loop is not None  # armed by work_sent
        now = loop.time()
        if self._readers_behind():
            self.last_frame = now  # a sender held back by its slow reader is not hung
        due = self.last_frame + self.timeout
        if now < due:
            self._timer = loop.call_at(due, self._check)
            return
        self._hung()
