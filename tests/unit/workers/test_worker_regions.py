"""A worker's mappings of client regions: inputs are views of the client's memory, outputs are
written into it, and nothing outside a region is ever touched."""

import mmap

import numpy as np
import posix_ipc
import pytest

from shmserve.ipc import messages
from shmserve.ipc.locations import InRegion
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
    view = regions.input(InRegion(1, 100, 4), "UINT8")
    assert bytes(view) == b"abcd"
    view[0:1] = b"z"
    assert mapping[100:101] == b"z"
    del view
    regions.close()


def test_an_unaligned_region_offset_is_honoured(client):
    _, mapping, _ = client
    regions = _mapped(client, offset=5000, byte_size=100)
    mapping[5000:5003] = b"xyz"
    assert bytes(regions.input(InRegion(1, 0, 3), "UINT8")) == b"xyz"
    with pytest.raises(ValueError):
        regions.input(InRegion(1, 98, 3), "UINT8")
    regions.close()


def test_outputs_are_written_in_place_and_must_fit(client):
    _, mapping, _ = client
    regions = _mapped(client, offset=4096, byte_size=64)
    array = np.arange(4, dtype=np.float32)
    assert regions.write(InRegion(1, 8, 16), "OUT", array, None) == 16
    assert np.array_equal(np.frombuffer(mapping[4096 + 8:4096 + 24], np.float32), array)
    assert regions.write(InRegion(1, 0, 7), "S", None, b"\x03\x00\x00\x00abc") == 7
    assert mapping[4096:4096 + 7] == b"\x03\x00\x00\x00abc"
    before = bytes(mapping)
    with pytest.raises(OutputTooLarge, match=r"\(12 bytes\) should be at least 16 bytes"):
        regions.write(InRegion(1, 0, 12), "OUT", array, None)
    assert bytes(mapping) == before
    regions.close()


def test_a_replaced_object_is_refused(client):
    name, _, identity = client
    posix_ipc.unlink_shared_memory(name)
    again = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=0o600, size=SIZE)
    again.close_fd()
    regions = _mapped(client)
    with pytest.raises(RegionUnavailable, match="removed"):
        regions.input(InRegion(1, 0, 4), "UINT8")


def test_a_missing_object_or_region_fails_cleanly(client):
    name, _, identity = client
    regions = ClientRegions(gpu_inputs=False)
    regions.map_system(messages.MapSystemRegion(7, "/shmtest_gone", 0, 16, identity))
    with pytest.raises(RegionUnavailable, match="shmtest_gone"):
        regions.input(InRegion(7, 0, 4), "UINT8")
    with pytest.raises(RegionUnavailable, match="not mapped"):
        regions.input(InRegion(8, 0, 4), "UINT8")


def test_unmap_leaves_views_the_model_kept_valid(client):
    _, mapping, _ = client
    regions = _mapped(client)
    mapping[0:2] = b"ok"
    kept = regions.input(InRegion(1, 0, 2), "UINT8")
    regions.unmap(1)
    assert bytes(kept) == b"ok"  # no segfault: the mapping lives until its last view goes
    with pytest.raises(RegionUnavailable):
        regions.input(InRegion(1, 0, 2), "UINT8")


# --- CUDA regions, with a stand-in for workers/cuda.py (no GPU here) ----------------------------

class DeviceArray(np.ndarray):
    """Stands for a cupy array over another process's device memory."""


class FakeCuda:
    """The calls workers/regions.py makes into workers/cuda.py, over host buffers named by
    handle: what is opened, and what is closed."""

    def __init__(self, allocations: dict):
        self.allocations = allocations  # raw handle -> bytearray (the client's allocation)
        self.opened = []
        self.closed = []
        self._by_pointer = {}

    def install(self, monkeypatch):
        from workers import cuda
        for name in ("open_ipc_handle", "close_ipc_handle", "allocation_size", "device_bytes",
                     "to_numpy", "copy_into", "is_device_array"):
            monkeypatch.setattr(cuda, name, getattr(self, name))
        return self

    def open_ipc_handle(self, raw_handle, device):
        if raw_handle not in self.allocations:
            raise RuntimeError("cudaErrorInvalidResourceHandle")
        pointer = 0x7000_0000 + 0x1000 * len(self.opened)
        self.opened.append(raw_handle)
        self._by_pointer[pointer] = self.allocations[raw_handle]
        return pointer

    def close_ipc_handle(self, pointer, device):
        self.closed.append(pointer)

    def allocation_size(self, pointer, device):
        return len(self._by_pointer[pointer])

    def device_bytes(self, pointer, nbytes, device):
        host = np.frombuffer(self._by_pointer[pointer], np.uint8)
        return host[:nbytes].view(DeviceArray)

    def to_numpy(self, array):
        return np.array(array.view(np.ndarray))

    def copy_into(self, dst, src):
        dst[...] = src

    def is_device_array(self, obj):
        return isinstance(obj, DeviceArray)


