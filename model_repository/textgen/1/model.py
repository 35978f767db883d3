"""textgen: a small character-level transformer (transformer.py) as a decoupled Triton model.

execute() only checks each request and queues it; one generation thread decodes every active
request together, one batched forward per token (continuous batching: new requests join
between steps, finished ones leave), and answers through each request's response sender.

Inputs; any optional input left out is read from the request parameter of the same name, else
takes its default:
  text_input  STRING  the prompt: printable ASCII (other characters are replaced), may be empty
  max_tokens  INT32   characters to generate, at least 1 (default 64)
  temperature FP32    0 = greedy (default 1.0, as in the vLLM backend)
  top_p       FP32    nucleus sampling, in (0, 1] (default 1.0)
  seed        UINT64  seeds the request's own random stream (default: nondeterministic)
  stop        STRING  [-1] stop sequences, left out of the output; parameter: string or list
  stream      BOOL    false (default): one response with the whole text, flagged FINAL;
                      true: one response per generated character, the last one flagged FINAL
                      (text that may start a stop sequence waits until it is known not to)
  return_num_input_tokens, return_num_output_tokens  BOOL  (default false) each response
                      also carries num_input_tokens (the prompt's) or num_output_tokens (its
                      text's), UINT32 [1]; one token is one character
Output: text_output STRING [-1], one UTF-8 string.
A cancelled request gets only the FINAL flag; a bad input value an INVALID_ARG error.
Generation ends after max_tokens characters, at a stop sequence, or when prompt and text fill
the model's context window (256 characters); a prompt of 256 characters or more is refused.
A KIND_GPU instance computes with cupy when it imports (numpy otherwise).
"""

import collections
import os
import queue
import threading
from dataclasses import dataclass

import triton_python_backend_utils as pb_utils

from . import inputs
from .transformer import DecodeBatch, Transformer, array_module

# Sequences decoding together at most; more requests wait for a free slot.
MAX_ACTIVE = 32

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


@dataclass
class _Job(inputs.AskedFor):
    request: object
    sender: object
    asked: inputs.Asked


class TritonPythonModel:
    def initialize(self, args):
        xp = array_module(args.get("model_instance_kind", "CPU"))
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "weights.npz")
        self._model = Transformer.load(path, xp)
        self._jobs = queue.SimpleQueue()  # _Job, or None to stop
        generator = _Generator(self._model, self._jobs)
        self._thread = threading.Thread(target=generator.run, name="textgen", daemon=True)
        self._thread.start()

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                job = self._job(request, sender)
            except ValueError as exc:
                error = pb_utils.TritonError(str(exc), pb_utils.TritonError.INVALID_ARG)
                sender.send(pb_utils.InferenceResponse(error=error), flags=FINAL)
                continue
            self._jobs.put(job)
        return None

    def finalize(self):
        self._jobs.put(None)
        self._thread.join()

    # --- requests ----------------------------------------------------------------------------

    def _job(self, request, sender) -> _Job:
        return _Job(request, sender, inputs.read_request(request, self._model))


class _Generator:
    """The generation thread's state: the decode batch, the jobs in it and those waiting."""

    def __init__(self, model: Transformer, jobs: queue.SimpleQueue):
        self._model = model
        self._queue = jobs
        self._batch = DecodeBatch(model, MAX_ACTIVE)
        self._active = {}  # Sequence -> _Job, for the sequences in the batch
        self._waiting = collections.deque()

    def run(self) -> None:
        while self._take_new():
            self._drop_cancelled()
            self._admit()
            try:
                pieces = self._batch.step()
            except Exception as exc:  # noqa: BLE001 (every request in the step gets the error)
                for job in self._active.values():
                    _fail(job, f"generation failed: {exc}")
                self._active.clear()
                self._batch = DecodeBatch(self._model, MAX_ACTIVE)
                continue
            self._answer(pieces)
        for job in [*self._active.values(), *self._waiting]:
            _fail(job, "textgen is being unloaded", pb_utils.TritonError.UNAVAILABLE)

    def _take_new(self) -> bool:
        """Moves queued jobs to the waiting line, blocking for one when there is nothing else
        to do; False when asked to stop."""
        try:
            job = self._queue.get(block=not self._active and not self._waiting)
            while job is not None:
                self._waiting.append(job)
                job = self._queue.get_nowait()
            return False
        except queue.Empty:
            return True

    def _drop_cancelled(self) -> None:
        for seq in [s for s in self._batch.sequences if self._active[s].request.is_cancelled()]:
            self._batch.remove(seq)
            _send(self._active.pop(seq), None, FINAL)
        for job in [j for j in self._waiting if j.request.is_cancelled()]:
            self._waiting.remove(job)
            _send(job, None, FINAL)

    def _admit(self) -> None:
        while self._waiting and not self._batch.full:
            job = self._waiting.popleft()
            try:
                self._batch.add(job.seq)
            except Exception as exc:  # noqa: BLE001 (the request gets the error)
                _fail(job, f"prefill failed: {exc}")
                continue
            self._active[job.seq] = job

    def _answer(self, pieces) -> None:
        for seq, piece in pieces:
            job = self._active[seq]
            if seq.finished:
                del self._active[seq]
                if not job.stream:
                    _send(job, _text_response(job, seq.text), FINAL)
                else:
                    _send(job, _text_response(job, piece) if piece else None, FINAL)
            elif job.stream and piece and not _send(job, _text_response(job, piece), 0):
                self._batch.remove(seq)
                del self._active[seq]


def _text_response(job: _Job, text: str):
    return inputs.text_response(job.asked, text, batched=False)


def _send(job: _Job, response, flags: int) -> bool:
    """Sends; False when the sender refuses (the request is gone), which ends the job."""
    try:
        job.sender.send(response, flags=flags)
        return True
    except Exception as exc:  # noqa: BLE001 (one lost client must not stop the others)
        pb_utils.Logger.log_warn(f"textgen: dropping request '{job.request.request_id()}': {exc}")
        return False


def _fail(job: _Job, message: str, code=None) -> None:
    # INTERNAL unless told; looked up here: Triton's stub adds TritonError to pb_utils only
    # after the model is imported (at auto-complete it is missing).
    if code is None:
        code = pb_utils.TritonError.INTERNAL
    _send(job, pb_utils.InferenceResponse(error=pb_utils.TritonError(message, code)), FINAL)
