"""textgen_iterative: textgen's transformer as a decoupled model whose decoding loop is the
server's scheduler. transformer.py and weights.npz are links to ../../textgen/1/, so both
models run the same code and weights.

The config picks how requests are batched:
- iterative (`sequence_batching { iterative_sequence: true }`): each execute() is ONE step for
  the requests in its batch: a new request's prompt is prefilled, every request gets its next
  token, then one forward over all of them readies the token after. Unfinished requests are
  released with RESCHEDULE, and the scheduler hands them back in the next batch together with
  the requests that arrived meanwhile (continuous batching). Each request's decode state (its
  KV cache slot, sampler and text) stays here between steps, keyed by its correlation id, and
  is freed when it finishes or is cancelled.
- request-level (any other scheduler, e.g. `dynamic_batching`; perf/continuous_repo/
  textgen_static links to this file): one execute() runs its batch to completion with the
  same step, so requests that arrive meanwhile wait for the whole batch.

Inputs, outputs and their meaning are textgen's (see its model.py), with a batch dimension:
each request is one prompt, [1, 1]; the output text_output is [1, 1]. With the `direct`
strategy, declare a CONTROL_SEQUENCE_READY control input: requests whose READY is 0 (null
requests padding the batch) are skipped.
"""

import json
import os
from dataclasses import dataclass

import numpy as np
import triton_python_backend_utils as pb_utils

from . import inputs
from .transformer import Transformer, array_module, sample

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
START = pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START
RESCHEDULE = pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE


@dataclass(eq=False)
class Generation(inputs.AskedFor):
    """One request's decode state."""

    key: object  # correlation id (iterative), position in the batch (request-level)
    asked: inputs.Asked


