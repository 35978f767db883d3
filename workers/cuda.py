"""GPU arrays for workers, through cupy; the only module that imports cupy.

Importing this module never imports cupy: each function imports it on first use, so CPU-only
workers and machines without cupy or a GPU run unchanged.
"""

import ctypes
import functools
import sys


@functools.cache
def _cupy():
    try:
        import cupy
    except ImportError:
        return None
    return cupy


def device_count() -> int:
    cupy = _cupy()
    if cupy is None:
        return 0
    try:
        return cupy.cuda.runtime.getDeviceCount()
    except cupy.cuda.runtime.CUDARuntimeError:
        return 0


def available() -> bool:
    return device_count() > 0


def is_device_array(obj) -> bool:
    # A cupy array can only exist once cupy has been imported, so never import it here.
    cupy = sys.modules.get("cupy")
    return cupy is not None and isinstance(obj, cupy.ndarray)


def device_id(array) -> int:
    return array.device.id


def consumer_stream(device: int) -> int:
    """The stream value a DLPack consumer on `device` passes to a producer's __dlpack__."""
    cupy = _cupy()
    with cupy.cuda.Device(device):
        ptr = cupy.cuda.get_current_stream().ptr
    # DLPack reserves 0; the legacy default stream is spelled 1.
    return ptr or 1


def from_dlpack(exporter):
    """A cupy array viewing the device memory of an object with __dlpack__/__dlpack_device__."""
    return _cupy().from_dlpack(exporter)


def device_copy(array):
    """A C-contiguous copy of the device array `array`, on its GPU, in memory of this process."""
    cupy = _cupy()
    with array.device:
        return cupy.array(array, copy=True, order="C")


def to_numpy(array):
    return _cupy().asnumpy(array)


def concatenate(arrays):
    """The device arrays `arrays` joined along their first dimension, on the first one's GPU."""
    cupy = _cupy()
    with arrays[0].device:
        return cupy.concatenate(arrays)


def to_device(array, device: int):
    """A cupy copy of the host array `array` on GPU `device`."""
    cupy = _cupy()
    with cupy.cuda.Device(device):
        return cupy.asarray(array)


def open_ipc_handle(raw_handle: bytes, device: int) -> int:
    """The device pointer of another process's allocation, from its cudaIpcMemHandle_t."""
    cupy = _cupy()
    if cupy is None:
        raise RuntimeError("CUDA shared memory needs cupy in the worker (pip install "
                           "shmserve[gpu])")
    with cupy.cuda.Device(device):
        return cupy.cuda.runtime.ipcOpenMemHandle(raw_handle)


def synchronize(device: int) -> None:
    """Wait for the work this process queued on GPU `device`."""
    _cupy().cuda.Device(device).synchronize()


def close_ipc_handle(pointer: int, device: int) -> None:
    cupy = _cupy()
    with cupy.cuda.Device(device):
        cupy.cuda.runtime.ipcCloseMemHandle(pointer)


@functools.cache
def _libcuda():
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None


def gpu_uuid(device: int) -> str:
    """The UUID of CUDA device `device`, as NVML and Triton's metrics spell it
    ("GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"); empty where the driver cannot say. Asked of
    the driver, so that it works without cupy and never creates a context."""
    lib = _libcuda()
    if lib is None:
        return ""
    handle = ctypes.c_int()
    raw = (ctypes.c_ubyte * 16)()
    try:
        if lib.cuInit(0) != 0 or lib.cuDeviceGet(ctypes.byref(handle), device) != 0 \
                or lib.cuDeviceGetUuid(raw, handle) != 0:
            return ""
    except AttributeError:  # a driver older than the call (CUDA 9.2)
        return ""
    return uuid_text(bytes(raw))


def uuid_text(raw: bytes) -> str:
    h = raw.hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def allocation_size(pointer: int, device: int):
    """Bytes from `pointer` to the end of its allocation, or None when the driver cannot say
    (cupy wraps no call for it, so the driver is asked directly)."""
    found = _address_range(pointer, device)
    if found is None:
        return None
    base, size = found
    return size - (pointer - base)


def export(array) -> tuple:
    """(cudaIpcMemHandle_t, offset): how another process opens the C-contiguous device array
    `array`, once the work queued on its GPU is done. A handle names a whole allocation, and
    cupy's memory pool hands out pieces of larger ones: the offset says where in it."""
    cupy = _cupy()
    device = array.device
    with device:
        device.synchronize()
        pointer = array.data.ptr
        found = _address_range(pointer, device.id)
        if found is None:
            raise RuntimeError("the CUDA driver cannot say which allocation holds the array")
        base, _ = found
        return cupy.cuda.runtime.ipcGetMemHandle(base), pointer - base


def _address_range(pointer: int, device: int):
    """(base, size) of the allocation that holds `pointer`, or None."""
    lib = _libcuda()
    if lib is None:
        return None
    base = ctypes.c_uint64()
    size = ctypes.c_size_t()
    with _cupy().cuda.Device(device):
        status = lib.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size),
                                             ctypes.c_uint64(pointer))
    if status != 0:
        return None
    return base.value, size.value


def device_bytes(pointer: int, nbytes: int, device: int):
    """A cupy uint8 array over `nbytes` of device memory this process does not own."""
    cupy = _cupy()
    memory = cupy.cuda.UnownedMemory(pointer, nbytes, None, device)
    return cupy.ndarray((nbytes,), cupy.uint8, cupy.cuda.MemoryPointer(memory, 0))


def copy_into(dst, src) -> None:
    """Copy the uint8 array `src` (host or device) into the device uint8 array `dst`."""
    cupy = _cupy()
    with cupy.cuda.Device(dst.device.id):
        if is_device_array(src):
            cupy.copyto(dst, src)
        else:
            dst.set(src)
        cupy.cuda.get_current_stream().synchronize()
