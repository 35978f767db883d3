"""Reloading a model whose config changed only in its instance groups: the instances are
updated in place, as Triton does, rather than the version reloaded.

Triton (core src/model_repository_manager/model_lifecycle.cc, backend_model.cc) updates a
serving version in place when its files other than the config are unchanged since it loaded
and the new config differs from the serving one in `instance_group` and `version_policy` at
most. Each instance it wants is matched by a signature: its group with `name` and `count`
left out, and its device. An instance wanted reuses an unclaimed serving instance of the same
signature (the last one of the model's instance list); otherwise a new instance starts, named
`<group>_<index>` as at a full load. The serving instances nothing claimed are removed. The
version stays READY throughout: inference goes on with the instances it has while the new
ones initialize, a removed instance finishes what it holds before its `finalize`, and the
kept ones are neither initialized nor finalized again. If a new instance fails to start,
nothing changes (the ones started are stopped) and the load fails with "version N is at
READY state: <why>;".

Anything else (another field changed, a file of the version or of the model directory that
is not its config, a model directory elsewhere, an ensemble) loads the version anew beside
the serving one, as before.
"""

import logging
import os

from shmserve import proto
from shmserve.config.parse import config_path
from shmserve.repository.scan import file_marks

log = logging.getLogger("shmserve.repository")


def config_change_requires_reload(old, new) -> bool:
    """Whether two normalized ModelConfigs differ in more than their instance groups and
    version policy (Triton's ConfigChangeRequiresReload)."""
    return _without_instances(old) != _without_instances(new)


def _without_instances(config):
    copy = type(config)()
    copy.CopyFrom(config)
    copy.ClearField("instance_group")
    copy.ClearField("version_policy")
    return copy


def signature(group, device: int) -> tuple:
    """What makes two instances interchangeable: the group they come from apart from its
    `name` and `count`, and their device."""
    copy = type(group)()
    copy.CopyFrom(group)
    copy.ClearField("name")
    copy.ClearField("count")
    return device, copy.SerializeToString(deterministic=True)


class Wanted:
    """An instance a config asks for: its group, kind, device and the name a new one gets."""

    __slots__ = ("group", "kind", "device", "name", "signature")

    def __init__(self, group, kind: str, device: int, name: str):
        self.group = group
        self.kind = kind
        self.device = device
        self.name = name
        self.signature = signature(group, device)


def wanted_instances(config, kind_of) -> list:
    """Every instance `config` asks for, in the order Triton goes through them (group by
    group, then by index, then by device). Named as a full load names them: a group's
    instances are numbered across its devices (all of the first GPU's, then the next's)."""
    out = []
    for group in config.instance_group:
        kind = kind_of(group)
        devices = list(group.gpus) if kind == "GPU" else [0]
        for c in range(group.count):
            for d, device in enumerate(devices):
                out.append(Wanted(group, kind, device, f"{group.name}_{d * group.count + c}"))
    return out


def match(wanted: list, serving: list, signature_of) -> tuple:
    """(for each wanted instance, the serving instance it keeps or None for a new one;
    the serving instances left over, to remove). `serving` is in the pool's order;
    `signature_of(instance)` gives its signature. As in Triton, a wanted instance takes the
    last unclaimed serving instance of its signature."""
    by_signature: dict = {}
    for inst in serving:
        by_signature.setdefault(signature_of(inst), []).append(inst)
    chosen = []
    for want in wanted:
        same = by_signature.get(want.signature)
        chosen.append(same.pop() if same else None)
    left = {id(inst) for same in by_signature.values() for inst in same}
    return chosen, [inst for inst in serving if id(inst) in left]


def version_source(model_dir: str, version: int, config_name=None) -> tuple:
    """What a change to a version's files changes: the model directory, then the path, size
    and mtime of each file of the version's directory and of the model directory outside
    its version directories and config file (Triton's IsModelVersionModified). Bytecode
    caches and hidden entries are left out, as in poll mode."""
    model_dir = os.path.abspath(model_dir)
    config_top = os.path.relpath(config_path(model_dir, config_name), model_dir).split(os.sep)[0]
    marks = []
    try:
        tops = sorted(os.listdir(model_dir))
    except OSError:
        return (model_dir,)
    for top in tops:
        if top.startswith(".") or top == "__pycache__" or top == config_top:
            continue
        if top.isascii() and top.isdigit() and top != str(version):
            continue
        marks += file_marks(os.path.join(model_dir, top), model_dir)
    return (model_dir, *marks)


def kind_name(group) -> str:
    """An instance group's kind as "GPU" or "CPU" (KIND_AUTO and KIND_MODEL run on the CPU)."""
    fd = group.DESCRIPTOR.fields_by_name["kind"]
    name = fd.enum_type.values_by_number[group.kind].name
    return "GPU" if name == "KIND_GPU" else "CPU"


def run_gpu_groups_on_cpu(config, model_name: str) -> None:
    """With no GPU on the machine, GPU instance groups run on the CPU rather than fail
    (Triton refuses the model; running it is more useful, and the log warns)."""
    for group in config.instance_group:
        if kind_name(group) == "GPU":
            log.warning("model '%s': instance group '%s' asks for a GPU but none exists; "
                        "running it on the CPU", model_name, group.name or "(unnamed)")
            group.kind = proto.ModelInstanceGroup.KIND_CPU
            del group.gpus[:]
