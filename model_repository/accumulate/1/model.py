"""A stateful running sum for Triton's sequence batcher.

OUTPUT = the sum of the sequence's INPUTs so far, this one included. The batcher injects the
control inputs START, END, READY (int32 0/1) and CORRID (uint64, the correlation id), one value
per request, whatever strategy schedules the sequence (`direct` or `oldest`): this file is the
same in model_repository/accumulate and accumulate_oldest, keep it so.

Sums are int32 and wrap around on overflow, as C arithmetic would (perf_analyzer sends random
INT32 data). A sequence that is never ended (the batcher drops it after the idle timeout without
telling the model) keeps its entry until its correlation id starts again.
"""
import numpy as np
import triton_python_backend_utils as pb_utils


def _column(requests, name: str) -> np.ndarray:
    """The tensor `name` of every request, one value per request."""
    return np.concatenate([pb_utils.get_input_tensor_by_name(r, name).as_numpy().reshape(-1) for r in requests])


def _wrap_int32(value: int) -> int:
    return (value + 2**31) % 2**32 - 2**31


class TritonPythonModel:
    def initialize(self, args):
        self.sums: dict[int, int] = {}  # correlation id -> running sum of the live sequence

    def execute(self, requests):
        inputs = _column(requests, "INPUT").tolist()
        starts, ends, readies = (_column(requests, name).tolist() for name in ("START", "END", "READY"))
        corrids = _column(requests, "CORRID").tolist()
        totals = []
        # One request at a time, in order, so that the sums stay right even if a batcher put two
        # requests of one sequence in a batch (Triton's never does).
        for value, start, end, ready, corrid in zip(inputs, starts, ends, readies, corrids):
            if not ready:  # a null request filling an empty slot of the batch: its answer is dropped
                totals.append(0)
                continue
            total = _wrap_int32(value + (0 if start else self.sums.get(corrid, 0)))
            if end:
                self.sums.pop(corrid, None)
            else:
                self.sums[corrid] = total
            totals.append(total)
        outputs = np.array(totals, dtype=np.int32).reshape(-1, 1)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", outputs[i:i + 1])])
                for i in range(len(requests))]
