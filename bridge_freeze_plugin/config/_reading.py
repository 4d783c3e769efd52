"""A layout + a config -> :class:`RunSettings`: every value the rules read, and where it came from.

Reading judges only the shape of a value (a flag that is not a real boolean, a key that looks like a
misspelt flag: errors at once); what the values mean together is for :mod:`bridge_freeze_plugin.config._rules`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from bridge_freeze_plugin.config._flags import checked_section, read_selection, selection_from_sections
from bridge_freeze_plugin.config._layout_detect import PLUGIN_KEYS
from bridge_freeze_plugin.config._layouts import Layout, resolvers
from bridge_freeze_plugin.config._misplaced import misplaced_keys, read_own_freeze, unread_freeze_keys
from bridge_freeze_plugin.config._recompute_rules import read_policy, read_provider_recompute
from bridge_freeze_plugin.config._run_settings import (
    LoraRead,
    RateSettings,
    RunSettings,
    RunSwitches,
    SelectionSources,
)
from bridge_freeze_plugin.config._setting_readers import (
    bool_setting,
    learning_rate_section,
    read_lora,
    read_peers,
    read_recompute,
    read_strategy,
    read_syncs_weights,
    read_vlm_lora,
    switches_shown,
)
from bridge_freeze_plugin.config._values import IN_CONFIG, Setting, Source, join_problems, section, select
from bridge_freeze_plugin.config._yaml_overrides import brief
from bridge_freeze_plugin.errors import InvalidFreezeConfigError
from bridge_freeze_plugin.families import FamilySpec
from bridge_freeze_plugin.optim import read_part_learning_rates
from bridge_freeze_plugin.request import ALIASES, FLAGS, FreezeSelection


def _resolve_all(cfg: Any, layout: Layout) -> None:
    """The trainer resolves every interpolation at start: one that fails would stop the run, so it is an error."""
    try:
        OmegaConf.to_container(cfg, resolve=True) if OmegaConf.is_config(cfg) else None
    except OmegaConfBaseException as exc:
        raise InvalidFreezeConfigError(
            f"an interpolation cannot be resolved, and {layout.trainer} resolves the whole config when it starts "
            f"(OmegaConf.to_container(resolve=True)), so the run would stop there: {brief(exc)}"
        ) from exc
    except RecursionError:
        raise InvalidFreezeConfigError("an interpolation refers to itself, or nests too deep, and "
                                       f"{layout.trainer} resolves the whole config when it starts") from None


def read_settings(cfg: Any, layout: Layout, source: Source | None = None,
                  family: FamilySpec | None = None) -> RunSettings:
    """Every value the rules read from ``cfg`` in ``layout``; ``source(key)`` says where a key's value came from;
    ``family``: the model's, when known (a learning-rate key that names no part is answered from its parts).

    Raises at once for a flag that is not a boolean or an unknown freeze key (policy or reference model), and
    for a flag, pattern or learning rate written where this layout's runs never read it; a malformed
    neighbouring setting is kept in :attr:`SelectionSources.malformed`.
    """
    source = source or (lambda key: IN_CONFIG)
    if not isinstance(cfg, (DictConfig, Mapping)):
        raise TypeError(f"expected an OmegaConf DictConfig or a mapping, got {type(cfg).__name__}")
    if layout.run.skyrl is not None:  # SkyRL's layout given in code: checked and read as the SkyRL here reads it
        from bridge_freeze_plugin.config._skyrl import adapt

        layout, _ = adapt(cfg, layout)
    with resolvers(layout):
        return _read(cfg, layout, source, family)


def _read(cfg: Any, layout: Layout, source: Source, family: FamilySpec | None = None) -> RunSettings:
    if layout.run.resolves_whole_config:
        _resolve_all(cfg, layout)
    misplaced = misplaced_keys(cfg, layout)
    if misplaced:
        raise InvalidFreezeConfigError(join_problems(misplaced))
    homes, sections, selection, reference = _selections(cfg, layout)
    malformed: list[str] = []
    strategy, strategy_note = read_strategy(cfg, layout, source)
    lmo = bool_setting(cfg, layout.model.language_model_only, source, malformed)
    lora, rank = read_lora(cfg, layout, source, malformed)
    target = select(cfg, layout.model.provider_target) if layout.model.provider_target else None
    lora_class = select(cfg, f"{layout.lora.section}._target_") if lora.enabled else None
    # Per-part learning rates (lr_<part>, min_lr_<part>): next to the flags, or (Bridge) on the optimizer
    # override provider; checked as they are read.
    learning_rates = read_part_learning_rates(learning_rate_section(cfg, layout, sections[layout.homes.flags]),
                                              where=layout.lr_section, frozen=selection.untrained_parts(),
                                              lora=lora.enabled, flags_where=layout.homes.flags,
                                              parts=None if family is None else family.part_names(),
                                              model="the model" if family is None else f"the {family.name} model")
    return RunSettings(
        layout=layout.name,
        selection=selection,
        sources=_sources(cfg, layout, source, homes, sections, reference, malformed),
        run=RunSwitches(
            strategy=strategy,
            language_model_only=lmo,
            recompute=read_recompute(cfg, layout.strategy, source),
            peers=read_peers(cfg, layout.model, source),
            strategy_fix=layout.strategy.key_fix(),
            strategy_note=strategy_note,
            strategy_unset=(f"none of {' / '.join(k for k, _ in layout.strategy.switches)} is true (no backend)"
                            if layout.strategy.switches else None),
            strategy_shown=switches_shown(cfg, layout.strategy, source),
            syncs_weights=read_syncs_weights(cfg, layout.run),
            weight_sync_note=layout.run.weight_sync_note,
            recompute_policy=read_policy(cfg, layout, source),
            provider_recompute=read_provider_recompute(cfg, layout, source),
        ),
        lora=lora,
        lora_read=LoraRead(rank=rank, enable=layout.lora.enable(),
                           lora_class=None if lora_class is None else str(lora_class),
                           vlm_lora=read_vlm_lora(cfg, layout.lora, lora, source)),
        rates=RateSettings(values=learning_rates, key=layout.lr_section),
        provider_target=None if target is None else Setting(str(target), layout.model.provider_target,
                                                             source(str(layout.model.provider_target))),
        trainer=layout.trainer,
    )


def _sources(cfg: Any, layout: Layout, source: Source, homes: Mapping[str, str],
             sections: Mapping[str, Mapping[str, Any]], reference: FreezeSelection | None,
             malformed: list[str]) -> SelectionSources:
    """Where the selection was read (the plugin keys, Bridge's names of a flag, the reference model's flags) and
    the ``freeze_*`` keys that are not the plugin's."""
    return SelectionSources(
        flags_key=layout.homes.flags,
        flag_keys={key: f"{home}.{key}" for key, home in homes.items() if home != layout.homes.flags},
        alias_keys={flag: tuple(f"{layout.homes.alias_home(a)}.{a}" for a, f in ALIASES.items() if f == flag)
                    for flag in FLAGS},
        aliases_written=tuple(f"{layout.homes.alias_home(a)}.{a}" for a in ALIASES
                              if a in sections.get(layout.homes.alias_home(a), {})),
        foreign_alias=layout.homes.foreign_alias,
        reference=reference,
        reference_key=layout.homes.reference_flags,
        own_freeze=read_own_freeze(cfg, layout, source),
        unread_freeze_keys=tuple(unread_freeze_keys(cfg, layout)),
        malformed=tuple(malformed),
    )


