"""Long fuzzing of the decoders of client input, with a time budget.

The properties of tests/unit/fuzz/ (a correct result or a ServerError with a client-facing
code; memory in proportion to the input), of the gRPC layer in
tests/unit/grpc/test_grpc_transport_calls.py (every call on an HTTP/2 connection ends with a
gRPC status, whatever its framing, headers and the bytes after it), of HTTP/2's server side in
tests/unit/grpc/test_http2_streams.py and test_http2_hostile_input.py (any frames either parse
or end the connection with GOAWAY) and of tests/unit/http/test_http1_fast_path.py (any bytes on
an HTTP/1.1 connection get answers, a refusal or a wait, never an exception), run with many
more examples by hypothesis, and with --atheris also coverage-guided (libFuzzer through
atheris) on the decoders that take bytes or text: the HTTP infer body, the gRPC
ModelInferRequest, config.pbtxt, JSON configs and generate bodies.

    .venv/bin/python perf/fuzz_decoders.py --seconds 180             # hypothesis only
    .venv/bin/python perf/fuzz_decoders.py --seconds 180 --atheris   # half each

Prints the inputs each decoder was given and every failure (with its input); exits 1 if any.
"""

import argparse
import inspect
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

# Examples per hypothesis run; runs repeat, with new random inputs, until the budget is spent.
CHUNK = 400
ATHERIS_TARGETS = ("http", "grpc", "config", "config_json", "generate")


def run_hypothesis(seconds: float) -> list[str]:
    os.environ["SHMSERVE_FUZZ_EXAMPLES"] = str(CHUNK)
    from tests.unit.fuzz import fuzz_helpers as props
    from tests.unit.fuzz import (test_fuzz_configs, test_fuzz_extensions,
                                 test_fuzz_infer_requests, test_fuzz_size_claims)
    from tests.unit.grpc import test_grpc_transport_calls as transport_props
    from tests.unit.grpc import test_http2_hostile_input, test_http2_streams
    from tests.unit.http import test_http1_fast_path as http1_props

    fuzz_props = (test_fuzz_infer_requests, test_fuzz_configs, test_fuzz_extensions,
                  test_fuzz_size_claims)
    http2_props = (test_http2_streams, test_http2_hostile_input)
    tests = [(name, fn) for module in (*fuzz_props, transport_props, *http2_props, http1_props)
             for name, fn in vars(module).items()
             if name.startswith("test_") and hasattr(fn, "hypothesis")]
    failures = []
    per_test = seconds / len(tests)
    with props.client_region() as regions:
        for name, fn in tests:
            wants_regions = "regions" in inspect.signature(fn.hypothesis.inner_test).parameters
            kwargs = {"regions": regions} if wants_regions else {}
            deadline = time.monotonic() + per_test
            runs = 0
            while time.monotonic() < deadline:
                runs += 1
                try:
                    fn(**kwargs)
                except Exception as exc:  # a failing property: report it, go on with the next
                    failures.append(f"{name}: {type(exc).__name__}: {exc}")
                    break
            print(f"  {name}: {runs} run(s) of up to {CHUNK} examples", flush=True)
    print("hypothesis: inputs per decoder (refused as client errors):")
    for label in sorted(props.TRIED):
        print(f"  {label:16} {props.TRIED[label]:9} ({props.REFUSED.get(label, 0)} refused)")
    return failures


# ---------------------------------------------------------------- atheris


def seed_corpus(target: str, folder: str) -> None:
    """Valid inputs to start from: libFuzzer mutates them into the interesting invalid ones."""
    import numpy as np
    import orjson
    import tritonclient.http as httpclient
    from tritonclient.grpc import _utils as grpc_utils
    import tritonclient.grpc as grpcclient

    from tests.unit.fuzz import test_fuzz_configs as configs

    seeds = []
    if target == "http":
        for binary in (False, True):
            inputs = [httpclient.InferInput("INPUT0", [1, 3], "FP32"),
                      httpclient.InferInput("INPUT1", [1, 2], "BYTES")]
            inputs[0].set_data_from_numpy(np.ones((1, 3), np.float32), binary_data=binary)
            inputs[1].set_data_from_numpy(np.array([[b"ab", b"c"]], object), binary_data=binary)
            body, header = httpclient.InferenceServerClient.generate_request_body(
                inputs, outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)],
                request_id="1", parameters={"p": 1})
            # First byte: how the header length is given (see http_target).
            seeds.append(bytes([header is not None]) + body)
    elif target == "grpc":
        inputs = [grpcclient.InferInput("INPUT0", [1, 3], "FP32")]
        inputs[0].set_data_from_numpy(np.ones((1, 3), np.float32))
        request = grpc_utils._get_inference_request(
            "batching", inputs, "", "1", None, 0, False, False, 0, None, {"p": 1})
        seeds.append(request.SerializeToString())
    elif target == "config":
        seeds.extend(text.encode() for text in configs.REPOSITORY_CONFIGS)
    elif target == "config_json":
        seeds.extend(text.encode() for text in configs._repository_json_configs())
    else:
        seeds.extend(orjson.dumps(doc) for doc in (
            {"INPUT0": [1.5, 2], "INPUT1": ["a", "b"], "parameters": {"p": 1}},
            {"INPUT0": [True, False, True], "INPUT1": [1, 2], "id": "x"}))
    for i, seed in enumerate(seeds):
        with open(os.path.join(folder, f"seed{i}"), "wb") as f:
            f.write(seed)


