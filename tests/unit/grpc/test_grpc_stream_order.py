"""The requests of one ModelStreamInfer call (shmserve/grpc/servicer.py, _Stream): answers leave
in request order, and the call ends once the client stopped sending and every answer left,
whatever order the wake-ups came in."""

import asyncio
from typing import NamedTuple

from shmserve import proto
from shmserve.grpc.servicer import _Stream
from shmserve.inference import InferRequest, StreamedResponse


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

    def _read_request(self, msg):
        return msg, msg, None

    async def _serve_one(self, named, request, error):
        self.release[request.id] = asyncio.get_running_loop().create_future()
        await self.release[request.id]
        return request.id


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


# -- decoupled responses that leave at once (_Call.send_now) --------------------------------

class _DecoupledPlane:
    """Every model is decoupled; each request's responses are what the test feeds its queue
    (None ends the request)."""

    def __init__(self):
        self.feeds = {}

    def is_decoupled(self, name, version) -> bool:
        return True

    async def stream(self, msg):
        feed = self.feeds[msg.id] = asyncio.Queue()
        while True:
            final = await feed.get()
            yield StreamedResponse(None, None, final)
            if final:
                return


class _Call:
    """The transport's side of send_now: takes what it is given while `open`."""

    def __init__(self):
        self.sent = []
        self.open = True

    def send_now(self, data: bytes) -> bool:
        if self.open:
            self.sent.append(_final_flag(data))
        return self.open


class _DecoupledStream(_Stream):
    def __init__(self, call):
        super().__init__(_DecoupledPlane(), call=call)

    def _read_request(self, request):
        return request, request, None


def _request(request_id: str):
    return InferRequest("m", id=request_id,
                        parameters={"triton_enable_empty_final_response": True})


def _final_flag(data: bytes) -> bool:
    response = proto.ModelStreamInferResponse.FromString(data).infer_response
    return response.parameters["triton_final_response"].bool_param


async def _one_request(call):
    """A stream that read request "a" and whose next() waits: (stream, that next(), the
    request's feed)."""
    stream = _DecoupledStream(call)
    asyncio.ensure_future(stream.read(_Requests([_request("a")])))
    waiting = asyncio.ensure_future(stream.next())
    await _turns()
    return stream, waiting, stream.dp.feeds["a"]


def test_decoupled_responses_leave_at_once_while_nothing_is_ahead_of_them():
    async def main():
        call = _Call()
        stream, waiting, feed = await _one_request(call)
        for final in (False, False, True):
            feed.put_nowait(final)
        await _turns()
        assert call.sent == [False, False, True]
        assert await asyncio.wait_for(waiting, 5) is None  # nothing was left to yield
    asyncio.run(main())


def test_a_response_waits_behind_one_still_on_its_way_out():
    """The first response could not leave at once (the socket was behind): it is yielded,
    and until the transport asks for the next message, later responses queue behind it."""
    async def main():
        call = _Call()
        stream, waiting, feed = await _one_request(call)
        call.open = False
        feed.put_nowait(False)
        first, written = await asyncio.wait_for(waiting, 5)
        assert _final_flag(first) is False and call.sent == []
        call.open = True  # the socket caught up; the transport has not come back yet
        feed.put_nowait(True)
        await _turns()
        assert call.sent == []  # it would overtake the first
        written.set_result(None)
        last, _ = await asyncio.wait_for(stream.next(), 5)
        assert _final_flag(last) is True
        assert await asyncio.wait_for(stream.next(), 5) is None
    asyncio.run(main())
