"""The soak's unary clients, one thread's traffic each over one protocol: add_sub,
identity_fp32 and string_echo (Unary), ensemble_pipeline (Ensemble), the same models through
system shared-memory regions made and destroyed as it goes (SharedMemory), and sequences with a
running sum (Sequences); Client, what every client is. Every answer is checked exactly (sums of
integer-valued floats), so that an answer mixed up with another request's is caught."""
import itertools
import os
from functools import partial

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm

from .tally import Tally, expect

TIMEOUT_S = 60
SHM_CYCLE = 20
IDENTITY_SHAPES = ([1, 4], [1, 4096], [4, 1024], [1, 262144])


def module_of(protocol: str):
    return grpcclient if protocol == "grpc" else httpclient


def make_client(protocol: str, ports):
    if protocol == "grpc":
        return grpcclient.InferenceServerClient(f"127.0.0.1:{ports[1]}")
    return httpclient.InferenceServerClient(f"127.0.0.1:{ports[0]}", network_timeout=TIMEOUT_S,
                                            connection_timeout=TIMEOUT_S)


def tensor(module, name: str, array: np.ndarray, datatype: str, binary: bool = True):
    t = module.InferInput(name, list(array.shape), datatype)
    if module is httpclient:
        t.set_data_from_numpy(array, binary_data=binary)
    else:
        t.set_data_from_numpy(array)
    return t


def small_floats(rng, shape) -> np.ndarray:
    # integers: a + b and a - b are then exact in FP32 and can be compared with ==
    return rng.integers(-1000, 1000, shape).astype(np.float32)


class Client:
    """One thread's traffic: unit(rng) sends some requests and checks their answers."""

    name: str

    def __init__(self, tally: Tally, ports):
        self.tally, self.ports = tally, ports

    def call(self, kind: str, send):
        """send() -> its answer, the request counted as sent; the caller counts it served
        (tally.ok) once the answer passed its checks."""
        self.tally.send(kind)
        return send()

    def unit(self, rng) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class Unary(Client):
    """add_sub, identity_fp32 (a random shape) and string_echo over one protocol; over HTTP,
    JSON and binary tensors in turn."""

    def __init__(self, tally, ports, protocol: str):
        super().__init__(tally, ports)
        self.name, self.protocol = f"unary {protocol}", protocol
        self.module, self.client = module_of(protocol), make_client(protocol, ports)
        self.binary = itertools.cycle((True, False))

    def infer(self, model: str, inputs, outputs: dict) -> None:
        kind = f"{self.protocol} {model}"
        result = self.call(kind, partial(self.client.infer, model, inputs, **self.timeout()))
        for name, expected in outputs.items():
            got = result.as_numpy(name)
            expect(got is not None and got.shape == expected.shape and np.array_equal(got, expected),
                   f"{kind}: {name} differs from what was sent")
        self.tally.ok(kind)

    def timeout(self) -> dict:
        return dict(client_timeout=TIMEOUT_S) if self.protocol == "grpc" else {}

    def unit(self, rng) -> None:
        m, binary = self.module, next(self.binary)
        a, b = small_floats(rng, [4]), small_floats(rng, [4])
        self.infer("add_sub", [tensor(m, "INPUT0", a, "FP32", binary), tensor(m, "INPUT1", b, "FP32", binary)],
                   {"OUTPUT0": a + b, "OUTPUT1": a - b})
        x = rng.standard_normal(IDENTITY_SHAPES[rng.integers(len(IDENTITY_SHAPES))]).astype(np.float32)
        self.infer("identity_fp32", [tensor(m, "INPUT0", x, "FP32", binary and x.size > 4)], {"OUTPUT0": x})
        words = np.array([f"soak {i} é {rng.integers(1 << 30)}".encode() for i in range(rng.integers(1, 9))],
                         dtype=np.object_)
        self.infer("string_echo", [tensor(m, "INPUT0", words, "BYTES", binary)], {"OUTPUT0": words})

    def close(self) -> None:
        self.client.close()


class Ensemble(Unary):
    """ensemble_pipeline over one protocol."""

    def __init__(self, tally, ports, protocol: str):
        super().__init__(tally, ports, protocol)
        self.name = f"ensemble {protocol}"

    def unit(self, rng) -> None:
        a, b = small_floats(rng, [4]), small_floats(rng, [4])
        s, d = a + b, a - b
        self.infer("ensemble_pipeline", [tensor(self.module, "INPUT0", a, "FP32"),
                                         tensor(self.module, "INPUT1", b, "FP32")],
                   {"SUM": s, "DOUBLE0": s + d, "DOUBLE1": s - d})


