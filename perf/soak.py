"""A bounded soak: minutes of mixed traffic on shmserve, every answer checked, the server's
processes watched for growth.

    .venv/bin/python perf/soak.py [--minutes 5] [--warmup-s 60] [--sample-s 10]
                                  [--ports 18120 18121 18122]

Serves model_repository/ with one shmserve and runs client threads (tritonclient) until
--minutes have passed: unary HTTP and gRPC (add_sub, identity_fp32 at a few sizes, string_echo),
ensemble_pipeline, gRPC streams to the decoupled `repeat` (streams closed and opened again every
STREAM_UNITS requests), HTTP generate_stream to `square` and now and then to
`textgen_iterative`, system shared memory over both protocols (regions created, registered, used
for inputs and outputs, unregistered and destroyed every SHM_CYCLE requests), and sequences on
accumulate / accumulate_oldest (running sums checked at every step).

Every SAMPLE_S it records the RSS and open fds of the server and of each of its workers, the
server's /dev/shm segments (shmserve.<pid>.*: count, size, memory behind them) and its
nv_inference_request_success / _failure counters. Open fds and /dev/shm are compared
between two quiescent samples (all clients held between two requests): one after --warmup-s,
one when the load ends. RSS swings too much for two samples to tell (see rss_peaks), so it is
judged by its peaks: the highest in the window that starts with the warm sample against the
highest in the window that ends with the last. Flat means, per process, the later peak less
than RSS_GROWTH above the earlier, no new fd, and no new /dev/shm segment or byte. Exit
status 1 on any wrong or failed answer, a server-side failure, an error in the server log, a
worker that changed, growth beyond these, or anything left behind. Files under
perf/results/soak-<date>-<time>/: table.md, samples.jsonl, shmserve.log.
"""

import argparse
import http.client
import itertools
import json
import os
import queue
import re
import signal
import sys
import threading
import time
import urllib.request
from collections import Counter
from functools import partial

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm

from servers import (PERF_DIR, REPO_ROOT, ServerError, ShmServer, markdown_row, open_fds,
                     process_tree, publish, rss_kib)

RSS_GROWTH = 0.05  # of the peak after warm-up, per process
TIMEOUT_S = 60
STREAM_UNITS = 50
SHM_CYCLE = 20
TEXTGEN_EVERY = 10  # generate_stream units; the others go to `square`
IDENTITY_SHAPES = ([1, 4], [1, 4096], [4, 1024], [1, 262144])
PROMPTS = ("The sea was", "Once upon a time", "He said that")


class WrongAnswer(Exception):
    pass


def expect(ok: bool, what: str) -> None:
    if not ok:
        raise WrongAnswer(what)


class Tally:
    """Requests sent and correctly answered per kind, errors per kind and exception class."""

    def __init__(self):
        self.lock = threading.Lock()
        self.sent, self.served, self.errors = Counter(), Counter(), Counter()
        self.first_errors: list[str] = []
        # Successes the server counts beyond one a request: the steps of iterative requests
        # after their first (Triton counts every step).
        self.more_steps = 0

    def send(self, kind: str) -> None:
        with self.lock:
            self.sent[kind] += 1

    def ok(self, kind: str, steps: int = 1) -> None:
        with self.lock:
            self.served[kind] += 1
            self.more_steps += steps - 1

    def error(self, client: str, exc: Exception) -> None:
        with self.lock:
            self.errors[f"{client}: {type(exc).__name__}"] += 1
            if len(self.first_errors) < 10:
                self.first_errors.append(f"{client}: {exc!r}"[:500])


class Gate:
    """Lets the client threads run, holds all of them between two units (for a quiescent
    sample), or ends them."""

    def __init__(self, threads: int):
        self.cond = threading.Condition()
        self.threads, self.parked, self.state = threads, 0, "run"

    def checkpoint(self) -> bool:
        """Called between two units; False when the client must end."""
        with self.cond:
            while self.state == "hold":
                self.parked += 1
                self.cond.notify_all()
                self.cond.wait()
                self.parked -= 1
            return self.state == "run"

    def hold(self) -> bool:
        with self.cond:
            self.state = "hold"
            return self.cond.wait_for(lambda: self.parked == self.threads, TIMEOUT_S)

    def release(self, state: str = "run") -> None:
        with self.cond:
            self.state = state
            self.cond.notify_all()


