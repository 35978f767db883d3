"""textgen_iterative (model_repository/textgen_iterative): model.py driven step by step as the
sequence batcher drives an iterative model (fresh request objects each step, same correlation
id, flags cleared after the first), and in its request-level mode, with fake response senders."""

import importlib.machinery
import importlib.util
import json
import os
import sys

import numpy as np
import pytest

import workers.triton_python_backend_utils as pb_utils
from tests.conftest import ROOT

VERSION_DIR = os.path.join(ROOT, "model_repository", "textgen_iterative", "1")
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
START = pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START
RESCHEDULE = pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE


def _import_version_package():
    """model.py and transformer.py as the server imports them (see test_textgen.py)."""
    sys.modules["triton_python_backend_utils"] = pb_utils
    spec = importlib.machinery.ModuleSpec("textgen_iterative_1", None, is_package=True)
    spec.submodule_search_locations = [VERSION_DIR]
    sys.modules["textgen_iterative_1"] = importlib.util.module_from_spec(spec)
    return (importlib.import_module("textgen_iterative_1.model"),
            importlib.import_module("textgen_iterative_1.transformer"))


model_py, tf = _import_version_package()

ITERATIVE = {"max_batch_size": 16,
             "sequence_batching": {"iterative_sequence": True,
                                   "oldest": {"max_candidate_sequences": 4}}}
DIRECT = {"max_batch_size": 4,
          "sequence_batching": {"iterative_sequence": True, "control_input": [
              {"name": "READY", "control": [{"kind": "CONTROL_SEQUENCE_READY",
                                             "int32_false_true": [0, 1]}]}]}}
REQUEST_LEVEL = {"max_batch_size": 16, "dynamic_batching": {}}


def serve(config):
    instance = model_py.TritonPythonModel()
    instance.initialize({"model_config": json.dumps(config), "model_instance_kind": "CPU"})
    return instance


@pytest.fixture(scope="module")
def model():
    return tf.Transformer.load(os.path.join(VERSION_DIR, "weights.npz"))


def greedy(model, prompt, max_tokens):
    return tf.generate(model, prompt, tf.SamplingParams(max_tokens, 0.0))


class Client:
    """One generation: the responses its sender received, and the request object of each step
    (as Triton hands a rescheduled request back: a new object, same id and correlation id)."""

    def __init__(self, correlation_id, prompt, stream=True, cancel_after=None, ready=None,
                 **parameters):
        self.correlation_id = correlation_id
        self.responses, self.flags = [], []
        self._cancel_after = cancel_after
        self._inputs = {"text_input": np.array([[prompt.encode()]], dtype=np.object_),
                        "stream": np.array([[stream]])}
        if ready is not None:
            self._inputs["READY"] = np.array([[ready]], np.int32)
        self._parameters = {"temperature": 0.0, **parameters}
        self.request = None

    def next_request(self, flags):
        sender = pb_utils.InferenceResponseSender(self._receive, self._cancelled)
        self.request = pb_utils.InferenceRequest._incoming(
            model_name="textgen_iterative", request_id=f"r{self.correlation_id}",
            correlation_id=self.correlation_id, flags=flags, timeout=0,
            parameters=self._parameters,
            inputs=[pb_utils.Tensor(name, value) for name, value in self._inputs.items()],
            requested_output_names=["text_output"], sender=sender)
        return self.request

    @property
    def rescheduled(self) -> bool:
        return bool(self.request._release_flags & RESCHEDULE)

    @property
    def done(self) -> bool:
        return FINAL in self.flags

    def _receive(self, response, flags):
        self.responses.append(response)
        self.flags.append(flags)

    def _cancelled(self):
        return self._cancel_after is not None and len(self.responses) >= self._cancel_after

    def texts(self):
        out = []
        for response in self.responses:
            if response is not None:
                assert not response.has_error(), response.error().message()
                tensor = pb_utils.get_output_tensor_by_name(response, "text_output")
                assert tensor.as_numpy().shape == (1, 1)
                out.append(tensor.as_numpy()[0, 0].decode())
        return out

    def error(self):
        assert self.flags == [FINAL] and self.responses[0].has_error()
        return self.responses[0].error()


def run_steps(instance, arrivals):
    """The iterative scheduler in miniature: `arrivals[i]` (a list of clients) joins at step i;
    clients the model rescheduled come back in the next step. Returns the batch sizes."""
    running, sizes = [], []
    for step in range(1000):
        new = arrivals[step] if step < len(arrivals) else []
        batch = [c.next_request(0) for c in running] + [c.next_request(START) for c in new]
        if not batch:
            return sizes
        sizes.append(len(batch))
        instance.execute(batch)
        running = [c for c in running + new if c.rescheduled]
    raise AssertionError("the generations never ended")


def test_one_step_gives_every_request_a_token_and_reschedules_the_unfinished(model):
    instance = serve(ITERATIVE)
    streaming = Client(1, "We hold these", max_tokens=5)
    whole = Client(2, "Tyger Tyger", stream=False, max_tokens=5)
    single = Client(3, "Four score", max_tokens=1)
    assert instance.execute([c.next_request(START) for c in (streaming, whole, single)]) is None
    assert streaming.texts() == [greedy(model, "We hold these", 5)[0]]
    assert streaming.flags == [0] and streaming.rescheduled
    assert whole.responses == [] and whole.rescheduled
    # One token was all it asked for: answered, not rescheduled, its slot already free.
    assert single.texts() == [greedy(model, "Four score", 1)] and single.flags == [FINAL]
    assert not single.rescheduled
    assert len(instance._decoder) == 2


