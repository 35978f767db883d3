"""Calls a model makes into the server from its worker: BLS inference
(`pb_utils.InferenceRequest.exec` / `async_exec`), model control (`pb_utils.load_model`,
`unload_model`, `is_model_ready`) and the declaration of a custom metric family
(`pb_utils.MetricFamily`, whose name the server keeps one kind for).

Each call arrives as a ServerCall frame and runs as a task of the front, as a client's request
would: the same dataplane, scheduling, statistics and errors. Its answers go back to the
calling worker as ServerReply frames.

Large tensors never pass through the front (see ipc/messages.py): an input the caller wrote
into its BLS arena, or one of its own inputs it passes on from a region it was given, reaches
the target as a RegionSlice of that arena or region, read in place; an output in the target's
output arena goes back as a reference the caller maps and copies out. Such a response is lent
to the caller until it says "release" (or dies): its slots are not reused before that.
"""

import asyncio
import contextlib
import logging
from collections import deque

from shmserve.admission import SEQUENCE_END, SEQUENCE_START
from shmserve.dataplane import DecoupledModel
from shmserve.errors import Code, ModelError, ServerError
from shmserve.inference import InferRequest, InferResponse, InputTensor, RequestedOutput
from shmserve.ipc import messages
from shmserve.ipc.locations import InRegion

log = logging.getLogger("shmserve")


class ServerCalls:
    """Serves ServerCall frames (WorkerHandle's `on_server_call`) with a DataPlane."""

    def __init__(self, dataplane):
        self.dp = dataplane
        self._tasks: dict = {}  # (worker id, call id) -> task
        self._streams: dict = {}  # (worker id, call id) -> request of a decoupled infer call
        # (worker id, call id) -> responses whose outputs the caller has yet to copy out, in
        # the order of their replies (the caller releases them in that order).
        self._leases: dict = {}

    def __call__(self, worker, call: messages.ServerCall) -> None:
        key = (id(worker), call.call_id)
        if call.kind == "cancel":
            task = self._tasks.get(key)
            if task is not None:
                task.cancel()
            return
        if call.kind == "cancel_request":
            request = self._streams.get(key)
            if request is not None and request.ask_cancel is not None:
                request.ask_cancel()
            elif key in self._tasks:  # an ensemble: its steps are stopped, the call ends
                self._tasks[key].cancel()
            return
        if call.kind == "release":
            leased = self._leases.get(key)
            if leased:
                leased.popleft().done()
                if not leased:
                    del self._leases[key]
            return
        task = asyncio.get_running_loop().create_task(self._serve(worker, call))
        self._tasks[key] = task
        task.add_done_callback(lambda _: self._tasks.pop(key, None))

    def cancel_all_of(self, worker) -> None:
        """The worker is gone: nobody waits for its calls' answers, nor copies out any more."""
        for (owner, _), task in list(self._tasks.items()):
            if owner == id(worker):
                task.cancel()
        for key in [key for key in self._leases if key[0] == id(worker)]:
            for response in self._leases.pop(key):
                response.done()

    async def _serve(self, worker, call: messages.ServerCall) -> None:
        args = call.args
        try:
            if call.kind == "infer":
                try:
                    await self._infer(worker, call.call_id, args)
                except ServerError as exc:
                    worker.reply(_bls_error(call.call_id, args["model"], exc))
                return
            if call.kind == "load":
                await self.dp.load_model(args["model"], args.get("config") or None,
                                         args.get("files") or {})
                value = True
            elif call.kind == "unload":
                await self.dp.unload_model(args["model"], bool(args.get("unload_dependents")))
                value = True
            elif call.kind == "ready":
                try:
                    value = await self.dp.model_ready(args["model"], args.get("version", ""))
                except ServerError:  # an unknown model is not ready, as in Triton
                    value = False
            elif call.kind == "metric_family":
                self.dp.registry.declare_metric_family(args["name"], args["description"],
                                                       int(args["kind"]))
                value = True
            else:
                raise ServerError(Code.INVALID_ARG, f"unknown server call '{call.kind}'")
            worker.reply(messages.ServerReply(call.call_id, True, None, value))
        except ServerError as exc:
            worker.reply(_error_reply(call.call_id, exc.code.name, exc.message))
        except (KeyError, TypeError, ValueError) as exc:
            worker.reply(_error_reply(call.call_id, "INVALID_ARG",
                                      f"malformed {call.kind} call: {exc}"))
        except Exception as exc:
            # A fault of the server's own: the model gets an answer rather than waiting
            # forever, and the front goes on serving.
            log.exception("the %s call of %s failed", call.kind, worker)
            worker.reply(_error_reply(call.call_id, "INTERNAL",
                                      f"{call.kind} call failed in the server: {exc!r}"))

    async def _infer(self, worker, call_id: int, args: dict) -> None:
        request = _infer_request(args, worker)
        caller = self.dp.tracer.in_progress(args.get("trace") or 0)
        if caller is not None:
            request.trace = self.dp.tracer.child(caller)
        if not args.get("decoupled"):
            try:
                response = await self.dp.infer(request)
            except DecoupledModel:
                raise ServerError(Code.INVALID_ARG,
                                  _DECOUPLED_ONLY.format(request.model_name)) from None
            self._reply(worker, call_id, True, response)
            return
        key = (id(worker), call_id)
        self._streams[key] = request
        try:
            await self._stream(worker, call_id, request)
        finally:
            del self._streams[key]

    async def _stream(self, worker, call_id: int, request) -> None:
        async with contextlib.aclosing(self.dp.stream(request)) as responses:
            async for item in responses:
                if item.response is not None:
                    sent = self._reply(worker, call_id, item.final, item.response)
                else:
                    frame = None
                    if item.error is not None:  # with its code (Triton since 2.58)
                        frame = messages.ResponseFrame(
                            [item.error.code.name, item.error.message], [])
                    sent = worker.reply(messages.ServerReply(call_id, item.final, frame))
                if not sent:
                    return  # the caller is gone: leaving the iteration cancels the request

    def _reply(self, worker, call_id: int, final: bool, response: InferResponse) -> bool:
        """Send a response; it is done() once the caller no longer needs its outputs."""
        leased = sent = False
        try:
            outputs = []
            for o in response.outputs:
                place = o.place
                if place is not None and worker.alive:
                    try:
                        worker.map_region(place.region)
                    except ConnectionError:
                        return False
                    location = InRegion(place.region.region_id, place.offset, place.nbytes)
                    leased = True
                else:
                    location = o.data  # the one copy of these bytes: into the frame
                outputs.append(messages.TensorRef(o.name, o.datatype, list(o.shape), location))
            frame = messages.ResponseFrame(None, outputs, response.parameters)
            sent = worker.reply(messages.ServerReply(call_id, final, frame))
            if sent and leased:
                self._leases.setdefault((id(worker), call_id), deque()).append(response)
            return sent
        finally:
            if not (sent and leased):
                response.done()


