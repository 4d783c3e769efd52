"""Config layouts as data: where each setting the rules read lives, and the defaults the rules depend on.

One table per layout, like the families' tables: the trainer's SFT and RL configs (the open-source
RL/SFT trainer this plugin's flags come from: its dataclass defaults, its older Hydra YAML layout),
Megatron-Bridge's own ``ConfigContainer`` (what Bridge writes as ``run_config.yaml`` in a checkpoint) and
NeMo-RL's GRPO / SFT configs. A layout is recognised from the file (:func:`detect`), weighing all its
evidence: keys only one layout has (its :attr:`Layout.decides` markers) decide; keys several layouts may hold
(:attr:`Layout.hints`) are hints, said when they conflict; two deciding layouts are an error. ``--layout``
forces one. What a rule needs to know about a layout is a field here (``syncs_weights``, the strategy
switches...), never a test of its name: a new layout is a new table.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from bridge_freeze_plugin.errors import ConfigLoadError
from bridge_freeze_plugin.request import ALIASES, FLAGS, PATTERN_KEYS, Part


@dataclass(frozen=True)
class Peer:
    """Another component's ``language_model_only`` that must agree with the policy's, when ``used_when`` holds."""

    key: str
    what: str
    #: keys any of which, true, make the component used (empty: always used)
    used_when: tuple[str, ...] = ()


@dataclass(frozen=True)
class OwnSetting:
    """A ``freeze_*`` setting that is not one of the plugin's flags: Bridge's or a trainer's own, applied by them.

    Read and said (never refused, never applied by the plugin).
    """

    #: what it freezes
    what: str
    #: who applies it, and how
    by: str
    #: the part inside which it freezes some tensors through a pre-wrap hook (the build reports it per part)
    narrows: Part | None = None
    #: it freezes modules outside the plugin's parts (MTP, MIMO's modality parts...)
    outside: bool = False
    #: it is a pre-wrap hook that freezes whole parts named like the plugin's flags (NeMo-RL's freeze_config)
    freezes_parts: bool = False


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
    name: str
    title: str
    #: who runs configs of this layout (messages: "the trainer", "Megatron-Bridge", "NeMo-RL")
    trainer: str
    #: the section holding the flags and patterns (and other model settings)
    flags: str
    #: dotted keys of the settings the rules read; ``None`` where the layout has no such setting
    strategy: str | None
    language_model_only: str | None
    lora: str
    lora_rank: str
    model_path: str | None
    #: key holding the provider's class path (Bridge's ``_target_``), the family's source there
    provider_target: str | None
    recompute: tuple[str, ...]
    #: a plugin key (flag or pattern key) -> the section it goes in, when not :attr:`flags`
    flag_homes: Mapping[str, str] = field(default_factory=dict)
    #: Bridge's name of a flag (an alias, ``freeze_sound_encoder``) -> the section it goes in, when not the flag's
    alias_homes: Mapping[str, str] = field(default_factory=dict)
    #: a section the plugin's keys may go in -> why a plugin key homed elsewhere is not applied there
    section_notes: Mapping[str, str] = field(default_factory=dict)
    #: ((key, strategy), ...): the strategy is the one whose key is true (NeMo-RL's ``enabled`` switches)
    strategy_switches: tuple[tuple[str, str], ...] = ()
    #: what to write for the Megatron strategy (default: ``<strategy key>=megatron``)
    strategy_fix: str | None = None
    #: a strategy -> why the flags cannot apply under it (said in the refusal)
    strategy_notes: Mapping[str, str] = field(default_factory=dict)
    #: the key of the LoRA section that turns it on (NeMo-RL's ``peft.enabled``); ``None``: present is on
    lora_switch: str | None = None
    #: ``_target_`` values of the LoRA section that are Bridge's ``VLMLoRA`` (its own freeze switches)
    vlm_lora_targets: tuple[str, ...] = ()
    #: a recompute key -> the switch that must be true for it to apply (NeMo-RL's ``activation_checkpointing``)
    recompute_switches: Mapping[str, str] = field(default_factory=dict)
    #: the model path may be a hub id: map its name to a family, said to be a guess
    family_from_name: bool = False
    #: a flag the config does not write keeps the model provider's own default (NeMo-RL passes only what is
    #: written); otherwise it is false (the trainer writes every flag)
    unwritten_flags_keep_provider_default: bool = False
    reference_flags: str | None = None
    #: ((section, what), ...): components that never train; a plugin key anywhere below them is refused
    reference_sections: tuple[tuple[str, str], ...] = ()
    peers: tuple[Peer, ...] = ()
    #: section (fnmatch pattern over the dotted path) -> its ``freeze_*`` settings that are not the plugin's (one
    #: :class:`OwnSetting` alone: every ``freeze_*`` key of the section is one)
    own: Mapping[str, Mapping[str, OwnSetting] | OwnSetting] = field(default_factory=dict)
    #: section -> ``freeze_*`` names that are no setting there, with why and what to write instead
    refused: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    #: the value a key takes when the config does not write it (the trainer's own defaults)
    defaults: Mapping[str, Any] = field(default_factory=dict)
    #: the rank a present LoRA section has when it writes none (Bridge's ``LoRA.dim``)
    lora_default_rank: int = 0
    #: what a strategy means when the layout has no strategy key
    fixed_strategy: str | None = None
    #: keys that decide this layout (no other layout has them), and hints (other layouts' files may have them)
    decides: tuple[Marker, ...] = ()
    hints: tuple[Marker, ...] = ()
    #: the section holding the per-part learning rates (``lr_<part>``...); ``None``: the flags' section
    learning_rates: str | None = None
    #: ``_target_`` values the learning-rate section must name to be applied (empty: no ``_target_`` needed)
    learning_rates_targets: tuple[str, ...] = ()
    #: why no per-part learning rate can apply in this layout's runs (``None``: they can)
    learning_rates_refused: str | None = None
    #: the run syncs the policy's weights to an inference engine (RL rollouts): always, or when one of
    #: ``syncs_weights_with`` (top-level sections) is present
    syncs_weights: bool = False
    syncs_weights_with: tuple[str, ...] = ()
    #: why LoRA with full-rank parts is refused for this trainer's weight sync (``None``: the rule's own words)
    weight_sync_note: str | None = None
    #: the trainer resolves every interpolation of the config at start (one that fails stops the run)
    resolves_whole_config: bool = False
    #: OmegaConf resolvers the trainer registers (name -> function), used while reading
    resolvers: Mapping[str, Callable[..., Any]] = field(default_factory=dict)
    #: ``key=value`` must name a key the config has (Hydra's struct mode: ``+key=value`` adds)
    strict_overrides: bool = False
    #: SkyRL's layout: its root class in SkyRL's field listing (``config._skyrl_fields``), the config checked as
    #: SkyRL's loader checks it and read as its Megatron worker reads it (``config._skyrl.adapt``)
    skyrl: str | None = None
    #: what the run does with Bridge's name of a flag (an alias) that the family's provider does not declare, when
    #: known (then check-config refuses it for such a family); ``None``: not known
    foreign_alias: str | None = None
    #: the section a saved provider the run builds from is found from (NeMo-RL's ``policy``: its conversion cache;
    #: :mod:`._conversion_cache`); ``None``: the run builds a fresh provider
    conversion_cache: str | None = None
    #: the file is a provider as Bridge saved it, every field written (``run_config.yaml``): a flag and its alias
    #: that disagree are read as the build reads the provider (frozen if either is true)
    saves_every_field: bool = False

    def key(self, setting: str) -> str:
        """The dotted key of a plugin key (a flag or a pattern key) in this layout."""
        return f"{self.home(setting)}.{setting}"

    def home(self, setting: str) -> str:
        """The section a plugin key (a flag or a pattern key) goes in."""
        return self.flag_homes.get(setting, self.flags)

    def alias_home(self, alias: str) -> str:
        """The section Bridge's name of a flag (``freeze_sound_encoder``) goes in: its own, else its flag's."""
        return self.alias_homes.get(alias, self.home(ALIASES[alias]))

    @property
    def plugin_homes(self) -> tuple[str, ...]:
        """Every section this layout reads plugin keys (flags, patterns) from, the flags' section first."""
        return tuple(dict.fromkeys([self.flags, *self.flag_homes.values()]))

    @property
    def lr_section(self) -> str:
        """Where this layout's runs read per-part learning rates from."""
        return self.learning_rates or self.flags

    @property
    def other_freeze_keys(self) -> frozenset[str] | None:
        """The ``freeze_*`` settings of the flags' section that are not the plugin's (``None``: any key)."""
        return self.own_keys(self.flags)

    def own_keys(self, section: str) -> frozenset[str] | None:
        """The ``freeze_*`` settings of ``section`` that are not the plugin's; ``None`` when every key there is."""
        keys: set[str] = set()
        for pattern, settings in self.own.items():
            if fnmatch.fnmatchcase(section, pattern):
                if isinstance(settings, OwnSetting):
                    return None
                keys.update(settings)
        return frozenset(keys)

    def own_setting(self, section: str, key: str) -> OwnSetting | None:
        """The setting ``section.key`` is when it is a ``freeze_*`` setting that is not the plugin's."""
        for pattern, settings in self.own.items():
            if fnmatch.fnmatchcase(section, pattern):
                found = settings if isinstance(settings, OwnSetting) else settings.get(key)
                if found is not None:
                    return found
        return None

    def refused_here(self, section: str) -> dict[str, str]:
        out: dict[str, str] = {}
        for pattern, keys in self.refused.items():
            if fnmatch.fnmatchcase(section, pattern):
                out.update(keys)
        return out

    def reference_of(self, section: str) -> str | None:
        """What never-training component ``section`` belongs to (``None``: none)."""
        for prefix, what in self.reference_sections:
            if section == prefix or section.startswith(prefix + "."):
                return what
        return None

    def strategy_key_fix(self, key: str | None) -> str:
        """What to write to choose the Megatron strategy."""
        return self.strategy_fix or f"{key}=megatron"


