"""The worker side of sequence batching: control tensors, implicit state per slot, null
requests, and requests an iterative-sequence model reschedules."""

import copy
import logging
import os
import textwrap
import threading

import numpy as np
import pytest

from shmserve.ipc import codec, messages, request_table
from shmserve.ipc.idle_spin import MIN_IDLE_CORES, STREAM_MIN_IDLE_CORES, IdleSpin
from shmserve.ipc.segments import Segment
from workers import triton_python_backend_utils as pb_utils
from workers.backends import BackendError, Context
from workers.backends.batch import Input, Request
from workers.backends.python import PythonModel
from workers.loop import WorkerLoop
from workers.sequence_extras import END, START, SequenceConfigError, SequenceExtras
from workers.server_calls import FrameReader


def control(name, kind, **fields):
    # As Triton's JSON renders a control: every repeated field, empty when unset.
    entry = {"kind": kind, "int32_false_true": [], "fp32_false_true": [], "bool_false_true": [],
             "data_type": "TYPE_INVALID"}
    entry.update(fields)
    return {"name": name, "control": [entry]}


CONTROLS = [
    control("START", "CONTROL_SEQUENCE_START", int32_false_true=[0, 1]),
    control("END", "CONTROL_SEQUENCE_END", fp32_false_true=[-1.0, 2.5]),
    control("READY", "CONTROL_SEQUENCE_READY", bool_false_true=[False, True]),
    control("CORRID", "CONTROL_SEQUENCE_CORRID", data_type="TYPE_UINT64"),
]

ZERO_STATE = {"input_name": "STATE_IN", "output_name": "STATE_OUT", "data_type": "TYPE_INT32",
              "dims": [1], "initial_state": [{"data_type": "TYPE_INT32", "dims": [1],
                                              "zero_data": True, "name": "zero"}]}

CONFIG = {
    "name": "acc",
    "max_batch_size": 4,
    "input": [{"name": "IN", "data_type": "TYPE_INT32", "dims": [1]}],
    "output": [{"name": "OUT", "data_type": "TYPE_INT32", "dims": [1]}],
    "sequence_batching": {"control_input": CONTROLS, "state": [ZERO_STATE]},
}


def config_with(**batching):
    config = copy.deepcopy(CONFIG)
    config["sequence_batching"] = batching
    return config


def extras_of(config, model_dir="/nonexistent", memory=None, kind="CPU", reserve=None):
    return SequenceExtras.from_config(config, model_dir, kind, memory, reserve)


def by_name(tensors):
    return {t.name(): t for t in tensors}


def values(tensors):
    return {t.name(): (t.triton_dtype(), t.as_numpy().tolist()) for t in tensors}


def state_response(array, name="STATE_OUT"):
    if not isinstance(array, np.ndarray):
        array = np.array(array, np.int32)
    return pb_utils.InferenceResponse([pb_utils.Tensor(name, array)])


TYPE_BOOL, TYPE_INT32, TYPE_INT64, TYPE_UINT32, TYPE_UINT64 = 1, 8, 9, 4, 5
TYPE_FP32, TYPE_STRING = 11, 13


# --- control tensors ----------------------------------------------------------------------------


@pytest.mark.parametrize("flags,start,end", [(0, 0, -1.0), (START, 1, -1.0), (END, 0, 2.5),
                                              (START | END, 1, 2.5)])
def test_controls_follow_the_flags(flags, start, end):
    extras = extras_of(config_with(control_input=CONTROLS))
    got = values(extras.inputs([], 0, flags, 77, True))
    assert got == {"START": (TYPE_INT32, [[start]]), "END": (TYPE_FP32, [[end]]),
                   "READY": (TYPE_BOOL, [[True]]), "CORRID": (TYPE_UINT64, [[77]])}


def test_a_control_without_kind_is_start_as_in_tritons_json():
    # Triton's JSON leaves an enum out at its default value, CONTROL_SEQUENCE_START.
    start = {"name": "S", "control": [{"int32_false_true": [0, 1]}]}
    extras = extras_of(config_with(control_input=[start]))
    assert values(extras.inputs([], 0, START, 1, True)) == {"S": (TYPE_INT32, [[1]])}
    assert values(extras.inputs([], 0, 0, 1, True)) == {"S": (TYPE_INT32, [[0]])}


