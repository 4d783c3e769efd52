"""The parallel layout ``bridge-freeze plan`` reports per-rank figures for: Megatron's own sizes and options.

Pure arithmetic (no torch). A :class:`Layout` holds what a user passes to a Megatron-Bridge run
(``--tensor-model-parallel-size`` ...): tensor (``tp``), pipeline (``pp``), virtual-pipeline (``vp``), expert
(``ep``), expert-tensor (``etp``, megatron-core's default: ``tp``) and data-parallel (``dp``) sizes, and whether
the distributed optimizer shards the optimizer state. Context parallelism is 1.

The world is ``tp * pp * dp`` ranks; megatron-core puts expert layers on ``etp * ep`` of them per pipeline
stage, data-parallel over the rest, so ``tp * dp`` must be a multiple of ``etp * ep``. Without ``--dp`` the
smallest data-parallel size the layout allows is taken (1 when ``etp * ep`` divides ``tp``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from bridge_freeze_plugin.errors import PlanError

#: The command-line spelling of each size, for messages.
_FLAGS = {
    "tp": "--tensor-model-parallel-size",
    "pp": "--pipeline-model-parallel-size",
    "vp": "--virtual-pipeline-model-parallel-size",
    "ep": "--expert-model-parallel-size",
    "etp": "--expert-tensor-parallel-size",
    "dp": "--data-parallel-size",
    "first_stage_layers": "--decoder-first-pipeline-num-layers",
    "last_stage_layers": "--decoder-last-pipeline-num-layers",
}


#: The most ranks a world may have: torch's process groups number ranks with a 32-bit integer.
MAX_WORLD_SIZE = 2**31 - 1


def _positive(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PlanError(f"{_FLAGS[name]} must be a positive integer, got {value!r}")


@dataclass(frozen=True)
class Layout:
    """Megatron's parallel sizes for one run (see the module docstring)."""

    tp: int = 1
    pp: int = 1
    vp: int | None = None
    ep: int = 1
    etp: int | None = None
    dp: int | None = None
    use_distributed_optimizer: bool = False
    #: uneven pipelines: language-model layers on the first / last stage (megatron-core's
    #: ``num_layers_in_first_pipeline_stage`` / ``..._last_...``); the rest split evenly over the others
    first_stage_layers: int | None = None
    last_stage_layers: int | None = None

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "ep"):
            _positive(name, getattr(self, name))
        for name in ("vp", "etp", "dp", "first_stage_layers", "last_stage_layers"):
            if getattr(self, name) is not None:
                _positive(name, getattr(self, name))
        if self.vp is not None and self.pp < 2:
            raise PlanError(f"{_FLAGS['vp']} {self.vp} needs a pipeline: give {_FLAGS['pp']} 2 or more "
                            f"(virtual pipeline stages interleave the stages of a pipeline)")
        sizes = " x ".join(f"{_FLAGS[n]} {getattr(self, n)}" for n in ("tp", "pp", "dp") if getattr(self, n))
        if self.tp * self.pp * (self.dp or 1) > MAX_WORLD_SIZE or self.expert_tp * self.ep > MAX_WORLD_SIZE:
            raise PlanError(f"the layout ({sizes}, expert-tensor x expert parallel {self.expert_tp} x {self.ep}) "
                            f"needs more than {MAX_WORLD_SIZE:,} GPUs, the most torch's process groups number: "
                            f"give smaller sizes")
        if self.dp is not None and (self.tp * self.dp) % (self.expert_tp * self.ep):
            raise PlanError(
                f"{_FLAGS['dp']} {self.dp} does not fit the expert layout: megatron-core needs tensor x data "
                f"parallel ({self.tp} x {self.dp}) to be a multiple of expert-tensor x expert parallel "
                f"({self.expert_tp} x {self.ep}); the smallest data-parallel size that fits is "
                f"{self.minimal_dp()}, any multiple of it works"
            )

    @property
    def expert_tp(self) -> int:
        """The expert-tensor-parallel size (megatron-core's default is the tensor-parallel size)."""
        return self.etp if self.etp is not None else self.tp

    def minimal_dp(self) -> int:
        group = self.expert_tp * self.ep
        return group // math.gcd(self.tp, group)

    @property
    def data_parallel(self) -> int:
        return self.dp if self.dp is not None else self.minimal_dp()

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.data_parallel

    @property
    def expert_data_parallel(self) -> int:
        """Ranks an expert parameter is replicated over (the distributed optimizer's group for it)."""
        return self.world_size // (self.pp * self.ep * self.expert_tp)

    @property
    def is_single_rank(self) -> bool:
        """No model parallelism: every rank holds the whole model."""
        return self.tp == self.pp == self.ep == self.expert_tp == 1 and self.vp is None

    def describe(self) -> str:
        vp = f", VP {self.vp}" if self.vp else ""
        if self.first_stage_layers or self.last_stage_layers:
            vp += f" (layers on first / last stage: {self.first_stage_layers or '-'} / {self.last_stage_layers or '-'})"
        etp = f", ETP {self.expert_tp}" if self.expert_tp != self.tp else ""
        opt = "distributed optimizer" if self.use_distributed_optimizer else "optimizer state on every DP rank"
        return (f"TP {self.tp}, PP {self.pp}{vp}, EP {self.ep}{etp}, DP {self.data_parallel} "
                f"({self.world_size} GPUs), {opt}")

    def as_dict(self) -> dict[str, Any]:
        return {
            "tensor_model_parallel_size": self.tp,
            "pipeline_model_parallel_size": self.pp,
            "virtual_pipeline_model_parallel_size": self.vp,
            "expert_model_parallel_size": self.ep,
            "expert_tensor_parallel_size": self.expert_tp,
            "data_parallel_size": self.data_parallel,
            "expert_data_parallel_size": self.expert_data_parallel,
            "world_size": self.world_size,
            "use_distributed_optimizer": self.use_distributed_optimizer,
            "decoder_first_pipeline_num_layers": self.first_stage_layers,
            "decoder_last_pipeline_num_layers": self.last_stage_layers,
        }
