"""Wire datatypes: sizes, numpy mapping, config names, BYTES encoding."""

import numpy as np
import pytest

from shmserve.ipc import datatypes as dt


def test_every_wire_type_has_a_size_and_a_config_name():
    sizes = {"BOOL": 1, "UINT8": 1, "UINT16": 2, "UINT32": 4, "UINT64": 8, "INT8": 1,
             "INT16": 2, "INT32": 4, "INT64": 8, "FP16": 2, "FP32": 4, "FP64": 8, "BF16": 2,
             "BYTES": 0}
    assert dt.WIRE_TYPES == set(sizes)
    for name, size in sizes.items():
        assert dt.element_size(name) == size
        assert dt.config_to_wire(dt.wire_to_config(name)) == name
    assert dt.config_to_wire("TYPE_STRING") == "BYTES"


@pytest.mark.parametrize("dtype,wire", [(np.bool_, "BOOL"), (np.uint8, "UINT8"), (np.int64, "INT64"),
                                        (np.float16, "FP16"), (np.float64, "FP64"),
                                        (np.dtype(">i4"), "INT32"), (np.object_, "BYTES"),
                                        (np.dtype("S3"), "BYTES")])
def test_wire_from_numpy(dtype, wire):
    assert dt.wire_from_numpy(dtype) == wire


def test_wire_from_numpy_refuses_unknown():
    with pytest.raises(ValueError):
        dt.wire_from_numpy(np.complex64)


def test_bytes_round_trip_and_checks():
    values = [b"", b"a", "\u00e9".encode(), bytes(range(256))]
    buf = dt.serialize_bytes(values)
    assert dt.deserialize_bytes(buf, 4) == values
    dt.check_bytes(buf, 4)
    with pytest.raises(ValueError):
        dt.check_bytes(buf, 3)
    with pytest.raises(ValueError):
        dt.check_bytes(buf[:-1], 4)
    with pytest.raises(ValueError):
        dt.check_bytes(b"\x01\x00", 1)
    with pytest.raises(ValueError):
        dt.deserialize_bytes(buf + b"\x05\x00\x00\x00ab")


def test_element_count():
    assert dt.element_count([]) == 1
    assert dt.element_count([2, 3, 4]) == 24
    assert dt.element_count([5, 0]) == 0
