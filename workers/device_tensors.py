"""Tensors that go from one GPU instance to another without leaving the GPU: an ensemble's
intermediates (see the KeptOnDevice and OnDevice locations in shmserve/ipc/locations.py).

The producing instance keeps a copy of the array its model made (`KeptOutputs`) and describes
it by the CUDA IPC handle of the allocation the copy lies in; the front passes that on as an
input of the next step. The reading instance opens the handle for one batch (`DeviceInputs`) and closes it before it
answers, so the producer may let the array go once every reader has answered: no handle is
still open when the memory behind it returns to the producer's pool, or to the driver.

An instance reading a tensor it kept itself (one model in two steps) uses the pointer it has:
CUDA opens no handle in the process that made it.
"""

import itertools
import threading

from shmserve.ipc.locations import KeptOnDevice, OnDevice
from workers import cuda
from workers.regions import ClientRegions


class KeptOutputs:
    """Device arrays this instance keeps until the front releases them, by keep id."""

    def __init__(self):
        self._arrays: dict = {}  # keep id -> (array, its allocation's handle)
        self._ids = itertools.count(1)
        # Handle -> [base pointer of its allocation, arrays kept in it]: a handle is only
        # read while an array in its allocation is kept.
        self.exported: dict = {}
        # Decoupled models answer from their own threads.
        self._lock = threading.Lock()

    def keep(self, array) -> KeptOnDevice:
        """The location of a copy of the device array `array`, kept from now
        on. A copy on the GPU costs little, and the model may reuse its array in its next
        batch while the reader still reads, or have it from memory it does not own (a
        client's region) and which no handle of its own could name."""
        array = cuda.device_copy(array)
        raw_handle, offset = cuda.export(array)
        keep_id = next(self._ids)
        with self._lock:
            self._arrays[keep_id] = (array, raw_handle)
            entry = self.exported.setdefault(raw_handle, [array.data.ptr - offset, 0])
            entry[1] += 1
        return KeptOnDevice(raw_handle, array.device.id, offset, array.nbytes, keep_id)

    def release(self, keep_ids: list) -> None:
        with self._lock:
            for keep_id in keep_ids:
                kept = self._arrays.pop(keep_id, None)
                if kept is None:
                    continue
                entry = self.exported[kept[1]]
                entry[1] -= 1
                if entry[1] == 0:
                    del self.exported[kept[1]]

    def __len__(self) -> int:
        return len(self._arrays)


class DeviceInputs:
    """Inputs of one batch that lie in other instances' device memory."""

    def __init__(self, kept: KeptOutputs, regions: ClientRegions):
        self._kept = kept
        # The model gets these as it gets a client's CUDA region: on the GPU if it asked for
        # GPU inputs, else as a host copy.
        self._regions = regions
        self._opened: list = []  # (pointer, device) of the handles this batch opened

    def input(self, location: OnDevice, datatype: str):
        """A cupy uint8 view of the tensor (a host memoryview for a model that takes host
        inputs); ValueError when its handle cannot be opened."""
        raw_handle, device = location.raw_handle, location.device_id
        own = self._kept.exported.get(raw_handle)
        if own is not None:
            base = own[0]
        else:
            try:
                base = cuda.open_ipc_handle(raw_handle, device)
            except Exception as exc:  # cupy's CUDA errors have no common base worth naming
                raise ValueError(f"the device memory of another instance's output cannot be "
                                 f"opened: {exc}") from None
            # Opening one handle twice counts twice, so each open is closed.
            self._opened.append((base, device))
        return self._regions.for_model(
            cuda.device_bytes(base + location.offset, location.nbytes, device), datatype)

    def close(self) -> None:
        """The batch is done, and the model holds no input past it (as in Triton). Work it
        queued on the GPU may still read them: that ends first."""
        opened, self._opened = self._opened, []
        for device in {device for _, device in opened}:
            cuda.synchronize(device)
        for pointer, device in opened:
            cuda.close_ipc_handle(pointer, device)
