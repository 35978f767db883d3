"""Top-k strings of the classification extension (shmserve/extensions/classification.py)."""

import numpy as np
import pytest

from shmserve.errors import ServerError
from shmserve.extensions.classification import classify, read_labels
from shmserve.inference import OutputTensor
from shmserve.ipc import datatypes
from shmserve.proto import ModelConfig


def strings(out: OutputTensor) -> list:
    return [v.decode() for v in datatypes.deserialize_bytes(out.data)]


def test_an_unbatched_output_is_one_list_and_ties_keep_index_order():
    out = OutputTensor("P", "FP32", [2, 2], np.array([[1, 5], [5, 2]], np.float32).tobytes())
    top = classify(out, 3, batched=False, labels=["a", "b"])
    assert (top.datatype, top.shape) == ("BYTES", [3])
    assert strings(top) == ["5.000000:1:b", "5.000000:2", "2.000000:3"]


def test_bf16_values_read_as_the_floats_they_are():
    bits = (np.array([0.5, 2.0], np.float32).view(np.uint32) >> 16).astype(np.uint16)
    top = classify(OutputTensor("P", "BF16", [1, 2], bits.tobytes()), 1, batched=True,
                   labels=None)
    assert (top.shape, strings(top)) == ([1, 1], ["2.000000:1"])


@pytest.mark.parametrize("datatype, data", [("BYTES", b"\1\0\0\0x"), ("BOOL", b"\1")])
def test_bytes_and_bool_outputs_are_refused_in_tritons_words(datatype, data):
    with pytest.raises(ServerError) as err:
        classify(OutputTensor("S", datatype, [1], data), 1, False, None)
    assert err.value.message == (f"class result not available for output due to unsupported "
                                 f"type '{datatype}'")


def test_labels_come_from_the_model_folder(tmp_path):
    (tmp_path / "l.txt").write_text("zero\none\n")
    config = ModelConfig()
    config.output.add(name="P", label_filename="l.txt")
    config.output.add(name="Q")
    assert read_labels(str(tmp_path), config) == {"P": ["zero", "one"]}
    config.output.add(name="R", label_filename="missing.txt")
    with pytest.raises(ServerError, match="labels of output 'R'"):
        read_labels(str(tmp_path), config)
