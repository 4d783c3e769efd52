"""The reading's settings stage: what the rules read next to the flags, one reader each: the strategy, LoRA (its
targets as the trainer's worker hands them to Bridge, and Bridge's ``VLMLoRA`` switches), recompute (and the
provider's ``full_recompute_policy``, and the recompute keys set on the provider as written), the peers'
``language_model_only``, the per-part learning rates' section, the weight sync. The sections come from the stage's
:class:`~._values.Sections`, read in one place.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf

from bridge_freeze_plugin.config._layout_bridge import VLM_LORA_SWITCHES
from bridge_freeze_plugin.config._layout_records import LoraKeys, ModelKeys, StrategyKeys, TrainerFacts
from bridge_freeze_plugin.config._layouts import Layout
from bridge_freeze_plugin.config._run_settings import LoraSettings
from bridge_freeze_plugin.config._values import IN_CONFIG, Sections, Setting, Source, as_yaml, select, type_label
from bridge_freeze_plugin.config._yaml_overrides import brief
from bridge_freeze_plugin.errors import FreezeFlagTypeError, PartLearningRateError
from bridge_freeze_plugin.optim import looks_like_lr_key
from bridge_freeze_plugin.prewrap import FORMER_POLICY_ATTR, POLICY_ATTR

#: Bridge's ``CanonicalLoRA``: a split name -> the leaf name of the fused Megatron module it lands on.
_CANONICAL_MODULES = {"linear_q": "linear_qkv", "linear_k": "linear_qkv", "linear_v": "linear_qkv",
                     "linear_fc1_up": "linear_fc1", "linear_fc1_gate": "linear_fc1"}
_ABSENT = object()


def bool_setting(cfg: Any, key: str | None, source: Source, malformed: list[str]) -> Setting:
    value = None if key is None else select(cfg, key)
    if value is not None and not isinstance(value, bool):
        malformed.append(f"{key} must be a boolean (true or false), got {as_yaml(value)!r}")
    return Setting(bool(value), key, source(key) if key else IN_CONFIG)


def read_lora(cfg: Any, sections: Sections, layout: Layout, source: Source, malformed: list[str]
              ) -> tuple[LoraSettings, Setting, Mapping[str, Any]]:
    """LoRA's settings, its rank's setting, and its section as read."""
    key = f"{layout.lora.section}.{layout.lora.rank}"
    present = select(cfg, layout.lora.section) is not None
    lora = sections[layout.lora.section]
    if layout.lora.switch is not None:  # NeMo-RL: peft.enabled turns it on; its dim is then required
        switch = f"{layout.lora.section}.{layout.lora.switch}"
        enabled = lora.get(layout.lora.switch)
        if enabled is not None and not isinstance(enabled, bool):
            malformed.append(f"{switch} must be a boolean (true or false), got {as_yaml(enabled)!r}")
        if enabled is not True:
            return LoraSettings(), Setting(0, key, f"{switch} is not true: LoRA off ({source(switch)})"), lora
        if lora.get(layout.lora.rank) is None:
            malformed.append(f"{key} must be set when {switch}=true ({layout.trainer} refuses LoRA without it)")
            return LoraSettings(), Setting(None, key, source(key)), lora
    rank = lora.get(layout.lora.rank, layout.lora.default_rank if present else 0)
    rank = 0 if rank is None else rank
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        malformed.append(f"{key} must be a non-negative integer (0: LoRA off), got {as_yaml(rank)!r}")
        return LoraSettings(), Setting(rank, key, source(key)), lora
    target = lora.get("target_modules")
    if target is not None and not isinstance(target, str) and not (
            isinstance(target, list) and all(isinstance(t, str) for t in target)):
        malformed.append(f"{layout.lora.section}.target_modules must be a module name or a list of them, got "
                         f"{brief(repr(target))} ({type_label(target)})")
        target = None
    target = _trainer_targets(cfg, layout.lora, target)
    exclude = lora.get("exclude_modules")
    exclude = [exclude] if isinstance(exclude, str) else exclude if isinstance(exclude, list) else []
    settings = LoraSettings(rank=rank, alpha=lora.get("alpha"),
                            target_modules=tuple(target) if isinstance(target, list) else target,
                            exclude_modules=tuple(str(e) for e in exclude))
    return settings, Setting(rank, key, source(key)), lora


def _trainer_targets(cfg: Any, keys: LoraKeys, target: str | list[str] | None) -> str | list[str] | None:
    """``target_modules`` as Bridge's LoRA receives it in this layout's runs (unchanged where the layout's trainer
    passes it through): SkyRL's Megatron worker never gives Bridge's LoRA the string ``"all-linear"`` (its default),
    it writes its list of Megatron leaf names in its place (``keys.target_aliases``); with ``lora_type:
    canonical_lora`` Bridge's ``CanonicalLoRA`` takes split names (``linear_q``, ``linear_fc1_up``...), each put on
    the fused module it splits: read as that module's leaf name, which is what the rules match."""
    if target is None:
        target = keys.default_target
    if isinstance(target, str) and target in keys.target_aliases:
        target = list(keys.target_aliases[target])
    if keys.type is not None and select(cfg, keys.type) == "canonical_lora" and target:
        names = [target] if isinstance(target, str) else target
        target = list(dict.fromkeys(_CANONICAL_MODULES.get(name, name) for name in names))
    return target


