"""The freeze rules, each a named function over a run's read settings (:class:`RunSettings`).

A config rule returns its problems (one line each); :func:`check` reports them all together in one
:class:`InvalidFreezeConfigError`, then asks whether a provider no family covers got a flag
(:class:`UnsupportedFreezeFlagError`), then applies the full-recompute rule. Every message names the
key (and, when it did not come from the config itself, where its value came from), the setting it
conflicts with, and the fix. Documented in ``docs/configuration.md``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from bridge_freeze_plugin.config._family import import_target, importable_target
from bridge_freeze_plugin.config._lora_targets import lora_targets_are_exportable
from bridge_freeze_plugin.config._run_settings import LoraSettings, RunSettings
from bridge_freeze_plugin.config._values import join_problems
from bridge_freeze_plugin.errors import InvalidFreezeConfigError, PartNotInFamilyError, UnsupportedFreezeFlagError
from bridge_freeze_plugin.families import REGISTRY, FamilySpec, list_families
from bridge_freeze_plugin.prewrap import full_recompute_adjustment, is_full, resolve_family
from bridge_freeze_plugin.ranks import is_rank0
from bridge_freeze_plugin.request import (
    ALIASES,
    BY_NAME,
    FLAG_PARTS,
    FLAGS,
    INFO,
    SELECTABLE_PARTS,
    FreezeSelection,
    Part,
    asked_text,
    label,
    spoken,
)

logger = logging.getLogger("bridge_freeze_plugin")

#: The only strategy under which the flags are honoured (they are applied by the Bridge provider).
MEGATRON = "megatron"

Rule = Callable[[RunSettings], list[str]]


def normalise_strategy(value: Any) -> str | None:
    """A strategy as compared: stripped, lower-case; ``None`` when not set."""
    return None if value is None else str(value).strip().lower()


def flag_list(selection: FreezeSelection, where: str | Callable[[str], str]) -> str:
    """The flags set and the patterns given, as written in the config (``where``: their section, or a function
    from a flag or pattern key to its dotted key)."""
    return asked_text(selection, where if callable(where) else (lambda name: f"{where}.{name}"), true="true")


def asked(s: RunSettings) -> str:
    """The policy's flags set and patterns given, each at its own key."""
    return flag_list(s.selection, s.key_of)


def reference_model_never_trains(s: RunSettings) -> list[str]:
    """A freeze flag under the reference model's section."""
    if s.reference is None or not s.reference.any_set:
        return []
    return [
        f"{flag_list(s.reference, str(s.reference_key))}: the reference model never trains, so a freeze flag "
        f"there has no meaning. Remove it from {s.reference_key}; to choose what the policy trains, "
        f"set the flag under {s.flags_key} instead."
    ]


def neighbours_well_formed(s: RunSettings) -> list[str]:
    """The settings the rules read next to the flags are well-formed once a flag is set (else left to the trainer)."""
    return list(s.malformed) if s.selection.any_set else []


def strategy_must_be_megatron(s: RunSettings) -> list[str]:
    """Only Megatron applies the flags; any other strategy would silently ignore them."""
    if not s.selection.any_set:
        return []
    flags, key, strategy = asked(s), s.strategy.key, s.strategy.value
    fix = s.strategy_fix or f"{key}=megatron"
    if strategy is None:
        unset = s.strategy_unset or f"{key} is not set"
        return [
            f"{flags} requires strategy=megatron, but {unset}: the freeze flags are applied by the "
            f"Megatron-Bridge model provider. Set {fix}, or unset the flag(s)."
        ]
    if normalise_strategy(strategy) != MEGATRON:
        why = s.strategy_note or f"{strategy} would silently ignore them"
        return [
            f"{flags} requires strategy=megatron, but {s.strategy_shown or s.strategy.written}: the freeze flags are "
            "applied by the "
            f"Megatron-Bridge model provider, and {why}. Set {fix}, or unset the flag(s)."
        ]
    return []


