"""System shared memory over both protocols: regions the probe creates, registered, used for
inputs and outputs (BYTES among them), unregistered, in order, with what the outputs placed in
the regions hold after each inference."""
import struct
import time

import grpc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from .calls import F4, M, T, grpc_answer, grpc_request, http_call, inp


SHM_IN, SHM_OUT, SHM_STR = "/shmserve_probe_in", "/shmserve_probe_out", "/shmserve_probe_str"


# SHM_STR: two BYTES elements at 0 (11 bytes), one whose length runs past its 6 bytes at 32.
STR_REGION = (struct.pack("<I", 2) + b"ab" + struct.pack("<I", 1) + b"c").ljust(32, b"\0") + \
    (struct.pack("<I", 9) + b"ab").ljust(32, b"\0")


def shm_answers(http_port, grpc_port):
    """Register, use and unregister system shared memory regions over both protocols, in
    order: each answer, and what the outputs placed in the regions hold."""
    import posix_ipc
    regions = []
    try:
        for key, data in ((SHM_IN, F4), (SHM_OUT, bytes(64)), (SHM_STR, STR_REGION)):
            shm = posix_ipc.SharedMemory(key, posix_ipc.O_CREX, size=len(data))
            with open(f"/dev/shm{key}", "r+b") as f:
                f.write(data)
            shm.close_fd()
            regions.append(shm)
        return _shm_answers(http_port, grpc_port)
    finally:
        for shm in regions:
            shm.unlink()