def test_controls_of_a_model_without_batching_have_shape_1():
    config = config_with(control_input=CONTROLS)
    config["max_batch_size"] = 0
    got = by_name(extras_of(config).inputs([], 0, START, 5, True))
    assert {name: t.shape() for name, t in got.items()} == {
        "START": [1], "END": [1], "READY": [1], "CORRID": [1]}
    assert got["START"].as_numpy().dtype == np.int32
    assert got["END"].as_numpy().dtype == np.float32
    assert got["READY"].as_numpy().dtype == np.bool_


@pytest.mark.parametrize("data_type,triton,correlation_id,expected", [
    ("TYPE_UINT64", TYPE_UINT64, 2**64 - 1, 2**64 - 1),
    ("TYPE_INT64", TYPE_INT64, 2**63, -2**63),
    ("TYPE_UINT32", TYPE_UINT32, 2**32 + 5, 5),
    ("TYPE_INT32", TYPE_INT32, 2**32 + 2**31, -2**31),
    ("TYPE_STRING", TYPE_STRING, "seq-a", b"seq-a"),
    ("TYPE_STRING", TYPE_STRING, 42, b"42"),
])
def test_correlation_id_control(data_type, triton, correlation_id, expected):
    config = config_with(control_input=[control("ID", "CONTROL_SEQUENCE_CORRID",
                                                data_type=data_type)])
    (tensor,) = extras_of(config).inputs([], 0, 0, correlation_id, True)
    assert (tensor.name(), tensor.triton_dtype(), tensor.shape()) == ("ID", triton, [1, 1])
    assert tensor.as_numpy()[0, 0] == expected


@pytest.mark.parametrize("data_type,correlation_id,expected", [
    # Values Triton 2.51 handed a model (probed): the string's BYTES element, length first.
    ("TYPE_UINT64", "a", 416611827713),
    ("TYPE_UINT64", "abc", 27974191445704707),
    ("TYPE_UINT64", "hello", 7812730950931972101),
    ("TYPE_UINT64", "sequence-1", 8462656719401517066),
    ("TYPE_UINT64", "12345", 3761405299819282437),
    ("TYPE_UINT64", "", 0),
    ("TYPE_UINT64", "x" * 40, int.from_bytes(b"\x28\0\0\0xxxx", "little")),
    ("TYPE_INT32", "hello", 5),
])
def test_string_correlation_id_for_a_numeric_control(data_type, correlation_id, expected):
    config = config_with(control_input=[control("ID", "CONTROL_SEQUENCE_CORRID",
                                                data_type=data_type)])
    (tensor,) = extras_of(config).inputs([], 0, START, correlation_id, True)
    assert int(tensor.as_numpy()[0, 0]) == expected


def test_null_request_is_not_ready_and_has_no_flags_or_id():
    got = values(extras_of(config_with(control_input=CONTROLS)).inputs([], 1, 0, 0, False))
    assert got == {"START": (TYPE_INT32, [[0]]), "END": (TYPE_FP32, [[-1.0]]),
                   "READY": (TYPE_BOOL, [[False]]), "CORRID": (TYPE_UINT64, [[0]])}
    config = config_with(control_input=[
        control("SID", "CONTROL_SEQUENCE_CORRID", data_type="TYPE_STRING")])
    assert values(extras_of(config).inputs([], 1, 0, 0, False)) == {
        "SID": (TYPE_STRING, [[b""]])}


def test_a_control_replaces_a_request_input_of_its_name():
    extras = extras_of(config_with(control_input=CONTROLS))
    request_inputs = [pb_utils.Tensor("IN", np.ones(1, np.int32)),
                      pb_utils.Tensor("START", np.full((1, 1), 9, np.int32))]
    got = extras.inputs(request_inputs, 0, 0, 3, True)
    assert [t.name() for t in got] == ["IN", "START", "END", "READY", "CORRID"]
    assert got[1].as_numpy().tolist() == [[0]]


def test_shared_control_tensors_are_read_only():
    (start,) = extras_of(config_with(control_input=CONTROLS[:1])).inputs([], 0, START, 0, True)
    with pytest.raises(ValueError):
        start.as_numpy()[0, 0] = 5


def test_a_model_without_controls_or_states_has_no_extras():
    config = {key: value for key, value in CONFIG.items() if key != "sequence_batching"}
    assert extras_of(config) is None
    assert extras_of(config_with(control_input=[], state=[], iterative_sequence=True)) is None


# --- implicit state -----------------------------------------------------------------------------


@pytest.fixture
def memory():
    return memoryview(bytearray(1 << 16))


