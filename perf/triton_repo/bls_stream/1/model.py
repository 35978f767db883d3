import asyncio
import threading

import numpy as np
import triton_python_backend_utils as pb_utils


def _describe(response):
    if response.has_error():
        error = response.error()
        return f"error {error.code()}: {error.message()}"
    return " ".join(f"{t.name()}={t.as_numpy().tolist()}"
                    for t in sorted(response.output_tensors(), key=lambda t: t.name()))


def _what(text):
    return pb_utils.InferenceResponse(
        [pb_utils.Tensor("WHAT", np.array([text.encode()], dtype=np.object_))])


def _request(model, **inputs):
    return pb_utils.InferenceRequest(
        model_name=model, requested_output_names=[],
        inputs=[pb_utils.Tensor(name, value) for name, value in inputs.items()])


_F4 = np.arange(4, dtype=np.float32).reshape(1, 4)


def _forward_repeat(sender):
    """Each response of a decoupled BLS call sent on as it comes."""
    for response in _request("repeat", IN=np.array([3, 4, 5], np.int32)).exec(decoupled=True):
        sender.send(_what(_describe(response)))


def _from_thread(sender):
    """Answered from a thread after execute() returned, as decoupled models often do."""
    def run():
        sender.send(_what(_describe(_request("identity_fp32", INPUT0=_F4).exec())))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    threading.Thread(target=run).start()


def _calls(mode):
    """The BLS call MODE names: what it answered, as text."""
    if mode == 2:  # a model that is not decoupled, called as if it were
        responses = _request("identity_fp32", INPUT0=_F4).exec(decoupled=True)
        return "; ".join(_describe(r) for r in responses)
    if mode == 3:
        return _describe(_request("nope", INPUT0=_F4).exec())
    if mode == 4:  # a decoupled call that gets no response
        responses = _request("repeat", IN=np.zeros(0, np.int32)).exec(decoupled=True)
        return f"{len(list(responses))} responses"
    if mode == 5:
        return _describe(_request("repeat", IN=np.array([1], np.int32)).exec())
    if mode == 6:  # a step that raises, through an ensemble
        return _describe(_request("ens_faults", MODE=np.array([1], np.int32)).exec())
    raise ValueError(f"no mode {mode}")


async def _async_calls(mode):
    if mode == 7:  # async_exec, two at once
        a, b = await asyncio.gather(_request("identity_fp32", INPUT0=_F4).async_exec(),
                                    _request("nope", INPUT0=_F4).async_exec())
        return f"{_describe(a)} | {_describe(b)}"
    if mode == 8:  # a decoupled async_exec, its responses iterated
        responses = await _request("repeat", IN=np.array([8, 9], np.int32)).async_exec(
            decoupled=True)
        return "; ".join(_describe(r) for r in responses)
    return _calls(mode)


class TritonPythonModel:
    """BLS calls made from a decoupled model, chosen by MODE, for perf/compat_probe.py to
    compare what each server tells the calling model and its client. Each response's WHAT
    says what a call answered or raised; the stream ends with a final flag."""

    async def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            mode = int(pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0])
            if mode == 1:
                _from_thread(sender)
                continue
            try:
                if mode == 0:
                    _forward_repeat(sender)
                else:
                    sender.send(_what(await _async_calls(mode)))
            except Exception as exc:
                sender.send(_what(f"raised {type(exc).__name__}: {exc}"))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
