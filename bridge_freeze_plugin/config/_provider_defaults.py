"""The family stage's last step: a run's settings with the model's family, and the flags the config does not write
as the model provider keeps them, for a layout whose trainer passes only the flags written (NeMo-RL): a fresh
provider's defaults (Bridge's ``Qwen3VLMoEModelProvider`` freezes the language model and the vision encoder), or
the saved provider a run with the plugin builds from (NeMo-RL's conversion cache: :mod:`._conversion_cache`). Said
per flag in :attr:`SelectionSources.provider_defaults`."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from bridge_freeze_plugin.config._conversion_cache import find_cache, unwritten_flag_notes
from bridge_freeze_plugin.config._layouts import Layout, resolvers
from bridge_freeze_plugin.config._run_settings import RunSettings
from bridge_freeze_plugin.config._values import section, select
from bridge_freeze_plugin.families import FamilySpec
from bridge_freeze_plugin.registry import REGISTRY
from bridge_freeze_plugin.request import FLAG_PARTS, FLAGS, FreezeSelection, label


def with_family(s: RunSettings, cfg: Any, layout: Layout, family: FamilySpec | None,
                source: str | None) -> RunSettings:
    """``s`` with its family (``source``: how it was found) and, where the layout's trainer leaves a flag the config
    does not write at the provider's value, each such flag as that provider keeps it."""
    s = replace(s, family=family, family_source=source)
    if not layout.run.unwritten_flags_keep_provider_default:
        return s
    known = _provider_flag_defaults(family)
    if layout.run.conversion_cache is not None:  # NeMo-RL: its saved provider, found as NeMo-RL finds it
        return _from_saved_provider(s, cfg, layout, family, known)
    on: dict[str, bool] = {}
    notes: dict[str, str] = {}
    for flag in FLAGS:
        if any(select(cfg, key) is not None for key in s.keys_of(flag)):
            continue
        if known is not None and flag in known[1]:
            on[flag] = True
            notes[flag] = f"not written: {layout.trainer} leaves the provider's default, {known[0]}: true"
        elif family is not None:
            notes[flag] = f"not written: {layout.trainer} leaves the provider's default (false for {family.name})"
        else:
            notes[flag] = (f"not written: {layout.trainer} leaves the provider's default, false on every Bridge "
                           f"provider but {_flag_defaults_sentence()}: name the family to be sure")
    if not on:
        return replace(s, sources=replace(s.sources, provider_defaults=notes))
    selection = FreezeSelection(**{**s.selection.as_dict(), **on}, train_patterns=s.selection.train_patterns,
                                freeze_patterns=s.selection.freeze_patterns)
    return replace(s, selection=selection, sources=replace(s.sources, provider_defaults=notes))


def _from_saved_provider(s: RunSettings, cfg: Any, layout: Layout, family: FamilySpec | None,
                         known: tuple[str, tuple[str, ...]] | None) -> RunSettings:
    """``s`` with each flag the config does not write set as the saved provider holds it (or as a fresh
    conversion with the plugin saves it), and where each came from."""
    assert layout.run.conversion_cache is not None
    bridge_default = dict.fromkeys(known[1], True) if known else {}
    shown = [f for f in FLAGS if family is None or family.has_part(FLAG_PARTS[f])]  # the model's flags
    with resolvers(layout):
        policy = section(cfg, layout.run.conversion_cache)
        megatron_cfg = section(cfg, layout.homes.flags)
        unwritten = [f for f in FLAGS if all(select(cfg, key) is None for key in s.keys_of(f))]
    values, notes, line = unwritten_flag_notes(find_cache(policy), unwritten, megatron_cfg, bridge_default, shown)
    selection = FreezeSelection(**{**s.selection.as_dict(), **values}, train_patterns=s.selection.train_patterns,
                                freeze_patterns=s.selection.freeze_patterns)
    return replace(s, selection=selection,
                   sources=replace(s.sources, provider_defaults=notes, saved_provider=line))


def _provider_flag_defaults(family: FamilySpec | None) -> tuple[str, tuple[str, ...]] | None:
    """(provider class name, the freeze flags it defaults to true), as ``family`` declares them
    (``FamilySpec.provider_flag_defaults``), or ``None``. A trainer that passes only the flags a config writes
    (NeMo-RL) leaves these on."""
    if family is None or not family.provider_flag_defaults:
        return None
    return family.providers[0].rpartition(":")[2], family.provider_flag_defaults


def _flag_defaults_sentence() -> str:
    """``"Qwen3VLMoEModelProvider (language model and vision encoder true)"``: every registered family's provider
    whose freeze flags default to true, as a message names them (``"none"`` when no family declares any)."""
    found = [_provider_flag_defaults(f) for f in REGISTRY]
    return ", ".join(f"{cls} ({' and '.join(label(FLAG_PARTS[flag]) for flag in flags)} true)"
                     for cls, flags in filter(None, found)) or "none"
