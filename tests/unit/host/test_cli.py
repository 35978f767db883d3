"""Command line: tritonserver's flag names, clear refusals, no silent ignoring."""

import pytest

from shmserve.host.cli import parse_options
from shmserve.observability.summaries import DEFAULT_QUANTILES
from shmserve.observability.tracing import TraceSettings


def test_triton_flags_in_both_spellings():
    opts, _ = parse_options(["--model-repository=/r", "--http-port", "9000", "--grpc-port=9001",
                             "--metrics-port=9002", "--http-address=127.0.0.1",
                             "--strict-readiness=false", "--exit-timeout-secs=5",
                             "--model-control-mode=explicit", "--load-model=a",
                             "--load-model", "b", "--id=x", "--allow-metrics=0"])
    assert opts.model_repository == ["/r"]
    assert (opts.http_port, opts.grpc_port, opts.metrics_port) == (9000, 9001, 9002)
    assert opts.http_address == "127.0.0.1" and opts.grpc_address == "0.0.0.0"
    assert opts.strict_readiness is False and opts.exit_timeout_secs == 5
    assert opts.model_control_mode == "explicit" and opts.load_model == ["a", "b"]
    assert opts.server_id == "x" and opts.allow_metrics is False


def test_defaults_match_tritonserver():
    opts, _ = parse_options(["--model-store=/r"])
    assert (opts.http_port, opts.grpc_port, opts.metrics_port) == (8000, 8001, 8002)
    assert opts.strict_readiness and opts.exit_timeout_secs == 30
    assert opts.http_max_input_size == 64 * 1024 * 1024