# ---- what Bridge and the trainers freeze themselves (read and said, never applied by the plugin) ----------------

#: The trainers' MoE router freeze: a pre-wrap hook that freezes ``mlp.router.weight`` of every MoE layer of the
#: language model (the build accepts it next to the flags and reports it per part, with the hook).
_ROUTER = "the MoE routers (a pre-wrap hook freezes mlp.router.weight of every MoE layer of the language model)"


def _router(by: str) -> OwnSetting:
    return OwnSetting(_ROUTER, by, narrows=Part.LANGUAGE_MODEL)


#: Bridge 0.6.2's own ``freeze_*`` provider fields that are neither a flag nor a flag's alias (read from its provider
#: classes; the aliases, e.g. ``freeze_sound_encoder``, are read as their flag: :data:`~bridge_freeze_plugin.request.
#: ALIASES`): Bridge applies them when it builds the model; they freeze modules outside every part.
BRIDGE_FIELDS: Mapping[str, OwnSetting] = {
    "freeze_mtp_model": OwnSetting("the multi-token-prediction layers (EXAONE 4.5 provider)", "Bridge", outside=True),
    "freeze_modality_encoders": OwnSetting("the modality encoders (MIMO provider)", "Bridge", outside=True),
    "freeze_modality_projections": OwnSetting("the modality projections (MIMO provider)", "Bridge", outside=True),
}