class SharedMemory(Unary):
    """identity_fp32 and add_sub with inputs and outputs in system shared memory regions of
    this client, over one protocol; the regions live SHM_CYCLE requests, then are unregistered
    and destroyed and new ones made."""

    def __init__(self, tally, ports, protocol: str):
        super().__init__(tally, ports, protocol)
        self.name = f"shm {protocol}"
        self.cycles = itertools.count()

    def shm_infer(self, model: str, inputs: dict, outputs: dict, regions: dict) -> None:
        """inputs / outputs: name -> (array, offset); arrays in the 'in' / 'out' region."""
        kind = f"{self.protocol} shm {model}"
        tensors, requested = [], []
        for name, (array, offset) in inputs.items():
            shm.set_shared_memory_region(regions["in"][1], [array], offset)
            t = self.module.InferInput(name, list(array.shape), "FP32")
            t.set_shared_memory(regions["in"][0], array.nbytes, offset)
            tensors.append(t)
        for name, (array, offset) in outputs.items():
            o = self.module.InferRequestedOutput(name, binary_data=True) if self.module is httpclient \
                else self.module.InferRequestedOutput(name)
            o.set_shared_memory(regions["out"][0], array.nbytes, offset)
            requested.append(o)
        self.call(kind, partial(self.client.infer, model, tensors, outputs=requested, **self.timeout()))
        for name, (array, offset) in outputs.items():
            # a copy: no view of the region may outlive it (an exported buffer cannot be closed)
            got = shm.get_contents_as_numpy(regions["out"][1], np.float32, array.shape, offset).copy()
            expect(np.array_equal(got, array), f"{kind}: {name} in the output region is wrong")
        self.tally.ok(kind)

    def unit(self, rng) -> None:
        elements = int(rng.integers(1024, 65537))
        nbytes = max(elements * 4, 64)
        prefix = f"soak_{os.getpid()}_{self.protocol}_{next(self.cycles)}"
        regions, registered = {}, []
        try:
            for role in ("in", "out"):
                name = f"{prefix}_{role}"
                regions[role] = (name, shm.create_shared_memory_region(name, "/" + name, nbytes, create_only=True))
                self.client.register_system_shared_memory(name, "/" + name, nbytes, **self.timeout())
                registered.append(name)
            for _ in range(SHM_CYCLE // 2):
                x = rng.standard_normal([1, elements]).astype(np.float32)
                self.shm_infer("identity_fp32", {"INPUT0": (x, 0)}, {"OUTPUT0": (x, 0)}, regions)
                a, b = small_floats(rng, [4]), small_floats(rng, [4])
                self.shm_infer("add_sub", {"INPUT0": (a, 0), "INPUT1": (b, 16)},
                               {"OUTPUT0": (a + b, 32), "OUTPUT1": (a - b, 48)}, regions)
        finally:
            for name in registered:
                self.client.unregister_system_shared_memory(name, **self.timeout())
            for _, region in regions.values():
                shm.destroy_shared_memory_region(region)


class Sequences(Unary):
    """Sequences of 3 to 12 requests on accumulate or accumulate_oldest over one protocol, the
    running sum checked at every step."""

    ids = itertools.count(1 + (os.getpid() << 20))  # shared by every Sequences client

    def __init__(self, tally, ports, protocol: str):
        super().__init__(tally, ports, protocol)
        self.name = f"sequence {protocol}"

    def unit(self, rng) -> None:
        model = ("accumulate", "accumulate_oldest")[rng.integers(2)]
        kind = f"{self.protocol} sequence {model}"
        values = rng.integers(-1000, 1000, rng.integers(3, 13)).astype(np.int32)
        sequence_id, total = next(self.ids), 0
        for i, v in enumerate(values):
            total += int(v)
            result = self.call(kind, partial(
                self.client.infer, model, [tensor(self.module, "INPUT", np.array([[v]], np.int32), "INT32")],
                sequence_id=sequence_id, sequence_start=i == 0, sequence_end=i == len(values) - 1,
                **self.timeout()))
            got = result.as_numpy("OUTPUT")
            expect(got is not None and got.tolist() == [[total]],
                   f"{kind}: step {i} of sequence {sequence_id}: OUTPUT {got}, expected {total}")
            self.tally.ok(kind)

