"""The gRPC layer's header encodings (shmserve/grpc/transport.py)."""

import urllib.parse

import pytest

from shmserve.grpc.transport import _percent_encode, _timeout_seconds


@pytest.mark.parametrize("value, seconds", [
    (b"1H", 3600.0), (b"2M", 120.0), (b"3S", 3.0), (b"200m", 0.2), (b"7u", 7e-6),
    (b"99999999n", 0.099999999),
])
def test_grpc_timeout_units(value, seconds):
    assert _timeout_seconds(value) == pytest.approx(seconds)


@pytest.mark.parametrize("value", [b"", b"m", b"S1", b"123456789S", b"1x", b"-1S", b"1.5S"])
def test_malformed_grpc_timeouts_are_refused(value):
    assert _timeout_seconds(value) is None


@pytest.mark.parametrize("message", ["plain ascii", "100% sure", "modèle ✓", "tab\there\n"])
def test_grpc_message_is_percent_encoded_printable_ascii(message):
    encoded = _percent_encode(message)
    assert all(0x20 <= b <= 0x7E for b in encoded)
    assert urllib.parse.unquote(encoded.decode("ascii")) == message


def test_printable_ascii_passes_unchanged():
    assert _percent_encode("failed: 'x' is not found") == b"failed: 'x' is not found"
