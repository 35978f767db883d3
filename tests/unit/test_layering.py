"""Imports point one way: transports -> dataplane -> registry -> scheduling -> dispatch -> ipc.
The worker side imports only shmserve.ipc, and only workers/cuda.py imports cupy."""

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _imports(path: str) -> set:
    with open(path) as f:
        tree = ast.parse(f.read())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


def _files(folder: str):
    for dirpath, _, names in os.walk(os.path.join(ROOT, folder)):
        for n in names:
            if n.endswith(".py"):
                yield os.path.join(dirpath, n)


def _layer_imports(folder: str) -> dict:
    return {os.path.relpath(p, ROOT): _imports(p) for p in _files(folder)}


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


def test_lower_layers_do_not_import_upper_ones():
    upper = {
        "shmserve/ipc": ("shmserve.dispatch", "shmserve.scheduling", "shmserve.registry",
                         "shmserve.dataplane", "shmserve.http", "shmserve.grpc", "shmserve.server"),
        "shmserve/dispatch": ("shmserve.scheduling", "shmserve.registry", "shmserve.dataplane",
                              "shmserve.http", "shmserve.grpc", "shmserve.server"),
        "shmserve/scheduling": ("shmserve.registry", "shmserve.dataplane", "shmserve.http",
                                "shmserve.grpc", "shmserve.server"),
        "shmserve/config": ("shmserve.dataplane", "shmserve.http", "shmserve.grpc",
                            "shmserve.dispatch", "shmserve.server"),
    }
    for folder, banned in upper.items():
        for path, mods in _layer_imports(folder).items():
            for m in mods:
                assert not m.startswith(banned), (path, m)
    for path in ("shmserve/dataplane.py", "shmserve/registry.py"):
        for m in _imports(os.path.join(ROOT, path)):
            assert not m.startswith(("shmserve.http", "shmserve.grpc", "shmserve.server")), (path, m)
