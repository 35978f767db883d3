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
        dt.deserialize_bytes(buf + b"\x05\x00\x00\x00ab")


def _layout_problem(buffer, count):
    with pytest.raises(dt.BytesLayoutError) as err:
        dt.check_bytes(buffer, count)
    e = err.value
    return e.problem, e.found, e.size, e.available


def test_bytes_layout_problems_in_the_order_triton_finds_them():
    two = dt.serialize_bytes([b"a", b"bc"])  # 1 + 4, 2 + 4 bytes
    assert _layout_problem(two, 1) == ("many", 2, 0, 0)  # at the element past the count
    assert _layout_problem(dt.serialize_bytes([b"x"] * 5), 2) == ("many", 3, 0, 0)
    assert _layout_problem(two, 3) == ("few", 2, 0, 0)
    assert _layout_problem(two + b"\x00\x00", 2) == ("length", 2, 0, 2)
    assert _layout_problem(b"\x01\x00", 1) == ("length", 0, 0, 2)
    # The last element cut short: said so when the count is right, else a count too low.
    assert _layout_problem(two[:-1], 2) == ("data", 2, 2, 1)
    assert _layout_problem(two[:-1], 3) == ("few", 2, 0, 0)
    dt.check_bytes(b"", 0)
    dt.check_bytes(dt.serialize_bytes([b"", b""]), 2)


def test_element_count():
    assert dt.element_count([]) == 1
    assert dt.element_count([2, 3, 4]) == 24
    assert dt.element_count([5, 0]) == 0
