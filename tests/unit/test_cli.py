"""Command line: tritonserver's flag names, clear refusals, no silent ignoring."""

import pytest

from shmserve.cli import parse_options


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
    (["--model-repository=/r", "--cache-config=local,size=1"], "does not support yet"),
    (["--model-repository=/r", "--strict-readiness=maybe"], "expected true or false"),
    (["--model-repository=/r", "--load-model=*", "--load-model=a"], "must be the only"),
    ([], "--model-repository"),
])
def test_refusals_are_clear(argv, fragment, capsys):
    with pytest.raises(SystemExit) as e:
        parse_options(argv)
    assert e.value.code == 2
    assert fragment in capsys.readouterr().err


def test_auto_complete_switches():
    assert parse_options(["--model-repository=/r", "--disable-auto-complete-config"])[0].disable_auto_complete
    assert parse_options(["--model-repository=/r", "--strict-model-config=true"])[0].disable_auto_complete
    assert not parse_options(["--model-repository=/r"])[0].disable_auto_complete
