"""Config validation for SFT, RL and Bridge runs: every bad combination fails before a model is built.

Each public function reads (:mod:`bridge_freeze_plugin.config`: YAML and overrides, layouts, reading), then checks
(:mod:`bridge_freeze_plugin.config._checks`). The rules: a flag needs strategy ``megatron``; a language-model-only
run has no vision part; every part frozen needs LoRA; LoRA with a partial selection is refused; no flag
under the reference model; a flag on a provider no family covers; full recompute on a family whose
projection loses gradient under it; flags that are real booleans, and no unknown freeze key. See
``docs/configuration.md`` for the layouts.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from omegaconf import DictConfig

from bridge_freeze_plugin.config import _checks as checks
from bridge_freeze_plugin.config._family import config_family, family_arg, family_from_model_path
from bridge_freeze_plugin.config._flags import read_selection
from bridge_freeze_plugin.config._layout_bridge import BRIDGE
from bridge_freeze_plugin.config._layout_sft_rl import RL, SFT
from bridge_freeze_plugin.config._layouts import Layout
from bridge_freeze_plugin.config._provider_defaults import with_family
from bridge_freeze_plugin.config._reading import read_chosen, read_settings
from bridge_freeze_plugin.config._rules import MEGATRON
from bridge_freeze_plugin.config._run_settings import LoraRead, LoraSettings, RunSettings, RunSwitches, SelectionSources
from bridge_freeze_plugin.config._source import LoadedConfig, choose_layout, load, load_config, with_layout
from bridge_freeze_plugin.config._values import Setting
from bridge_freeze_plugin.families import FamilySpec
from bridge_freeze_plugin.registry import family_for_provider
from bridge_freeze_plugin.request import FreezeSelection

__all__ = [
    "ConfigRun",
    "LoraSettings",
    "family_from_model_path",
    "load_config",
    "load_run",
    "read_selection",
    "validate_bridge_config",
    "validate_config",
    "validate_rl_config",
    "validate_selection",
    "validate_sft_config",
]


def validate_selection(
    selection: FreezeSelection,
    *,
    strategy: str | None = MEGATRON,
    language_model_only: bool = False,
    lora: LoraSettings | None = None,
    provider: Any = None,
    family: FamilySpec | str | None = None,
    recompute_granularity: str | None = None,
    where: str = "megatron_config",
) -> FreezeSelection:
    """Check a selection against the run's settings, for any trainer; returns the selection.

    ``provider`` (a Bridge model provider instance or class) or ``family`` (a :class:`FamilySpec`, a
    family name or a provider class name) identify the model family; the provider wins when both are
    given. With neither, the unsupported-provider and full-recompute rules cannot apply (the provider
    checks both again when it builds). ``recompute_granularity`` defaults to the provider's own. ``where``
    is the config section the flags were read from, used in messages. Raises
    :class:`InvalidFreezeConfigError` (or :class:`UnsupportedFreezeFlagError` for a flag on an
    unsupported provider).
    """
    if not isinstance(selection, FreezeSelection):
        raise TypeError(f"selection must be a FreezeSelection, got {type(selection).__name__}")
    if recompute_granularity is None and provider is not None:
        recompute_granularity = getattr(provider, "recompute_granularity", None)
    lora = LoraSettings() if lora is None else lora
    settings = RunSettings(
        layout="api",
        selection=selection,
        sources=SelectionSources(flags_key=where),
        run=RunSwitches(strategy=Setting(strategy, "strategy"),
                        language_model_only=Setting(bool(language_model_only), "language_model_only"),
                        recompute=(Setting(recompute_granularity, "recompute_granularity"),)),
        lora=lora,
        lora_read=LoraRead(rank=Setting(lora.rank, "lora.rank")),
        family=family_arg(family),
        provider=provider,
    )
    return checks.check(settings)


def _validate_layout(cfg: Any, layout: Layout, *, provider: Any, family: FamilySpec | str | None) -> FreezeSelection:
    """The stages of :func:`load_run` on a config given in code: its family (``provider``'s, else the config's),
    the reading, the provider's defaults; then every rule."""
    if provider is not None:
        settings = read_settings(cfg, layout, family=family_for_provider(provider))
        return checks.check(replace(settings, provider=provider, family_source="the provider given"))
    found, how = config_family(cfg, layout, family)
    settings = read_settings(cfg, layout, family=found)
    return checks.check(with_family(settings, cfg, layout, found, how))


