"""The reading stage: a chosen layout + a config -> :class:`RunSettings`, every value the rules read and where it
came from, in steps: the whole config resolved where the trainer resolves it, one survey of its keys
(:mod:`._misplaced`), the sections read in one place (:class:`~._values.Sections`), the selection
(:mod:`._flags`), then the settings next to it (:mod:`._setting_readers`) and the per-part learning rates.

Reading judges only the shape of a value (a flag that is not a real boolean, a key that looks like a
misspelt flag: errors at once); what the values mean together is for :mod:`bridge_freeze_plugin.config._rules`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from bridge_freeze_plugin.config._flags import read_plugin_keys
from bridge_freeze_plugin.config._layouts import Layout, resolvers
from bridge_freeze_plugin.config._misplaced import survey
from bridge_freeze_plugin.config._run_settings import LoraRead, RateSettings, RunSettings, RunSwitches
from bridge_freeze_plugin.config._setting_readers import (
    bool_setting,
    learning_rate_key,
    learning_rate_section,
    read_lora,
    read_peers,
    read_policy,
    read_provider_recompute,
    read_recompute,
    read_strategy,
    read_syncs_weights,
    read_vlm_lora,
    switches_shown,
)
from bridge_freeze_plugin.config._skyrl import adapt
from bridge_freeze_plugin.config._values import IN_CONFIG, Sections, Setting, Source, join_problems, select
from bridge_freeze_plugin.config._yaml_overrides import brief
from bridge_freeze_plugin.errors import InvalidFreezeConfigError
from bridge_freeze_plugin.families import FamilySpec
from bridge_freeze_plugin.optim import read_part_learning_rates


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
        layout, _ = adapt(cfg, layout)
    return read_chosen(cfg, layout, source, family)


def read_chosen(cfg: Any, layout: Layout, source: Source, family: FamilySpec | None = None) -> RunSettings:
    """:func:`read_settings` for a layout as chosen for the config (a SkyRL layout already adapted to it:
    :func:`._source.choose_layout`), under its trainer's resolvers."""
    with resolvers(layout):
        if layout.run.resolves_whole_config:
            _resolve_all(cfg, layout)
        misplaced, unread, own_freeze = survey(cfg, layout, source)
        if misplaced:
            raise InvalidFreezeConfigError(join_problems(misplaced))
        sections = Sections(cfg, (*layout.homes.plugin_homes, layout.homes.reference_flags, layout.lora.section,
                                  learning_rate_key(layout)))
        selection, where, flags = read_plugin_keys(sections, layout)
        malformed: list[str] = []
        strategy, strategy_note = read_strategy(cfg, layout, source)
        lmo = bool_setting(cfg, layout.model.language_model_only, source, malformed)
        lora, rank, lora_values = read_lora(cfg, sections, layout, source, malformed)
        target = select(cfg, layout.model.provider_target) if layout.model.provider_target else None
        lora_class = select(cfg, f"{layout.lora.section}._target_") if lora.enabled else None
        # Per-part learning rates (lr_<part>, min_lr_<part>): next to the flags, or (Bridge) on the optimizer
        # override provider; checked as they are read.
        learning_rates = read_part_learning_rates(
            learning_rate_section(sections, layout, flags), where=layout.lr_section,
            frozen=selection.untrained_parts(), lora=lora.enabled, flags_where=layout.homes.flags,
            parts=None if family is None else family.part_names(),
            model="the model" if family is None else f"the {family.name} model")
        run = RunSwitches(
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
        )
        lora_read = LoraRead(rank=rank, enable=layout.lora.enable(),
                             lora_class=None if lora_class is None else str(lora_class),
                             vlm_lora=read_vlm_lora(cfg, layout.lora, lora, lora_values, source))
    return RunSettings(
        layout=layout.name,
        selection=selection,
        sources=replace(where, own_freeze=own_freeze, unread_freeze_keys=tuple(unread), malformed=tuple(malformed)),
        run=run,
        lora=lora,
        lora_read=lora_read,
        rates=RateSettings(values=learning_rates, key=layout.lr_section),
        provider_target=None if target is None else Setting(str(target), layout.model.provider_target,
                                                             source(str(layout.model.provider_target))),
        trainer=layout.trainer,
    )


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
