"""An ensemble's plan (`platform: "ensemble"`): its steps validated once, at load, with
Triton's messages, and what a request needs of them (which steps feed which, which can be left
out for the outputs a request asks for). shmserve/scheduling/ensemble.py runs requests by it.
"""

from dataclasses import dataclass, field
from typing import Callable

from shmserve.config.normalize import WILDCARD_DIM
from shmserve.errors import invalid_arg
from shmserve.proto import DataType, ModelInstanceGroup


@dataclass(slots=True)
class Step:
    index: int
    model_name: str
    model_version: str  # "" for the latest ready version (-1 in the config)
    input_map: dict  # model input -> ensemble tensor
    output_map: dict  # model output -> ensemble tensor
    batching: bool
    input_dims: dict  # model input -> dims in the model's config (without the batch dim)
    decoupled: bool
    # Model outputs its instance keeps on the GPU, if made there: only GPU steps read them.
    device_outputs: tuple = ()


@dataclass
class EnsemblePlan:
    name: str
    batching: bool
    steps: list  # of Step
    inputs: tuple  # ensemble input names
    output_dims: dict  # ensemble output -> dims in the ensemble's config
    producer: dict  # tensor -> index of the step that writes it
    consumers: dict  # tensor -> indexes of the steps that read it
    decoupled: bool
    max_inflight: int = 0
    # requested outputs -> (the steps they need, each tensor's number of uses)
    _pruned: dict = field(default_factory=dict)

    @property
    def composing_models(self) -> frozenset:
        return frozenset(step.model_name for step in self.steps)

    @staticmethod
    def build(config, step_config: Callable) -> "EnsemblePlan":
        """Validate the ensemble `config`; `step_config(model_name, version)` gives the config
        of a step's model (version -1: the latest) or raises why it cannot. INVALID_ARG with
        Triton's message for an ensemble that cannot run."""
        name = config.name
        _graph(config)
        batching = config.max_batch_size > 0
        shapes = {}  # tensor -> (data type, dims, full dims, model it is inferred from)
        for t in config.input:
            dims = list(t.reshape.shape) if t.HasField("reshape") else list(t.dims)
            shapes[t.name] = _node(t.data_type, dims, batching, name)
        for t in config.output:
            dims = list(t.reshape.shape) if t.HasField("reshape") else list(t.dims)
            shapes[t.name] = _node(t.data_type, dims, batching, name)
        plan_steps = []
        on_gpu = set()  # indexes of the steps whose model has only GPU instances
        for index, step in enumerate(config.ensemble_scheduling.step):
            model = step_config(step.model_name, step.model_version)
            plan_steps.append(_check_step(name, config.max_batch_size, index, step, model,
                                          shapes))
            if model.instance_group and all(g.kind == ModelInstanceGroup.KIND_GPU
                                            for g in model.instance_group):
                on_gpu.add(index)
        decoupled = _decoupled_flow(name, config, plan_steps)
        producer = {}
        consumers: dict = {}
        for s in plan_steps:
            for tensor in s.output_map.values():
                producer[tensor] = s.index
            for tensor in dict.fromkeys(s.input_map.values()):
                consumers.setdefault(tensor, []).append(s.index)
        outputs = {t.name for t in config.output}
        for s in plan_steps:
            s.device_outputs = tuple(
                o for o, tensor in s.output_map.items()
                if tensor not in outputs and tensor in consumers
                and on_gpu.issuperset(consumers[tensor]))
        return EnsemblePlan(
            name=name, batching=batching, steps=plan_steps,
            inputs=tuple(t.name for t in config.input),
            output_dims={t.name: list(t.reshape.shape) if t.HasField("reshape")
                         else list(t.dims) for t in config.output},
            producer=producer, consumers={k: tuple(v) for k, v in consumers.items()},
            decoupled=decoupled,
            max_inflight=config.ensemble_scheduling.max_inflight_requests)

    def pruned(self, requested: tuple) -> tuple:
        """(indexes of the steps the requested outputs need, uses of each tensor by those
        steps and by the response); as Triton, steps no requested output needs do not run."""
        found = self._pruned.get(requested)
        if found is not None:
            return found
        needed = set()
        todo = [self.producer[t] for t in requested if t in self.producer]
        while todo:
            index = todo.pop()
            if index in needed:
                continue
            needed.add(index)
            todo.extend(self.producer[t] for t in self.steps[index].input_map.values()
                        if t in self.producer)
        uses = dict.fromkeys(requested, 1)
        for tensor, readers in self.consumers.items():
            uses[tensor] = uses.get(tensor, 0) + sum(1 for i in readers if i in needed)
        found = self._pruned[requested] = (frozenset(needed), uses)
        return found


