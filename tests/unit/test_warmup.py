"""Building a config's warmup samples (shmserve/warmup.py): their data, and the samples that
cannot be built, refused before anything is allocated. Running them is end to end
(tests/e2e/test_warmup.py)."""

import struct

import pytest

from shmserve import warmup
from shmserve.config.parse import parse_config_text
from shmserve.errors import ServerError


def config(*samples: str):
    return parse_config_text('name: "m" backend: "python" max_batch_size: 4 model_warmup [ '
                             + ", ".join(samples) + " ]")


def sample(inputs: str, batch_size: int = 1, count: int = 0, name: str = "s") -> str:
    return f'{{ name: "{name}" batch_size: {batch_size} count: {count} inputs [ {inputs} ] }}'


def one(key: str, value: str) -> str:
    return f'{{ key: "{key}" value: {{ {value} }} }}'


def test_zeros_random_bytes_and_a_file(tmp_path):
    (tmp_path / "warmup").mkdir()
    (tmp_path / "warmup" / "x.bin").write_bytes(struct.pack("<3i", 7, 8, 9) + b"tail")
    built = warmup.samples(config(
        sample(one("Z", "data_type: TYPE_FP16 dims: [ 2, 3 ] zero_data: true"), batch_size=2,
               count=3),
        sample(one("R", "data_type: TYPE_FP32 dims: [ 5 ] random_data: true")),
        sample(one("F", 'data_type: TYPE_INT32 dims: [ 3 ] input_data_file: "x.bin"')),
        sample(one("S", "data_type: TYPE_STRING dims: [ 2 ] random_data: true")),
        sample(one("N", "data_type: TYPE_FP32 dims: [ 1 ] zero_data: true"), batch_size=0)),
        str(tmp_path), 1 << 20)
    assert [(s.name, s.batch_size, s.count) for s in built] == [
        ("s", 2, 3), ("s", 1, 1), ("s", 1, 1), ("s", 1, 1)]  # batch size 0: skipped
    assert built[0].inputs == (("Z", "FP16", [2, 3], bytes(12)),)
    assert len(built[1].inputs[0][3]) == 20
    assert built[2].inputs[0][3] == struct.pack("<3i", 7, 8, 9)  # the file's first 12 bytes
    assert built[3].inputs[0][3] == bytes(8)  # two empty strings


@pytest.mark.parametrize("value,message", [
    ("data_type: TYPE_FP32 dims: [ -1 ] zero_data: true",
     "warmup setting expects all variable-size dimensions are specified for input 'X'"),
    ("data_type: TYPE_FP32 dims: [ -3 ] zero_data: true",
     "tensor 'X' contains an invalid dimension [-3]"),
    ("data_type: TYPE_FP32 dims: [ 100000, 100000 ] zero_data: true",
     "warmup sample 's': input 'X' would take 40000000000 bytes, more than the 1048576 bytes "
     "this server takes for a tensor"),
    ("data_type: TYPE_FP32 dims: [ 4 ]",
     "[request id: <id_unknown>] warmup setting expects input 'X' to have input_data_type set"),
    ('data_type: TYPE_FP32 dims: [ 4 ] input_data_file: "short.bin"',
     "[request id: <id_unknown>] warmup setting expects 16 bytes, but the data provided from "
     "short.binonly has 3 bytes"),
])
def test_samples_that_cannot_be_built(tmp_path, value, message):
    (tmp_path / "warmup").mkdir()
    (tmp_path / "warmup" / "short.bin").write_bytes(b"abc")
    with pytest.raises(ServerError) as err:
        warmup.samples(config(sample(one("X", value))), str(tmp_path), 1 << 20)
    assert err.value.message == message


def test_a_data_file_larger_than_a_tensor_may_be_is_not_read_whole(tmp_path):
    (tmp_path / "warmup").mkdir()
    (tmp_path / "warmup" / "big.bin").write_bytes(bytes(2048))
    with pytest.raises(ServerError, match="is larger than the 1024 bytes"):
        warmup.samples(config(sample(one(
            "S", 'data_type: TYPE_STRING dims: [ 1 ] input_data_file: "big.bin"'))),
            str(tmp_path), 1024)
