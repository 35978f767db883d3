"""How often a client may ask the server side of an HTTP/2 connection for work that costs it
something while carrying no call: PINGs, by gRPC's ping policy, and streams it resets while
this side serves them (HTTP/2 "rapid reset"). Going past either ends the connection (GOAWAY
ENHANCE_YOUR_CALM), as the connection's other bounds do (see http2.py).
"""

import math

from shmserve.grpc.http2_frames import ENHANCE_YOUR_CALM, Http2Error

# gRPC's ping policy, with its defaults (tritonserver's --grpc-http2-min-recv-ping-interval-
# without-data and --grpc-http2-max-ping-strikes): a PING sooner than this after the last one,
# with no HEADERS or DATA sent in between, is a strike; one strike more than the maximum ends
# the connection (GOAWAY ENHANCE_YOUR_CALM, "too_many_pings"). While no call is open the
# interval is two hours, unless pings without calls are permitted.
PING_INTERVAL_WITHOUT_DATA_S = 300.0
PING_INTERVAL_WITHOUT_CALLS_S = 7200.0
MAX_PING_STRIKES = 2
# Streams the client resets while this side still serves them: a burst, then so many a second.
RESET_BURST = 1000
RESET_RATE = 100.0


class PingPolicy:
    """gRPC's ping policy on one connection: `interval` and `max_strikes` (0: no limit) as
    gRPC's; with `without_calls` the same interval holds while no call is open."""

    __slots__ = ("_interval", "_max_strikes", "_without_calls", "_clock", "_last", "_strikes")

    def __init__(self, interval: float, max_strikes: int, without_calls: bool, clock):
        self._interval = interval
        self._max_strikes = max_strikes
        self._without_calls = without_calls
        self._clock = clock
        self._last = -math.inf  # when the last PING came, since this side last sent
        self._strikes = 0

    def received(self, calls_open) -> None:
        """A PING came (not an ACK), while `calls_open` (truthy when some call is open);
        Http2Error when it is one strike too many."""
        if not self._max_strikes:
            return
        now = self._clock()
        interval = self._interval
        if not (calls_open or self._without_calls):
            interval = PING_INTERVAL_WITHOUT_CALLS_S
        if now < self._last + interval:
            self._strikes += 1
            if self._strikes > self._max_strikes:
                raise Http2Error(ENHANCE_YOUR_CALM, "too_many_pings")
        self._last = now

    def sent(self) -> None:
        """HEADERS or DATA go out: the policy starts over (as gRPC's does)."""
        self._last = -math.inf
        self._strikes = 0


class ResetRateLimit:
    """Streams reset while served, as a token bucket of RESET_BURST tokens filled at
    RESET_RATE a second."""

    __slots__ = ("_clock", "_tokens", "_time")

    def __init__(self, clock):
        self._clock = clock
        self._tokens = float(RESET_BURST)
        self._time = clock()

    def spend(self) -> None:
        """A stream this side was serving was reset: one token, or Http2Error when none is
        left."""
        now = self._clock()
        tokens = min(RESET_BURST, self._tokens + (now - self._time) * RESET_RATE)
        self._time = now
        if tokens < 1:
            raise Http2Error(ENHANCE_YOUR_CALM, f"more than {RESET_BURST} streams reset at "
                                                f"once, or {RESET_RATE:g} a second")
        self._tokens = tokens - 1