def language_model_only_has_no_vision_part(s: RunSettings) -> list[str]:
    """A language-model-only run has none of the model's other parts (vision, audio) to choose from."""
    lmo = s.language_model_only
    if not (s.selection.any_set and lmo.value):
        return []
    none_of = spoken(label(p) for p in s.parts if p is not Part.LANGUAGE_MODEL) or "other part"
    return [
        f"{asked(s)} cannot be combined with {lmo.written}: a language-model-only "
        f"run has no {none_of} to choose from. Unset the flag(s), or set {lmo.key}=false."
    ]


def every_part_frozen_needs_lora(s: RunSettings) -> list[str]:
    """Every part frozen and no adapters: nothing would train."""
    if not (s.selection.freezes_all(s.parts) and not s.lora.enabled) or s.selection.train_patterns:
        return []  # (train patterns make parts of the frozen model train)
    enable = s.lora_enable or f"{s.lora_rank.key} > 0"
    return [
        f"{asked(s)}: every part of the model is frozen and LoRA is off "
        f"({s.lora_rank.key}={s.lora.rank}), so nothing would train. Unset at least one flag, or enable LoRA "
        f"({enable}) to train adapters on the frozen model."
    ]


def lora_with_partial_selection(s: RunSettings) -> list[str]:
    """LoRA with one or two flags trains adapters next to full-rank parts: for SFT; an RL run refuses it."""
    if not (s.lora.enabled and s.selection.any_set and not s.selection.freezes_all(s.parts)) or not s.syncs_weights:
        return []
    key = s.lora_rank.key
    why = s.weight_sync_note or (
        "the full-rank parts would need syncing too, which the trainer does not do, so generation would run on "
        "stale weights")
    return [
        f"{asked(s)} with LoRA ({key}={s.lora.rank}) in an RL run: LoRA with full-rank parts "
        f"({s.selection.describe(s.parts).removeprefix('train ')} at full rank next to the adapters) is supported for "
        f"SFT only. The rollout engine's weight sync moves the adapters (or the merged weights) to the inference "
        f"engine; {why}. Use LoRA with every part's flag true (adapters only), plain LoRA (no flag), or "
        f"LoRA off to train the selected parts at full rank."
    ]


def language_model_only_agrees(s: RunSettings) -> list[str]:
    """A language-model-only policy needs the reference model (when used) and the inference engine to agree."""
    lmo = s.language_model_only
    if lmo.value is not True:
        return []
    return [
        f"{lmo.written} but {peer.written}: the trainer requires {what}'s language_model_only to agree with "
        f"the policy's. Set {peer.key}=true, or {lmo.key}=false."
        for what, peer in s.peers if peer.value is not True
    ]


def part_freezing_hooks_agree(s: RunSettings) -> list[str]:
    """A trainer's own hook that freezes whole parts (NeMo-RL's ``freeze_config``) next to the flags: the build
    refuses a pre-wrap hook that freezes a part the flags train, so the config does."""
    if not s.selection.any_set:
        return []
    trained = {part.value for part in s.selection.trained_parts(s.parts)}
    out = []
    for own in s.own_freeze:
        part = own.name.removeprefix("freeze_")
        if own.setting.freezes_parts and own.value is True and own.name in FLAGS and part in trained:
            out.append(
                f"{own.key}=true: {own.setting.by} freezes the {part} whole, but {asked(s)} trains it: the build "
                f"refuses a pre-wrap hook that freezes a part the flags train (FreezeGuaranteeError). Set "
                f"{s.key_of(own.name)}=true instead and remove {own.key}, or set it false."
            )
    return out


#: The config rules, in the order their problems are listed.
CONFIG_RULES: tuple[Rule, ...] = (
    reference_model_never_trains,
    neighbours_well_formed,
    strategy_must_be_megatron,
    language_model_only_has_no_vision_part,
    every_part_frozen_needs_lora,
    lora_with_partial_selection,
    language_model_only_agrees,
    part_freezing_hooks_agree,
)


def config_problems(s: RunSettings, rules: Sequence[Rule] = CONFIG_RULES) -> list[str]:
    return [problem for rule in rules for problem in rule(s)]


