"""The in-process API: an application embeds `Server` (and may import tritonclient too)."""

import asyncio
import gc
import os

import numpy as np
import pytest
import tritonclient.grpc  # noqa: F401  (registers inference.* in the default pool)

from shmserve.errors import Code, ServerError
from shmserve.inference import InferRequest, InputTensor, RequestedOutput
from shmserve.server import Options, Server

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_embedded_server_infers_without_endpoints():
    async def run():
        server = Server(Options(model_repository=[os.path.join(ROOT, "model_repository")],
                                allow_http=False, allow_grpc=False, allow_metrics=False))
        own_thresholds = gc.get_threshold()
        await server.start()
        try:
            assert server.dataplane.server_ready()
            assert gc.get_threshold()[0] > own_thresholds[0]  # see host/gc_tuning.py
            a = np.arange(4, dtype=np.float32)
            request = InferRequest("add_sub", inputs=[
                InputTensor("INPUT0", "FP32", [4], a.tobytes()),
                InputTensor("INPUT1", "FP32", [4], a.tobytes())],
                outputs=[RequestedOutput("OUTPUT0")])
            response = await server.infer(request)
            try:
                assert [o.name for o in response.outputs] == ["OUTPUT0"]
                np.testing.assert_array_equal(
                    np.frombuffer(response.outputs[0].data, np.float32), a * 2)
            finally:
                response.done()
            with pytest.raises(ServerError) as e:
                await server.infer(InferRequest("add_sub", inputs=[]))
            assert e.value.code == Code.INVALID_ARG
        finally:
            await server.stop()
        assert not server.dataplane.server_live()
        assert gc.get_threshold() == own_thresholds  # the application's own again
        with pytest.raises(ServerError) as e:
            await server.infer(request)
        assert e.value.code == Code.UNAVAILABLE

    asyncio.run(run())
