"""The model API of the Python backend, one concept per module; models see it as
`triton_python_backend_utils` (workers/triton_python_backend_utils.py), the one module that
says what they may reach.

constants    response, request and memory-type constants
dtypes       datatype maps and the BYTES encoding
errors       TritonModelException, TritonError and its codes
tensor       Tensor, DLPack in and out
parameters   request and response parameters
request      InferenceRequest (execute()'s and BLS calls'), PreferredMemory, InferenceTrace,
             input lookups and batched_input
response     InferenceResponse, InferenceResponseSender, output lookup
bls          the responses of BLS calls, read from the server's replies
server       calls into the server; load_model, unload_model, is_model_ready
context      the instance's context the worker sets (model folder, name, channel, BLS allowed)
log          Logger
metrics      MetricFamily and Metric
model_config configuration lookups and ModelConfig (auto_complete_config)

The Python backend (workers/backends/python.py and the python_*.py modules beside it) is the
backend side of these classes and reads their underscore attributes directly.
"""
