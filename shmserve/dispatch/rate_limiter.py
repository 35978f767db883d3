"""Triton's rate limiter (`--rate-limit=execution_count`): a model instance whose instance group
lists `rate_limiter { resources [...] }` runs a batch only while it holds those resources, so
that instances of all models together never run more than the resources allow.

Resources are counted per device (the instance's GPU; 0 for CPU instances), or once for the
whole server when a model lists them `global: true`. The copies of a resource are, unless
`--rate-limit-resource=<name>:<count>[:<device>]` says otherwise, the most that any loaded
instance asks for, so every instance can run. An instance takes its resources when a batch
leaves for it and gives them back when the batch is done; while it holds them it takes no
second batch (no pipelining), so holding them means running.

Instances that found the resources taken wait; when resources come back the waiting ones are
offered them in order of the executions they have had times their `priority` (0 counts as
1), as Triton's execution_count mode decides: an instance of priority 2 gets half the turns of
one of priority 1. Instances without resources are not limited at all.
"""

import collections
from dataclasses import dataclass

GLOBAL = "GLOBAL"  # the device of a resource shared by all devices


@dataclass(frozen=True)
class Needs:
    """What one instance must hold to run: ((resource name, device or GLOBAL), count) pairs."""

    resources: tuple
    priority: int


def needs_of(group, device: int) -> Needs | None:
    """The Needs of an instance of `group` (a ModelInstanceGroup) on `device`; None when it
    lists no resources."""
    limiter = group.rate_limiter
    resources = tuple(((r.name, GLOBAL if getattr(r, "global") else device), r.count)
                      for r in limiter.resources if r.count > 0)
    if not resources:
        return None
    return Needs(resources, max(limiter.priority, 1))


def parse_resource(text: str) -> tuple:
    """--rate-limit-resource "<name>:<count>[:<device>]" -> (name, count, device or None)."""
    parts = text.split(":")
    if len(parts) not in (2, 3) or not parts[0] or not all(p.isdigit() for p in parts[1:]):
        raise ValueError(f"expected <name>:<count>[:<device>], got '{text}'")
    return parts[0], int(parts[1]), int(parts[2]) if len(parts) == 3 else None


class RateLimiter:
    def __init__(self, resources=()):
        """`resources`: the --rate-limit-resource values, as parse_resource gives them."""
        self._given: dict = {}  # (name, device or None) -> copies
        for name, count, device in resources:
            self._given[name, device] = count
        self._needs: dict = {}  # instance -> Needs
        self._in_use: collections.Counter = collections.Counter()  # (name, device) -> copies
        self._held: collections.Counter = collections.Counter()  # instance -> batches holding
        self._executions: collections.Counter = collections.Counter()  # instance -> runs
        self._waiting: dict = {}  # instance -> the pool to wake when resources come back

    def add(self, inst, needs: Needs) -> None:
        self._needs[inst] = needs

    def remove(self, inst) -> None:
        """The instance is unloaded; what it still holds is given back."""
        self.drop_held(inst)
        self._needs.pop(inst, None)
        self._waiting.pop(inst, None)
        self._executions.pop(inst, None)

    def drop_held(self, inst) -> None:
        """The instance restarted: the batches it held are gone, and their resources too."""
        if self._held.pop(inst, 0):
            self._recount()
            self._offer()

    def limits(self, inst) -> bool:
        return inst in self._needs

    def fits(self, inst, pool=None) -> bool:
        """Whether the instance could take its resources now; when not, and `pool` is given,
        the pool is woken once they may have come back."""
        needs = self._needs.get(inst)
        if needs is None:
            return True
        for key, count in needs.resources:
            if self._in_use[key] + count > self._copies(key):
                if pool is not None:
                    self._waiting[inst] = pool
                return False
        return True

    def take(self, inst) -> None:
        """Take the instance's resources for one batch (after `fits` said yes)."""
        needs = self._needs.get(inst)
        if needs is None:
            return
        for key, count in needs.resources:
            self._in_use[key] += count
        self._held[inst] += 1
        self._executions[inst] += 1
        self._waiting.pop(inst, None)

    def give_back(self, inst, pool) -> None:
        """The batch is done: its resources go to the waiting instances, best score first;
        the instance itself (its pool) competes too, in case it has more to run."""
        needs = self._needs.get(inst)
        if needs is None or not self._held[inst]:
            return
        self._held[inst] -= 1
        for key, count in needs.resources:
            self._in_use[key] -= count
        self._waiting[inst] = pool
        self._offer()

    def _offer(self) -> None:
        if not self._waiting:
            return
        # A woken pool's scheduler may take the resources at once: those after it then no
        # longer fit and go on waiting.
        order = sorted(self._waiting, key=lambda i: self._executions[i] * self._needs[i].priority)
        woken = set()
        for inst in order:
            pool = self._waiting.get(inst)
            if pool is not None and pool not in woken and self.fits(inst):
                woken.add(pool)
                del self._waiting[inst]
                pool.resources_freed()

    def _copies(self, key) -> int:
        name, device = key
        if device == GLOBAL:  # a device given for a global resource is ignored, as in Triton
            given = next((n for (r, _), n in self._given.items() if r == name), None)
        else:
            given = self._given.get((name, device), self._given.get((name, None)))
        if given is not None:
            return given
        return max((count for needs in self._needs.values()
                    for k, count in needs.resources if k == key), default=0)

    def _recount(self) -> None:
        self._in_use = collections.Counter()
        for inst, batches in self._held.items():
            for key, count in self._needs[inst].resources:
                self._in_use[key] += count * batches
