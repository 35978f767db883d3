"""What the soak's clients count, and what the server's counters must add up to by that count.
A wrong answer is an exception (WrongAnswer) so that a client's unit stops at the first one and
its thread counts it as an error like any other failure."""
import threading
from collections import Counter


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


def server_successes(tally: Tally) -> int:
    """What nv_inference_request_success must add up to: every request served, for each
    ensemble_pipeline request its two add_sub steps as well, and every decode step of an
    iterative request."""
    ensembles = sum(n for kind, n in tally.served.items() if kind.endswith("ensemble_pipeline"))
    return sum(tally.served.values()) + 2 * ensembles + tally.more_steps

