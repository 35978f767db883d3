"""Custom batching strategies: a model's `batch_strategy.py`, asked by the dynamic batcher
whether each queued request may join the batch being formed.

This is the Python counterpart of Triton's batch-strategy library (its five
TRITONBACKEND_ModelBatch* entry points become five module-level functions). Like Triton's
library, the strategy runs in the server's own process (here the front, on its event loop),
not in a model instance. docs/batch_strategy.md describes it for users.
"""

import copy
import importlib.util
import itertools
import logging
import os
import re
import sys
import types

import numpy as np

from shmserve.errors import Code, ServerError
from shmserve.ipc import datatypes

log = logging.getLogger("shmserve.scheduling")

PATH_PARAMETER = "TRITON_BATCH_STRATEGY_PATH"
FILE_NAME = "batch_strategy.py"
FUNCTIONS = ("batcher_initialize", "batch_initialize", "batch_include_request",
             "batch_finalize", "batcher_finalize")

_module_ids = itertools.count(1)


class RequestView:
    """What a strategy sees of one queued request; read-only, built per include() call, so
    everything beyond the three stored references is computed only when asked for."""

    __slots__ = ("_work", "_batch_size", "_priority")

    def __init__(self, work, batch_size: int, priority: int):
        self._work = work
        self._batch_size = batch_size
        self._priority = priority

    @property
    def request_id(self) -> str:
        return self._work.request_id

    @property
    def batch_size(self) -> int:
        return self._batch_size

    @property
    def priority(self) -> int:
        return self._priority

    @property
    def parameters(self) -> types.MappingProxyType:
        return types.MappingProxyType(self._work.parameters)

    @property
    def input_names(self) -> list:
        return [i.name for i in self._work.inputs]

    def input_shape(self, name: str) -> tuple:
        return tuple(self._input(name).shape)

    def input_datatype(self, name: str) -> str:
        return self._input(name).datatype

    def input_as_numpy(self, name: str) -> np.ndarray:
        """A read-only array over the request's own bytes (BYTES: an object array of bytes).
        It is valid during the call only; copy what must outlive it."""
        tensor = self._input(name)
        if tensor.datatype == "BYTES":
            count = datatypes.element_count(tensor.shape)
            array = np.empty(count, dtype=np.object_)
            array[:] = datatypes.deserialize_bytes(tensor.data, count)
        else:
            array = np.frombuffer(tensor.data, dtype=datatypes.numpy_dtype(tensor.datatype))
        array = array.reshape(tensor.shape)
        array.flags.writeable = False
        return array

    def _input(self, name: str):
        for tensor in self._work.inputs:
            if tensor.name == name:
                return tensor
        raise KeyError(f"request '{self._work.request_id}' has no input '{name}' "
                       f"(its inputs: {', '.join(self.input_names) or 'none'})")

    def __repr__(self):
        return (f"RequestView(request_id={self.request_id!r}, batch_size={self._batch_size}, "
                f"priority={self._priority}, inputs={self.input_names})")


