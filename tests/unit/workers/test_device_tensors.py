"""Device tensors between instances (workers/device_tensors.py), over a stand-in for the CUDA
calls: what a producer keeps and for how long, which handles a reader opens, and that each is
closed when its batch is done. The real GPU path is in tests/e2e/test_gpu_ensemble.py."""

import types

import numpy as np
import pytest

from shmserve.ipc.locations import KeptOnDevice, OnDevice
from workers import cuda
from workers.device_tensors import DeviceInputs, KeptOutputs
from workers.regions import ClientRegions


class DeviceArray(np.ndarray):
    """Stands for a cupy array: host memory the fake driver knows by address."""


class FakeDriver:
    def __init__(self):
        self.memory = {}  # base pointer -> bytearray (an allocation)
        self.handles = {}  # raw handle -> base pointer
        self.opened = []
        self.closed = []
        self.synchronized = False

    def allocate(self, handle: bytes, base: int, data: bytes):
        self.memory[base] = bytearray(data)
        self.handles[handle] = base

    def array_at(self, base: int, offset: int, nbytes: int):
        """A device array of `nbytes` at `offset` in the allocation at `base`."""
        array = np.frombuffer(self.memory[base], np.uint8)[offset:offset + nbytes]
        array = array.view(DeviceArray)
        array.pointer = base + offset
        return array

    def install(self, monkeypatch):
        for name in ("device_copy", "export", "open_ipc_handle", "close_ipc_handle",
                     "device_bytes", "to_numpy", "synchronize"):
            monkeypatch.setattr(cuda, name, getattr(self, name))
        return self

    def device_copy(self, array):
        return array  # in place: the tests choose where it lies

    def export(self, array):
        pointer = array.data.ptr
        for handle, base in self.handles.items():
            if base <= pointer < base + len(self.memory[base]):
                return handle, pointer - base
        raise RuntimeError("not an allocation")

    def open_ipc_handle(self, raw_handle, device):
        if raw_handle not in self.handles:
            raise RuntimeError("cudaErrorInvalidResourceHandle")
        self.opened.append(raw_handle)
        return self.handles[raw_handle]

    def close_ipc_handle(self, pointer, device):
        assert self.synchronized, "closed while queued work may still read it"
        self.closed.append(pointer)

    def synchronize(self, device):
        self.synchronized = True

    def device_bytes(self, pointer, nbytes, device):
        for base, memory in self.memory.items():
            if base <= pointer < base + len(memory):
                return self.array_at(base, pointer - base, nbytes)
        raise AssertionError("no such memory")

    def to_numpy(self, array):
        return np.array(array.view(np.ndarray))


@pytest.fixture
def driver(monkeypatch):
    fake = FakeDriver().install(monkeypatch)
    fake.allocate(b"mine", 0x1000, bytes(range(64)))
    fake.allocate(b"theirs", 0x9000, bytes(range(100, 164)))
    return fake


def _with_device(array):
    """What KeptOutputs reads of a cupy array."""
    return types.SimpleNamespace(data=types.SimpleNamespace(ptr=array.pointer),
                                 device=types.SimpleNamespace(id=0), nbytes=array.nbytes)


def test_a_kept_output_is_described_by_its_allocations_handle_until_released(driver):
    kept = KeptOutputs()
    first = kept.keep(_with_device(driver.array_at(0x1000, 16, 8)))
    second = kept.keep(_with_device(driver.array_at(0x1000, 32, 4)))
    assert first == KeptOnDevice(b"mine", 0, 16, 8, first.keep_id)
    assert second == KeptOnDevice(b"mine", 0, 32, 4, second.keep_id)
    assert first.keep_id != second.keep_id and len(kept) == 2
    kept.release([first.keep_id])
    assert len(kept) == 1 and b"mine" in kept.exported
    kept.release([second.keep_id, second.keep_id, 12345])  # twice, and unknown: no harm
    assert len(kept) == 0 and kept.exported == {}


def test_a_reader_opens_another_instances_handle_for_one_batch(driver):
    inputs = DeviceInputs(KeptOutputs(), ClientRegions(gpu_inputs=True))
    view = inputs.input(OnDevice(b"theirs", 0, 4, 3), "UINT8")
    assert isinstance(view, DeviceArray) and bytes(view) == bytes([104, 105, 106])
    inputs.input(OnDevice(b"theirs", 0, 0, 1), "UINT8")
    # Opening one handle twice counts twice in CUDA: both are closed.
    assert driver.opened == [b"theirs", b"theirs"] and driver.closed == []
    inputs.close()
    assert driver.closed == [0x9000, 0x9000]
    inputs.close()
    assert len(driver.closed) == 2


def test_a_model_that_takes_host_inputs_gets_a_host_copy(driver):
    inputs = DeviceInputs(KeptOutputs(), ClientRegions(gpu_inputs=False))
    view = inputs.input(OnDevice(b"theirs", 0, 0, 2), "UINT8")
    assert isinstance(view, memoryview) and bytes(view) == bytes([100, 101])
    inputs.close()
    assert driver.closed == [0x9000]


def test_a_tensor_this_instance_kept_is_read_without_opening_its_handle(driver):
    kept = KeptOutputs()
    location = kept.keep(_with_device(driver.array_at(0x1000, 8, 4)))
    inputs = DeviceInputs(kept, ClientRegions(gpu_inputs=True))
    as_input = OnDevice(location.raw_handle, location.device_id, location.offset,
                        location.nbytes)
    assert bytes(inputs.input(as_input, "UINT8")) == bytes([8, 9, 10, 11])
    inputs.close()
    assert driver.opened == [] and driver.closed == []


def test_a_handle_that_cannot_be_opened_is_a_clear_error(driver):
    inputs = DeviceInputs(KeptOutputs(), ClientRegions(gpu_inputs=True))
    with pytest.raises(ValueError, match="another instance's output cannot be opened: "
                                         "cudaErrorInvalidResourceHandle"):
        inputs.input(OnDevice(b"gone", 0, 0, 4), "FP32")
    inputs.close()
    assert driver.closed == []
