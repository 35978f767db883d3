"""The local response cache: keys, least-recently-used eviction, --cache-config."""

import pytest

from shmserve.errors import ServerError
from shmserve.extensions.response_cache import (CachedResponse, ResponseCache,
                                                parse_cache_config, request_key)
from shmserve.inference import InputTensor


def entry(nbytes: int) -> CachedResponse:
    return CachedResponse([("OUT", "UINT8", [nbytes], b"x" * nbytes)])


def test_the_least_recently_used_entries_go_first_and_oversized_ones_never_come_in():
    size = entry(1000).size
    cache = ResponseCache(3 * size)
    for key in (b"a", b"b", b"c"):
        cache.insert(key, entry(1000))
    assert cache.lookup(b"a") is not None  # now b is the least recently used
    cache.insert(b"d", entry(1000))
    assert cache.lookup(b"b") is None and cache.evictions == 1
    assert all(cache.lookup(k) is not None for k in (b"a", b"c", b"d"))
    cache.insert(b"huge", entry(4 * size))
    assert cache.lookup(b"huge") is None and len(cache) == 3 and cache.used == 3 * size


def key(inputs, requested=("OUT",), model="m", version=1):
    return request_key(model, version, [InputTensor(*t) for t in inputs], list(requested))


def test_the_key_names_everything_that_changes_the_answer_and_nothing_else():
    a = ("A", "INT32", [1], b"\1\0\0\0")
    b = ("B", "INT32", [1], b"\2\0\0\0")
    base = key([a, b])
    assert key([b, a]) == base  # the order inputs were sent in does not matter
    assert key([a, ("B", "INT32", [1], bytearray(b"\2\0\0\0"))]) == base
    different = [
        key([a, ("B", "INT32", [1], b"\3\0\0\0")]),  # data
        key([a, ("B", "UINT32", [1], b"\2\0\0\0")]),  # datatype
        key([a, ("B", "INT32", [1, 1], b"\2\0\0\0")]),  # shape
        key([a, b], requested=("OUT", "OTHER")),  # outputs asked for
        key([a, b], model="n"), key([a, b], version=2),
        key([("A", "INT32", [1], b"\1\0\0\0\2"), ("B", "INT32", [0], b"\0\0\0")]),  # boundaries
    ]
    assert base not in different and len(set(different)) == len(different)


def test_cache_config():
    assert parse_cache_config([]) == 0
    assert parse_cache_config(["local,size=1048576"]) == 1048576
    for bad in ("redis,host=x", "local,size=big", "local"):
        with pytest.raises(ServerError):
            parse_cache_config([bad])
