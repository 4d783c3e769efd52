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
from bridge_freeze_plugin.config._family import family_from_model_path, family_from_name, family_from_target
from bridge_freeze_plugin.config._flags import read_selection
from bridge_freeze_plugin.config._layout_bridge import BRIDGE
from bridge_freeze_plugin.config._layout_sft_rl import RL, SFT
from bridge_freeze_plugin.config._layouts import Layout
from bridge_freeze_plugin.config._reading import read_settings, with_provider_defaults
from bridge_freeze_plugin.config._rules import MEGATRON
from bridge_freeze_plugin.config._run_settings import LoraRead, LoraSettings, RunSettings, RunSwitches, SelectionSources
from bridge_freeze_plugin.config._source import LoadedConfig, choose_layout, load, load_config, with_layout
from bridge_freeze_plugin.config._values import Setting, select
from bridge_freeze_plugin.families import FamilySpec
from bridge_freeze_plugin.registry import REGISTRY, family_for_provider
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


def _family_arg(family: FamilySpec | str | None) -> FamilySpec | None:
    if family is None or isinstance(family, FamilySpec):
        return family
    return REGISTRY.find(family)


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
        family=_family_arg(family),
        provider=provider,
    )
    return checks.check(settings)


def _with_family(settings: RunSettings, cfg: Any, layout: Layout, provider: Any,
                 family: FamilySpec | str | None) -> RunSettings:
    """``settings`` with the family: ``provider``, else ``family``, else the model path, else ``_target_``."""
    if provider is not None:
        return replace(settings, provider=provider, family_source="the provider given")
    target = None if settings.provider_target is None else settings.provider_target.value
    resolved, source = _family_of(cfg, layout, family, target)
    settings = with_provider_defaults(settings, cfg, layout, resolved)
    return replace(settings, family=resolved, family_source=source)


def _family_of(cfg: Any, layout: Layout, family: FamilySpec | str | None,
               target: str | None) -> tuple[FamilySpec | None, str | None]:
    """The family and how it was found: ``family``, else the model path, else ``target`` (the provider class)."""
    resolved, source = _family_arg(family), "named by the caller"
    if resolved is None and layout.model.path is not None:
        model_path = select(cfg, layout.model.path)
        resolved = family_from_model_path(model_path) if isinstance(model_path, str) else None
        source = f"{layout.model.path}'s config.json (model_type)"
        if resolved is None and layout.model.family_from_name and isinstance(model_path, str):
            resolved = family_from_name(model_path)
            source = (f"{layout.model.path}={model_path}: a guess from the name (no local config.json to read; "
                      "--family NAME to be sure)")
    if resolved is None and target is not None:
        resolved = family_from_target(target)
        source = f"{layout.model.provider_target} (the provider class)"
    return resolved, source if resolved is not None else None


def _known_family(cfg: Any, layout: Layout, provider: Any, family: FamilySpec | str | None) -> FamilySpec | None:
    """The family as far as it is known before the settings are read, for their messages (a learning-rate key
    that names no part is answered from the model's own parts); :func:`_with_family` decides it for the rules."""
    if provider is not None:
        return family_for_provider(provider)
    try:
        target = select(cfg, layout.model.provider_target) if layout.model.provider_target else None
    except Exception:  # noqa: BLE001 - a malformed target is reported by read_settings; here it only names no family
        target = None
    return _family_of(cfg, layout, family, None if target is None else str(target))[0]


def _validate_layout(cfg: Any, layout: Layout, *, provider: Any, family: FamilySpec | str | None) -> FreezeSelection:
    settings = read_settings(cfg, layout, family=_known_family(cfg, layout, provider, family))
    return checks.check(_with_family(settings, cfg, layout, provider, family))


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
    the key. Nothing is checked yet: call :meth:`ConfigRun.validate`."""
    loaded = load(path, overrides)
    chosen, reason = choose_layout(loaded, layout)
    loaded = with_layout(loaded, chosen, reason)
    settings = read_settings(loaded.cfg, chosen, loaded.source, _known_family(loaded.cfg, chosen, None, family))
    return ConfigRun(loaded, _with_family(settings, loaded.cfg, chosen, None, family))
