"""HTTP routes of the system and CUDA shared-memory extensions: status, register, unregister.

Transport only: bodies are decoded here and handed to the SharedMemoryManager.
"""

import orjson

from shmserve.errors import invalid_arg
from shmserve.extensions.client_regions import SharedMemoryManager, decode_raw_handle
from shmserve.http.codec import json_object
from shmserve.http.http1_messages import Request, Response


class SharedMemoryRoutes:
    def __init__(self, manager: SharedMemoryManager):
        self.manager = manager

    async def system_status(self, request: Request):
        return _json(self.manager.system_status(_region(request)))

    async def system_register(self, request: Request):
        doc = json_object(request.body)
        self.manager.register_system(_region(request), _field(doc, "key", str),
                                     _field(doc, "offset", int, 0), _field(doc, "byte_size", int))
        return Response()

    async def system_register_unnamed(self, request: Request):
        raise invalid_arg("'region name' is necessary to register system shared memory region")

    async def cuda_register_unnamed(self, request: Request):
        raise invalid_arg("'region name' is necessary to register cuda shared memory region")

    async def system_unregister(self, request: Request):
        self.manager.unregister_system(_region(request))
        return Response()

    async def cuda_status(self, request: Request):
        return _json(self.manager.cuda_status(_region(request)))

    async def cuda_register(self, request: Request):
        doc = json_object(request.body)
        handle = _field(doc, "raw_handle", dict)
        raw = decode_raw_handle(_field(handle, "b64", str))
        self.manager.register_cuda(_region(request), raw, _field(doc, "device_id", int),
                                   _field(doc, "byte_size", int))
        return Response()

    async def cuda_unregister(self, request: Request):
        self.manager.unregister_cuda(_region(request))
        return Response()


def add_routes(router, manager: SharedMemoryManager) -> None:
    """`router`: anything with `add(method, pattern, handler)` (a Router)."""
    r = SharedMemoryRoutes(manager)
    for kind, status, register, unnamed, unregister in (
            ("system", r.system_status, r.system_register, r.system_register_unnamed,
             r.system_unregister),
            ("cuda", r.cuda_status, r.cuda_register, r.cuda_register_unnamed,
             r.cuda_unregister)):
        base = f"/v2/{kind}sharedmemory"
        region = base + "/region/{region}"
        router.add("GET", base + "/status", status)
        router.add("GET", region + "/status", status)
        router.add("POST", region + "/register", register)
        router.add("POST", base + "/register", unnamed)
        router.add("POST", base + "/unregister", unregister)
        router.add("POST", region + "/unregister", unregister)


def _region(request: Request) -> str:
    return request.match_info.get("region", "")


_MISSING = object()


def _field(doc: dict, name: str, kind: type, default=_MISSING):
    value = doc.get(name, _MISSING)
    if value is _MISSING:
        if default is _MISSING:
            raise invalid_arg(f"Shared memory register request has no '{name}' field")
        return default
    # bool is an int to Python, never to JSON
    if type(value) is not kind:
        raise invalid_arg(f"Unable to parse '{name}'")
    return value


def _json(obj) -> Response:
    return Response(200, orjson.dumps(obj), "application/json")
