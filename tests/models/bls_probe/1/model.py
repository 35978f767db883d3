"""Calls other models through BLS and model control, as MODE says (tests/models/README.md)."""

import asyncio
import json
import multiprocessing

import numpy as np
import triton_python_backend_utils as pb_utils


def _request(model, outputs, trace=None, preferred_memory=None, **inputs):
    return pb_utils.InferenceRequest(
        model_name=model, requested_output_names=outputs, trace=trace,
        preferred_memory=preferred_memory,
        inputs=[pb_utils.Tensor(name, value) for name, value in inputs.items()])


def _text(*values):
    return pb_utils.Tensor("TEXT", np.array([str(v).encode() for v in values], np.object_))


def _floats(name, values):
    return pb_utils.Tensor(name, np.asarray(values, np.float32))


def _in_child(args):
    """In a process forked by a multiprocessing Pool: add_sub of (x, y), and a large tensor
    (1 MiB, beyond what travels inline) through identity_fp32 and back."""
    x, y, k = args
    added = _request("add_sub", ["OUTPUT0"], INPUT0=x, INPUT1=y * k).exec()
    big = np.full((1, 1 << 18), k, np.float32)
    echoed = _request("identity_fp32", ["OUTPUT0"], INPUT0=big).exec()
    if added.has_error() or echoed.has_error():
        raise RuntimeError((added.error() or echoed.error()).message())
    total = float(pb_utils.get_output_tensor_by_name(echoed, "OUTPUT0").as_numpy().sum())
    return pb_utils.get_output_tensor_by_name(added, "OUTPUT0").as_numpy(), total


