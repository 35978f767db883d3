"""`shmserve`: the command line, with tritonserver's flag names.

Flags of tritonserver that shmserve does not implement are refused with a clear message
rather than ignored.
"""

import argparse
import asyncio
import logging
import re
import sys
from typing import Any, Callable, Coroutine

from jinja2 import TemplateError

from shmserve.config.backend import DEFAULT_BACKEND_DIRECTORY, parse_backend_config
from shmserve.dataplane import MAX_MESSAGE_SIZE
from shmserve.dispatch.pool import DEFAULT_PIPELINE_BELOW_US
from shmserve.dispatch.rate_limiter import parse_resource
from shmserve.errors import ServerError
from shmserve.extensions import restricted_api
from shmserve.extensions.response_cache import parse_cache_config
from shmserve.grpc import tls
from shmserve.host.server import Options, Server, StartupError
from shmserve.ipc.idle_spin import DEFAULT_SPIN_US
from shmserve.ipc.malloc import keep_large_blocks, trim_periodically
from shmserve.ipc.priority import set_front_nice
from shmserve.observability import logs
from shmserve.observability.summaries import DEFAULT_QUANTILES, parse_quantiles
from shmserve.observability.tracing import settings_from_flags
from shmserve.openai import chat_templates
from shmserve.openai import restrictions as openai_restricted_api

# tritonserver flags that exist but that shmserve does not implement (yet).
UNSUPPORTED_FLAGS = (
    "allow-sagemaker", "sagemaker-port",
    "sagemaker-safe-port-range", "allow-vertex-ai", "vertex-ai-port", "model-namespacing",
)
# Tuning flags of parts of Triton that shmserve does not have (its C++ thread pools, memory
# and response pools, the Python backend's stub and shared-memory sizing, repository agents,
# NUMA host policies, GPU peer access and limits, port reuse, a bound on its own pings):
# accepted, so that a Triton command line works unchanged, and the log says they have no
# effect. None changes what a well-behaved client's request gets.
NO_EFFECT_FLAGS = ("http-thread-count", "grpc-infer-thread-count", "model-load-thread-count",
                   "pinned-memory-pool-byte-size",
                   "cuda-memory-pool-byte-size", "buffer-manager-thread-count", "host-policy",
                   "min-supported-compute-capability", "grpc-infer-allocation-pool-size",
                   "grpc-max-response-pool-size", "repoagent-directory", "cache-directory",
                   "model-load-gpu-limit", "enable-peer-access", "reuse-http-port",
                   "reuse-grpc-port",
                   # The PINGs shmserve sends without data: only keepalive's, while calls
                   # are open (or with --grpc-keepalive-permit-without-calls).
                   "grpc-http2-max-pings-without-data")


def _bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("true", "1", "on", "yes"):
        return True
    if value in ("false", "0", "off", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got '{text}'")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got '{text}'")
    return value


def _pattern(text: str) -> str:
    try:
        re.compile(text)
    except re.error as exc:
        raise argparse.ArgumentTypeError(f"not a regular expression: {exc}") from None
    return text


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got '{text}'")
    return value


