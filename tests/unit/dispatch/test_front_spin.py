"""FrontSpin: the front's loop polls for its time after a batch is sent and after it ends, and
for as long as a stream is open and a while after, while the gate allows (a lower one for a
lone stream and for the linger after streams)."""

import asyncio

from shmserve.dispatch.front_spin import STREAM_LINGER_S, FrontSpin


class Gate:
    def __init__(self, allowed: bool = True):
        self.allowed = allowed

    def should_spin(self) -> bool:
        return self.allowed


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def turns_until_idle(spin: FrontSpin, limit: int = 10_000) -> int:
    """Loop turns while the spin goes on (the spin's callback runs once per turn)."""
    turns = 0
    while spin.spinning and turns < limit:
        await asyncio.sleep(0)
        turns += 1
    return turns


def test_polls_after_a_batch_is_sent_and_again_after_it_ends():
    async def main():
        clock = Clock()
        spin = FrontSpin(300, gate=Gate(), clock=clock)
        batch = asyncio.get_running_loop().create_future()
        spin.watch(batch)
        assert spin.spinning
        for _ in range(50):
            await asyncio.sleep(0)
        assert spin.spinning  # the loop keeps turning
        clock.now += 0.000301
        assert await turns_until_idle(spin) <= 3  # its time is up, the batch runs on
        batch.set_result(None)  # polls again: the client's next request may come soon
        await asyncio.sleep(0)
        assert spin.spinning
        clock.now += 0.000299
        for _ in range(10):
            await asyncio.sleep(0)
        assert spin.spinning
        clock.now += 0.000002
        assert await turns_until_idle(spin) <= 3
    asyncio.run(main())


def test_a_later_batch_extends_the_time():
    async def main():
        clock = Clock()
        spin = FrontSpin(300, gate=Gate(), clock=clock)
        batch = asyncio.get_running_loop().create_future()
        spin.watch(asyncio.get_running_loop().create_future())
        clock.now += 0.000200
        spin.watch(batch)
        clock.now += 0.000200  # past the first batch's time, within the second's
        for _ in range(10):
            await asyncio.sleep(0)
        assert spin.spinning
        clock.now += 0.000101
        assert await turns_until_idle(spin) <= 3
        batch.cancel()
    asyncio.run(main())


def test_no_polling_without_a_core_to_spare_or_when_off():
    async def main():
        loop = asyncio.get_running_loop()
        closed = FrontSpin(300, gate=Gate(False), clock=Clock())
        closed.watch(loop.create_future())
        assert not closed.spinning
        gate = Gate()
        spin = FrontSpin(300, gate=gate, clock=Clock())
        spin.watch(loop.create_future())
        gate.allowed = False  # the machine got busy
        assert await turns_until_idle(spin) <= 3
        off = FrontSpin(0, gate=Gate(), clock=Clock())
        off.watch(loop.create_future())
        assert not off.spinning
    asyncio.run(main())


def test_a_stream_holds_the_polling_until_it_ends_and_a_while_after():
    async def main():
        clock = Clock()
        spin = FrontSpin(300, gate=Gate(), stream_gate=Gate(), clock=clock)
        stream = asyncio.get_running_loop().create_future()
        spin.hold(stream)
        assert spin.spinning
        clock.now += 1.0  # far past the batch time: the stream is still open
        for _ in range(10):
            await asyncio.sleep(0)
        assert spin.spinning
        stream.set_result(None)
        await asyncio.sleep(0)  # its callback runs
        clock.now += STREAM_LINGER_S - 0.001
        for _ in range(10):
            await asyncio.sleep(0)
        assert spin.spinning
        clock.now += 0.002
        assert await turns_until_idle(spin) <= 3
    asyncio.run(main())


def test_a_plain_batch_does_not_cut_a_streams_linger_short():
    async def main():
        loop = asyncio.get_running_loop()
        clock = Clock()
        spin = FrontSpin(300, gate=Gate(), stream_gate=Gate(), clock=clock)
        stream, batch = loop.create_future(), loop.create_future()
        spin.hold(stream)
        stream.set_result(None)
        spin.watch(batch)
        batch.set_result(None)
        await asyncio.sleep(0)  # their callbacks run
        clock.now += 0.001  # past the plain batch's time, within the stream's linger
        for _ in range(10):
            await asyncio.sleep(0)
        assert spin.spinning
        clock.now += STREAM_LINGER_S
        assert await turns_until_idle(spin) <= 3
    asyncio.run(main())


def test_the_linger_after_streams_asks_a_gate_of_its_own():
    async def main():
        loop = asyncio.get_running_loop()
        stream_gate = Gate()
        spin = FrontSpin(300, gate=Gate(False), stream_gate=stream_gate, clock=Clock())
        stream = loop.create_future()
        spin.hold(stream)
        assert not spin.spinning  # while the stream runs, the usual gate decides
        stream.set_result(None)
        await asyncio.sleep(0)  # its callback runs: the linger, under the streams' gate
        for _ in range(10):
            await asyncio.sleep(0)
        assert spin.spinning
        stream_gate.allowed = False  # the machine got busy
        assert await turns_until_idle(spin) <= 3

        spin = FrontSpin(300, gate=Gate(), stream_gate=Gate(False), clock=Clock())
        stream = loop.create_future()
        spin.hold(stream)
        for _ in range(10):
            await asyncio.sleep(0)
        assert spin.spinning
        stream.set_result(None)
        assert await turns_until_idle(spin) <= 3  # no linger without the streams' gate

        off = FrontSpin(0, gate=Gate(), stream_gate=Gate(), clock=Clock())
        off.hold(loop.create_future())
        assert not off.spinning
    asyncio.run(main())


def test_a_lone_stream_polls_under_the_streams_gate_while_open():
    async def main():
        loop = asyncio.get_running_loop()
        stream_gate = Gate()
        spin = FrontSpin(300, gate=Gate(False), stream_gate=stream_gate, clock=Clock())
        lone = loop.create_future()
        spin.hold(lone, lone=True)
        for _ in range(10):
            await asyncio.sleep(0)
        assert spin.spinning  # the usual gate is closed, the streams' gate open
        crowded = loop.create_future()
        spin.hold(crowded)  # another client came: the usual gate decides again
        assert await turns_until_idle(spin) <= 3
        crowded.set_result(None)
        await asyncio.sleep(0)  # the lone one is still open, alone again
        for _ in range(10):
            await asyncio.sleep(0)
        assert spin.spinning
        stream_gate.allowed = False  # the machine got busy
        assert await turns_until_idle(spin) <= 3
        lone.cancel()
    asyncio.run(main())
