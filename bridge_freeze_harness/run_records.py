"""What a test reads back from a run of Bridge's real ``pretrain()`` / ``finetune()``: a callback and checkpoints.

- :class:`Recorder`: a Bridge callback (``pretrain(cfg, step, callbacks=[recorder])``) that records, when training
  starts, the parameters each DDP gradient buffer holds, every parameter's initial value, and the optimizer's
  parameter groups (learning rates and the names of the model parameters in each group); and the loss of each step.
- :func:`read_checkpoint`: one ``torch_dist`` checkpoint directory (``iter_0000004``) as a flat dict, read with
  torch's own ``dcp_to_torch_save`` (no process group needed); :func:`model_tensors` keeps its model tensors.

Names are the model's own (``language_model.decoder.layers.0...``), without the ``module.`` prefixes the DDP and
mixed-precision wrappers add. Who imports this package, and why: :mod:`bridge_freeze_harness`.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

_WRAPPER_PREFIX = re.compile(r"^(module\.)+")
#: Checkpoint entries that are not model tensors.
_NOT_MODEL = ("optimizer.", "rng_state", "common_state")


def bare_name(name: str) -> str:
    """A parameter name without the wrappers' ``module.`` prefixes."""
    return _WRAPPER_PREFIX.sub("", name)


def named_parameters(chunks: list[Any]) -> dict[str, torch.nn.Parameter]:
    return {bare_name(n): p for chunk in chunks for n, p in chunk.named_parameters()}


@dataclass
class OptimizerGroup:
    max_lr: float
    min_lr: float
    lr: float
    names: frozenset[str]


def _groups_with_model_params(optimizer: Any) -> Iterator[tuple[dict[str, Any], list[torch.nn.Parameter]]]:
    """Each param group of a megatron-core optimizer with the MODEL parameters it updates.

    A distributed optimizer's groups hold shards (``model_float16_groups`` / ``model_fp32_groups`` name the model
    parameters, same order); a mixed-precision one's hold fp32 copies of the bf16 parameters.
    """
    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        groups = opt.optimizer.param_groups
        if hasattr(opt, "model_fp32_groups"):
            members = [[*a, *b] for a, b in zip(opt.model_float16_groups, opt.model_fp32_groups, strict=True)]
        elif hasattr(opt, "float16_groups"):
            members = [[*a, *b] for a, b in zip(opt.float16_groups, opt.fp32_from_fp32_groups, strict=True)]
        else:
            members = [list(group["params"]) for group in groups]
        yield from zip(groups, members, strict=True)


@dataclass
class Recorder:
    """A Bridge callback (duck-typed: Bridge registers any object's ``on_<event>`` methods)."""

    grad_buffer_names: set[str] = field(default_factory=set)
    grad_buffer_numel: int = 0
    initial: dict[str, torch.Tensor] = field(default_factory=dict)
    groups: list[OptimizerGroup] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)

    def on_train_start(self, context: Any) -> None:
        params = named_parameters(context.model)
        by_id = {id(p): n for n, p in params.items()}
        for chunk in context.model:
            for buffer in [*chunk.buffers, *chunk.expert_parallel_buffers]:
                self.grad_buffer_names |= {by_id[id(p)] for p in buffer.params}
                self.grad_buffer_numel += int(buffer.numel_unpadded)
        self.initial = {n: p.detach().clone() for n, p in params.items()}
        for group, members in _groups_with_model_params(context.optimizer):
            self.groups.append(OptimizerGroup(float(group["max_lr"]), float(group["min_lr"]), float(group["lr"]),
                                              frozenset(by_id[id(p)] for p in members)))

    def on_train_step_end(self, context: Any) -> None:
        loss = next(iter(context.loss_dict.values()), None) if context.loss_dict else None
        if loss is not None:
            self.losses.append(float(loss))

    def group_of(self, name: str) -> OptimizerGroup:
        (group,) = [g for g in self.groups if name in g.names]
        return group


def read_checkpoint(iteration_dir: str | Path) -> dict[str, Any]:
    """Every entry of a ``torch_dist`` checkpoint directory, flat, on the CPU."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    with tempfile.TemporaryDirectory() as tmp:
        target = Path(tmp) / "checkpoint.pt"
        dcp_to_torch_save(str(iteration_dir), str(target))
        return torch.load(target, weights_only=False)


def model_tensors(checkpoint: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The model's tensors of a checkpoint read by :func:`read_checkpoint` (no optimizer, RNG, extra state)."""
    return {k: v for k, v in checkpoint.items()
            if torch.is_tensor(v) and not k.startswith(_NOT_MODEL) and "_extra_state" not in k}


def iteration_dir(save_dir: str | Path, iteration: int) -> Path:
    """Bridge's directory for ``iteration`` under ``checkpoint.save``."""
    return Path(save_dir) / f"iter_{iteration:07d}"
