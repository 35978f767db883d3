"""Which reloads update a version's instances in place, and which instances they keep, start
and remove (shmserve/repository/instances.py), as Triton decides."""

import os

from shmserve.config.normalize import normalize_config
from shmserve.config.parse import parse_config_text
from shmserve.repository.instances import (config_change_requires_reload, kind_name, match,
                                           version_source, wanted_instances)

BASE = '''
name: "m"
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
'''


def config(extra: str, gpus: int = 0):
    return normalize_config(parse_config_text(BASE + extra), "m", gpus)


def test_only_instance_groups_and_version_policy_may_differ():
    two = config("instance_group [ { count: 2 kind: KIND_CPU } ]")
    assert not config_change_requires_reload(two, config(
        'instance_group [ { name: "other" count: 5 kind: KIND_CPU } ]'
        "version_policy { all { } }"))
    assert config_change_requires_reload(two, config(
        "instance_group [ { count: 2 kind: KIND_CPU } ] dynamic_batching { }"))
    assert config_change_requires_reload(two, config(
        'instance_group [ { count: 2 kind: KIND_CPU } ] parameters { key: "k" value { '
        'string_value: "v" } }'))


class Serving:
    def __init__(self, name, want):
        self.name = name
        self.signature = want.signature


def serving(cfg, names=None) -> list:
    wanted = wanted_instances(cfg, kind_name)
    return [Serving(names[i] if names else w.name, w) for i, w in enumerate(wanted)]


def names(chosen, wanted):
    return [inst.name if inst is not None else "new " + want.name
            for inst, want in zip(chosen, wanted)]


def test_a_wanted_instance_keeps_the_last_serving_one_of_its_kind():
    two = serving(config("instance_group [ { count: 2 kind: KIND_CPU } ]"))
    assert [s.name for s in two] == ["m_0_0", "m_0_1"]
    wanted = wanted_instances(config("instance_group [ { count: 3 kind: KIND_CPU } ]"), kind_name)
    chosen, removed = match(wanted, two, lambda s: s.signature)
    assert names(chosen, wanted) == ["m_0_1", "m_0_0", "new m_0_2"] and removed == []
    # Triton's order afterwards: the kept ones as claimed, then the new one.
    three = [two[1], two[0], Serving("m_0_2", wanted[2])]
    wanted = wanted_instances(config("instance_group [ { count: 1 kind: KIND_CPU } ]"), kind_name)
    chosen, removed = match(wanted, three, lambda s: s.signature)
    assert names(chosen, wanted) == ["m_0_2"]
    assert [s.name for s in removed] == ["m_0_1", "m_0_0"]


def test_group_names_and_counts_do_not_tell_instances_apart_but_other_fields_do():
    cpu = serving(config('instance_group [ { name: "a" count: 1 kind: KIND_CPU }, '
                         '{ name: "b" count: 2 kind: KIND_CPU } ]'))
    wanted = wanted_instances(config('instance_group [ { name: "c" count: 3 kind: KIND_CPU } ]'),
                              kind_name)
    chosen, removed = match(wanted, cpu, lambda s: s.signature)
    assert None not in chosen and removed == []  # the instances keep their names: a_0, b_0, b_1
    wanted = wanted_instances(config(
        'instance_group [ { count: 3 kind: KIND_CPU rate_limiter { resources [ { name: "R" '
        'count: 2 } ] } } ]'), kind_name)
    chosen, removed = match(wanted, cpu, lambda s: s.signature)
    assert chosen == [None] * 3 and len(removed) == 3


def test_gpu_instances_are_told_apart_by_device_and_numbered_across_devices():
    cfg = config("instance_group [ { count: 2 kind: KIND_GPU gpus: [ 0, 1 ] } ]", gpus=2)
    wanted = wanted_instances(cfg, kind_name)
    assert [(w.name, w.device) for w in wanted] == [
        ("m_0_0", 0), ("m_0_2", 1), ("m_0_1", 0), ("m_0_3", 1)]
    assert wanted[0].signature == wanted[2].signature != wanted[1].signature


def test_version_source_sees_the_version_and_shared_files_but_not_the_config(tmp_path):
    model = tmp_path / "m"
    for path in ("config.pbtxt", "1/model.py", "2/model.py", "labels.txt"):
        os.makedirs(model / os.path.dirname(path), exist_ok=True)
        (model / path).write_text("x")
    (model / "1" / "__pycache__").mkdir()
    first = version_source(str(model), 1)
    (model / "config.pbtxt").write_text("changed")
    (model / "2" / "model.py").write_text("changed")
    (model / "1" / "__pycache__" / "model.pyc").write_text("bytecode")
    assert version_source(str(model), 1) == first
    (model / "labels.txt").write_text("changed")
    second = version_source(str(model), 1)
    assert second != first
    (model / "1" / "model.py").write_text("changed")
    assert version_source(str(model), 1) != second
    assert version_source(str(tmp_path / "elsewhere"), 1) != second
