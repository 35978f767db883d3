"""Behaviours of the real Triton that a user's models and clients rely on, each against a real
server process (tests/models/README.md records what Triton answered)."""

import json

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

MODULES = {"http": httpclient, "grpc": grpcclient}


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_model_sees_the_command_line_tritons_stub_gives(clients, protocol):
    t = MODULES[protocol].InferInput("INPUT0", [1], "INT32")
    t.set_data_from_numpy(np.array([1], np.int32))
    argv = clients[protocol].infer("argv_probe", [t]).as_numpy("ARGV")[0]
    assert json.loads(argv) == [""]