def _graph(config) -> None:
    """Triton's checks of the dataflow alone (no step model needed)."""
    name = config.name
    steps = config.ensemble_scheduling.step
    if not steps:
        raise invalid_arg(f"must specify 'step' for ensemble '{name}'")
    inputs = {t.name for t in config.input}
    written = {}  # tensor -> step index
    for index, step in enumerate(steps):
        for field_name in ("model_name", "input_map", "output_map"):
            if not getattr(step, field_name):
                raise invalid_arg(f"must specify '{field_name}' in step {index} of ensemble "
                                  f"'{name}'")
        for tensor in step.output_map.values():
            if tensor in written or tensor in inputs:
                raise invalid_arg(f"ensemble tensor '{tensor}' can appear in an output map only "
                                  f"once for ensemble '{name}' step {index}"
                                  + (" (it is an ensemble input)" if tensor in inputs else ""))
            written[tensor] = index
    _check_acyclic(name, steps, written)
    read = {t for step in steps for t in step.input_map.values()}
    for t in config.input:
        if t.name not in read:
            raise invalid_arg(f"ensemble input '{t.name}' for ensemble '{name}' is not used")
    ready = _flow(steps, inputs)
    outputs = set()
    for t in config.output:
        if t.name not in read and t.name not in written:
            raise invalid_arg(f"ensemble output '{t.name}' for ensemble '{name}' is not used")
        if t.name not in ready:
            raise invalid_arg(f"output '{t.name}' for ensemble '{name}' is not written")
        outputs.add(t.name)
    for tensor in sorted(read | set(written)):
        if tensor not in outputs and (tensor not in ready or tensor not in read):
            raise invalid_arg(f"ensemble tensor '{tensor}' is unused in ensemble '{name}'")


def _check_acyclic(name: str, steps, written: dict) -> None:
    after = {i: {written[t] for t in step.input_map.values() if t in written}
             for i, step in enumerate(steps)}  # step -> the steps it waits for
    state = {}  # step -> 1 while on the path, 2 when done

    def visit(index, path):
        state[index] = 1
        for before in sorted(after[index]):
            if state.get(before) == 1:
                cycle = path[path.index(before):] + [before]
                raise invalid_arg(f"ensemble '{name}' has a cycle: " + " -> ".join(
                    f"step {i} ('{steps[i].model_name}')" for i in cycle))
            if before not in state:
                visit(before, path + [before])
        state[index] = 2

    for index in range(len(steps)):
        if index not in state:
            visit(index, [index])


def _flow(steps, inputs: set) -> set:
    """The tensors that get a value when every ensemble input has one."""
    ready = set(inputs)
    pending = list(steps)
    progress = True
    while progress:
        progress = False
        for step in list(pending):
            if all(t in ready for t in step.input_map.values()):
                ready.update(step.output_map.values())
                pending.remove(step)
                progress = True
    return ready


@dataclass(slots=True)
class _Node:
    data_type: int
    dims: list
    full_dims: list
    model: str


def _node(data_type: int, dims: list, batching: bool, model: str) -> _Node:
    return _Node(data_type, dims, ([WILDCARD_DIM] if batching else []) + dims, model)


