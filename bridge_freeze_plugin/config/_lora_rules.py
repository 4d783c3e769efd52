"""The LoRA rules: which parts LoRA's targets reach (as Bridge matches targets) and the full-rank parts they must
avoid, and Bridge's ``VLMLoRA`` switches against the flags.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from bridge_freeze_plugin.config._rules import asked
from bridge_freeze_plugin.config._run_settings import LoraSettings, RunSettings
from bridge_freeze_plugin.families import FamilySpec
from bridge_freeze_plugin.ranks import is_rank0
from bridge_freeze_plugin.request import INFO, SELECTABLE_PARTS, FreezeSelection, Part

logger = logging.getLogger("bridge_freeze_plugin")


#: Characters that make a LoRA target more than a wildcard path (Bridge compiles a target as a regular expression,
#: ``*`` -> ``(.*)``): with one of them, which modules it reaches is for the build to say.
_REGEX_CHARACTERS = frozenset("[](){}?+^$|\\")


def _lora_target_parts(target: str, family: FamilySpec) -> tuple[frozenset[Part | None], frozenset[Part]] | None:
    """``(parts it may reach, parts it certainly reaches)`` for a LoRA target, as Bridge matches targets;
    ``None`` when the config cannot tell (regex characters, or a leaf name on a family with no leaf table).

    Bridge (``ModuleMatcher.match``) puts an adapter on a module whose own name equals the target, or whose full
    name matches it with ``*`` standing for any text. A name without ``.`` or ``*`` is a leaf name: it
    reaches the parts whose linear modules have that name (the family's ``linear_leaves``, :func:`_leaf_parts`).
    Otherwise the names it matches start with its literal head (the text before the first ``*``): they may lie in
    the part of the longest family prefix the head lies under, and in every part with a prefix that begins with the
    head (``None``: names under no prefix). It certainly reaches a part when that is the only part it may reach, or
    when it ends with ``*`` and so matches every module under one of the part's prefixes (``vision_model.*`` covers
    ``vision_model.merger``). (``.`` is read as the separator it stands for in module names.)
    """
    if _REGEX_CHARACTERS & set(target):
        return None
    if "." not in target and "*" not in target:
        return _leaf_parts(target, family)
    if "*" not in target:
        part = family.classify(target)
        return frozenset({part}), frozenset({part} - {None})
    head, _, rest = target.partition("*")
    prefixes = [(prefix, part) for part in (*SELECTABLE_PARTS, Part.OTHER) for prefix in family.prefixes(part)]
    above = [(prefix, part) for prefix, part in prefixes if head.startswith(prefix + ".")]
    base = max(above, key=lambda item: len(item[0]))[1] if above else None
    may = frozenset({base, *(part for prefix, part in prefixes if prefix.startswith(head))})
    certain = set(may - {None}) if len(may) == 1 else set()
    if not rest.strip("*"):  # ends with "*": every name that starts with the head
        certain |= {part for prefix, part in prefixes if (prefix + ".").startswith(head)}
    return may, frozenset(certain)


def _leaf_parts(leaf: str, family: FamilySpec) -> tuple[frozenset[Part | None], frozenset[Part]] | None:
    """The parts whose linear modules have the leaf name ``leaf`` (``None`` in the first set: modules in no part),
    reached for certain: Bridge matches a leaf name against every module's own name. ``None``: the family has no
    leaf table."""
    if not family.linear_leaves:
        return None
    reached = {part for part in (*family.part_names(), Part.OTHER) if leaf in (family.linear_leaves_of(part) or ())}
    return frozenset(None if p is Part.OTHER else p for p in reached), frozenset(reached - {Part.OTHER})


def _lora_section(s: RunSettings) -> str:
    return (s.lora_read.rank.key or "lora.rank").rpartition(".")[0]


def lora_targets_avoid_full_rank_parts(s: RunSettings, family: FamilySpec | None) -> list[str]:
    """A LoRA target that certainly reaches modules of a part trained at full rank: an overlap the build refuses.

    Refused only when certain (:func:`_lora_target_parts`, and no freeze pattern could make those tensors
    frozen), so the config does not refuse what the build accepts. A target that may also reach a full-rank part
    (``vision_model.*linear_qkv`` next to a full-rank ``vision_model.merger``), a leaf name (Bridge's defaults), or
    a run with freeze patterns is checked against the built model: the build raises ``LoraOverlapError`` before
    training if adapters land on a full-rank parameter (logged here as a warning).
    """
    targets = s.lora.target_modules
    if not s.lora.enabled or not s.selection.any_set:
        return []
    full_rank = {p for p in s.selection.trained_parts(s.parts)}
    if targets == () and not s.lora.exclude_modules and not s.selection.freeze_patterns:
        # written empty: Bridge's LoRA wraps every linear module; the LM and the vision encoder certainly have some
        hit = sorted(p.value for p in full_rank & ALL_LINEAR_PARTS)
        if hit:
            return [
                f"{_lora_section(s)}.target_modules=[] (empty: Bridge's LoRA "
                f"then wraps every linear module, less exclude_modules) puts adapters in {', '.join(hit)}, which "
                f"{asked(s)} trains at full rank; a weight cannot train through an adapter and at full rank at "
                "once, and the build would refuse it (LoraOverlapError). Name the targets in the frozen parts "
                "(e.g. language_model.*linear_qkv), or set the flag of that part."
            ]
        return []
    if family is None or not targets:
        return []
    found, maybe = [], []
    for target in ([targets] if isinstance(targets, str) else list(targets)):
        reach = _lora_target_parts(str(target), family)
        if reach is None or not reach[0] & full_rank:
            continue
        hit = sorted(p.value for p in reach[1] & full_rank)
        if hit and not s.selection.freeze_patterns:
            found.append(f"{target!r} (in {', '.join(hit)})")
        else:
            maybe.append(f"{target!r} (may reach {', '.join(sorted(p.value for p in reach[0] & full_rank))})")
    if maybe and is_rank0():
        logger.warning(
            "bridge-freeze: LoRA target_modules %s: adapters there may land on parameters trained at full rank; "
            "whether they do depends on the model's module names, so the build checks it (LoraOverlapError "
            "before training if they do). bridge-freeze plan MODEL --lora-rank N --lora-target-modules ... shows it.",
            ", ".join(maybe),
        )
    if not found:
        return []
    return [
        f"{_lora_section(s)}.target_modules {', '.join(found)}: LoRA would put adapters on "
        f"modules of a part that {asked(s) or 'the selection'} trains at full rank (the "
        f"target reaches that part, as Bridge matches targets: the module's full name, '*' for any text), and a "
        f"weight cannot train through an adapter and at full rank at once; the build would refuse it "
        f"(LoraOverlapError). Scope those targets to the frozen parts, or set the flag of that part."
    ]


#: The module Bridge's ``VLMLoRA`` freezes for each of its switches (an attribute of the model, below
#: ``llava_model`` when the model has one: ``peft/lora.py`` ``VLMLoRA.freeze_model``).
VLM_LORA_MODULES: dict[str, str] = {"freeze_vision_model": "vision_model",
                                    "freeze_vision_projection": "vision_projection",
                                    "freeze_language_model": "language_model"}


@dataclass(frozen=True)
class VlmLoraEffect:
    """What ``VLMLoRA``'s switches freeze on one family's model."""

    #: parts frozen whole, parts partly frozen
    frozen: frozenset[Part]
    partial: frozenset[Part]
    #: the modules it freezes (``vision_model``...), and the switches whose module the model does not have
    modules: tuple[str, ...]
    missing: tuple[str, ...]


def vlm_lora_effect(family: FamilySpec, switches: Mapping[str, bool]) -> VlmLoraEffect:
    """What Bridge's ``VLMLoRA`` freezes on ``family``'s model, from the family's module prefixes.

    ``VLMLoRA.freeze_model`` freezes, for each switch that is true, the model's attribute of that name (the
    LLaVA layout's ``vision_model`` / ``vision_projection`` / ``language_model``, below ``llava_model`` when the
    model has one); an attribute the model does not have fails with ``AttributeError``. Which of the plugin's
    parts that covers follows from the family's prefixes (``vision_model`` covers Qwen3-VL's projection
    ``vision_model.merger`` too).
    """
    every = [prefix for part in (*SELECTABLE_PARTS, Part.OTHER) for prefix in family.prefixes(part)]
    root = "llava_model." if any(p == "llava_model" or p.startswith("llava_model.") for p in every) else ""
    modules, missing = [], []
    for switch, attribute in VLM_LORA_MODULES.items():
        if not switches.get(switch):
            continue
        module = root + attribute
        if any(p == module or p.startswith(module + ".") for p in every):
            modules.append(module)
        else:
            missing.append(switch)
    frozen, partial = set(), set()
    for part in family.part_names():
        prefixes = family.prefixes(part)
        covered = [p for p in prefixes if any(p == m or p.startswith(m + ".") for m in modules)]
        if covered and len(covered) == len(prefixes):
            frozen.add(part)
        elif covered:
            partial.add(part)
    return VlmLoraEffect(frozenset(frozen), frozenset(partial), tuple(modules), tuple(missing))


def vlm_lora_switches(s: RunSettings, family: FamilySpec | None) -> list[str]:
    """``VLMLoRA``'s own switches (``peft.freeze_*``): read when they mean what they say on this model, refused
    with the reason when they cannot (a module the model lacks) or would be overruled (by the flags)."""
    if s.lora_read.vlm_lora is None:
        return []
    switches = {flag: bool(setting.value) for flag, setting in s.lora_read.vlm_lora.items()}
    written = ", ".join(f"{setting.key}={'true' if setting.value else 'false'}"
                        for setting in s.lora_read.vlm_lora.values())
    if family is None:
        if not s.selection.any_set:
            return []  # the plugin is not asked: VLMLoRA decides (said in the summary)
        return [f"{asked(s)} with VLMLoRA ({written}): the model family is unknown here, so what VLMLoRA's switches "
                "freeze (they name the LLaVA layout's modules) cannot be compared with the flags. Name the family "
                "(--family), or use megatron.bridge.peft.lora.LoRA, which has no switches of its own."]
    effect = vlm_lora_effect(family, switches)
    if effect.missing:
        keys = ", ".join(s.lora_read.vlm_lora[switch].key for switch in effect.missing)
        modules = ", ".join(f"model.{VLM_LORA_MODULES[switch]}" for switch in effect.missing)
        return [f"{keys}=true: VLMLoRA freezes {modules}, which the {family.name} model does not have (VLMLoRA "
                f"names the LLaVA layout's modules), so Bridge's PEFT step would fail with AttributeError. Set "
                f"{keys}: false, or use megatron.bridge.peft.lora.LoRA (with the plugin's flags model.freeze_* to "
                "choose what trains at full rank)."]
    if not s.selection.any_set:
        return []
    flagged = s.selection.frozen_parts()
    differ = sorted({*(effect.frozen ^ flagged), *effect.partial}, key=SELECTABLE_PARTS.index)
    if not differ:
        return []
    said = "; ".join(
        f"{part.value}: {s.key_of(f'freeze_{part.value}')}={'true' if part in flagged else 'false'}, VLMLoRA "
        + ("freezes it" if part in effect.frozen else "freezes part of it" if part in effect.partial
           else "leaves it training")
        for part in differ)
    return [f"{asked(s)} with VLMLoRA ({written}): with the plugin's flags set, the flags decide what trains at "
            f"full rank (the plugin restores its full-rank parts after Bridge's PEFT step), so VLMLoRA's switches "
            f"would be overruled where they differ ({said}). Make them agree, or use "
            "megatron.bridge.peft.lora.LoRA, which has no switches of its own."]


#: Parts that always hold linear modules (an empty target list puts adapters there for certain): the vocabulary's.
ALL_LINEAR_PARTS = frozenset(part for part, info in INFO.items() if info.linear)


def lora_adapter_parts(lora: LoraSettings, family: FamilySpec | None) -> dict[str, str]:
    """Part -> whether LoRA's targets put adapters there: ``"yes"``, ``"may"`` (a leaf name, regex characters, the
    family unknown: the built model tells), or ``"no"``."""
    listed = FreezeSelection().parts_of(None if family is None else family.part_names())
    parts = [part.value for part in listed]
    targets = lora.target_modules
    if targets == ():  # written empty: Bridge's LoRA matches every linear module, less exclude_modules
        return {part.value: "yes" if part in ALL_LINEAR_PARTS and not lora.exclude_modules else "may"
                for part in listed}
    if family is None or targets is None:
        return dict.fromkeys(parts, "may")
    found: dict[str, str] = dict.fromkeys(parts, "no")
    for target in [targets] if isinstance(targets, str) else list(targets):
        reach = _lora_target_parts(str(target), family)
        if reach is None:
            return dict.fromkeys(parts, "may")
        for part in reach[0] - {None}:
            if found.get(part.value) == "no":
                found[part.value] = "may"
        for part in reach[1]:
            if part.value in found:
                found[part.value] = "yes"
    return found
