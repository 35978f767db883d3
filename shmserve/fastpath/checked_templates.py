"""Checked templates: the fast path's shortcut through admission (docs/fast-path.md).

A request filled from a request template (request_templates.py) differs from the template's
earlier requests only in its tensors' bytes. Once one of them passed admission on a model,
the next ones to a model of the same signature pass the same checks and make the same work
request, provided their tensors are as long: they are admitted by checking just that.

The normal path does not need this module: a request without a template, or whose template
has no check on record, is admitted in full (lifecycle.Lifecycle.admit).
"""

from shmserve.admission import Admitted
from shmserve.dispatch.memory_regions import RegionSlice
from shmserve.dispatch.work_types import WorkInput, WorkRequest
from shmserve.inference import InferRequest
from shmserve.ipc import datatypes


def admitted(request: InferRequest, mv, started: int) -> Admitted | None:
    """The admission of a request whose template has a check on record, or None when it
    must be checked in full."""
    checked = request.template.checked
    if checked is None:
        return None
    work = checked.work(request, mv)
    if work is None:
        return None
    work.trace = request.trace
    work.timeout_us = checked.timeout_us
    return Admitted(work, checked.batch_size, checked.priority, checked.timeout_us, started)


def remember(request: InferRequest, mv, work: WorkRequest, batch_size: int, priority: int,
             timeout_us: int) -> None:
    """Record on the request's template what its full check made, for its next requests
    (none, for a request that must be checked each time)."""
    request.template.checked = CheckedTemplate.of(request, mv, work, batch_size, priority,
                                                  timeout_us)


class CheckedTemplate:
    """What `admission.prepare` made of a request filled from a request template, for the
    next requests of that template to a model of the same signature: they differ only in their
    tensor bytes, so they pass the same checks and make the same work request, once their
    bytes are as long."""

    __slots__ = ("signature", "parameters", "inputs", "batch_size", "priority",
                 "timeout_us", "correlation_id", "flags", "model_parameters", "requested")
    signature: object  # the model version's ModelSignature
    parameters: dict
    inputs: list  # (name, datatype, shape, byte length) of each input
    batch_size: int
    priority: int
    timeout_us: int
    correlation_id: int | str
    flags: int
    model_parameters: dict
    requested: list

    @classmethod
    def of(cls, request: InferRequest, mv, work: WorkRequest, batch_size: int, priority: int,
           timeout_us: int):
        """None for a request that uses shared memory or BYTES: those are checked each
        time (a region's contents and a BYTES tensor's elements can change)."""
        if work.regions or work.output_regions \
                or any(t.datatype == "BYTES" for t in request.inputs):
            return None
        checked = cls()
        checked.signature = mv.signature
        checked.parameters = dict(request.parameters)
        checked.inputs = [(w.name, w.datatype, list(w.shape), datatypes.byte_length(w.data))
                          for w in work.inputs]
        checked.batch_size = batch_size
        checked.priority = priority
        checked.timeout_us = timeout_us
        checked.correlation_id = work.correlation_id
        checked.flags = work.flags
        checked.model_parameters = dict(work.parameters)
        checked.requested = list(work.requested_outputs)
        return checked

    def work(self, request: InferRequest, mv) -> WorkRequest | None:
        """The work request for `request`, or None when it must be checked in full (another
        signature or parameters, a tensor of another length)."""
        if self.signature is not mv.signature or request.parameters != self.parameters:
            return None
        inputs = []
        for (name, datatype, shape, nbytes), t in zip(self.inputs, request.inputs):
            data = t.data
            if data is None or type(data) is RegionSlice or datatypes.byte_length(data) != nbytes:
                return None
            inputs.append(WorkInput(name, datatype, shape.copy(), data))
        return WorkRequest(request.id, self.correlation_id, self.flags,
                           self.model_parameters.copy(), inputs, self.requested.copy())
