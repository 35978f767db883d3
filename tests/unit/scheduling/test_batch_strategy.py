"""Custom batching strategies: where the file is found, how it is loaded, how the batcher's
calls reach the user's functions, and what a strategy sees of a request."""

import logging
import os
import sys
import textwrap

import numpy as np
import pytest

from shmserve.config.normalize import normalize_config
from shmserve.config.parse import parse_config_text
from shmserve.config.render import config_to_json
from shmserve.dispatch.work_types import WorkInput, WorkRequest
from shmserve.errors import Code, ServerError
from shmserve.ipc import datatypes
from shmserve.scheduling.strategy import BatchStrategy, RequestView

CONFIG = """
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 2 ] } ]
dynamic_batching { }
"""

# Records every call in the batcher state, so a test can check order and arguments.
RECORDING = """
def batcher_initialize(model_config):
    return {"config": model_config, "calls": []}

def batch_initialize(batcher_state):
    batcher_state["calls"].append("start")
    return {"batcher": batcher_state, "ids": []}

def batch_include_request(request, batch_state):
    batch_state["ids"].append(request.request_id)
    batch_state["batcher"]["calls"].append(("include", request.request_id))
    return request.request_id != "refuse"

def batch_finalize(batch_state):
    batch_state["batcher"]["calls"].append(("end", tuple(batch_state["ids"])))

def batcher_finalize(batcher_state):
    batcher_state["calls"].append("close")
"""

INCLUDE_ALL = "def batch_include_request(request, batch_state):\n    return True\n"


@pytest.fixture(autouse=True)
def forget_loaded_modules():
    """Strategies a test does not close stay importable; drop them after the test."""
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        if name.startswith("_shmserve_batch_strategy_"):
            del sys.modules[name]


def model(tmp_path, name="m", extra_config="", files=None):
    """A model folder with config and the given files ({relative path: source}), and its
    normalized config."""
    folder = tmp_path / name
    folder.mkdir()
    for rel, source in (files or {}).items():
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source))
    config = normalize_config(parse_config_text(CONFIG + extra_config), name, 0)
    return str(folder), config


def load(folder, config, version=1):
    return BatchStrategy.find(folder, version, config, config_to_json(config))


def path_parameter(value):
    return ('parameters { key: "TRITON_BATCH_STRATEGY_PATH" '
            f'value: {{ string_value: "{value}" }} }}\n')


def work(request_id="r", inputs=(), parameters=None):
    return WorkRequest(request_id, 0, 0, parameters or {}, list(inputs), [])


def fp32_input(values, name="INPUT0"):
    array = np.asarray(values, dtype=np.float32)
    return WorkInput(name, "FP32", list(array.shape), array.tobytes())


def tagged(tag):
    return f"TAG = {tag!r}\n" + INCLUDE_ALL.replace("True", "TAG")


def loaded_tag(strategy):
    return sys.modules[strategy._module.__name__].TAG


def load_error(folder, config) -> str:
    with pytest.raises(ServerError) as info:
        load(folder, config)
    assert info.value.code == Code.INVALID_ARG
    return info.value.message


# ---- where the file is found ----

def test_lookup_order_parameter_then_version_folder_then_model_folder(tmp_path):
    files = {"chosen.py": tagged("parameter"), "1/batch_strategy.py": tagged("version"),
             "batch_strategy.py": tagged("model")}
    folder, config = model(tmp_path, "a", path_parameter("chosen.py"), files)
    assert loaded_tag(load(folder, config)) == "parameter"

    folder, config = model(tmp_path, "b", files=files)
    assert loaded_tag(load(folder, config, version=1)) == "version"
    assert loaded_tag(load(folder, config, version=2)) == "model"


def test_no_file_means_no_strategy(tmp_path):
    folder, config = model(tmp_path, files={"1/model.py": ""})
    assert load(folder, config) is None
    assert "TRITON_BATCH_STRATEGY_PATH" not in config.parameters


def test_parameter_path_relative_to_model_folder_or_absolute(tmp_path):
    folder, config = model(tmp_path, "rel", path_parameter("lib/mine.py"),
                           {"lib/mine.py": tagged("relative")})
    strategy = load(folder, config)
    assert strategy.path == os.path.join(folder, "lib", "mine.py")
    assert loaded_tag(strategy) == "relative"

    elsewhere = tmp_path / "shared.py"
    elsewhere.write_text(tagged("absolute"))
    folder, config = model(tmp_path, "abs", path_parameter(elsewhere))
    assert loaded_tag(load(folder, config)) == "absolute"


def test_named_file_that_does_not_exist_is_an_error(tmp_path):
    folder, config = model(tmp_path, extra_config=path_parameter("gone.py"),
                           files={"batch_strategy.py": INCLUDE_ALL})
    message = load_error(folder, config)
    assert os.path.join(folder, "gone.py") in message
    assert "TRITON_BATCH_STRATEGY_PATH" in message and "does not exist" in message


