"""Plan a freeze before any GPU is involved: build the real Bridge model on the meta device and count.

``bridge-freeze plan`` uses this module. It builds the model a Bridge provider gives (no weights, no
memory: every tensor lives on PyTorch's ``meta`` device), classifies every parameter with the
provider's family, and estimates what a training run holds per part and what freezing saves:

- **weights**: every parameter, frozen or not (``param_dtype`` bytes each);
- **gradient buffer**: Megatron's DDP keeps one ``main_grad`` per *trainable* parameter
  (``grad_dtype`` bytes: fp32 by default, as with ``grad_reduce_in_fp32``); frozen ones get none;
- **optimizer state** per trainable parameter: an fp32 master copy when ``param_dtype`` is not
  fp32 (mixed precision), plus Adam's ``exp_avg`` and ``exp_avg_sq`` (``adam``) or the momentum
  buffer (``sgd``), in ``state_dtype`` (fp32 by default). bf16 weights + Adam: 4 + 4 + 4 = 12 bytes.
  Megatron's distributed optimizer shards this state (master copy included) over the
  data-parallel ranks: ``dp_size`` divides it (the gradient buffer is not sharded).

Counts are for the whole model (tensor / pipeline / expert parallel size 1): with model
parallelism, each rank holds its share of these figures. Building needs torch and Megatron-Bridge;
the CPU harness (TransformerEngine stub, local layer specs) comes from the ``bridge_freeze_harness``
package shipped alongside, imported lazily inside this module's functions, never at module level. The
plugin's runtime path (activation, the mixin, freeze, report, validation, the registry) never imports
that package; only this module (``bridge-freeze plan``) and ``bridge-freeze demo`` in
:mod:`bridge_freeze_plugin.cli` do, because they build models on the meta device / the CPU (where
TransformerEngine loads, the TE stub does nothing). Nothing in this module prints.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bridge_freeze_plugin.errors import BridgeFreezeError
from bridge_freeze_plugin.registry import REGISTRY, FamilySpec, family_for_provider, list_families
from bridge_freeze_plugin.selection import SELECTABLE_PARTS, FreezeSelection, Part

__all__ = [
    "DTYPE_BYTES",
    "OPTIMIZERS",
    "SCHEMA_VERSION",
    "MemoryAssumptions",
    "ParamInfo",
    "Plan",
    "PlanError",
    "PlanPart",
    "build_meta_model",
    "config_file",
    "hf_config_provider",
    "make_plan",
    "plan_model",
    "resolve_model",
    "tiny_provider",
]

#: Version of the ``--json`` document (bumped on any incompatible change; see docs/cli.md).
SCHEMA_VERSION = 1

#: Bytes per element of the dtypes the estimate understands.
DTYPE_BYTES: dict[str, int] = {"fp32": 4, "bf16": 2, "fp16": 2}

#: Optimizer -> number of per-parameter state tensors (besides the fp32 master copy).
OPTIMIZERS: dict[str, int] = {"adam": 2, "sgd": 1}
_STATE_NAMES = {"adam": "exp_avg + exp_avg_sq", "sgd": "momentum buffer"}


class PlanError(BridgeFreezeError, ValueError):
    """A plan cannot be made (unknown model, unreadable config, a build that fails...)."""


# --------------------------------------------------------------------------------------------
# The assumptions behind the byte estimates.
# --------------------------------------------------------------------------------------------


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
    def optimizer_bytes(self) -> int:
        """Optimizer state bytes per trainable parameter, before data-parallel sharding."""
        return self.master_bytes + OPTIMIZERS[self.optimizer] * DTYPE_BYTES[self.state_dtype]

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


# --------------------------------------------------------------------------------------------
# The plan itself (pure: counts in, bytes out).
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ParamInfo:
    name: str
    part: Part
    trainable: bool
    numel: int
    shape: tuple[int, ...]

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "part": self.part.value,
            "trainable": self.trainable,
            "numel": self.numel,
            "shape": list(self.shape),
        }


@dataclass(frozen=True)
class PlanPart:
    """Counts and byte estimates of one part (or of the whole model, ``part=None``)."""

    part: Part | None
    trainable: int
    total: int
    trainable_tensors: int
    total_tensors: int
    assumptions: MemoryAssumptions

    @property
    def frozen(self) -> int:
        return self.total - self.trainable

    @property
    def weight_bytes(self) -> int:
        return self.total * self.assumptions.param_bytes

    @property
    def grad_bytes(self) -> int:
        return self.trainable * self.assumptions.grad_bytes

    def _optimizer(self, n: int) -> int:
        return math.ceil(n * self.assumptions.optimizer_bytes / self.assumptions.dp_size)

    @property
    def optimizer_bytes(self) -> int:
        return self._optimizer(self.trainable)

    @property
    def saved_grad_bytes(self) -> int:
        return self.frozen * self.assumptions.grad_bytes

    @property
    def saved_optimizer_bytes(self) -> int:
        return self._optimizer(self.frozen)

    @property
    def saved_bytes(self) -> int:
        return self.saved_grad_bytes + self.saved_optimizer_bytes

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {} if self.part is None else {"part": self.part.value}
        out.update(
            trainable=self.trainable,
            frozen=self.frozen,
            total=self.total,
            trainable_tensors=self.trainable_tensors,
            total_tensors=self.total_tensors,
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
            "selection": self.selection.as_dict(),
            "trained_parts": [p.value for p in SELECTABLE_PARTS if p in self.selection.trained_parts()],
            "assumptions": self.assumptions.as_dict(),
            "parts": [p.as_dict() for p in self.parts],
            "total": self.total.as_dict(),
        }
        if with_params:
            out["parameters"] = [p.as_dict() for p in self.params]
        return out

    def to_json(self, *, with_params: bool = True) -> str:
        return json.dumps(self.as_dict(with_params=with_params), indent=2, sort_keys=True)


def make_plan(
    params: list[ParamInfo] | tuple[ParamInfo, ...],
    *,
    family: str,
    provider: str,
    selection: FreezeSelection,
    assumptions: MemoryAssumptions,
    source: str = "",
    config_path: str | None = None,
    model_name: str | None = None,
    build_seconds: float = 0.0,
) -> Plan:
    """Aggregate per-parameter records into per-part counts and byte estimates."""
    rows: dict[Part, list[int]] = {}
    for p in params:
        row = rows.setdefault(p.part, [0, 0, 0, 0])
        row[1] += p.numel
        row[3] += 1
        if p.trainable:
            row[0] += p.numel
            row[2] += 1
    order = [*SELECTABLE_PARTS, *([Part.OTHER] if Part.OTHER in rows else [])]
    parts = tuple(PlanPart(part, *rows.get(part, [0, 0, 0, 0]), assumptions) for part in order)
    sums = [sum(r[i] for r in rows.values()) for i in range(4)]
    total = PlanPart(None, sums[0], sums[1], sums[2], sums[3], assumptions)
    return Plan(
        family=family,
        provider=provider,
        source=source,
        config_path=config_path,
        model_name=model_name,
        selection=selection,
        assumptions=assumptions,
        parts=parts,
        total=total,
        params=tuple(params),
        build_seconds=build_seconds,
    )


def collect_params(model: Any, family: FamilySpec) -> list[ParamInfo]:
    """One record per (distinct) parameter of ``model`` (a module or list of chunks), by part."""
    from bridge_freeze_plugin.build.classify import as_chunks, named_parameters

    seen: set[int] = set()
    out = []
    for _, name, param in named_parameters(as_chunks(model)):
        if id(param) in seen:
            continue
        seen.add(id(param))
        part = family.classify(name) or Part.OTHER
        out.append(ParamInfo(name, part, bool(param.requires_grad), int(param.numel()), tuple(param.shape)))
    return out


# --------------------------------------------------------------------------------------------
# Which model: MODEL (family or provider class) + --tiny / --hf-config.
# --------------------------------------------------------------------------------------------


def resolve_model(name: str) -> FamilySpec:
    """The family of ``name``: a registered family, a provider class name, or a tiny config name."""
    list_families()  # built-ins and entry points registered
    try:
        return REGISTRY.find(name)
    except BridgeFreezeError:
        from bridge_freeze_harness.tiny import TINY_FAMILIES

        for spec in REGISTRY:
            if name in TINY_FAMILIES and name.startswith(spec.name + "_"):
                return spec
        raise


def _base_class_name(provider: Any) -> str:
    for klass in type(provider).__mro__:
        if not klass.__dict__.get("_bridge_freeze_generated", False) and klass.__name__ != "FreezableVLMProvider":
            return klass.__name__
    return type(provider).__name__


def tiny_provider(name: str, family: FamilySpec) -> tuple[Any, str]:
    """The project's tiny test provider for ``name`` (family, tiny config or provider class name).

    Returns ``(provider, tiny config name)``.
    """
    from bridge_freeze_harness import tiny

    if name in tiny.TINY_FAMILIES:
        return tiny.make_provider(name), name
    candidates = [k for k in tiny.TINY_FAMILIES if k == family.name or k.startswith(family.name + "_")]
    if not candidates:
        raise PlanError(
            f"no tiny test configuration for family {family.name!r}; use --hf-config PATH "
            f"(tiny configurations: {', '.join(sorted(tiny.TINY_FAMILIES))})"
        )
    is_class_name = name != family.name
    for key in candidates:
        provider = tiny.make_provider(key)
        if not is_class_name or name in (_base_class_name(provider), type(provider).__name__):
            return provider, key
    raise PlanError(f"no tiny test configuration builds {name}; tiny configurations of {family.name!r}: "
                    f"{', '.join(candidates)}")


def config_file(path: str | os.PathLike[str]) -> Path:
    candidate = Path(os.path.expanduser(os.fspath(path)))
    if candidate.is_dir():
        candidate = candidate / "config.json"
    if not candidate.is_file():
        raise PlanError(f"no config at {path}: give a config.json file or a model folder that holds one")
    return candidate


def _one_line(exc: BaseException) -> str:
    text = " ".join(line.strip(" ✗") for line in str(exc).splitlines() if line.strip())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


#: Provider fields set for a CPU / meta build (no TE, no fused kernels, no CUDA streams, one rank).
_CPU_FIELDS: dict[str, Any] = {
    "gradient_accumulation_fusion": False,
    "bias_activation_fusion": False,
    "bias_dropout_fusion": False,
    "masked_softmax_fusion": False,
    "persist_layer_norm": False,
    "apply_rope_fusion": False,
    "moe_grouped_gemm": False,
    "moe_permute_fusion": False,
    "tensor_model_parallel_size": 1,
    "pipeline_model_parallel_size": 1,
    "virtual_pipeline_model_parallel_size": None,
    "expert_model_parallel_size": 1,
    "expert_tensor_parallel_size": 1,
    "context_parallel_size": 1,
    "sequence_parallel": False,
}


def hf_config_provider(path: str | os.PathLike[str]) -> tuple[Any, str]:
    """A Bridge provider converted by Bridge itself (``AutoBridge``) from a local HF ``config.json``.

    Returns ``(provider, config file)``. No weights, no hub access.
    """
    cfg_file = config_file(path)
    try:
        from transformers import AutoConfig

        hf_config = AutoConfig.from_pretrained(str(cfg_file))
    except (OSError, ValueError, KeyError) as exc:
        raise PlanError(f"cannot read {cfg_file} as a transformers config: {_one_line(exc)}") from exc
    from megatron.bridge import AutoBridge

    try:
        bridge = AutoBridge.from_hf_config(hf_config)
        provider = bridge.to_megatron_provider(load_weights=False)
    except (ValueError, KeyError, AttributeError, TypeError, NotImplementedError) as exc:
        raise PlanError(f"Megatron-Bridge cannot convert {cfg_file}: {_one_line(exc)}") from exc
    for name, value in _CPU_FIELDS.items():
        if hasattr(provider, name):
            setattr(provider, name, value)
    if getattr(provider, "num_moe_experts", None):
        provider.moe_token_dispatcher_type = "allgather"  # all-to-all creates a CUDA stream
    try:
        provider.finalize()
    except (ValueError, AssertionError, AttributeError, TypeError) as exc:
        raise PlanError(f"the provider converted from {cfg_file} does not validate: {_one_line(exc)}") from exc
    return provider, str(cfg_file)


# --------------------------------------------------------------------------------------------
# Building on the meta device.
# --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _cpu_build_context(tiny_name: str | None) -> Iterator[None]:
    from bridge_freeze_harness import tiny
    from bridge_freeze_harness.cpu_runtime import import_bridge, init_cpu_distributed
    from bridge_freeze_harness.local_specs import cpu_build_patches

    if tiny_name is not None and tiny_name in tiny.TINY_FAMILIES:
        with tiny.build_context(tiny_name):
            yield
        return
    import_bridge()
    init_cpu_distributed()
    with cpu_build_patches():
        yield


def build_meta_model(provider: Any, *, tiny_name: str | None = None) -> Any:
    """``provider.provide()`` under ``torch.device("meta")``: the real model class, no storage.

    Initialisation is skipped (nothing to initialise on the meta device) and the provider builds
    with CPU-initialisation code paths, which create their tensors on the default (meta) device.
    """
    import torch

    provider.init_model_with_meta_device = True
    provider.use_cpu_initialization = True
    provider.perform_initialization = False
    with _cpu_build_context(tiny_name):
        if getattr(provider, "_pg_collection", None) is None:
            from megatron.core.process_groups_config import ProcessGroupCollection

            provider._pg_collection = ProcessGroupCollection.use_mpu_process_groups()
        with torch.device("meta"):
            return provider.provide(pre_process=True, post_process=True)


def bridge_runtime() -> None:
    """Import Megatron-Bridge (TE stub) and bring up the single-process CPU runtime."""
    from bridge_freeze_harness.cpu_runtime import import_bridge, init_cpu_distributed

    import_bridge()
    init_cpu_distributed()


def plan_model(
    model: str | None,
    selection: FreezeSelection,
    assumptions: MemoryAssumptions,
    *,
    tiny: bool = False,
    hf_config: str | os.PathLike[str] | None = None,
) -> Plan:
    """Build ``model`` (family / provider class name) on the meta device with ``selection``; the plan.

    ``model`` may be ``None`` with ``hf_config``: the family is then the one of the converted provider.
    """
    import time

    from bridge_freeze_plugin.mixins import make_freezable
    from bridge_freeze_plugin.provider import model_name_of

    if tiny == (hf_config is not None):
        raise PlanError("give exactly one of --tiny (the project's tiny test config) or --hf-config PATH")
    if model is None and tiny:
        raise PlanError("--tiny needs MODEL (a family or provider class name)")
    family = resolve_model(model) if model is not None else None
    if hf_config is not None:
        config_file(hf_config)  # a missing file fails before the (slow) Bridge import
    bridge_runtime()
    if tiny:
        assert model is not None and family is not None
        provider, tiny_name = tiny_provider(model, family)
        source, config_path = "tiny", None
    else:
        assert hf_config is not None
        provider, config_path = hf_config_provider(hf_config)
        source = "hf-config"
        found = family_for_provider(provider)
        if found is None:
            families = ", ".join(f.name for f in list_families())
            raise PlanError(
                f"{config_path} converts to {type(provider).__name__}, which no bridge-freeze family covers "
                f"(registered families: {families})"
            )
        if family is None:
            family = found
        elif found.name != family.name:
            raise PlanError(
                f"{config_path} is a {found.name} model ({type(provider).__name__}), "
                f"but MODEL {model!r} is family {family.name!r}"
            )
        tiny_name = found.name
    provider_name = _base_class_name(provider)
    make_freezable(provider, selection)
    started = time.perf_counter()
    try:
        built = build_meta_model(provider, tiny_name=tiny_name)
    except BridgeFreezeError:
        raise
    except Exception as exc:  # a failing Bridge build becomes one readable line
        raise PlanError(f"building {provider_name} on the meta device failed: {_one_line(exc)}") from exc
    seconds = time.perf_counter() - started
    params = collect_params(built, family)
    return make_plan(
        params,
        family=family.name,
        provider=provider_name,
        selection=selection,
        assumptions=assumptions,
        source=source,
        config_path=config_path,
        model_name=model_name_of(provider) if source != "tiny" else f"tiny:{tiny_name}",
        build_seconds=seconds,
    )
