"""What a traced request's trace records on its way through the front (see tracing.py for
the trace itself): its start, the compute times of the batch it ran in, and each response,
with Triton's timestamp and tensor activity names."""

import time


def trace_request(trace, request, mv, started: int) -> None:
    """The request as admitted: its model, its transport's timestamps, and at the TENSORS
    level its inputs."""
    trace.model(mv.name, mv.version, request.id)
    for name, ns in request.received:
        trace.stamp(name, ns)
    trace.stamp("REQUEST_START", started)
    if trace.tensors:
        for t in request.inputs:
            trace.tensor("TENSOR_QUEUE_INPUT", t.name, t.datatype, t.shape, t.data)


def trace_execution(trace, timings, response) -> None:
    """The compute times of the batch the request ran in; a response that is not streamed,
    and with it the end of the request."""
    start = timings.start_ns
    if start:
        end_input = start + timings.compute_input_ns
        start_output = end_input + timings.compute_infer_ns
        trace.stamp("COMPUTE_START", start)
        trace.stamp("COMPUTE_INPUT_END", end_input)
        trace.stamp("COMPUTE_OUTPUT_START", start_output)
        trace.stamp("COMPUTE_END", start_output + timings.compute_output_ns)
    if response is not None:
        trace_response(trace, response)
        trace.stamp("REQUEST_END", time.perf_counter_ns())


def trace_response(trace, response) -> None:
    """A response of the request (a WorkResponse, or None for the final flag alone)."""
    trace.stamp("INFER_RESPONSE_COMPLETE", time.perf_counter_ns())
    if trace.tensors and response is not None and response.error is None:
        for o in response.outputs:
            trace.tensor("TENSOR_BACKEND_OUTPUT", o.name, o.datatype, o.shape, o.data)
