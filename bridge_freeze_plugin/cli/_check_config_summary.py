"""``bridge-freeze check-config``'s summary: what trains, as the flags, the patterns, LoRA (Bridge's ``LoRA`` or
``VLMLoRA``) and the trainers' own part freezes decide it together, as the JSON document's entries and text lines.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from bridge_freeze_plugin.config import lora_adapter_parts, vlm_lora_effect
from bridge_freeze_plugin.request import FLAGS, FreezeSelection, Part


def model_parts(selection: FreezeSelection, family: Any) -> tuple[Part, ...]:
    """The parts the model has: its family's; unknown family: those assumed for a VLM, and any part flagged."""
    return selection.parts_of(None if family is None else family.part_names())


def _parts(selection: FreezeSelection, family: Any = None,
           frozen_by_hooks: frozenset[Part] = frozenset()) -> tuple[list[str], list[str], dict[str, str]]:
    """(parts that train whole, parts frozen whole, part -> how the patterns decide it per tensor).

    A freeze pattern can only freeze tensors of a part its flag trains; a train pattern can only train tensors
    of a part its flag freezes, and only where it can match a name under the part's prefixes (the family's when
    known, else any registered family's). Which tensors they match is known once the model is built.
    ``frozen_by_hooks``: parts a trainer's own hook freezes whole (NeMo-RL's ``freeze_config``).
    """
    parts = model_parts(selection, family)
    prefixes = None if family is None else {part: family.prefixes(part) for part in parts}
    untrained = selection.untrained_parts(prefixes)
    trained, frozen, per_tensor = [], [], {}
    for part in parts:
        if part in frozen_by_hooks:
            frozen.append(part.value)
        elif part in selection.trained_parts(parts):
            if selection.freeze_patterns:
                per_tensor[part.value] = "trains, less the tensors a freeze pattern matches"
            else:
                trained.append(part.value)
        elif part in untrained:
            frozen.append(part.value)
        else:
            per_tensor[part.value] = "frozen, but the tensors a train pattern matches train"
    return trained, frozen, per_tensor


@dataclass
class Summary:
    """What trains, as the flags, the patterns, LoRA and the trainers' own part freezes decide it together."""

    trained: list[str]
    frozen: list[str]
    per_tensor: dict[str, str]
    #: the ``lora`` object of the JSON document (``None``: LoRA off)
    lora: dict[str, Any] | None = None
    #: text lines said after the "trains:" line
    lines: list[str] = field(default_factory=list)
    #: what decides the parts of ``per_tensor``
    per_tensor_by: str = "the patterns"


def summarize(checked: Any, selection: FreezeSelection) -> Summary:
    s = checked.settings
    hooks = frozenset(Part(own.name.removeprefix("freeze_")) for own in s.sources.own_freeze
                      if own.setting.freezes_parts and own.value is True and own.name in FLAGS)
    if not s.lora.enabled:
        summary = Summary(*_parts(selection, s.family, hooks))
    elif s.lora_read.vlm_lora is not None and not selection.any_set:
        summary = _vlm_lora_summary(checked)
    elif selection.any_set:  # the flags choose the full-rank parts; the others train through adapters only
        summary = Summary(*_parts(selection, s.family, hooks))
        summary.lora = _lora_doc(checked, "the plugin's flags: a part whose flag is false trains at full rank, a "
                                          "part whose flag is true through its adapters only")
    else:  # plain LoRA: Bridge's PEFT step freezes the whole base model; only the adapters train
        summary = Summary([], [part.value for part in model_parts(selection, s.family)], {})
        summary.lora = _lora_doc(checked, "LoRA alone (no flag): the base model is frozen, only the adapters train")
    if hooks:
        summary.lines.append("frozen whole by the trainer's own hook: " + ", ".join(
            f"{own.key}=true" for own in s.sources.own_freeze if own.setting.freezes_parts and own.value is True
            and own.name in FLAGS
        ) + f" ({next(o.setting.by for o in s.sources.own_freeze if o.setting.freezes_parts)})")
    return summary


def _lora_doc(checked: Any, decided_by: str, switches: dict[str, bool] | None = None) -> dict[str, Any]:
    s = checked.settings
    targets = s.lora.target_modules
    return {
        "class": s.lora_read.lora_class or "megatron.bridge.peft.lora.LoRA", "rank": s.lora.rank,
        "target_modules": list(targets) if isinstance(targets, tuple) else targets,
        "adapters": lora_adapter_parts(s.lora, s.family), "decided_by": decided_by, "switches": switches,
    }


