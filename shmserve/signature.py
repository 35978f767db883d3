"""A model's tensor contract, taken once from its config so that validating a request is a
few dictionary lookups."""

from dataclasses import dataclass
from typing import Optional

from shmserve.ipc import datatypes


@dataclass(slots=True, frozen=True)
class TensorSpec:
    name: str
    datatype: str  # wire name
    dims: tuple  # without the batch dimension; -1 = any size
    reshape: Optional[tuple]  # shape the model sees instead of dims, if any
    optional: bool = False


@dataclass(slots=True, frozen=True)
class ModelSignature:
    max_batch_size: int
    inputs: dict  # name -> TensorSpec, in config order
    outputs: dict  # name -> TensorSpec, in config order

    @staticmethod
    def from_config(config) -> "ModelSignature":
        def spec(t, optional):
            reshape = tuple(t.reshape.shape) if t.HasField("reshape") else None
            dtype = datatypes.config_to_wire(_enum_name(t, "data_type"))
            return TensorSpec(t.name, dtype, tuple(t.dims), reshape, optional)

        return ModelSignature(
            max_batch_size=config.max_batch_size,
            inputs={t.name: spec(t, t.optional) for t in config.input},
            outputs={t.name: spec(t, False) for t in config.output},
        )

    def metadata_shape(self, spec: TensorSpec) -> list:
        """Shape as model metadata shows it: a leading -1 when the model batches."""
        return ([-1] if self.max_batch_size > 0 else []) + list(spec.dims)


def _enum_name(msg, field: str) -> str:
    fd = msg.DESCRIPTOR.fields_by_name[field]
    return fd.enum_type.values_by_number[getattr(msg, field)].name
