"""The requests of one ModelStreamInfer call (shmserve/grpc/servicer.py, _Stream): answers leave
in request order, and the call ends once the client stopped sending and every answer left,
whatever order the wake-ups came in."""

import asyncio
from typing import NamedTuple

from shmserve.grpc.servicer import _Stream


class _Msg(NamedTuple):
    id: str
    model_name: str = "m"
    model_version: str = ""


class _Plane:
    """Just enough of a DataPlane: no model is decoupled."""

    def is_decoupled(self, name, version) -> bool:
        return False


class _Requests:
    """The client's messages, then the end of its sending half."""

    def __init__(self, messages):
        self._messages = list(messages)

    def __aiter__(self):
        return self

    async def __anext__(self):
        if not self._messages:
            raise StopAsyncIteration
        return self._messages.pop(0)


class _HeldStream(_Stream):
    """Each request's answer is its message, once the test releases it."""

    def __init__(self):
        super().__init__(_Plane())
        self.release = {}

    async def _serve_one(self, msg):
        self.release[msg.id] = asyncio.get_running_loop().create_future()
        await self.release[msg.id]
        return msg.id


async def _turns(count: int = 10) -> None:
    for _ in range(count):
        await asyncio.sleep(0)


def test_the_call_ends_when_the_last_answer_came_with_the_last_wake_up():
    """The client sends two requests and stops sending; the answers come while the
    generator waits: the wake-up of the last one is taken by the turn that returns it."""
    async def main():
        stream = _HeldStream()
        reader = asyncio.ensure_future(stream.read(_Requests([_Msg("a"), _Msg("b")])))
        await _turns()
        assert reader.done() and sorted(stream.release) == ["a", "b"]
        stream.release["a"].set_result(None)
        assert await asyncio.wait_for(stream.next(), 5) == ("a", None)
        waiting = asyncio.ensure_future(stream.next())
        await _turns()  # the generator now waits for b's wake-up
        assert not waiting.done()
        stream.release["b"].set_result(None)
        assert await asyncio.wait_for(waiting, 5) == ("b", None)
        assert await asyncio.wait_for(stream.next(), 5) is None
        await stream.close()
    asyncio.run(main())


def test_answers_leave_in_request_order():
    async def main():
        stream = _HeldStream()
        asyncio.ensure_future(stream.read(_Requests([_Msg(n) for n in "abc"])))
        await _turns()
        for name in ("c", "b", "a"):  # done in reverse
            stream.release[name].set_result(None)
        got = [await asyncio.wait_for(stream.next(), 5) for _ in range(4)]
        assert got == [("a", None), ("b", None), ("c", None), None]
        await stream.close()
    asyncio.run(main())