def state_of(extras, slot, flags=0):
    (tensor,) = extras.inputs([], slot, flags, 1, True)
    return tensor.as_numpy()


def test_state_follows_its_slot(memory):
    extras = extras_of(config_with(state=[ZERO_STATE]), memory=memory)
    assert state_of(extras, 0, START).tolist() == [[0]]
    assert extras.capture(0, True, state_response([[5]])) is None
    assert extras.capture(1, True, state_response([[7]])) is None
    assert state_of(extras, 0).tolist() == [[5]]
    assert state_of(extras, 1).tolist() == [[7]]
    extras.capture(0, True, state_response([[6]]))
    assert state_of(extras, 0).tolist() == [[6]]
    assert state_of(extras, 1).tolist() == [[7]]


def test_state_is_a_read_only_view_of_the_arena(memory):
    extras = extras_of(config_with(state=[ZERO_STATE]), memory=memory)
    extras.capture(0, True, state_response(np.array([[41]], np.int32)))
    state = state_of(extras, 0)
    assert np.shares_memory(state, np.frombuffer(memory, np.uint8))
    assert not state.flags.writeable
    assert extras.arena_used > 0


def test_start_resets_and_end_frees_the_slot(memory):
    extras = extras_of(config_with(state=[ZERO_STATE]), memory=memory)
    extras.capture(0, True, state_response([[5]]))
    extras.capture(1, True, state_response([[8]]))
    assert state_of(extras, 0, START).tolist() == [[0]]
    assert state_of(extras, 0).tolist() == [[0]]
    extras.capture(0, True, state_response([[3]]))
    extras.end(0, END, True)
    extras.end(1, 0, True)  # not the end of slot 1's sequence
    assert state_of(extras, 0).tolist() == [[0]]
    assert state_of(extras, 1).tolist() == [[8]]
    extras.end(1, START | END, True)
    assert extras.arena_used == 0


def test_null_requests_neither_read_nor_update_state(memory):
    extras = extras_of(config_with(state=[ZERO_STATE]), memory=memory)
    extras.capture(0, True, state_response([[5]]))
    (null_state,) = extras.inputs([], 0, 0, 0, False)
    assert null_state.as_numpy().tolist() == [[0]]
    extras.capture(0, False, state_response([[9]]))
    extras.end(0, END, False)
    assert state_of(extras, 0).tolist() == [[5]]


def test_a_state_of_the_wrong_type_is_an_error_and_kept_out(memory):
    extras = extras_of(config_with(state=[ZERO_STATE]), memory=memory)
    extras.capture(0, True, state_response(np.array([[5]], np.int32)))
    error = extras.capture(0, True, state_response(np.array([[1.5]], np.float32)))
    assert error == ("implicit state output 'STATE_OUT' has data type FP32, but its "
                     "sequence_batching.state declares TYPE_INT32")
    assert state_of(extras, 0).tolist() == [[5]]


def test_a_response_without_the_state_output_keeps_the_state(memory):
    extras = extras_of(config_with(state=[ZERO_STATE]), memory=memory)
    extras.capture(0, True, state_response([[5]]))
    extras.capture(0, True, state_response([[1]], name="OTHER"))
    extras.capture(0, True, pb_utils.InferenceResponse(error=pb_utils.TritonError("no")))
    assert state_of(extras, 0).tolist() == [[5]]


def test_full_arena_keeps_state_on_the_heap(caplog):
    extras = extras_of(config_with(state=[ZERO_STATE]), memory=memoryview(bytearray(64)))
    extras.capture(0, True, state_response(np.arange(8, dtype=np.int32).reshape(1, 8)))
    with caplog.at_level(logging.WARNING, logger="workers.sequence_extras"):
        extras.capture(1, True, state_response(np.arange(32, dtype=np.int32).reshape(1, 32)))
    assert "state arena full" in caplog.text
    assert state_of(extras, 1).tolist() == [list(range(32))]
    assert state_of(extras, 0).tolist() == [list(range(8))]
    extras.end(1, END, True)
    extras.end(0, END, True)
    assert extras.arena_used == 0


def test_no_room_in_dev_shm_keeps_state_on_the_heap(memory, caplog):
    asked = []

    def reserve(end):  # /dev/shm has room for nothing
        asked.append(end)
        return False

    extras = extras_of(config_with(state=[ZERO_STATE]), memory=memory, reserve=reserve)
    with caplog.at_level(logging.WARNING, logger="workers.sequence_extras"):
        extras.capture(0, True, state_response(np.array([[41]], np.int32)))
    assert asked and "no room in /dev/shm" in caplog.text
    state = state_of(extras, 0)
    assert state.tolist() == [[41]]
    assert not np.shares_memory(state, np.frombuffer(memory, np.uint8))
    assert extras.arena_used == 0