def read_vlm_lora(cfg: Any, keys: LoraKeys, lora: LoraSettings, values: Mapping[str, Any],
                  source: Source) -> Mapping[str, Setting] | None:
    """Bridge's ``VLMLoRA`` switches (``peft.freeze_*``, true when not written: its defaults), if that is the class;
    ``values``: LoRA's section, as :func:`read_lora` read it."""
    if not lora.enabled or select(cfg, f"{keys.section}._target_") not in keys.vlm_targets:
        return None
    out = {}
    for flag in VLM_LORA_SWITCHES:
        key = f"{keys.section}.{flag}"
        value = values.get(flag, True)
        if not isinstance(value, bool):
            raise FreezeFlagTypeError(f"{key} (VLMLoRA's own switch) must be a boolean (true or false), got "
                                      f"{as_yaml(value)!r}")
        out[flag] = Setting(value, key, source(key) if flag in values else "VLMLoRA's default")
    return out


def read_strategy(cfg: Any, layout: Layout, source: Source) -> tuple[Setting, str | None]:
    """The strategy setting and, when the flags cannot apply under it, why (from the layout's notes)."""
    if layout.strategy.switches:  # NeMo-RL: the backend whose `enabled` switch is true
        on = [(key, name) for key, name in layout.strategy.switches if select(cfg, key) is True]
        value = "+".join(name for _, name in on) or None
        key = on[0][0] if len(on) == 1 else layout.strategy.switches[0][0]
        return Setting(value, key, source(key)), layout.strategy.notes.get(value) if value is not None else None
    strategy = select(cfg, layout.strategy.key) if layout.strategy.key else layout.strategy.fixed
    value = None if strategy is None else str(strategy)
    where = source(layout.strategy.key) if layout.strategy.key else f"always, in the {layout.title} layout"
    return Setting(value, layout.strategy.key, where), layout.strategy.notes.get(value) if value is not None else None


def switches_shown(cfg: Any, keys: StrategyKeys, source: Source) -> str | None:
    """The backend switches that are on, as written (``policy.dtensor_cfg.enabled=true (sft.yaml)``)."""
    if not keys.switches:
        return None
    on = [Setting(True, key, source(key)).written + f" (the {name} backend)"
          for key, name in keys.switches if select(cfg, key) is True]
    return " and ".join(on) or None


def read_recompute(cfg: Any, keys: StrategyKeys, source: Source) -> tuple[Setting, ...]:
    out = []
    for key in keys.recompute:
        value = select(cfg, key)
        switch = keys.recompute_switches.get(key)
        if switch is not None and value is not None and _switch_off(keys, key, select(cfg, switch)):
            # the trainer applies it only when the switch is on (NeMo-RL: activation_checkpointing)
            out.append(Setting(None, key, f"{as_yaml(value)} written, not applied: {switch} is not true"))
            continue
        out.append(Setting(value, key, source(key)))
    return tuple(out)


