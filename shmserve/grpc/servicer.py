"""gRPC endpoints: inference.GRPCInferenceService and grpc.health.v1.Health.

Transport only: each RPC decodes, calls the dataplane, and encodes. Registered through
generic handlers over our private-pool message classes, so no generated stubs are needed.
"""

import asyncio
import logging

import grpc
from google.protobuf import json_format

from shmserve import proto
from shmserve.dataplane import DataPlane
from shmserve.errors import Code, ServerError
from shmserve.grpc import codec
from shmserve.stats import stats_json

log = logging.getLogger("shmserve.grpc")

STATUS = {
    Code.INTERNAL: grpc.StatusCode.INTERNAL,
    Code.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    Code.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    Code.UNSUPPORTED: grpc.StatusCode.UNIMPLEMENTED,
    Code.INVALID_ARG: grpc.StatusCode.INVALID_ARGUMENT,
    Code.ALREADY_EXISTS: grpc.StatusCode.ALREADY_EXISTS,
    Code.CANCELLED: grpc.StatusCode.CANCELLED,
    Code.UNKNOWN: grpc.StatusCode.UNKNOWN,
}

SERVING = 1
STREAM_INFLIGHT = 64  # requests of one stream accepted but not yet answered


def _unary(fn):
    async def handler(request, context):
        try:
            return await fn(request)
        except ServerError as exc:
            await context.abort(STATUS.get(exc.code, grpc.StatusCode.UNKNOWN), exc.message)
    return handler


class InferenceServicer:
    def __init__(self, dataplane: DataPlane):
        self.dp = dataplane

    async def ServerLive(self, request):
        return proto.ServerLiveResponse(live=self.dp.server_live())

    async def ServerReady(self, request):
        return proto.ServerReadyResponse(ready=self.dp.server_ready())

    async def ModelReady(self, request):
        return proto.ModelReadyResponse(ready=self.dp.model_ready(request.name, request.version))

    async def ServerMetadata(self, request):
        return proto.ServerMetadataResponse(**self.dp.server_metadata())

    async def ModelMetadata(self, request):
        md = self.dp.model_metadata(request.name, request.version)
        resp = proto.ModelMetadataResponse(name=md["name"], versions=md["versions"],
                                           platform=md["platform"])
        for key, target in (("inputs", resp.inputs), ("outputs", resp.outputs)):
            for t in md[key]:
                target.add(name=t["name"], datatype=t["datatype"], shape=t["shape"])
        return resp

    async def ModelConfig(self, request):
        config, _ = self.dp.model_config(request.name, request.version)
        resp = proto.ModelConfigResponse()
        resp.config.CopyFrom(config)
        return resp

    async def ModelStatistics(self, request):
        stats = self.dp.model_statistics(request.name, request.version)
        return json_format.ParseDict(
            {"model_stats": [stats_json(mv, s) for mv, s in stats]},
            proto.ModelStatisticsResponse())

    async def RepositoryIndex(self, request):
        resp = proto.RepositoryIndexResponse()
        for entry in self.dp.repository_index(request.ready):
            resp.models.add(**entry)
        return resp

    async def ModelInfer(self, request):
        infer_request = codec.decode_model_infer_request(request)
        response = await self.dp.infer(infer_request)
        try:
            return codec.encode_model_infer_response(response)
        finally:
            response.done()

    async def ModelStreamInfer(self, request_iterator, context):
        """Responses leave in request order; errors travel in-band and the stream stays
        open, unless the client asked for `triton_grpc_error` (then the RPC ends)."""
        grpc_error = any(k == "triton_grpc_error" and v.lower() == "true"
                         for k, v in context.invocation_metadata() or ())
        # Bounded: a client that sends faster than it reads stops being read from.
        inflight: asyncio.Queue = asyncio.Queue(maxsize=STREAM_INFLIGHT)

        async def read():
            try:
                async for msg in request_iterator:
                    await inflight.put((msg, asyncio.ensure_future(self._stream_one(msg))))
            finally:
                await inflight.put(None)

        reader = asyncio.ensure_future(read())
        pending = []
        try:
            while True:
                item = await inflight.get()
                if item is None:
                    break
                msg, task = item
                pending.append(task)
                try:
                    out = await task
                except ServerError as exc:
                    if grpc_error:
                        await context.abort(STATUS.get(exc.code, grpc.StatusCode.UNKNOWN),
                                            exc.message)
                    out = proto.ModelStreamInferResponse(error_message=exc.message)
                    out.infer_response.id = msg.id
                    out.infer_response.model_name = msg.model_name
                    out.infer_response.model_version = msg.model_version
                    out.infer_response.parameters["triton_final_response"].bool_param = True
                pending.remove(task)
                yield out
        finally:
            reader.cancel()
            while not inflight.empty():
                item = inflight.get_nowait()
                if item is not None:
                    pending.append(item[1])
            for task in pending:
                task.cancel()
            await asyncio.gather(reader, *pending, return_exceptions=True)

    async def _stream_one(self, msg):
        response = await self.dp.infer(codec.decode_model_infer_request(msg))
        try:
            out = proto.ModelStreamInferResponse()
            out.infer_response.CopyFrom(codec.encode_model_infer_response(response))
        finally:
            response.done()
        out.infer_response.parameters["triton_final_response"].bool_param = True
        return out


class HealthServicer:
    def __init__(self, dataplane: DataPlane):
        self.dp = dataplane

    async def Check(self, request):
        return proto.HealthCheckResponse(status=SERVING if self.dp.server_live() else 2)


def _handlers(service_name: str, servicer) -> grpc.GenericRpcHandler:
    table = {}
    for name, req_cls, resp_cls, client_stream, server_stream in proto.methods(service_name):
        fn = getattr(servicer, name, None)
        if fn is None:
            continue  # grpc answers UNIMPLEMENTED for methods without a handler
        if client_stream and server_stream:
            table[name] = grpc.stream_stream_rpc_method_handler(
                fn, request_deserializer=req_cls.FromString,
                response_serializer=resp_cls.SerializeToString)
        elif not client_stream and not server_stream:
            table[name] = grpc.unary_unary_rpc_method_handler(
                _unary(fn), request_deserializer=req_cls.FromString,
                response_serializer=resp_cls.SerializeToString)
    return grpc.method_handlers_generic_handler(service_name, table)


MAX_MESSAGE = 2**31 - 1


def build_server(dataplane: DataPlane) -> grpc.aio.Server:
    server = grpc.aio.server(options=[
        ("grpc.max_send_message_length", MAX_MESSAGE),
        ("grpc.max_receive_message_length", MAX_MESSAGE),
        ("grpc.so_reuseport", 0),
    ])
    server.add_generic_rpc_handlers((
        _handlers(proto.SERVICE_NAME, InferenceServicer(dataplane)),
        _handlers(proto.HEALTH_SERVICE_NAME, HealthServicer(dataplane)),
    ))
    return server
