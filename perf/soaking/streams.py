"""The soak's streaming clients: a gRPC stream to the decoupled `repeat` (Stream), and HTTP
generate_stream to `square` and `textgen_iterative` (GenerateStream). Each keeps its stream or
connection across units, as real streaming clients do, and opens a new one after a failure,
whose late responses must not be read as the next request's."""
import http.client
import json
import queue
from functools import partial

import numpy as np
import tritonclient.grpc as grpcclient

from .clients import TIMEOUT_S, Client, tensor
from .tally import expect

STREAM_UNITS = 50
TEXTGEN_EVERY = 10  # generate_stream units; the others go to `square`
PROMPTS = ("The sea was", "Once upon a time", "He said that")


class Stream(Client):
    """`repeat` on a gRPC stream: each element of IN back in order, then the empty final
    response; the stream is closed and a new one opened every STREAM_UNITS requests."""

    name = "stream grpc"
    kind = "grpc stream repeat"

    def __init__(self, tally, ports):
        super().__init__(tally, ports)
        self.client = grpcclient.InferenceServerClient(f"127.0.0.1:{ports[1]}")
        self.responses: queue.Queue = queue.Queue()
        self.units = 0
        self.open = False

    def unit(self, rng) -> None:
        try:
            self.exchange(rng)
        except BaseException:
            # responses of the failed request may still come: the next request gets a new stream
            self.close_stream()
            self.units = 0
            raise

    def exchange(self, rng) -> None:
        if self.units % STREAM_UNITS == 0:
            self.close_stream()
            self.responses = queue.Queue()
            self.client.start_stream(lambda result, error: self.responses.put((result, error)),
                                     stream_timeout=None)
            self.open = True
        self.units += 1
        values = rng.integers(-1 << 20, 1 << 20, rng.integers(1, 9)).astype(np.int32)
        rid = f"r{self.units}"
        self.call(self.kind, partial(self.client.async_stream_infer, "repeat",
                                     [tensor(grpcclient, "IN", values, "INT32")], request_id=rid,
                                     enable_empty_final_response=True))
        for i in range(len(values) + 1):
            result, error = self.responses.get(timeout=TIMEOUT_S)
            if error is not None:
                raise error
            response = result.get_response()
            expect(response.id == rid, f"{self.kind}: response for {response.id!r}, expected {rid!r}")
            final = response.parameters["triton_final_response"].bool_param
            if i == len(values):
                expect(final and not response.outputs, f"{self.kind}: no empty final response")
            else:
                expect(not final and result.as_numpy("OUT").tolist() == [values[i]]
                       and result.as_numpy("IDX").tolist() == [i], f"{self.kind}: response {i} is wrong")
        self.tally.ok(self.kind)

    def close_stream(self) -> None:
        if self.open:
            self.client.stop_stream()
            self.open = False

    def close(self) -> None:
        self.close_stream()
        self.client.close()


class GenerateStream(Client):
    """HTTP generate_stream (server-sent events) on one kept-alive connection: `square` with
    IN = n gives n events holding n; every TEXTGEN_EVERY-th request a short greedy text from
    textgen_iterative, which must be the same every time for a prompt."""

    name = "generate_stream http"

    def __init__(self, tally, ports):
        super().__init__(tally, ports)
        self.conn = http.client.HTTPConnection("127.0.0.1", ports[0], timeout=TIMEOUT_S)
        self.units = 0
        self.texts: dict[str, str] = {}

    def events(self, model: str, body: dict) -> list[dict]:
        self.conn.request("POST", f"/v2/models/{model}/generate_stream", json.dumps(body),
                          {"Content-Type": "application/json"})
        response = self.conn.getresponse()
        text = response.read().decode()
        expect(response.status == 200, f"generate_stream {model}: HTTP {response.status} {text[:200]}")
        return [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:")]

    def unit(self, rng) -> None:
        try:
            self.exchange(rng)
        except BaseException:
            self.conn.close()  # the next request connects again
            raise

    def exchange(self, rng) -> None:
        self.units += 1
        if self.units % TEXTGEN_EVERY == 0:
            kind = "http generate_stream textgen_iterative"
            prompt = PROMPTS[rng.integers(len(PROMPTS))]
            events = self.call(kind, partial(self.events, "textgen_iterative", dict(
                text_input=prompt, max_tokens=12, temperature=0.0, stream=True)))
            text = "".join(e.get("text_output", "") for e in events)
            expect(0 < len(text) <= 12 and all("error" not in e for e in events),
                   f"{kind}: {len(text)} characters, {events[-1:]}")
            expect(self.texts.setdefault(prompt, text) == text,
                   f"{kind}: greedy text for {prompt!r} changed: {self.texts[prompt]!r} then {text!r}")
            self.tally.ok(kind, steps=len(text))  # one decode step a character
            return
        else:
            kind = "http generate_stream square"
            n = int(rng.integers(1, 7))
            events = self.call(kind, partial(self.events, "square", {"IN": n}))
            expect([np.ravel(e.get("OUT")).tolist() for e in events] == [[n]] * n,
                   f"{kind}: IN={n} gave {events}")
        self.tally.ok(kind)

    def close(self) -> None:
        self.conn.close()

