"""Build the chosen model on PyTorch's meta device (no storage) with a selection, and plan from what was built.

The build runs under the CPU harness (:mod:`bridge_freeze_harness`, imported lazily; why it exists and who may
import it is said there): a ``--tiny`` build under its tiny configuration's build context, an ``--hf-config``
build under :func:`bridge_freeze_harness.cpu_build_context` (the family's any-size CPU patches only, never a tiny
configuration's). Nothing here prints.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bridge_freeze_plugin.errors import BridgeFreezeError, PlanError
from bridge_freeze_plugin.families import FamilySpec
from bridge_freeze_plugin.planning._config_checks import DEFAULT_MAX_LAYER_BLOCKS
from bridge_freeze_plugin.planning._estimate import MemoryAssumptions, ParamInfo, Plan, collect_params, make_plan
from bridge_freeze_plugin.planning._layout import Layout
from bridge_freeze_plugin.planning._model_choice import (
    convert_hf_config,
    error_line,
    load_hf_config,
    resolve_model,
    tiny_provider,
)
from bridge_freeze_plugin.planning._per_rank import _LM_LAYER, ActivationSettings, plan_ranks
from bridge_freeze_plugin.planning._sync_bytes import plan_sync
from bridge_freeze_plugin.prewrap import model_name_of, provider_label
from bridge_freeze_plugin.registry import family_for_provider, list_families
from bridge_freeze_plugin.request import FreezeSelection, Part


@dataclass(frozen=True)
class _Chosen:
    """The provider to build, its family, and where its configuration came from."""

    provider: Any
    family: FamilySpec
    source: str  # "tiny" or "hf-config"
    config_path: str | None
    tiny_name: str | None  # the tiny configuration (source "tiny" only)
    hf_config: tuple[Any, Path] | None = None  # the read config and its file (source "hf-config" only)


def apply_lora(provider: Any, model: Any, lora: Any) -> tuple[Any, frozenset[str]]:
    """Run ``lora`` over the meta-built model through the plugin's own pre-wrap hook chain (freeze, LoRA, its
    full-rank parts, the guarantee), as a real build would; returns the model and its names before LoRA."""
    import torch

    from bridge_freeze_plugin.prewrap import HookChain, preflight

    before = frozenset(name for name, _ in model.named_parameters())
    with torch.device("meta"):
        (model,) = HookChain(provider, preflight(provider), [lora])([model])
    return model, before


def bridge_runtime() -> None:
    """Import Megatron-Bridge (TE stub) and bring up the single-process CPU runtime."""
    from bridge_freeze_harness.cpu_runtime import import_bridge, init_cpu_distributed

    import_bridge()
    init_cpu_distributed()


def _build_context(family_name: str, tiny_name: str | None) -> Any:
    """A tiny configuration's build context, or (``tiny_name`` None) the any-size CPU context of the family."""
    if tiny_name is not None:
        from bridge_freeze_harness.tiny import build_context

        return build_context(tiny_name)
    from bridge_freeze_harness import cpu_build_context

    return cpu_build_context(family_name)


@contextlib.contextmanager
def _process_groups_once() -> Iterator[None]:
    """megatron-core modules built without a process-group collection each ask parallel_state for one
    (``ProcessGroupCollection.use_mpu_process_groups``): about 48,000 times, 4 s of a 235B build. The groups do
    not change during a build, so each request is answered once and then from memory, for this build only."""
    from megatron.core.process_groups_config import ProcessGroupCollection

    original = ProcessGroupCollection.__dict__["use_mpu_process_groups"]
    answers: dict[tuple[str, ...] | None, Any] = {}

    def once(cls: type, required_pgs: list[str] | None = None) -> Any:
        key = None if required_pgs is None else tuple(required_pgs)
        if key not in answers:
            answers[key] = original.__func__(cls, required_pgs)
        return answers[key]

    ProcessGroupCollection.use_mpu_process_groups = classmethod(once)  # type: ignore[method-assign]
    try:
        yield
    finally:
        ProcessGroupCollection.use_mpu_process_groups = original  # type: ignore[method-assign]


def build_meta_model(
    provider: Any, *, family_name: str, tiny_name: str | None = None, lora: Any = None
) -> tuple[Any, frozenset[str] | None]:
    """``provider.provide()`` under ``torch.device("meta")``: the real model class, no storage.

    With ``lora`` (a PEFT object), it then runs through the plugin's pre-wrap hook chain, inside the same CPU
    build context; returns the model and, with LoRA, its parameter names before LoRA.

    Initialisation is skipped (nothing to initialise on the meta device) and the provider builds
    with CPU-initialisation code paths, which create their tensors on the default (meta) device.
    ``tiny_name``: the tiny configuration the provider is (its patches apply); ``None`` for a real config.
    """
    import torch

    provider.init_model_with_meta_device = True
    provider.use_cpu_initialization = True
    provider.perform_initialization = False
    with _build_context(family_name, tiny_name), _process_groups_once():
        if getattr(provider, "_pg_collection", None) is None:
            from megatron.core.process_groups_config import ProcessGroupCollection

            provider._pg_collection = ProcessGroupCollection.use_mpu_process_groups()
        with torch.device("meta"):
            model = provider.provide(pre_process=True, post_process=True)
        if lora is None:
            return model, None
        return apply_lora(provider, model, lora)


