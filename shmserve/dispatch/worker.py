"""One model instance as seen from the front: the handle the pool, the schedulers and the
supervisor hold, across its worker processes.

Its parts go by how long they live:
- each start spawns a worker process (worker_process.py) with its shared memory
  (instance_memory.py), its channel, and the socket that lends it clients' sockets
  (fastpath/worker_loans.py); the process's exit, or its stop, ends them all together, and the
  regions it mapped (region_mapping.py) go with it;
- the batches and streams it holds (batch_dispatch.py), the answers its worker writes
  (fastpath/worker_loans.py), its custom metrics (custom_metrics.py) and the look-out for hangs
  (hang_watch.py) belong to the handle, and outlive each process: a worker that dies fails
  the batches it holds (the running one and the one queued behind it), and the streams still
  open, with an error naming the instance. With `detect_hangs`, so does one that holds work
  and sends nothing for too long: it is killed.
The handle routes the worker's frames to those parts, and answers for the rest of the
instance's life: its readiness, the model's calls into the server, its exit.
"""

import asyncio
import logging
import os
import socket
from typing import Any, Callable, Optional

from shmserve.dispatch.batch_dispatch import BatchDispatch
from shmserve.dispatch.batch_layout import INLINE_THRESHOLD
from shmserve.dispatch.custom_metrics import CustomMetrics
from shmserve.dispatch.front_spin import FrontSpin
from shmserve.dispatch.hang_watch import HangWatch
from shmserve.dispatch.instance_memory import InstanceMemory
from shmserve.dispatch.memory_regions import Region, RegionSlice
from shmserve.dispatch.region_mapping import MappedRegions
from shmserve.dispatch.worker_process import PythonEnvironment, WorkerProcess
from shmserve.errors import Code, ModelError, ServerError
from shmserve.fastpath.worker_loans import WorkerLoans
from shmserve.ipc import messages
from shmserve.ipc.channel import AsyncChannel
from shmserve.ipc.idle_spin import DEFAULT_SPIN_US
from shmserve.observability import logs

log = logging.getLogger("shmserve.dispatch")

# How long requests on a closed channel wait for the process's exit code before failing.
EXIT_REPORT_WAIT_S = 1.0
# How long a model's is_ready() may take before the instance counts as not ready (Triton's).
READINESS_TIMEOUT_S = 5.0


