"""The worker side of sequence batching through a Python model (PythonModel) and the worker
loop: implicit state accumulating per slot, the controls the model sees, state errors, decoupled
responses, the requests an iterative-sequence model reschedules, and the loop's frames for null
and rescheduled requests."""

import copy
import os
import textwrap
import threading

import numpy as np
import pytest

from shmserve.ipc import codec, messages, request_table
from shmserve.ipc.idle_spin import MIN_IDLE_CORES, STREAM_MIN_IDLE_CORES, IdleSpin
from shmserve.ipc.segments import Segment
from tests.unit.workers.sequence_extras_helpers import CONFIG, ZERO_STATE, config_with
from workers.backends import BackendError, Context
from workers.backends.batch import Input, Request
from workers.backends.python import PythonModel
from workers.loop import WorkerLoop
from workers.sequence_extras import END, START
from workers.server_calls import FrameReader


# --- through the runner -------------------------------------------------------------------------


# OUT = IN + state; the new state is OUT; the controls come back as parameters.
ACCUMULATOR = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            get = lambda name: pb_utils.get_input_tensor_by_name(request, name).as_numpy()
            state = get("STATE_IN")
            assert not state.flags.writeable
            total = get("IN") + state
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUT", total), pb_utils.Tensor("STATE_OUT", total)],
                parameters={"start": int(get("START")[0, 0]), "ready": bool(get("READY")[0, 0]),
                            "corrid": int(get("CORRID")[0, 0])}))
        return responses