def test_two_states_and_a_bytes_state(memory):
    words = {"input_name": "WORDS_IN", "output_name": "WORDS_OUT", "data_type": "TYPE_STRING",
             "dims": [2]}
    extras = extras_of(config_with(state=[ZERO_STATE, words]), memory=memory)
    assert values(extras.inputs([], 0, START, 1, True)) == {
        "STATE_IN": (TYPE_INT32, [[0]]), "WORDS_IN": (TYPE_STRING, [[b"", b""]])}
    response = pb_utils.InferenceResponse([
        pb_utils.Tensor("WORDS_OUT", np.array([[b"a", b"b"]], dtype=np.object_)),
        pb_utils.Tensor("STATE_OUT", np.array([[3]], np.int32))])
    extras.capture(0, True, response)
    assert values(extras.inputs([], 0, 0, 1, True)) == {
        "STATE_IN": (TYPE_INT32, [[3]]), "WORDS_IN": (TYPE_STRING, [[b"a", b"b"]])}


def test_initial_state_from_a_file(tmp_path):
    (tmp_path / "initial_state").mkdir()
    (tmp_path / "initial_state" / "init.bin").write_bytes(
        np.array([[1.5, 2.5], [3.5, 4.5]], np.float32).tobytes())
    state = {"input_name": "S", "output_name": "S_OUT", "data_type": "TYPE_FP32", "dims": [-1, 2],
             "initial_state": [{"data_type": "TYPE_FP32", "dims": [2, 2],
                                "data_file": "init.bin", "name": "from file"}]}
    config = config_with(state=[state])
    (tensor,) = extras_of(config, str(tmp_path)).inputs([], 0, START, 1, True)
    assert tensor.as_numpy().tolist() == [[[1.5, 2.5], [3.5, 4.5]]]
    config["max_batch_size"] = 0
    (tensor,) = extras_of(config, str(tmp_path)).inputs([], 0, START, 1, True)
    assert tensor.as_numpy().tolist() == [[1.5, 2.5], [3.5, 4.5]]


def test_zero_initial_state_of_its_own_dims():
    state = dict(ZERO_STATE, data_type="TYPE_FP32", dims=[-1],
                 initial_state=[{"data_type": "TYPE_FP32", "dims": [3], "zero_data": True}])
    (tensor,) = extras_of(config_with(state=[state])).inputs([], 0, START, 1, True)
    assert tensor.as_numpy().tolist() == [[0.0, 0.0, 0.0]]
    assert tensor.as_numpy().dtype == np.float32


def test_without_initial_state_variable_dims_are_1():
    state = {"input_name": "S", "output_name": "S_OUT", "data_type": "TYPE_INT64",
             "dims": [-1, 3]}
    (tensor,) = extras_of(config_with(state=[state])).inputs([], 0, START, 1, True)
    assert tensor.shape() == [1, 1, 3]
    assert not tensor.as_numpy().any()


@pytest.mark.parametrize("initial,files,message", [
    ({"data_type": "TYPE_INT32", "dims": [1], "data_file": "missing"}, {},
     "cannot read the initial state of 'STATE_IN'"),
    ({"data_type": "TYPE_INT32", "dims": [2], "data_file": "short"}, {"short": b"1234"},
     "does not match dims [2] of TYPE_INT32: 4 bytes for 8 expected"),
    ({"data_type": "TYPE_INT32", "dims": [-1], "zero_data": True}, {},
     "must not be variable-size"),
    ({"data_type": "TYPE_FP32", "dims": [1], "zero_data": True}, {},
     "has data type TYPE_FP32, the state has TYPE_INT32"),
    ({"data_type": "TYPE_INT32", "dims": [1]}, {}, "neither zero_data nor data_file"),
])
def test_bad_initial_states_are_refused(tmp_path, initial, files, message):
    (tmp_path / "initial_state").mkdir()
    for name, data in files.items():
        (tmp_path / "initial_state" / name).write_bytes(data)
    config = config_with(state=[dict(ZERO_STATE, initial_state=[initial])])
    with pytest.raises(SequenceConfigError) as caught:
        extras_of(config, str(tmp_path))
    assert message in str(caught.value)


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