@pytest.fixture
def fake_cuda(monkeypatch):
    """A FakeCuda holding one 64-byte allocation, of handle b"h1"."""
    return FakeCuda({b"h1": bytearray(64)}).install(monkeypatch)


def _cuda_mapped(*, gpu_inputs, handle=b"h1", byte_size=64, region_id=7):
    regions = ClientRegions(gpu_inputs=gpu_inputs)
    regions.map_cuda(messages.MapCudaRegion(region_id, handle, 0, byte_size))
    return regions


def test_a_cuda_region_is_opened_once_and_closed_on_unmap(fake_cuda):
    fake = fake_cuda
    fake.allocations[b"h1"][:] = range(64)
    regions = _cuda_mapped(gpu_inputs=True)
    for _ in range(3):
        assert bytes(regions.input(InRegion(7, 8, 4), "UINT8").view(np.ndarray)) == bytes([8, 9, 10, 11])
    assert len(fake.opened) == 1 and fake.closed == []
    assert not regions.in_host_memory(7)
    regions.unmap(7)
    assert len(fake.closed) == 1
    with pytest.raises(RegionUnavailable, match="not mapped"):
        regions.input(InRegion(7, 0, 4), "UINT8")
    regions.close()
    assert len(fake.closed) == 1


def test_a_gpu_model_reads_a_cuda_input_in_place_and_others_get_a_host_copy(fake_cuda):
    memory = fake_cuda.allocations[b"h1"]
    on_gpu = _cuda_mapped(gpu_inputs=True)
    view = on_gpu.input(InRegion(7, 0, 4), "FP32")
    assert isinstance(view, DeviceArray)
    view[0] = 42  # the model writes into its input: the client's memory changes
    assert memory[0] == 42
    # BYTES inputs are parsed on the host, so even a GPU model gets them copied.
    assert isinstance(on_gpu.input(InRegion(7, 0, 4), "BYTES"), memoryview)
    on_cpu = _cuda_mapped(gpu_inputs=False)
    host = on_cpu.input(InRegion(7, 0, 4), "FP32")
    assert isinstance(host, memoryview) and host[0] == 42
    host[0] = 1
    assert memory[0] == 42  # a copy
    on_gpu.close()
    on_cpu.close()
    assert len(fake_cuda.closed) == 2


def test_outputs_are_written_into_the_cuda_region_within_bounds(fake_cuda):
    memory = fake_cuda.allocations[b"h1"]
    regions = _cuda_mapped(gpu_inputs=True)
    out = np.arange(4, dtype=np.float32)
    assert regions.write(InRegion(7, 16, 16), "OUT", out, None) == 16
    assert np.frombuffer(memory, np.float32, 4, 16).tolist() == [0, 1, 2, 3]
    device_out = np.arange(2, dtype=np.float32).view(DeviceArray)
    assert regions.write(InRegion(7, 0, 8), "OUT", device_out, None) == 8  # device to device
    assert np.frombuffer(memory, np.float32, 2, 0).tolist() == [0, 1]
    with pytest.raises(OutputTooLarge, match="should be at least 16 bytes"):
        regions.write(InRegion(7, 0, 8), "OUT", out, None)
    with pytest.raises(RegionUnavailable, match="outside the region of 64 bytes"):
        regions.write(InRegion(7, 56, 16), "OUT", out, None)
    assert memory[56:] == bytes(8)
    regions.close()


def test_a_cuda_region_larger_than_its_allocation_or_a_bad_handle_is_refused(fake_cuda):
    fake = fake_cuda
    too_big = _cuda_mapped(gpu_inputs=True, byte_size=65)
    with pytest.raises(RegionUnavailable, match="exceeds the 64-byte CUDA allocation"):
        too_big.input(InRegion(7, 0, 4), "UINT8")
    assert len(fake.opened) == 1 and len(fake.closed) == 1  # opened, refused, closed at once
    bad = _cuda_mapped(gpu_inputs=True, handle=b"stale")
    with pytest.raises(RegionUnavailable,
                       match="cannot be opened: cudaErrorInvalidResourceHandle"):
        bad.input(InRegion(7, 0, 4), "UINT8")
    too_big.close()
    bad.close()
    assert len(fake.closed) == 1
