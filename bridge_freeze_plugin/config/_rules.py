"""The freeze rules, each a named function over a run's read settings (:class:`RunSettings`).

A config rule returns its problems (one line each); :func:`._checks.check` reports them all together in one
:class:`InvalidFreezeConfigError`, then asks whether a provider no family covers got a flag
(:class:`UnsupportedFreezeFlagError`), then applies the LoRA rules (:mod:`._lora_rules`) and the full-recompute
rule. Every message names the key (and, when it did not come from the config itself, where its value came from),
the setting it conflicts with, and the fix. Documented in ``docs/configuration.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from bridge_freeze_plugin.config._run_settings import RunSettings
from bridge_freeze_plugin.request import FLAGS, FreezeSelection, Part, asked_text, label, spoken

#: The only strategy under which the flags are honoured (they are applied by the Bridge provider).
MEGATRON = "megatron"

Rule = Callable[[RunSettings], list[str]]


def normalise_strategy(value: Any) -> str | None:
    """A strategy as compared: stripped, lower-case; ``None`` when not set."""
    return None if value is None else str(value).strip().lower()


def _flag_list(selection: FreezeSelection, where: str | Callable[[str], str]) -> str:
    """The flags set and the patterns given, as written in the config (``where``: their section, or a function
    from a flag or pattern key to its dotted key)."""
    return asked_text(selection, where if callable(where) else (lambda name: f"{where}.{name}"), true="true")


def asked(s: RunSettings) -> str:
    """The policy's flags set and patterns given, each at its own key."""
    return _flag_list(s.selection, s.key_of)


def reference_model_never_trains(s: RunSettings) -> list[str]:
    """A freeze flag under the reference model's section."""
    if s.sources.reference is None or not s.sources.reference.any_set:
        return []
    return [
        f"{_flag_list(s.sources.reference, str(s.sources.reference_key))}: the reference model never trains, so a "
        "freeze flag "
        f"there has no meaning. Remove it from {s.sources.reference_key}; to choose what the policy trains, "
        f"set the flag under {s.sources.flags_key} instead."
    ]


def neighbours_well_formed(s: RunSettings) -> list[str]:
    """The settings the rules read next to the flags are well-formed once a flag is set (else left to the trainer)."""
    return list(s.sources.malformed) if s.selection.any_set else []


def strategy_must_be_megatron(s: RunSettings) -> list[str]:
    """Only Megatron applies the flags; any other strategy would silently ignore them."""
    if not s.selection.any_set:
        return []
    flags, key, strategy = asked(s), s.run.strategy.key, s.run.strategy.value
    fix = s.run.strategy_fix or f"{key}=megatron"
    if strategy is None:
        unset = s.run.strategy_unset or f"{key} is not set"
        return [
            f"{flags} requires strategy=megatron, but {unset}: the freeze flags are applied by the "
            f"Megatron-Bridge model provider. Set {fix}, or unset the flag(s)."
        ]
    if normalise_strategy(strategy) != MEGATRON:
        why = s.run.strategy_note or f"{strategy} would silently ignore them"
        return [
            f"{flags} requires strategy=megatron, but {s.run.strategy_shown or s.run.strategy.written}: the freeze "
            "flags are "
            "applied by the "
            f"Megatron-Bridge model provider, and {why}. Set {fix}, or unset the flag(s)."
        ]
    return []


def language_model_only_has_no_vision_part(s: RunSettings) -> list[str]:
    """A language-model-only run has none of the model's other parts (vision, audio) to choose from."""
    lmo = s.run.language_model_only
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
    enable = s.lora_read.enable or f"{s.lora_read.rank.key} > 0"
    return [
        f"{asked(s)}: every part of the model is frozen and LoRA is off "
        f"({s.lora_read.rank.key}={s.lora.rank}), so nothing would train. Unset at least one flag, or enable LoRA "
        f"({enable}) to train adapters on the frozen model."
    ]


def lora_with_partial_selection(s: RunSettings) -> list[str]:
    """LoRA with one or two flags trains adapters next to full-rank parts: for SFT; an RL run refuses it."""
    if not (s.lora.enabled and s.selection.any_set and not s.selection.freezes_all(s.parts)) or not s.run.syncs_weights:
        return []
    key = s.lora_read.rank.key
    why = s.run.weight_sync_note or (
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
    lmo = s.run.language_model_only
    if lmo.value is not True:
        return []
    return [
        f"{lmo.written} but {peer.written}: the trainer requires {what}'s language_model_only to agree with "
        f"the policy's. Set {peer.key}=true, or {lmo.key}=false."
        for what, peer in s.run.peers if peer.value is not True
    ]


def part_freezing_hooks_agree(s: RunSettings) -> list[str]:
    """A trainer's own hook that freezes whole parts (NeMo-RL's ``freeze_config``) next to the flags: the build
    refuses a pre-wrap hook that freezes a part the flags train, so the config does."""
    if not s.selection.any_set:
        return []
    trained = {part.value for part in s.selection.trained_parts(s.parts)}
    out = []
    for own in s.sources.own_freeze:
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
