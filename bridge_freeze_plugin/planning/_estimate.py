"""The estimate behind ``bridge-freeze plan``: per-parameter records in, per-part counts and bytes out.

Pure arithmetic (no torch, no Bridge), on the records :func:`collect_params` reads off a built model. What a
training run holds per part:

- **weights**: every parameter, frozen or not (``param_dtype`` bytes each);
- **gradient buffer**: Megatron's DDP keeps one ``main_grad`` per *trainable* parameter
  (``grad_dtype`` bytes: fp32 by default, as with ``grad_reduce_in_fp32``); frozen ones get none;
- **optimizer state** per trainable parameter: an fp32 master copy when ``param_dtype`` is not
  fp32 (mixed precision), plus Adam's ``exp_avg`` and ``exp_avg_sq`` (``adam``) or the momentum
  buffer (``sgd``), in ``state_dtype`` (fp32 by default). bf16 weights + Adam: 4 + 4 + 4 = 12 bytes.
  Megatron's distributed optimizer shards this state (master copy included) over the
  data-parallel ranks: ``dp_size`` divides it (the gradient buffer is not sharded).

Part counts are for the whole model (tensor / pipeline / expert parallel size 1); the per-part counting is
:mod:`bridge_freeze_plugin.prewrap._counting`'s. What each GPU holds under a parallel layout (``Plan.per_rank``) comes
from real per-rank builds (:mod:`.per_rank`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from bridge_freeze_plugin.errors import PlanError
from bridge_freeze_plugin.families import FamilySpec
from bridge_freeze_plugin.planning._save_size import save_size
from bridge_freeze_plugin.prewrap import PartCount, PartTally
from bridge_freeze_plugin.request import INFO, FreezeSelection, Part

#: Version of the ``--json`` document (bumped on any incompatible change; see docs/cli.md).
SCHEMA_VERSION = 1

#: Bytes per element of the dtypes the estimate understands.
DTYPE_BYTES: dict[str, int] = {"fp32": 4, "bf16": 2, "fp16": 2}

#: Optimizer -> number of per-parameter state tensors (besides the fp32 master copy).
OPTIMIZERS: dict[str, int] = {"adam": 2, "sgd": 1}
_STATE_NAMES = {"adam": "exp_avg + exp_avg_sq", "sgd": "momentum buffer"}

#: The counts a part's ``--json`` entry carries (besides ``part``, ``frozen`` and the bytes).
_COUNT_KEYS = ("trainable", "total", "trainable_tensors", "total_tensors")


@dataclass(frozen=True)
class MemoryAssumptions:
    """Precisions and optimizer the byte estimates assume (all overridable from the command line)."""

    param_dtype: str = "bf16"
    grad_dtype: str = "fp32"
    optimizer: str = "adam"
    state_dtype: str = "fp32"
    dp_size: int = 1

    def __post_init__(self) -> None:
        for attr in ("param_dtype", "grad_dtype", "state_dtype"):
            value = getattr(self, attr)
            if value not in DTYPE_BYTES:
                raise PlanError(f"{attr} must be one of {', '.join(DTYPE_BYTES)}, got {value!r}")
        if self.optimizer not in OPTIMIZERS:
            raise PlanError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {self.optimizer!r}")
        if isinstance(self.dp_size, bool) or not isinstance(self.dp_size, int) or self.dp_size < 1:
            raise PlanError(f"dp_size must be a positive integer, got {self.dp_size!r}")

    @property
    def param_bytes(self) -> int:
        return DTYPE_BYTES[self.param_dtype]

    @property
    def grad_bytes(self) -> int:
        return DTYPE_BYTES[self.grad_dtype]

    @property
    def master_bytes(self) -> int:
        """The fp32 master copy mixed precision keeps (none when the weights are fp32 already)."""
        return 0 if self.param_dtype == "fp32" else DTYPE_BYTES["fp32"]

    @property
    def state_bytes(self) -> int:
        """The optimizer's own state tensors' bytes per trainable parameter (Adam's two moments, SGD's momentum)."""
        return OPTIMIZERS[self.optimizer] * DTYPE_BYTES[self.state_dtype]

    @property
    def optimizer_bytes(self) -> int:
        """Optimizer state bytes per trainable parameter, before data-parallel sharding."""
        return self.master_bytes + self.state_bytes

    def describe(self) -> str:
        master = "" if not self.master_bytes else "fp32 master weights + "
        shard = (
            f", optimizer state sharded over {self.dp_size} data-parallel ranks (distributed optimizer)"
            if self.dp_size > 1
            else ", optimizer state on one data-parallel rank (--dp-size N: distributed optimizer over N)"
        )
        return (
            f"{self.param_dtype} weights ({self.param_bytes} B/param), {self.grad_dtype} gradient buffer "
            f"({self.grad_bytes} B/trainable param), {self.optimizer} with {master}{self.state_dtype} "
            f"{_STATE_NAMES[self.optimizer]} ({self.optimizer_bytes} B/trainable param){shard}"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "param_dtype": self.param_dtype,
            "grad_dtype": self.grad_dtype,
            "optimizer": self.optimizer,
            "optimizer_state_dtype": self.state_dtype,
            "master_weights_dtype": "fp32" if self.master_bytes else None,
            "dp_size": self.dp_size,
            "bytes_per_param": {
                "weights": self.param_bytes,
                "grad": self.grad_bytes,
                "optimizer": self.optimizer_bytes,
            },
            "description": self.describe(),
        }


@dataclass(frozen=True)
class ParamInfo:
    """One parameter of the planned model: its name, part, trainability and size."""

    name: str
    part: Part
    trainable: bool
    numel: int
    shape: tuple[int, ...]
    #: a LoRA adapter (added by the PEFT hook), not a base weight
    adapter: bool = False

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "part": self.part.value,
            "trainable": self.trainable,
            "numel": self.numel,
            "shape": list(self.shape),
        }
        if self.adapter:
            out["adapter"] = True
        return out


def collect_params(model: Any, family: FamilySpec, base_names: frozenset[str] | None = None) -> list[ParamInfo]:
    """One record per (distinct) parameter of ``model`` (a module or list of chunks), by part.

    ``base_names``: the parameter names before a PEFT hook ran; a trainable parameter whose (unwrapped) name is
    not among them is an adapter.
    """
    from bridge_freeze_plugin.prewrap import Classifier, as_chunks, base_name, named_parameters

    classifier = Classifier(family)
    seen: set[int] = set()
    out = []
    for _, name, param in named_parameters(as_chunks(model)):
        if id(param) in seen:
            continue
        seen.add(id(param))
        part = classifier.part_by_name(name) or Part.OTHER
        trains = bool(param.requires_grad)
        adapter = trains and base_names is not None and base_name(name) not in base_names
        out.append(ParamInfo(name, part, trains, int(param.numel()), tuple(param.shape), adapter))
    return out


@dataclass(frozen=True)
class PlanPart:
    """The byte estimates of one part's counts (``count.part is None``: the whole model)."""

    count: PartCount
    assumptions: MemoryAssumptions

    @property
    def weight_bytes(self) -> int:
        return self.count.total * self.assumptions.param_bytes

    @property
    def grad_bytes(self) -> int:
        return self.count.trainable * self.assumptions.grad_bytes

    def _optimizer(self, n: int) -> int:
        return math.ceil(n * self.assumptions.optimizer_bytes / self.assumptions.dp_size)

    @property
    def optimizer_bytes(self) -> int:
        return self._optimizer(self.count.trainable)

    @property
    def saved_grad_bytes(self) -> int:
        return self.count.frozen * self.assumptions.grad_bytes

    @property
    def saved_optimizer_bytes(self) -> int:
        return self._optimizer(self.count.frozen)

    @property
    def saved_bytes(self) -> int:
        return self.saved_grad_bytes + self.saved_optimizer_bytes

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {} if self.count.part is None else {"part": self.count.part.value}
        out.update({key: getattr(self.count, key) for key in _COUNT_KEYS}, frozen=self.count.frozen)
        if self.count.adapter_tensors:  # with LoRA: the trainable parameters that are adapters
            out.update(adapters=self.count.adapters, adapter_tensors=self.count.adapter_tensors)
        out.update(
            weight_bytes=self.weight_bytes,
            grad_bytes=self.grad_bytes,
            optimizer_bytes=self.optimizer_bytes,
            saved_grad_bytes=self.saved_grad_bytes,
            saved_optimizer_bytes=self.saved_optimizer_bytes,
            saved_bytes=self.saved_bytes,
        )
        return out