def _from_hf_config(model: str | None, family: FamilySpec | None, hf_config: Any, cfg_file: Path) -> _Chosen:
    provider = convert_hf_config(hf_config, cfg_file)
    config_path = str(cfg_file)
    found = family_for_provider(provider)
    if found is None:
        families = ", ".join(f.name for f in list_families())
        raise PlanError(
            f"{config_path} converts to {type(provider).__name__}, which no bridge-freeze family covers "
            f"(registered families: {families})"
        )
    if family is not None and found.name != family.name:
        raise PlanError(
            f"{config_path} is a {found.name} model ({type(provider).__name__}), "
            f"but MODEL {model!r} is family {family.name!r}"
        )
    return _Chosen(provider, found, "hf-config", config_path, None, (hf_config, cfg_file))


def _choose(
    model: str | None, *, tiny: bool, hf_config: str | os.PathLike[str] | None, max_layer_blocks: int
) -> _Chosen:
    if tiny == (hf_config is not None):
        raise PlanError("give exactly one of --tiny (the project's tiny test config) or --hf-config PATH")
    if model is None and tiny:
        raise PlanError("--tiny needs MODEL (a family or provider class name)")
    family = resolve_model(model) if model is not None else None
    if hf_config is not None:  # read and checked before the (slow) Bridge import
        loaded, cfg_file = load_hf_config(hf_config, max_layer_blocks=max_layer_blocks)
        bridge_runtime()
        return _from_hf_config(model, family, loaded, cfg_file)
    bridge_runtime()
    assert model is not None and family is not None
    provider, tiny_name = tiny_provider(model, family)
    return _Chosen(provider, family, "tiny", None, tiny_name)


def plan_model(
    model: str | None,
    selection: FreezeSelection,
    assumptions: MemoryAssumptions,
    *,
    tiny: bool = False,
    hf_config: str | os.PathLike[str] | None = None,
    max_layer_blocks: int = DEFAULT_MAX_LAYER_BLOCKS,
    lora: Callable[[Any], Any] | None = None,
    layout: Layout | None = None,
    activation: ActivationSettings | None = None,
) -> Plan:
    """Build ``model`` (family / provider class name) on the meta device with ``selection``; the plan.

    ``model`` may be ``None`` with ``hf_config``: the family is then the one of the converted provider.
    ``max_layer_blocks``: refuse an ``hf_config`` whose build is larger (:mod:`.config_checks`; 0: no limit).
    ``lora``: makes the PEFT object (called once Bridge is imported) whose adapters the plan counts.
    ``layout``: the parallel layout whose ranks get per-rank figures (``None``: one rank, no parallelism);
    ``activation``: what the activation estimate assumes (sequence length, micro-batch, recompute).
    """
    from bridge_freeze_plugin import make_freezable

    layout = layout if layout is not None else Layout()
    activation = activation if activation is not None else ActivationSettings()
    chosen = _choose(model, tiny=tiny, hf_config=hf_config, max_layer_blocks=max_layer_blocks)
    provider_name = provider_label(chosen.provider)
    make_freezable(chosen.provider, selection)
    started = time.perf_counter()
    built, base_names = _build_whole(chosen, provider_name, lora)
    seconds = time.perf_counter() - started
    params = collect_params(built, chosen.family, base_names)
    sync = plan_sync(chosen.hf_config[0] if chosen.hf_config else None, built, assumptions.param_dtype)
    started = time.perf_counter()
    if layout.world_size > 1:
        ranks, recompute = _per_rank(chosen, selection, assumptions, layout, activation, lora)
    else:
        ranks, recompute = _single_rank(chosen, selection, params, assumptions, activation)
    settings = _activation_document(activation, {p.part for p in params}, recompute, assumptions, layout)
    plan = make_plan(
        params,
        family=chosen.family.name,
        provider=provider_name,
        selection=selection,
        assumptions=assumptions,
        source=chosen.source,
        config_path=chosen.config_path,
        model_name=f"tiny:{chosen.tiny_name}" if chosen.tiny_name else model_name_of(chosen.provider),
        build_seconds=seconds,
        layout=layout,
        activation=settings,
        per_rank=ranks,
        per_rank_seconds=time.perf_counter() - started,
    )
    return dataclasses.replace(plan, sync=sync[0], sync_unavailable=sync[1])


