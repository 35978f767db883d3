import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shmserve.ipc.allocator import ArenaAllocator


def test_blocks_are_aligned_and_padding_counts_as_used():
    arena = ArenaAllocator(1024, alignment=64)
    assert arena.alloc(1) == 0
    assert arena.alloc(65) == 64
    assert arena.alloc(64) == 192
    assert arena.used == 256
    assert arena.largest_free() == 768


def test_returns_none_when_nothing_fits_and_recovers_after_free():
    arena = ArenaAllocator(256, alignment=64)
    first = arena.alloc(128)
    assert arena.alloc(192) is None
    assert arena.alloc(128) == 128
    assert arena.alloc(1) is None
    arena.free(first)
    assert arena.alloc(100) == first


def test_best_fit_takes_the_smallest_hole_that_fits():
    arena = ArenaAllocator(1024, alignment=64)
    a, _, b, _ = (arena.alloc(n) for n in (128, 64, 64, 64))
    arena.free(a)  # 128-byte hole at 0
    arena.free(b)  # 64-byte hole at 192
    assert arena.alloc(64) == b
    assert arena.alloc(64) == a


def test_odd_capacity_tail_is_handed_out_whole():
    arena = ArenaAllocator(100, alignment=64)
    assert arena.alloc(64) == 0
    assert arena.alloc(36) == 64
    assert arena.used == 100
    arena.free(0)
    arena.free(64)
    assert arena.alloc(100) == 0


def test_freeing_between_free_neighbours_coalesces_both_sides():
    arena = ArenaAllocator(4096, alignment=64)
    blocks = [arena.alloc(1000) for _ in range(4)]
    arena.free(blocks[0])
    arena.free(blocks[2])
    arena.free(blocks[1])
    assert arena.largest_free() == 4096 - 1024
    arena.free(blocks[3])
    assert arena.largest_free() == 4096
    assert arena.used == 0


def test_double_free_and_unknown_offsets_are_errors():
    arena = ArenaAllocator(1024)
    offset = arena.alloc(100)
    with pytest.raises(ValueError):
        arena.free(offset + 64)
    with pytest.raises(ValueError):
        arena.free(-1)
    arena.free(offset)
    with pytest.raises(ValueError):
        arena.free(offset)
    assert arena.largest_free() == 1024


def test_zero_byte_blocks_consume_nothing_and_free_freely():
    arena = ArenaAllocator(128, alignment=64)
    assert arena.alloc(128) == 0
    assert arena.alloc(0) == 128
    assert arena.alloc(0) == 128
    assert arena.used == 128
    arena.free(128)
    arena.free(128)
    arena.free(0)
    assert arena.largest_free() == 128


def test_empty_arena():
    arena = ArenaAllocator(0)
    assert arena.largest_free() == 0
    assert arena.alloc(1) is None
    assert arena.alloc(0) == 0
    arena.free(0)


@pytest.mark.parametrize("capacity, alignment", [(-1, 64), (64, 0), (64, 48), (64, -64)])
def test_bad_arguments(capacity, alignment):
    with pytest.raises(ValueError):
        ArenaAllocator(capacity, alignment)


def test_negative_size_is_an_error():
    with pytest.raises(ValueError):
        ArenaAllocator(64).alloc(-1)


@settings(max_examples=300, deadline=None)
@given(
    capacity=st.integers(0, 1 << 14),
    alignment=st.sampled_from([1, 8, 64, 4096]),
    ops=st.lists(st.tuples(st.booleans(), st.integers(0, 1 << 12)), max_size=150),
    data=st.data(),
)
def test_random_alloc_free_sequences(capacity, alignment, ops, data):
    arena = ArenaAllocator(capacity, alignment)
    live: dict[int, int] = {}
    for is_alloc, n in ops:
        if is_alloc or not live:
            fits = n <= arena.largest_free()
            offset = arena.alloc(n)
            if n == 0:
                assert offset == capacity
                continue
            assert (offset is not None) == fits
            if offset is None:
                continue
            assert offset % alignment == 0
            assert 0 <= offset and offset + n <= capacity
            assert all(offset + n <= o or o + m <= offset for o, m in live.items())
            live[offset] = n
        else:
            offset = sorted(live)[n % len(live)]
            del live[offset]
            arena.free(offset)
        padded = sum(-(-m // alignment) * alignment for m in live.values())
        assert sum(live.values()) <= arena.used <= min(padded, capacity)
        assert arena.largest_free() <= capacity - arena.used

    for offset in data.draw(st.permutations(sorted(live))):
        arena.free(offset)
    assert arena.used == 0
    assert arena.largest_free() == capacity
    if live:
        with pytest.raises(ValueError):
            arena.free(next(iter(live)))