@dataclass(frozen=True)
class Plan:
    """What a selection trains and holds, per part and in total, for one model."""

    family: str
    provider: str
    source: str
    config_path: str | None
    model_name: str | None
    selection: FreezeSelection
    assumptions: MemoryAssumptions
    parts: tuple[PlanPart, ...]
    total: PlanPart
    params: tuple[ParamInfo, ...] = field(repr=False)
    build_seconds: float = 0.0
    #: the parallel layout, the activation assumptions and each rank position's figures (see per_rank.py)
    layout: Any = None
    activation: dict[str, Any] | None = None
    per_rank: tuple[Any, ...] = ()
    per_rank_seconds: float = 0.0
    #: the bytes one RL weight sync sends (:class:`.sync_bytes.SyncBytes`), or None and why not
    sync: Any = None
    sync_unavailable: str | None = None

    @property
    def part_names(self) -> tuple[Part, ...]:
        """The parts of the model (its family's), in vocabulary order."""
        return tuple(p.count.part for p in self.parts if p.count.part not in (None, Part.OTHER))

    def largest_rank(self) -> Any:
        """The rank position holding the most bytes (weights + gradients + optimizer + peak activations)."""
        return max(self.per_rank, key=lambda r: (r.total_bytes, -r.pp, -r.tp, -r.ep)) if self.per_rank else None

    def as_dict(self, *, with_params: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION,
            "model": {
                "family": self.family,
                "provider": self.provider,
                "source": self.source,
                "config_path": self.config_path,
                "model_name": self.model_name,
                "device": "meta",
            },
            "selection": {INFO[p].flag: getattr(self.selection, INFO[p].flag) for p in self.part_names},
            "trained_parts": [p.value for p in self.part_names if p in self.selection.trained_parts(self.part_names)],
            "assumptions": self.assumptions.as_dict(),
            "parts": [p.as_dict() for p in self.parts],
            "total": self.total.as_dict(),
        }
        if self.layout is not None:
            out["layout"] = self.layout.as_dict()
            out["activation"] = self.activation
            out["per_rank"] = [r.as_dict() for r in self.per_rank]
        out["checkpoint_save"] = save_size(self).as_dict()
        out["sync"] = None if self.sync is None else self.sync.as_dict()
        if self.sync is None and self.sync_unavailable:
            out["sync_unavailable"] = self.sync_unavailable
        if with_params:
            out["parameters"] = [p.as_dict() for p in self.params]
        return out

    def to_json(self, *, with_params: bool = True) -> str:
        return json.dumps(self.as_dict(with_params=with_params), indent=2, sort_keys=True)


