"""The queue of one model's waiting requests: priority levels, each with Triton's queue policy.

Level 1 is the highest priority. Within a level requests stay in arrival order; a request
whose queue timeout expired under the DELAY action moves behind the level's other requests
(but still ahead of lower levels), as Triton's policy queues do.
"""

import asyncio
import collections
from dataclasses import dataclass
from typing import Optional

from shmserve.errors import Code, ServerError

QUEUED, TAKEN, GONE = range(3)


class QueueRejection(ServerError):
    """The scheduler refused a request (queue full, queue timeout): Triton's REJECTED."""

    def __init__(self, message: str):
        super().__init__(Code.UNAVAILABLE, message)


def queue_full() -> QueueRejection:
    """A model's queue policy, or the server's default bound, is at its maximum size."""
    return QueueRejection("Exceeds maximum queue size")


@dataclass(slots=True)
class QueuePolicy:
    max_queue_size: int = 0  # 0: unbounded
    timeout_ns: int = 0  # 0: no timeout
    allow_timeout_override: bool = False
    delay_on_timeout: bool = False  # timeout_action DELAY rather than REJECT

    @classmethod
    def from_proto(cls, p) -> "QueuePolicy":
        action = p.DESCRIPTOR.fields_by_name["timeout_action"].enum_type
        return cls(max_queue_size=p.max_queue_size,
                   timeout_ns=p.default_timeout_microseconds * 1000,
                   allow_timeout_override=p.allow_timeout_override,
                   delay_on_timeout=action.values_by_number[p.timeout_action].name == "DELAY")

    def timeout_for(self, requested_us: int) -> int:
        """The queue timeout of a request, in ns (0: none). A request may lower a default
        timeout when the policy allows it, never raise it; as in Triton, with no default
        timeout there is nothing to lower."""
        if self.allow_timeout_override and 0 < requested_us * 1000 < self.timeout_ns:
            return requested_us * 1000
        return self.timeout_ns


class Pending:
    """One queued request and what the scheduler knows about it."""

    __slots__ = ("work", "batch_size", "shape_key", "level", "enqueued_ns",
                 "future", "state", "delayed", "timer", "deadline_ns", "outcome")

    def __init__(self, work, batch_size: int, shape_key, level: int,
                 enqueued_ns: int, future):
        self.work = work
        self.batch_size = batch_size
        self.shape_key = shape_key  # requests batch together only when their keys are equal
        self.level = level
        self.enqueued_ns = enqueued_ns
        self.future = future
        self.state = QUEUED
        self.delayed = False
        self.timer: Optional[asyncio.TimerHandle] = None  # handle of the queue-timeout timer, if any
        self.deadline_ns = 0
        self.outcome = None  # set once answered, while it waits for preserve_ordering


class RequestQueue:
    def __init__(self, levels: int = 0, default_level: int = 0,
                 default_policy: Optional[QueuePolicy] = None,
                 level_policies: Optional[dict] = None):
        self.levels = max(levels, 1)
        self.default_level = default_level if levels else 1
        default_policy = default_policy or QueuePolicy()
        level_policies = level_policies or {}
        self._policies = [level_policies.get(n, default_policy) for n in range(1, self.levels + 1)]
        # Per level: requests in arrival order, then those delayed by a timeout.
        self._main: list[collections.deque] = [collections.deque() for _ in range(self.levels)]
        self._delayed: list[collections.deque] = [collections.deque()
                                                  for _ in range(self.levels)]
        self._size = 0

    @classmethod
    def from_config(cls, batching) -> "RequestQueue":
        """From a dynamic_batching config message."""
        return cls(batching.priority_levels, batching.default_priority_level,
                   QueuePolicy.from_proto(batching.default_queue_policy),
                   {level: QueuePolicy.from_proto(p)
                    for level, p in batching.priority_queue_policy.items()})

    def __len__(self) -> int:
        return self._size

    @property
    def bounded(self) -> bool:
        """Some priority level has a max_queue_size of its own."""
        return any(p.max_queue_size for p in self._policies)

    @property
    def has_policy(self) -> bool:
        """Priorities, a queue timeout or a size bound apply: requests must stay queued until
        an instance starts them, for these to hold over everything that has not started."""
        return self.levels > 1 or any(p.timeout_ns or p.max_queue_size for p in self._policies)

    def level_of(self, priority: int) -> int:
        """A request's level: 0, or a value beyond the configured levels, means the default."""
        if priority <= 0 or priority > self.levels:
            return self.default_level
        return priority

    def policy(self, level: int) -> QueuePolicy:
        return self._policies[level - 1]

    def push(self, entry: Pending) -> None:
        i = entry.level - 1
        cap = self._policies[i].max_queue_size
        if cap and len(self._main[i]) + len(self._delayed[i]) >= cap:
            raise queue_full()
        self._main[i].append(entry)
        self._size += 1

    def remove(self, entry: Pending) -> None:
        i = entry.level - 1
        (self._delayed[i] if entry.delayed else self._main[i]).remove(entry)
        self._size -= 1

    def delay(self, entry: Pending) -> None:
        i = entry.level - 1
        self._main[i].remove(entry)
        self._delayed[i].append(entry)
        entry.delayed = True

    def __iter__(self):
        """Requests in the order batches take them."""
        for main, delayed in zip(self._main, self._delayed):
            yield from main
            yield from delayed

    def take(self, count: int) -> list:
        """Remove and return the first `count` requests in batch order."""
        taken: list = []
        for main, delayed in zip(self._main, self._delayed):
            for q in (main, delayed):
                while q and len(taken) < count:
                    taken.append(q.popleft())
            if len(taken) == count:
                break
        self._size -= len(taken)
        return taken


def resolve(future: asyncio.Future, outcome) -> None:
    """Hand a scheduled request its outcome: (WorkResponse, ...) or an exception. A caller that
    is gone gets nothing, and the outputs made for it are handed back."""
    if future.done():
        if isinstance(outcome, tuple) and outcome[0].release is not None:
            outcome[0].release()
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)
