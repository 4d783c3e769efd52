"""What the run-time audit watches in one model: its tensors by part, what must not change, and which parts ran.

Made when the model is built (the bare chunks the plugin froze, before Float16Module and DDP: both keep each
parameter's identity). Which tensors train is read at the first forward (after every pre-wrap hook, a checkpoint
load, the optimizer's build), as the optimizer sees them:

- **trainable**: ``requires_grad`` parameters; the audit counts the gradients they get;
- **held**: what must hold the same contents after every optimizer step: the frozen parameters, the parameters whose
  learning rate is 0 all along (recorded by the plugin's per-part overrides), and the persistent buffers of the
  modules that hold no trainable parameter (a frozen BatchNorm's running statistics, a frozen MoE router's expert
  bias). Non-persistent buffers (token counters megatron-core resets every step) are scratch, not state;
- **modules that ran**: each module that holds parameters of its own gets a forward hook for the audited steps,
  which notes that it ran a training forward (grad enabled): a trainable tensor without a gradient whose module
  never ran is told from one whose module ran and sent nothing back, and a part none of whose modules ran got no
  input (a text-only batch never runs the vision encoder).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from bridge_freeze_plugin.prewrap import TrainingBuild, chunk_state, model_wide_names, ownership
from bridge_freeze_plugin.request import Part


@dataclass
class Tracked:
    """One parameter: its model-wide name, part, and who counts it in model-wide sums."""

    name: str
    part: Part | None
    param: Any
    chunk: int
    #: its name in its own chunk (what ``get_submodule`` finds)
    local: str = ""
    #: an MoE expert's parameter (megatron-core's ``is_expert`` linear, ``allreduce=False``, or under ``experts``): it
    #: learns only from the tokens routed to it
    expert: bool = False
    #: this rank counts its elements / the tensor itself in world-wide sums (:func:`~..prewrap.ownership`)
    counts_here: bool = True
    first_shard: bool = True
    #: this rank counts its shard of the gradient when the distributed optimizer shards it over data-parallel ranks
    shard_owner: bool = True
    #: id of the module that holds it (its forward hook notes that it ran)
    module: int = 0


@dataclass
class Watch:
    """One model's tensors, as the audit reads them (see the module docstring)."""

    tracked: list[Tracked]
    #: id(buffer) -> (model-wide name, owning module): every persistent buffer
    buffers: dict[int, tuple[str, Any]]
    #: the modules that hold parameters of their own (their forward hooks fill :attr:`ran`)
    modules: list[Any] = field(default_factory=list)
    #: ids of the buffers of modules without parameters of their own under a part the selection freezes
    frozen_by_name: set[int] = field(default_factory=set)
    #: ids of the modules that ran a training forward in the audited steps
    ran: set[int] = field(default_factory=set)
    handles: list[Any] = field(default_factory=list)
    #: ids of the trainable parameters at learning rate 0, and the parts they are in
    zero_lr: frozenset[int] = frozenset()
    zero_lr_parts: tuple[str, ...] = ()

    def remove_hooks(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles.clear()

    def part_ran(self, part: Part | None) -> bool:
        """Whether any module holding a parameter of ``part`` ran (on this rank)."""
        return any(t.module in self.ran for t in self.tracked if t.part == part)

    def trainable(self) -> list[Tracked]:
        return [t for t in self.tracked if t.param.requires_grad]

    def held_parameters(self) -> list[Tracked]:
        """The parameters that must not change: the frozen ones and those at learning rate 0."""
        return [t for t in self.tracked if not t.param.requires_grad or id(t.param) in self.zero_lr]

    def held_buffers(self) -> list[tuple[str, Any]]:
        """(name, buffer) of the persistent buffers of modules that hold no parameter that moves."""
        still = {id(t.param) for t in self.held_parameters()}
        out = []
        for buffer_id, (name, module) in self.buffers.items():
            own = list(module.parameters(recurse=False))
            if (all(id(p) in still for p in own) if own else buffer_id in self.frozen_by_name):
                out.append((name, _buffer(module, name)))
        return out


def _buffer(module: Any, name: str) -> Any:
    return module._buffers[name.rpartition(".")[2]]


def _persistent_buffers(chunk: Any) -> Iterator[tuple[str, Any, Any]]:
    """(local name, module, buffer) of every persistent buffer of ``chunk``."""
    for module_name, module in chunk.named_modules():
        skipped = getattr(module, "_non_persistent_buffers_set", set())
        for key, buffer in module._buffers.items():
            if buffer is not None and key not in skipped:
                yield (f"{module_name}.{key}" if module_name else key), module, buffer


def parallel_state() -> Any | None:
    """megatron-core's ``parallel_state`` when a multi-rank model-parallel state is up, else ``None``."""
    from bridge_freeze_plugin.ranks import world

    if world() is None:
        return None
    from megatron.core import parallel_state

    return parallel_state if parallel_state.model_parallel_is_initialized() else None


def watch_of(build: TrainingBuild) -> Watch:
    """What to watch in a freshly built model (its hooks are registered by :meth:`RunAudit`)."""
    chunks, classifier, context = build.chunks, build.classifier, build.context
    wide = model_wide_names(chunks, buffers=True)
    ps = parallel_state()
    tracked: list[Tracked] = []
    holder: dict[int, int] = {}
    experts: set[int] = set()
    modules: list[Any] = []
    for chunk in chunks:
        for module_name, module in chunk.named_modules():
            own = [p for p in module.parameters(recurse=False) if id(p) not in holder]
            if own:
                modules.append(module)
                holder.update((id(p), id(module)) for p in own)
                if getattr(module, "is_expert", False) or ".experts." in f".{module_name}.":
                    experts.update(id(p) for p in own)
    seen: set[int] = set()
    for index, chunk in enumerate(chunks):
        for local, param in chunk.named_parameters():
            if id(param) in seen:
                continue
            seen.add(id(param))
            name = wide.get(id(param), local)
            counts_here, first = ownership(param, ps) if ps is not None else (True, True)
            shard_owner = ownership(param, ps, replicas=False)[0] if ps is not None else True
            tracked.append(Tracked(name, classifier.part(local, param), param, index, local,
                                   expert=id(param) in experts or not getattr(param, "allreduce", True),
                                   counts_here=counts_here,
                                   first_shard=first, shard_owner=shard_owner, module=holder.get(id(param), 0)))
    buffers: dict[int, tuple[str, Any]] = {}
    by_name: set[int] = set()
    frozen_parts = context.selection.frozen_parts()
    for chunk in chunks:
        for local, module, buffer in _persistent_buffers(chunk):
            if id(buffer) in buffers:
                continue
            buffers[id(buffer)] = (wide.get(id(buffer), local), module)
            part = context.family.classify(local) if context.family is not None else None
            if part in frozen_parts and not any(p.requires_grad for p in module.parameters()):
                by_name.add(id(buffer))
    return Watch(tracked, buffers, modules, frozen_by_name=by_name)


def read_learning_rates(watch: Watch, chunks: list[Any]) -> None:
    """The parameters at learning rate 0, as the plugin's per-part overrides recorded them on the chunks."""
    zero: set[int] = set()
    parts: list[str] = []
    for chunk in chunks:
        state = chunk_state(chunk)
        if state is not None:
            zero |= state.zero_lr
            parts += [p for p in state.zero_lr_parts if p not in parts]
    watch.zero_lr, watch.zero_lr_parts = frozenset(zero), tuple(parts)