class TritonPythonModel:
    def initialize(self, args):
        # Calls work from initialize too: this model is not ready while it loads.
        self._ready_while_loading = pb_utils.is_model_ready(args["model_name"])

    async def execute(self, requests):
        return [await self._one(request) for request in requests]

    async def _one(self, request):
        mode = pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0].decode()
        x = pb_utils.get_input_tensor_by_name(request, "INPUT0")
        y = pb_utils.get_input_tensor_by_name(request, "INPUT1")
        x = None if x is None else x.as_numpy()
        y = None if y is None else y.as_numpy()
        if mode == "sync":  # add_sub from execute's own thread
            response = _request("add_sub", ["OUTPUT0", "OUTPUT1"], INPUT0=x, INPUT1=y).exec()
            if response.has_error():
                return pb_utils.InferenceResponse(error=response.error())
            return pb_utils.InferenceResponse([
                _floats("OUTPUT0", pb_utils.get_output_tensor_by_name(response, "OUTPUT0").as_numpy()),
                _floats("OUTPUT1", pb_utils.get_output_tensor_by_name(response, "OUTPUT1").as_numpy())])
        if mode == "async":  # two add_sub calls at once; only OUTPUT0 asked of each
            first, second = await asyncio.gather(
                _request("add_sub", ["OUTPUT0"], INPUT0=x, INPUT1=y).async_exec(),
                _request("add_sub", ["OUTPUT0"], INPUT0=y, INPUT1=x).async_exec())
            names = [t.name() for t in first.output_tensors()]
            return pb_utils.InferenceResponse([
                _floats("OUTPUT0", pb_utils.get_output_tensor_by_name(first, "OUTPUT0").as_numpy()),
                _floats("OUTPUT1", pb_utils.get_output_tensor_by_name(second, "OUTPUT0").as_numpy()),
                _text(*names)])
        if mode == "stream":  # every response of the decoupled repeat
            responses = _request("repeat", ["OUT", "IDX"], IN=x.astype(np.int32)).exec(decoupled=True)
            values, empty = [], 0
            for response in responses:
                out = pb_utils.get_output_tensor_by_name(response, "OUT")
                if out is None:
                    empty += 1
                else:
                    values.append(float(out.as_numpy()[0]))
            return pb_utils.InferenceResponse([_floats("OUTPUT0", values), _text(f"empty {empty}")])
        if mode == "stream_async":  # repeat by async_exec: next() for the first response,
            # `async for` for the rest
            responses = await _request("repeat", ["OUT", "IDX"],
                                       IN=x.astype(np.int32)).async_exec(decoupled=True)
            values = [next(responses)]
            values += [response async for response in responses]
            values = [float(pb_utils.get_output_tensor_by_name(r, "OUT").as_numpy()[0])
                      for r in values if pb_utils.get_output_tensor_by_name(r, "OUT")]
            return pb_utils.InferenceResponse([_floats("OUTPUT0", values), _text("")])
        if mode == "stream_cancel":  # repeat's first response, then cancel(): what came after
            responses = _request("repeat", ["OUT", "IDX"],
                                 IN=x.astype(np.int32)).exec(decoupled=True)
            first = pb_utils.get_output_tensor_by_name(next(responses), "OUT").as_numpy()[0]
            responses.cancel()
            return pb_utils.InferenceResponse([_floats("OUTPUT0", [first]),
                                               _text(f"after cancel {len(list(responses))}")])
        if mode == "timeout":  # request_probe called with a timeout of 123456 µs and its
            # name as bytes, as a model reads it from a BYTES tensor: the timeout it saw
            response = pb_utils.InferenceRequest(
                model_name=b"request_probe", requested_output_names=["TIMEOUT"],
                inputs=[pb_utils.Tensor("INPUT0", np.array([1], np.int32))],
                timeout=123456).exec()
            if response.has_error():
                return pb_utils.InferenceResponse(error=response.error())
            seen = pb_utils.get_output_tensor_by_name(response, "TIMEOUT").as_numpy()[0]
            return pb_utils.InferenceResponse([_floats("OUTPUT0", [seen]), _text("")])
        if mode == "traced":  # add_sub twice: with this request's trace, then without; the
            # trace's OpenTelemetry context as TEXT
            with_trace = _request("add_sub", ["OUTPUT0"], trace=request.trace(),
                                  INPUT0=x, INPUT1=y).exec()
            without = _request("add_sub", ["OUTPUT0"], INPUT0=x, INPUT1=y).exec()
            for r in (with_trace, without):
                if r.has_error():
                    return pb_utils.InferenceResponse(error=r.error())
            return pb_utils.InferenceResponse([
                _floats("OUTPUT0", pb_utils.get_output_tensor_by_name(with_trace, "OUTPUT0").as_numpy()),
                _floats("OUTPUT1", pb_utils.get_output_tensor_by_name(without, "OUTPUT0").as_numpy()),
                _text(str(request.trace().get_context()))])
        if mode == "preferred_gpu":  # add_sub's OUTPUT0 asked onto GPU 0; TEXT: where it came
            gpu = pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_GPU, 0)
            response = _request("add_sub", ["OUTPUT0"], preferred_memory=gpu,
                                INPUT0=x, INPUT1=y).exec()
            out = pb_utils.get_output_tensor_by_name(response, "OUTPUT0")
            if out.is_cpu():
                return pb_utils.InferenceResponse([_floats("OUTPUT0", out.as_numpy()),
                                                   _text("cpu")])
            import cupy
            return pb_utils.InferenceResponse([
                _floats("OUTPUT0", cupy.asnumpy(cupy.from_dlpack(out.to_dlpack()))),
                _text("gpu")])
        if mode == "bytes":
            words = np.array([b"alpha", b"", b"gamma"], np.object_)
            response = _request("string_echo", ["OUTPUT0"], INPUT0=words).exec()
            out = pb_utils.get_output_tensor_by_name(response, "OUTPUT0").as_numpy()
            return pb_utils.InferenceResponse([_text(*[w.decode() for w in out])])
        if mode == "errors":  # a missing model, a decoupled model asked for one response,
            # a model that raises: each error's code and message
            missing = _request("no_such_model", ["OUT"], IN=x).exec()
            decoupled = _request("repeat", ["OUT"], IN=x.astype(np.int32)).exec()
            raised = _request("raiser", ["OUTPUT0"], INPUT0=x).exec()
            return pb_utils.InferenceResponse([_text(*[
                str(answer) for response in (missing, decoupled, raised)
                for answer in (response.error().code(), response.error().message())])])
        if mode == "large":  # identity_fp32 of INPUT0 (as [1, N]) by exec, then of 2x and
            # 3x at once by async_exec: OUTPUT0 the first answer, OUTPUT1 the sum of the others
            row = x.reshape(1, -1)
            first = _request("identity_fp32", ["OUTPUT0"], INPUT0=row).exec()
            others = await asyncio.gather(
                _request("identity_fp32", ["OUTPUT0"], INPUT0=row * 2).async_exec(),
                _request("identity_fp32", ["OUTPUT0"], INPUT0=row * 3).async_exec())
            for r in (first, *others):
                if r.has_error():
                    return pb_utils.InferenceResponse(error=r.error())
            out = [pb_utils.get_output_tensor_by_name(r, "OUTPUT0").as_numpy() for r in others]
            out[0] += out[1]  # answers are the model's own to write to
            return pb_utils.InferenceResponse([
                _floats("OUTPUT0", pb_utils.get_output_tensor_by_name(first, "OUTPUT0").as_numpy().reshape(-1)),
                _floats("OUTPUT1", out[0].reshape(-1))])
        if mode == "forward":  # INPUT0, the very tensor it was given, to shm_inplace
            given = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            response = pb_utils.InferenceRequest(
                model_name="shm_inplace", requested_output_names=["OUTPUT0"],
                inputs=[given]).exec()
            if response.has_error():
                return pb_utils.InferenceResponse(error=response.error())
            return pb_utils.InferenceResponse([_floats(
                "OUTPUT0", pb_utils.get_output_tensor_by_name(response, "OUTPUT0").as_numpy())])
        if mode == "fork_pool":  # _in_child in 3 processes a multiprocessing Pool forked
            with multiprocessing.get_context("fork").Pool(3) as pool:
                results = pool.map(_in_child, [(x, y, k) for k in (1, 2, 3)])
            return pb_utils.InferenceResponse([
                _floats("OUTPUT0", np.concatenate([added for added, _ in results])),
                _floats("OUTPUT1", [total for _, total in results])])
        if mode == "params":  # params_echo with reply_ parameters: its response's parameters()
            response = pb_utils.InferenceRequest(
                model_name="params_echo", requested_output_names=["OUTPUT0"],
                inputs=[pb_utils.Tensor("INPUT0", x.astype(np.int32))],
                parameters={"reply_k": "v", "reply_n": 3, "reply_b": True}).exec()
            return pb_utils.InferenceResponse([_text(response.parameters())])
        if mode == "init":
            return pb_utils.InferenceResponse([_text(self._ready_while_loading)])
        if mode == "control":  # the model named by the request parameter "target"
            target = json.loads(request.parameters())["target"]
            ready = [pb_utils.is_model_ready(target)]
            outcomes = []
            for step in (pb_utils.load_model, pb_utils.unload_model):
                try:
                    step(target)
                    outcomes.append("ok")
                except pb_utils.TritonModelException as exc:
                    outcomes.append(str(exc))
                ready.append(pb_utils.is_model_ready(target))
            return pb_utils.InferenceResponse([_text(json.dumps(ready), *outcomes)])
        return pb_utils.InferenceResponse(error=pb_utils.TritonError(f"unknown MODE {mode}"))