class BatchStrategy:
    """One model's loaded strategy. Every call into user code is guarded: an exception is
    logged and the batcher carries on (include() then answers False)."""

    def __init__(self, model_name: str, path: str, module: types.ModuleType, batcher_state):
        self.model_name = model_name
        self.path = path
        self._module = module
        self._batcher_state = batcher_state
        self._include = module.batch_include_request
        self._batch_initialize = getattr(module, "batch_initialize", None)
        self._batch_finalize = getattr(module, "batch_finalize", None)
        self._batcher_finalize = getattr(module, "batcher_finalize", None)
        self._closed = False

    @classmethod
    def find(cls, model_dir: str, version: int, config,
             config_json: dict) -> "BatchStrategy | None":
        """The model's strategy, loaded and initialized, or None when it has none."""
        path = _strategy_path(model_dir, version, config)
        if path is None:
            return None
        module = _import(path, config.name)
        try:
            _check_functions(module, path)
            initialize = getattr(module, "batcher_initialize", None)
            batcher_state = None
            if initialize is not None:
                try:
                    # A copy: the strategy may keep or change it without touching /config.
                    batcher_state = initialize(copy.deepcopy(config_json))
                except Exception as exc:
                    raise ServerError(Code.INVALID_ARG,
                                      f"batch strategy '{path}': batcher_initialize failed: "
                                      f"{type(exc).__name__}: {exc}") from exc
        except BaseException:
            sys.modules.pop(module.__name__, None)
            raise
        return cls(config.name, path, module, batcher_state)

    def start_batch(self):
        """A new batch starts forming; returns its state for include() and end_batch()."""
        if self._batch_initialize is None:
            return None
        try:
            return self._batch_initialize(self._batcher_state)
        except Exception:
            log.exception("model '%s': batch strategy '%s': batch_initialize failed",
                          self.model_name, self.path)
            return None

    def include(self, batch_state, work, batch_size: int, priority: int) -> bool:
        """Whether the queued request `work` (a WorkRequest) joins the batch being formed."""
        try:
            return bool(self._include(RequestView(work, batch_size, priority), batch_state))
        except Exception:
            log.exception("model '%s': batch strategy '%s': batch_include_request failed for "
                          "request '%s'", self.model_name, self.path, work.request_id)
            return False

    def end_batch(self, batch_state) -> None:
        """The batch is complete (sent or abandoned)."""
        if self._batch_finalize is None:
            return
        try:
            self._batch_finalize(batch_state)
        except Exception:
            log.exception("model '%s': batch strategy '%s': batch_finalize failed",
                          self.model_name, self.path)

    def close(self) -> None:
        """At unload: batcher_finalize once, then forget the module."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._batcher_finalize is not None:
                self._batcher_finalize(self._batcher_state)
        except Exception:
            log.exception("model '%s': batch strategy '%s': batcher_finalize failed",
                          self.model_name, self.path)
        finally:
            sys.modules.pop(self._module.__name__, None)
            self._batcher_state = None


def _strategy_path(model_dir: str, version: int, config) -> str | None:
    # `in` first: indexing a protobuf map inserts the missing key.
    if PATH_PARAMETER in config.parameters:
        named = config.parameters[PATH_PARAMETER].string_value
        path = os.path.join(model_dir, named)  # an absolute `named` wins
        if not os.path.isfile(path):
            raise ServerError(Code.INVALID_ARG,
                              f"batch strategy file '{path}' named by parameter "
                              f"{PATH_PARAMETER} does not exist")
        return path
    for path in (os.path.join(model_dir, str(version), FILE_NAME),
                 os.path.join(model_dir, FILE_NAME)):
        if os.path.isfile(path):
            return path
    return None


def _import(path: str, model_name: str) -> types.ModuleType:
    # A name of its own per load: two models' batch_strategy.py never meet, and a reload
    # runs the file afresh.
    tag = re.sub(r"\W", "_", model_name)
    name = f"_shmserve_batch_strategy_{tag}_{next(_module_ids)}"
    spec = importlib.util.spec_from_file_location(name, path)
    # A path ending in .py always has a spec, with a source loader.
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # Registered while it runs, as for any import (dataclasses and pickle look it up there).
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:
        sys.modules.pop(name, None)
        if not isinstance(exc, Exception):
            raise
        raise ServerError(Code.INVALID_ARG,
                          f"failed to load batch strategy '{path}': "
                          f"{type(exc).__name__}: {exc}") from exc
    return module


def _check_functions(module: types.ModuleType, path: str) -> None:
    if not hasattr(module, "batch_include_request"):
        raise ServerError(Code.INVALID_ARG,
                          f"batch strategy '{path}' defines no batch_include_request function")
    for name in FUNCTIONS:
        if hasattr(module, name) and not callable(getattr(module, name)):
            raise ServerError(Code.INVALID_ARG,
                              f"batch strategy '{path}': {name} is not a function")

