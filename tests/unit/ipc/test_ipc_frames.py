"""Control frames: every message survives encode/decode; framing copes with any split."""

import socket
import threading

import pytest

from shmserve.ipc import codec, locations, messages
from shmserve.ipc.channel import SyncChannel
from shmserve.ipc.locations import (InCallArena, InInputArena, InOutputArena, InRegion,
                                    KeptOnDevice, OnDevice, WrittenToRegion)

SAMPLES = [
    messages.Init("m", 1, "/repo/m", "/repo", {"name": "m", "max_batch_size": 8}, "m_0", "CPU", 0,
                  "/shmserve.1.a", "/shmserve.1.b", "/shmserve.1.c", 65536),
    messages.Ready(""),
    messages.Ready("ImportError: no module"),
    messages.Execute(7, InInputArena(4096, (1 << 20) + 64), [
        messages.RequestFrame("id-1", 42, 3, {"k": "v", "n": 1, "b": True, "f": 0.5},
                              [messages.TensorRef("IN", "FP32", [1, 4], [0, 16]),
                               messages.TensorRef("BIG", "UINT8", [1, 1 << 20], [64, 1 << 20])],
                              ["OUT"], 0),
        messages.RequestFrame("id-2", 0, 0, {}, [], [], 65535, trace_id=5, device_outputs=["O"],
                              trace_context='{"traceparent":"00-0af7651916cd43dd8448eb211c12666c-'
                                            'b7ad6b7169242424-01"}')]),
    messages.Execute(8, b"\x01" * 24, [
        messages.RequestFrame("a", 0, 0, {}, [messages.TensorRef("IN", "FP32", [1, 2], [0, 8])],
                              ["OUT"], 1),
        messages.RequestFrame("b", 0, 0, {}, [messages.TensorRef("IN", "FP32", [2, 2], [8, 16])],
                              ["OUT"], 2)]),
    messages.Execute(9, b"", [messages.RequestFrame("", 0, 0, {}, [], [], 3)]),
    messages.Execute(10, b"", [messages.RequestFrame("", 0, 0, {}, [], [], 4)], lone=True),
    messages.Result(7, [messages.ResponseFrame(None, [messages.TensorRef("OUT", "BYTES", [1], b"\x01\x00\x00\x00x")], {"p": 1}),
                        messages.ResponseFrame(["INTERNAL", "boom"], [], {})], 1, 2, 3),
    messages.Result(10, [], 4, 5, 6),
    messages.Result(11, [], written=[[9, []], [10, [[0, b"rest"]]]]),
    messages.StreamResponse(3, False, messages.ResponseFrame(
        None, [messages.TensorRef("OUT", "INT32", [1], b"\x01\x00\x00\x00")], {})),
    messages.StreamResponse(3, False, messages.ResponseFrame(["INVALID_ARG", "bad"], [], {})),
    messages.StreamResponse(3, True, None),
    messages.Written(11, [[2, b"rest"]]),
    messages.Release([0, 64, 128]),
    messages.Release([], [3, 4]),
    messages.Shutdown(),
    messages.Bye(),
    # Every kind of location, where it travels.
    messages.Execute(12, b"", [messages.RequestFrame(
        "r", 0, 0, {}, [messages.TensorRef("IN", "FP32", [4], [0, 16]),
                        messages.TensorRef("SHM", "FP32", [4], InRegion(3, 128, 16)),
                        messages.TensorRef("GPU", "FP32", [4], OnDevice(b"h" * 64, 1, 256, 16))],
        ["OUT", "MID"], 5, output_regions={"OUT": InRegion(3, 512, 64)})]),
    messages.Result(12, [messages.ResponseFrame(None, [
        messages.TensorRef("OUT", "FP32", [4], WrittenToRegion(3, 16)),
        messages.TensorRef("MID", "FP32", [4], KeptOnDevice(b"h" * 64, 1, 0, 16, 9)),
        messages.TensorRef("BIG", "FP32", [1 << 16], InOutputArena(4096, 1 << 18))])]),
    messages.ServerReply(2, True, messages.ResponseFrame(None, [
        messages.TensorRef("OUT", "FP32", [1 << 16], InRegion(4, 0, 1 << 18))])),
]


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda m: type(m).__name__)
def test_round_trip(msg):
    frame = b"".join(codec.encode(msg))
    (body,) = codec.FrameSplitter().feed(frame)
    assert codec.decode_body(body) == msg


def test_splitter_handles_every_split_point():
    stream = b"".join(b"".join(codec.encode(m)) for m in SAMPLES)
    for cut in range(0, len(stream), 7):
        splitter = codec.FrameSplitter()
        bodies = splitter.feed(stream[:cut]) + splitter.feed(stream[cut:])
        assert [codec.decode_body(b) for b in bodies] == SAMPLES


