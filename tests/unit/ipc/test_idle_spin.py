"""When a worker polls its socket between batches (shmserve/ipc/idle_spin.py), and the polling
itself (SyncChannel)."""

import socket
import threading
import time

from shmserve.ipc import messages
from shmserve.ipc.channel import SyncChannel
from shmserve.ipc.idle_spin import CHECK_S, SPIN_INTERVALS, IdleSpin


class Machine:
    """A fake /proc/stat: `run(busy_cores, seconds)` adds jiffies (100 per core-second)."""

    def __init__(self, tmp_path, cores=2):
        self.path = tmp_path / "stat"
        self.cores = cores
        self.busy = self.idle = 0
        self.now = 0.0
        self._write()

    def run(self, busy_cores: float, seconds: float = CHECK_S + 0.001) -> None:
        self.busy += int(busy_cores * seconds * 100)
        self.idle += int((self.cores - busy_cores) * seconds * 100)
        self.now += seconds
        self._write()

    def _write(self):
        # user nice system idle iowait irq softirq steal guest guest_nice
        self.path.write_text(f"cpu  {self.busy} 0 0 {self.idle} 0 0 0 0 0 0\ncpu0 0 0 0 0\n")

    def spin(self, **kwargs) -> IdleSpin:
        return IdleSpin(stat_path=str(self.path), clock=lambda: self.now, cores=self.cores,
                        **kwargs)


def test_polls_while_a_core_is_idle_and_measures_again_without_polling(tmp_path):
    machine = Machine(tmp_path)
    spin = machine.spin()
    assert not spin.should_spin()  # nothing measured yet
    machine.run(busy_cores=0.5)
    assert spin.should_spin()  # 1.5 cores idle
    for _ in range(SPIN_INTERVALS - 1):
        machine.run(busy_cores=2.0)  # busy while polling: says nothing, polling goes on
        assert spin.should_spin()
    machine.run(busy_cores=2.0)
    assert not spin.should_spin()  # one interval without polling, to measure
    machine.run(busy_cores=1.6)
    assert not spin.should_spin()  # 0.4 cores idle: not enough
    machine.run(busy_cores=1.0)
    assert spin.should_spin()


def test_a_lower_threshold_polls_with_less_idle(tmp_path):
    machine = Machine(tmp_path)
    usual, streams = machine.spin(), machine.spin(min_idle_cores=0.3)
    machine.run(busy_cores=1.6)  # 0.4 cores idle
    assert not usual.should_spin()
    assert streams.should_spin()
    busier = machine.spin(min_idle_cores=0.3)
    machine.run(busy_cores=1.8)  # 0.2 cores idle: below even the lower threshold
    assert not busier.should_spin()


def test_off_without_a_spin_time_or_without_proc_stat(tmp_path):
    machine = Machine(tmp_path)
    off = machine.spin(spin_us=0)
    machine.run(busy_cores=0.0)
    assert not off.should_spin()
    missing = IdleSpin(stat_path=str(tmp_path / "nothing"), clock=lambda: machine.now)
    machine.run(busy_cores=0.0)
    assert not missing.should_spin()


class Always:
    spin_s = 0.05

    def should_spin(self):
        return True


def test_a_frame_that_comes_while_polling_is_read_and_sends_still_block():
    ours, theirs = socket.socketpair()
    channel = SyncChannel(ours, spin=Always())
    peer = SyncChannel(theirs)
    try:
        threading.Timer(0.01, peer.send, (messages.Release([1, 2]),)).start()
        assert channel.recv() == messages.Release([1, 2])
        # Past the polling time the read blocks as before.
        threading.Timer(0.2, peer.send, (messages.Release([3]),)).start()
        started = time.monotonic()
        assert channel.recv() == messages.Release([3])
        assert time.monotonic() - started >= 0.15
        assert ours.getblocking()  # polling never made the socket non-blocking
    finally:
        ours.close()
        theirs.close()


class ClosesAfter:
    """A gate that closes after its first `n` answers, as when the machine gets busy."""
    spin_s = 10.0

    def __init__(self, n: int):
        self.answers = 0
        self.n = n

    def should_spin(self):
        self.answers += 1
        return self.answers <= self.n


def test_polling_stops_when_the_machine_gets_busy():
    ours, theirs = socket.socketpair()
    channel = SyncChannel(ours, spin=ClosesAfter(3))
    peer = SyncChannel(theirs)
    try:
        threading.Timer(0.3, peer.send, (messages.Release([1]),)).start()
        cpu = time.thread_time()
        assert channel.recv() == messages.Release([1])
        assert time.thread_time() - cpu < 0.1  # it blocked instead of polling all that time
    finally:
        ours.close()
        theirs.close()
