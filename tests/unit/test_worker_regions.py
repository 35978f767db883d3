"""A worker's mappings of client regions: inputs are views of the client's memory, outputs are
written into it, and nothing outside a region is ever touched."""

import mmap

import numpy as np
import posix_ipc
import pytest

from shmserve.ipc import messages
from workers.regions import ClientRegions, OutputTooLarge, RegionUnavailable

SIZE = 3 * mmap.PAGESIZE


@pytest.fixture
def client(shm_object):
    """(name, a mapping of it as the client sees it, its identity) of an object of 3 pages."""
    return shm_object(SIZE)


def _mapped(client, region_id=1, offset=0, byte_size=SIZE) -> ClientRegions:
    name, _, identity = client
    regions = ClientRegions(gpu_inputs=False)
    regions.map_system(messages.MapSystemRegion(region_id, name, offset, byte_size, identity))
    return regions


def test_an_input_is_a_writable_view_of_the_client_memory(client):
    _, mapping, _ = client
    regions = _mapped(client)
    mapping[100:104] = b"abcd"
    view = regions.input((1, 100, 4), "UINT8")
    assert bytes(view) == b"abcd"
    view[0:1] = b"z"
    assert mapping[100:101] == b"z"
    del view
    regions.close()


def test_an_unaligned_region_offset_is_honoured(client):
    _, mapping, _ = client
    regions = _mapped(client, offset=5000, byte_size=100)
    mapping[5000:5003] = b"xyz"
    assert bytes(regions.input((1, 0, 3), "UINT8")) == b"xyz"
    with pytest.raises(ValueError):
        regions.input((1, 98, 3), "UINT8")
    regions.close()


def test_outputs_are_written_in_place_and_must_fit(client):
    _, mapping, _ = client
    regions = _mapped(client, offset=4096, byte_size=64)
    array = np.arange(4, dtype=np.float32)
    assert regions.write((1, 8, 16), "OUT", array, None) == 16
    assert np.array_equal(np.frombuffer(mapping[4096 + 8:4096 + 24], np.float32), array)
    assert regions.write((1, 0, 7), "S", None, b"\x03\x00\x00\x00abc") == 7
    assert mapping[4096:4096 + 7] == b"\x03\x00\x00\x00abc"
    before = bytes(mapping)
    with pytest.raises(OutputTooLarge, match=r"\(12 bytes\) should be at least 16 bytes"):
        regions.write((1, 0, 12), "OUT", array, None)
    assert bytes(mapping) == before
    regions.close()


def test_a_replaced_object_is_refused(client):
    name, _, identity = client
    posix_ipc.unlink_shared_memory(name)
    again = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=0o600, size=SIZE)
    again.close_fd()
    regions = _mapped(client)
    with pytest.raises(RegionUnavailable, match="removed"):
        regions.input((1, 0, 4), "UINT8")


def test_a_missing_object_or_region_fails_cleanly(client):
    name, _, identity = client
    regions = ClientRegions(gpu_inputs=False)
    regions.map_system(messages.MapSystemRegion(7, "/shmtest_gone", 0, 16, identity))
    with pytest.raises(RegionUnavailable, match="shmtest_gone"):
        regions.input((7, 0, 4), "UINT8")
    with pytest.raises(RegionUnavailable, match="not mapped"):
        regions.input((8, 0, 4), "UINT8")


def test_unmap_leaves_views_the_model_kept_valid(client):
    _, mapping, _ = client
    regions = _mapped(client)
    mapping[0:2] = b"ok"
    kept = regions.input((1, 0, 2), "UINT8")
    regions.unmap(1)
    assert bytes(kept) == b"ok"  # no segfault: the mapping lives until its last view goes
    with pytest.raises(RegionUnavailable):
        regions.input((1, 0, 2), "UINT8")
