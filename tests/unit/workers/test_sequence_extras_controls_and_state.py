"""The worker side of sequence batching, SequenceExtras on its own: the control tensors it
adds to a request (start, end, ready, correlation ID, as their configured types), and the
implicit state it keeps per sequence slot (in the state arena or on the heap), with its initial
values and the configurations it refuses."""

import logging

import numpy as np
import pytest

from tests.unit.workers.sequence_extras_helpers import (CONFIG, CONTROLS, ZERO_STATE, config_with,
                                                        control)
from workers import triton_python_backend_utils as pb_utils
from workers.sequence_extras import END, START, SequenceConfigError, SequenceExtras


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
