"""Imports point one way.

The front, top first; a module may import its own layer and the layers below it, never one
above:

    host -> transports (http/, grpc/, openai/, model_calls.py) -> dataplane -> repository -> registry
         -> scheduling -> dispatch -> ipc

(the dataplane layer is dataplane.py and the request's way behind it: lifecycle.py,
admission.py, responses.py, and warmup.py, whose requests take that way)

Beside those layers:
- the base (errors, inference, signature, eager, proto, config/) imports only itself and ipc,
  so any layer may use it;
- fastpath/ (docs/fast-path.md) is one home for modules that serve different layers: each of
  its modules is placed in the layer it serves (FASTPATH), and none imports a transport;
- observability/ imports only itself, the base and ipc (and metrics reads the registry): it
  never imports a transport, and the request path records into it from any layer;
- extensions/ never imports host/ or a transport (their routes live with the transports, e.g.
  http/region_routes.py); the registry, everything below it, observability/ and the base never
  import an extension (dispatch/ and scheduling/ name regions through
  dispatch/memory_regions.py);
- ipc/ imports nothing of shmserve outside ipc/: it is what the workers share with the front;
- shmserve/cli.py and shmserve/server.py import only host/ (stable paths of the entry point
  and of the in-process API); nothing else imports host/.
The worker side imports only shmserve.ipc, and only workers/cuda.py imports cupy.
"""

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Top first.
LAYERS = (
    ("host", ("shmserve.host",)),
    ("transports", ("shmserve.http", "shmserve.grpc", "shmserve.openai", "shmserve.model_calls")),
    ("dataplane", ("shmserve.dataplane", "shmserve.lifecycle", "shmserve.admission",
                   "shmserve.responses", "shmserve.warmup",
                   "shmserve.fastpath.checked_templates")),
    ("repository", ("shmserve.repository",)),
    ("registry", ("shmserve.registry",)),
    ("scheduling", ("shmserve.scheduling",)),
    ("dispatch", ("shmserve.dispatch", "shmserve.fastpath.worker_loans")),
    ("ipc", ("shmserve.ipc",)),
)
BASE = ("shmserve.errors", "shmserve.inference", "shmserve.signature", "shmserve.eager",
        "shmserve.proto", "shmserve.config", "shmserve.fastpath.request_templates",
        "shmserve.fastpath.answer_loan", "shmserve.fastpath.prepared_answers",
        "shmserve.fastpath.connection_loans")
# The packages themselves (shmserve/__init__.py holds only __version__, fastpath/__init__.py
# only its docstring), base as well.
PACKAGE = ("shmserve", "shmserve.__version__", "shmserve.fastpath")
# The fast path's modules, each placed above in the layer (or the base) it serves.
FASTPATH = ("shmserve.fastpath",)
OBSERVABILITY = ("shmserve.observability",)
EXTENSIONS = ("shmserve.extensions",)
ENTRY_POINTS = ("shmserve.cli", "shmserve.server")
TRANSPORTS = dict(LAYERS)["transports"]


def _imports(path: str) -> set:
    """Modules a file imports; `from a import b` counts as both `a` and `a.b`, so that
    importing a submodule by name (`from shmserve import logs`) is seen."""
    with open(path) as f:
        tree = ast.parse(f.read())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
    return out


def _files(folder: str):
    for dirpath, _, names in os.walk(os.path.join(ROOT, folder)):
        for n in names:
            if n.endswith(".py"):
                yield os.path.join(dirpath, n)


def _layer_imports(folder: str) -> dict:
    return {os.path.relpath(p, ROOT): _imports(p) for p in _files(folder)}


def _module(path: str) -> str:
    """shmserve/http/app.py -> shmserve.http.app; a package's __init__ is the package."""
    dotted = path[:-len(".py")].replace(os.sep, ".")
    return dotted[:-len(".__init__")] if dotted.endswith(".__init__") else dotted