def read_peers(cfg: Any, keys: ModelKeys, source: Source) -> tuple[tuple[str, Setting], ...]:
    """The other components' language_model_only, for those the config writes and that are used."""
    out = []
    for peer in keys.peers:
        value = select(cfg, peer.key)
        used = not peer.used_when or any(select(cfg, k) is True for k in peer.used_when)
        if value is not None and used:
            out.append((peer.what, Setting(value, peer.key, source(peer.key))))
    return tuple(out)


def learning_rate_key(layout: Layout) -> str | None:
    """The section :func:`learning_rate_section` reads, if it reads one besides the flags'."""
    return None if layout.rates.refused is not None or layout.lr_section == layout.homes.flags else layout.lr_section


def learning_rate_section(sections: Sections, layout: Layout, flags: Mapping[str, Any]) -> Mapping[str, Any]:
    """The mapping the layout's runs read per-part learning rates from (an applied one only)."""
    if layout.rates.refused is not None:
        return {}  # any LR key was refused while walking the config
    if layout.lr_section == layout.homes.flags:
        return flags
    lrs = sections[layout.lr_section]
    if not layout.rates.targets:
        return lrs
    asked = [str(k) for k, v in lrs.items() if looks_like_lr_key(k) and v is not None]
    target = lrs.get("_target_")
    if target in layout.rates.targets:
        return lrs
    if asked:
        raise PartLearningRateError(
            f"{layout.lr_section}.{asked[0]} is set, but {layout.lr_section}._target_ is {as_yaml(target)}, which "
            f"applies no per-part learning rate, so it would never apply. Set {layout.lr_section}._target_: "
            f"{layout.rates.targets[0]}"
        )
    return {}


def read_syncs_weights(cfg: Any, facts: TrainerFacts) -> bool:
    if facts.syncs_weights:
        return True
    return any(_has(cfg, key) for key in facts.syncs_weights_with)


def _has(cfg: Any, key: str) -> bool:
    return key in cfg if isinstance(cfg, DictConfig | Mapping) else False


def _switch_off(keys: StrategyKeys, key: str, value: Any) -> bool:
    """Whether recompute key ``key``'s switch, holding ``value`` (``None``: not written), turns it off."""
    if key not in keys.recompute_switches:
        return False
    return value is not True and not (value is None and keys.recompute_switches_on_by_default)


def _as_config(cfg: Any) -> Any:
    return cfg if OmegaConf.is_config(cfg) else OmegaConf.create(dict(cfg))


def _known(cfg: Any, key: str, source: Source) -> Setting | None:
    """``key``'s setting when the config (or the layout's defaults) holds it, else ``None`` (not known here)."""
    value = OmegaConf.select(_as_config(cfg), key, default=_ABSENT)
    return None if value is _ABSENT else Setting(value, key, source(key))


def read_policy(cfg: Any, layout: Layout, source: Source) -> tuple[Setting, ...]:
    """The ``full_recompute_policy`` settings the config writes, where the provider fields of the plugin go."""
    home = layout.homes.home("train_patterns")
    return tuple(found for attr in (POLICY_ATTR, FORMER_POLICY_ATTR)
                 if (found := _known(cfg, f"{home}.{attr}", source)) is not None and found.value is not None)


def read_provider_recompute(cfg: Any, layout: Layout, source: Source
                            ) -> tuple[tuple[Setting, Setting | None, Setting | None], ...]:
    """(granularity, method, num_layers) of each section whose recompute keys go to the provider as written; a
    section whose switch is off (SkyRL's ``trainer.gradient_checkpointing=false``: its worker sets all three to
    None) or whose granularity is unknown is left out."""
    out = []
    for key in layout.strategy.provider_recompute:
        switch = layout.strategy.recompute_switches.get(key)
        if switch is not None and _switch_off(layout.strategy, key, OmegaConf.select(_as_config(cfg), switch)):
            continue
        granularity = _known(cfg, key, source)
        if granularity is None or granularity.value is None:
            continue
        section = key.rpartition(".")[0]
        out.append((granularity, _known(cfg, f"{section}.recompute_method", source),
                    _known(cfg, f"{section}.recompute_num_layers", source)))
    return tuple(out)
