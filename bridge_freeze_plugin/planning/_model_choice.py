"""Which model ``bridge-freeze plan`` builds: MODEL (a family or provider class name) + ``--tiny`` / ``--hf-config``.

A tiny provider comes from the project's CPU harness (:mod:`bridge_freeze_harness`, imported lazily; why it
exists and who may import it is said there); an ``--hf-config`` provider is converted by Megatron-Bridge itself
from a local ``config.json``, once :mod:`.config_checks` has checked it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from bridge_freeze_plugin.errors import BridgeFreezeError, PlanError
from bridge_freeze_plugin.families import FamilySpec
from bridge_freeze_plugin.planning._config_checks import DEFAULT_MAX_LAYER_BLOCKS, check_hf_config, field_error
from bridge_freeze_plugin.prewrap import provider_label
from bridge_freeze_plugin.registry import REGISTRY, list_families


def error_line(exc: BaseException) -> str:
    """``"TypeName: message"`` on one line (Bridge's multi-line messages and their ✗ marks flattened)."""
    text = " ".join(line.strip(" ✗") for line in str(exc).splitlines() if line.strip())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


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
        if not is_class_name or name in (provider_label(provider), type(provider).__name__):
            return provider, key
    raise PlanError(f"no tiny test configuration builds {name}; tiny configurations of {family.name!r}: "
                    f"{', '.join(candidates)}")


def config_file(path: str | os.PathLike[str]) -> Path:
    """The ``config.json`` that ``path`` names (a file, or a model folder holding one)."""
    candidate = Path(os.path.expanduser(os.fspath(path)))
    if candidate.is_dir():
        candidate = candidate / "config.json"
    if not candidate.is_file():
        raise PlanError(f"no config at {path}: give a config.json file or a model folder that holds one")
    return candidate


#: Provider fields set for a meta build besides the harness's CPU_FUSIONS_OFF (no grouped GEMM, one rank).
_CPU_FIELDS: dict[str, Any] = {
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


def load_hf_config(
    path: str | os.PathLike[str], *, max_layer_blocks: int = DEFAULT_MAX_LAYER_BLOCKS
) -> tuple[Any, Path]:
    """The checked (:mod:`.config_checks`) transformers config of a local ``config.json``; no Bridge, no hub."""
    cfg_file = config_file(path)
    doc = check_hf_config(cfg_file, max_layer_blocks=max_layer_blocks)
    from huggingface_hub.errors import StrictDataclassError
    from transformers import AutoConfig

    from bridge_freeze_plugin.planning._offline_configs import OFFLINE_TYPES, read_offline

    try:
        if doc["model_type"] in OFFLINE_TYPES:
            return read_offline(doc, cfg_file), cfg_file
        return AutoConfig.from_pretrained(str(cfg_file)), cfg_file
    except StrictDataclassError as exc:
        raise field_error(exc, doc, cfg_file) from exc
    except PlanError:
        raise
    except Exception as exc:  # transformers' own reading of a config: any failure is the config's
        raise PlanError(f"cannot read {cfg_file} as a transformers config: {error_line(exc)}") from exc


def convert_hf_config(hf_config: Any, cfg_file: Path) -> Any:
    """A Bridge provider converted by Bridge itself (``AutoBridge``), set up for a CPU / meta build."""
    from megatron.bridge import AutoBridge

    try:
        provider = AutoBridge.from_hf_config(hf_config).to_megatron_provider(load_weights=False)
    except Exception as exc:  # a conversion reads only the config: its failure is one readable line
        raise PlanError(f"Megatron-Bridge cannot convert {cfg_file}: {error_line(exc)}") from exc
    from bridge_freeze_harness.cpu_runtime import CPU_FUSIONS_OFF

    for name, value in {**CPU_FUSIONS_OFF, **_CPU_FIELDS}.items():
        if hasattr(provider, name):
            setattr(provider, name, value)
    if getattr(provider, "num_moe_experts", None):
        # all-to-all and flex create CUDA streams / kernels in __init__; allgather builds the same modules and
        # parameters. Megatron refuses the shared-expert overlap (a scheduling choice, no parameter of its own)
        # with allgather, so it goes with it: Bridge turns it on for GLM-4.5V and Kimi K2.5.
        provider.moe_token_dispatcher_type = "allgather"
        provider.moe_shared_expert_overlap = False
    try:
        provider.finalize()
    except Exception as exc:
        raise PlanError(f"the provider converted from {cfg_file} does not validate: {error_line(exc)}") from exc
    return provider


def hf_config_provider(
    path: str | os.PathLike[str], *, max_layer_blocks: int = DEFAULT_MAX_LAYER_BLOCKS
) -> tuple[Any, str]:
    """A Bridge provider converted by Bridge itself (``AutoBridge``) from a local HF ``config.json``.

    Returns ``(provider, config file)``. No weights, no hub access. Needs Bridge imported with the CPU harness
    (:func:`bridge_freeze_plugin.planning._meta_build.bridge_runtime`).
    """
    hf_config, cfg_file = load_hf_config(path, max_layer_blocks=max_layer_blocks)
    return convert_hf_config(hf_config, cfg_file), str(cfg_file)
