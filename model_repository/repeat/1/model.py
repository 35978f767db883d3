"""Decoupled repeat: each element of IN comes back as its own response (OUT = the value, IDX =
its position), then the final flag alone. An optional DELAY gives the milliseconds to wait
before each response.

A request with delays is streamed from its own thread, so that its waiting never holds up
the other requests of the batch or the next batches; one without is answered at once.
A cancelled request stops early.
"""

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
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().reshape(-1)
            delay = pb_utils.get_input_tensor_by_name(request, "DELAY")
            delays = None if delay is None else delay.as_numpy().reshape(-1)
            if delays is None or not delays.any():
                _repeat(request, values, None)
                continue
            thread = threading.Thread(target=self._run, args=(request, values, delays),
                                      daemon=True)
            with self._lock:
                self._threads.add(thread)
            thread.start()
        return None

    def _run(self, request, values, delays):
        try:
            _repeat(request, values, delays)
        finally:
            with self._lock:
                self._threads.discard(threading.current_thread())

    def finalize(self):
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join()


def _repeat(request, values, delays):
    sender = request.get_response_sender()
    for i, value in enumerate(values):
        if delays is not None and i < len(delays) and delays[i]:
            # Sleep in short steps so that a cancelled request stops promptly.
            deadline = time.monotonic() + delays[i] / 1000.0
            while not sender.is_cancelled():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                time.sleep(min(0.005, left))
        if sender.is_cancelled():
            break
        sender.send(pb_utils.InferenceResponse([
            pb_utils.Tensor("OUT", np.array([value], dtype=np.int32)),
            pb_utils.Tensor("IDX", np.array([i], dtype=np.uint32)),
        ]))
    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

