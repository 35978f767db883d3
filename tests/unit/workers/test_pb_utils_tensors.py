"""Our `triton_python_backend_utils`: the maps between Triton's type numbers, its type strings
and numpy's types, the constants, the BYTES helpers (serialize_byte_tensor and
deserialize_bytes_tensor), and Tensor with its DLPack exchange, BF16 included."""

import numpy as np
import pytest

import workers.triton_python_backend_utils as pb_utils
from shmserve.ipc import datatypes
from workers import dlpack


# --- type maps --------------------------------------------------------------------------------


NUMBERED = [
    (1, np.bool_), (2, np.uint8), (3, np.uint16), (4, np.uint32), (5, np.uint64),
    (6, np.int8), (7, np.int16), (8, np.int32), (9, np.int64),
    (10, np.float16), (11, np.float32), (12, np.float64), (13, np.object_),
]


@pytest.mark.parametrize("number,numpy_type", NUMBERED)
def test_triton_numbers_map_both_ways(number, numpy_type):
    assert pb_utils.triton_to_numpy_type(number) is numpy_type
    assert pb_utils.numpy_to_triton_type(numpy_type) == number
    assert pb_utils.numpy_to_triton_type(np.dtype(numpy_type)) == number


def test_type_map_edges():
    assert pb_utils.numpy_to_triton_type(np.bytes_) == 13
    assert pb_utils.numpy_to_triton_type(np.complex64) is None
    assert pb_utils.numpy_to_triton_type(np.dtype(">f4")) is None
    assert pb_utils.triton_to_numpy_type(14) is None  # BF16: no numpy type
    assert pb_utils.triton_to_numpy_type(0) is None


def test_triton_string_to_numpy():
    assert pb_utils.triton_string_to_numpy("TYPE_FP32") is np.float32
    assert pb_utils.triton_string_to_numpy("TYPE_STRING") is np.object_
    assert pb_utils.TRITON_STRING_TO_NUMPY["TYPE_BOOL"] is bool
    with pytest.raises(KeyError):
        pb_utils.triton_string_to_numpy("TYPE_BF16")


def test_constants():
    assert pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL == 1
    assert pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START == 1
    assert pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END == 2
    assert pb_utils.TRITONSERVER_REQUEST_RELEASE_ALL == 1
    assert pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE == 2
    assert pb_utils.TRITONSERVER_MEMORY_CPU != pb_utils.TRITONSERVER_MEMORY_GPU


# --- BYTES helpers ----------------------------------------------------------------------------


def test_serialize_deserialize_bytes_round_trip():
    values = np.array([[b"a", b""], ["h\xe9", b"\x00\x01"]], dtype=np.object_)
    encoded = pb_utils.serialize_byte_tensor(values)
    assert encoded == (b"\x01\x00\x00\x00a" + b"\x00\x00\x00\x00"
                       + b"\x03\x00\x00\x00h\xc3\xa9" + b"\x02\x00\x00\x00\x00\x01")
    decoded = pb_utils.deserialize_bytes_tensor(encoded)
    assert decoded.dtype == np.object_ and decoded.shape == (4,)
    assert list(decoded) == [b"a", b"", "h\xe9".encode(), b"\x00\x01"]


def test_serialize_byte_tensor_edges():
    assert pb_utils.serialize_byte_tensor(np.array([b"xy"], dtype=np.bytes_)) == b"\x02\0\0\0xy"
    assert pb_utils.serialize_byte_tensor(np.array([1, 2], dtype=np.int32)) is None
    assert pb_utils.serialize_byte_tensor(np.empty(0, dtype=np.object_)) == b""


def test_deserialize_keeps_equal_length_elements_as_bytes():
    decoded = pb_utils.deserialize_bytes_tensor(datatypes.serialize_bytes([b"ab", b"cd"]))
    assert decoded.shape == (2,) and decoded[0] == b"ab"


# --- Tensor -----------------------------------------------------------------------------------


def test_tensor_basics():
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    tensor = pb_utils.Tensor("x", array)
    assert tensor.name() == "x"
    assert tensor.as_numpy() is array
    assert tensor.shape() == [2, 3]
    assert tensor.triton_dtype() == 11
    assert tensor.is_cpu()
    assert tensor.__dlpack_device__() == (dlpack.KDL_CPU, 0)