#: Names that look like Bridge fields but are none (a run would drop them: Bridge skips an override key its
#: provider does not have, with a warning), with what to write instead.
_NOT_BRIDGE_FIELDS: Mapping[str, str] = {
    "freeze_sound_model": (
        "is no field of Bridge's providers (freeze_sound_model is an argument of the Nemotron Omni model's freeze(); "
        "its provider field is freeze_sound_encoder), so Bridge would skip it. Write {section}.freeze_sound_encoder"),
    "freeze_moe_router": (
        "is no field of Bridge's providers, so Bridge would skip it: Bridge freezes MoE routers with the function "
        "megatron.bridge.training.utils.train_utils.freeze_moe_router, registered as a pre-wrap hook "
        "(provider.register_pre_wrap_hook(freeze_moe_router)); the build accepts that hook next to the flags"),
}

def _bridge_field_elsewhere(trainer: str) -> dict[str, str]:
    """Bridge's own provider fields written in a trainer's section: refused with what they are (never "a
    misspelling of freeze_vision_model", whose advice would freeze the wrong part)."""
    return {key: (f"is Bridge's own provider field ({setting.what}), not a setting the plugin knows {trainer} to "
                  "pass from {section} to the model provider, so the run may ignore it. It is set on the provider "
                  f"in a Megatron-Bridge config (model.{key})") for key, setting in BRIDGE_FIELDS.items()}