def make_plan(
    params: Iterable[ParamInfo],
    *,
    family: str,
    provider: str,
    selection: FreezeSelection,
    assumptions: MemoryAssumptions,
    source: str = "",
    config_path: str | None = None,
    model_name: str | None = None,
    build_seconds: float = 0.0,
    layout: Any = None,
    activation: dict[str, Any] | None = None,
    per_rank: tuple[Any, ...] = (),
    per_rank_seconds: float = 0.0,
) -> Plan:
    """Aggregate per-parameter records into per-part counts and byte estimates (a row per part of the family)."""
    params = tuple(params)
    tally = PartTally()
    for p in params:
        tally.add(p.part, p.numel, p.trainable, adapter=p.adapter)
    return Plan(
        family=family,
        provider=provider,
        source=source,
        config_path=config_path,
        model_name=model_name,
        selection=selection,
        assumptions=assumptions,
        parts=tuple(PlanPart(count, assumptions) for count in tally.parts(_family_parts(family))),
        total=PlanPart(tally.total(), assumptions),
        params=params,
        build_seconds=build_seconds,
        layout=layout,
        activation=activation,
        per_rank=tuple(per_rank),
        per_rank_seconds=per_rank_seconds,
    )


def _family_parts(family: str) -> tuple[Part, ...] | None:
    from bridge_freeze_plugin.registry import REGISTRY

    spec = REGISTRY.get_or_none(family)
    return None if spec is None else spec.part_names()
