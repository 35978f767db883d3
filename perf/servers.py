"""The two servers a benchmark compares: the real Triton (started through the anchors' scripts)
and shmserve. Each binds 127.0.0.1 only and is stopped by its PID."""
import argparse
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable

PERF_DIR = Path(__file__).resolve().parent
REPO_ROOT = PERF_DIR.parent
CLK_TCK = os.sysconf("SC_CLK_TCK")
SERVER_NAMES = ("triton", "shmserve")


class ServerError(RuntimeError):
    pass


def anchors_env(anchors: Path) -> dict[str, str]:
    """The environment the anchors' env.sh defines (paths to tritonserver, perf_analyzer, ports)."""
    out = subprocess.run(["bash", "-c", f'. "{anchors}/env.sh" && env -0'], check=True,
                         stdout=subprocess.PIPE, env=dict(os.environ, ANCHORS=str(anchors))).stdout
    return dict(item.split("=", 1) for item in out.decode().split("\0") if "=" in item)


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_in_use(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _proc_stat(pid: int) -> list[str]:
    with open(f"/proc/{pid}/stat") as f:
        text = f.read()
    # fields after the command name, which may itself contain spaces and parentheses
    return text[text.rindex(")") + 2:].split()


def _all_stats() -> dict[int, list[str]]:
    stats = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stats[int(d)] = _proc_stat(int(d))
            except (FileNotFoundError, ProcessLookupError):
                pass
    return stats


def _tree(root: int, stats: dict[int, list[str]]) -> list[int]:
    children: dict[int, list[int]] = {}
    for pid, st in stats.items():
        children.setdefault(int(st[1]), []).append(pid)
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        if pid in stats:
            found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def process_tree(root: int) -> list[int]:
    """root and its live descendants (python-backend stubs, workers), root first."""
    return _tree(root, _all_stats())


def split_cpu_seconds(root: int) -> tuple[float, float]:
    """(root's utime + stime, its live descendants' together): a server's front process (or
    tritonserver) apart from its model processes (workers, python-backend stubs). At high load
    a front near a whole core while the machine has idle CPU is the limit."""
    stats = _all_stats()
    cpu = {pid: (int(stats[pid][11]) + int(stats[pid][12])) / CLK_TCK for pid in _tree(root, stats)}
    front = cpu.pop(root, 0.0)
    return front, sum(cpu.values())


def thread_sched_seconds(pid: int) -> tuple[float, float] | None:
    """(seconds on a CPU, seconds ready to run and waiting for one) of a process's main thread,
    from the kernel's schedstat; None where the kernel keeps none. shmserve's event loop runs on
    its main thread: a loop that is busy or ready all the time limits the throughput however
    little it runs, and the waiting is the time other threads held its core."""
    try:
        with open(f"/proc/{pid}/task/{pid}/schedstat") as f:
            run_ns, wait_ns = (int(x) for x in f.read().split()[:2])
    except (OSError, ValueError):
        return None
    return run_ns / 1e9, wait_ns / 1e9


def tree_cpu_seconds(root: int) -> float:
    """utime + stime of root and all its live descendants."""
    return sum(split_cpu_seconds(root))


def children_cpu_seconds() -> float:
    """CPU time of this process's children that have ended (perf_analyzer runs, say)."""
    t = os.times()
    return t.children_user + t.children_system


def host_steal_seconds() -> float:
    """CPU time the hypervisor gave to others while this VM's CPUs wanted it ("steal" in
    /proc/stat), summed over all CPUs; 0 where the kernel does not count it."""
    with open("/proc/stat") as f:
        fields = f.readline().split()
    return int(fields[8]) / CLK_TCK if len(fields) > 8 else 0.0


def add_steal_arguments(ap: argparse.ArgumentParser) -> None:
    """--max-steal and --steal-reruns, for the benchmarks that measure through measure_steady."""
    ap.add_argument("--max-steal", type=float, default=0.1,
                    help="cores the hypervisor may take during a measurement before it is taken again (default 0.1)")
    ap.add_argument("--steal-reruns", type=int, default=2,
                    help="how many times a measurement with too much steal is taken again (default 2)")


def measure_steady(run, max_steal: float, reruns: int) -> dict:
    """run() (a dict of figures) with the host's steal over it in cores: on a shared VM the
    hypervisor may take a third of the machine for minutes, and a measurement taken then says
    nothing about either server. One whose steal passes max_steal is taken again, up to
    `reruns` times; the last is kept, its steal shown."""
    for attempt in range(reruns + 1):  # noqa: B007 (the last value is reported below)
        steal0, t0 = host_steal_seconds(), time.monotonic()
        figures = run()
        steal = (host_steal_seconds() - steal0) / (time.monotonic() - t0)
        if steal <= max_steal or figures.get("error"):
            break
    return dict(figures, steal_cores=round(steal, 3), steal_reruns=attempt)


def rss_kib(pid: int) -> int:
    """Resident memory of one process (VmRSS), KiB."""
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


class Server:
    """What a benchmark needs of a server: start(), stop() -> leftover PIDs, its ports and PID."""

    name: str
    http_port: int
    grpc_port: int
    metrics_port: int
    pid: int | None = None

    @property
    def ports(self) -> tuple[int, int, int]:
        return self.http_port, self.grpc_port, self.metrics_port

    def check_ports_free(self) -> None:
        busy = [p for p in self.ports if port_in_use(p)]
        if busy:
            raise ServerError(f"{self.name}: port(s) {busy} on 127.0.0.1 already in use; stop whatever holds them")

    def wait_model_ready(self, model: str, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        url = f"http://127.0.0.1:{self.http_port}/v2/models/{model}/ready"
        while not http_ok(url):
            if time.monotonic() > deadline:
                raise ServerError(f"{self.name}: model {model} not ready after {timeout_s:.0f} s")
            time.sleep(0.25)


class TritonServer(Server):
    """tritonserver via the anchors' start_triton.sh / stop_pid.sh (PID in $ANCHORS/run/triton.pid)."""

    name = "triton"

    def __init__(self, anchors: Path, env: dict[str, str], model_repository: Path, log_path: Path):
        self.anchors, self.env = anchors, env
        self.model_repository, self.log_path = model_repository, log_path
        self.http_port, self.grpc_port, self.metrics_port = (
            int(env["TRITON_HTTP"]), int(env["TRITON_GRPC"]), int(env["TRITON_METRICS"]))
        self.pid_file = anchors / "run" / "triton.pid"
        self.started = False

    def start(self) -> None:
        # start_triton.sh silently reuses a running Triton, which may serve another repository.
        if self.pid_file.exists():
            raise ServerError(f"{self.pid_file} exists: a Triton from the anchors is running; "
                              f"stop it first ({self.anchors}/stop_pid.sh triton)")
        self.check_ports_free()
        env = dict(os.environ, ANCHORS=str(self.anchors), TRITON_REPO=str(self.model_repository),
                   TRITON_LOG=str(self.log_path))
        self.started = True
        self.started_at = time.time()
        # In the client's session, as the anchors' scripts start it from a shell, and as
        # shmserve is started (see ShmServer).
        p = subprocess.run([str(self.anchors / "start_triton.sh")], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if self.pid_file.exists():
            self.pid = int(self.pid_file.read_text())
        if p.returncode != 0:
            raise ServerError(f"triton did not start:\n{p.stdout[-3000:]}")

    def stop(self) -> list[int]:
        # Only ours: start() refuses to run while another Triton's PID file exists.
        if self.started and self.pid_file.exists():
            subprocess.run([str(self.anchors / "stop_pid.sh"), "triton"],
                           env=dict(os.environ, ANCHORS=str(self.anchors)), stdout=subprocess.DEVNULL)
            # Triton 2.51's Python backend makes /tmp/python_env_XXXXXX at each start and never
            # removes it: only this run's (made since start(), empty) go.
            for path in Path(tempfile.gettempdir()).glob("python_env_*"):
                if path.is_dir() and path.stat().st_mtime >= self.started_at:
                    shutil.rmtree(path, ignore_errors=True)
        self.started, self.pid = False, None
        return []


class ShmServer(Server):
    """shmserve from the project's venv (or $SHMSERVE_VENV), in the client's session, as
    Triton is started: where the kernel groups threads by session for scheduling (autogroup),
    a session of its own changes a server's share of the cores (see perf/README.md), so both
    servers are placed alike. It leads a process group of its own, in which what it leaves
    behind (workers that outlive it) can be found and reported."""

    name = "shmserve"

    def __init__(self, model_repository: Path, ports: tuple[int, int, int], log_path: Path):
        self.model_repository, self.log_path = model_repository, log_path
        self.http_port, self.grpc_port, self.metrics_port = ports
        self.proc: subprocess.Popen | None = None

    @staticmethod
    def command() -> list[str]:
        """From $SHMSERVE_VENV if set (the interpreter's build matters, see perf/README.md), as
        the anchors' $TRITON_VENV picks Triton's; else from the project's venv."""
        venv = os.environ.get("SHMSERVE_VENV")
        exe = Path(venv or REPO_ROOT / ".venv") / "bin" / "shmserve"
        if exe.exists() or venv:
            return [str(exe)]
        # Without the project's venv (a lent GPU machine): this interpreter, from the checkout.
        return [sys.executable, "-m", "shmserve.cli"]

    @staticmethod
    def python() -> str:
        """The interpreter that runs shmserve and its workers."""
        command = ShmServer.command()
        return str(Path(command[0]).with_name("python")) if len(command) == 1 else command[0]

    def start(self, timeout_s: float = 120) -> None:
        self.check_ports_free()
        args = self.command() + [
            "--model-repository", str(self.model_repository),
            "--http-port", str(self.http_port), "--grpc-port", str(self.grpc_port),
            "--metrics-port", str(self.metrics_port), "--http-address", "127.0.0.1",
            "--grpc-address", "127.0.0.1", "--metrics-address", "127.0.0.1",
            # Triton 2.51 allows client shared memory; shmserve, as Triton since 2.68, must be
            # told to.
            "--allow-client-shm=true",
            # Flags to compare, as the anchors' TRITON_EXTRA_ARGS does for Triton.
            *shlex.split(os.environ.get("SHMSERVE_EXTRA_ARGS", ""))]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(args, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, process_group=0)
        self.pid = self.proc.pid
        deadline = time.monotonic() + timeout_s
        while not http_ok(f"http://127.0.0.1:{self.http_port}/v2/health/ready"):
            if self.proc.poll() is not None:
                raise ServerError(f"shmserve exited with {self.proc.returncode}; see {self.log_path}:\n"
                                  + self.log_path.read_text(errors="replace")[-3000:])
            if time.monotonic() > deadline:
                raise ServerError(f"shmserve not ready after {timeout_s:.0f} s; see {self.log_path}")
            time.sleep(0.25)

    def stop(self, grace_s: float = 40) -> list[int]:
        """SIGTERM, then SIGKILL after grace_s. Returns the PIDs of processes of its process
        group that were still alive afterwards (and were killed): a shutdown bug worth
        reporting."""
        if self.proc is None:
            return []
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        leftovers = [pid for pid, st in _all_stats().items() if int(st[2]) == self.proc.pid]
        for pid in leftovers:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc, self.pid = None, None
        return leftovers


def add_server_arguments(ap: argparse.ArgumentParser) -> None:
    """--only, --anchors and --shmserve-ports, which every benchmark takes."""
    ap.add_argument("--only", choices=SERVER_NAMES, help="measure one server only")
    ap.add_argument("--anchors", type=Path, default=Path(os.environ.get("ANCHORS", Path.home() / "shmserve-anchors")),
                    help="the anchors' directory (Triton, perf_analyzer); default $ANCHORS or ~/shmserve-anchors")
    ap.add_argument("--shmserve-ports", type=int, nargs=3, default=[18100, 18101, 18102],
                    metavar=("HTTP", "GRPC", "METRICS"))


def new_run(args, kind: str) -> tuple[dict[str, str], Path, dict[str, Server], list[str]]:
    """(anchors environment, a fresh perf/results/<kind>-<time>/ with pa/ in it, both servers
    on perf/triton_repo logging there, the names of the servers to measure)."""
    env = anchors_env(args.anchors)
    out_dir = PERF_DIR / "results" / time.strftime(f"{kind}-%Y%m%d-%H%M%S")
    (out_dir / "pa").mkdir(parents=True)
    repo = PERF_DIR / "triton_repo"
    servers = {
        "triton": TritonServer(args.anchors, env, repo, out_dir / "triton.log"),
        "shmserve": ShmServer(repo, tuple(args.shmserve_ports), out_dir / "shmserve.log"),
    }
    return env, out_dir, servers, [args.only] if args.only else list(SERVER_NAMES)


def end_run(servers: dict[str, Server], out_dir: Path, records: list[dict]) -> None:
    """Stop both servers (by PID) and write what was measured to results.jsonl."""
    for server in servers.values():
        server.stop()
    with open(out_dir / "results.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)


def serve_and_measure(server: Server, measure_all: Callable[[list[str]], None]) -> list[str]:
    """Start server, run measure_all(errors) (which appends what went wrong as it goes), stop it
    by its PID, also on failure. Returns the errors, with a failed start and processes that
    outlived the server among them."""
    errors = []
    try:
        server.start()
        measure_all(errors)
    except (ServerError, OSError, subprocess.SubprocessError) as e:
        errors.append(f"{server.name}: {e}")
    finally:
        leftovers = server.stop()
    if leftovers:
        errors.append(f"{server.name}: processes {leftovers} outlived the server (killed)")
    return errors


def run_servers(servers: dict[str, Server], names: list[str], out_dir: Path, records: list[dict],
                run_one: Callable[[Server], list[str]]) -> list[str]:
    """run_one(server) -> errors for each named server in turn; Ctrl-C keeps what was measured so
    far, SIGTERM stops the servers too; then end_run. Returns the errors."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    errors = []
    try:
        for name in names:
            errs = run_one(servers[name])
            errors += errs
            for e in errs:
                print(f"ERROR: {e}", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        errors.append("interrupted (Ctrl-C)")
    finally:
        end_run(servers, out_dir, records)
    return errors


def publish(out_dir: Path, text: str, errors: list[str]) -> int:
    """Print the report with the errors under it and write it to out_dir/table.md; the exit
    status: 1 when anything failed."""
    text += "".join(f"\n- error: {e}" for e in errors)
    (out_dir / "table.md").write_text(text + "\n")
    print(text)
    print(f"\nresults: {out_dir}", file=sys.stderr)
    return 1 if errors else 0


_DESCRIBE_PYTHON = ("import os, sys; maps = open('/proc/self/maps').read(); "
                    "print(sys.version.split()[0], os.path.realpath(sys.executable), "
                    "'(libpython shared)' if 'libpython' in maps else '(libpython linked in)')")


def interpreters(env: dict[str, str]) -> dict[str, str]:
    """Which Python runs each server's Python code: shmserve whole, Triton's python-backend
    stubs (they load the libpython of the anchors' PY311_LIBDIR). How CPython was built (PGO,
    LTO, libpython linked in or shared) moves shmserve's throughput by 7-15 %."""
    def run(python: str, code: str) -> str:
        try:
            out = subprocess.run([python, "-c", code], stdout=subprocess.PIPE,
                                 stderr=subprocess.DEVNULL, text=True).stdout.strip()
        except OSError:
            out = ""
        return out or f"{python}: not runnable"
    stub_version = run(str(Path(env["TRITON_VENV"]) / "bin" / "python"),
                       "import sys; print(sys.version.split()[0])")
    libpython = Path(env["PY311_LIBDIR"]) / "libpython3.11.so.1.0"
    return {"shmserve": run(ShmServer.python(), _DESCRIBE_PYTHON),
            "triton_stub": f"{stub_version} {os.path.realpath(libpython)}"}


def interpreters_line(env: dict[str, str]) -> str:
    """The report's line naming both servers' Python."""
    found = interpreters(env)
    return f"\n\nPython: shmserve {found['shmserve']}; Triton's stubs {found['triton_stub']}."


def run_metadata(args, env: dict[str, str], **extra) -> dict:
    """What meta.json records of a run: when, which commit, which tools, which arguments."""
    git = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    head = git.stdout.strip() if git.returncode == 0 else None
    return dict(started_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), git_head=head,
                cpus=os.cpu_count(), **extra, anchors=str(args.anchors),
                perf_analyzer=env["PERF_ANALYZER"], shmserve_command=ShmServer.command(),
                python=interpreters(env), args=vars(args))


def fmt(v, spec: str) -> str:
    """A table cell: `v` formatted, or a dash when it was not measured."""
    return "–" if v is None else format(v, spec)


def markdown_row(cells) -> str:
    return "| " + " | ".join(cells) + " |"


def ratio(s, t):
    """shmserve's figure over Triton's, or None when either is missing."""
    return None if s is None or not t else s / t
