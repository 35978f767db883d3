"""A batch's inputs as one block, through a real WorkerHandle and worker process: inline and
input-arena blocks round-trip, the arena slot comes back, and a batched model sees each input
of the batch as one array."""

import asyncio
import textwrap

import numpy as np
import pytest

from shmserve.dispatch import batch_layout, instance_memory
from shmserve.dispatch.work_types import DeviceTensor, WorkInput, WorkRequest
from shmserve.dispatch.worker import WorkerHandle
from shmserve.ipc import datatypes, messages
from shmserve.ipc.locations import KeptOnDevice, OnDevice

CONFIG = {
    "name": "block",
    "backend": "python",
    "max_batch_size": 8,
    "input": [
        {"name": "A", "data_type": "TYPE_FP32", "dims": [-1]},
        {"name": "B", "data_type": "TYPE_INT8", "dims": [-1], "optional": True},
        {"name": "S", "data_type": "TYPE_STRING", "dims": [-1], "optional": True},
    ],
    "output": [
        {"name": "A_OUT", "data_type": "TYPE_FP32", "dims": [-1]},
        {"name": "B_OUT", "data_type": "TYPE_INT8", "dims": [-1]},
        {"name": "S_OUT", "data_type": "TYPE_STRING", "dims": [-1]},
        {"name": "A_SHARED", "data_type": "TYPE_BOOL", "dims": [1]},
    ],
}