def validate_sft_config(
    cfg: DictConfig | Mapping[str, Any], *, provider: Any = None, family: FamilySpec | str | None = None
) -> FreezeSelection:
    """Validate an SFT config (``strategy``, ``model.*``, ``megatron_config.freeze_*``); returns the selection.

    The config is taken as complete (a key it does not write is unset). The family comes from
    ``provider``, else ``family``, else ``model.path`` when it is a local checkpoint with a ``config.json``.
    """
    return _validate_layout(cfg, SFT, provider=provider, family=family)


def validate_rl_config(
    cfg: DictConfig | Mapping[str, Any], *, provider: Any = None, family: FamilySpec | str | None = None
) -> FreezeSelection:
    """Validate an RL config (``trainer.strategy``, ``trainer.policy.*``); returns the policy's selection.

    Also rejects any freeze flag under ``trainer.ref.megatron_config`` (the reference model never
    trains). The family comes from ``provider``, else ``family``, else ``trainer.policy.model.path``.
    """
    return _validate_layout(cfg, RL, provider=provider, family=family)


def validate_bridge_config(
    cfg: DictConfig | Mapping[str, Any], *, provider: Any = None, family: FamilySpec | str | None = None
) -> FreezeSelection:
    """Validate a Megatron-Bridge ``ConfigContainer`` (``run_config.yaml``: ``model.freeze_*``, ``peft``...).

    The family comes from ``provider``, else ``family``, else ``model._target_`` (the provider class).
    """
    return _validate_layout(cfg, BRIDGE, provider=provider, family=family)


def validate_config(
    cfg: DictConfig | Mapping[str, Any],
    rl: bool,
    *,
    provider: Any = None,
    family: FamilySpec | str | None = None,
) -> FreezeSelection:
    """:func:`validate_rl_config` if ``rl`` else :func:`validate_sft_config`."""
    validate = validate_rl_config if rl else validate_sft_config
    return validate(cfg, provider=provider, family=family)


@dataclass(frozen=True)
class ConfigRun:
    """A config as a run would see it (file, defaults list, layout defaults, overrides) and its settings."""

    loaded: LoadedConfig
    settings: RunSettings

    @property
    def layout(self) -> Layout:
        assert self.loaded.layout is not None
        return self.loaded.layout

    def validate(self) -> FreezeSelection:
        """Every rule; returns the selection or raises (see :func:`validate_selection`)."""
        return checks.check(self.settings)

    def adjustments(self) -> list[str]:
        """What the provider build will adjust for this run (e.g. full recompute off in a vision tower)."""
        return checks.adjustments(self.settings)


def load_run(
    path: str | os.PathLike[str] | None = None,
    overrides: Iterable[str] = (),
    *,
    layout: str | None = None,
    family: FamilySpec | str | None = None,
) -> ConfigRun:
    """Read a run's config as ``bridge-freeze check-config`` does: the file (or none: the layout's defaults
    stand in for it), its defaults list, the overrides (``+``/``++``/``~`` understood); the layout detected
    (or ``layout``, which must agree with the file); the trainer's defaults filled in where nothing wrote
    the key. Nothing is checked yet: call :meth:`ConfigRun.validate`.

    A pipeline of stages, each calling down into its own helpers and the values layer (:mod:`._values`): the
    file (:func:`._source.load`), the layout (:func:`._source.choose_layout`, :func:`._source.with_layout`), the
    family (:func:`._family.config_family`), the reading (:func:`._reading.read_chosen`), the provider's defaults
    (:func:`._provider_defaults.with_family`)."""
    loaded = load(path, overrides)
    chosen, reason = choose_layout(loaded, layout)
    loaded = with_layout(loaded, chosen, reason)
    found, how = config_family(loaded.cfg, chosen, family)
    settings = read_chosen(loaded.cfg, chosen, loaded.source, found)
    return ConfigRun(loaded, with_family(settings, loaded.cfg, chosen, found, how))