def _nice(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or not -20 <= value <= 19:
        raise argparse.ArgumentTypeError(f"expected a nice value from -20 to 19, got '{text}'")
    return value


def _message_size(text: str) -> int:
    value = _positive_int(text)
    if value > MAX_MESSAGE_SIZE:
        raise argparse.ArgumentTypeError(f"gRPC messages cannot exceed {MAX_MESSAGE_SIZE} "
                                         f"bytes, got '{text}'")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number of seconds >= 0, got '{text}'")
    return value


class _Unsupported(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(f"{option_string} is a tritonserver option that shmserve does not support yet")


def build_parser() -> argparse.ArgumentParser:
    defaults = Options()
    p = argparse.ArgumentParser(prog="shmserve", allow_abbrev=False,
                                description="Triton-compatible inference server for Python-backend models.")
    p.add_argument("--model-repository", "--model-store", action="append", required=True,
                   dest="model_repository", metavar="PATH")
    p.add_argument("--model-control-mode", choices=("none", "poll", "explicit"), default="none")
    p.add_argument("--load-model", action="append", default=[], metavar="NAME")
    p.add_argument("--repository-poll-secs", type=_positive_int, default=15, metavar="SECONDS")
    p.add_argument("--model-config-name", default=None)
    p.add_argument("--id", default="shmserve", dest="server_id")
    p.add_argument("--strict-readiness", type=_bool, default=True, metavar="BOOL")
    p.add_argument("--model-load-retry-count", type=_non_negative_int, default=0, metavar="N",
                   help="try a model version that failed to load this many more times")
    p.add_argument("--exit-on-error", type=_bool, default=True, metavar="BOOL",
                   help="exit when a model fails to load at startup (default true, as "
                        "Triton); false serves the models that did load")
    p.add_argument("--exit-timeout-secs", type=int, default=30)
    # shmserve's own (Triton has no such flag).
    p.add_argument("--model-instance-timeout-secs", type=_seconds, default=0.0, metavar="SECONDS",
                   help="a model instance that holds requests and sends nothing back for this "
                        "long is killed, its requests fail, and it is restarted; 0 (the "
                        "default) never does")
    p.add_argument("--allow-http", type=_bool, default=True, metavar="BOOL")
    p.add_argument("--http-address", default="0.0.0.0")
    p.add_argument("--http-port", type=int, default=8000)
    p.add_argument("--http-max-input-size", type=_positive_int, default=64 * 1024 * 1024,
                   metavar="BYTES", help="largest HTTP request body, also once decompressed "
                                         "(default 64 MiB, as Triton)")
    p.add_argument("--allow-grpc", type=_bool, default=True, metavar="BOOL")
    p.add_argument("--grpc-address", default="0.0.0.0")
    p.add_argument("--grpc-port", type=int, default=8001)
    p.add_argument("--grpc-max-message-size", type=_message_size, default=MAX_MESSAGE_SIZE,
                   metavar="BYTES", help="largest gRPC message received or sent (default and "
                                         f"maximum {MAX_MESSAGE_SIZE}, as Triton)")
    # shmserve's own limits (Triton has no such flags); see docs/limits.md.
    p.add_argument("--max-tensor-byte-size", type=_positive_int,
                   default=defaults.max_tensor_byte_size, metavar="BYTES",
                   help="shmserve's own: largest input tensor of a request, from its shape and "
                        "datatype, refused before it is copied (default 2 GiB)")
    p.add_argument("--max-inflight-per-connection", type=_positive_int,
                   default=defaults.max_inflight_per_connection, metavar="N",
                   help="shmserve's own: requests one HTTP connection (pipelined) or one gRPC "
                        "stream may have in flight; more are answered UNAVAILABLE (default "
                        f"{defaults.max_inflight_per_connection})")
    p.add_argument("--max-open-streams", type=_positive_int,
                   default=defaults.max_open_streams, metavar="N",
                   help="shmserve's own: gRPC streams and HTTP generate_stream responses open "
                        f"at once; more are refused UNAVAILABLE (default "
                        f"{defaults.max_open_streams})")
    p.add_argument("--max-open-streams-per-connection", type=_positive_int,
                   default=defaults.max_open_streams_per_connection, metavar="N",
                   help="shmserve's own: gRPC streaming calls one connection may have open; "
                        f"more are refused UNAVAILABLE (default "
                        f"{defaults.max_open_streams_per_connection})")
    p.add_argument("--max-queue-size-default", type=_non_negative_int,
                   default=defaults.max_queue_size_default, metavar="N",
                   help="shmserve's own: queued requests per model whose config sets no "
                        "max_queue_size; more are refused UNAVAILABLE 'Exceeds maximum queue "
                        f"size'; 0 is unbounded, as Triton (default "
                        f"{defaults.max_queue_size_default})")
    p.add_argument("--metrics-config", action="append", default=[], metavar="KEY=VALUE",
                   help="counter_latencies=<bool> (default true), histogram_latencies=<bool> "
                        "(default false)")
    p.add_argument("--allow-metrics", type=_bool, default=True, metavar="BOOL")
    p.add_argument("--metrics-address", default="0.0.0.0")
    p.add_argument("--metrics-port", type=int, default=8002)
    p.add_argument("--allow-gpu-metrics", type=_bool, default=True, metavar="BOOL")
    p.add_argument("--allow-cpu-metrics", type=_bool, default=True, metavar="BOOL")
    p.add_argument("--metrics-interval-ms", type=int, default=2000)
    for protocol in ("http", "grpc"):
        p.add_argument(f"--{protocol}-header-forward-pattern", type=_pattern, default="",
                       metavar="REGEX", help=f"{protocol.upper()} request headers whose names "
                       "match are passed to the model as request parameters")
    p.add_argument("--grpc-keepalive-time", type=_non_negative_int,
                   default=defaults.grpc_keepalive_time_ms, metavar="MS",
                   help="a PING to each client this often while it has calls open (0: never)")
    p.add_argument("--grpc-keepalive-timeout", type=_positive_int,
                   default=defaults.grpc_keepalive_timeout_ms, metavar="MS",
                   help="close a connection whose client leaves a PING unanswered this long")
    p.add_argument("--grpc-keepalive-permit-without-calls", type=_bool, default=False,
                   metavar="BOOL", help="send the PINGs also while a connection has no call")
    p.add_argument("--grpc-max-connection-age", type=_non_negative_int, default=0,
                   metavar="MS", help="send GOAWAY to a connection this old, so that its "
                                      "client reconnects (0, the default: never)")
    p.add_argument("--grpc-max-connection-age-grace", type=_non_negative_int, default=0,
                   metavar="MS", help="then close it this much later if calls are still "
                                      "open (0: once they end)")
    p.add_argument("--grpc-http2-min-recv-ping-interval-without-data", type=_non_negative_int,
                   default=defaults.grpc_http2_min_recv_ping_interval_without_data_ms,
                   metavar="MS", help="a client's PING sooner than this after its last one, "
                   "with no data sent in between, is a strike (default 300000, as Triton)")
    p.add_argument("--grpc-http2-max-ping-strikes", type=_non_negative_int,
                   default=defaults.grpc_http2_max_ping_strikes, metavar="N",
                   help="strikes a client may have before GOAWAY 'too_many_pings' closes its "
                        "connection; 0: no limit (default 2, as Triton)")
    p.add_argument("--grpc-max-connections", type=_non_negative_int,
                   default=defaults.grpc_max_connections, metavar="N",
                   help="shmserve's own: gRPC connections open at once; one more gets GOAWAY "
                        f"and is closed; 0: no limit (default {defaults.grpc_max_connections})")
    p.add_argument("--grpc-max-connection-idle", type=_non_negative_int,
                   default=defaults.grpc_max_connection_idle_ms, metavar="MS",
                   help="shmserve's own: GOAWAY to a gRPC connection that has had no call "
                        "open this long (its client reconnects when it next calls); 0: never "
                        f"(default {defaults.grpc_max_connection_idle_ms})")
    p.add_argument("--grpc-max-decompressed-size", type=_positive_int,
                   default=defaults.grpc_max_decompressed_size, metavar="BYTES",
                   help="shmserve's own: the most a compressed gRPC request message may "
                        "inflate to; more is refused RESOURCE_EXHAUSTED (default 64 MiB, as "
                        "--http-max-input-size)")
    p.add_argument("--grpc-infer-response-compression-level",
                   choices=("none", "low", "medium", "high"), default="none",
                   help="compress what the gRPC endpoint sends with an algorithm the client "
                        "accepts, as gRPC servers choose it: low gzip, medium and high "
                        "deflate when both are accepted (default none)")
    p.add_argument("--rate-limit", choices=("off", "execution_count"), default="off",
                   help="execution_count: instances whose instance_group lists rate_limiter "
                        "resources run only while those resources are free")
    p.add_argument("--rate-limit-resource", action="append", default=[],
                   metavar="<name>:<count>[:<device>]",
                   help="copies of a rate limiter resource (default: the most any instance "
                        "asks for)")
    p.add_argument("--worker-spin-us", type=_non_negative_int, default=DEFAULT_SPIN_US,
                   metavar="US", help="how long a worker polls for its next batch before it "
                                      "sleeps, while the machine has 3/4 of a core idle "
                                      f"(default {DEFAULT_SPIN_US}; 0: never)")
    p.add_argument("--front-spin-us", type=_non_negative_int, default=DEFAULT_SPIN_US,
                   metavar="US", help="how long the server polls after it sent a batch and "
                                      "after one ended before it sleeps, while the machine "
                                      "has 3/4 of a core idle "
                                      f"(default {DEFAULT_SPIN_US}; 0: never)")
    p.add_argument("--front-nice", type=_nice, metavar="N",
                   help="shmserve's own: the scheduling priority (nice, -20 to 19) of the event-"
                        "loop thread every request passes through, as nginx's worker_priority; "
                        "model workers keep the server's. Below the starting value it needs "
                        "CAP_SYS_NICE (default: left as started)")
    p.add_argument("--worker-answers", type=_bool, default=True, metavar="BOOL",
                   help="shmserve's own: a model's worker writes an HTTP or gRPC infer "
                        "answer to the client itself when the connection's previous request "
                        "was the same but for its tensors' bytes, and the outputs are binary "
                        "and small; the server's event loop then only keeps its accounts "
                        "(default true)")
    p.add_argument("--pipeline-below-us", type=_non_negative_int,
                   default=DEFAULT_PIPELINE_BELOW_US, metavar="US",
                   help="an instance whose batches take less than this is sent its next "
                        "batch while it runs one, so that it never waits for the server; "
                        "one with longer batches gets the next when it is free, as in Triton, "
                        f"so that more requests join it (default {DEFAULT_PIPELINE_BELOW_US}; "
                        "0: never; a model whose queue has a policy never pipelines)")
    p.add_argument("--grpc-use-ssl", type=_bool, default=False, metavar="BOOL",
                   help="serve gRPC over TLS (with --grpc-server-cert and --grpc-server-key)")
    p.add_argument("--grpc-use-ssl-mutual", type=_bool, default=False, metavar="BOOL",
                   help="TLS that also asks clients for a certificate signed by "
                        "--grpc-root-cert")
    for flag in ("--grpc-server-cert", "--grpc-server-key", "--grpc-root-cert"):
        p.add_argument(flag, default=None, metavar="PEM_FILE")
    for flag in ("--http-restricted-api", "--grpc-restricted-protocol"):
        p.add_argument(flag, action="append", default=[],
                       metavar="<category>[,<category>...]:<header>=<value>",
                       help="answer these API categories only to requests carrying the header "
                            f"(categories: {', '.join(restricted_api.CATEGORIES)})")
    p.add_argument("--openai-port", type=_non_negative_int, default=0, metavar="PORT",
                   help="serve the OpenAI-compatible routes on this port too (on --http-address;"
                        " they are always served on the HTTP port; 0: not; Triton's OpenAI "
                        "frontend listens on 9000)")
    p.add_argument("--tokenizer", default=None, metavar="DIR",
                   help="a Hugging Face tokenizer folder whose chat template renders "
                        "/v1/chat/completions' messages (a model's own <model>/tokenizer/ "
                        "folder comes first)")
    p.add_argument("--chat-template", default=None, metavar="FILE",
                   help="a Jinja chat template replacing the tokenizer's")
    p.add_argument("--default-max-tokens", type=_non_negative_int, default=16, metavar="N",
                   help="max_tokens sent to a model when an OpenAI request gives none "
                        "(default 16, as Triton's frontend)")
    p.add_argument("--openai-restricted-api", nargs=3, action="append", default=[],
                   metavar=("APIS", "HEADER", "VALUE"),
                   help="answer these OpenAI API groups (comma-separated: inference, "
                        "model-repository, metrics, health) only to requests whose HEADER is "
                        "VALUE; others get 401")
    p.add_argument("--cache-config", action="append", default=[], metavar="local,size=BYTES",
                   help="the response cache, for models whose config enables it: only the "
                        "'local' cache (size in bytes)")
    p.add_argument("--response-cache-byte-size", type=_non_negative_int, default=None,
                   metavar="BYTES", help="Triton's older spelling of --cache-config local,size=")
    p.add_argument("--trace-config", action="append", default=[],
                   metavar="[triton,]<setting>=<value>",
                   help="tracing: level=OFF|TIMESTAMPS|TENSORS, rate=N, count=N, mode=triton, "
                        "triton,file=PATH, triton,log-frequency=N")
    # Tracing's older spellings (Triton marks them deprecated).
    p.add_argument("--trace-file", default=None, metavar="PATH", help=argparse.SUPPRESS)
    p.add_argument("--trace-level", action="append", default=[], metavar="LEVEL",
                   help=argparse.SUPPRESS)
    for flag in ("--trace-rate", "--trace-count", "--trace-log-frequency"):
        p.add_argument(flag, default=None, metavar="N", help=argparse.SUPPRESS)
    p.add_argument("--allow-client-shm", type=_bool, default=False, metavar="BOOL",
                   help="let clients register system and CUDA shared-memory regions (default "
                        "false, as Triton since 2.68)")
    p.add_argument("--disable-auto-complete-config", action="store_true")
    p.add_argument("--backend-config", action="append", default=[],
                   metavar="[BACKEND,]SETTING=VALUE",
                   help="a backend's setting, or every backend's without BACKEND (as Triton: "
                        "onnxruntime,default-max-batch-size=8)")
    p.add_argument("--backend-directory", default=DEFAULT_BACKEND_DIRECTORY, metavar="DIR",
                   help="where Python-based backends live: a model with backend NAME that "
                        "shmserve does not run itself (or with runtime \"model.py\") runs "
                        "DIR/NAME/model.py")
    p.add_argument("--strict-model-config", type=_bool, default=None, metavar="BOOL",
                   help="deprecated Triton spelling: true means --disable-auto-complete-config")
    p.add_argument("--log-verbose", type=int, default=0)
    p.add_argument("--log-info", type=_bool, default=True, metavar="BOOL")
    p.add_argument("--log-warning", type=_bool, default=True, metavar="BOOL")
    p.add_argument("--log-error", type=_bool, default=True, metavar="BOOL")
    p.add_argument("--log-format", choices=logs.FORMATS, default="default",
                   help="default or ISO8601 (Triton's line formats), or json: one JSON object "
                        "a line (shmserve's addition)")
    p.add_argument("--log-file", default="", metavar="PATH",
                   help="append the log to this file rather than write it to stderr")
    for flag in NO_EFFECT_FLAGS:
        p.add_argument(f"--{flag}", dest=flag.replace("-", "_"), action="append",
                       default=None)  # some, like --backend-config, are given several times
    for flag in UNSUPPORTED_FLAGS:
        p.add_argument(f"--{flag}", action=_Unsupported, nargs="?", help=argparse.SUPPRESS)
    return p


def _metrics_config(settings: list) -> dict:
    """{counter_latencies, histogram_latencies, summary_latencies, summary_quantiles} from
    --metrics-config's key=value settings."""
    metrics = {"counter_latencies": True, "histogram_latencies": False,
               "summary_latencies": False, "summary_quantiles": DEFAULT_QUANTILES}
    for setting in settings:
        key, _, value = setting.partition("=")
        if key == "summary_quantiles":
            try:
                metrics[key] = parse_quantiles(value)
            except ValueError as exc:
                raise argparse.ArgumentTypeError(f"{key}: {exc}") from None
            continue
        if key not in metrics:
            raise argparse.ArgumentTypeError(f"unknown setting '{key}' (one of "
                                             f"{', '.join(metrics)})")
        try:
            metrics[key] = _bool(value)
        except argparse.ArgumentTypeError as exc:
            raise argparse.ArgumentTypeError(f"{key}: {exc}") from None
    return metrics


def parse_options(argv) -> tuple[Options, argparse.Namespace]:
    args = build_parser().parse_args(argv)
    if "*" in args.load_model and len(args.load_model) > 1:
        build_parser().error("--load-model=* must be the only --load-model")
    try:
        cache_size = parse_cache_config(args.cache_config)
    except ServerError as exc:
        build_parser().error(exc.message)
    try:
        http_restrictions = restricted_api.parse_restrictions(args.http_restricted_api)
        grpc_restrictions = restricted_api.parse_restrictions(args.grpc_restricted_protocol)
    except restricted_api.RestrictionError as exc:
        build_parser().error(str(exc))
    try:
        openai_restrictions = openai_restricted_api.parse(args.openai_restricted_api)
    except ValueError as exc:
        build_parser().error(f"--openai-restricted-api: {exc}")
    try:  # read now so that a bad folder or file stops the server before it starts
        chat_templates.load(args.tokenizer or "", args.chat_template)
    except (OSError, ValueError, TemplateError) as exc:
        build_parser().error(f"--tokenizer/--chat-template: {exc}")
    try:
        metrics = _metrics_config(args.metrics_config)
    except argparse.ArgumentTypeError as exc:
        build_parser().error(f"--metrics-config {exc}")
    try:
        grpc_tls = tls.settings_from_flags(args.grpc_use_ssl, args.grpc_use_ssl_mutual,
                                           args.grpc_server_cert, args.grpc_server_key,
                                           args.grpc_root_cert)
        if grpc_tls is not None:
            tls.server_context(grpc_tls)  # unreadable files are refused before anything starts
    except tls.TlsConfigError as exc:
        build_parser().error(str(exc))
    try:
        rate_limit_resources = tuple(parse_resource(r) for r in args.rate_limit_resource)
    except ValueError as exc:
        build_parser().error(f"--rate-limit-resource: {exc}")
    try:
        trace = settings_from_flags(args.trace_config, file=args.trace_file,
                                    levels=args.trace_level, rate=args.trace_rate,
                                    count=args.trace_count,
                                    log_frequency=args.trace_log_frequency)
    except ServerError as exc:
        build_parser().error(exc.message)
    try:
        backend_config = parse_backend_config(args.backend_config)
    except ValueError as exc:
        build_parser().error(str(exc))
    if args.response_cache_byte_size is not None and not args.cache_config:
        cache_size = args.response_cache_byte_size
    options = Options(
        model_repository=args.model_repository,
        model_control_mode=args.model_control_mode,
        load_model=args.load_model,
        repository_poll_secs=args.repository_poll_secs,
        model_config_name=args.model_config_name,
        disable_auto_complete=args.disable_auto_complete_config or bool(args.strict_model_config),
        backend_config=backend_config,
        backend_directory=args.backend_directory,
        server_id=args.server_id,
        strict_readiness=args.strict_readiness,
        exit_on_error=args.exit_on_error,
        model_load_retry_count=args.model_load_retry_count,
        http_header_forward_pattern=args.http_header_forward_pattern,
        grpc_header_forward_pattern=args.grpc_header_forward_pattern,
        http_restrictions=http_restrictions,
        grpc_restrictions=grpc_restrictions,
        openai_port=args.openai_port,
        openai_tokenizer=args.tokenizer,
        openai_chat_template=args.chat_template,
        openai_default_max_tokens=args.default_max_tokens,
        openai_restrictions=openai_restrictions,
        grpc_keepalive_time_ms=args.grpc_keepalive_time,
        grpc_keepalive_timeout_ms=args.grpc_keepalive_timeout,
        grpc_keepalive_permit_without_calls=args.grpc_keepalive_permit_without_calls,
        grpc_infer_response_compression_level=args.grpc_infer_response_compression_level,
        grpc_max_connection_age_ms=args.grpc_max_connection_age,
        grpc_max_connection_age_grace_ms=args.grpc_max_connection_age_grace,
        grpc_http2_min_recv_ping_interval_without_data_ms=(
            args.grpc_http2_min_recv_ping_interval_without_data),
        grpc_http2_max_ping_strikes=args.grpc_http2_max_ping_strikes,
        grpc_max_connections=args.grpc_max_connections,
        grpc_max_connection_idle_ms=args.grpc_max_connection_idle,
        grpc_max_decompressed_size=args.grpc_max_decompressed_size,
        max_open_streams_per_connection=args.max_open_streams_per_connection,
        grpc_tls=grpc_tls,
        rate_limit=args.rate_limit == "execution_count",
        rate_limit_resources=rate_limit_resources,
        worker_spin_us=args.worker_spin_us,
        front_spin_us=args.front_spin_us,
        pipeline_below_us=args.pipeline_below_us,
        worker_answers=args.worker_answers,
        exit_timeout_secs=args.exit_timeout_secs,
        model_instance_timeout_secs=args.model_instance_timeout_secs,
        allow_http=args.allow_http,
        http_address=args.http_address,
        http_port=args.http_port,
        http_max_input_size=args.http_max_input_size,
        allow_grpc=args.allow_grpc,
        grpc_address=args.grpc_address,
        grpc_port=args.grpc_port,
        allow_metrics=args.allow_metrics,
        metrics_address=args.metrics_address,
        metrics_port=args.metrics_port,
        allow_gpu_metrics=args.allow_gpu_metrics,
        allow_cpu_metrics=args.allow_cpu_metrics,
        metrics_interval_ms=args.metrics_interval_ms,
        metrics_counter_latencies=metrics["counter_latencies"],
        metrics_histogram_latencies=metrics["histogram_latencies"],
        metrics_summary_quantiles=(metrics["summary_quantiles"]
                                   if metrics["summary_latencies"] else ()),
        allow_client_shm=args.allow_client_shm,
        cache_size=cache_size,
        trace=trace,
        grpc_max_message_size=args.grpc_max_message_size,
        max_tensor_byte_size=args.max_tensor_byte_size,
        max_inflight_per_connection=args.max_inflight_per_connection,
        max_open_streams=args.max_open_streams,
        max_queue_size_default=args.max_queue_size_default,
    )
    return options, args


def log_settings(args: argparse.Namespace) -> logs.LogSettings:
    return logs.LogSettings(log_file=args.log_file, log_info=args.log_info,
                            log_warning=args.log_warning, log_error=args.log_error,
                            log_verbose_level=max(0, args.log_verbose),  # as Triton clamps it
                            log_format=args.log_format)


def main(argv=None) -> int:
    options, args = parse_options(sys.argv[1:] if argv is None else argv)
    try:
        logs.configure(log_settings(args))
    except OSError as exc:
        print(f"shmserve: cannot open --log-file: {exc}", file=sys.stderr)
        return 1
    keep_large_blocks()
    trim_periodically()
    for flag in NO_EFFECT_FLAGS:
        if getattr(args, flag.replace("-", "_")) is not None:
            logging.getLogger("shmserve").info("--%s has no effect in shmserve", flag)
    runner: Callable[[Coroutine[Any, Any, None]], None]
    try:
        import uvloop
        runner = uvloop.run
    except ImportError:  # uvloop is a dependency; this keeps odd platforms working
        runner = asyncio.run
    if args.front_nice is not None:
        set_front_nice(args.front_nice)  # before the loop starts: its thread is this one
    try:
        runner(Server(options).serve_forever())
    except (OSError, StartupError) as exc:
        logging.getLogger("shmserve").error("failed to start: %s", exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
