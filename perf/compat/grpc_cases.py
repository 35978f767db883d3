"""The gRPC cases: unary calls (the status code and message, or the reply) and ModelStreamInfer
streams on decoupled models, on others, on a decoupled ensemble, and on the models whose
faults and BLS calls are compared (stream_faults, bls_stream)."""
import struct

from tritonclient.grpc import service_pb2 as pb

from .calls import F4, grpc_request, raw_of


def grpc_cases():
    return {
        "grpc ServerReady": ("ServerReady", pb.ServerReadyRequest()),
        "grpc ModelReady unknown model": ("ModelReady", pb.ModelReadyRequest(name="nope")),
        "grpc ModelReady unknown version": ("ModelReady", pb.ModelReadyRequest(name="identity_fp32", version="7")),
        "grpc metadata unknown model": ("ModelMetadata", pb.ModelMetadataRequest(name="nope")),
        "grpc metadata version x": ("ModelMetadata", pb.ModelMetadataRequest(name="identity_fp32", version="x")),
        "grpc config unknown model": ("ModelConfig", pb.ModelConfigRequest(name="nope")),
        "grpc stats unknown model": ("ModelStatistics", pb.ModelStatisticsRequest(name="nope")),
        "grpc stats unknown version": ("ModelStatistics", pb.ModelStatisticsRequest(name="identity_fp32", version="4")),
        "grpc load in none mode": ("RepositoryModelLoad", pb.RepositoryModelLoadRequest(model_name="identity_fp32")),
        "grpc shm status unknown": ("SystemSharedMemoryStatus", pb.SystemSharedMemoryStatusRequest(name="nope")),
        "grpc shm register missing key": ("SystemSharedMemoryRegister", pb.SystemSharedMemoryRegisterRequest(
            name="r", key="/shmserve_probe_absent", byte_size=16)),
        "grpc shm unregister unknown": ("SystemSharedMemoryUnregister", pb.SystemSharedMemoryUnregisterRequest(name="nope")),
        "grpc cuda register short handle": ("CudaSharedMemoryRegister", pb.CudaSharedMemoryRegisterRequest(
            name="r", raw_handle=b"xx", byte_size=16)),
        "grpc infer": ("ModelInfer", grpc_request()),
        "grpc response parameters": ("ModelInfer", grpc_request(
            model="params_echo", datatype="INT32", shape=(1,), raw=(struct.pack("<i", 1),),
            params={"reply_s": "x", "reply_n": 7, "reply_b": True})),
        "grpc response sender misuse twice": ("ModelInfer", grpc_request(
            model="sender_misuse", shape=(4,), params={"misuse": "twice"})),
        "grpc infer unknown model": ("ModelInfer", grpc_request(model="nope")),
        "grpc infer unknown version": ("ModelInfer", grpc_request(version="2")),
        "grpc infer version x": ("ModelInfer", grpc_request(version="x")),
        "grpc infer unknown input": ("ModelInfer", grpc_request(name="X")),
        "grpc infer wrong datatype": ("ModelInfer", grpc_request(datatype="INT32")),
        "grpc infer bad datatype": ("ModelInfer", grpc_request(datatype="FLOAT")),
        "grpc infer no batch dim": ("ModelInfer", grpc_request(shape=(4,))),
        "grpc infer too few bytes": ("ModelInfer", grpc_request(shape=(1, 5))),
        "grpc infer no contents": ("ModelInfer", grpc_request(raw=())),
        "grpc two raw contents for one input": ("ModelInfer", grpc_request(raw=(F4, F4))),
        "grpc infer unknown output": ("ModelInfer", grpc_request(outputs=("NOPE",))),
        "grpc infer negative priority": ("ModelInfer", grpc_request(params={"priority": -1})),
        "grpc infer timeout as string": ("ModelInfer", grpc_request(params={"timeout": "x"})),
        "grpc infer triton_ parameter": ("ModelInfer", grpc_request(params={"triton_x": 1})),
        **{f"grpc model fault {mode}": ("ModelInfer", grpc_request(
            model="model_faults", name="MODE", datatype="INT32", shape=(1,), raw=(struct.pack("<i", mode),)))
           for mode in (1, 3, 4, 5, 6, 7, 8, 9, 11, 13)},
        "grpc infer decoupled model": ("ModelInfer", grpc_request(model="repeat", name="IN", datatype="INT32",
                                                                 shape=(2,), raw=(struct.pack("<2i", 1, 2),))),
    }


