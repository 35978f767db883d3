"""Our `triton_python_backend_utils`: the config lookup helpers, the auto-complete ModelConfig
(what it fills in, what it refuses), and Logger, which keeps the level and the model's call
site."""

import json
import logging

import pytest

import workers.triton_python_backend_utils as pb_utils


# --- config helpers and ModelConfig -----------------------------------------------------------


CONFIG = {
    "name": "m",
    "max_batch_size": 8,
    "input": [{"name": "IN", "data_type": "TYPE_FP32", "dims": [4]}],
    "output": [{"name": "OUT", "data_type": "TYPE_FP32", "dims": [4]}],
}


def test_config_lookup_helpers():
    assert pb_utils.get_input_config_by_name(CONFIG, "IN")["dims"] == [4]
    assert pb_utils.get_output_config_by_name(CONFIG, "OUT")["data_type"] == "TYPE_FP32"
    assert pb_utils.get_input_config_by_name(CONFIG, "OUT") is None
    assert not pb_utils.using_decoupled_model_transaction_policy(CONFIG)
    decoupled = dict(CONFIG, model_transaction_policy={"decoupled": True})
    assert pb_utils.using_decoupled_model_transaction_policy(decoupled)


def test_model_config_completes_an_empty_config():
    config = pb_utils.ModelConfig(json.dumps({"name": "m", "max_batch_size": 0,
                                              "input": [], "output": []}))
    config.set_max_batch_size(4)
    config.set_dynamic_batching()
    config.add_input({"name": "IN", "data_type": "TYPE_INT32", "dims": [-1], "optional": True})
    config.add_output({"name": "OUT", "data_type": "TYPE_INT32", "dims": [-1]})
    config.set_model_transaction_policy({"decoupled": False})
    assert config.as_dict() == {
        "name": "m", "max_batch_size": 4, "dynamic_batching": {},
        "input": [{"name": "IN", "data_type": "TYPE_INT32", "dims": [-1], "optional": True}],
        "output": [{"name": "OUT", "data_type": "TYPE_INT32", "dims": [-1]}],
        "model_transaction_policy": {"decoupled": False},
    }


def test_model_config_fills_a_partial_entry():
    config = pb_utils.ModelConfig(json.dumps(
        {"name": "m", "max_batch_size": 0,
         "input": [{"name": "IN", "data_type": "TYPE_INVALID", "dims": []}], "output": []}))
    config.add_input({"name": "IN", "data_type": "TYPE_FP16", "dims": [2]})
    assert config.as_dict()["input"] == [{"name": "IN", "data_type": "TYPE_FP16", "dims": [2]}]


@pytest.mark.parametrize("edit,message", [
    (lambda c: c.set_max_batch_size(2), "configuration specified max_batch_size 8"),
    (lambda c: c.add_input({"name": "IN", "data_type": "TYPE_INT8", "dims": [4]}),
     "configuration expects datatype TYPE_FP32 for input 'IN', model provides TYPE_INT8"),
    (lambda c: c.add_output({"name": "OUT", "data_type": "TYPE_FP32", "dims": [5]}),
     r"the model expects dims \[5\] but the model configuration specifies dims \[4\]"),
    (lambda c: c.add_input({"name": "X", "data_type": "TYPE_FP32"}), "missing 'dims'"),
    (lambda c: c.add_input({"data_type": "TYPE_FP32", "dims": [1]}), "missing 'name'"),
    (lambda c: c.add_output({"name": "Y", "data_type": "TYPE_FP32", "dims": [1],
                             "optional": True}),
     "contains property other than 'name', 'data_type' and 'dims'"),
    (lambda c: c.set_model_transaction_policy({"streaming": True}),
     "contains property other than 'decoupled'"),
])
def test_model_config_checks(edit, message):
    with pytest.raises(ValueError, match=message):
        edit(pb_utils.ModelConfig(json.dumps(CONFIG)))


def test_model_config_scheduler_and_decoupled_conflicts():
    sequence = pb_utils.ModelConfig(json.dumps(dict(CONFIG, sequence_batching={})))
    with pytest.raises(ValueError, match="'sequence_batching'"):
        sequence.set_dynamic_batching()
    decoupled = pb_utils.ModelConfig(
        json.dumps(dict(CONFIG, model_transaction_policy={"decoupled": True})))
    with pytest.raises(ValueError, match="already set to 'True'"):
        decoupled.set_model_transaction_policy({"decoupled": False})
    decoupled.set_model_transaction_policy({"decoupled": True})


# --- Logger -----------------------------------------------------------------------------------


def test_logger_keeps_the_level_and_the_models_call_site():
    # The worker's root handler takes the records to the server log (workers/__main__.py).
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger(pb_utils.LOGGER_NAME)
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        pb_utils.Logger.log_info("hello")
        pb_utils.Logger.log_warn("careful")
        pb_utils.Logger.log_error("bad")
        pb_utils.Logger.log_verbose("detail")
        pb_utils.Logger.log("default level")
        pb_utils.Logger.log("shown", level=pb_utils.Logger.VERBOSE)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(logging.NOTSET)
    assert [(r.levelno, r.getMessage()) for r in records] == [
        (logging.INFO, "hello"), (logging.WARNING, "careful"), (logging.ERROR, "bad"),
        (logging.DEBUG, "detail"), (logging.INFO, "default level"), (logging.DEBUG, "shown")]
    # The location is the model's call site, not this module.
    assert {r.filename for r in records} == {"test_pb_utils_config_and_logger.py"}
    pb_utils._set_model_context(model_dir="/models/m/1")
    assert pb_utils.get_model_dir() == "/models/m/1"