# ---- loading errors ----

@pytest.mark.parametrize("source,what", [
    ("def batch_include_request(request, state)\n    return True\n", "SyntaxError"),
    ("import no_such_module_for_shmserve_tests\n", "ModuleNotFoundError"),
    ("raise RuntimeError('broken on purpose')\n", "broken on purpose"),
])
def test_file_that_cannot_be_imported(tmp_path, source, what):
    folder, config = model(tmp_path, files={"batch_strategy.py": source})
    before = set(sys.modules)
    message = load_error(folder, config)
    assert os.path.join(folder, "batch_strategy.py") in message and what in message
    assert set(sys.modules) == before


def test_missing_include_function(tmp_path):
    folder, config = model(tmp_path, files={"batch_strategy.py": "def batch_initialize(s):\n"
                                                                 "    return None\n"})
    message = load_error(folder, config)
    assert os.path.join(folder, "batch_strategy.py") in message
    assert "batch_include_request" in message


def test_entry_point_that_is_not_a_function(tmp_path):
    source = INCLUDE_ALL + "batch_finalize = 3\n"
    folder, config = model(tmp_path, files={"batch_strategy.py": source})
    assert "batch_finalize is not a function" in load_error(folder, config)


def test_batcher_initialize_error(tmp_path):
    source = INCLUDE_ALL + "def batcher_initialize(config):\n    raise ValueError('no way')\n"
    folder, config = model(tmp_path, files={"batch_strategy.py": source})
    before = set(sys.modules)
    message = load_error(folder, config)
    assert os.path.join(folder, "batch_strategy.py") in message
    assert "batcher_initialize" in message and "ValueError: no way" in message
    assert set(sys.modules) == before


# ---- the calls ----

def test_calls_reach_the_user_functions_with_their_states(tmp_path):
    folder, config = model(tmp_path, extra_config=path_parameter("s.py"),
                           files={"s.py": RECORDING})
    config_json = config_to_json(config)
    strategy = BatchStrategy.find(folder, 1, config, config_json)
    batcher = strategy._batcher_state
    assert batcher["config"] == config_json and batcher["config"] is not config_json
    assert batcher["config"]["parameters"]["TRITON_BATCH_STRATEGY_PATH"]["string_value"] == "s.py"

    state = strategy.start_batch()
    assert state["batcher"] is batcher
    assert strategy.include(state, work("a"), 1, 1) is True
    assert strategy.include(state, work("refuse"), 1, 1) is False
    strategy.end_batch(state)
    strategy.close()
    strategy.close()
    assert batcher["calls"] == ["start", ("include", "a"), ("include", "refuse"),
                                ("end", ("a", "refuse")), "close"]


def test_optional_functions_may_be_left_out(tmp_path):
    folder, config = model(tmp_path, files={"batch_strategy.py": INCLUDE_ALL})
    strategy = load(folder, config)
    state = strategy.start_batch()
    assert state is None
    assert strategy.include(state, work(), 1, 1) is True
    strategy.end_batch(state)
    strategy.close()


def test_close_forgets_the_module(tmp_path):
    folder, config = model(tmp_path, files={"batch_strategy.py": INCLUDE_ALL})
    strategy = load(folder, config)
    name = strategy._module.__name__
    assert sys.modules[name] is strategy._module
    strategy.close()
    assert name not in sys.modules


@pytest.mark.parametrize("value,expected", [("1", True), ("0", False), ("[]", False),
                                            ("'yes'", True), ("None", False),
                                            ("np.bool_(True)", True), ("np.float32(0)", False)])
def test_include_answer_taken_as_bool(tmp_path, value, expected):
    source = ("import numpy as np\n"
              f"def batch_include_request(request, batch_state):\n    return {value}\n")
    folder, config = model(tmp_path, files={"batch_strategy.py": source})
    assert load(folder, config).include(None, work(), 1, 1) is expected


FAILING = """
def batch_initialize(batcher_state):
    raise RuntimeError("start failed")

def batch_include_request(request, batch_state):
    raise RuntimeError("include failed")

def batch_finalize(batch_state):
    raise RuntimeError("end failed")

def batcher_finalize(batcher_state):
    raise RuntimeError("close failed")
"""


def test_exceptions_are_logged_and_count_as_refusals(tmp_path, caplog):
    folder, config = model(tmp_path, "failing_model", files={"batch_strategy.py": FAILING})
    strategy = load(folder, config)
    with caplog.at_level(logging.ERROR, logger="shmserve.scheduling"):
        state = strategy.start_batch()
        assert state is None
        assert strategy.include(state, work("req-7"), 1, 1) is False
        strategy.end_batch(state)
        strategy.close()
        strategy.close()
    records = [r for r in caplog.records if r.name == "shmserve.scheduling"]
    assert [r.getMessage().split(": ")[-1] for r in records] == [
        "batch_initialize failed", "batch_include_request failed for request 'req-7'",
        "batch_finalize failed", "batcher_finalize failed"]
    for record, what in zip(records, ["start", "include", "end", "close"]):
        assert "'failing_model'" in record.getMessage()
        assert record.exc_info and f"{what} failed" in str(record.exc_info[1])
    assert "Traceback" in caplog.text


