"""What the test_sequence_extras_* modules share: control inputs as Triton's JSON renders them
(`control`, CONTROLS), the implicit state ZERO_STATE, the sequence model's config CONFIG, and
`config_with`, CONFIG with other sequence_batching settings."""

import copy


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
