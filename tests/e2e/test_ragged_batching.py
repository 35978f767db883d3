"""Ragged batching end to end, as Triton's framework backends do it: requests whose ragged input
lengths differ share one batch, the model gets them as one flat tensor with a batch input that
says where each request ends, and each request gets its own part of a batch output. An ONNX
model and a TorchScript model, built here, over HTTP and gRPC."""

import concurrent.futures
import os
import textwrap

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
torch = pytest.importorskip("torch")

from tests.conftest import start_server, stop_server  # noqa: E402
from tests.onnx_graphs import ragged_doubler  # noqa: E402

PROTOCOLS = {"http": httpclient, "grpc": grpcclient}
LENGTHS = (3, 1, 5)
# A batch leaves once all three requests are in (or after 10 s): the three always share one.
BATCHER = "dynamic_batching { preferred_batch_size: [ 3 ] max_queue_delay_microseconds: 10000000 }"

ONNX_CONFIG = f"""
backend: "onnxruntime"
max_batch_size: 8
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true }} ]
output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ -1 ] }},
         {{ name: "END" data_type: TYPE_FP32 dims: [ 1 ] }} ]
batch_input [ {{ kind: BATCH_ACCUMULATED_ELEMENT_COUNT target_name: "INDEX"
                data_type: TYPE_FP32 source_input: "X" }} ]
batch_output [ {{ kind: BATCH_SCATTER_WITH_INPUT_SHAPE target_name: "Y" source_input: "X" }} ]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
{BATCHER}
"""

TORCH_CONFIG = f"""
platform: "pytorch_libtorch"
max_batch_size: 8
input [ {{ name: "x" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true }} ]
output [ {{ name: "DOUBLED__0" data_type: TYPE_FP32 dims: [ -1 ] }},
         {{ name: "SUM__1" data_type: TYPE_FP32 dims: [ 1 ] }},
         {{ name: "SEEN__2" data_type: TYPE_INT32 dims: [ 5 ] }} ]
batch_input [
  {{ kind: BATCH_ELEMENT_COUNT target_name: "counts" data_type: TYPE_INT32 source_input: "x" }},
  {{ kind: BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO target_name: "starts"
    data_type: TYPE_INT32 source_input: "x" }},
  {{ kind: BATCH_MAX_ELEMENT_COUNT_AS_SHAPE target_name: "longest" data_type: TYPE_INT32
    source_input: "x" }},
  {{ kind: BATCH_ITEM_SHAPE target_name: "items" data_type: TYPE_INT32 source_input: "x" }},
  {{ kind: BATCH_ITEM_SHAPE_FLATTEN target_name: "flat" data_type: TYPE_INT32
    source_input: "x" }} ]
batch_output [ {{ kind: BATCH_SCATTER_WITH_INPUT_SHAPE target_name: "DOUBLED__0"
                 source_input: "x" }} ]
parameters {{ key: "INTRA_OP_THREAD_COUNT" value: {{ string_value: "1" }} }}
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
{BATCHER}
"""


class Ragged(torch.nn.Module):
    """Doubles the flat batch; for each request, the sum of its elements (from where each
    request starts) and what every batch input said of it: its element count, its start, the
    longest request's length, its item shape, its flattened item shape."""

    def forward(self, x: torch.Tensor, counts: torch.Tensor, starts: torch.Tensor,
                longest: torch.Tensor, items: torch.Tensor, flat: torch.Tensor):
        sums = torch.cat([torch.zeros(1), torch.cumsum(x, 0)])
        ends = starts[1:].long()
        totals = (sums[ends] - sums[starts[:-1].long()]).unsqueeze(1)
        n = counts.shape[0]
        seen = torch.stack([counts, starts[:-1], torch.full([n], longest.shape[0]).int(),
                            items[:, 0], flat], 1)
        return x * 2, totals, seen


def write(repo, name, filename, save, config):
    os.makedirs(os.path.join(repo, name, "1"))
    save(os.path.join(repo, name, "1", filename))
    with open(os.path.join(repo, name, "config.pbtxt"), "w") as f:
        f.write(textwrap.dedent(config))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = str(tmp_path_factory.mktemp("ragged"))
    write(repo, "onnx_ragged", "model.onnx", lambda p: onnx.save(ragged_doubler(), p), ONNX_CONFIG)
    write(repo, "torch_ragged", "model.pt", torch.jit.script(Ragged()).save, TORCH_CONFIG)
    log = str(tmp_path_factory.mktemp("logs") / "shmserve.log")
    # Each instance imports its framework: on a busy 2-core machine that takes a while.
    srv = start_server(repo, log, wait_models=("onnx_ragged", "torch_ragged"), timeout=180)
    try:
        yield srv
    finally:
        stop_server(srv, timeout=90)


def together(server, protocol, model, name, outputs):
    """The three requests of LENGTHS sent at once, each on its own client: (input, result)."""
    lib = PROTOCOLS[protocol]
    url = server.http_url if protocol == "http" else server.grpc_url
    values = [np.arange(n, dtype=np.float32).reshape(1, n) + 10 * n for n in LENGTHS]

    def one(x):
        client = lib.InferenceServerClient(url)
        try:
            t = lib.InferInput(name, list(x.shape), "FP32")
            t.set_data_from_numpy(x)
            return client.infer(model, [t], outputs=[lib.InferRequestedOutput(o)
                                                     for o in outputs])
        finally:
            client.close()

    with concurrent.futures.ThreadPoolExecutor(len(values)) as pool:
        return list(zip(values, pool.map(one, values)))


def executions(server, model) -> tuple[int, int]:
    with httpclient.InferenceServerClient(server.http_url) as client:
        stats = client.get_inference_statistics(model)["model_stats"][0]
    return stats["execution_count"], stats["inference_count"]


def in_batch_order(answers, end_of):
    """The answers sorted by where the batch put them, each with its start in the flat batch;
    the starts must follow from the lengths, as one batch of all three makes them."""
    ordered = sorted(answers, key=end_of)
    start, placed = 0, []
    for x, result in ordered:
        placed.append((x, result, start))
        start += x.size
        assert end_of((x, result)) == start, [end_of(a) for a in ordered]
    return placed


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_an_onnx_model_batches_ragged_requests(server, protocol):
    before = executions(server, "onnx_ragged")
    answers = together(server, protocol, "onnx_ragged", "X", ("Y", "END"))
    after = executions(server, "onnx_ragged")
    assert (after[0] - before[0], after[1] - before[1]) == (1, 3)
    for x, result, _ in in_batch_order(answers, lambda a: a[1].as_numpy("END")[0, 0]):
        np.testing.assert_array_equal(result.as_numpy("Y"), x * 2)
        assert result.as_numpy("Y").shape == x.shape


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_torchscript_model_gets_every_batch_input_kind(server, protocol):
    before = executions(server, "torch_ragged")
    answers = together(server, protocol, "torch_ragged", "x", ("DOUBLED__0", "SUM__1", "SEEN__2"))
    after = executions(server, "torch_ragged")
    assert (after[0] - before[0], after[1] - before[1]) == (1, 3)

    def end_of(answer):
        count, start = answer[1].as_numpy("SEEN__2")[0, :2]
        return start + count

    for x, result, start in in_batch_order(answers, end_of):
        np.testing.assert_array_equal(result.as_numpy("DOUBLED__0"), x * 2)
        assert result.as_numpy("SUM__1").tolist() == [[float(x.sum())]]
        # count, start, the longest request, item shape, flattened item shape
        assert result.as_numpy("SEEN__2").tolist() == [
            [x.size, start, max(LENGTHS), x.size, x.size]]

