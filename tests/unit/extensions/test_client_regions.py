"""The shared-memory extension's region table: registration checks, slices, and when the
workers that mapped a region are told to unmap it."""

import base64
import os

import posix_ipc
import pytest

from shmserve.errors import Code, ServerError
from shmserve.extensions.client_regions import (CUDA_IPC_HANDLE_SIZE, SharedMemoryManager,
                                              decode_raw_handle)
from shmserve.ipc.segments import Segment, segment_name


@pytest.fixture
def client_object():
    """A client's POSIX shared-memory object of 8 KiB, removed after the test."""
    name = f"/shmtest_unit_{os.getpid()}"
    shm = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=0o600, size=8192)
    shm.close_fd()
    yield name
    posix_ipc.unlink_shared_memory(name)


def _code(fn, *args, **kwargs) -> Code:
    with pytest.raises(ServerError) as info:
        fn(*args, **kwargs)
    return info.value.code


class FakeWorker:
    def __init__(self):
        self.unmapped = []

    def unmap_region(self, region_id):
        self.unmapped.append(region_id)


def test_register_status_unregister(client_object):
    m = SharedMemoryManager()
    m.register_system("a", client_object, 0, 4096)
    m.register_system("b", client_object, 4096, 4096)
    assert m.system_status() == [
        {"name": "a", "key": client_object, "offset": 0, "byte_size": 4096},
        {"name": "b", "key": client_object, "offset": 4096, "byte_size": 4096}]
    assert m.system_status("b") == [m.system_status()[1]]
    assert m.cuda_status() == []
    m.unregister_system("a")
    assert [s["name"] for s in m.system_status()] == ["b"]
    m.unregister_system()
    assert m.system_status() == []


def test_register_refusals(client_object):
    m = SharedMemoryManager()
    m.register_system("a", client_object, 0, 16)
    assert _code(m.register_system, "a", client_object, 0, 16) is Code.ALREADY_EXISTS
    # Triton answers INTERNAL to a key it cannot open; each is the client's mistake here.
    assert _code(m.register_system, "x", "/shmtest_no_such_object", 0, 16) is Code.NOT_FOUND
    assert _code(m.register_system, "x", client_object, 0, 8193) is Code.INVALID_ARG
    assert _code(m.register_system, "x", client_object, 4096, 4097) is Code.INVALID_ARG
    for key in ("/a/b", "/../../etc/passwd", "", "/", "/..", "/x\0y", "/" + "k" * 300):
        assert _code(m.register_system, "x", key, 0, 16) is Code.INVALID_ARG, key
    assert _code(m.register_system, "x", client_object, 0, 0) is Code.INVALID_ARG
    assert _code(m.register_system, "x", "triton_python_backend_shm_region_1", 0, 16) \
        is Code.INVALID_ARG
    assert [s["name"] for s in m.system_status()] == ["a"]


def test_a_server_segment_cannot_be_registered():
    segment = Segment.create(segment_name(os.getpid(), "unit-own"), 4096)
    try:
        m = SharedMemoryManager()
        assert _code(m.register_system, "x", segment.name, 0, 16) is Code.INVALID_ARG
    finally:
        segment.close()
        segment.unlink()


def test_disabled_refuses_register_and_unregister_but_not_status(client_object):
    m = SharedMemoryManager(allowed=False)
    assert _code(m.register_system, "a", client_object, 0, 16) is Code.UNSUPPORTED
    assert _code(m.unregister_system) is Code.UNSUPPORTED
    assert _code(m.register_cuda, "c", bytes(64), 0, 16) is Code.UNSUPPORTED
    assert m.system_status() == [] and m.cuda_status() == []


def test_status_of_an_unknown_region_is_not_found(client_object):
    m = SharedMemoryManager(gpu_count=1)
    m.register_cuda("gpu", bytes(CUDA_IPC_HANDLE_SIZE), 0, 1024)
    assert _code(m.system_status, "nope") is Code.NOT_FOUND
    # one namespace, two kinds: a CUDA region is no system region
    assert _code(m.system_status, "gpu") is Code.NOT_FOUND
    assert m.cuda_status("gpu") == [{"name": "gpu", "device_id": 0, "byte_size": 1024}]
    assert _code(m.register_system, "gpu", client_object, 0, 16) is Code.ALREADY_EXISTS