def _within(module: str, prefixes) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def _in_base(module: str) -> bool:
    return module in PACKAGE or _within(module, BASE)


def _front_modules() -> dict:
    """shmserve's modules -> the shmserve modules each imports."""
    return {_module(path): {m for m in mods if _within(m, ("shmserve",))}
            for path, mods in _layer_imports("shmserve").items()}


def _layer_of(module: str):
    for i, (_, prefixes) in enumerate(LAYERS):
        if _within(module, prefixes):
            return i
    return None


def test_workers_import_only_ipc_of_shmserve():
    for path, mods in _layer_imports("workers").items():
        for m in mods:
            if m.startswith("shmserve"):
                assert m.startswith("shmserve.ipc"), (path, m)
            assert not m.startswith(("grpc", "aiohttp", "google")), (path, m)
            if m.startswith("cupy"):
                assert path.endswith("cuda.py"), (path, m)


def test_front_never_imports_cupy_or_workers():
    for path, mods in _layer_imports("shmserve").items():
        for m in mods:
            assert not m.startswith(("cupy", "workers")), (path, m)


def test_every_front_module_has_a_place():
    """A new module goes into a layer or group named here (and so under its rules)."""
    placed = tuple(p for _, prefixes in LAYERS for p in prefixes) + OBSERVABILITY \
        + EXTENSIONS + ENTRY_POINTS
    for module in _front_modules():
        assert _in_base(module) or _within(module, placed), module


def test_lower_layers_do_not_import_upper_ones():
    for module, mods in _front_modules().items():
        own = _layer_of(module)
        if own is None:
            continue
        for m in mods:
            other = _layer_of(m)
            assert other is None or other >= own, (module, m, LAYERS[other][0])


def test_base_imports_only_base_and_ipc():
    for module, mods in _front_modules().items():
        if _in_base(module):
            for m in mods:
                assert _in_base(m) or _within(m, ("shmserve.ipc",)), (module, m)


def test_the_fast_path_imports_no_transport():
    for module, mods in _front_modules().items():
        if _within(module, FASTPATH):
            for m in mods:
                assert not _within(m, TRANSPORTS + ("shmserve.host",) + ENTRY_POINTS), \
                    (module, m)


def test_ipc_imports_only_ipc():
    for module, mods in _front_modules().items():
        if _within(module, ("shmserve.ipc",)):
            for m in mods:
                assert _within(m, ("shmserve.ipc",)), (module, m)


def test_observability_imports_no_transport_and_nothing_above_the_registry():
    for module, mods in _front_modules().items():
        if not _within(module, OBSERVABILITY):
            continue
        for m in mods:
            assert not _within(m, TRANSPORTS), (module, m)
            if module == "shmserve.observability.metrics" and _within(m, ("shmserve.registry",)):
                continue  # collectors read the loaded models at scrape time
            assert _in_base(m) or _within(m, OBSERVABILITY + ("shmserve.ipc",)), (module, m)


def test_extensions_import_no_transport_and_lower_layers_no_extension():
    banned = ("shmserve.host", *TRANSPORTS, *ENTRY_POINTS)
    below_extensions = ("shmserve.registry", "shmserve.scheduling", "shmserve.dispatch",
                        "shmserve.ipc", *OBSERVABILITY)
    for module, mods in _front_modules().items():
        for m in mods:
            if _within(module, EXTENSIONS):
                assert not _within(m, banned), (module, m)
            elif _in_base(module) or _within(module, below_extensions):
                assert not _within(m, EXTENSIONS), (module, m)


def test_only_the_entry_points_import_host():
    for module, mods in _front_modules().items():
        if _within(module, ("shmserve.host",)):
            continue
        for m in mods:
            if _within(m, ("shmserve.host",)):
                assert module in ENTRY_POINTS, (module, m)
    for module in ENTRY_POINTS:
        assert all(_within(m, ("shmserve.host",)) for m in _front_modules()[module]), module