SFT = Layout(
    name="sft",
    title="SFT",
    trainer="the trainer",
    flags="megatron_config",
    strategy="strategy",
    language_model_only="model.language_model_only",
    lora="model.lora",
    lora_rank="rank",
    model_path="model.path",
    provider_target=None,
    recompute=(
        "megatron_config.recompute_granularity",
        "megatron_config.transformer_config_kwargs.recompute_granularity",
    ),
    own={"megatron_config": {"freeze_moe_router": _router("the trainer")}},
    refused={"megatron_config": _bridge_field_elsewhere("the trainer")},
    defaults={
        "strategy": "megatron",
        "model.lora.rank": 0,
        "megatron_config.transformer_config_kwargs.recompute_granularity": "full",
    },
    decides=(Marker(("strategy",)), Marker(("megatron_config",))),
    skyrl="sft",
    hints=(Marker(("model.path",)), Marker(("model.lora",)), Marker(("model.language_model_only",))),
)

RL = Layout(
    name="rl",
    title="RL",
    trainer="the trainer",
    flags="trainer.policy.megatron_config",
    strategy="trainer.strategy",
    language_model_only="trainer.policy.language_model_only",
    lora="trainer.policy.model.lora",
    lora_rank="rank",
    model_path="trainer.policy.model.path",
    provider_target=None,
    recompute=(
        "trainer.policy.megatron_config.recompute_granularity",
        "trainer.policy.megatron_config.transformer_config_kwargs.recompute_granularity",
    ),
    reference_flags="trainer.ref.megatron_config",
    peers=(
        Peer("trainer.ref.language_model_only", "the reference model",
             used_when=("trainer.algorithm.use_kl_loss", "trainer.algorithm.use_kl_in_reward")),
        Peer("generator.inference_engine.language_model_only", "the inference engine"),
    ),
    own={"trainer.policy.megatron_config": {"freeze_moe_router": _router("the trainer")},
         "trainer.ref.megatron_config": {"freeze_moe_router": _router("the trainer")}},
    refused={"trainer.policy.megatron_config": _bridge_field_elsewhere("the trainer")},
    defaults={
        "trainer.strategy": "fsdp",
        "trainer.policy.language_model_only": False,
        "trainer.policy.model.lora.rank": 0,
        "trainer.policy.megatron_config.transformer_config_kwargs.recompute_granularity": "full",
        "trainer.ref.language_model_only": False,
        "trainer.algorithm.use_kl_loss": True,
        "trainer.algorithm.use_kl_in_reward": False,
        "generator.inference_engine.language_model_only": False,
    },
    decides=(Marker(("trainer",)),),
    hints=(Marker(("generator",)),),
    syncs_weights=True,
    skyrl="rl",
)

#: Bridge's LoRA class with its own three freeze switches (``peft.freeze_*``).
VLM_LORA = "megatron.bridge.peft.lora.VLMLoRA"
#: ``VLMLoRA``'s own freeze switches (fields of Bridge's class, named like three of the flags).
VLM_LORA_SWITCHES = ("freeze_language_model", "freeze_vision_model", "freeze_vision_projection")

BRIDGE = Layout(
    name="bridge",
    title="Megatron-Bridge ConfigContainer",
    trainer="Megatron-Bridge",
    flags="model",
    strategy=None,
    fixed_strategy="megatron",
    language_model_only=None,
    lora="peft",
    lora_rank="dim",
    lora_default_rank=32,
    vlm_lora_targets=(VLM_LORA,),
    model_path=None,
    provider_target="model._target_",
    recompute=("model.recompute_granularity",),
    own={"model": BRIDGE_FIELDS},
    refused={"model": _NOT_BRIDGE_FIELDS},
    decides=(Marker(("model._target_",)),),
    hints=tuple(Marker((key,)) for key in ("peft", "ddp", "checkpoint", "scheduler", "rerun_state_machine",
                                           "optimizer", "optimizer_config_override_provider", "model.freeze_*")),
    # Bridge applies per-part learning rates through the optimizer override provider, never from the provider
    # (model) section: cfg.optimizer_config_override_provider = PartLROverrideProvider(...).
    learning_rates="optimizer_config_override_provider",
    saves_every_field=True,
    foreign_alias="Bridge's instantiate drops a field its provider class lacks (with a warning)",
    learning_rates_targets=("bridge_freeze_plugin.optim.bridge.PartLROverrideProvider",
                            "bridge_freeze_plugin.optim.PartLROverrideProvider"),
)


