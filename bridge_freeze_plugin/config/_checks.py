"""The check of a run's settings, stage by stage (:func:`check`): the config rules (:mod:`._rules`), the provider
and its family (:func:`supported_provider`), the LoRA rules (:mod:`._lora_rules`), then the full-recompute rule.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from bridge_freeze_plugin.config._family import import_target, importable_target
from bridge_freeze_plugin.config._lora_rules import lora_targets_avoid_full_rank_parts, vlm_lora_switches
from bridge_freeze_plugin.config._lora_targets import lora_targets_are_exportable
from bridge_freeze_plugin.config._recompute_rules import (
    megatron_core_problems,
    policy_of,
    policy_problems,
    policy_refusal,
    router_pattern_problems,
)
from bridge_freeze_plugin.config._rules import MEGATRON, asked, config_problems, normalise_strategy
from bridge_freeze_plugin.config._run_settings import RunSettings
from bridge_freeze_plugin.config._values import join_problems
from bridge_freeze_plugin.errors import InvalidFreezeConfigError, PartNotInFamilyError, UnsupportedFreezeFlagError
from bridge_freeze_plugin.families import FamilySpec
from bridge_freeze_plugin.prewrap import full_recompute_adjustment, is_full, resolve_family
from bridge_freeze_plugin.ranks import is_rank0
from bridge_freeze_plugin.registry import REGISTRY, list_families
from bridge_freeze_plugin.request import ALIASES, BY_NAME, FLAG_PARTS, FreezeSelection, label

logger = logging.getLogger("bridge_freeze_plugin")


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
    foreign = [] if family is None or s.sources.foreign_alias is None else [
        k for k in s.sources.aliases_written if k.rsplit(".", 1)[1] not in family.aliases]
    if foreign:
        alias = foreign[0].rsplit(".", 1)[1]
        raise InvalidFreezeConfigError(
            f"{foreign[0]}: the {family.name} model's provider has no field {alias} (Bridge's name of "
            f"{ALIASES[alias]} on another family's provider), so the run would not apply it: "
            f"{s.sources.foreign_alias}. "
            f"Write {s.key_of(ALIASES[alias])} instead.")
    absent = [] if family is None or s.rates.values is None else [
        name for name in s.rates.values.names() if name in BY_NAME and not family.has_part(BY_NAME[name])]
    if absent:
        keys = ", ".join(f"{s.rates.key}.lr_{name}" for name in absent)
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
    if normalise_strategy(s.run.strategy.value) not in (None, MEGATRON) or s.run.language_model_only.value:
        return None
    settings = {r.key or "recompute_granularity": r.value for r in s.run.recompute}
    sources = {r.key or "recompute_granularity": r.source for r in s.run.recompute}
    refuse = policy_of(s) == "refuse"
    note = full_recompute_adjustment(family, s.selection, settings, flags_key=s.sources.flags_key, sources=sources,
                                     warn=warn and is_rank0() and not refuse)
    if note is not None and refuse:  # the build's refusal (a flag set), or its warning with recompute kept
        assert family is not None
        refusal = policy_refusal(s, family, [k for k, v in settings.items() if is_full(v)])
        if s.selection.any_set:
            raise InvalidFreezeConfigError(refusal)
        if warn and is_rank0():
            logger.warning("bridge-freeze: no flag is set, so the build only warns and keeps full recompute (the "
                           "gradients stay wrong there): %s", refusal)
        return None
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


def check(s: RunSettings) -> FreezeSelection:
    """Every rule over ``s``; returns the selection, or raises the first failing stage's error."""
    problems = config_problems(s) + policy_problems(s)
    if normalise_strategy(s.run.strategy.value) in (None, MEGATRON):
        problems += megatron_core_problems(s)
    if problems:
        raise InvalidFreezeConfigError(join_problems(problems))
    family = supported_provider(s)
    problems = (vlm_lora_switches(s, family) + lora_targets_avoid_full_rank_parts(s, family)
                + lora_targets_are_exportable(s, family) + router_pattern_problems(s, family))
    if problems:
        raise InvalidFreezeConfigError(join_problems(problems))
    full_recompute_rule(replace(s, family=family), family)
    return s.selection


def adjustments(s: RunSettings) -> list[str]:
    """What the provider build will adjust for this run (said, never refused): one line each."""
    note = full_recompute_rule(s, supported_provider(s), warn=False)
    return [note] if note else []