BIG = messages.Execute(4, bytes(range(256)) * (codec.LARGE_BODY // 256 + 1), [])


@pytest.mark.parametrize("chunk", [7, 4096, 65536, codec.LARGE_BODY + 3, 10 * codec.LARGE_BODY])
def test_a_large_body_is_filled_in_place_whatever_the_chunks(chunk):
    sent = [SAMPLES[3], BIG, SAMPLES[4], BIG, SAMPLES[2]]
    stream = b"".join(b"".join(codec.encode(m)) for m in sent)
    if chunk == 7:  # small chunks through the first large body only: enough, and quick
        sent = sent[:2]
        stream = stream[:sum(len(b"".join(codec.encode(m))) for m in sent)]
    splitter = codec.FrameSplitter()
    bodies = []
    for start in range(0, len(stream), chunk):
        bodies += splitter.feed(stream[start:start + chunk])
    assert [codec.decode_body(b) for b in bodies] == sent


def test_byte_at_a_time():
    stream = b"".join(codec.encode(SAMPLES[3]))
    splitter = codec.FrameSplitter()
    bodies = []
    for i in range(len(stream)):
        bodies += splitter.feed(stream[i:i + 1])
    assert [codec.decode_body(b) for b in bodies] == [SAMPLES[3]]


def test_every_location_arrives_as_its_own_struct():
    execute, result, reply = (codec.decode_body(codec.encode(m)[1]) for m in SAMPLES[-3:])
    request = execute.requests[0]
    # An input within the block stays an (offset, nbytes) pair.
    assert [type(t.location) for t in request.inputs] == [list, InRegion, OnDevice]
    assert type(request.output_regions["OUT"]) is InRegion
    assert [type(t.location) for t in result.responses[0].outputs] == [
        WrittenToRegion, KeptOnDevice, InOutputArena]
    assert type(reply.response.outputs[0].location) is InRegion
    block = codec.decode_body(codec.encode(SAMPLES[3])[1]).input_block
    assert type(block) is InInputArena and (block.offset, block.nbytes) == (4096, (1 << 20) + 64)
    # A BLS call's arguments carry InCallArena inputs as arrays, which the front checks.
    assert locations.checked(list(InCallArena(64, 8))) == InCallArena(64, 8)


@pytest.mark.parametrize("array", [[], [1, 2], [1, 2, 99], [1, 2, 3, locations.IN_CALL_ARENA],
                                   "xy", {"a": 1}])
def test_a_malformed_location_from_a_call_is_refused(array):
    with pytest.raises(ValueError, match="not a tensor location"):
        locations.checked(array)


def test_unknown_tag_is_an_error():
    import msgpack
    with pytest.raises(ValueError):
        codec.decode_body(msgpack.packb([99, 1]))


def test_oversized_frame_header_is_refused():
    with pytest.raises(ValueError):
        codec.FrameSplitter().feed(b"\xff\xff\xff\xff")


def test_sync_channel_over_a_socketpair():
    a, b = socket.socketpair()
    left, right = SyncChannel(a), SyncChannel(b)
    try:
        senders = [threading.Thread(target=left.send, args=(m,)) for m in SAMPLES]
        for t in senders:
            t.start()
        got = [right.recv() for _ in SAMPLES]
        for t in senders:
            t.join()
        assert sorted(map(repr, got)) == sorted(map(repr, SAMPLES))  # whole frames, any order
        left.close()
        assert right.recv() is None
    finally:
        right.close()


def test_large_frames_cross_both_channel_ends_whole():
    """Frames around large bodies, from the worker's end to the front's (on uvloop, as in the
    server) and back: each arrives whole and in order."""
    import asyncio

    import uvloop

    from shmserve.ipc.channel import AsyncChannel

    sent = [SAMPLES[3], BIG, SAMPLES[4], BIG, SAMPLES[2]]

    async def main():
        front, worker = socket.socketpair()
        got, closed = [], []
        loop = asyncio.get_running_loop()
        complete = loop.create_future()

        def on_message(message):
            got.append(message)
            if len(got) == len(sent) and not complete.done():
                complete.set_result(None)

        _, channel = await loop.create_unix_connection(
            lambda: AsyncChannel(on_message, closed.append), sock=front)
        worker_end = SyncChannel(worker)
        sender = threading.Thread(target=lambda: [worker_end.send(m) for m in sent])
        sender.start()
        await asyncio.wait_for(complete, 30)
        sender.join()
        for message in sent:  # and back
            channel.send(message)
        back = await asyncio.to_thread(lambda: [worker_end.recv() for _ in sent])
        channel.close()
        worker_end.close()
        return got, back, closed

    got, back, closed = uvloop.run(main())
    assert got == sent and back == sent
    assert not [c for c in closed if c is not None]