def test_tensor_rejects_empty_name_and_unsupported_dtype():
    with pytest.raises(pb_utils.TritonModelException, match="empty string"):
        pb_utils.Tensor("", np.zeros(1))
    with pytest.raises(pb_utils.TritonModelException, match="not supported"):
        pb_utils.Tensor("c", np.zeros(2, dtype=np.complex64))


def test_tensor_makes_arrays_contiguous_and_little_endian():
    strided = np.arange(12, dtype=np.int32).reshape(3, 4)[:, ::2]
    tensor = pb_utils.Tensor("s", strided)
    assert tensor.as_numpy().flags.c_contiguous
    np.testing.assert_array_equal(tensor.as_numpy(), strided)
    big = pb_utils.Tensor("b", np.array([1.5, 2.5], dtype=">f8"))
    assert big.as_numpy().dtype == np.dtype("<f8") and big.triton_dtype() == 12


def test_bytes_tensor_keeps_object_array_and_converts_string_arrays():
    objects = np.array([b"a", b"bc"], dtype=np.object_)
    assert pb_utils.Tensor("o", objects).triton_dtype() == 13
    fixed = pb_utils.Tensor("f", np.array([b"ab", b"c"]))
    assert fixed.as_numpy().dtype == np.object_ and list(fixed.as_numpy()) == [b"ab", b"c"]
    with pytest.raises(pb_utils.TritonModelException, match="string tensors"):
        pb_utils.Tensor("o", objects).to_dlpack()


def test_dlpack_round_trip_shares_memory():
    array = np.arange(12, dtype=np.int64).reshape(3, 4)
    back = pb_utils.Tensor.from_dlpack("y", pb_utils.Tensor("x", array).to_dlpack())
    assert back.name() == "y" and back.triton_dtype() == 9 and back.shape() == [3, 4]
    assert np.shares_memory(back.as_numpy(), array)


def test_dlpack_interoperates_with_numpy():
    tensor = pb_utils.Tensor("x", np.array([True, False]))
    np.testing.assert_array_equal(np.from_dlpack(tensor), [True, False])
    from_numpy = pb_utils.Tensor.from_dlpack("z", np.arange(3, dtype=np.float16))
    assert from_numpy.triton_dtype() == 10


def test_to_dlpack_of_read_only_array():
    read_only = np.frombuffer(b"\x01\x00\x02\x00", dtype=np.int16)
    tensor = pb_utils.Tensor._wrap("r", read_only, "INT16")
    np.testing.assert_array_equal(np.from_dlpack(tensor), [1, 2])


def test_from_dlpack_rejects_non_contiguous_and_non_dlpack():
    strided = np.arange(10, dtype=np.float32)[::2]
    with pytest.raises(pb_utils.TritonModelException, match="not contiguous"):
        pb_utils.Tensor.from_dlpack("x", strided)
    with pytest.raises(pb_utils.TritonModelException, match="DLPack capsule"):
        pb_utils.Tensor.from_dlpack("x", [1, 2])


def test_bf16_as_numpy_raises_but_dlpack_carries_bf16():
    bits = np.array([0x3F80, 0x4000, 0xC040], dtype=np.uint16)  # 1.0, 2.0, -3.0
    tensor = pb_utils.Tensor._wrap("h", bits, "BF16")
    assert tensor.triton_dtype() == 14
    with pytest.raises(pb_utils.TritonModelException, match="BF16"):
        tensor.as_numpy()

    capsule = tensor.to_dlpack()
    assert dlpack.dtype(capsule) == (dlpack.KDL_BFLOAT, 16, 1)
    # numpy has no bfloat16, so it must refuse the capsule: proof the label is not uint16.
    with pytest.raises((BufferError, RuntimeError, TypeError)):
        np.from_dlpack(dlpack.CapsuleExporter(capsule, (dlpack.KDL_CPU, 0)))

    back = pb_utils.Tensor.from_dlpack("h2", capsule)
    assert back.triton_dtype() == 14 and back.shape() == [3]
    assert np.shares_memory(back._array, bits)
    np.testing.assert_array_equal(back._array, bits)
    assert dlpack.dtype(pb_utils.Tensor.from_dlpack("h3", back).to_dlpack())[0] == dlpack.KDL_BFLOAT
