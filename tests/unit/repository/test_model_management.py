"""Model management without processes: what an unload takes down, change detection for poll
mode, and the one-step swap of reloaded versions."""

import asyncio

import pytest

from shmserve import proto
from shmserve import registry as reg
from shmserve.errors import ServerError
from shmserve.repository.loader import _install, visible_gpus
from shmserve.repository.manager import ModelManager, fingerprint, models_to_unload


def ensemble(*steps):
    config = proto.ModelConfig(platform="ensemble")
    for name in steps:
        config.ensemble_scheduling.step.add(model_name=name, model_version=-1)
    return config


CONFIGS = {"a": proto.ModelConfig(), "b": proto.ModelConfig(), "c": proto.ModelConfig(),
           "e1": ensemble("a", "b"), "e2": ensemble("b", "c"), "outer": ensemble("e1")}
LOADED = set(CONFIGS)


def test_unloading_a_step_takes_down_the_ensembles_that_use_it():
    assert models_to_unload("a", CONFIGS, LOADED, LOADED, False) == ["a", "e1", "outer"]
    assert models_to_unload("c", CONFIGS, LOADED, LOADED, False) == ["c", "e2"]


def test_unload_dependents_takes_the_steps_nothing_else_uses():
    explicit = {"e1", "e2", "outer"}  # a, b and c came in as steps
    # b is still used by e2; a is not.
    assert models_to_unload("e1", CONFIGS, LOADED, explicit, True) == ["a", "e1", "outer"]
    assert models_to_unload("e1", CONFIGS, LOADED, explicit, False) == ["e1", "outer"]
    # Models loaded by name stay.
    assert models_to_unload("e1", CONFIGS, LOADED, LOADED, True) == ["e1", "outer"]


def test_unloading_a_model_that_is_not_loaded_is_just_that_model():
    assert models_to_unload("x", CONFIGS, LOADED, LOADED, True) == ["x"]


def test_fingerprint_sees_file_changes_but_not_bytecode(tmp_path):
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "model.py").write_text("a")
    (tmp_path / "config.pbtxt").write_text("x")
    before = fingerprint(str(tmp_path))
    (tmp_path / "1" / "__pycache__").mkdir()
    (tmp_path / "1" / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"\0")
    assert fingerprint(str(tmp_path)) == before
    (tmp_path / "config.pbtxt").write_text("xy")
    changed = fingerprint(str(tmp_path))
    assert changed != before
    (tmp_path / "2").mkdir()
    (tmp_path / "2" / "model.py").write_text("a")
    assert fingerprint(str(tmp_path)) != changed


class _Pool:
    ready = True
    all_alive = True


def version(number: int, state=reg.READY) -> reg.ModelVersion:
    mv = reg.ModelVersion(name="m", version=number, config=None, config_json={},
                          signature=None, platform="python", state=state)
    if state == reg.READY:  # a loaded version has its instances and its scheduler
        mv.pool = _Pool()
        mv.scheduler = object()
    return mv


def test_install_swaps_in_one_step_and_returns_the_replaced_versions():
    rec = reg.ModelRecord("m")
    old1, old2 = version(1), version(2)
    rec.versions = {1: old1, 2: old2}
    new2, new3 = version(2), version(3)
    retired = _install(rec, [new2, new3])
    assert rec.versions == {1: old1, 2: new2, 3: new3}
    assert sorted(mv.version for mv in retired) == [1, 2]
    assert old1 in retired and old2 in retired
    assert old1.state == old2.state == reg.UNLOADING  # no new request reaches them
    assert not old1.ready


def test_a_failed_reload_keeps_the_serving_version():
    rec = reg.ModelRecord("m")
    old = version(1)
    rec.versions = {1: old}
    failed = version(1, reg.UNAVAILABLE)
    assert _install(rec, [failed]) == []
    assert rec.versions == {1: old} and old.state == reg.READY


class _Loader:
    repositories = ["/nonexistent"]


@pytest.mark.parametrize("mode", ["none", "poll"])
def test_load_and_unload_are_refused_unless_explicit(mode):
    manager = ModelManager(reg.Registry(), _Loader(), mode=mode)
    for call in (manager.load("m"), manager.unload("m")):
        with pytest.raises(ServerError, match="not allowed if polling is enabled"):
            asyncio.run(call)


def test_model_files_need_a_config():
    manager = ModelManager(reg.Registry(), _Loader(), mode="explicit")
    with pytest.raises(ServerError, match="'config'"):
        asyncio.run(manager.load("m", None, {"file:1/model.py": b""}))


@pytest.mark.parametrize("env, visible", [
    (None, 4), ("", 0), ("0,1", 2), ("3", 1), ("1,7,2", 1), ("-1", 0), ("0,x,1", 1),
    ("GPU-5a3c2e7d-0000-0000-0000-000000000000", 1), ("0,1,2,3,0", 4),
])
def test_cuda_visible_devices_decides_how_many_gpus_instances_are_placed_on(env, visible):
    assert visible_gpus(4, env) == visible
