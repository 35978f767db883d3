"""textgen (model_repository/textgen): the training gradients, the transformer's KV-cached and
batched decoding, sampling and stopping, the trained weights, and the decoupled model.py with
fake response senders."""

import importlib.machinery
import importlib.util
import os
import re
import sys
import threading

import numpy as np
import pytest

import workers.triton_python_backend_utils as pb_utils
from tests.conftest import ROOT

MODEL_DIR = os.path.join(ROOT, "model_repository", "textgen")
VERSION_DIR = os.path.join(MODEL_DIR, "1")
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def _import_version_package():
    """model.py and transformer.py as the server imports them: a package over the version
    folder (model.py imports transformer.py relatively), with our pb_utils installed."""
    sys.modules["triton_python_backend_utils"] = pb_utils
    spec = importlib.machinery.ModuleSpec("textgen_1", None, is_package=True)
    spec.submodule_search_locations = [VERSION_DIR]
    sys.modules["textgen_1"] = importlib.util.module_from_spec(spec)
    return (importlib.import_module("textgen_1.model"),
            importlib.import_module("textgen_1.transformer"))


def _import_train():
    saved = list(sys.path)
    try:
        spec = importlib.util.spec_from_file_location("textgen_train",
                                                      os.path.join(MODEL_DIR, "train.py"))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path[:] = saved


model_py, tf = _import_version_package()
train = _import_train()


@pytest.fixture(scope="module")
def model():
    return tf.Transformer.load(os.path.join(VERSION_DIR, "weights.npz"))


def tiny_weights(rng, dtype=np.float64):
    """A small random model (2 layers, d 16, 2 heads, context 12) with non-trivial norms."""
    params = train.init_params(rng, 2, 16, 12, len(tf.VOCAB), dtype=dtype)
    for name in params:
        params[name] += (rng.standard_normal(params[name].shape) * 0.1).astype(dtype)
    return params


def as_weights(params, n_head=2):
    return {**params, "vocab": np.frombuffer(tf.VOCAB.encode(), np.uint8), "n_head": n_head}


