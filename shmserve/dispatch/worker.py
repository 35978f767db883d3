"""One model instance as seen from the front: its process, its channel, its arenas.

`execute` sends one Execute frame per batch and resolves when the Result frame comes back.
A worker that dies fails exactly its in-flight batch, with an error naming the instance.
"""

import asyncio
import itertools
import logging
import os
import socket
import sys
from dataclasses import dataclass, field
from typing import Callable, Optional

from shmserve.dispatch.arena import InputArena, new_segment
from shmserve.errors import Code, ServerError
from shmserve.ipc import messages
from shmserve.ipc.channel import AsyncChannel

log = logging.getLogger("shmserve.dispatch")

# Tensors up to this size travel inside the control frame: for small tensors a memcpy into
# the frame is cheaper than an arena slot and its release message.
INLINE_THRESHOLD = 64 * 1024
ARENA_BYTES = 256 * 1024 * 1024  # sparse: pages cost memory only once touched


@dataclass(slots=True)
class WorkInput:
    name: str
    datatype: str
    shape: list
    data: object  # bytes or memoryview of raw wire bytes


@dataclass(slots=True)
class WorkRequest:
    """A validated request, ready for a worker."""

    request_id: str
    correlation_id: object
    flags: int
    parameters: dict
    inputs: list  # of WorkInput
    requested_outputs: list  # of str


@dataclass(slots=True)
class WorkOutput:
    name: str
    datatype: str
    shape: list
    data: object  # bytes (inline) or memoryview into the output arena


@dataclass(slots=True)
class WorkResponse:
    error: Optional[ServerError]
    outputs: list = field(default_factory=list)
    parameters: dict = field(default_factory=dict)
    # Output-arena offsets to hand back once the outputs are copied out.
    slots: list = field(default_factory=list)


@dataclass(slots=True)
class BatchTimings:
    compute_input_ns: int = 0
    compute_infer_ns: int = 0
    compute_output_ns: int = 0


