"""The flags a config does not write, as a run with the plugin builds them from a saved provider (NeMo-RL's
conversion cache: :mod:`._conversion_cache`), said per flag in :attr:`SelectionSources.provider_defaults`."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from bridge_freeze_plugin.config._conversion_cache import find_cache, unwritten_flag_notes
from bridge_freeze_plugin.config._family import provider_flag_defaults
from bridge_freeze_plugin.config._layouts import Layout, resolvers
from bridge_freeze_plugin.config._run_settings import RunSettings
from bridge_freeze_plugin.config._values import section, select
from bridge_freeze_plugin.families import FamilySpec
from bridge_freeze_plugin.request import FLAG_PARTS, FLAGS, FreezeSelection


def with_saved_provider(s: RunSettings, cfg: Any, layout: Layout, family: FamilySpec | None) -> RunSettings:
    """``s`` with each flag the config does not write set as the saved provider holds it (or as a fresh
    conversion with the plugin saves it), and where each came from."""
    assert layout.run.conversion_cache is not None
    with resolvers(layout):
        policy = section(cfg, layout.run.conversion_cache)
        megatron_cfg = section(cfg, layout.homes.flags)
        unwritten = [f for f in FLAGS if all(select(cfg, key) is None for key in s.keys_of(f))]
    known = provider_flag_defaults(family)
    bridge_default = dict.fromkeys(known[1], True) if known else {}
    shown = [f for f in FLAGS if family is None or family.has_part(FLAG_PARTS[f])]  # the model's flags
    values, notes, line = unwritten_flag_notes(find_cache(policy), unwritten, megatron_cfg, bridge_default, shown)
    selection = FreezeSelection(**{**s.selection.as_dict(), **values}, train_patterns=s.selection.train_patterns,
                                freeze_patterns=s.selection.freeze_patterns)
    return replace(s, selection=selection,
                   sources=replace(s.sources, provider_defaults=notes, saved_provider=line))
