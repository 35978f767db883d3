"""Responses: what a model's work response becomes for the transports, an InferResponse.

Outputs the worker left in its output arena are named by where they lie (a RegionSlice), so
a transport can send them from there; an output with a `reshape` gets its config shape back;
outputs asked as classifications are turned into their top classes here.
"""

from shmserve.dispatch.memory_regions import RegionSlice
from shmserve.extensions.classification import classify
from shmserve.extensions.response_cache import CachedResponse
from shmserve.inference import InferRequest, InferResponse, OutputTensor, StreamedResponse


def infer_response(request: InferRequest, mv, work) -> InferResponse:
    """The InferResponse of `work`, a WorkResponse of `request` to model version `mv`."""
    sig = mv.signature
    outputs = []
    arena = work.arena
    for o in work.outputs:
        shape = o.shape
        spec = sig.outputs.get(o.name)
        if spec is not None and spec.reshape is not None and -1 not in spec.dims:
            shape = ([shape[0]] if sig.max_batch_size > 0 and shape else []) + list(spec.dims)
        place = None
        if o.offset >= 0 and arena is not None:
            place = RegionSlice(arena, o.offset, len(o.data))
        outputs.append(OutputTensor(o.name, o.datatype, shape, o.data, place=place))
    classes = classifications(request) if request.outputs else None
    if classes:
        outputs = [classify(o, classes[o.name], sig.max_batch_size > 0, mv.labels.get(o.name))
                   if o.name in classes else o for o in outputs]
    return InferResponse(mv.name, str(mv.version), request.id, work.parameters, outputs,
                         release=work.release, written_by_worker=work.written_by_worker)


def cached_response(request: InferRequest, mv, hit: CachedResponse) -> InferResponse:
    """The InferResponse of a response cache hit."""
    return InferResponse(mv.name, str(mv.version), request.id, dict(hit.parameters),
                         [OutputTensor(name, datatype, list(shape), data)
                          for name, datatype, shape, data in hit.outputs])


def streamed(request: InferRequest, mv, work, final: bool) -> StreamedResponse:
    """One response of a stream (`work`: a WorkResponse, or None for the final flag alone)."""
    if work is None:
        return StreamedResponse(None, None, final)
    if work.error is not None:
        return StreamedResponse(None, work.error, final)
    return StreamedResponse(infer_response(request, mv, work), None, final)


def classifications(request: InferRequest) -> dict | None:
    """{output name: k} of the outputs asked as classifications, or None."""
    found = None
    for o in request.outputs:
        k = o.parameters.get("classification") if o.parameters else None
        if k:
            found = found or {}
            found[o.name] = k
    return found