def _check_step(ensemble: str, max_batch_size: int, index: int, step, model,
                shapes: dict) -> Step:
    """Triton's ValidateTensorMapping: the step's maps against its model's config."""
    where = f"in ensemble {ensemble}"
    step_name = step.model_name
    if model.max_batch_size != 0 and model.max_batch_size < max_batch_size:
        raise invalid_arg(f"ensemble {ensemble} allows maximum batch size {max_batch_size}, "
                          f"but it contains model {step_name} which only allows maximum batch "
                          f"size to be {model.max_batch_size}")
    batching = model.max_batch_size > 0
    model_inputs = {t.name: t for t in model.input}
    for model_input, tensor in step.input_map.items():
        if model_input not in model_inputs:
            raise invalid_arg(f"{where}, ensemble tensor {tensor} is mapping to non-existing "
                              f"input {model_input} in model {step_name}")
    for t in model.input:
        tensor = step.input_map.get(t.name)
        if tensor is None:
            if t.optional:
                continue
            raise invalid_arg(f"{where}, input {t.name} in model {step_name} is not mapped to "
                              f"any ensemble tensors")
        _agree(where, tensor, shapes, _node(t.data_type, list(t.dims), batching, step_name))
    model_outputs = {t.name: t for t in model.output}
    for model_output, tensor in step.output_map.items():
        t = model_outputs.get(model_output)
        if t is None:
            raise invalid_arg(f"{where}, ensemble tensor {tensor} is mapped from non-existing "
                              f"output {model_output} in model {step_name}")
        _agree(where, tensor, shapes, _node(t.data_type, list(t.dims), batching, step_name))
    return Step(index=index, model_name=step_name,
                model_version="" if step.model_version < 0 else str(step.model_version),
                input_map=dict(step.input_map), output_map=dict(step.output_map),
                batching=batching, input_dims={t.name: list(t.dims) for t in model.input},
                decoupled=model.model_transaction_policy.decoupled)


def _agree(where: str, tensor: str, shapes: dict, node: _Node) -> None:
    known = shapes.get(tensor)
    if known is None:
        shapes[tensor] = node
        return
    if known.data_type != node.data_type:
        raise invalid_arg(f"{where}, ensemble tensor {tensor}: inconsistent data type: "
                          f"{DataType.Name(known.data_type)} is inferred from model "
                          f"{known.model} while {DataType.Name(node.data_type)} is inferred "
                          f"from model {node.model}")
    # A tensor may pass between a batching and a non-batching model when the full shapes
    # (batch dimension included) agree.
    if not (dims_agree(known.dims, node.dims) or dims_agree(known.full_dims, node.full_dims)):
        raise invalid_arg(f"{where}, ensemble tensor {tensor}: inconsistent shape: "
                          f"{_fmt(known.full_dims)} is inferred from model {known.model} while "
                          f"{_fmt(node.full_dims)} is inferred from model {node.model}")


def dims_agree(a: list, b: list) -> bool:
    return len(a) == len(b) and all(x == y or WILDCARD_DIM in (x, y) for x, y in zip(a, b))


def _decoupled_flow(name: str, config, steps: list) -> bool:
    """Whether the ensemble is decoupled (a step is); a step may not take inputs that come
    from different decoupled steps (their responses could not be paired)."""
    label = dict.fromkeys((t.name for t in config.input), 0)  # tensor -> decoupled origin
    labels = 0
    pending = list(steps)
    while pending:
        for step in list(pending):
            tensors = list(step.input_map.values())
            if not all(t in label for t in tensors):
                continue
            origins = {label[t] for t in tensors}
            if len(origins) > 1:
                raise invalid_arg(f"in ensemble {name}, step of model '{step.model_name}' "
                                  f"receives inputs originated from different decoupled models")
            origin = origins.pop()
            if step.decoupled:
                labels += 1
                origin = labels
            for t in step.output_map.values():
                label[t] = origin
            pending.remove(step)
    return labels > 0


def _fmt(dims) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"