def module_of(protocol: str):
    return grpcclient if protocol == "grpc" else httpclient


def make_client(protocol: str, ports):
    if protocol == "grpc":
        return grpcclient.InferenceServerClient(f"127.0.0.1:{ports[1]}")
    return httpclient.InferenceServerClient(f"127.0.0.1:{ports[0]}", network_timeout=TIMEOUT_S,
                                            connection_timeout=TIMEOUT_S)


def tensor(module, name: str, array: np.ndarray, datatype: str, binary: bool = True):
    t = module.InferInput(name, list(array.shape), datatype)
    if module is httpclient:
        t.set_data_from_numpy(array, binary_data=binary)
    else:
        t.set_data_from_numpy(array)
    return t


def small_floats(rng, shape) -> np.ndarray:
    # integers: a + b and a - b are then exact in FP32 and can be compared with ==
    return rng.integers(-1000, 1000, shape).astype(np.float32)


class Client:
    """One thread's traffic: unit(rng) sends some requests and checks their answers."""

    name: str

    def __init__(self, tally: Tally, ports):
        self.tally, self.ports = tally, ports

    def call(self, kind: str, send):
        """send() -> its answer, the request counted as sent; the caller counts it served
        (tally.ok) once the answer passed its checks."""
        self.tally.send(kind)
        return send()

    def unit(self, rng) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class Unary(Client):
    """add_sub, identity_fp32 (a random shape) and string_echo over one protocol; over HTTP,
    JSON and binary tensors in turn."""

    def __init__(self, tally, ports, protocol: str):
        super().__init__(tally, ports)
        self.name, self.protocol = f"unary {protocol}", protocol
        self.module, self.client = module_of(protocol), make_client(protocol, ports)
        self.binary = itertools.cycle((True, False))

    def infer(self, model: str, inputs, outputs: dict) -> None:
        kind = f"{self.protocol} {model}"
        result = self.call(kind, partial(self.client.infer, model, inputs, **self.timeout()))
        for name, expected in outputs.items():
            got = result.as_numpy(name)
            expect(got is not None and got.shape == expected.shape and np.array_equal(got, expected),
                   f"{kind}: {name} differs from what was sent")
        self.tally.ok(kind)

    def timeout(self) -> dict:
        return dict(client_timeout=TIMEOUT_S) if self.protocol == "grpc" else {}

    def unit(self, rng) -> None:
        m, binary = self.module, next(self.binary)
        a, b = small_floats(rng, [4]), small_floats(rng, [4])
        self.infer("add_sub", [tensor(m, "INPUT0", a, "FP32", binary), tensor(m, "INPUT1", b, "FP32", binary)],
                   {"OUTPUT0": a + b, "OUTPUT1": a - b})
        x = rng.standard_normal(IDENTITY_SHAPES[rng.integers(len(IDENTITY_SHAPES))]).astype(np.float32)
        self.infer("identity_fp32", [tensor(m, "INPUT0", x, "FP32", binary and x.size > 4)], {"OUTPUT0": x})
        words = np.array([f"soak {i} é {rng.integers(1 << 30)}".encode() for i in range(rng.integers(1, 9))],
                         dtype=np.object_)
        self.infer("string_echo", [tensor(m, "INPUT0", words, "BYTES", binary)], {"OUTPUT0": words})

    def close(self) -> None:
        self.client.close()


class Ensemble(Unary):
    """ensemble_pipeline over one protocol."""

    def __init__(self, tally, ports, protocol: str):
        super().__init__(tally, ports, protocol)
        self.name = f"ensemble {protocol}"

    def unit(self, rng) -> None:
        a, b = small_floats(rng, [4]), small_floats(rng, [4])
        s, d = a + b, a - b
        self.infer("ensemble_pipeline", [tensor(self.module, "INPUT0", a, "FP32"),
                                         tensor(self.module, "INPUT1", b, "FP32")],
                   {"SUM": s, "DOUBLE0": s + d, "DOUBLE1": s - d})


