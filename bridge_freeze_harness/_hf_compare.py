"""The demo's comparison of the exported HF checkpoint with the input one (step 5 of
:func:`bridge_freeze_harness.demo_flow.run_demo_flow`, which re-exports these names): each exported tensor, its
Megatron sources (Bridge's conversion tasks, merged LoRA adapters), whether it changed and whether it should have.
Who imports this package, and why: :mod:`bridge_freeze_harness`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bridge_freeze_harness.run_records import bare_name


@dataclass(frozen=True)
class HFTensor:
    """One tensor of the exported HF checkpoint."""

    name: str
    #: the plugin's part of its Megatron source (``None``: under no part prefix; ``"none"``: no Megatron source)
    part: str | None
    #: the Megatron parameters (or buffers) it is made of: its conversion task's, and merged LoRA adapters
    sources: tuple[str, ...]
    #: at least one source is in an optimizer group
    trainable: bool
    #: at least one source is in an optimizer group at a learning rate above 0
    expected: bool
    #: the exported tensor differs from the input checkpoint's (bit for bit)
    changed: bool



def read_safetensors(directory: Path) -> dict[str, torch.Tensor]:
    """Every tensor of every ``*.safetensors`` file in ``directory``."""
    from safetensors.torch import load_file

    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(Path(directory).glob("*.safetensors")):
        tensors.update(load_file(str(file)))
    return tensors


def _task_hf_names(task: Any) -> set[str]:
    """The HF tensor names one conversion task's (resolved) mapping writes."""
    mapping = task.mapping
    hf_param = getattr(mapping, "hf_param", None)
    if isinstance(hf_param, str):
        names = {hf_param}
    elif isinstance(hf_param, Mapping):  # several HF tensors (e.g. q / k / v, gate / up)
        names = set(hf_param.values())
    else:
        names = set()
    if getattr(mapping, "is_grouped_export", False) and getattr(mapping, "group_key", None):
        names.add(str(mapping.group_key))  # a fused tensor assembled from several tasks (e.g. all experts)
    return {str(n) for n in names}


def hf_sources(bridge: Any, model: Any) -> dict[str, set[str]]:
    """HF tensor name -> the Megatron parameter / buffer names it is made of (Bridge's conversion tasks).

    A LoRA-wrapped base weight (``...<module>.to_wrap.weight``, not its bias) also has the module's adapters
    (``...<module>.adapter.*``) as sources: Bridge's export merges them into it.
    """
    from megatron.bridge.models.conversion.utils import unwrap_model

    chunks = unwrap_model(model if isinstance(model, list) else [model])
    names = [bare_name(n) for chunk in chunks for n, _ in chunk.named_parameters()]
    sources: dict[str, set[str]] = {}
    for task in bridge.get_conversion_tasks(chunks):
        if task is None:
            continue
        param = bare_name(task.global_param_name)
        feeds = {param}
        if _bias_moves_with_router(task):  # its router's weight trains: the bias is updated with it
            feeds.add(param.rpartition(".")[0] + ".weight")
        if param.endswith(".to_wrap.weight"):  # LoRA's B @ A is added to the weight, never to the bias
            module = param.removesuffix(".to_wrap.weight")
            feeds |= {n for n in names if n.startswith(f"{module}.adapter.")}
        for hf_name in _task_hf_names(task):
            sources.setdefault(hf_name, set()).update(feeds)
    return sources


def _bias_moves_with_router(task: Any) -> bool:
    """A MoE router's ``expert_bias`` buffer that megatron-core's ``finalize_model_grads`` updates without a
    gradient (``moe_router_enable_expert_bias`` with a ``moe_router_bias_update_rate`` above 0, not
    ``frozen_expert_bias``): it changes when its router trains (GLM-4.5V's rate is 0: its bias never moves)."""
    module = getattr(task, "megatron_module", None)
    if module is None or getattr(module, "expert_bias", None) is not task.param_weight:
        return False
    config = module.config
    return (bool(getattr(config, "moe_router_enable_expert_bias", False))
            and float(getattr(config, "moe_router_bias_update_rate", 0.0) or 0.0) > 0.0
            and not getattr(module, "frozen_expert_bias", False))


def _feeds(name: str, sources: Mapping[str, set[str]]) -> tuple[set[str], set[str]]:
    """The Megatron sources of exported tensor ``name``'s values, and those that give its part.

    Bridge's INT4 export (Kimi K2.5's routed experts) writes a mapped ``<base>.weight`` as ``<base>.weight_packed``
    and ``<base>.weight_scale``, fed by the weight's sources, and ``<base>.weight_shape``, which records the shape:
    no parameter's value feeds it, but it belongs to the weight's part.
    """
    if name in sources:
        return sources[name], sources[name]
    base, dot_weight, kind = name.rpartition(".weight_")
    weight_sources = sources.get(f"{base}.weight", set()) if dot_weight and kind in _INT4_PARTS else set()
    return (set() if kind == "shape" else weight_sources), weight_sources


#: The tensors Bridge's INT4 export writes for one weight (``<base>.weight_<kind>``).
_INT4_PARTS = ("packed", "scale", "shape")


def _part_of(family: Any, sources: set[str]) -> str | None:
    if not sources:
        return "none"
    bases = sorted(s for s in sources if ".adapter." not in s) or sorted(sources)
    part = family.classify(bases[0]) if family is not None else None
    return None if part is None else part.value


def compare(
    original: Mapping[str, torch.Tensor],
    exported: Mapping[str, torch.Tensor],
    sources: Mapping[str, set[str]],
    lr_of: Mapping[str, float],
    family: Any,
) -> list[HFTensor]:
    """One :class:`HFTensor` per exported tensor (``lr_of``: Megatron name -> peak LR, for trainable ones)."""
    missing = sorted(set(original) ^ set(exported))
    if missing:
        raise AssertionError(f"the export and the input checkpoint differ in names: {missing[:5]}")
    rows = []
    for name in sorted(exported):
        feeds, part_feeds = _feeds(name, sources)
        before, after = original[name], exported[name]
        changed = before.dtype != after.dtype or before.shape != after.shape or not torch.equal(before, after)
        rows.append(HFTensor(
            name=name, part=_part_of(family, part_feeds), sources=tuple(sorted(feeds)),
            trainable=any(s in lr_of for s in feeds), expected=any(lr_of.get(s, 0.0) > 0.0 for s in feeds),
            changed=changed))
    return rows