def test_cuda_register_checks_handle_and_device():
    m = SharedMemoryManager(gpu_count=1)
    assert _code(m.register_cuda, "c", bytes(63), 0, 16) is Code.INVALID_ARG
    assert _code(m.register_cuda, "c", bytes(64), 1, 16) is Code.INVALID_ARG
    assert _code(SharedMemoryManager(gpu_count=0).register_cuda, "c", bytes(64), 0, 16) \
        is Code.INVALID_ARG
    assert _code(decode_raw_handle, "not base64!") is Code.INVALID_ARG
    assert _code(decode_raw_handle, "AAEC") is Code.INVALID_ARG
    assert decode_raw_handle(base64.b64encode(bytes(range(64))).decode()) == bytes(range(64))


def test_slices_stay_inside_their_region(client_object):
    m = SharedMemoryManager()
    m.register_system("r", client_object, 4096, 1024)
    piece = m.slice({"shared_memory_region": "r", "shared_memory_byte_size": 24,
                           "shared_memory_offset": 1000})
    assert (piece.offset, piece.nbytes, piece.region.key) == (1000, 24, client_object)
    assert _code(m.slice, {"shared_memory_region": "r", "shared_memory_byte_size": 25,
                                 "shared_memory_offset": 1000}) is Code.INVALID_ARG
    assert _code(m.slice, {"shared_memory_region": "r", "shared_memory_byte_size": 0,
                                 "shared_memory_offset": 1024}) is Code.INVALID_ARG
    assert _code(m.slice, {"shared_memory_region": "r"}) is Code.INVALID_ARG
    assert _code(m.slice, {"shared_memory_region": "other",
                                 "shared_memory_byte_size": 4}) is Code.NOT_FOUND


def test_unmap_waits_for_the_last_request(client_object):
    m = SharedMemoryManager()
    m.register_system("r", client_object, 0, 64)
    region = m.slice({"shared_memory_region": "r", "shared_memory_byte_size": 64}).region
    worker = FakeWorker()
    region.mapped_by.add(worker)
    region.users += 1  # a request in flight
    m.unregister_system("r")
    assert worker.unmapped == []
    # As Triton since 2.53: listed, and usable, until the requests that use it end.
    assert [r["name"] for r in m.system_status()] == ["r"]
    assert _code(m.register_system, "r", client_object, 0, 64) is Code.ALREADY_EXISTS
    again = m.slice({"shared_memory_region": "r", "shared_memory_byte_size": 64}).region
    assert again is region
    region.users += 1  # another request
    region.release()
    assert worker.unmapped == [] and len(m.system_status()) == 1
    region.release()
    assert worker.unmapped == [region.region_id]
    assert m.system_status() == []
    assert _code(m.slice, {"shared_memory_region": "r",
                           "shared_memory_byte_size": 64}) is Code.NOT_FOUND
    m.register_system("r", client_object, 0, 64)  # the name is free again


def test_triton_s_key_and_overflow_texts(client_object):
    m = SharedMemoryManager()
    for key, text in (("//", "cannot register shared memory region 'x' - invalid shm key '//'"),
                      ("/triton_python_backend_shm_region_7",
                       "cannot register shared memory region 'x' with key "
                       "'/triton_python_backend_shm_region_7' as the key contains the reserved "
                       "prefix 'triton_python_backend_shm_region_'")):
        with pytest.raises(ServerError) as refused:
            m.register_system("x", key, 0, 16)
        assert (refused.value.code, refused.value.message) == (Code.INVALID_ARG, text)
    m.register_system("r", client_object, 0, 64)
    with pytest.raises(ServerError) as refused:
        m.slice({"shared_memory_region": "r", "shared_memory_byte_size": 2**64 - 32,
                 "shared_memory_offset": 32})
    assert refused.value.message == (
        "Integer overflow detected: byte_size (18446744073709551584) + offset (32) exceeds "
        "maximum value (18446744073709551615) for region 'r'")


def test_unregister_of_an_unused_region_unmaps_at_once(client_object):
    m = SharedMemoryManager()
    m.register_system("r", client_object, 0, 64)
    region = m.slice({"shared_memory_region": "r", "shared_memory_byte_size": 8}).region
    workers = [FakeWorker(), FakeWorker()]
    region.mapped_by.update(workers)
    m.unregister_system()
    assert [w.unmapped for w in workers] == [[region.region_id]] * 2
