"""Triton's response cache, the `local` kind (`--cache-config local,size=<bytes>`): responses
of models whose config says `response_cache { enable: true }`, kept by a hash of the request
(model, version, each input's name, datatype, shape and bytes, and the outputs asked for)
and evicted least recently used first once their bytes pass the size.

A cached response is a copy of its outputs in the front's heap: a hit answers without
scheduling anything, and the copy never depends on a worker's output arena.
"""

import hashlib
from collections import OrderedDict
from dataclasses import dataclass, field

from shmserve.errors import Code, ServerError

# Bytes an entry counts besides its outputs' (names, shapes, bookkeeping).
_ENTRY_OVERHEAD = 256


@dataclass(slots=True)
class CachedResponse:
    outputs: list  # of (name, datatype, shape, bytes)
    parameters: dict = field(default_factory=dict)

    @property
    def size(self) -> int:
        return _ENTRY_OVERHEAD + sum(len(data) + 64 for _, _, _, data in self.outputs)


class ResponseCache:
    def __init__(self, capacity: int):
        self.capacity = capacity
        self.used = 0
        self.evictions = 0
        self._entries: OrderedDict = OrderedDict()  # key -> CachedResponse, oldest use first

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, key: bytes):
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
        return entry

    def insert(self, key: bytes, entry: CachedResponse) -> None:
        """Keep `entry`, evicting the least recently used ones to make room; an entry larger
        than the whole cache is not kept."""
        size = entry.size
        if size > self.capacity or key in self._entries:
            return
        while self.used + size > self.capacity:
            _, old = self._entries.popitem(last=False)
            self.used -= old.size
            self.evictions += 1
        self._entries[key] = entry
        self.used += size


def request_key(model: str, version: int, inputs, requested: list) -> bytes:
    """The hash of a validated request: `inputs` have name, datatype, shape and data (bytes-
    like); inputs are taken in name order, so the order a client sent them in does not
    matter."""
    h = hashlib.blake2b(digest_size=32)
    h.update(f"{model}\0{version}\0".encode())
    for t in sorted(inputs, key=lambda t: t.name):
        h.update(f"{t.name}\0{t.datatype}\0{list(t.shape)}\0{len(t.data)}\0".encode())
        h.update(t.data)
    h.update("\0".join(sorted(requested)).encode())
    return h.digest()


def parse_cache_config(values: list) -> int:
    """The size in bytes from `--cache-config` values (`local,size=<bytes>`); 0 when none.
    Only the `local` cache exists here."""
    size = 0
    for value in values:
        kind, _, setting = value.partition(",")
        key, _, number = setting.partition("=")
        if kind != "local":
            raise ServerError(Code.INVALID_ARG, f"--cache-config: the '{kind}' cache is not "
                                                f"available (only 'local')")
        if key != "size" or not number.isdigit():
            raise ServerError(Code.INVALID_ARG, f"--cache-config: expected 'local,size=<bytes>', "
                                                f"got '{value}'")
        size = int(number)
    return size