class Decoder:
    """The generations in progress, generation i in slot i of one KV cache: a generation joins
    with a prefill of its prompt into the next slot; one that leaves hands its slot to the last
    one, so the busy slots stay 0..n-1 and a forward attends over views of the cache."""

    def __init__(self, model: Transformer, capacity: int):
        self.model = model
        self.capacity = capacity
        self._cache = model.new_cache(capacity)
        self._generations: list[Generation] = []
        self._by_key: dict = {}
        self._logits = np.zeros((capacity, len(model.vocab)), dtype=np.float32)
        self._temperature = np.zeros(capacity, dtype=np.float32)
        self._top_p = np.ones(capacity, dtype=np.float32)

    def __len__(self) -> int:
        return len(self._generations)

    def __contains__(self, key) -> bool:
        return key in self._by_key

    def join(self, gen: Generation) -> None:
        if len(self._generations) == self.capacity:
            raise RuntimeError(f"all {self.capacity} decode slots are busy")
        slot = len(self._generations)
        self._logits[slot] = self.model.prefill(gen.seq.prompt_ids, self._cache, slot)
        self._temperature[slot] = gen.seq.params.temperature
        self._top_p[slot] = gen.seq.params.top_p
        gen.seq.slot = slot
        gen.seq.length = len(gen.seq.prompt_ids)
        self._generations.append(gen)
        self._by_key[gen.key] = gen

    def leave(self, key) -> None:
        """Frees the generation's slot; nothing when there is no such generation."""
        gen = self._by_key.pop(key, None)
        if gen is None:
            return
        slot, last = gen.seq.slot, len(self._generations) - 1
        if slot != last:
            moved = self._generations[last]
            self._cache.move(last, slot, moved.seq.length)
            self._logits[slot] = self._logits[last]
            self._temperature[slot] = self._temperature[last]
            self._top_p[slot] = self._top_p[last]
            self._generations[slot] = moved
            moved.seq.slot = slot
        self._generations.pop()
        gen.seq.slot = None

    def sample(self, keys: list) -> list[tuple[Generation, str]]:
        """The next token of each generation of `keys`: (generation, text it can hand out now)
        for each. Those that finished have left."""
        gens = [self._by_key[key] for key in keys]
        rows = [gen.seq.slot for gen in gens]
        uniforms = np.array([gen.seq.rng.random() for gen in gens])
        tokens = sample(self._logits[rows], self._temperature[rows], self._top_p[rows], uniforms)
        chars = self.model.vocab.decode(tokens)
        context = self.model.context
        out = [(gen, gen.seq.accept(token, char, gen.seq.length + 1 >= context))
               for gen, token, char in zip(gens, tokens.tolist(), chars)]
        for gen, _ in out:
            if gen.seq.finished:
                self.leave(gen.key)
        return out

    def forward(self, keys: list) -> None:
        """One forward over the tokens just sampled for `keys`: into the cache, and their next
        logits. It covers slots 0 up to the highest of theirs; a slot in that range whose
        generation is not stepping (the scheduler left it out of this batch) reruns its
        previous token at its previous position, which rewrites the same cache entry."""
        if not keys:
            return
        rows = [self._by_key[key].seq.slot for key in keys]
        covered = [gen.seq for gen in self._generations[:max(rows) + 1]]
        positions = np.array([seq.length - 1 for seq in covered])
        positions[rows] += 1
        tokens = np.array([seq.last_token for seq in covered])
        self._logits[rows] = self.model.decode(tokens, positions, self._cache)[rows]
        for row in rows:
            covered[row].length += 1


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        batching = config.get("sequence_batching", {})
        self._iterative = bool(batching.get("iterative_sequence"))
        self._ready_input = _ready_control_input(batching)
        # As many generations as the scheduler can have going on this instance.
        capacity = batching.get("oldest", {}).get("max_candidate_sequences")
        capacity = int(capacity or config["max_batch_size"] or 1)
        xp = array_module(args.get("model_instance_kind", "CPU"))
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "weights.npz")
        self._model = Transformer.load(path, xp)
        self._decoder = Decoder(self._model, capacity)

    def execute(self, requests):
        if self._iterative:
            self._step(requests)
        else:
            self._run_to_completion(requests)
        return None

    def _step(self, requests) -> None:
        batch = []  # (request, key) of the requests that take a token in this step
        for request in requests:
            if self._ready_input and not _is_ready(request, self._ready_input):
                continue  # a null request: its answer would be dropped
            key = request.correlation_id()
            if request.flags() & START:
                self._decoder.leave(key)  # a reused correlation id starts over
                if not self._join(key, request):
                    continue
            elif key not in self._decoder:
                _fail(request, f"no generation in progress for correlation id {key!r}")
                continue
            if request.is_cancelled():
                self._decoder.leave(key)
                _send(request, None, FINAL)
                continue
            batch.append((request, key))
        for request, _ in self._advance(batch):
            request.set_release_flags(RESCHEDULE)

    def _run_to_completion(self, requests) -> None:
        batch = [(request, key) for key, request in enumerate(requests)
                 if self._join(key, request)]
        while batch:
            going = []
            for request, key in batch:
                if request.is_cancelled():
                    self._decoder.leave(key)
                    _send(request, None, FINAL)
                else:
                    going.append((request, key))
            batch = self._advance(going)

    def _join(self, key, request) -> bool:
        """Starts the request's generation with a prefill of its prompt; on a bad input or a
        failure the request gets the error instead."""
        try:
            asked = inputs.read_request(request, self._model)
        except ValueError as exc:
            _fail(request, str(exc), pb_utils.TritonError.INVALID_ARG)
            return False
        try:
            self._decoder.join(Generation(key, asked))
        except Exception as exc:  # noqa: BLE001 (the request gets the error)
            _fail(request, f"the generation could not start: {exc}")
            return False
        return True

    def _advance(self, batch: list) -> list:
        """One token for each (request, key) of `batch`, answered before the forward that
        readies the next one; returns those still going."""
        if not batch:
            return []
        try:
            sampled = self._decoder.sample([key for _, key in batch])
            going = []
            for (request, key), (gen, piece) in zip(batch, sampled):
                if gen.seq.finished:
                    _send(request, _last_response(gen, piece), FINAL)
                elif not gen.stream or not piece or _send(request, _text_response(gen, piece), 0):
                    going.append((request, key))
                else:
                    self._decoder.leave(key)  # the client is gone
            self._decoder.forward([key for _, key in going])
            return going
        except Exception as exc:  # noqa: BLE001 (every request of the step gets the error)
            for request, key in batch:
                if key in self._decoder:
                    self._decoder.leave(key)
                    _fail(request, f"generation failed: {exc}")
            return []


def _ready_control_input(batching: dict):
    """The name of the CONTROL_SEQUENCE_READY control input, or None."""
    for control_input in batching.get("control_input", []):
        if any(c.get("kind") == "CONTROL_SEQUENCE_READY" for c in control_input.get("control", [])):
            return control_input["name"]
    return None


def _is_ready(request, name: str) -> bool:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return tensor is not None and bool(tensor.as_numpy().any())


def _text_response(gen: Generation, text: str):
    return inputs.text_response(gen.asked, text, batched=True)


def _last_response(gen: Generation, piece: str):
    """Streaming: the last piece, if any; otherwise the whole text."""
    if not gen.stream:
        return _text_response(gen, gen.seq.text)
    return _text_response(gen, piece) if piece else None


def _send(request, response, flags: int) -> bool:
    """Sends; False when the sender refuses (the request is gone)."""
    try:
        request.get_response_sender().send(response, flags=flags)
        return True
    except Exception as exc:  # noqa: BLE001 (one lost client must not stop the others)
        pb_utils.Logger.log_warn(
            f"textgen_iterative: dropping request '{request.request_id()}': {exc}")
        return False


def _fail(request, message: str, code=None) -> None:
    # INTERNAL unless told; looked up here: Triton's stub adds TritonError to pb_utils only
    # after the model is imported (at auto-complete it is missing).
    if code is None:
        code = pb_utils.TritonError.INTERNAL
    _send(request, pb_utils.InferenceResponse(error=pb_utils.TritonError(message, code)), FINAL)