@pytest.mark.parametrize("argv,fragment", [
    (["--model-repository=/r", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    (["--model-repository=/r", "--trace-config=level=TIMESTAMPS"], "file name is not given"),
    (["--model-repository=/r", "--trace-config=mode=zipkin"], "unknown trace mode"),
    (["--model-repository=/r", "--allow-sagemaker=true"], "does not support yet"),
    (["--model-repository=/r", "--rate-limit=sometimes"], "invalid choice"),
    (["--model-repository=/r", "--rate-limit-resource=R"], "<name>:<count>"),
    (["--model-repository=/r", "--cache-config=redis,host=x"], "only 'local'"),
    (["--model-repository=/r", "--strict-readiness=maybe"], "expected true or false"),
    (["--model-repository=/r", "--http-header-forward-pattern=("], "not a regular expression"),
    (["--model-repository=/r", "--metrics-config=summary_quantiles=0.5"], "<quantile>:<error>"),
    (["--model-repository=/r", "--metrics-config=colour=blue"], "unknown setting"),
    (["--model-repository=/r", "--metrics-config=histogram_latencies=maybe"],
     "expected true or false"),
    (["--model-repository=/r", "--load-model=*", "--load-model=a"], "must be the only"),
    ([], "--model-repository"),
])
def test_refusals_are_clear(argv, fragment, capsys):
    with pytest.raises(SystemExit) as e:
        parse_options(argv)
    assert e.value.code == 2
    assert fragment in capsys.readouterr().err


def test_trace_flags():
    assert parse_options(["--model-repository=/r"])[0].trace == TraceSettings()
    opts, _ = parse_options(["--model-repository=/r", "--trace-config=triton,file=/t.json",
                             "--trace-config=level=TIMESTAMPS", "--trace-config=rate=1",
                             "--trace-config=count=10", "--trace-config=triton,log-frequency=5"])
    assert opts.trace == TraceSettings(level=("TIMESTAMPS",), rate=1, count=10,
                                       log_frequency=5, file="/t.json")
    opts, _ = parse_options(["--model-repository=/r", "--trace-file=/t.json",
                             "--trace-level=TIMESTAMPS", "--trace-level=TENSORS",
                             "--trace-rate=2", "--trace-count=3", "--trace-log-frequency=4"])
    assert opts.trace == TraceSettings(level=("TIMESTAMPS", "TENSORS"), rate=2, count=3,
                                       log_frequency=4, file="/t.json")


def test_auto_complete_switches():
    assert parse_options(["--model-repository=/r", "--disable-auto-complete-config"])[0].disable_auto_complete
    assert parse_options(["--model-repository=/r", "--strict-model-config=true"])[0].disable_auto_complete
    assert not parse_options(["--model-repository=/r"])[0].disable_auto_complete


def test_metrics_flags():
    opts, _ = parse_options(["--model-repository=/r"])
    assert opts.allow_gpu_metrics and opts.allow_cpu_metrics and opts.metrics_interval_ms == 2000
    opts, _ = parse_options(["--model-repository=/r", "--allow-gpu-metrics=false",
                             "--allow-cpu-metrics", "0", "--metrics-interval-ms=500"])
    assert not opts.allow_gpu_metrics and not opts.allow_cpu_metrics
    assert opts.metrics_interval_ms == 500


def test_model_instance_timeout():
    assert parse_options(["--model-repository=/r"])[0].model_instance_timeout_secs == 0
    opts, _ = parse_options(["--model-repository=/r", "--model-instance-timeout-secs=2.5"])
    assert opts.model_instance_timeout_secs == 2.5


@pytest.mark.parametrize("value", ["-1", "soon", "nan", "inf"])
def test_model_instance_timeout_refuses_what_is_not_seconds(value, capsys):
    with pytest.raises(SystemExit):
        parse_options(["--model-repository=/r", f"--model-instance-timeout-secs={value}"])
    assert "expected a number of seconds >= 0" in capsys.readouterr().err


def test_log_flags():
    from shmserve.host.cli import log_settings
    settings = log_settings(parse_options(["--model-repository=/r"])[1])
    assert settings.as_dict() == {"log_file": "", "log_info": True, "log_warning": True,
                                  "log_error": True, "log_verbose_level": 0,
                                  "log_format": "default"}
    settings = log_settings(parse_options([
        "--model-repository=/r", "--log-verbose=2", "--log-info=false", "--log-warning", "0",
        "--log-format=json", "--log-file=/tmp/x.log"])[1])
    assert settings.as_dict() == {"log_file": "/tmp/x.log", "log_info": False,
                                  "log_warning": False, "log_error": True,
                                  "log_verbose_level": 2, "log_format": "json"}
    assert log_settings(parse_options(["--model-repository=/r", "--log-verbose=-3"])[1]
                        ).log_verbose_level == 0


def test_log_format_choices(capsys):
    with pytest.raises(SystemExit):
        parse_options(["--model-repository=/r", "--log-format=xml"])
    assert "invalid choice: 'xml'" in capsys.readouterr().err


def test_model_control_flags():
    opts, _ = parse_options(["--model-repository=/r"])
    assert opts.model_control_mode == "none" and opts.repository_poll_secs == 15
    opts, _ = parse_options(["--model-repository=/r", "--model-control-mode=poll",
                             "--repository-poll-secs=2"])
    assert opts.model_control_mode == "poll" and opts.repository_poll_secs == 2


def test_repository_poll_secs_must_be_positive(capsys):
    with pytest.raises(SystemExit):
        parse_options(["--model-repository=/r", "--repository-poll-secs=0"])
    assert "expected a positive integer" in capsys.readouterr().err


def test_limits_have_protective_defaults():
    opts, _ = parse_options(["--model-repository=/r"])
    assert opts.grpc_max_message_size == 2**31 - 1  # Triton's
    assert opts.max_tensor_byte_size == 2**31
    assert opts.max_inflight_per_connection == 64
    assert opts.max_open_streams == 16384
    assert opts.max_open_streams_per_connection == 256
    assert opts.max_queue_size_default == 1024
    assert opts.grpc_max_connections == 10000
    assert opts.grpc_max_connection_idle_ms == 300_000
    assert opts.grpc_max_decompressed_size == 64 * 1024 * 1024
    # gRPC's ping policy, as Triton sets it
    assert opts.grpc_http2_min_recv_ping_interval_without_data_ms == 300_000
    assert opts.grpc_http2_max_ping_strikes == 2
    assert opts.allow_client_shm is False  # as Triton since 2.68


def test_limits_are_flags():
    opts, _ = parse_options(["--model-repository=/r", "--http-max-input-size=1000",
                             "--grpc-max-message-size=2000", "--max-tensor-byte-size=3000",
                             "--max-inflight-per-connection=4", "--max-open-streams=5",
                             "--max-queue-size-default=0"])
    assert (opts.http_max_input_size, opts.grpc_max_message_size,
            opts.max_tensor_byte_size) == (1000, 2000, 3000)
    assert (opts.max_inflight_per_connection, opts.max_open_streams,
            opts.max_queue_size_default) == (4, 5, 0)
    opts, _ = parse_options(["--model-repository=/r", "--grpc-max-connections=0",
                             "--grpc-max-connection-idle=1000", "--grpc-max-decompressed-size=7",
                             "--max-open-streams-per-connection=3",
                             "--grpc-http2-min-recv-ping-interval-without-data=10",
                             "--grpc-http2-max-ping-strikes=0"])
    assert (opts.grpc_max_connections, opts.grpc_max_connection_idle_ms,
            opts.grpc_max_decompressed_size, opts.max_open_streams_per_connection,
            opts.grpc_http2_min_recv_ping_interval_without_data_ms,
            opts.grpc_http2_max_ping_strikes) == (0, 1000, 7, 3, 10, 0)


@pytest.mark.parametrize("flag,fragment", [
    ("--grpc-max-message-size=2147483648", "cannot exceed 2147483647"),
    ("--max-open-streams=0", "expected a positive integer"),
    ("--max-queue-size-default=-1", "expected an integer >= 0"),
    ("--http-max-input-size=0", "expected a positive integer"),
])
def test_limit_refusals(flag, fragment, capsys):
    with pytest.raises(SystemExit):
        parse_options(["--model-repository=/r", flag])
    assert fragment in capsys.readouterr().err


def test_triton_tuning_flags_are_accepted_even_repeated(tmp_path):
    argv = ["--model-repository", str(tmp_path / "missing"),
            "--backend-config=python,shm-default-byte-size=16777216",
            "--backend-config=python,stub-timeout-seconds=30",
            "--pinned-memory-pool-byte-size=0", "--cuda-memory-pool-byte-size=0:0",
            "--min-supported-compute-capability=6.0", "--http-thread-count=8",
            "--grpc-http2-max-pings-without-data=0", "--reuse-grpc-port=true"]
    options, args = parse_options(argv)
    assert options.backend_config == {"python": {"shm-default-byte-size": "16777216",
                                                 "stub-timeout-seconds": "30"}}
    assert options.model_repository == [str(tmp_path / "missing")]


def test_backend_config_global_and_per_backend():
    options, _ = parse_options(["--model-repository=/r",
                                "--backend-config=default-max-batch-size=8",
                                "--backend-config=onnxruntime,default-max-batch-size=2"])
    assert options.backend_config == {"": {"default-max-batch-size": "8"},
                                      "onnxruntime": {"default-max-batch-size": "2"}}


def test_a_malformed_backend_config_is_refused(capsys):
    with pytest.raises(SystemExit):
        parse_options(["--model-repository=/r", "--backend-config=onnxruntime,nothing"])
    assert "--backend-config 'onnxruntime,nothing'" in capsys.readouterr().err


def test_metrics_config():
    options, _ = parse_options(["--model-repository=/r",
                                "--metrics-config=counter_latencies=false",
                                "--metrics-config=histogram_latencies=true"])
    assert not options.metrics_counter_latencies and options.metrics_histogram_latencies
    options, _ = parse_options(["--model-repository=/r"])
    assert options.metrics_counter_latencies and not options.metrics_histogram_latencies


def test_latency_summary_flags():
    assert parse_options(["--model-repository=/r"])[0].metrics_summary_quantiles == ()
    opts, _ = parse_options(["--model-repository=/r", "--metrics-config=summary_latencies=true"])
    assert opts.metrics_summary_quantiles == DEFAULT_QUANTILES
    opts, _ = parse_options(["--model-repository=/r", "--metrics-config=summary_latencies=1",
                             "--metrics-config=summary_quantiles=0.5:0.05,0.99:0.001"])
    assert opts.metrics_summary_quantiles == ((0.5, 0.05), (0.99, 0.001))