"""


@pytest.fixture
def make_runner(tmp_path):
    runners = []

    def make(source, config=CONFIG, memory=None):
        model_dir = tmp_path / config["name"]
        (model_dir / "1").mkdir(parents=True, exist_ok=True)
        (model_dir / "1" / "model.py").write_text(textwrap.dedent(source))
        runner = PythonModel(Context(
            model_name=config["name"], model_version=1, model_dir=str(model_dir),
            model_config=config, instance_name=f"{config['name']}_0_0", instance_kind="CPU",
            device_id=0, model_repository=str(tmp_path), state_memory=memory))
        runner.initialize()
        runners.append(runner)
        return runner

    yield make
    for runner in runners:
        runner.finalize()


def request(value, slot, flags=0, ready=True, correlation_id=None, request_id="r", **kwargs):
    data = np.array([[value]], np.int32).tobytes()
    return Request(
        request_id=request_id, parameters={}, flags=flags,
        correlation_id=slot + 100 if correlation_id is None else correlation_id,
        inputs=[Input("IN", "INT32", [1, 1], data)], requested_output_names=["OUT"],
        sequence_slot=slot, ready=ready, **kwargs)


def totals(runner, *requests):
    responses, _ = runner.execute(list(requests))
    out = []
    for response in responses:
        assert response.error is None, response.error
        assert [o.name for o in response.outputs] == ["OUT"]  # the state output stays here
        out.append(int(response.outputs[0].array[0, 0]))
    return out


def test_state_accumulates_per_slot_through_the_model(make_runner, memory):
    runner = make_runner(ACCUMULATOR, memory=memory)
    assert totals(runner, request(1, 0, START), request(10, 1, START)) == [1, 10]
    assert totals(runner, request(2, 0), request(20, 1)) == [3, 30]
    assert totals(runner, request(3, 0, END), request(0, 1, ready=False)) == [6, 0]
    assert totals(runner, request(5, 0, START), request(30, 1, END)) == [5, 60]
    assert totals(runner, request(1, 0, END)) == [6]
    assert runner._sequence.arena_used == 0


def test_the_model_sees_the_controls(make_runner):
    runner = make_runner(ACCUMULATOR)
    responses, _ = runner.execute([request(1, 0, START, correlation_id=9),
                                   request(0, 1, ready=False, correlation_id=0)])
    assert [r.parameters for r in responses] == [
        {"start": 1, "ready": True, "corrid": 9}, {"start": 0, "ready": False, "corrid": 0}]


def test_a_client_may_request_the_state_output(make_runner):
    config = copy.deepcopy(CONFIG)
    config["output"].append({"name": "STATE_OUT", "data_type": "TYPE_INT32", "dims": [1]})
    runner = make_runner(ACCUMULATOR, config=config)
    asked = request(4, 0, START)
    asked.requested_output_names = ["OUT", "STATE_OUT"]
    (response,), _ = runner.execute([asked])
    assert {o.name: o.array.tolist() for o in response.outputs} == {
        "OUT": [[4]], "STATE_OUT": [[4]]}


def test_a_wrong_state_type_fails_only_its_request(make_runner):
    runner = make_runner("""
        import numpy as np
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def execute(self, requests):
                return [pb_utils.InferenceResponse([pb_utils.Tensor(
                    "STATE_OUT", np.zeros((1, 1), np.float32 if r.request_id() == "bad"
                                          else np.int32))]) for r in requests]
    """)
    responses, _ = runner.execute([request(1, 0, START, request_id="bad"),
                                   request(1, 1, START, request_id="good")])
    assert responses[0].error[0] == "INTERNAL"
    assert "'STATE_OUT' has data type FP32" in responses[0].error[1]
    assert responses[1].error is None


def test_a_bad_sequence_config_fails_the_load(make_runner):
    config = config_with(state=[dict(ZERO_STATE, initial_state=[
        {"data_type": "TYPE_INT32", "dims": [1], "data_file": "nope"}])])
    with pytest.raises(BackendError, match="sequence batching of model 'acc': cannot read"):
        make_runner(ACCUMULATOR, config=config)


def test_decoupled_responses_update_the_state_and_the_final_one_ends_it(make_runner, memory):
    config = copy.deepcopy(CONFIG)
    config["model_transaction_policy"] = {"decoupled": True}
    runner = make_runner("""
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def execute(self, requests):
                for request in requests:
                    get = lambda name: pb_utils.get_input_tensor_by_name(request, name).as_numpy()
                    total = get("IN") + get("STATE_IN")
                    request.get_response_sender().send(
                        pb_utils.InferenceResponse([pb_utils.Tensor("OUT", total),
                                                    pb_utils.Tensor("STATE_OUT", total)]),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    """, config=config, memory=memory)
    got = []

    def respond(response, final):
        got.append((int(response.outputs[0].array[0, 0]), final))

    for value, flags in ((2, START), (3, 0), (4, END)):
        runner.execute([request(value, 0, flags, respond=respond)])
        assert (runner._sequence.arena_used == 0) == (flags == END)
    assert got == [(2, True), (5, True), (9, True)]


# --- iterative sequences ------------------------------------------------------------------------


# Runs each request three times: the first two ask to be rescheduled.
ITERATING = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.runs = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            n = self.runs[request.request_id()] = self.runs.get(request.request_id(), 0) + 1
            if n < 3:
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                responses.append(None)
            else:
                responses.append(pb_utils.InferenceResponse(
                    [pb_utils.Tensor("OUT", np.full((1, 1), n, np.int32))]))
        return responses
"""


ITERATIVE = dict(CONFIG, sequence_batching={"iterative_sequence": True})


def test_rescheduled_requests_of_an_iterative_model(make_runner):
    runner = make_runner(ITERATING, config=ITERATIVE)
    for _ in range(2):
        batch = [request(0, 0, request_id="a"), request(0, 1, request_id="b")]
        responses, _ = runner.execute(batch)
        assert [r.rescheduled for r in batch] == [True, True]
        assert [(r.outputs, r.error) for r in responses] == [([], None), ([], None)]
    last = request(0, 0, request_id="a")
    (response,), _ = runner.execute([last])
    assert not last.rescheduled
    assert response.outputs[0].array.tolist() == [[3]]


def test_rescheduling_needs_an_iterative_sequence(make_runner):
    runner = make_runner(ITERATING)
    one = request(0, 0, START)
    (response,), _ = runner.execute([one])
    assert not one.rescheduled
    assert response.error == ("INVALID_ARG", "Request is released with "
                              "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, while the model is not "
                              "configured to handle such a flag.")


def test_a_rescheduled_request_must_return_none(make_runner):
    runner = make_runner("""
        import numpy as np
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def execute(self, requests):
                for request in requests:
                    request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                return [pb_utils.InferenceResponse([pb_utils.Tensor(
                    "OUT", np.zeros((1, 1), np.int32))]) for _ in requests]
    """, config=ITERATIVE)
    one = request(0, 0, START)
    (response,), _ = runner.execute([one])
    assert response.error[0] == "INTERNAL"
    assert ("message: Expected a None object in the execute function return list for "
            "reschduled request, found type '<class '") in response.error[1]
    assert response.error[1].endswith("InferenceResponse'>'.")


def test_rescheduled_requests_of_a_decoupled_iterative_model(make_runner):
    config = dict(ITERATIVE, model_transaction_policy={"decoupled": True})
    runner = make_runner("""
        import numpy as np
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def initialize(self, args):
                self.runs = 0

            def execute(self, requests):
                self.runs += 1
                sender = requests[0].get_response_sender()
                sender.send(pb_utils.InferenceResponse(
                    [pb_utils.Tensor("OUT", np.full((1, 1), self.runs, np.int32))]))
                if self.runs < 2:
                    requests[0].set_release_flags(
                        pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                else:
                    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    """, config=config)
    got = []

    def respond(response, final):
        got.append((None if response is None else int(response.outputs[0].array[0, 0]), final))

    first = request(0, 0, respond=respond)
    assert runner.execute([first])[0] == []
    assert first.rescheduled and got == [(1, False)]
    second = request(0, 0, respond=respond)
    runner.execute([second])
    assert not second.rescheduled
    assert got == [(1, False), (2, False), (None, True)]


# --- through the worker loop --------------------------------------------------------------------


class FakeChannel:
    """The front's side of the socket: frames to hand the loop, and frames it sent, each
    through the wire codec."""

    def __init__(self, frames):
        self._frames = list(frames)
        self.sent = []
        self._lock = threading.Lock()

    def recv(self):
        return _through_wire(self._frames.pop(0)) if self._frames else None

    def send(self, message):
        with self._lock:
            self.sent.append(_through_wire(message))


def _through_wire(message):
    return codec.decode_body(codec.encode(message)[1])


@pytest.fixture
def segments():
    names = {}
    created = []
    for tag, size in (("in", 1 << 16), ("out", 1 << 16), ("rows", request_table.SIZE)):
        segment = Segment.create(f"/shmtest_sequence_{os.getpid()}_{tag}", size)
        created.append(segment)
        names[tag] = segment.name
    yield names
    for segment in created:
        segment.close()
        segment.unlink()


def run_loop(runner, segments, requests, decoupled=False, lone=False, spin=None):
    init = messages.Init("acc", 1, "", "", {}, "acc_0_0", "CPU", 0, segments["in"],
                         segments["out"], segments["rows"], 1 << 12)
    block = b"".join(np.array([[v]], np.int32).tobytes() for v, *_ in requests)
    frames = [messages.RequestFrame(f"r{i}", 0, flags, {}, [
        messages.TensorRef("IN", "INT32", [1, 1], [4 * i, 4])], ["OUT"], i,
        sequence_slot=i, ready=ready) for i, (_, flags, ready) in enumerate(requests)]
    channel = FakeChannel([messages.Execute(7, block, frames, lone)])
    WorkerLoop(channel, FrameReader(channel), runner, init, spin).run()
    return channel.sent


def test_a_lone_batch_lowers_the_polling_threshold_and_others_restore_it(make_runner,
                                                                          segments):
    runner = make_runner(ACCUMULATOR)
    spin = IdleSpin(300)
    run_loop(runner, segments, [(5, START, True)], lone=True, spin=spin)
    assert spin.min_idle_cores == STREAM_MIN_IDLE_CORES
    run_loop(runner, segments, [(1, 0, True)], spin=spin)
    assert spin.min_idle_cores == MIN_IDLE_CORES


def test_loop_answers_null_requests_with_empty_frames(make_runner, segments):
    runner = make_runner(ACCUMULATOR)
    (result,) = run_loop(runner, segments, [(5, START, True), (0, 0, False)])
    assert result.rescheduled == []
    assert result.responses[0].outputs[0].location == np.array([[5]], np.int32).tobytes()
    assert result.responses[1] == messages.ResponseFrame(None, [], {})


def test_loop_lists_rescheduled_requests(make_runner, segments):
    runner = make_runner(ITERATING, config=ITERATIVE)
    (result,) = run_loop(runner, segments, [(0, 0, True), (0, 0, True)])
    assert result.rescheduled == [0, 1]
    assert result.responses == [messages.ResponseFrame(None, [], {})] * 2


def test_loop_frees_the_row_of_a_decoupled_null_request(make_runner, segments):
    config = dict(CONFIG, model_transaction_policy={"decoupled": True})
    runner = make_runner("""
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def execute(self, requests):
                for request in requests:
                    value = pb_utils.get_input_tensor_by_name(request, "IN")
                    request.get_response_sender().send(
                        pb_utils.InferenceResponse([pb_utils.Tensor("OUT", value.as_numpy())]),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    """, config=config)
    sent = run_loop(runner, segments, [(5, START, True), (0, 0, False)])
    streamed = [m for m in sent if isinstance(m, messages.StreamResponse)]
    assert [(m.row, m.final, m.response is None) for m in streamed] == [(0, True, False),
                                                                        (1, True, True)]
    assert isinstance(sent[-1], messages.Result) and sent[-1].responses == []