def supported_provider(s: RunSettings) -> FamilySpec | None:
    """The family, checking that a provider given (or named by ``_target_``) with a flag set is covered, and
    that every flag set names a part the family has (:class:`PartNotInFamilyError`)."""
    family = _covered_family(s)
    missing = [] if family is None else [f for f in s.selection.set_flags() if not family.has_part(FLAG_PARTS[f])]
    if missing:
        keys = ", ".join(f"{s.key_of(f)}=true" for f in missing)
        what = " and ".join(label(FLAG_PARTS[f]) for f in missing)
        raise PartNotInFamilyError(
            f"{keys}: the {family.name} model has no {what} (its parts: {family.describe_parts()}), so the flag "
            f"cannot freeze anything. Remove {', '.join(s.key_of(f) for f in missing)} (or set it to false)."
        )
    foreign = [] if family is None or s.foreign_alias is None else [
        k for k in s.aliases_written if k.rsplit(".", 1)[1] not in family.aliases]
    if foreign:
        alias = foreign[0].rsplit(".", 1)[1]
        raise InvalidFreezeConfigError(
            f"{foreign[0]}: the {family.name} model's provider has no field {alias} (Bridge's name of "
            f"{ALIASES[alias]} on another family's provider), so the run would not apply it: {s.foreign_alias}. "
            f"Write {s.key_of(ALIASES[alias])} instead.")
    absent = [] if family is None or s.learning_rates is None else [
        name for name in s.learning_rates.names() if name in BY_NAME and not family.has_part(BY_NAME[name])]
    if absent:
        keys = ", ".join(f"{s.learning_rates_key}.lr_{name}" for name in absent)
        raise PartNotInFamilyError(
            f"{keys}: the {family.name} model has no {' and '.join(label(BY_NAME[n]) for n in absent)} (its "
            f"parts: {family.describe_parts()}), so the learning rate would never apply. Remove {keys}.")
    return family


def _covered_family(s: RunSettings) -> FamilySpec | None:
    if s.provider is not None:
        return resolve_family(s.provider, s.selection) or s.family
    target = s.provider_target
    if s.family is not None or target is None or not s.selection.any_set:
        return s.family
    cls = import_target(target.value)
    if cls is not None:
        return resolve_family(cls, s.selection)
    supported = ", ".join(f.name for f in list_families())
    why = ("it cannot be imported here to look for a covered base class" if importable_target(target.value)
           else "a config's _target_ is imported only from Megatron-Bridge's own modules, never other code, so a "
                "covered base class cannot be looked for")
    raise UnsupportedFreezeFlagError(
        f"{asked(s)} was set on the provider {target.written}, but no bridge-freeze "
        f"family covers this class ({why}), so the flag cannot be honoured. Supported families: {supported}. "
        "Unset the flag, name the family if the class extends a covered provider (--family NAME, family=... in "
        "code), or register the model's family with bridge_freeze_plugin.register_family(...)."
    )


def full_recompute_rule(s: RunSettings, family: FamilySpec | None, *, warn: bool = True) -> str | None:
    """Full recompute on a family where it gives wrong gradients: the build's adjustment, said now (a warning)."""
    if normalise_strategy(s.strategy.value) not in (None, MEGATRON) or s.language_model_only.value:
        return None
    settings = {r.key or "recompute_granularity": r.value for r in s.recompute}
    sources = {r.key or "recompute_granularity": r.source for r in s.recompute}
    note = full_recompute_adjustment(family, s.selection, settings, flags_key=s.flags_key, sources=sources,
                                     warn=warn and is_rank0())
    if not warn:
        return note
    full_keys = [key for key, value in settings.items() if is_full(value)]
    if family is None and full_keys and s.selection.any_set and s.selection.trained_parts(s.parts) and is_rank0():
        affected = ", ".join(f.name for f in REGISTRY if f.no_full_recompute) or "none registered"
        logger.warning(
            "bridge-freeze: %s with %s, but the model family is not known from the config, so whether full "
            "recompute needs adjusting (on some families it gives wrong gradients: %s) is decided when the "
            "provider is built. To see it now, name the family (family=... in code, --family with "
            "bridge-freeze check-config).",
            " and ".join(f"{k}=full" for k in full_keys), asked(s), affected,
        )
    return note