def test_two_models_with_their_own_files_do_not_clash(tmp_path):
    counting = """
        COUNT = 0
        LIMIT = {}
        def batch_include_request(request, batch_state):
            global COUNT
            COUNT += 1
            return COUNT <= LIMIT
    """
    first = load(*model(tmp_path, "first", files={"batch_strategy.py": counting.format(1)}))
    second = load(*model(tmp_path, "second", files={"batch_strategy.py": counting.format(3)}))
    assert first._module is not second._module
    assert first._module.__name__ != second._module.__name__
    assert "batch_strategy" not in sys.modules
    assert [first.include(None, work(), 1, 1) for _ in range(3)] == [True, False, False]
    assert [second.include(None, work(), 1, 1) for _ in range(3)] == [True, True, True]
    first.close()
    assert second.include(None, work(), 1, 1) is False  # its own COUNT went on to 4


# ---- the request view ----

def test_view_fields():
    inputs = [fp32_input([[1, 2], [3, 4], [5, 6]]), fp32_input([7], name="EXTRA")]
    view = RequestView(work("id-1", inputs, {"tenant": "a", "n": 3}), 3, 2)
    assert (view.request_id, view.batch_size, view.priority) == ("id-1", 3, 2)
    assert view.parameters == {"tenant": "a", "n": 3}
    assert view.input_names == ["INPUT0", "EXTRA"]
    assert view.input_shape("INPUT0") == (3, 2)
    assert view.input_datatype("EXTRA") == "FP32"
    assert "id-1" in repr(view) and "INPUT0" in repr(view)


def test_view_is_read_only():
    view = RequestView(work(parameters={"k": 1}), 1, 1)
    with pytest.raises(AttributeError):
        view.batch_size = 2
    with pytest.raises(AttributeError):
        view.anything = 2
    with pytest.raises(TypeError):
        view.parameters["k"] = 2


def test_numpy_view_shares_the_request_bytes():
    data = bytearray(np.arange(6, dtype=np.int32).tobytes())
    view = RequestView(work(inputs=[WorkInput("IN", "INT32", [2, 3], memoryview(data))]), 2, 1)
    array = view.input_as_numpy("IN")
    assert array.dtype == np.int32 and array.shape == (2, 3)
    np.testing.assert_array_equal(array, np.arange(6).reshape(2, 3))
    assert not array.flags.writeable
    data[0] = 42  # the same memory, not a copy
    assert array[0, 0] == 42


def test_numpy_view_of_bf16_is_its_uint16_storage():
    raw = np.array([0x3F80, 0x4000], dtype="<u2")
    view = RequestView(work(inputs=[WorkInput("IN", "BF16", [2], raw.tobytes())]), 1, 1)
    np.testing.assert_array_equal(view.input_as_numpy("IN"), raw)


def test_numpy_view_of_bytes_input():
    values = [b"a", b"", "ü".encode(), b"\x00\xff"]
    tensor = WorkInput("TEXT", "BYTES", [2, 2], datatypes.serialize_bytes(values))
    array = RequestView(work(inputs=[tensor]), 2, 1).input_as_numpy("TEXT")
    assert array.dtype == np.object_ and array.shape == (2, 2)
    assert array.ravel().tolist() == values
    assert not array.flags.writeable


def test_unknown_input_name_is_a_clear_key_error():
    view = RequestView(work("id-9", [fp32_input([1, 2])]), 1, 1)
    for call in (view.input_shape, view.input_datatype, view.input_as_numpy):
        with pytest.raises(KeyError) as info:
            call("NOPE")
        message = str(info.value)
        assert "'NOPE'" in message and "id-9" in message and "INPUT0" in message


def test_strategy_reads_inputs_through_the_view(tmp_path):
    # The documented example's idea: cap the elements of INPUT0 per batch.
    source = """
        import numpy as np
        def batch_initialize(batcher_state):
            return {"elements": 0}
        def batch_include_request(request, batch_state):
            n = request.input_as_numpy("INPUT0").size
            if batch_state["elements"] + n > 6:
                return False
            batch_state["elements"] += n
            return True
    """
    folder, config = model(tmp_path, files={"batch_strategy.py": source})
    strategy = load(folder, config)
    state = strategy.start_batch()
    requests = [work(str(i), [fp32_input(np.zeros((2, 2)))]) for i in range(2)]
    assert [strategy.include(state, r, 2, 1) for r in requests] == [True, False]
