"""A Python model's own execution environment, as Triton's Python backend takes it: the model
parameter EXECUTION_ENV_PATH names a packed environment (a conda-pack or venv archive,
`.tar.gz`) or a folder holding one, `$$TRITON_MODEL_DIRECTORY` standing for the model's folder.
An archive is unpacked once into a scratch folder of the server (ipc/scratch.py: removed as the
server stops, or by whoever outlives it), and again when its file changes; a folder is used
where it is. The environment must hold `bin/activate` (Triton's check) and an
interpreter of the server's Python version: the model's workers (and its auto-complete) run
that interpreter, with the environment's packages before the server's
(dispatch/worker_process.py).

An archive is unpacked as tar does it (the 'tar' filter: no absolute paths, no setuid bits),
not as untrusted data: an environment's links may point anywhere, as a venv's interpreter does,
and the model's own code runs in it anyway.
"""

import glob
import logging
import os
import shutil
import sys
import tarfile
import threading

from shmserve.dispatch.worker_process import PythonEnvironment, code_root
from shmserve.errors import internal
from shmserve.ipc import scratch

log = logging.getLogger("shmserve.repository")

PARAMETER = "EXECUTION_ENV_PATH"
MODEL_DIRECTORY = "$$TRITON_MODEL_DIRECTORY"


def requested_path(config, model_dir: str) -> str:
    """The environment a model's config asks for ("" for none): only Python models (and
    Python-based backends, which run as Python models) have one."""
    if config.platform == "ensemble" or (config.backend in ("onnxruntime", "pytorch")
                                         and not config.runtime):
        return ""
    parameter = config.parameters.get(PARAMETER)
    if parameter is None or not parameter.string_value:
        return ""
    return parameter.string_value.replace(MODEL_DIRECTORY, model_dir)


class PythonEnvironments:
    """The environments the repository's models use, unpacked once each, and removed when the
    server stops (`close`)."""

    def __init__(self):
        self._base = ""  # the server's scratch folder for them, made at the first use
        self._unpacked: dict = {}  # real path -> (folder, mtime_ns)
        self._count = 0
        self._closed = False
        self._lock = threading.Lock()  # prepare() runs in threads

    def prepare(self, path: str) -> PythonEnvironment:
        """The environment at `path`, unpacked if it is an archive; ServerError (INTERNAL, in
        Triton's words where it has them) if it cannot serve. Blocking: run it in a thread."""
        real = os.path.realpath(path)
        if not os.path.exists(real):
            raise internal(f"Failed to get the canonical path for {path}.")
        root = real if os.path.isdir(real) else self._unpack(real)
        activate = os.path.join(root, "bin", "activate")
        if not os.path.exists(activate):
            raise internal(f"Path {activate} does not exist. The Python environment should "
                           "contain an 'activate' script.")
        with self._lock:
            code = os.path.join(self._scratch(), "code")
        return PythonEnvironment(root, _interpreter(root, path), code)

    def _scratch(self) -> str:
        """The scratch folder, made with the links to the server's code at the first use
        (under the lock)."""
        if self._closed:
            raise internal("the server is stopping")
        if not self._base:
            self._base = scratch.make_folder(os.getpid())
            code = os.path.join(self._base, "code")
            os.mkdir(code)
            for package in ("shmserve", "workers"):
                os.symlink(os.path.join(code_root(), package), os.path.join(code, package))
        return self._base

    def _unpack(self, archive: str) -> str:
        mtime = os.stat(archive).st_mtime_ns
        with self._lock:
            known = self._unpacked.get(archive)
            if known is not None and known[1] == mtime:
                return known[0]
            # A changed archive goes to a folder of its own: workers of the version still
            # serving may run from the old one, which stays until the server stops.
            folder = os.path.join(self._scratch(), str(self._count))
            self._count += 1
            os.mkdir(folder)
            log.info("unpacking Python execution environment %s into %s", archive, folder)
            try:
                with tarfile.open(archive) as tar:
                    tar.extractall(folder, filter="tar")
            except (tarfile.TarError, OSError, ValueError) as exc:
                shutil.rmtree(folder, ignore_errors=True)
                raise internal(f"failed to extract Python execution environment {archive}: "
                               f"{exc}") from None
            self._unpacked[archive] = (folder, mtime)
            return folder

    def close(self) -> None:
        """Remove what was unpacked; no environment is prepared after this. Blocking (an
        unpacking under way is waited for): run it in a thread."""
        with self._lock:
            self._closed = True
            if self._base:
                shutil.rmtree(self._base, ignore_errors=True)
            self._base = ""
            self._unpacked.clear()


def _interpreter(root: str, path: str) -> str:
    """The environment's interpreter; ServerError if it has none of this server's version (the
    workers run the server's code and, for what the environment lacks, its packages)."""
    ours = f"python{sys.version_info.major}.{sys.version_info.minor}"
    found = glob.glob(os.path.join(root, "lib", "python[0-9]*"))
    versions = sorted(os.path.basename(p) for p in found if os.path.isdir(p))
    if versions and ours not in versions:
        raise internal(f"the Python execution environment {path} holds "
                       f"{', '.join(versions)}; this server's workers need {ours}")
    for name in (ours, "python3", "python"):
        python = os.path.join(root, "bin", name)
        if os.access(python, os.X_OK):
            return python
    raise internal(f"the Python execution environment {path} has no bin/{ours} or bin/python3")