class WorkerHandle:
    def __init__(self, *, model_name: str, model_version: int, model_dir: str,
                 model_repository: str, model_config: dict, instance_name: str,
                 instance_kind: str, device_id: int,
                 on_exit: Optional[Callable[["WorkerHandle"], None]] = None):
        self.instance_name = instance_name
        self._init_args = dict(model_name=model_name, model_version=model_version,
                               model_dir=model_dir, model_repository=model_repository,
                               model_config=model_config, instance_name=instance_name,
                               instance_kind=instance_kind, device_id=device_id)
        self._on_exit = on_exit
        self._batch_ids = itertools.count(1)
        self._pending: dict = {}  # batch id -> (future, input offsets)
        self._channel: Optional[AsyncChannel] = None
        self._process: Optional[asyncio.subprocess.Process] = None
        self._ready: Optional[asyncio.Future] = None
        self._bye: Optional[asyncio.Future] = None
        self._input_arena: Optional[InputArena] = None
        self._output_arena = None
        self._output_buf = None
        self.alive = False

    @property
    def pid(self) -> Optional[int]:
        return self._process.pid if self._process else None

    async def start(self) -> None:
        """Spawn the process and load the model; ServerError(UNAVAILABLE) if it fails."""
        loop = asyncio.get_running_loop()
        tag = self.instance_name
        self._input_arena = InputArena(f"{tag}.in", ARENA_BYTES)
        self._output_arena = new_segment(f"{tag}.out", ARENA_BYTES)
        self._output_buf = self._output_arena.buffer
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "workers", str(child.fileno()),
                pass_fds=(child.fileno(),), stdin=asyncio.subprocess.DEVNULL,
                env=worker_env())
        finally:
            child.close()
        self._ready = loop.create_future()
        _, self._channel = await loop.create_unix_connection(
            lambda: AsyncChannel(self._on_message, self._on_closed), sock=parent)
        self._channel.send(messages.Init(
            **self._init_args, input_arena=self._input_arena.name,
            output_arena=self._output_arena.name, inline_threshold=INLINE_THRESHOLD))
        asyncio.ensure_future(self._watch_exit())
        error = await self._ready
        if error:
            await self._reap()
            raise ServerError(Code.UNAVAILABLE, error)
        self.alive = True

    async def execute(self, batch: list) -> tuple[list, BatchTimings]:
        """Run one batch of WorkRequests; one WorkResponse per request, in order."""
        if not self.alive:
            raise ServerError(Code.UNAVAILABLE,
                              f"model instance '{self.instance_name}' is not available")
        batch_id = next(self._batch_ids)
        offsets = []
        frames = []
        try:
            for req in batch:
                refs = []
                for t in req.inputs:
                    refs.append(messages.TensorRef(t.name, t.datatype, t.shape,
                                                   self._place_input(t.data, offsets)))
                frames.append(messages.RequestFrame(req.request_id, req.correlation_id,
                                                    req.flags, req.parameters, refs,
                                                    req.requested_outputs))
            future = asyncio.get_running_loop().create_future()
            self._pending[batch_id] = (future, offsets)
            self._channel.send(messages.Execute(batch_id, frames))
        except BaseException:
            self._pending.pop(batch_id, None)
            self._free_inputs(offsets)
            raise
        return await future

    def release_outputs(self, offsets: list) -> None:
        if offsets and self.alive:
            try:
                self._channel.send(messages.Release(offsets))
            except ConnectionError:
                pass  # the worker is gone, and its arena with it

    async def stop(self, timeout: float = 10.0) -> None:
        """Finalize the model and end the process (killed if it does not stop in time)."""
        if self._process is None:
            return
        if self.alive and self._channel is not None:
            self._bye = asyncio.get_running_loop().create_future()
            try:
                self._channel.send(messages.Shutdown())
                await asyncio.wait_for(asyncio.shield(self._bye), timeout)
            except (ConnectionError, asyncio.TimeoutError):
                pass
        self.alive = False
        await self._reap(timeout)

    async def _reap(self, timeout: float = 5.0) -> None:
        proc = self._process
        if proc is not None and proc.returncode is None:
            try:
                await asyncio.wait_for(proc.wait(), timeout)
            except asyncio.TimeoutError:
                proc.kill()
                await proc.wait()
        if self._channel is not None:
            self._channel.close()
        self._destroy_arenas()

    def _destroy_arenas(self) -> None:
        if self._input_arena is not None:
            self._input_arena.destroy()
            self._input_arena = None
        if self._output_arena is not None:
            self._output_buf = None
            self._output_arena.close()
            self._output_arena.unlink()
            self._output_arena = None

    def _place_input(self, data, offsets: list):
        n = data.nbytes if isinstance(data, memoryview) else len(data)
        if n <= INLINE_THRESHOLD:
            return data
        offset = self._input_arena.put(data)
        if offset is None:
            return data  # arena full: fall back to inline bytes
        offsets.append(offset)
        return (messages.INPUT_ARENA, offset, n)

    def _free_inputs(self, offsets: list) -> None:
        if self._input_arena is not None:
            for offset in offsets:
                self._input_arena.free(offset)

    def _on_message(self, msg) -> None:
        if isinstance(msg, messages.Result):
            entry = self._pending.pop(msg.batch_id, None)
            if entry is None:
                return
            future, offsets = entry
            self._free_inputs(offsets)
            if not future.done():
                future.set_result((self._responses(msg), BatchTimings(
                    msg.compute_input_ns, msg.compute_infer_ns, msg.compute_output_ns)))
        elif isinstance(msg, messages.Ready):
            if self._ready is not None and not self._ready.done():
                self._ready.set_result(msg.error)
        elif isinstance(msg, messages.Bye):
            if self._bye is not None and not self._bye.done():
                self._bye.set_result(None)

    def _responses(self, msg: messages.Result) -> list:
        out = []
        for frame in msg.responses:
            if frame.error is not None:
                code, text = frame.error
                out.append(WorkResponse(ServerError(_code(code), text), parameters=frame.parameters))
                continue
            outputs = []
            slots = []
            for t in frame.outputs:
                loc = t.location
                if isinstance(loc, bytes):
                    data = loc
                else:
                    _, offset, nbytes = loc
                    data = self._output_buf[offset:offset + nbytes]
                    slots.append(offset)
                outputs.append(WorkOutput(t.name, t.datatype, t.shape, data))
            out.append(WorkResponse(None, outputs, frame.parameters, slots))
        return out

    def _on_closed(self, exc) -> None:
        self._fail_pending("connection to the worker was lost")

    async def _watch_exit(self) -> None:
        proc = self._process
        code = await proc.wait()
        was_alive = self.alive
        self.alive = False
        if self._ready is not None and not self._ready.done():
            self._ready.set_result(f"model instance '{self.instance_name}' exited with code "
                                   f"{code} while loading (see the server log)")
        self._fail_pending(f"exited with code {code}")
        if was_alive and self._on_exit is not None:
            self._on_exit(self)

    def _fail_pending(self, why: str) -> None:
        pending, self._pending = self._pending, {}
        for future, offsets in pending.values():
            self._free_inputs(offsets)
            if not future.done():
                future.set_exception(ServerError(
                    Code.INTERNAL,
                    f"Failed to process the request(s) for model instance "
                    f"'{self.instance_name}', message: the instance's process {why}"))


def _code(name: str) -> Code:
    try:
        return Code[name]
    except KeyError:
        return Code.INTERNAL


def worker_env() -> dict:
    env = dict(os.environ)
    # Workers must import this checkout's `workers` and `shmserve.ipc` even when the server
    # runs from a source tree rather than an installed package.
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env