def _vlm_lora_summary(checked: Any) -> Summary:
    """No flag: Bridge's ``VLMLoRA`` freezes what its own switches name, the rest trains at full rank too."""
    s = checked.settings
    switches = {flag: bool(setting.value) for flag, setting in (s.lora_read.vlm_lora or {}).items()}
    written = ", ".join(f"{setting.key}={'true' if setting.value else 'false'}"
                        for setting in (s.lora_read.vlm_lora or {}).values())
    doc = _lora_doc(checked, "VLMLoRA's own switches (no flag set: the plugin is not asked)", switches)
    if s.family is None:
        per_tensor = {part.value: "VLMLoRA's switches decide" for part in model_parts(FreezeSelection(), None)}
        summary = Summary([], [], per_tensor, doc, per_tensor_by="VLMLoRA")
        summary.lines.append(f"VLMLoRA's own switches ({written}) name the LLaVA layout's modules (model.vision_model, "
                             "vision_projection, language_model); the family is unknown, so which parts they freeze "
                             "cannot be said here (--family NAME)")
        return summary
    effect = vlm_lora_effect(s.family, switches)
    trained = [p.value for p in s.family.part_names() if p not in effect.frozen | effect.partial]
    frozen = [p.value for p in s.family.part_names() if p in effect.frozen]
    per_tensor = {p.value: f"VLMLoRA freezes part of it ({', '.join(effect.modules)})" for p in effect.partial}
    summary = Summary(trained, frozen, per_tensor, doc, per_tensor_by="VLMLoRA")
    summary.lines.append(f"VLMLoRA's own switches ({written}) freeze {', '.join(effect.modules) or 'nothing'} "
                         "(read: no flag set, the plugin is not asked)")
    return summary


def trains_line(summary: Summary) -> str:
    if summary.per_tensor:
        return (f"trains: {', '.join(summary.trained) or 'no part whole'}; frozen: "
                f"{', '.join(summary.frozen) or 'no part whole'}; decided per tensor by {summary.per_tensor_by} "
                "(when the model is built; bridge-freeze plan lists the tensors): "
                + "; ".join(f"{part}: {how}" for part, how in summary.per_tensor.items()))
    if summary.lora is None:
        return f"trains: {', '.join(summary.trained) or 'nothing'}; frozen: {', '.join(summary.frozen) or 'nothing'}"
    full = f"{', '.join(summary.trained)} at full rank, and " if summary.trained else ""
    only = "only " if not summary.trained else ""
    frozen = ", ".join(summary.frozen) or "nothing"
    return f"trains: {full}LoRA adapters {only}(where target_modules reach); frozen: {frozen} (base weights)"


def lora_line(lora: dict[str, Any]) -> str:
    adapters = "; ".join(f"{part}: {where}" for part, where in lora["adapters"].items())
    targets = "Bridge's default (linear_qkv, linear_proj, linear_fc1, linear_fc2)" if lora["target_modules"] is None \
        else json.dumps(lora["target_modules"])
    return (f"LoRA ({lora['class'].rpartition('.')[2]}, rank {lora['rank']}, target_modules {targets}): decided by "
            f"{lora['decided_by']}; adapters in {adapters} (may: the built model tells, bridge-freeze plan "
            "--lora-rank N --lora-target-modules ... lists them)")


def stage_of(checked: Any, selection: FreezeSelection) -> Any:
    """The stage a Megatron-Bridge ``ConfigContainer``'s ``checkpoint`` section starts (``stages.StageCheck``), or
    None: another layout, or nothing loaded. Its ``run_config.yaml`` is read with the config reader."""
    from omegaconf import OmegaConf

    from bridge_freeze_plugin.config import BRIDGE, load_config, select
    from bridge_freeze_plugin.stages import stage_check

    section = select(checked.loaded.cfg, "checkpoint") if checked.layout.name == BRIDGE.name else None
    if not isinstance(section, Mapping):
        return None
    target = checked.settings.provider_target
    label = str(target.value).rpartition(".")[2] if target is not None and target.value else "this config"
    return stage_check(section, selection,
                       lambda path: OmegaConf.to_container(load_config(path)), label)
