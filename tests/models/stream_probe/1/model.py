"""Decoupled probe: COUNT responses, the k-th (from 0) an OUT of SIZE bytes all equal to
k % 256, then the final flag alone. Each request streams from its own thread, so execute
returns at once and a test can watch the model from outside while the client reads slowly
or goes away.

Request parameters:
- `record_to`: a file the model rewrites after every send (`sent <k>`, k responses sent so far)
  and when it notices cancellation (`cancelled <k>`); replaced atomically, so a reader never
  sees half a line.
- `delay_ms`: the wait between two responses.
- `fail_after`: after that many good responses (fewer than COUNT), an error response ("probe failure") with the
  final flag ends the request.
A cancelled request stops before its next send and ends with the final flag alone.
"""

import json
import os
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self._threads = set()
        self._lock = threading.Lock()

    def execute(self, requests):
        for request in requests:
            count = int(pb_utils.get_input_tensor_by_name(request, "COUNT").as_numpy()[0])
            size = pb_utils.get_input_tensor_by_name(request, "SIZE")
            size = 4 if size is None else int(size.as_numpy()[0])
            params = json.loads(request.parameters())
            thread = threading.Thread(
                target=self._run,
                args=(request.get_response_sender(), count, size, params.get("record_to"),
                      params.get("delay_ms", 0) / 1000.0, params.get("fail_after")),
                daemon=True)
            with self._lock:
                self._threads.add(thread)
            thread.start()
        return None

    def _run(self, *args):
        try:
            _stream(*args)
        finally:
            with self._lock:
                self._threads.discard(threading.current_thread())

    def finalize(self):
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join()


def _stream(sender, count, size, record_to, delay_s, fail_after):
    sent = 0
    for k in range(count):
        if k and delay_s:
            time.sleep(delay_s)
        if sender.is_cancelled():
            _record(record_to, f"cancelled {sent}")
            break
        if fail_after is not None and sent == fail_after:
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError("probe failure")),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return
        sender.send(pb_utils.InferenceResponse(
            [pb_utils.Tensor("OUT", np.full(size, k % 256, dtype=np.uint8))]))
        sent += 1
        _record(record_to, f"sent {sent}")
    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)


def _record(path, line):
    if path:
        with open(path + ".tmp", "w") as f:
            f.write(line)
        os.replace(path + ".tmp", path)