#: Characters that make a LoRA target more than a wildcard path (Bridge compiles a target as a regular expression,
#: ``*`` -> ``(.*)``): with one of them, which modules it reaches is for the build to say.
_REGEX_CHARACTERS = frozenset("[](){}?+^$|\\")


def lora_target_parts(target: str, family: FamilySpec) -> tuple[frozenset[Part | None], frozenset[Part]] | None:
    """``(parts it may reach, parts it certainly reaches)`` for a LoRA target, as Bridge matches targets;
    ``None`` when the config cannot tell (a leaf name, or regex characters).

    Bridge (``ModuleMatcher.match``) puts an adapter on a module whose own name equals the target, or whose full
    name matches it with ``*`` standing for any text. A name without ``.`` or ``*`` is a leaf name, found in any
    part: only the built model tells. Otherwise the names it matches start with its literal head (the text before
    the first ``*``): they may lie in the part of the longest family prefix the head lies under, and in every part
    with a prefix that begins with the head (``None``: names under no prefix). It certainly reaches a part when
    that is the only part it may reach, or when it ends with ``*`` and so matches every module under one of the
    part's prefixes (``vision_model.*`` covers ``vision_model.merger``). (``.`` is read as the separator it stands
    for in module names.)
    """
    if ("." not in target and "*" not in target) or _REGEX_CHARACTERS & set(target):
        return None
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


def _lora_section(s: RunSettings) -> str:
    return (s.lora_rank.key or "lora.rank").rpartition(".")[0]


def lora_targets_avoid_full_rank_parts(s: RunSettings, family: FamilySpec | None) -> list[str]:
    """A LoRA target that certainly reaches modules of a part trained at full rank: an overlap the build refuses.

    Refused only when certain (:func:`lora_target_parts`, and no freeze pattern could make those tensors
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
        reach = lora_target_parts(str(target), family)
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
    if s.vlm_lora is None:
        return []
    switches = {flag: bool(setting.value) for flag, setting in s.vlm_lora.items()}
    written = ", ".join(f"{setting.key}={'true' if setting.value else 'false'}" for setting in s.vlm_lora.values())
    if family is None:
        if not s.selection.any_set:
            return []  # the plugin is not asked: VLMLoRA decides (said in the summary)
        return [f"{asked(s)} with VLMLoRA ({written}): the model family is unknown here, so what VLMLoRA's switches "
                "freeze (they name the LLaVA layout's modules) cannot be compared with the flags. Name the family "
                "(--family), or use megatron.bridge.peft.lora.LoRA, which has no switches of its own."]
    effect = vlm_lora_effect(family, switches)
    if effect.missing:
        keys = ", ".join(s.vlm_lora[switch].key for switch in effect.missing)
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
        reach = lora_target_parts(str(target), family)
        if reach is None:
            return dict.fromkeys(parts, "may")
        for part in reach[0] - {None}:
            if found.get(part.value) == "no":
                found[part.value] = "may"
        for part in reach[1]:
            if part.value in found:
                found[part.value] = "yes"
    return found


def check(s: RunSettings) -> FreezeSelection:
    """Every rule over ``s``; returns the selection, or raises the first failing stage's error."""
    problems = config_problems(s)
    if problems:
        raise InvalidFreezeConfigError(join_problems(problems))
    family = supported_provider(s)
    problems = (vlm_lora_switches(s, family) + lora_targets_avoid_full_rank_parts(s, family)
                + lora_targets_are_exportable(s, family))
    if problems:
        raise InvalidFreezeConfigError(join_problems(problems))
    full_recompute_rule(replace(s, family=family), family)
    return s.selection


def adjustments(s: RunSettings) -> list[str]:
    """What the provider build will adjust for this run (said, never refused): one line each."""
    note = full_recompute_rule(s, supported_provider(s), warn=False)
    return [note] if note else []