class Stream(Client):
    """`repeat` on a gRPC stream: each element of IN back in order, then the empty final
    response; the stream is closed and a new one opened every STREAM_UNITS requests."""

    name = "stream grpc"
    kind = "grpc stream repeat"

    def __init__(self, tally, ports):
        super().__init__(tally, ports)
        self.client = grpcclient.InferenceServerClient(f"127.0.0.1:{ports[1]}")
        self.responses: queue.Queue = queue.Queue()
        self.units = 0
        self.open = False

    def unit(self, rng) -> None:
        try:
            self.exchange(rng)
        except BaseException:
            # responses of the failed request may still come: the next request gets a new stream
            self.close_stream()
            self.units = 0
            raise

    def exchange(self, rng) -> None:
        if self.units % STREAM_UNITS == 0:
            self.close_stream()
            self.responses = queue.Queue()
            self.client.start_stream(lambda result, error: self.responses.put((result, error)),
                                     stream_timeout=None)
            self.open = True
        self.units += 1
        values = rng.integers(-1 << 20, 1 << 20, rng.integers(1, 9)).astype(np.int32)
        rid = f"r{self.units}"
        self.call(self.kind, partial(self.client.async_stream_infer, "repeat",
                                     [tensor(grpcclient, "IN", values, "INT32")], request_id=rid,
                                     enable_empty_final_response=True))
        for i in range(len(values) + 1):
            result, error = self.responses.get(timeout=TIMEOUT_S)
            if error is not None:
                raise error
            response = result.get_response()
            expect(response.id == rid, f"{self.kind}: response for {response.id!r}, expected {rid!r}")
            final = response.parameters["triton_final_response"].bool_param
            if i == len(values):
                expect(final and not response.outputs, f"{self.kind}: no empty final response")
            else:
                expect(not final and result.as_numpy("OUT").tolist() == [values[i]]
                       and result.as_numpy("IDX").tolist() == [i], f"{self.kind}: response {i} is wrong")
        self.tally.ok(self.kind)

    def close_stream(self) -> None:
        if self.open:
            self.client.stop_stream()
            self.open = False

    def close(self) -> None:
        self.close_stream()
        self.client.close()