def stream_cases():
    def repeat(count=2, model="repeat", name="IN", request_id="", params=None):
        request = grpc_request(model=model, name=name, datatype="INT32", shape=(count,),
                               raw=(struct.pack(f"<{count}i", *range(count)),), params=params)
        request.id = request_id
        return request
    final = {"triton_enable_empty_final_response": True}

    def identity(request_id, shape=(1, 4), params=None, model="identity_fp32", name="INPUT0"):
        request = grpc_request(model=model, name=name, shape=shape,
                               raw=(bytes(4 * shape[0] * shape[1]),), params=params)
        request.id = request_id
        return request
    cases = {  # ModelStreamInfer on models that are not decoupled
        "stream identity": ([identity("i1"), identity("i2", (2, 4)), identity("i3")], None),
        "stream identity, a bad one between": ([identity("b1"), identity("b2", (65, 1)), identity("b3")], None),
        "stream identity, unknown input between": ([identity("u1"), identity("u2", name="X"), identity("u3")], None),
        "stream identity empty final response": ([identity("f1", params=final)], None),
        "stream identity empty final response as an int": (
            [identity("n1", params={"triton_enable_empty_final_response": 1}), identity("n2")], None),
        # Not among them: a stream mixing identity_fp32 and repeat, whose responses Triton 2.51
        # orders differently from run to run and which once ended its process ("ASSERTION
        # FAILED: !byte_buffer->Valid()").
        "stream identity triton_grpc_error": ([identity("e1"), identity("e2", (65, 1)), identity("e3")],
                                              (("triton_grpc_error", "true"),)),
        "stream model fault 3": ([grpc_request(model="model_faults", name="MODE", datatype="INT32", shape=(1,),
                                               raw=(struct.pack("<i", 3),)), identity("after")], None),
        "stream no requests": ([], None),
    }
    text = pb.ModelInferRequest(model_name="textgen", id="tg")
    for name, datatype, raw in (("text_input", "BYTES", raw_of("BYTES", ["It was"])),
                                ("max_tokens", "INT32", raw_of("INT32", [5])),
                                ("seed", "UINT64", raw_of("UINT64", [3])),
                                ("temperature", "FP32", raw_of("FP32", [0.8]))):
        text.inputs.add(name=name, datatype=datatype, shape=[1])
        text.raw_input_contents.append(raw)
    cases["stream textgen"] = ([text], None)
    return {**cases,
        "stream": ([repeat(request_id="a")], None),
        "stream unknown model, then on": ([repeat(1, model="nope", request_id="x"), repeat(1, request_id="y")], None),
        "stream unknown input, then on": ([repeat(1, name="X", request_id="x"), repeat(1, request_id="y")], None),
        "stream empty final response": ([repeat(request_id="e", params=final)], None),
        "stream no responses": ([repeat(0, request_id="z", params=final)], None),
        "stream triton_grpc_error": ([repeat(1, model="nope"), repeat(1)], (("triton_grpc_error", "true"),)),
        # A decoupled ensemble (ens_repeat: one step, repeat).
        "stream ensemble": ([repeat(3, model="ens_repeat", request_id="en")], None),
        "stream ensemble empty final response": ([repeat(2, model="ens_repeat", request_id="ef",
                                                         params=final)], None),
        "stream ensemble unknown input, then on": ([repeat(1, model="ens_repeat", name="X", request_id="x"),
                                                    repeat(1, model="ens_repeat", request_id="y")], None),
        "stream ensemble no responses": ([repeat(0, model="ens_repeat", request_id="e0",
                                                 params=final)], None),
        "stream ensemble sequence fields": ([repeat(1, model="ens_repeat", request_id="es",
                                                    params={"sequence_id": 7, "sequence_start": True})], None),
        # stream_faults: what a decoupled Python model can do wrong; then a good request.
        **{f"stream fault {mode}": ([
            grpc_request(model="stream_faults", name="MODE", datatype="INT32", shape=(1,),
                         raw=(struct.pack("<i", value),), params=final) for value in (mode, 0)], None)
           for mode in range(1, 9)},
        # bls_stream: BLS calls from a decoupled model, forwarded, from a thread, awaited.
        **{f"stream bls {mode}": ([
            grpc_request(model="bls_stream", name="MODE", datatype="INT32", shape=(1,),
                         raw=(struct.pack("<i", mode),), params=final)], None)
           for mode in range(9)},
    }
