"""The classification extension: a requested output with the parameter `classification: k`
comes back as BYTES, the k largest values of each batch item as "<value>:<index>" or, where
the output's `label_filename` names a label for that index, "<value>:<index>:<label>".
Values are written as C++'s std::to_string writes them (floats with six decimals), as
Triton does.
"""

import os

import numpy as np

from shmserve.errors import Code, ReadError, ServerError
from shmserve.inference import OutputTensor
from shmserve.ipc import datatypes


def read_labels(model_dir: str, config) -> dict:
    """{output name: [label, ...]} from the outputs' `label_filename`s (one label a line, in
    the model's folder)."""
    labels = {}
    for output in config.output:
        if not output.label_filename:
            continue
        path = os.path.join(model_dir, output.label_filename)
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                labels[output.name] = f.read().splitlines()
        except OSError as exc:
            raise ServerError(Code.INVALID_ARG, f"unable to read the labels of output "
                                                f"'{output.name}' from '{path}': "
                                                f"{exc.strerror}") from None
    return labels


def classify(out: OutputTensor, k: int, batched: bool, labels: list | None) -> OutputTensor:
    if out.datatype in ("BYTES", "BOOL"):
        # Triton's words, which name no output and no request: it finds this as it writes
        # the answer, after the model ran.
        raise ReadError(Code.INVALID_ARG, f"class result not available for output due to "
                                          f"unsupported type '{out.datatype}'")
    values = _values(out)
    shape = list(out.shape)
    rows = shape[0] if batched and shape else 1
    values = values.reshape(rows, -1)
    top = min(k, values.shape[1])
    results = []
    for row in values:
        # Largest first; equal values keep index order.
        order = np.argsort(-row.astype(np.float64), kind="stable")[:top]
        for index in order:
            text = f"{_number(row[index])}:{index}"
            if labels is not None and index < len(labels):
                text += f":{labels[index]}"
            results.append(text.encode())
    new_shape = [rows, top] if batched and shape else [top]
    return OutputTensor(out.name, "BYTES", new_shape, datatypes.serialize_bytes(results),
                        out.parameters)


def _values(out: OutputTensor) -> np.ndarray:
    if out.datatype == "BF16":  # the upper half of a float32
        raw = np.frombuffer(out.data, dtype=np.uint16).astype(np.uint32) << 16
        return raw.view(np.float32)
    return np.frombuffer(out.data, dtype=datatypes.numpy_dtype(out.datatype))


def _number(value) -> str:
    if isinstance(value, np.floating):
        return f"{float(value):f}"
    return str(int(value))
