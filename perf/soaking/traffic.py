"""The soak's client threads: the mix of clients (make_clients), the loop each runs on its
thread (run_client), and the Gate through which the soak holds them all between two units for a
quiescent sample, or ends them. Holding them between units rather than mid-request is what makes
a sample quiescent: no request in flight, so fds and /dev/shm can be compared exactly."""
import threading
import time

import numpy as np

from .clients import TIMEOUT_S, Client, Ensemble, Sequences, SharedMemory, Unary
from .streams import GenerateStream, Stream
from .tally import Tally


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

