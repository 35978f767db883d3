"""The Python backend (PythonModel) answering through response senders, with small model.py
files written into a temporary repository: decoupled models streaming from threads (their
failures, cancellation, and the None they must return), and a model that is not decoupled
answering through its sender: misuse, a response sent after execute returned (awaited), and a
request the model dropped unanswered (failed at once)."""

import threading
import time

import pytest

from tests.unit.workers.python_backend_helpers import (CONFIG, DOUBLE, assert_internal_error,
                                                       fp32_request, outputs_of, run)


# --- decoupled models -------------------------------------------------------------------------


DECOUPLED = dict(CONFIG, model_transaction_policy={"decoupled": True})


# Sends IN[0] responses (0, 1, ...) for each request from a thread, after execute returned;
# IN[0] < 0 raises in execute, 0 sends the final flag alone.
STREAMER = """
import threading
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        threads = []
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            if n < 0:
                raise ValueError("negative count")
            threads.append(threading.Thread(target=self._stream, args=(request, n)))
        for t in threads:
            t.start()
        return None

    def _stream(self, request, n):
        sender = request.get_response_sender()
        for i in range(n):
            if sender.is_cancelled():
                break
            sender.send(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUT", np.array([i], dtype=np.float32)),
                pb_utils.Tensor("EXTRA", np.array([i], dtype=np.int32))]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""


class Collector:
    """respond(...) of several requests; wait() until each has its final response."""

    def __init__(self, count):
        self.responses = [[] for _ in range(count)]
        self.finals = [threading.Event() for _ in range(count)]

    def respond(self, index):
        def respond(response, final):
            self.responses[index].append(response)
            if final:
                self.finals[index].set()
        return respond

    def wait(self):
        for event in self.finals:
            assert event.wait(10)


def test_decoupled_model_answers_through_respond(make_runner):
    runner = make_runner(STREAMER, config=DECOUPLED)
    runner.initialize()
    got = Collector(3)
    requests = [fp32_request([n], f"r{n}", outputs=["OUT"], respond=got.respond(k))
                for k, n in enumerate((3, 0, 1))]
    responses, _ = runner.execute(requests)
    assert responses == []
    got.wait()
    values = [[None if r is None else outputs_of(r)["OUT"].array.tolist() for r in rs]
              for rs in got.responses]
    # The final flag arrives alone; EXTRA was not requested.
    assert values == [[[0.0], [1.0], [2.0], None], [None], [[0.0], None]]


def test_decoupled_execute_failure_ends_open_requests_with_the_error(make_runner):
    runner = make_runner(STREAMER, config=DECOUPLED)
    runner.initialize()
    got = Collector(2)
    requests = [fp32_request([2], "a", respond=got.respond(0)),
                fp32_request([-1], "b", respond=got.respond(1))]
    assert runner.execute(requests)[0] == []
    got.wait()
    for responses in got.responses:
        (last,) = responses
        assert last.error[0] == "INTERNAL" and "negative count" in last.error[1]


def test_decoupled_cancellation_reaches_the_sender(make_runner):
    runner = make_runner(STREAMER, config=DECOUPLED)
    runner.initialize()
    got = Collector(1)
    request = fp32_request([1000], respond=got.respond(0), is_cancelled=lambda: True)
    runner.execute([request])
    got.wait()
    assert got.responses[0] == [None]


def test_decoupled_model_must_return_none(make_runner):
    runner = make_runner(DOUBLE, config=DECOUPLED)
    runner.initialize()
    got = Collector(1)
    runner.execute([fp32_request([1], respond=got.respond(0))])
    got.wait()
    (only,) = got.responses[0]
    assert only.error[0] == "INTERNAL" and "must return None" in only.error[1]


# --- the sender of a model that is not decoupled ----------------------------------------------


def test_response_through_sender_for_non_decoupled_model(make_runner):
    runner = make_runner("""
        import numpy as np
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def execute(self, requests):
                for request in requests:
                    sender = request.get_response_sender()
                    out = pb_utils.Tensor("OUT", np.full(1, 5, np.float32))
                    if request.request_id() == "split":
                        sender.send(pb_utils.InferenceResponse([out]))
                        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                    else:
                        sender.send(pb_utils.InferenceResponse([out]),
                                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                return None
    """)
    runner.initialize()
    for response in run(runner, fp32_request([0], "one"), fp32_request([0], "split")):
        assert outputs_of(response)["OUT"].array.tolist() == [5.0]


@pytest.mark.parametrize("body,text", [
    ("sender.send(flags=FINAL)", "cannot send complete final before sending a response"),
])
def test_sender_misuse_fails_the_batch(make_runner, body, text):
    runner = make_runner(f"""
        import triton_python_backend_utils as pb_utils
        FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL

        class TritonPythonModel:
            def execute(self, requests):
                sender = requests[0].get_response_sender()
                r = pb_utils.InferenceResponse()
                {body}
    """)
    runner.initialize()
    assert_internal_error(run(runner, fp32_request([0]))[0], "m_0_0", text)


@pytest.mark.parametrize("misuse,text", [
    ("sender.send(r, flags=FINAL); return [r]", "Response sender has been closed"),
    ("sender.send(r); sender.send(r)", "cannot send more than one response"),
])
def test_a_sent_response_survives_a_later_failure(make_runner, caplog, misuse, text):
    """A response was delivered: sending another, or returning it again, fails execute; the
    failure is logged and the client still gets the response, as in Triton."""
    runner = make_runner(f"""
        import numpy as np
        import triton_python_backend_utils as pb_utils
        FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL

        class TritonPythonModel:
            def execute(self, requests):
                r = pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.ones(1, np.float32))])
                sender = requests[0].get_response_sender()
                {misuse}
    """)
    runner.initialize()
    with caplog.at_level("ERROR"):
        response = run(runner, fp32_request([0], "x"))[0]
    assert outputs_of(response)["OUT"].array.tolist() == [1.0]
    assert text in caplog.text


def test_response_without_final_is_an_error(make_runner):
    runner = make_runner("""
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def execute(self, requests):
                requests[0].get_response_sender().send(pb_utils.InferenceResponse())
    """)
    runner.initialize()
    assert_internal_error(run(runner, fp32_request([0], "x"))[0], "m_0_0",
                          "without TRITONSERVER_RESPONSE_COMPLETE_FINAL")


@pytest.mark.parametrize("later", [
    # from a thread, the response with FINAL
    "threading.Thread(target=lambda: (time.sleep(0.2), sender.send(r, flags=FINAL))).start()",
    # the response now, FINAL from a thread
    "sender.send(r); threading.Timer(0.2, sender.send, kwargs={'flags': FINAL}).start()",
    # kept by the model alone (in self), answered from another thread
    "self.kept.append(sender); threading.Timer(0.2, self.answer_kept, args=(r,)).start()",
])
def test_a_response_sent_after_execute_returned_is_awaited(make_runner, later):
    """Triton lets a model that is not decoupled return None for a request and answer it
    later, from another thread."""
    runner = make_runner(f"""
        import threading, time
        import numpy as np
        import triton_python_backend_utils as pb_utils
        FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL

        class TritonPythonModel:
            def initialize(self, args):
                self.kept = []

            def answer_kept(self, r):
                self.kept.pop().send(r, flags=FINAL)

            def execute(self, requests):
                answers = []
                for request in requests:
                    if request.request_id() == "now":
                        answers.append(pb_utils.InferenceResponse(
                            [pb_utils.Tensor("OUT", np.zeros(1, np.float32))]))
                        continue
                    r = pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.ones(1, np.float32))])
                    sender = request.get_response_sender()
                    {later}
                    answers.append(None)
                return answers
    """)
    runner.initialize()
    late, now = run(runner, fp32_request([0], "late"), fp32_request([0], "now"))
    assert outputs_of(late)["OUT"].array.tolist() == [1.0]
    assert outputs_of(now)["OUT"].array.tolist() == [0.0]


def test_a_request_the_model_dropped_unanswered_is_not_awaited(make_runner):
    """Nothing can answer it any more (Triton would never answer it): it fails at once."""
    runner = make_runner("""
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def execute(self, requests):
                self.cycle = None
                holder = {"request": requests[0]}
                holder["self"] = holder  # only a cycle holds it once execute returns
                return [None]
    """)
    runner.initialize()
    started = time.monotonic()
    response = run(runner, fp32_request([0], "x"))[0]
    assert_internal_error(response, "m_0_0", "execute returned None for request 'x'")
    assert time.monotonic() - started < 5