def _build_whole(chosen: _Chosen, provider_name: str, lora: Callable[[Any], Any] | None) -> tuple[Any, Any]:
    """The whole model on the meta device (:func:`build_meta_model`); a failing Bridge build as one line."""
    try:
        return build_meta_model(chosen.provider, family_name=chosen.family.name, tiny_name=chosen.tiny_name,
                                lora=None if lora is None else lora(chosen.provider))
    except BridgeFreezeError:
        raise
    except Exception as exc:  # a failing Bridge build becomes one readable line
        raise PlanError(f"building {provider_name} on the meta device failed: {error_line(exc)}") from exc


def _activation_document(activation: ActivationSettings, built_parts: set[Part], recompute: str,
                         assumptions: MemoryAssumptions, layout: Layout) -> dict[str, Any]:
    """What the activation estimate assumed, for the plan's ``activation`` entry."""
    return {
        "seq_length": activation.seq_length,
        "micro_batch_size": activation.micro_batch_size,
        "vision_tokens": activation.patches if Part.VISION_MODEL in built_parts else 0,
        # the estimate covers the language model and a vision encoder; an audio encoder's are not counted
        "not_estimated": [p.value for p in (Part.AUDIO_MODEL, Part.AUDIO_PROJECTION) if p in built_parts],
        "recompute": recompute,
        "activation_dtype": assumptions.param_dtype,
        "sequence_parallel": layout.tp > 1,
    }


def _provider_factory(chosen: _Chosen) -> Callable[[], Any]:
    """A fresh provider of the chosen model per call (each per-rank build mutates its own)."""
    if chosen.tiny_name is not None:
        from bridge_freeze_harness.tiny import make_provider

        name = chosen.tiny_name
        return lambda: make_provider(name)
    hf_config, cfg_file = chosen.hf_config
    return lambda: convert_hf_config(hf_config, cfg_file)


def _per_rank(
    chosen: _Chosen, selection: FreezeSelection, assumptions: MemoryAssumptions, layout: Layout,
    activation: ActivationSettings, lora: Callable[[Any], Any] | None,
) -> tuple[list[Any], str]:
    from bridge_freeze_plugin import make_freezable

    def prepare(provider: Any) -> None:
        make_freezable(provider, selection)
        if lora is not None:
            provider.register_pre_wrap_hook(lora(provider))

    return plan_ranks(
        _provider_factory(chosen), layout, family=chosen.family, selection=selection, assumptions=assumptions,
        settings=activation, build_context=lambda: _build_context(chosen.family.name, chosen.tiny_name),
        prepare=prepare,
        distinct_experts=bool(selection.train_patterns or selection.freeze_patterns) or lora is not None,
    )


def _single_rank(
    chosen: _Chosen, selection: FreezeSelection, params: list[ParamInfo], assumptions: MemoryAssumptions,
    activation: ActivationSettings,
) -> tuple[list[Any], str]:
    """One GPU holding the whole model (no parallelism): the figures from the whole-model build."""
    from bridge_freeze_plugin.planning._activations import StageLayers, micro_batch_bytes, vision_depth
    from bridge_freeze_plugin.planning._per_rank import RankFigures, activation_model

    layout = Layout()
    provider = chosen.provider
    recompute = activation.recompute or (getattr(provider, "recompute_granularity", None) or "none")
    total = sum(p.numel for p in params)
    trainable = sum(p.numel for p in params if p.trainable)
    layers: dict[str, bool] = {}
    for p in params:
        found = _LM_LAYER.search(p.name)
        if found:
            key = p.name[: found.end()]
            layers[key] = layers.get(key, False) or ".mlp.experts." in p.name or ".mlp.router." in p.name
    moe = sum(layers.values())
    has_vision = any(p.part is Part.VISION_MODEL for p in params)
    depth = vision_depth(getattr(provider, "vision_config", None)) if has_vision else 0
    stage = StageLayers(dense_layers=len(layers) - moe, moe_layers=moe, vision_layers=depth,
                        first_stage=True, last_stage=True)
    model = activation_model(provider, layout, chosen.family, selection, recompute)
    act = micro_batch_bytes(model, stage, seq_length=activation.seq_length,
                            micro_batch_size=activation.micro_batch_size, vision_tokens=activation.patches,
                            recompute=recompute, elem=assumptions.param_bytes)
    figures = RankFigures(
        tp=0, pp=0, ep=0, parameters=total, trainable=trainable,
        weight_bytes=total * assumptions.param_bytes, grad_bytes=trainable * assumptions.grad_bytes,
        optimizer_bytes=-(-trainable * assumptions.optimizer_bytes // assumptions.dp_size),
        activation_bytes=act, in_flight_micro_batches=1.0,
        dense_layers=stage.dense_layers, moe_layers=moe, vision_layers=depth,
    )
    return [figures], recompute