class GenerateStream(Client):
    """HTTP generate_stream (server-sent events) on one kept-alive connection: `square` with
    IN = n gives n events holding n; every TEXTGEN_EVERY-th request a short greedy text from
    textgen_iterative, which must be the same every time for a prompt."""

    name = "generate_stream http"

    def __init__(self, tally, ports):
        super().__init__(tally, ports)
        self.conn = http.client.HTTPConnection("127.0.0.1", ports[0], timeout=TIMEOUT_S)
        self.units = 0
        self.texts: dict[str, str] = {}

    def events(self, model: str, body: dict) -> list[dict]:
        self.conn.request("POST", f"/v2/models/{model}/generate_stream", json.dumps(body),
                          {"Content-Type": "application/json"})
        response = self.conn.getresponse()
        text = response.read().decode()
        expect(response.status == 200, f"generate_stream {model}: HTTP {response.status} {text[:200]}")
        return [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:")]

    def unit(self, rng) -> None:
        try:
            self.exchange(rng)
        except BaseException:
            self.conn.close()  # the next request connects again
            raise

    def exchange(self, rng) -> None:
        self.units += 1
        if self.units % TEXTGEN_EVERY == 0:
            kind = "http generate_stream textgen_iterative"
            prompt = PROMPTS[rng.integers(len(PROMPTS))]
            events = self.call(kind, partial(self.events, "textgen_iterative", dict(
                text_input=prompt, max_tokens=12, temperature=0.0, stream=True)))
            text = "".join(e.get("text_output", "") for e in events)
            expect(0 < len(text) <= 12 and all("error" not in e for e in events),
                   f"{kind}: {len(text)} characters, {events[-1:]}")
            expect(self.texts.setdefault(prompt, text) == text,
                   f"{kind}: greedy text for {prompt!r} changed: {self.texts[prompt]!r} then {text!r}")
            self.tally.ok(kind, steps=len(text))  # one decode step a character
            return
        else:
            kind = "http generate_stream square"
            n = int(rng.integers(1, 7))
            events = self.call(kind, partial(self.events, "square", {"IN": n}))
            expect([np.ravel(e.get("OUT")).tolist() for e in events] == [[n]] * n,
                   f"{kind}: IN={n} gave {events}")
        self.tally.ok(kind)

    def close(self) -> None:
        self.conn.close()


class SharedMemory(Unary):
    """identity_fp32 and add_sub with inputs and outputs in system shared memory regions of
    this client, over one protocol; the regions live SHM_CYCLE requests, then are unregistered
    and destroyed and new ones made."""

    def __init__(self, tally, ports, protocol: str):
        super().__init__(tally, ports, protocol)
        self.name = f"shm {protocol}"
        self.cycles = itertools.count()

    def shm_infer(self, model: str, inputs: dict, outputs: dict, regions: dict) -> None:
        """inputs / outputs: name -> (array, offset); arrays in the 'in' / 'out' region."""
        kind = f"{self.protocol} shm {model}"
        tensors, requested = [], []
        for name, (array, offset) in inputs.items():
            shm.set_shared_memory_region(regions["in"][1], [array], offset)
            t = self.module.InferInput(name, list(array.shape), "FP32")
            t.set_shared_memory(regions["in"][0], array.nbytes, offset)
            tensors.append(t)
        for name, (array, offset) in outputs.items():
            o = self.module.InferRequestedOutput(name, binary_data=True) if self.module is httpclient \
                else self.module.InferRequestedOutput(name)
            o.set_shared_memory(regions["out"][0], array.nbytes, offset)
            requested.append(o)
        self.call(kind, partial(self.client.infer, model, tensors, outputs=requested, **self.timeout()))
        for name, (array, offset) in outputs.items():
            # a copy: no view of the region may outlive it (an exported buffer cannot be closed)
            got = shm.get_contents_as_numpy(regions["out"][1], np.float32, array.shape, offset).copy()
            expect(np.array_equal(got, array), f"{kind}: {name} in the output region is wrong")
        self.tally.ok(kind)

    def unit(self, rng) -> None:
        elements = int(rng.integers(1024, 65537))
        nbytes = max(elements * 4, 64)
        prefix = f"soak_{os.getpid()}_{self.protocol}_{next(self.cycles)}"
        regions, registered = {}, []
        try:
            for role in ("in", "out"):
                name = f"{prefix}_{role}"
                regions[role] = (name, shm.create_shared_memory_region(name, "/" + name, nbytes, create_only=True))
                self.client.register_system_shared_memory(name, "/" + name, nbytes, **self.timeout())
                registered.append(name)
            for _ in range(SHM_CYCLE // 2):
                x = rng.standard_normal([1, elements]).astype(np.float32)
                self.shm_infer("identity_fp32", {"INPUT0": (x, 0)}, {"OUTPUT0": (x, 0)}, regions)
                a, b = small_floats(rng, [4]), small_floats(rng, [4])
                self.shm_infer("add_sub", {"INPUT0": (a, 0), "INPUT1": (b, 16)},
                               {"OUTPUT0": (a + b, 32), "OUTPUT1": (a - b, 48)}, regions)
        finally:
            for name in registered:
                self.client.unregister_system_shared_memory(name, **self.timeout())
            for _, region in regions.values():
                shm.destroy_shared_memory_region(region)


class Sequences(Unary):
    """Sequences of 3 to 12 requests on accumulate or accumulate_oldest over one protocol, the
    running sum checked at every step."""

    ids = itertools.count(1 + (os.getpid() << 20))  # shared by every Sequences client

    def __init__(self, tally, ports, protocol: str):
        super().__init__(tally, ports, protocol)
        self.name = f"sequence {protocol}"

    def unit(self, rng) -> None:
        model = ("accumulate", "accumulate_oldest")[rng.integers(2)]
        kind = f"{self.protocol} sequence {model}"
        values = rng.integers(-1000, 1000, rng.integers(3, 13)).astype(np.int32)
        sequence_id, total = next(self.ids), 0
        for i, v in enumerate(values):
            total += int(v)
            result = self.call(kind, partial(
                self.client.infer, model, [tensor(self.module, "INPUT", np.array([[v]], np.int32), "INT32")],
                sequence_id=sequence_id, sequence_start=i == 0, sequence_end=i == len(values) - 1,
                **self.timeout()))
            got = result.as_numpy("OUTPUT")
            expect(got is not None and got.tolist() == [[total]],
                   f"{kind}: step {i} of sequence {sequence_id}: OUTPUT {got}, expected {total}")
            self.tally.ok(kind)


def make_clients(tally: Tally, ports) -> list[Client]:
    clients = [Stream(tally, ports), GenerateStream(tally, ports)]
    for protocol in ("http", "grpc"):
        clients += [cls(tally, ports, protocol) for cls in (Unary, Ensemble, SharedMemory, Sequences)]
    return clients


def run_client(client: Client, gate: Gate, seed: int) -> None:
    rng = np.random.default_rng(seed)
    try:
        while gate.checkpoint():
            try:
                client.unit(rng)
            except Exception as exc:  # any failure is counted; the client goes on
                client.tally.error(client.name, exc)
                time.sleep(0.2)
    finally:
        client.close()


# ---- what the server holds --------------------------------------------------------------------

def worker_labels(server_pid: int) -> dict[int, str]:
    """pid -> 'front' or the instance whose arenas a worker maps (e.g. 'add_sub_0_0')."""
    pattern = re.compile(rf"/dev/shm/shmserve\.{server_pid}\.(.+)\.(?:in|out|req|state)\.\d+$")
    labels = {}
    for pid in process_tree(server_pid):
        if pid == server_pid:
            labels[pid] = "front"
            continue
        try:
            with open(f"/proc/{pid}/maps") as f:
                tags = {m.group(1) for line in f if (m := pattern.search(line.rstrip()))}
        except OSError:
            tags = set()
        labels[pid] = ",".join(sorted(tags)) or f"pid {pid}"
    return labels


def server_segments(server_pid: int) -> dict:
    count = size = allocated = 0
    for entry in os.scandir("/dev/shm"):
        if entry.name.startswith(f"shmserve.{server_pid}."):
            st = entry.stat()
            count, size, allocated = count + 1, size + st.st_size, allocated + st.st_blocks * 512
    return dict(segments=count, bytes=size, allocated=allocated)


def our_regions() -> list[str]:
    return [e.name for e in os.scandir("/dev/shm") if e.name.startswith(f"soak_{os.getpid()}_")]


def request_metrics(metrics_port: int) -> dict:
    """success per model, failure per reason (summed over models)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as r:
        text = r.read().decode()
    success, failure = Counter(), Counter()
    for line in text.splitlines():
        m = re.match(r'nv_inference_request_(success|failure)\{(.*)\} (\S+)$', line)
        if m:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
            if m.group(1) == "success":
                success[labels["model"]] += int(float(m.group(3)))
            else:
                failure[labels["reason"]] += int(float(m.group(3)))
    return dict(success=dict(success), failure=dict(failure))


def sample(server: ShmServer, labels: dict[int, str], started: float, tag: str) -> dict:
    procs = {}
    for pid in process_tree(server.pid):
        try:
            procs[labels.get(pid, f"new pid {pid}")] = dict(pid=pid, rss_mib=rss_kib(pid) / 1024, fds=open_fds(pid))
        except OSError:
            pass
    return dict(tag=tag, t_s=round(time.monotonic() - started, 1), procs=procs,
                shm=server_segments(server.pid), metrics=request_metrics(server.metrics_port))


# ---- the report -------------------------------------------------------------------------------

def rss_peaks(samples: list[dict], warm: dict, label: str) -> tuple[float, float]:
    """A process's highest RSS (MiB) in the window that starts with the warm sample, and in the
    window that ends with the last sample; each window holds as many samples as the warm-up.

    Under this mix the front's RSS swings by a fifth between samples, quiescent ones too (a
    run of 2026-11-28: 87-111 MiB under load with no trend, 103.0 held after warm-up and 110.3
    held at the end): the JSON of a 1 MiB tensor leaves the allocator holding pages for a
    while. A leak lifts every later sample, so it lifts the later peak; the swing does not."""
    start = next(i for i, s in enumerate(samples) if s is warm)
    width = max(start, 1)
    pid = warm["procs"][label]["pid"]

    def peak(window):
        return max(s["procs"][label]["rss_mib"] for s in window
                   if s["procs"].get(label, {}).get("pid") == pid)
    return peak(samples[start:start + width]), peak(samples[-width:])


def growth_table(samples: list[dict], warm: dict, end: dict, errors: list[str]) -> str:
    rows = [markdown_row(["process", "pid", "peak RSS MiB after warm-up → at the end", "growth",
                          "fds warm → end"]),
            markdown_row(["---"] * 5)]
    for label in sorted(warm["procs"].keys() | end["procs"].keys()):
        w, e = warm["procs"].get(label), end["procs"].get(label)
        if w is None or e is None or w["pid"] != e["pid"]:
            errors.append(f"process {label}: {w and w['pid']} at warm-up, {e and e['pid']} at the end")
            continue
        early, late = rss_peaks(samples, warm, label)
        grew = (late - early) / early
        if grew >= RSS_GROWTH:
            errors.append(f"{label}: peak RSS grew {grew:+.1%} ({early:.1f} → {late:.1f} MiB)")
        if e["fds"] > w["fds"]:
            errors.append(f"{label}: open fds {w['fds']} → {e['fds']}")
        rows.append(markdown_row([label, str(e["pid"]), f"{early:.1f} → {late:.1f}",
                                  f"{grew:+.2%}", f"{w['fds']} → {e['fds']}"]))
    ws, es = warm["shm"], end["shm"]
    for key in ("segments", "bytes", "allocated"):
        if es[key] > ws[key]:
            errors.append(f"/dev/shm {key}: {ws[key]} → {es[key]}")
    rows.append(markdown_row(["/dev/shm shmserve.*", "", f"segments {ws['segments']} → {es['segments']}",
                              f"bytes {ws['bytes']} → {es['bytes']}",
                              f"allocated {ws['allocated']} → {es['allocated']}"]))
    return "\n".join(rows)


def sample_line(s: dict) -> str:
    procs = s["procs"].values()
    return (f"| {s['tag']} | {s['t_s']:.0f} | {len(s['procs'])} | {sum(p['rss_mib'] for p in procs):.1f} | "
            f"{s['procs'].get('front', {}).get('rss_mib', 0):.1f} | {sum(p['fds'] for p in procs)} | "
            f"{s['shm']['segments']} | {s['shm']['allocated'] / 2**20:.1f} | "
            f"{sum(s['metrics']['success'].values())} | {sum(s['metrics']['failure'].values())} |")


def report(args, tally: Tally, samples: list[dict], warm: dict, end: dict, errors: list[str],
           log_lines: dict) -> str:
    lines = [f"# Soak: {args.minutes:g} min of mixed traffic on model_repository/", "",
             "| kind | sent | served |", "|---|---|---|"]
    lines += [f"| {k} | {tally.sent[k]} | {tally.served[k]} |" for k in sorted(tally.sent)]
    lost = sum(tally.sent.values()) - sum(tally.served.values())
    lines += ["", f"requests served: {sum(tally.served.values())}; lost (sent − correctly answered): {lost}",
              f"server's nv_inference_request_success at the end: {sum(end['metrics']['success'].values())} "
              f"(expected {server_successes(tally)}: ensemble requests count their two steps too, "
              f"iterative requests each of their decode steps)",
              "errors by kind: " + (", ".join(f"{k} × {n}" for k, n in sorted(tally.errors.items())) or "none"),
              "server failures by reason (metrics): " + (json.dumps(end["metrics"]["failure"])), "",
              "## Samples", "",
              "| sample | t s | processes | RSS MiB all | RSS MiB front | fds all | shm segments | shm MiB allocated "
              "| server successes | server failures |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    lines += [sample_line(s) for s in samples]
    lines += ["", f"## Growth: from the warm-up (t = {warm['t_s']:.0f} s) to the end "
              f"(t = {end['t_s']:.0f} s)", "",
              f"Flat: peak RSS growth < {RSS_GROWTH:.0%} per process (see rss_peaks), no new fd "
              f"between the quiescent samples, no new /dev/shm segment or byte.", "",
              growth_table(samples, warm, end, errors), "",
              f"server log: {log_lines['E']} error lines, {log_lines['W']} warning lines"]
    return "\n".join(lines)


def server_successes(tally: Tally) -> int:
    """What nv_inference_request_success must add up to: every request served, for each
    ensemble_pipeline request its two add_sub steps as well, and every decode step of an
    iterative request."""
    ensembles = sum(n for kind, n in tally.served.items() if kind.endswith("ensemble_pipeline"))
    return sum(tally.served.values()) + 2 * ensembles + tally.more_steps


def log_levels(path) -> dict:
    counts = Counter(line[:1] for line in path.read_text(errors="replace").splitlines())
    return {"E": counts["E"], "W": counts["W"]}


# ---- the run ----------------------------------------------------------------------------------

def quiescent(gate: Gate, server, labels, started, tag, errors) -> dict:
    """A sample with every client held between two units and the server given a second to settle."""
    if not gate.hold():
        errors.append(f"{tag}: the clients did not come to a halt within {TIMEOUT_S} s")
    time.sleep(1)
    return sample(server, labels, started, tag)


def soak(args, server: ShmServer, out_dir, errors: list[str]) -> tuple:
    tally = Tally()
    clients = make_clients(tally, tuple(args.ports))
    labels = worker_labels(server.pid)
    started = time.monotonic()
    samples = [sample(server, labels, started, "start (idle)")]
    gate = Gate(len(clients))
    threads = [threading.Thread(target=run_client, args=(c, gate, i), name=c.name, daemon=True)
               for i, c in enumerate(clients)]
    for t in threads:
        t.start()
    deadline = started + args.minutes * 60
    warm = None
    try:
        while (now := time.monotonic()) < deadline:
            time.sleep(min(args.sample_s, deadline - now))
            if warm is None and time.monotonic() - started >= args.warmup_s:
                warm = quiescent(gate, server, labels, started, "warm (held)", errors)
                samples.append(warm)
                gate.release()
            else:
                samples.append(sample(server, labels, started, "load"))
            print(sample_line(samples[-1]), file=sys.stderr, flush=True)
        end = quiescent(gate, server, labels, started, "end (held)", errors)
        samples.append(end)
    finally:
        gate.release("stop")
        for t in threads:
            t.join(TIMEOUT_S)
            if t.is_alive():
                errors.append(f"client {t.name} did not end")
    if warm is None:
        errors.append(f"the run was shorter than the warm-up ({args.warmup_s} s): no growth measured")
        warm = samples[0]
    with open(out_dir / "samples.jsonl", "w") as f:
        f.writelines(json.dumps(s) + "\n" for s in samples)
    return tally, samples, warm, end


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=5)
    ap.add_argument("--warmup-s", type=float, default=60)
    ap.add_argument("--sample-s", type=float, default=10)
    ap.add_argument("--ports", type=int, nargs=3, default=[18120, 18121, 18122], metavar=("HTTP", "GRPC", "METRICS"))
    return ap.parse_args()


def main() -> int:
    args = parse_args()
    out_dir = PERF_DIR / "results" / time.strftime("soak-%Y%m%d-%H%M%S")
    out_dir.mkdir(parents=True)
    server = ShmServer(REPO_ROOT / "model_repository", tuple(args.ports), out_dir / "shmserve.log")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    errors: list[str] = []
    text, server_pid = "", None
    try:
        server.start()
        tally, samples, warm, end = soak(args, server, out_dir, errors)
        if tally.errors:
            errors.append(f"{sum(tally.errors.values())} failed or wrong answers; first: {tally.first_errors}")
        if sum(tally.sent.values()) != sum(tally.served.values()):
            errors.append("requests lost")
        if sum(end["metrics"]["failure"].values()):
            errors.append(f"server-side failures: {end['metrics']['failure']}")
        counted, expected = sum(end["metrics"]["success"].values()), server_successes(tally)
        if counted != expected:
            errors.append(f"the server counts {counted} successes, the clients expect {expected}")
        log_lines = log_levels(server.log_path)
        if log_lines["E"]:
            errors.append(f"{log_lines['E']} error lines in {server.log_path}")
        text = report(args, tally, samples, warm, end, errors, log_lines)
    except (ServerError, OSError) as e:
        errors.append(f"shmserve: {e}")
    except KeyboardInterrupt:
        errors.append("interrupted (Ctrl-C)")
    finally:
        server_pid = server.pid
        leftovers = server.stop()
    if leftovers:
        errors.append(f"processes {leftovers} outlived the server (killed)")
    left = our_regions() + [n for n in os.listdir("/dev/shm") if n.startswith(f"shmserve.{server_pid}.")]
    if left:
        errors.append(f"left in /dev/shm: {left}")
    return publish(out_dir, text, errors)


if __name__ == "__main__":
    sys.exit(main())