def assert_same_logits(actual, expected):
    """Equal to 1e-5 of the largest logit: float32 sums in another order differ by a few ulp."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape
    assert np.abs(actual - expected).max() <= 1e-5 * np.abs(expected).max()


def cross_entropy(logits, targets):
    logits = logits.astype(np.float64).reshape(-1, logits.shape[-1])
    logits -= logits.max(axis=1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    return -logp[np.arange(len(logits)), targets.reshape(-1)].mean()


# --- training ---------------------------------------------------------------------------------


def test_gradients_match_finite_differences():
    rng = np.random.default_rng(0)
    params = tiny_weights(rng)
    inputs = rng.integers(0, len(tf.VOCAB), (2, 12))
    targets = rng.integers(0, len(tf.VOCAB), (2, 12))
    _, grads = train.loss_and_grads(params, 2, inputs, targets)
    eps = 1e-5
    for name, value in params.items():
        for _ in range(4):
            index = tuple(rng.integers(0, n) for n in value.shape)
            old = value[index]
            value[index] = old + eps
            up, _ = train.loss_and_grads(params, 2, inputs, targets)
            value[index] = old - eps
            down, _ = train.loss_and_grads(params, 2, inputs, targets)
            value[index] = old
            numeric = (up - down) / (2 * eps)
            assert grads[name][index] == pytest.approx(numeric, rel=1e-4, abs=1e-9), name


def test_training_loss_is_the_models_cross_entropy():
    rng = np.random.default_rng(1)
    params = tiny_weights(rng, np.float32)
    inputs = rng.integers(0, len(tf.VOCAB), (3, 12))
    targets = rng.integers(0, len(tf.VOCAB), (3, 12))
    loss, _ = train.loss_and_grads(params, 2, inputs, targets)
    logits = tf.Transformer(as_weights(params)).forward(inputs)
    assert loss == pytest.approx(cross_entropy(logits, targets), rel=1e-5)


def test_adam_and_clipping_lower_the_loss():
    rng = np.random.default_rng(2)
    params = tiny_weights(rng, np.float32)
    inputs = rng.integers(0, len(tf.VOCAB), (4, 12))
    targets = np.roll(inputs, -1, axis=1)
    adam = train.Adam(params)
    first, _ = train.loss_and_grads(params, 2, inputs, targets)
    for _ in range(30):
        loss, grads = train.loss_and_grads(params, 2, inputs, targets)
        train.clip(grads, 1.0)
        adam.update(params, grads, 1e-2)
    assert loss < first / 2


def test_held_out_windows_never_overlap_training_windows():
    ids = np.arange(25000) % 96
    starts, held_out = train.split(ids, 100)
    held = (np.arange(len(ids)) // train.BLOCK) % train.VAL_EVERY == train.VAL_EVERY // 2
    assert len(starts) and len(held_out)
    assert not any(held[s:s + 100].any() for s in starts)


# --- the transformer --------------------------------------------------------------------------


def test_vocabulary_round_trip_and_replacements():
    vocab = tf.Vocabulary(tf.VOCAB)
    text = "We hold these truths ~ 1776!\n"
    assert vocab.decode(vocab.encode(text)) == text
    assert vocab.decode(vocab.encode("caf\u00e9\ttab")) == "caf? tab"


def test_kv_cache_decode_matches_full_forward(model):
    tokens = model.vocab.encode("When in the Course of human events, it becomes")
    full = model.forward(tokens[None])[0]
    cache = model.new_cache(1)
    prompt = 7
    logits = [model.prefill(tokens[:prompt], cache, 0)]
    for position in range(prompt, len(tokens)):
        logits.append(model.decode(tokens[position:position + 1], [position], cache)[0])
    assert_same_logits(logits, full[prompt - 1:])


def test_a_gpu_instance_computes_what_the_cpu_one_does(model):
    """A KIND_GPU instance's transformer runs on cupy: the same logits, to float32 rounding in
    another summation order (cuBLAS's), through a full pass, a prefill and decoding."""
    xp = tf.array_module("GPU")
    if xp is np:
        pytest.skip("needs cupy (pip install .[gpu])")
    try:
        gpus = xp.cuda.runtime.getDeviceCount()
    except xp.cuda.runtime.CUDARuntimeError:
        gpus = 0
    if not gpus:
        pytest.skip("needs an NVIDIA GPU")
    on_gpu = tf.Transformer.load(os.path.join(VERSION_DIR, "weights.npz"), xp)
    tokens = model.vocab.encode("It was the best of times, it was the worst")

    def close(actual, expected):
        assert isinstance(actual, np.ndarray)  # logits come back to the host for sampling
        assert np.abs(actual - expected).max() <= 1e-4 * np.abs(expected).max()

    close(on_gpu.forward(tokens[None]), model.forward(tokens[None]))
    caches = on_gpu.new_cache(1), model.new_cache(1)
    close(on_gpu.prefill(tokens[:9], caches[0], 0), model.prefill(tokens[:9], caches[1], 0))
    for position in range(9, len(tokens)):
        step = tokens[position:position + 1]
        close(on_gpu.decode(step, [position], caches[0]), model.decode(step, [position], caches[1]))


def test_batched_decode_matches_decoding_each_alone(model):
    prompts = ["We hold", "Once upon a midnight dreary, while I", "In the beginning God created"]

    def run(batch, seqs, steps):
        seen = {id(seq): [] for seq in seqs}
        for _ in range(steps):
            for seq in batch.sequences:
                seen[id(seq)].append(batch.logits[seq.slot].copy())
            batch.step()
        return [np.array(seen[id(seq)]) for seq in seqs]

    def sequence(prompt):
        return tf.Sequence(model.vocab.encode(prompt), tf.SamplingParams(30, 0.0), model.context)

    together = tf.DecodeBatch(model, 4)
    seqs = [sequence(p) for p in prompts]
    for seq in seqs:
        together.add(seq)
    batched = run(together, seqs, 30)
    for prompt, seq, logits in zip(prompts, seqs, batched):
        alone = tf.DecodeBatch(model, 1)
        solo = sequence(prompt)
        alone.add(solo)
        assert_same_logits(logits, run(alone, [solo], 30)[0])
        assert seq.text == solo.text and len(seq.text) == 30


def test_sequences_join_and_leave_a_running_batch(model):
    """A sequence that joins late, after another has left and its slot was reused, still
    produces what it produces alone."""
    greedy = tf.SamplingParams(max_tokens=40, temperature=0.0)
    batch = tf.DecodeBatch(model, 2)
    first = tf.Sequence(model.vocab.encode("Four score"), tf.SamplingParams(5, 0.0),
                        model.context)
    second = tf.Sequence(model.vocab.encode("The Lord is my"), greedy, model.context)
    batch.add(first)
    batch.add(second)
    for _ in range(8):
        batch.step()
    assert first.finished and len(batch) == 1
    late = tf.Sequence(model.vocab.encode("Tyger Tyger"), greedy, model.context)
    batch.add(late)
    while len(batch):
        batch.step()
    assert second.text == tf.generate(model, "The Lord is my", greedy)
    assert late.text == tf.generate(model, "Tyger Tyger", greedy)


def test_greedy_decoding_is_deterministic(model):
    one = tf.generate(model, "We hold these", tf.SamplingParams(50, 0.0, seed=1))
    two = tf.generate(model, "We hold these", tf.SamplingParams(50, 0.0, seed=2))
    assert one == two and len(one) == 50


def test_an_empty_prompt_starts_a_new_text(model):
    text = tf.generate(model, "", tf.SamplingParams(30, 0.0))
    assert len(text) == 30 and text == tf.generate(model, "\n", tf.SamplingParams(30, 0.0))


def test_seeds_decide_sampled_text(model):
    def text(seed):
        return tf.generate(model, "The ", tf.SamplingParams(80, 1.0, seed=seed))

    assert text(7) == text(7)
    assert text(7) != text(8)


def test_tiny_top_p_is_greedy(model):
    greedy = tf.generate(model, "Death, be not", tf.SamplingParams(60, 0.0))
    nucleus = tf.generate(model, "Death, be not", tf.SamplingParams(60, 1.5, top_p=1e-6))
    assert nucleus == greedy


def test_nucleus_keeps_the_smallest_set_reaching_top_p():
    logits = np.log(np.array([[0.1, 0.4, 0.2, 0.3]] * 4, dtype=np.float32))
    uniforms = np.array([0.0, 0.5, 0.99, 0.999999])
    ones = np.ones(4, dtype=np.float32)
    picked = tf.sample(logits, ones, ones * 0.5, uniforms)
    # 0.4 + 0.3 reaches 0.5: tokens 1 and 3 only, in proportion 4:3.
    assert picked.tolist() == [1, 1, 3, 3]
    assert tf.sample(logits, ones * 0, ones, uniforms).tolist() == [1, 1, 1, 1]
    # All four, most likely first: 0.4, 0.3, 0.2, 0.1.
    assert tf.sample(logits, ones, ones, uniforms).tolist() == [1, 3, 0, 0]


def test_stop_sequence_ends_the_text_and_is_left_out(model):
    prompt = "We hold these"
    full = tf.generate(model, prompt, tf.SamplingParams(60, 0.0))
    stop = full[20:23]
    expected = full[:full.index(stop)]
    params = tf.SamplingParams(60, 0.0, stop=("never matches", stop))
    seq = tf.Sequence(model.vocab.encode(prompt), params, model.context)
    batch = tf.DecodeBatch(model, 1)
    batch.add(seq)
    pieces = []
    while not seq.finished:
        pieces.extend(piece for _, piece in batch.step())
    assert seq.text == expected and seq.finish_reason == "stop"
    assert "".join(pieces) == expected


def test_max_tokens_and_the_context_window_end_generation(model):
    seq = tf.Sequence(model.vocab.encode("To be, or not"), tf.SamplingParams(17, 0.0),
                      model.context)
    batch = tf.DecodeBatch(model, 1)
    batch.add(seq)
    while not seq.finished:
        batch.step()
    assert len(seq.text) == 17 and seq.finish_reason == "length"

    prompt = "a" * (model.context - 5)
    seq = tf.Sequence(model.vocab.encode(prompt), tf.SamplingParams(100, 0.0), model.context)
    batch.add(seq)
    while not seq.finished:
        batch.step()
    assert len(seq.text) == 5 and seq.finish_reason == "length"
    with pytest.raises(ValueError, match="at most"):
        tf.Sequence(model.vocab.encode("a" * model.context), tf.SamplingParams(), model.context)


@pytest.mark.parametrize("bad", [
    {"max_tokens": 0}, {"temperature": -0.5}, {"temperature": float("nan")},
    {"top_p": 0.0}, {"top_p": 1.5}, {"stop": ("",)}, {"seed": -1},
])
def test_sampling_params_refuse_bad_values(bad):
    with pytest.raises(ValueError):
        tf.SamplingParams(**bad)


def test_trained_model_writes_english(model):
    with open(os.path.join(MODEL_DIR, "corpus.txt")) as f:
        corpus = " ".join(re.findall(r"[a-z]+", f.read().lower()))
    vocabulary = set(corpus.split())
    greedy = tf.generate(model, "We hold these", tf.SamplingParams(120, 0.0))
    sampled = "".join(tf.generate(model, "And the ", tf.SamplingParams(200, 0.8, seed=seed))
                      for seed in range(3))
    for text in (greedy, sampled):
        plain = sum(c.isalpha() or c in " \n.,;:'!?\"-" for c in text)
        assert plain / len(text) > 0.8, text
        words = re.findall(r"[a-z]+", text.lower())
        long_words = [w for w in words if len(w) > 2]
        known = [w for w in long_words if w in vocabulary]
        assert len(known) >= 10 and len(known) > 0.6 * len(long_words), text
        phrases = {" ".join(words[i:i + 3]) for i in range(len(words) - 2)}
        assert sum(f" {p} " in corpus for p in phrases) >= 3, text


# --- model.py ---------------------------------------------------------------------------------


class Client:
    """One request to model.py and the responses its sender receives."""

    def __init__(self, inputs=None, parameters=None, cancel_after=None):
        self.responses = []
        self.flags = []
        self.done = threading.Event()
        self._cancel_after = cancel_after
        tensors = [pb_utils.Tensor(name, value) for name, value in (inputs or {}).items()]
        sender = pb_utils.InferenceResponseSender(self._receive, self._cancelled)
        self.request = pb_utils.InferenceRequest._incoming(
            model_name="textgen", request_id="r", correlation_id=0, flags=0, timeout=0,
            parameters=parameters or {}, inputs=tensors, requested_output_names=["text_output"],
            sender=sender,
        )

    def _receive(self, response, flags):
        self.responses.append(response)
        self.flags.append(flags)
        if flags == FINAL:
            self.done.set()

    def _cancelled(self):
        return self._cancel_after is not None and len(self.responses) >= self._cancel_after

    def texts(self):
        assert self.done.wait(10), "no final response"
        out = []
        for response in self.responses:
            if response is not None:
                assert not response.has_error(), response.error().message()
                tensor = pb_utils.get_output_tensor_by_name(response, "text_output")
                out.append(tensor.as_numpy()[0].decode())
        return out

    def error(self):
        assert self.done.wait(10), "no final response"
        assert len(self.responses) == 1 and self.flags == [FINAL]
        return self.responses[0].error()


def text_inputs(prompt, **extra):
    inputs = {"text_input": np.array([prompt.encode()], dtype=np.object_)}
    for name, value in extra.items():
        inputs[name] = value
    return inputs


@pytest.fixture
def served():
    instance = model_py.TritonPythonModel()
    instance.initialize({"model_instance_kind": "CPU", "model_version": "1"})
    yield instance
    instance.finalize()
    assert not instance._thread.is_alive()


def test_model_answers_once_with_the_whole_text(served, model):
    client = Client(text_inputs("We hold these", max_tokens=np.array([40], np.int32),
                                temperature=np.array([0.0], np.float32)))
    assert served.execute([client.request]) is None
    texts = client.texts()
    assert texts == [tf.generate(model, "We hold these", tf.SamplingParams(40, 0.0))]
    assert client.flags == [FINAL]


def test_model_streams_one_response_per_character(served, model):
    client = Client(text_inputs("Once upon", stream=np.array([True])),
                    parameters={"max_tokens": 25, "temperature": 0.0})
    served.execute([client.request])
    texts = client.texts()
    assert texts == list(tf.generate(model, "Once upon", tf.SamplingParams(25, 0.0)))
    assert client.flags == [0] * 24 + [FINAL]


def test_model_takes_sampling_settings_from_inputs_or_parameters(served, model):
    expected = tf.generate(model, "The ", tf.SamplingParams(30, 0.9, 0.95, ("ee",), seed=11))
    client = Client(text_inputs("The "), parameters={
        "max_tokens": 30, "temperature": 0.9, "top_p": 0.95, "stop": "ee", "seed": 11})
    tensors = Client(text_inputs(
        "The ", max_tokens=np.array([30], np.int32), temperature=np.array([0.9], np.float32),
        top_p=np.array([0.95], np.float32), seed=np.array([11], np.uint64),
        stop=np.array([b"ee"], dtype=np.object_)))
    served.execute([client.request, tensors.request])
    # The batch keeps temperature and top_p as float32, so both forms sample alike.
    assert client.texts() == tensors.texts() == [expected]


def test_model_batches_concurrent_requests_like_single_ones(served, model):
    prompts = ["We hold these", "Tyger Tyger", "Shall I compare", "Four score", "The Lord"]
    clients = [Client(text_inputs(p), parameters={"max_tokens": 30 + 5 * i, "temperature": 0.0})
               for i, p in enumerate(prompts)]
    served.execute([c.request for c in clients[:3]])
    served.execute([c.request for c in clients[3:]])
    for i, (prompt, client) in enumerate(zip(prompts, clients)):
        assert client.texts() == [tf.generate(model, prompt, tf.SamplingParams(30 + 5 * i, 0.0))]


def test_model_stops_a_cancelled_request_with_only_the_final_flag(served):
    client = Client(text_inputs("And", stream=np.array([True])),
                    parameters={"max_tokens": 200}, cancel_after=3)
    served.execute([client.request])
    assert client.done.wait(10)
    assert client.responses[-1] is None and client.flags[-1] == FINAL
    assert len(client.responses) <= 5


@pytest.mark.parametrize("inputs,parameters,message", [
    ({"temperature": np.array([-1.0], np.float32)}, {}, "temperature"),
    ({}, {"top_p": 2}, "top_p"),
    ({}, {"max_tokens": "many"}, "max_tokens"),
    ({}, {"stream": "yes"}, "stream"),
    ({"text_input": np.array([b"\xff"], dtype=np.object_)}, {}, "UTF-8"),
    ({"text_input": np.array([b"x" * 300], dtype=np.object_)}, {}, "context"),
])
def test_model_refuses_bad_values(served, inputs, parameters, message):
    client = Client({**text_inputs("We"), **inputs}, parameters=parameters)
    served.execute([client.request])
    error = client.error()
    assert message in error.message()
    assert error.code() == pb_utils.TritonError.INVALID_ARG


def test_model_requires_a_prompt(served):
    client = Client({}, parameters={"max_tokens": 3})
    served.execute([client.request])
    assert "text_input" in client.error().message()