class WorkerHandle:
    def __init__(self, *, model_name: str, model_version: int, model_dir: str,
                 model_repository: str, model_config: dict, instance_name: str,
                 instance_kind: str, device_id: int, runtime_dir: str = "",
                 on_exit: Optional[Callable[["WorkerHandle"], None]] = None,
                 on_server_call: Optional[Callable] = None, spin_us: int = DEFAULT_SPIN_US,
                 front_spin: Optional[FrontSpin] = None,
                 environment: Optional[PythonEnvironment] = None):
        """`on_server_call(handle, ServerCall)` serves the model's calls into the server
        (BLS, model control), answered with `reply`; `spin_us`: how long the worker polls
        for its next frame before it blocks, while the machine has a core to spare (0:
        never; see ipc/idle_spin.py); `front_spin`: keeps the front polling around its
        batches (see front_spin.py), if given; `environment`: the model's own Python
        environment (EXECUTION_ENV_PATH), if it has one."""
        self._environment = environment
        self.instance_name = instance_name
        # What an instance group update matches it by (repository/instances.py); the loader
        # sets it.
        self.signature: tuple = ()
        self._spin_us = spin_us
        self._init_args: dict[str, Any] = dict(model_name=model_name, model_version=model_version,
                               model_dir=model_dir, model_repository=model_repository,
                               model_config=model_config, instance_name=instance_name,
                               instance_kind=instance_kind, device_id=device_id,
                               runtime_dir=runtime_dir)
        self._on_exit = on_exit
        self._on_server_call = on_server_call
        self._channel: Optional[AsyncChannel] = None
        self._process: Optional[WorkerProcess] = None
        self._ready: Optional[asyncio.Future] = None
        self._bye: Optional[asyncio.Future] = None
        # The model defines is_ready(); the answer to the CheckReady in flight, if any.
        self.readiness_hook = False
        self._readiness: Optional[asyncio.Future] = None
        # A KIND_GPU instance's GPU, as its worker found it (empty until then, or unknown):
        # the batches it runs are counted under that GPU's metric labels.
        self.gpu_uuid = ""
        self.alive = False
        self._running = False  # started and not being stopped: an exit is a crash
        self._exit_watch: Optional[asyncio.Task] = None
        self._log_context = logs.context(model=model_name, version=model_version,
                                         instance=instance_name)
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._memory = InstanceMemory()
        self._metrics = CustomMetrics()
        self._loans = WorkerLoans(self)
        self._regions = MappedRegions(self, self._send)
        self._hangs = HangWatch(busy=lambda: self.alive and self.holds_work,
                                readers_behind=lambda: self._batches.waiting_on_readers(),
                                hung=self._hung)
        self._batches = BatchDispatch(self, self._memory, self._loans, self._regions,
                                      self._hangs, front_spin, self._send)

    @property
    def pid(self) -> Optional[int]:
        return self._process.pid if self._process else None

    @property
    def custom_metrics(self) -> list:
        """The model's custom metrics, as its process last reported them (MetricsReport)."""
        return self._metrics.families

    async def start(self) -> None:
        """Spawn the process and load the model; ServerError(UNAVAILABLE) if it fails."""
        loop = self._loop = self._hangs.loop = asyncio.get_running_loop()
        self._batches.begin(loop)
        self._process = None
        self._metrics.restart()
        try:
            self._metrics.open()
            self._memory.create(self.instance_name, bool(
                self._init_args["model_config"].get("sequence_batching", {}).get("state")))
        except BaseException as exc:
            self._destroy_memory()  # those made before the one that failed
            if isinstance(exc, OSError):  # ENOSPC when /dev/shm is full, EMFILE, ...
                raise ServerError(Code.UNAVAILABLE, f"cannot start model instance "
                                                    f"'{self.instance_name}': cannot create its "
                                                    f"shared memory: {exc}") from None
            raise
        self._regions.clear()
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        lent = self._loans.open()
        lent_fd = lent.fileno()  # the worker's, under the same number
        process = self._process = WorkerProcess(self._log_context, self._environment)
        assert self._memory.table is not None  # create() made it
        wake_fd = self._memory.table.wake_fd
        try:
            # The front's pid: the worker cleans up after a front that was killed.
            await process.spawn((str(child.fileno()), str(self._spin_us), str(os.getpid())),
                                pass_fds=(child.fileno(), wake_fd, lent_fd,
                                          self._metrics.fd))
            self._ready = loop.create_future()
            _, self._channel = await loop.create_unix_connection(
                lambda: AsyncChannel(self._on_message, self._on_closed), sock=parent)
        except BaseException as exc:
            parent.close()
            self._loans.close()
            await process.abandon()
            self._destroy_memory()
            if isinstance(exc, OSError):
                raise ServerError(Code.UNAVAILABLE, f"cannot start model instance "
                                                    f"'{self.instance_name}': {exc}") from None
            raise
        finally:
            child.close()
            lent.close()
        self._channel.send(messages.Init(
            **self._init_args, **self._memory.init_fields(), inline_threshold=INLINE_THRESHOLD,
            loan_fd=lent_fd, metrics_fd=self._metrics.fd))
        # Held here: the event loop keeps only a weak reference to tasks.
        self._exit_watch = asyncio.ensure_future(self._watch_exit())
        error = await self._ready
        if error:
            await self._reap()
            raise ServerError(Code.INTERNAL, error)  # the model's failure, as in Triton
        self.alive = True
        self._running = True

    def execute(self, batch: list) -> asyncio.Future:
        """Send one batch of WorkRequests to the worker now; the future gives (one
        WorkResponse per request, in order, BatchTimings). Sending here rather than in a task
        saves the batch a turn of the event loop before the worker can start on it."""
        if not self.alive:
            raise ServerError(Code.UNAVAILABLE,
                              f"model instance '{self.instance_name}' is not available")
        try:
            return self._batches.send(batch)
        except ConnectionError:
            self.alive = False
            raise ServerError(Code.UNAVAILABLE, f"model instance '{self.instance_name}' is "
                                                f"not available") from None

    def map_region(self, region: Region) -> None:
        """Have the worker map `region` before it reads the next frame, unless it has."""
        self._regions.map(region)

    def unmap_region(self, region_id: int) -> None:
        """The region is gone and no request uses it any more: the worker unmaps it."""
        self._regions.unmap(region_id, tell=self.alive)

    def bls_slice(self, location: list) -> RegionSlice:
        """Where a BLS input lies, by the location array the model's call carried: InCallArena
        in the model's BLS arena, or InRegion of a region this process has mapped (an input of
        its own passed on as it came). ValueError when it is neither, there is no such region
        or the range leaves it."""
        return self._regions.bls_slice(location, self._memory.bls_region)

    async def stop(self, timeout: float = 10.0) -> None:
        """Finalize the model and end the process (killed if it does not stop in time)."""
        self._running = False
        if self._process is None or not self._process.spawned:
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
        # Closing our end first makes a worker blocked on its socket see EOF and exit.
        if self._channel is not None:
            self._channel.close()
        assert self._process is not None  # start and stop reap only a spawned process
        await self._process.reap(timeout)
        self._loans.close()
        self._destroy_memory()

    def _destroy_memory(self) -> None:
        self._metrics.close()
        self._memory.destroy()

    def _send(self, msg) -> None:
        """Send a frame to the current process; ConnectionError when it is gone."""
        assert self._channel is not None  # frames are sent only once a process has started
        self._channel.send(msg)

    async def fresh_custom_metrics(self, timeout: float) -> None:
        """Ask the worker for its custom metrics, and wait until it has answered (then
        `custom_metrics` holds values as they were at this call, or newer), `timeout`
        seconds at most: a worker that does not answer in time shows its last values."""
        if self.alive:
            assert self._loop is not None  # set by start
            await self._metrics.fresh(self._loop, timeout)

    def _on_closed(self, exc) -> None:
        self.alive = False
        self._resolve_bye()
        self._metrics.wake()
        cancel_calls = getattr(self._on_server_call, "cancel_all_of", None)
        if cancel_calls is not None:  # nobody is left to read their answers
            cancel_calls(self)
        # The socket closes first when the process dies: its exit code, which _watch_exit
        # reports in a moment, tells the client more. Only a process that closed its end and
        # lives on is left for this to fail.
        assert self._loop is not None  # set by start, before the connection
        self._loop.call_later(EXIT_REPORT_WAIT_S, self._fail_pending_of,
                              self._batches.generation, "closed its connection to the server")

    def _fail_pending_of(self, generation: int, why: str) -> None:
        if generation == self._batches.generation:  # not a process started since
            self._fail_pending(why)

    async def _watch_exit(self) -> None:
        process = self._process
        assert process is not None  # watched once spawned
        code = await process.exit_code()
        unexpected = self._running
        self._running = False
        self.alive = False
        await process.log.close()  # the process's last lines come before the news of its end
        if unexpected:
            log.error("model instance '%s' (pid %s) exited with %s", self.instance_name,
                      process.pid, code, extra=self._log_context)
        self._resolve_bye()
        if self._ready is not None and not self._ready.done():
            # Triton's words for a stub that died before it was ready (its tests look for
            # them), then how it ended.
            self._ready.set_result(f"Stub process '{self.instance_name}' is not healthy. "
                                   f"(model instance '{self.instance_name}' exited with "
                                   f"{code} while loading; see the server log)")
        self._fail_pending(f"exited with {code}")
        if unexpected and self._on_exit is not None:
            self._on_exit(self)

    def detect_hangs(self, timeout: float) -> None:
        """From now on, an instance that holds work (a batch not yet answered, or a stream
        still open) and sends no frame for `timeout` seconds is hung: it is killed, its
        requests fail saying so, and its exit is reported like any other (`on_exit`)."""
        self._hangs.start(timeout)

    def _hung(self) -> None:
        timeout = self._hangs.timeout
        log.error("model instance '%s' (pid %s) holds requests and sent nothing for %g s "
                  "(--model-instance-timeout-secs): killing it", self.instance_name, self.pid,
                  timeout)
        self.kill(f"stopped answering within {timeout:g} s "
                  f"(--model-instance-timeout-secs) and was killed")

    def kill(self, why: str) -> None:
        """End the process now, without finalizing the model: its requests fail with an error
        naming the instance and saying that its process `why`."""
        process = self._process
        if process is None or not process.running:
            return
        self.alive = False
        self._fail_pending(why)
        process.kill()  # one that exited already is reported by _watch_exit

    @property
    def holds_work(self) -> bool:
        return self._batches.holds_work

    async def model_is_ready(self, timeout: float = READINESS_TIMEOUT_S) -> bool:
        """The answer of the model's is_ready() in this instance; False if it takes longer
        than `timeout`. The worker answers between batches. A check still running is not
        asked again: later callers wait for its answer (as Triton's Python backend does)."""
        if not self.alive:
            return False
        if self._readiness is None or self._readiness.done():
            self._readiness = asyncio.get_running_loop().create_future()
            assert self._channel is not None  # alive: started
            try:
                self._channel.send(messages.CheckReady())
            except ConnectionError:
                self._readiness.set_result(False)
        try:
            return await asyncio.wait_for(asyncio.shield(self._readiness), timeout)
        except asyncio.TimeoutError:
            return False

    def _fail_pending(self, why: str) -> None:
        if self._readiness is not None and not self._readiness.done():
            self._readiness.set_result(False)
        self._batches.fail(ModelError(Code.INTERNAL, f"Failed to process the request(s) for "
                                                     f"model instance '{self.instance_name}', "
                                                     f"message: the instance's process {why}"))

    def _on_message(self, msg) -> None:
        hangs = self._hangs
        if hangs.timeout:
            assert self._loop is not None  # set by start, before the connection
            hangs.last_frame = self._loop.time()
        if isinstance(msg, messages.StreamResponse):
            self._batches.stream_response(msg)
        elif isinstance(msg, messages.Result):
            self._batches.result(msg)
        elif isinstance(msg, messages.Written):
            self._loans.written(msg.batch_id, msg.unsent)
        elif isinstance(msg, messages.Ready):
            self.readiness_hook = msg.readiness_hook
            self.gpu_uuid = msg.gpu_uuid
            if self._ready is not None and not self._ready.done():
                self._ready.set_result(msg.error)
        elif isinstance(msg, messages.ReadyState):
            if self._readiness is not None and not self._readiness.done():
                self._readiness.set_result(bool(msg.ready))
        elif isinstance(msg, messages.MetricsReport):
            self._metrics.report(msg)
        elif isinstance(msg, messages.ServerCall):
            if self._on_server_call is not None:
                self._on_server_call(self, msg)
            else:
                self.reply(messages.ServerReply(msg.call_id, True, messages.ResponseFrame(
                    ["UNSUPPORTED", "this server does not serve calls from models"], [])))
        elif isinstance(msg, messages.Bye):
            self._resolve_bye()

    def reply(self, msg: messages.ServerReply) -> bool:
        """Answer a ServerCall; False when the worker is gone."""
        channel = self._channel
        if channel is None:  # no process yet (it was an AttributeError, caught below)
            return False
        try:
            channel.send(msg)
        except (ConnectionError, AttributeError):
            return False
        return True

    def _resolve_bye(self) -> None:
        if self._bye is not None and not self._bye.done():
            self._bye.set_result(None)