_DECOUPLED_ONLY = ("Model {} is using the decoupled. The current BLS request call doesn't "
                   "support models using the decoupled transaction policy. Please use "
                   "'decoupled=True' argument to the 'exec' or 'async_exec' calls for "
                   "decoupled models.'")  # sic, the quote too


def _infer_request(args: dict, worker) -> InferRequest:
    version = args.get("version", -1)
    params = dict(args.get("parameters") or {})
    correlation_id = args.get("correlation_id", 0)
    flags = args.get("flags", 0)
    if correlation_id not in (0, ""):
        params["sequence_id"] = correlation_id
    if flags & SEQUENCE_START:
        params["sequence_start"] = True
    if flags & SEQUENCE_END:
        params["sequence_end"] = True
    if args.get("timeout"):
        params["timeout"] = args["timeout"]
    return InferRequest(
        model_name=args["model"],
        model_version="" if version is None or version < 0 else str(version),
        id=args.get("id", ""),
        parameters=params,
        inputs=[InputTensor(name, datatype, list(shape),
                            worker.bls_slice(data) if type(data) is list else data)
                for name, datatype, shape, data in args["inputs"]],
        outputs=[RequestedOutput(name) for name in args.get("outputs") or ()],
        bls=True)


def _bls_error(call_id: int, model: str, exc: ServerError) -> messages.ServerReply:
    """A failed call as Triton's Python backend reports it to the calling model: a response's
    error with its code (Triton since 2.58; 2.51 made it INTERNAL); a request the server
    refused before any model ran it (unknown model, validation, full queue) INTERNAL, saying
    so first, and one for a model that is not there is "not ready"."""
    if isinstance(exc, ModelError):
        return _error_reply(call_id, exc.code.name, exc.message)
    message = exc.message
    if exc.code is Code.NOT_FOUND:
        message = f"Failed for execute the inference request. Model '{model}' is not ready."
    return _error_reply(call_id, Code.INTERNAL.name,
                        f"Model {model} - Error when running inference: {message}")


def _error_reply(call_id: int, code: str, message: str) -> messages.ServerReply:
    return messages.ServerReply(call_id, True, messages.ResponseFrame([code, message], []))