# ---- NeMo-RL (read from NVIDIA-NeMo/RL: nemo_rl/models/megatron/setup.py, nemo_rl/models/policy/__init__.py) -----

_MEGATRON_CFG = "policy.megatron_cfg"
_MODEL_OVERRIDES = "policy.megatron_cfg.model_overrides"
#: The provider fields NeMo-RL copies from ``policy.megatron_cfg`` to the provider, when written
#: (``iter_vlm_config_overrides``); every other provider field goes through ``model_overrides``.
NEMO_RL_PROVIDER_KEYS = ("radio_force_cpe_eval_mode", "freeze_vision_model", "freeze_vision_projection",
                         "freeze_sound_encoder", "freeze_sound_projection")
#: Keys of ``model_overrides`` NeMo-RL refuses (``_validate_model_override_conflicts``: a key annotated on its
#: ``MegatronConfig`` is a first-class setting) that name a setting the rules read, and why / what to write.
_FIRST_CLASS = ("duplicates the first-class setting policy.megatron_cfg.{key}, which NeMo-RL refuses (a ValueError "
                "when the policy is set up). Write policy.megatron_cfg.{key}")
_NEMO_RL_REFUSED_OVERRIDES = {key: _FIRST_CLASS for key in ("freeze_sound_encoder", "freeze_sound_projection",
                                                              "freeze_moe_router", "radio_force_cpe_eval_mode",
                                                              "recompute_granularity")}
_NEMO_RL_FREEZE_CONFIG = OwnSetting(
    "the part its name gives, whole", "NeMo-RL (policy.megatron_cfg.freeze_config: a pre-wrap hook passes it to the "
    "model's freeze())", freezes_parts=True)
_AUTOMODEL_FREEZE = OwnSetting("what NeMo Automodel's freeze_config names", "NeMo-RL's DTensor backend (Automodel)",
                               outside=True)


def _nemo_rl_own(megatron_cfg: str) -> dict[str, Mapping[str, OwnSetting] | OwnSetting]:
    """The freeze settings NeMo-RL reads itself, below one model's ``megatron_cfg`` (the policy's, a teacher's)."""
    # (NeMo-RL passes freeze_sound_encoder / freeze_sound_projection from megatron_cfg to the provider: Bridge's
    # names of the audio flags, read as those flags.)
    return {
        megatron_cfg: {"freeze_moe_router": _router("NeMo-RL"), "freeze_config": _NEMO_RL_FREEZE_CONFIG},
        f"{megatron_cfg}.model_overrides": dict(BRIDGE_FIELDS),
        # any key: NeMo-RL passes freeze_config to the model's freeze() as keyword arguments
        f"{megatron_cfg}.freeze_config": _NEMO_RL_FREEZE_CONFIG,
    }


def _nemo_rl_resolvers() -> dict[str, Callable[..., Any]]:
    # NeMo-RL's register_omegaconf_resolvers (nemo_rl/utils/config.py), the same four.
    return {"add": lambda a, b: a + b, "mul": lambda a, b: a * b, "div": lambda a, b: a / b,
            "max": lambda a, b: max(a, b)}


