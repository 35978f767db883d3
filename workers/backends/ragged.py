"""Ragged batching, as Triton's framework backends do it: a ragged input (`allow_ragged_batch`)
reaches the model as one flat tensor of every request's elements, the config's `batch_input`s
describe the batch so formed (element counts, offsets, item shapes), and a `batch_output`
(BATCH_SCATTER_WITH_INPUT_SHAPE) hands each request the part of a flat output that its input
shape says is its own.

Pure array code over the shapes of a batch's requests; `stacked.py` feeds and answers with it.
The arrays are numpy (a batch input is built on the host, as Triton's backends build it) or
the framework's own for outputs (numpy or cupy: only reshape and slicing are used).
"""

from dataclasses import dataclass

import numpy as np

_DTYPES = {"TYPE_INT32": np.int32, "TYPE_FP32": np.float32}
KINDS = ("BATCH_ELEMENT_COUNT", "BATCH_ACCUMULATED_ELEMENT_COUNT",
         "BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO", "BATCH_MAX_ELEMENT_COUNT_AS_SHAPE",
         "BATCH_ITEM_SHAPE", "BATCH_ITEM_SHAPE_FLATTEN")


def _element_count(shape) -> int:
    count = 1
    for dim in shape:
        count *= int(dim)
    return count


@dataclass(frozen=True)
class BatchInput:
    """One `batch_input` of the config: a tensor the backend makes for each batch and feeds
    to the model under each of `targets`."""

    kind: str
    targets: tuple[str, ...]
    data_type: str  # TYPE_INT32 or TYPE_FP32 (the front's config check allows no other)
    source: str  # the request input whose shapes it describes

    def array(self, shapes: list) -> np.ndarray:
        """The tensor for a batch whose requests' `source` inputs have `shapes` (each with
        its batch dimension first, for a batching model), in request order."""
        dtype = _DTYPES[self.data_type]
        counts = [_element_count(shape) for shape in shapes]
        kind = self.kind
        if kind == "BATCH_ELEMENT_COUNT":
            return np.array(counts, dtype=dtype)
        if kind == "BATCH_ACCUMULATED_ELEMENT_COUNT":
            return np.cumsum(counts, dtype=np.int64).astype(dtype)
        if kind == "BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO":
            return np.concatenate(([0], np.cumsum(counts, dtype=np.int64))).astype(dtype)
        if kind == "BATCH_MAX_ELEMENT_COUNT_AS_SHAPE":
            # Only its shape says anything: the largest request's element count.
            return np.zeros(max(counts, default=0), dtype=dtype)
        # BATCH_ITEM_SHAPE and _FLATTEN: each batch item's shape without the batch
        # dimension, repeated for each item of a request; as [items, dims] or flat.
        rows = [list(shape[1:]) for shape in shapes for _ in range(int(shape[0]) if shape
                                                                    else 0)]
        width = len(shapes[0]) - 1 if shapes else 0
        items = np.array(rows, dtype=dtype).reshape(len(rows), width)
        return items if kind == "BATCH_ITEM_SHAPE" else items.reshape(-1)


@dataclass(frozen=True)
class BatchOutput:
    """A `batch_output` (BATCH_SCATTER_WITH_INPUT_SHAPE): the model's `target` output is the
    batch's requests' parts back to back, each shaped as the config's dims of `target` with
    every free dimension taken from the same dimension of the request's `source` input."""

    target: str
    source: str
    shape: tuple[int, ...]  # the target's config shape, a free batch dimension first

    def shape_for(self, source_shape) -> list[int]:
        shape = list(self.shape)
        for index, dim in enumerate(shape):
            if dim == -1:
                if index >= len(source_shape):
                    raise ValueError(f"batch output '{self.target}' has a free dimension "
                                     f"{index}, which input '{self.source}' (shape "
                                     f"{list(source_shape)}) does not have")
                shape[index] = int(source_shape[index])
        return shape

    def scatter(self, result, source_shapes: list) -> list:
        """Each request's part of the model's `result`, shaped; ValueError when the result
        holds fewer elements than the requests' shapes need."""
        flat = result.reshape(-1)
        parts, offset = [], 0
        for source_shape in source_shapes:
            shape = self.shape_for(source_shape)
            count = _element_count(shape)
            if offset + count > flat.shape[0]:
                raise ValueError(f"output '{self.target}' has {flat.shape[0]} elements, fewer "
                                 f"than the shapes of input '{self.source}' in the batch need")
            parts.append(flat[offset:offset + count].reshape(shape))
            offset += count
        return parts


@dataclass(frozen=True)
class RaggedBatching:
    """What a model's config asks of ragged batching (empty for most models)."""

    ragged: frozenset  # names of the inputs flattened across the batch
    batch_inputs: tuple[BatchInput, ...]
    batch_outputs: dict  # target output name -> BatchOutput

    @classmethod
    def from_config(cls, config: dict) -> "RaggedBatching":
        """From the model's config in Triton's JSON form, which the front has checked (one
        source input each, known names, INT32 or FP32)."""
        batching = int(config.get("max_batch_size") or 0) > 0
        ragged = frozenset(entry["name"] for entry in config.get("input") or []
                           if entry.get("allow_ragged_batch"))
        batch_inputs = tuple(
            BatchInput(entry.get("kind") or KINDS[0], tuple(entry.get("target_name") or ()),
                       entry.get("data_type") or "TYPE_INT32", entry["source_input"][0])
            for entry in config.get("batch_input") or [])
        shapes = {}
        for entry in config.get("output") or []:
            reshape = entry.get("reshape")
            dims = reshape.get("shape") or [] if reshape is not None else entry.get("dims") or []
            shapes[entry["name"]] = ((-1,) if batching else ()) + tuple(int(d) for d in dims)
        batch_outputs = {}
        for entry in config.get("batch_output") or []:
            source = entry["source_input"][0]
            for target in entry.get("target_name") or ():
                batch_outputs[target] = BatchOutput(target, source, shapes[target])
        return cls(ragged, batch_inputs, batch_outputs)

    def target_entries(self) -> list[dict]:
        """The batch inputs' targets as config input entries (name, data type, dims [-1]),
        for a backend to bind to the model's inputs."""
        return [{"name": target, "data_type": batch_input.data_type, "dims": [-1]}
                for batch_input in self.batch_inputs for target in batch_input.targets]


NONE = RaggedBatching(frozenset(), (), {})
