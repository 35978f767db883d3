"""What the benchmark does to one server: every model's outputs checked against onnxruntime run
here (perf_analyzer never looks at outputs), shmserve's session options against the in-process
loop's, perf_analyzer for each model, protocol and concurrency, and the memory of the process
holding `tiny`."""
import json
import sys
import urllib.request
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from pa_runner import measure_server
from servers import Server, ServerError, measure_steady
from .inprocess import backend_options
from .models import Model
from .processes import memory_kib, shmserve_worker, triton_stub

PROTOCOLS = {"grpc": grpcclient, "http": httpclient}


def port_of(server: Server, protocol: str) -> int:
    return server.grpc_port if protocol == "grpc" else server.http_port


def model_config(server: Server, model: str) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.http_port}/v2/models/{model}/config", timeout=10) as r:
        return json.loads(r.read())


def check_outputs(server: Server, model: Model, session, protocols: list[str]) -> None:
    """A batch of 3 random rows per protocol: OUTPUT0 must be what onnxruntime here computes."""
    rng = np.random.default_rng()
    data = {name: rng.standard_normal((3, cols), dtype=np.float32) for name, cols in model.inputs}
    expected = session.run(["OUTPUT0"], data)[0]
    for protocol in protocols:
        module = PROTOCOLS[protocol]
        client = module.InferenceServerClient(f"127.0.0.1:{port_of(server, protocol)}")
        try:
            tensors = []
            for name, array in data.items():
                tensors.append(module.InferInput(name, list(array.shape), "FP32"))
                tensors[-1].set_data_from_numpy(array)
            out = client.infer(model.name, tensors).as_numpy("OUTPUT0")
        except InferenceServerException as e:
            raise ServerError(f"{server.name} {model.name} {protocol}: infer failed: {e}") from e
        finally:
            client.close()
        if out is None or out.shape != expected.shape or not np.allclose(out, expected, rtol=1e-4, atol=1e-5):
            raise ServerError(f"{server.name} {model.name} {protocol}: OUTPUT0 (shape "
                              f"{None if out is None else out.shape}) differs from onnxruntime's")


def measure_one(server: Server, model: Model, protocol: str, concurrency: int, pa, out_dir: Path, args) -> dict:
    """One perf_analyzer case. One that does not settle within --stability is taken once more
    with twice the tolerance (`retried_with_s` in its record, marked in the report), so that a
    busy machine leaves a figure, flagged, rather than an empty target."""
    pa_args = ["-m", model.name, "-u", f"127.0.0.1:{port_of(server, protocol)}", "-i", protocol,
               "--concurrency-range", f"{concurrency}:{concurrency}"]
    stem = out_dir / "pa" / f"{server.name}_{model.name}_{protocol}_c{concurrency}"

    def run() -> dict:
        rec = measure_server(server.pid, pa, pa_args, stem, args.measurement_args, retry=False)
        if rec["error"] and "stable" in rec["error"].lower() and args.stability < 100:
            looser = min(2 * args.stability, 100)
            rec = dict(measure_server(server.pid, pa, pa_args, stem.with_name(f"{stem.name}_s{looser}"),
                                      measurement_args(args, looser), retry=False), retried_with_s=looser)
        return rec

    return measure_steady(run, args.max_steal, args.steal_reruns)


def check_and_measure(server: Server, models: list[Model], pa, out_dir: Path, args, sessions: dict,
                      records: list[dict], errors: list[str]) -> None:
    usable = []
    for model in models:
        try:
            server.wait_model_ready(model.name, timeout_s=120)
            check_outputs(server, model, sessions[model.name], args.protocols)
            usable.append(model)
            if server.name == "shmserve":
                got, want = backend_options(model_config(server, model.name)), args.inprocess_options
                records.append(dict(kind="options", model=model.name, backend=got, inprocess=want,
                                    error=None if got == want else "differ"))
                if got != want:
                    errors.append(f"shmserve {model.name}: the backend's session options {got} are not "
                                  f"the in-process loop's {want}")
        except (ServerError, OSError) as e:
            errors.append(f"{e} -> {model.name} not measured on {server.name}")
    for model in usable:
        for protocol in args.protocols:
            for concurrency in model.concurrency:
                figures = measure_one(server, model, protocol, concurrency, pa, out_dir, args)
                rec = dict(kind="perf_analyzer", server=server.name, model=model.name, protocol=protocol,
                           concurrency=concurrency, **figures)
                records.append(rec)
                print(json.dumps(rec), file=sys.stderr, flush=True)
    if any(m.name == "tiny" for m in usable):
        if server.name == "shmserve":
            pid, what = shmserve_worker(server.pid, "tiny"), "shmserve worker"
        else:
            pid, what = triton_stub(server.pid, "tiny", server.model_repository), "Triton python-backend stub"
        if pid is None:
            errors.append(f"{server.name}: no process of model tiny found among the server's children")
        else:
            records.append(dict(kind="memory", server=server.name, model="tiny", process=what, pid=pid,
                                memory_kib=memory_kib(pid), error=None))
            print(json.dumps(records[-1]), file=sys.stderr, flush=True)


def measurement_args(args, stability: int) -> list[str]:
    return ["-p", str(args.window_ms), "--max-trials", str(args.max_trials), "-s", str(stability)]