NEMO_RL = Layout(
    name="nemo_rl",
    title="NeMo-RL",
    trainer="NeMo-RL",
    flags=_MEGATRON_CFG,
    # NeMo-RL copies only freeze_vision_model / freeze_vision_projection (and the sound and RADIO fields) from
    # megatron_cfg to the provider; the LM flag and the patterns are provider fields it passes through
    # model_overrides.
    # The audio flags too: NeMo-RL drops policy.megatron_cfg.freeze_audio_model (not one of the five keys it
    # copies); its own names of the audio parts, freeze_sound_encoder / freeze_sound_projection, are copied from
    # megatron_cfg (Bridge's aliases of the audio flags, on Nemotron Omni's provider).
    flag_homes={"freeze_language_model": _MODEL_OVERRIDES, "train_patterns": _MODEL_OVERRIDES,
                "freeze_patterns": _MODEL_OVERRIDES, "freeze_audio_model": _MODEL_OVERRIDES,
                "freeze_audio_projection": _MODEL_OVERRIDES},
    alias_homes={"freeze_sound_encoder": _MEGATRON_CFG, "freeze_sound_projection": _MEGATRON_CFG},
    section_notes={
        _MEGATRON_CFG: "NeMo-RL copies from policy.megatron_cfg to the model provider only "
                       f"{', '.join(NEMO_RL_PROVIDER_KEYS)}; any other provider field goes under model_overrides",
        _MODEL_OVERRIDES: "NeMo-RL refuses a model_overrides key that duplicates a first-class policy.megatron_cfg "
                          "setting (a ValueError when the policy is set up)",
    },
    strategy=None,
    strategy_switches=(("policy.megatron_cfg.enabled", "megatron"), ("policy.dtensor_cfg.enabled", "dtensor")),
    strategy_fix="policy.megatron_cfg.enabled=true and policy.dtensor_cfg.enabled=false",
    strategy_notes={
        "dtensor": "NeMo-RL's DTensor backend builds the policy with Hugging Face / NeMo Automodel, never from a "
                   "Megatron-Bridge model provider, so the flags never reach it (its own freezing is "
                   "policy.dtensor_cfg.automodel_kwargs.freeze_config)",
        "megatron+dtensor": "NeMo-RL refuses a policy with both backends enabled",
    },
    language_model_only=None,
    lora="policy.megatron_cfg.peft",
    lora_rank="dim",
    lora_switch="enabled",
    model_path="policy.model_name",
    family_from_name=True,
    unwritten_flags_keep_provider_default=True,
    conversion_cache="policy",
    foreign_alias=("NeMo-RL refuses a policy.megatron_cfg key the provider lacks (a ValueError when the policy is "
                   "set up)"),
    provider_target=None,
    # (model_overrides.recompute_granularity is refused by NeMo-RL: a MegatronConfig annotation)
    recompute=("policy.megatron_cfg.recompute_granularity",),
    recompute_switches={"policy.megatron_cfg.recompute_granularity": "policy.megatron_cfg.activation_checkpointing"},
    reference_sections=(("teacher", "the distillation teacher"),
                        ("on_policy_distillation", "the distillation teachers")),
    own={**_nemo_rl_own(_MEGATRON_CFG), **_nemo_rl_own("teacher.megatron_cfg"),
         "*dtensor_cfg.automodel_kwargs.freeze_config": _AUTOMODEL_FREEZE,
         "on_policy_distillation*": OwnSetting("a teacher's setting", "NeMo-RL", outside=True)},
    refused={_MODEL_OVERRIDES: _NEMO_RL_REFUSED_OVERRIDES},
    decides=(Marker(("policy", "grpo")), Marker(("policy", "sft"))),
    hints=(Marker(("policy",)),),
    learning_rates_refused=(
        "NeMo-RL builds the optimizer with Bridge's setup_optimizer and no optimizer_config_override_provider, so "
        "no per-part learning rate is applied in a NeMo-RL run; remove it (every part trains on "
        "policy.megatron_cfg.optimizer.lr)"),
    syncs_weights_with=("grpo",),
    weight_sync_note=(
        "NeMo-RL's Megatron refit exports the whole merged model with Bridge's export_hf_weights at every sync, so "
        "it may well send the full-rank parts too, but no run has yet shown its inference engine generating from "
        "updated full-rank parts next to adapters (docs/rl-weight-sync.md: the rule is lifted per trainer once "
        "one has)"),
    resolves_whole_config=True,
    resolvers=_nemo_rl_resolvers(),
    strict_overrides=True,
)

LAYOUTS: dict[str, Layout] = {layout.name: layout for layout in (SFT, RL, BRIDGE, NEMO_RL)}