def _shm_answers(http_port, grpc_port):
    out = {}
    base = "/v2/systemsharedmemory"

    def region_bytes():
        with open(f"/dev/shm{SHM_OUT}", "rb") as f:
            return f.read(32).hex()

    def strings(input_region, in_size, shape, output_region, out_size, in_offset=0):
        return {"inputs": [{"name": "IN_BYTES", "shape": shape, "datatype": "BYTES", "parameters": {
                    "shared_memory_region": input_region, "shared_memory_byte_size": in_size,
                    "shared_memory_offset": in_offset}}],
                "outputs": [{"name": "OUT_BYTES", "parameters": {
                    "shared_memory_region": output_region, "shared_memory_byte_size": out_size}}]}

    def infer(input_region, output_region, out_size=16, in_size=16, in_offset=0):
        return {"inputs": [inp(data=None, parameters={
                    "shared_memory_region": input_region, "shared_memory_byte_size": in_size,
                    "shared_memory_offset": in_offset})],
                "outputs": [{"name": "OUTPUT0", "parameters": {
                    "shared_memory_region": output_region, "shared_memory_byte_size": out_size}}]}

    steps = [
        ("shm register in", "POST", base + "/region/in/register", {"key": SHM_IN, "offset": 0, "byte_size": 16}),
        ("shm register in again", "POST", base + "/region/in/register", {"key": SHM_IN, "offset": 0, "byte_size": 16}),
        ("shm register out", "POST", base + "/region/out/register", {"key": SHM_OUT, "offset": 0, "byte_size": 64}),
        ("shm register past the end", "POST", base + "/region/far/register", {"key": SHM_OUT, "offset": 100, "byte_size": 16}),
        ("shm register no key", "POST", base + "/region/nokey/register", {"offset": 0, "byte_size": 16}),
        ("shm status after register", "GET", base + "/status", None),
        ("shm status of in", "GET", base + "/region/in/status", None),
        ("shm infer", "POST", M + "/infer", infer("in", "out")),
        ("shm infer input larger than region", "POST", M + "/infer", infer("in", "out", in_size=32)),
        ("shm infer input offset past region", "POST", M + "/infer", infer("in", "out", in_offset=8)),
        ("shm infer output region too small", "POST", M + "/infer", infer("in", "out", out_size=8)),
        ("shm infer unknown region", "POST", M + "/infer", infer("nope", "out")),
        ("shm unregister in", "POST", base + "/region/in/unregister", None),
        ("shm infer after unregister", "POST", M + "/infer", infer("in", "out")),
        ("shm unregister all", "POST", base + "/unregister", None),
        ("shm status after unregister", "GET", base + "/status", None),
        # BYTES in and out of regions (all_types).
        ("shm register str", "POST", base + "/region/str/register", {"key": SHM_STR, "offset": 0, "byte_size": 64}),
        ("shm register out2", "POST", base + "/region/out2/register", {"key": SHM_OUT, "offset": 0, "byte_size": 64}),
        ("shm infer BYTES", "POST", T, strings("str", 11, [2], "out2", 64)),
        ("shm infer BYTES output region too small", "POST", T, strings("str", 11, [2], "out2", 8)),
        ("shm infer BYTES past the end", "POST", T, strings("str", 6, [1], "out2", 64, in_offset=32)),
        ("shm infer BYTES fewer elements", "POST", T, strings("str", 11, [3], "out2", 64)),
        ("shm infer BYTES elements beyond its bytes", "POST", T, strings("str", 4, [2], "out2", 64)),
        ("shm infer size 0", "POST", T, strings("str", 0, [0], "out2", 64)),
        ("shm infer with data too", "POST", T, {"inputs": [{
            "name": "IN_BYTES", "shape": [1], "datatype": "BYTES", "data": ["x"], "parameters": {
                "shared_memory_region": "str", "shared_memory_byte_size": 11}}]}),
        ("shm infer output in a region and binary", "POST", T, {"inputs": [
            {"name": "IN_INT32", "shape": [1], "datatype": "INT32", "data": [1]}],
            "outputs": [{"name": "OUT_INT32", "parameters": {
                "shared_memory_region": "out2", "shared_memory_byte_size": 4, "binary_data": True}}]}),
        ("shm infer output offset", "POST", T, {"inputs": [
            {"name": "IN_INT32", "shape": [1], "datatype": "INT32", "data": [0x01020304]}],
            "outputs": [{"name": "OUT_INT32", "parameters": {
                "shared_memory_region": "out2", "shared_memory_byte_size": 4, "shared_memory_offset": 20}}]}),
        ("shm unregister all again", "POST", base + "/unregister", None),
    ]
    for name, method, path, body in steps:
        out[name] = http_call(http_port, method, path, body)
        if "infer" in name:
            out[name + ": region"] = region_bytes()
    channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
    stub = pb_grpc.GRPCInferenceServiceStub(channel)
    request = grpc_request(raw=())
    request.inputs[0].parameters["shared_memory_region"].string_param = "gin"
    request.inputs[0].parameters["shared_memory_byte_size"].int64_param = 16
    wanted = request.outputs.add(name="OUTPUT0")
    wanted.parameters["shared_memory_region"].string_param = "gout"
    wanted.parameters["shared_memory_byte_size"].int64_param = 16
    calls = [
        ("grpc shm register in", "SystemSharedMemoryRegister", pb.SystemSharedMemoryRegisterRequest(
            name="gin", key=SHM_IN, byte_size=16)),
        ("grpc shm register in again", "SystemSharedMemoryRegister", pb.SystemSharedMemoryRegisterRequest(
            name="gin", key=SHM_IN, byte_size=16)),
        ("grpc shm register out", "SystemSharedMemoryRegister", pb.SystemSharedMemoryRegisterRequest(
            name="gout", key=SHM_OUT, byte_size=64)),
        ("grpc shm status", "SystemSharedMemoryStatus", pb.SystemSharedMemoryStatusRequest()),
        ("grpc shm register unaligned offset", "SystemSharedMemoryRegister",
         pb.SystemSharedMemoryRegisterRequest(name="gmid", key=SHM_OUT, offset=16, byte_size=48)),
        ("grpc shm infer", "ModelInfer", request),
        ("grpc shm unregister all", "SystemSharedMemoryUnregister", pb.SystemSharedMemoryUnregisterRequest()),
        ("grpc shm infer after unregister", "ModelInfer", request),
    ]
    for name, method, message in calls:
        if "unregister" in name:
            # Triton holds a region until it has released the last request that used it,
            # a moment after answering; unregistered before then, it refuses ("Failed to
            # unregister").
            time.sleep(0.1)
        out[name] = grpc_answer(stub, method, message)
        if "infer" in name:
            out[name + ": region"] = region_bytes()
    channel.close()
    return out
