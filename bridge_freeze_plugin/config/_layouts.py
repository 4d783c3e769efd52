"""Config layouts as data: where each setting the rules read lives, and the defaults the rules depend on.

One table per layout, like the families' tables, each in its trainer's module: the trainer's SFT and RL configs
(:mod:`._layout_sft_rl`), Megatron-Bridge's own ``ConfigContainer`` (what Bridge writes as ``run_config.yaml`` in a
checkpoint: :mod:`._layout_bridge`) and NeMo-RL's GRPO / SFT configs (:mod:`._layout_nemorl`); this module holds
:class:`Layout` itself and what several tables share. A layout is recognised from the file
(:func:`._layout_detect.detect`), weighing all its evidence: keys only one layout has (its :attr:`Layout.decides`
markers) decide; keys several layouts may hold (:attr:`Layout.hints`) are hints, said when they conflict; two
deciding layouts are an error. ``--layout`` forces one. What a rule needs to know about a layout is a field here
(``run.syncs_weights``, ``strategy.switches``...), never a test of its name: a new layout is a new table. Its
fields are grouped by job, one record each (:mod:`._layout_records`), and each reader takes its group.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from omegaconf import OmegaConf

from bridge_freeze_plugin.config._layout_records import (
    Homes,
    LoraKeys,
    ModelKeys,
    OwnSetting,
    RateKeys,
    StrategyKeys,
    TrainerFacts,
)
from bridge_freeze_plugin.request import Part


@dataclass(frozen=True)
class Marker:
    """Keys that, all present, point at a layout. A last segment ending in ``*`` matches any key it starts."""

    keys: tuple[str, ...]

    def found(self, top: Mapping[str, Any]) -> list[str] | None:
        """The keys as found in ``top`` (a config's top-level mapping), or ``None`` when one is missing."""
        out: list[str] = []
        for key in self.keys:
            hits = _present(top, key)
            if not hits:
                return None
            out += hits
        return out


def _present(top: Mapping[str, Any], key: str) -> list[str]:
    node: Any = top
    parts = key.split(".")
    for part in parts[:-1]:
        node = node.get(part) if isinstance(node, Mapping) else None
        if not isinstance(node, Mapping):
            return []
    last = parts[-1]
    if last.endswith("*"):
        prefix = ".".join(parts[:-1])
        return sorted(f"{prefix}.{k}" if prefix else str(k) for k in node if str(k).startswith(last[:-1]))
    return [key] if last in node else []


@dataclass(frozen=True)
class Layout:
    """One trainer's config layout: who runs it, how it is recognised, and its keys grouped by job (each reader
    takes its group: :attr:`homes` for the flags and patterns, :attr:`model`, :attr:`lora`, :attr:`strategy`,
    :attr:`rates` for the settings next to them, :attr:`run` for what the trainer does with the config)."""

    name: str
    title: str
    #: who runs configs of this layout (messages: "the trainer", "Megatron-Bridge", "NeMo-RL")
    trainer: str
    homes: Homes
    lora: LoraKeys
    model: ModelKeys = field(default_factory=ModelKeys)
    strategy: StrategyKeys = field(default_factory=StrategyKeys)
    rates: RateKeys = field(default_factory=RateKeys)
    run: TrainerFacts = field(default_factory=TrainerFacts)
    #: keys that decide this layout (no other layout has them), and hints (other layouts' files may have them)
    decides: tuple[Marker, ...] = ()
    hints: tuple[Marker, ...] = ()

    @property
    def lr_section(self) -> str:
        """Where this layout's runs read per-part learning rates from."""
        return self.rates.section or self.homes.flags


# ---- what Bridge and the trainers freeze themselves (read and said, never applied by the plugin) ----------------

#: The trainers' MoE router freeze: a pre-wrap hook that freezes ``mlp.router.weight`` of every MoE layer of the
#: language model (the build accepts it next to the flags and reports it per part, with the hook).
_ROUTER = "the MoE routers (a pre-wrap hook freezes mlp.router.weight of every MoE layer of the language model)"


def router_keys(by: str) -> OwnSetting:
    return OwnSetting(_ROUTER, by, narrows=Part.LANGUAGE_MODEL)


#: Bridge 0.6.2's own ``freeze_*`` provider fields that are neither a flag nor a flag's alias (read from its provider
#: classes; the aliases, e.g. ``freeze_sound_encoder``, are read as their flag: :data:`~bridge_freeze_plugin.request.
#: ALIASES`): Bridge applies them when it builds the model; they freeze modules outside every part.
BRIDGE_FIELDS: Mapping[str, OwnSetting] = {
    "freeze_mtp_model": OwnSetting("the multi-token-prediction layers (EXAONE 4.5 provider)", "Bridge", outside=True),
    "freeze_modality_encoders": OwnSetting("the modality encoders (MIMO provider)", "Bridge", outside=True),
    "freeze_modality_projections": OwnSetting("the modality projections (MIMO provider)", "Bridge", outside=True),
}


def bridge_field_elsewhere(trainer: str) -> dict[str, str]:
    """Bridge's own provider fields written in a trainer's section: refused with what they are (never "a
    misspelling of freeze_vision_model", whose advice would freeze the wrong part)."""
    return {key: (f"is Bridge's own provider field ({setting.what}), not a setting the plugin knows {trainer} to "
                  "pass from {section} to the model provider, so the run may ignore it. It is set on the provider "
                  f"in a Megatron-Bridge config (model.{key})") for key, setting in BRIDGE_FIELDS.items()}


@contextlib.contextmanager
def resolvers(layout: Layout) -> Iterator[None]:
    """The OmegaConf resolvers the layout's trainer registers (NeMo-RL's ``mul``...), while reading only: those
    this process has not registered itself are removed again afterwards."""
    added = []
    try:
        # OmegaConf 2.4 deprecates register_new_resolver for register_resolver (same behaviour for these)
        register = getattr(OmegaConf, "register_resolver", None) or OmegaConf.register_new_resolver
        for name, function in layout.run.resolvers.items():
            if not OmegaConf.has_resolver(name):
                register(name, function)
                added.append(name)
        yield
    finally:
        for name in added:
            OmegaConf.clear_resolver(name)