def get(name: str) -> Layout:
    try:
        return LAYOUTS[name]
    except KeyError:
        raise ConfigLoadError(f"unknown layout {name!r}; the layouts are {', '.join(LAYOUTS)}") from None


#: How strongly a key points at a layout: it DECIDES (no other layout has it) or is a HINT (others may).
DECIDES, HINT = 2, 1


@dataclass(frozen=True)
class Evidence:
    """What one config shows of one layout: the keys that decide it, and the hints."""

    layout: Layout
    decides: tuple[str, ...] = ()
    hints: tuple[str, ...] = ()

    @property
    def strength(self) -> int:
        return DECIDES if self.decides else HINT if self.hints else 0

    def why(self) -> str:
        return "; ".join([*self.decides, *(f"{hint} (a hint)" if self.decides else hint for hint in self.hints)])


def _said(keys: list[str]) -> str:
    return " + ".join(f"top-level {k}" if "." not in k else k for k in keys)


def evidence(top: Mapping[str, Any]) -> dict[str, Evidence]:
    """Layout name -> what the config's keys show of it (every layout with any evidence)."""
    found: dict[str, Evidence] = {}
    for layout in LAYOUTS.values():
        deciding = [hit for m in layout.decides if (hit := m.found(top)) is not None]
        covered = {key for hit in deciding for key in hit}
        decides = [_said(hit) for hit in deciding]
        hints = [_said(hit) for m in layout.hints if (hit := m.found(top)) is not None and not set(hit) <= covered]
        if decides or hints:
            found[layout.name] = Evidence(layout, tuple(decides), tuple(hints))
    return found


def _what_decides(layout: Layout) -> str:
    keys = " or ".join(" + ".join(f"{k}:" for k in m.keys) for m in layout.decides)
    return f"{layout.title}: {keys}" if keys else layout.title


def detect(top: Mapping[str, Any], what: str) -> tuple[Layout, str]:
    """The layout ``top`` (a config's top-level mapping) is written in, and why; an error when it cannot tell.

    The strongest evidence wins: keys that decide a layout over hints. Two layouts with deciding keys (or, with
    none deciding, two with hints) are an error naming both. Evidence for another layout that lost is said in
    the reason, never silently ignored; a flag or learning rate written where the chosen layout does not read
    it is refused when the settings are read (:func:`bridge_freeze_plugin.config._reading.read_settings`).
    """
    found = evidence(top)
    names = ", ".join(LAYOUTS)
    if not found:
        raise ConfigLoadError(
            f"{what} matches no config layout (top-level keys: {', '.join(map(str, top)) or 'none'}); each layout's "
            f"deciding keys: {'; '.join(_what_decides(layout) for layout in LAYOUTS.values())}. Name it with "
            f"--layout ({names})"
        )
    best = max(e.strength for e in found.values())
    top_layouts = [e for e in found.values() if e.strength == best]
    if len(top_layouts) > 1:
        reasons = "; ".join(f"{e.layout.title}: {e.why()}" for e in top_layouts)
        raise ConfigLoadError(
            f"{what} matches several config layouts, and its evidence conflicts ({reasons}); name one with "
            f"--layout ({names}), and move or remove the keys of the other"
        )
    (chosen,) = top_layouts
    return chosen.layout, _reason(chosen, found)


def _reason(chosen: Evidence, found: Mapping[str, Evidence]) -> str:
    others = [e for e in found.values() if e.layout is not chosen.layout]
    if not others:
        return chosen.why()
    conflict = "; ".join(f"{e.why()} suggests the {e.layout.title} layout" for e in others)
    return f"{chosen.why()}; conflicting evidence, outweighed: {conflict}"


def plugin_sections() -> tuple[str, ...]:
    """Every section any layout reads the plugin's keys from (flags, patterns, learning rates, the reference's)."""
    out: list[str] = []
    for layout in LAYOUTS.values():
        for key in (*layout.plugin_homes, layout.lr_section, layout.reference_flags):
            if key is not None and key not in out:
                out.append(key)
    return tuple(out)


#: The plugin's own keys in a flags' section (flags and pattern keys).
PLUGIN_KEYS: tuple[str, ...] = (*FLAGS, *PATTERN_KEYS)