def test_steps_produce_what_each_request_produces_alone_and_free_their_state(model):
    instance = serve(ITERATIVE)
    prompts = ["We hold these", "Shall I compare", "Once upon", "The Lord", "And the"]
    clients = [Client(10 + i, p, stream=i % 2 == 0, max_tokens=6 + 7 * i)
               for i, p in enumerate(prompts)]
    # Two start together; the others join running steps, one after a slot has been freed.
    sizes = run_steps(instance, [clients[:2], [], [clients[2]], [], [], [], [], [clients[3]],
                                 [], [], [], [], [], [], [], [clients[4]]])
    assert max(sizes) <= 4
    for i, (prompt, client) in enumerate(zip(prompts, clients)):
        expected = greedy(model, prompt, 6 + 7 * i)
        if i % 2 == 0:
            assert client.texts() == list(expected)
            assert client.flags == [0] * (len(expected) - 1) + [FINAL]
        else:
            assert client.texts() == [expected] and client.flags == [FINAL]
    assert len(instance._decoder) == 0


def test_a_generation_left_out_of_a_step_keeps_its_place(model):
    """A scheduler may step a subset of the generations: the others wait, unchanged."""
    instance = serve(ITERATIVE)
    first, second = Client(1, "We hold these", max_tokens=12), Client(2, "Death, be not",
                                                                       max_tokens=12)
    instance.execute([first.next_request(START), second.next_request(START)])
    for _ in range(3):
        instance.execute([second.next_request(0)])  # first sits in slot 0, left out
    while first.rescheduled or second.rescheduled:
        instance.execute([c.next_request(0) for c in (first, second) if c.rescheduled])
    assert "".join(first.texts()) == greedy(model, "We hold these", 12)
    assert "".join(second.texts()) == greedy(model, "Death, be not", 12)


def test_a_cancelled_request_ends_with_the_final_flag_and_frees_its_state():
    instance = serve(ITERATIVE)
    cancelled = Client(1, "And", max_tokens=200, cancel_after=3)
    other = Client(2, "The ", max_tokens=200)
    instance.execute([cancelled.next_request(START), other.next_request(START)])
    for _ in range(4):
        instance.execute([c.next_request(0) for c in (cancelled, other) if c.rescheduled])
    assert cancelled.flags == [0, 0, 0, FINAL] and cancelled.responses[-1] is None
    assert not cancelled.rescheduled
    assert 1 not in instance._decoder and 2 in instance._decoder


def test_null_requests_of_a_direct_batch_are_skipped(model):
    instance = serve(DIRECT)
    real = Client(5, "We hold these", max_tokens=3, ready=1)
    null = Client(0, "", ready=0)
    instance.execute([null.next_request(0), real.next_request(START)])
    while real.rescheduled:
        instance.execute([null.next_request(0), real.next_request(0)])
    assert null.responses == [] and not null.rescheduled
    assert "".join(real.texts()) == greedy(model, "We hold these", 3)


def test_a_reused_correlation_id_starts_over(model):
    instance = serve(ITERATIVE)
    old = Client(7, "Once upon", max_tokens=50)
    instance.execute([old.next_request(START)])
    new = Client(7, "Tyger Tyger", max_tokens=4)
    run_steps(instance, [[new]])
    assert "".join(new.texts()) == greedy(model, "Tyger Tyger", 4)
    assert len(instance._decoder) == 0


def test_a_request_without_start_and_without_state_is_refused():
    instance = serve(ITERATIVE)
    client = Client(9, "We")
    instance.execute([client.next_request(0)])
    assert "correlation id 9" in client.error().message() and not client.rescheduled


def test_bad_values_are_refused_without_taking_a_slot():
    instance = serve(ITERATIVE)
    client = Client(1, "We", top_p=2)
    instance.execute([client.next_request(START)])
    assert client.error().code() == pb_utils.TritonError.INVALID_ARG
    assert "top_p" in client.error().message()
    assert not client.rescheduled and len(instance._decoder) == 0


def test_request_level_mode_runs_its_batch_to_completion(model):
    instance = serve(REQUEST_LEVEL)
    prompts = ["We hold these", "Shall I compare", "Four score"]
    clients = [Client(0, p, stream=i != 1, max_tokens=5 + 10 * i) for i, p in enumerate(prompts)]
    assert instance.execute([c.next_request(0) for c in clients]) is None
    for i, (prompt, client) in enumerate(zip(prompts, clients)):
        expected = greedy(model, prompt, 5 + 10 * i)
        assert "".join(client.texts()) == expected and client.flags[-1] == FINAL
        assert len(client.flags) == (len(expected) if i != 1 else 1)
        assert not client.rescheduled
    assert len(instance._decoder) == 0


def test_a_generation_beyond_the_schedulers_slots_is_refused():
    instance = serve(ITERATIVE)  # 4 candidate sequences
    clients = [Client(i + 1, "We", max_tokens=9) for i in range(5)]
    instance.execute([c.next_request(START) for c in clients])
    assert [c.rescheduled for c in clients] == [True] * 4 + [False]
    assert "decode slots are busy" in clients[4].error().message()