def atheris_target(target: str, libfuzzer_args: list[str]) -> None:
    """Runs in its own process: libFuzzer ends it."""
    import atheris

    with atheris.instrument_imports(include=["shmserve"]):
        from shmserve.http import generate
        from tests.unit.fuzz import fuzz_helpers as props

    # The client object goes at once: the manager keeps what it checked at registration, and
    # libFuzzer may end this process without running any cleanup.
    with props.client_region() as regions:
        pass
    models = sorted(props.MODELS)

    def http_target(data: bytes) -> None:
        if not data:
            return
        provider = atheris.FuzzedDataProvider(data[1:])
        header = None
        if data[0] & 1:
            header = provider.ConsumeIntInRange(-2, len(data))
        model = models[data[0] >> 1 & 1]
        props.http_property(provider.ConsumeBytes(len(data)), header, regions, model)

    def grpc_target(data: bytes) -> None:
        props.grpc_property(data, regions, models[len(data) & 1])

    def config_target(data: bytes) -> None:
        props.config_property(data.decode("utf-8", "replace"))

    def config_json_target(data: bytes) -> None:
        config = props.outcome("config_json", props.parse_config_json,
                               data.decode("utf-8", "replace"))
        if config is not None:
            props.outcome("config_normalize", props.normalize_config, config, config.name or "m", 0)

    def generate_target(data: bytes) -> None:
        model = props.MODELS[models[len(data) & 1]]
        request = props.outcome("generate", generate.decode_generate_request, data, "m", "",
                                model.signature)
        if request is not None:
            props.outcome(None, props.prepare, request, model, regions)

    fuzz = {"http": http_target, "grpc": grpc_target, "config": config_target,
            "config_json": config_json_target, "generate": generate_target}[target]
    atheris.Setup([sys.argv[0], *libfuzzer_args], fuzz)
    atheris.Fuzz()


def run_atheris(seconds: float) -> list[str]:
    failures = []
    per_target = max(int(seconds / len(ATHERIS_TARGETS)), 1)
    # Failing inputs stay here, one file each, for the failures to be replayed.
    crashes = tempfile.mkdtemp(prefix="fuzz_decoders_crashes_")
    print("atheris: executions per decoder:")
    for target in ATHERIS_TARGETS:
        corpus = tempfile.mkdtemp(prefix=f"fuzz_{target}_")
        try:
            seed_corpus(target, corpus)
            # -timeout: an input that takes 10 s is a hang; -rss_limit_mb: one that needs
            # 2 GB is an over-allocation.
            args = [f"-max_total_time={per_target}", "-timeout=10", "-rss_limit_mb=2048",
                    "-print_final_stats=1", f"-artifact_prefix={crashes}/{target}-", corpus]
            proc = subprocess.run(
                [sys.executable, __file__, "--atheris-target", target, "--", *args],
                capture_output=True, text=True, timeout=per_target + 120, cwd=ROOT)
            output = proc.stdout + proc.stderr
            runs = re.search(r"stat::number_of_executed_units:\s*(\d+)", output)
            print(f"  {target:16} {runs.group(1) if runs else '?':>9}", flush=True)
            if proc.returncode != 0:
                # From libFuzzer's report: the Python traceback, else its last lines.
                start = output.find("=== Uncaught Python exception")
                report = output[start:start + 4000] if start >= 0 else output[-4000:]
                failures.append(f"atheris {target} (exit {proc.returncode}, input in "
                                f"{crashes}):\n{report}")
        finally:
            shutil.rmtree(corpus, ignore_errors=True)
    if not os.listdir(crashes):
        os.rmdir(crashes)
    return failures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=180, help="time budget in all")
    parser.add_argument("--atheris", action="store_true",
                        help="spend half the budget on coverage-guided fuzzing")
    parser.add_argument("--atheris-target", choices=ATHERIS_TARGETS, help=argparse.SUPPRESS)
    args, libfuzzer_args = parser.parse_known_args()
    if args.atheris_target:
        atheris_target(args.atheris_target, [a for a in libfuzzer_args if a != "--"])
        return 0
    started = time.monotonic()
    hypothesis_seconds = args.seconds / 2 if args.atheris else args.seconds
    failures = run_hypothesis(hypothesis_seconds)
    if args.atheris:
        failures += run_atheris(args.seconds - (time.monotonic() - started))
    print(f"failures: {len(failures)} in {time.monotonic() - started:.0f} s")
    for failure in failures:
        print("---\n" + failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