# Echoes its inputs; A_SHARED says whether the request's A is a view of batched_input's array.
MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        whole = pb_utils.batched_input(requests, "A")
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "A").as_numpy()
            shared = np.full((len(a), 1), np.shares_memory(a, whole))
            outputs = [pb_utils.Tensor("A_OUT", a.copy()), pb_utils.Tensor("A_SHARED", shared)]
            for name in ("B", "S"):
                tensor = pb_utils.get_input_tensor_by_name(request, name)
                if tensor is not None:
                    outputs.append(pb_utils.Tensor(name + "_OUT", tensor.as_numpy()))
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
"""


@pytest.fixture
def model_dir(tmp_path):
    (tmp_path / "block" / "1").mkdir(parents=True)
    (tmp_path / "block" / "1" / "model.py").write_text(textwrap.dedent(MODEL))
    return tmp_path


def run_with_worker(model_dir, body):
    async def go():
        handle = WorkerHandle(model_name="block", model_version=1,
                              model_dir=str(model_dir / "block"),
                              model_repository=str(model_dir), model_config=CONFIG,
                              instance_name="block_0", instance_kind="CPU", device_id=0)
        await handle.start()
        try:
            await body(handle)
        finally:
            await handle.stop()
    asyncio.run(go())


def request(request_id, **inputs):
    work_inputs = []
    for name, array in inputs.items():
        if array.dtype == np.object_:
            work_inputs.append(WorkInput(name, "BYTES", list(array.shape),
                                         datatypes.serialize_bytes(array.reshape(-1))))
        else:
            data = array.tobytes()
            work_inputs.append(WorkInput(name, datatypes.wire_from_numpy(array.dtype),
                                         list(array.shape), memoryview(data)))
    return WorkRequest(request_id, 0, 0, {}, work_inputs, ["A_OUT", "B_OUT", "S_OUT", "A_SHARED"])


async def execute(handle, batch):
    """{output name: array} per request, copied out; the output slots are released."""
    responses, _ = await handle.execute(batch)
    results = []
    for response in responses:
        assert response.error is None, response.error
        out = {}
        for o in response.outputs:
            if o.datatype == "BYTES":
                out[o.name] = datatypes.deserialize_bytes(o.data)
            else:
                out[o.name] = np.frombuffer(o.data, datatypes.numpy_dtype(o.datatype)).copy()
        if response.release is not None:
            response.release()
        results.append(out)
    return results


def test_layout_is_input_major_with_aligned_runs():
    batch = [WorkRequest("r0", 0, 0, {}, [WorkInput("B", "INT8", [1, 3], b"bbb"),
                                          WorkInput("A", "FP32", [1, 1], b"a0a0")], []),
             WorkRequest("r1", 0, 0, {}, [WorkInput("A", "FP32", [2, 1], memoryview(b"a1a1a1a1"))],
                         []),
             WorkRequest("r2", 0, 0, {}, [WorkInput("A", "FP32", [1, 1], b"a2a2"),
                                          WorkInput("B", "INT8", [1, 3], b"BBB")], [])]
    frames, pieces, size = batch_layout.layout(batch, [0, 1, 2])
    block = b"".join(pieces)
    assert size == len(block) == batch_layout.BLOCK_ALIGNMENT + 16
    assert block[:6] == b"bbbBBB" and block[batch_layout.BLOCK_ALIGNMENT:] == b"a0a0a1a1a1a1a2a2"
    assert [f.request_id for f in frames] == ["r0", "r1", "r2"]
    assert [[(r.name, r.shape) for r in f.inputs] for f in frames] == [
        [("B", [1, 3]), ("A", [1, 1])], [("A", [2, 1])], [("A", [1, 1]), ("B", [1, 3])]]
    for request, frame in zip(batch, frames):
        for t, ref in zip(request.inputs, frame.inputs):
            offset, nbytes = ref.location
            assert block[offset:offset + nbytes] == t.data


def test_a_tensor_on_another_instances_gpu_travels_by_handle_not_in_the_block():
    device = DeviceTensor(b"h" * 64, 1, 512, 4096)
    batch = [WorkRequest("r0", 0, 0, {}, [WorkInput("A", "FP32", [1024], device),
                                          WorkInput("B", "INT8", [3], b"bbb")], ["OUT"],
                         device_outputs=("OUT",))]
    (frame,), pieces, size = batch_layout.layout(batch, [0])
    assert b"".join(pieces) == b"bbb" and size == 3
    assert frame.inputs[0].location == OnDevice(b"h" * 64, 1, 512, 4096)
    assert frame.device_outputs == ("OUT",)


def test_an_output_kept_on_the_gpu_is_released_with_the_arena_slots():
    handle = WorkerHandle(model_name="m", model_version=1, model_dir="", model_repository="",
                          model_config={}, instance_name="m_0", instance_kind="GPU",
                          device_id=0)
    sent = []
    handle._channel = type("Channel", (), {"send": staticmethod(sent.append)})()
    handle.alive = True
    response = handle._batches.response(messages.ResponseFrame(None, [
        messages.TensorRef("MID", "FP32", [1024], KeptOnDevice(b"h" * 64, 0, 256, 4096, 7)),
        messages.TensorRef("SMALL", "INT8", [2], b"xy")]))
    mid, small = response.outputs
    assert mid.device == DeviceTensor(b"h" * 64, 0, 256, 4096) and mid.data == b""
    assert small.device is None and small.data == b"xy"
    assert response.arena is None  # nothing of it is in the output arena
    response.release()
    assert sent == [messages.Release([], [7])]


@pytest.mark.parametrize("elements,arena_blocks", [(3, 0), (40_000, 1)],
                         ids=["inline", "arena"])
def test_block_round_trips_and_batches(model_dir, elements, arena_blocks):
    async def body(handle):
        arena = handle._memory.input_arena
        slots = []  # one per block put into the arena
        put = arena.put

        def recording_put(pieces, nbytes):
            slots.append(put(pieces, nbytes))
            return slots[-1]

        arena.put = recording_put
        a = [np.arange(n * elements, dtype=np.float32).reshape(n, elements) + i
             for i, n in enumerate((1, 2, 1))]
        b = [np.arange(n * 5, dtype=np.int8).reshape(n, 5) for n in (1, 2, 1)]
        s = np.array([[b"x", b"yz"]], dtype=np.object_)
        batch = [request("r0", B=b[0], A=a[0], S=s), request("r1", A=a[1], B=b[1]),
                 request("r2", A=a[2], B=b[2])]
        results = await execute(handle, batch)
        for i, out in enumerate(results):
            np.testing.assert_array_equal(out["A_OUT"], a[i].reshape(-1))
            np.testing.assert_array_equal(out["B_OUT"], b[i].reshape(-1))
            assert out["A_SHARED"].all()
        assert results[0]["S_OUT"] == [b"x", b"yz"] and "S_OUT" not in results[1]
        assert len(slots) == arena_blocks and None not in slots
        assert arena._alloc.used == 0  # the block's slot came back with the Result

    run_with_worker(model_dir, body)


def test_full_input_arena_falls_back_to_inline(model_dir, monkeypatch):
    monkeypatch.setattr(instance_memory, "ARENA_BYTES", 256 * 1024)

    async def body(handle):
        a = [np.full((1, 50_000), i, dtype=np.float32) for i in range(2)]  # 400 kB in all
        results = await execute(handle, [request("r0", A=a[0]), request("r1", A=a[1])])
        for i, out in enumerate(results):
            np.testing.assert_array_equal(out["A_OUT"], a[i].reshape(-1))
            assert out["A_SHARED"].all()

    run_with_worker(model_dir, body)


def test_single_request_without_inputs(model_dir):
    async def body(handle):
        responses, _ = await handle.execute([WorkRequest("r", 0, 0, {}, [], ["A_OUT"])])
        (response,) = responses
        assert "has no input 'A'" in response.error.message

    run_with_worker(model_dir, body)
