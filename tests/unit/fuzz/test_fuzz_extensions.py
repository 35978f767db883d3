"""Generated bad input for the decoders of the protocol's extensions: generate requests (any
JSON or bytes, for a model's signature, on through the dataplane) and the encoders of generate
and infer responses for whatever outputs a worker may hand over; shared-memory registration,
references to a region and CUDA raw handles; and trace settings, where a refused change
changes nothing. The property is fuzz_helpers': a correct result or a ServerError with a
client-facing code.
"""

import orjson
from hypothesis import given
from hypothesis import strategies as st

from shmserve.admission import prepare
from shmserve.errors import Code
from shmserve.extensions.client_regions import SharedMemoryManager, decode_raw_handle
from shmserve.http import generate
from shmserve.http.app import _trace_changes
from shmserve.http.codec import OutputFormat, encode_infer_response
from shmserve.inference import InferResponse, OutputTensor
from shmserve.ipc import datatypes
from shmserve.observability.tracing import SETTING_NAMES, TraceSettings, Tracer, parse_changes
from tests.unit.fuzz.fuzz_helpers import (CLIENT_CODES, FUZZ, JSON, MODELS, NAMES, REGION_BYTES,
                                          SCALARS, SIZES, outcome)


# ---------------------------------------------------------------- generate


@FUZZ
@given(st.one_of(st.dictionaries(st.sampled_from(["INPUT0", "INPUT1", "x", "id", "parameters",
                                                  "triton_x", "p"]), JSON, max_size=4),
                 JSON).map(orjson.dumps) | st.binary(max_size=60),
       st.sampled_from(sorted(MODELS)))
def test_generate_requests(regions, body, model_name):
    model = MODELS[model_name]
    request = outcome("generate", generate.decode_generate_request, body, "m", "",
                      model.signature)
    if request is None:
        return
    # generate derives shapes from the signature: with every required input given, the
    # dataplane must take them.
    prepared = outcome(None, prepare, request, model, regions)
    required = {n for n, s in model.signature.inputs.items() if not s.optional}
    assert prepared is not None or not required <= {t.name for t in request.inputs}


@FUZZ
@given(st.lists(st.tuples(NAMES, st.sampled_from(sorted(datatypes.WIRE_TYPES)),
                          st.lists(st.integers(0, 4), max_size=3), st.binary(max_size=24)),
                max_size=3),
       st.dictionaries(st.sampled_from(["id", "p", "OUTPUT0"]), SCALARS, max_size=2))
def test_generate_and_infer_responses(outputs, parameters):
    """Outputs as a worker may hand them over (any datatype, shape and bytes the model's
    tensors may have): the encoders answer JSON or a ServerError (INTERNAL for bytes that do
    not fit the shape)."""
    response = InferResponse("m", "1", "", parameters, [OutputTensor(*o) for o in outputs])
    codes = CLIENT_CODES | {Code.INTERNAL}
    payload = outcome("generate", generate.encode_generate_response, response, codes=codes)
    if payload is not None:
        event = generate.sse_data(payload)
        assert event.count(b"\n") == 2 and event.endswith(b"\n\n")
        assert isinstance(orjson.loads(payload), dict)
    fmt = OutputFormat(binary_default=bool(len(outputs) % 2))
    encoded = outcome("http_out", encode_infer_response, response, fmt, codes=codes)
    if encoded is not None:
        chunks, header, _ = encoded
        orjson.loads(chunks[0])
        assert header is None or header == len(chunks[0])


# ---------------------------------------------------------------- shared memory


@FUZZ
@given(st.text(max_size=6), st.one_of(st.text(max_size=300), st.sampled_from(
    ["", "/", ".", "..", "/dev/shm", "x/y", "triton_python_backend_shm_region_1", "\x00"])),
    SIZES, SIZES, st.booleans())
def test_shm_register(regions, name, key, offset, byte_size, ours):
    manager = SharedMemoryManager()
    if ours:
        key = regions.key
    outcome("shm_register", manager.register_system, name, key, offset, byte_size)
    if manager.system_status():
        assert ours and 0 <= offset and 0 < byte_size and offset + byte_size <= REGION_BYTES


@FUZZ
@given(st.dictionaries(st.sampled_from(["shared_memory_offset", "shared_memory_byte_size"]),
                       SIZES), st.sampled_from(["fuzz", "nope", ""]))
def test_shm_references(regions, params, region):
    piece = outcome("shm_slice", regions.slice, {"shared_memory_region": region, **params})
    if piece is not None:
        assert 0 <= piece.offset and 0 < piece.nbytes
        assert piece.offset + piece.nbytes <= REGION_BYTES


@FUZZ
@given(st.text(max_size=100))
def test_cuda_raw_handle(text):
    raw = outcome("shm_register", decode_raw_handle, text)
    assert raw is None or len(raw) == 64


_TRACE_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-2**40, 2**40), st.floats(allow_nan=True),
              st.sampled_from(["OFF", "TIMESTAMPS", "TENSORS", "0", "1", "-1", "-2", "1000",
                               "4294967296", " 7", "1e3", ""]), st.text(max_size=12)),
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.text(max_size=4), inner, max_size=2)),
    max_leaves=6)


@FUZZ
@given(st.dictionaries(st.one_of(st.sampled_from(SETTING_NAMES), st.text(max_size=8)),
                       _TRACE_VALUES, max_size=6), st.sampled_from(["", "m"]))
def test_trace_settings(body, model):
    tracer = Tracer(TraceSettings(file="trace.json"))  # no trace is taken: nothing is written
    before = tracer.settings(model)
    changes = outcome("trace_settings", _trace_changes, body)
    after = None
    if changes is not None:
        after = outcome(None, lambda: tracer.update(model, parse_changes(changes)))
    if after is None:
        assert tracer.settings(model) == before  # a refused change changes nothing
        return
    assert after == tracer.settings(model)
    levels = after["trace_level"]
    assert levels == ["OFF"] or (levels and set(levels) <= {"TIMESTAMPS", "TENSORS"})
    assert 1 <= int(after["trace_rate"]) < 2**32 and int(after["trace_count"]) >= -1
    assert int(after["log_frequency"]) >= 0