def _selections(cfg: Any, layout: Layout) -> tuple[dict[str, str], dict[str, Mapping[str, Any]], FreezeSelection,
                                                    FreezeSelection | None]:
    """The plugin keys' homes, their checked sections, the policy's selection and the reference model's."""
    homes = {key: layout.homes.home(key) for key in PLUGIN_KEYS}
    sections = {}
    for home in layout.homes.plugin_homes:
        known = layout.homes.own_keys(home)
        sections[home] = checked_section(section(cfg, home), home, known or frozenset(),
                                          layout.homes.refused_here(home), any_own=known is None)
    selection = selection_from_sections(sections, {**homes, **{a: layout.homes.alias_home(a) for a in ALIASES}},
                           saved=layout.homes.saves_every_field)
    reference = None
    if layout.homes.reference_flags is not None:
        reference = read_selection(section(cfg, layout.homes.reference_flags), where=layout.homes.reference_flags,
                                   known=layout.homes.own_keys(layout.homes.reference_flags) or frozenset())
    return homes, sections, selection, reference


def with_provider_defaults(s: RunSettings, cfg: Any, layout: Layout, family: FamilySpec | None) -> RunSettings:
    """``s`` with the flags the config does not write set as the model provider keeps them, for a layout whose
    trainer passes only the flags written (NeMo-RL): Bridge's ``Qwen3VLMoEModelProvider`` freezes the language
    model and the vision encoder by default. Said per flag in :attr:`SelectionSources.provider_defaults`."""
    if not layout.run.unwritten_flags_keep_provider_default:
        return s
    if layout.run.conversion_cache is not None:  # NeMo-RL: its saved provider, found as NeMo-RL finds it
        from bridge_freeze_plugin.config._saved_provider import with_saved_provider

        return with_saved_provider(s, cfg, layout, family)
    from bridge_freeze_plugin.config._family import flag_defaults_sentence, provider_flag_defaults

    known = provider_flag_defaults(family)
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
                           f"provider but {flag_defaults_sentence()}: name the family to be sure")
    if not on:
        return replace(s, sources=replace(s.sources, provider_defaults=notes))
    selection = FreezeSelection(**{**s.selection.as_dict(), **on}, train_patterns=s.selection.train_patterns,
                                freeze_patterns=s.selection.freeze_patterns)
    return replace(s, selection=selection, sources=replace(s.sources, provider_defaults=notes))
