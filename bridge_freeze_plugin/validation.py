"""Config validation for SFT and RL runs: every bad combination fails before a model is built.

The three ``freeze_*`` flags live in a ``megatron_config`` section of a training config (YAML, plus
dotted command-line overrides). This module checks them against the rest of the run:

1. a flag set with a strategy other than ``megatron`` (checked for every strategy, SFT and RL);
2. a flag set with ``language_model_only=true`` (no vision part to choose from);
3. all three set without LoRA (nothing would train);
4. LoRA with a partial selection (LoRA plus full-rank components is not supported yet);
5. a flag set for a provider whose family is not registered (:func:`resolve_family`);
6. a flag set under the reference model's config (the reference model never trains);
7. families with ``projection_needs_recompute_off``: a trained projection under full activation
   recompute gets (partly) no gradient: rejected when a flag is set, a warning when none is;
8. values that are not real booleans, and keys that look like misspelt flags.

Rules 1-4 and 6 are reported together, in one :class:`InvalidFreezeConfigError`; rule 5 raises
:class:`UnsupportedFreezeFlagError` (only once rules 1-4 pass); rule 7 comes last. Every message
names the config key, the setting it conflicts with, and what to do instead. See
``docs/configuration.md`` for the layouts.
"""

from __future__ import annotations

import difflib
import json
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from bridge_freeze_plugin.errors import FreezeFlagTypeError, InvalidFreezeConfigError
from bridge_freeze_plugin.provider import resolve_family
from bridge_freeze_plugin.ranks import is_rank0
from bridge_freeze_plugin.recompute import check_projection_recompute, is_full
from bridge_freeze_plugin.registry import REGISTRY, FamilySpec
from bridge_freeze_plugin.selection import FLAGS, FreezeSelection

logger = logging.getLogger("bridge_freeze_plugin")

__all__ = [
    "LoraSettings",
    "family_from_model_path",
    "load_config",
    "read_selection",
    "validate_config",
    "validate_rl_config",
    "validate_selection",
    "validate_sft_config",
]

#: The only strategy under which the flags are honoured (they are applied by the Bridge provider).
MEGATRON = "megatron"
#: How close (difflib ratio, lower-cased) a key must be to a flag to be reported as a misspelling.
_MISSPELLING_CUTOFF = 0.8


@dataclass(frozen=True)
class LoraSettings:
    """The LoRA settings that matter to the freeze rules. ``rank`` 0 means LoRA is off."""

    rank: int = 0
    alpha: float | None = None
    target_modules: tuple[str, ...] | str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 0:
            raise InvalidFreezeConfigError(f"LoRA rank must be a non-negative integer (0: LoRA off), got {self.rank!r}")
        if isinstance(self.target_modules, list):
            object.__setattr__(self, "target_modules", tuple(self.target_modules))

    @property
    def enabled(self) -> bool:
        return self.rank > 0


@dataclass(frozen=True)
class _Keys:
    """Where each setting lives in the config being validated (for messages only)."""

    strategy: str
    language_model_only: str
    lora_rank: str
    flags: str  # the megatron_config section holding the freeze flags
    recompute: str


# --------------------------------------------------------------------------------------------
# Small helpers.
# --------------------------------------------------------------------------------------------


def _yaml(value: Any) -> str:
    """A value as a user would write it in YAML / on the command line."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _flag_list(selection: FreezeSelection, where: str) -> str:
    return ", ".join(f"{where}.{flag}=true" for flag in selection.set_flags())


def _to_container(node: Any, key: str) -> Any:
    """A config node as plain Python (interpolations resolved); mappings stay mappings."""
    if isinstance(node, DictConfig) or OmegaConf.is_config(node):
        try:
            return OmegaConf.to_container(node, resolve=True)
        except OmegaConfBaseException as exc:
            raise InvalidFreezeConfigError(f"cannot resolve {key}: {exc}") from exc
    return node


def _select(cfg: Any, key: str) -> Any:
    """``cfg[key]`` for a dotted key, ``None`` when any level is missing (or null)."""
    node: Any = cfg
    for part in key.split("."):
        if isinstance(node, DictConfig):
            if part not in node:
                return None
            try:
                node = node[part]
            except OmegaConfBaseException as exc:
                raise InvalidFreezeConfigError(f"cannot resolve {key}: {exc}") from exc
        elif isinstance(node, Mapping):
            node = node.get(part)
        else:
            return None
        if node is None:
            return None
    return _to_container(node, key)


def _section(cfg: Any, key: str) -> Mapping[str, Any]:
    value = _select(cfg, key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidFreezeConfigError(f"{key} must be a mapping of settings, got {value!r}")
    return value


def _as_config(cfg: Any) -> Any:
    if isinstance(cfg, (DictConfig, Mapping)):
        return cfg
    raise TypeError(f"expected an OmegaConf DictConfig or a mapping, got {type(cfg).__name__}")


# --------------------------------------------------------------------------------------------
# Reading a selection (rule 8).
# --------------------------------------------------------------------------------------------


def read_selection(section: Mapping[str, Any] | None, *, where: str = "megatron_config") -> FreezeSelection:
    """The selection in a ``megatron_config``-like mapping, checking every value and key.

    Values must be real booleans (YAML ``true``/``false``); ``1``, ``"yes please"`` or ``null`` are
    rejected naming the key. A key that looks like a misspelt flag (``freeze_vison_model``) is
    rejected with the closest flag. Other keys are ignored. A missing flag means ``false``.
    """
    section = {} if section is None else _to_container(section, where)
    if not isinstance(section, Mapping):
        raise InvalidFreezeConfigError(f"{where} must be a mapping of settings, got {section!r}")
    problems: list[str] = []
    type_only = True  # every problem is a non-bool value: FreezeFlagTypeError, as from the API
    values: dict[str, bool] = {}
    for key, value in section.items():
        key_str = str(key)
        if key_str in FLAGS:
            if isinstance(value, bool):
                values[key_str] = value
            else:
                problems.append(
                    f"{where}.{key_str} must be a boolean (true or false), got {_yaml(value)!r} "
                    f"({type(value).__name__}); write {where}.{key_str}=true or {where}.{key_str}=false"
                )
            continue
        close = difflib.get_close_matches(key_str.lower(), FLAGS, n=1, cutoff=_MISSPELLING_CUTOFF)
        if close:
            type_only = False
            problems.append(
                f"{where}.{key_str} is not a freeze flag; did you mean {where}.{close[0]}? "
                f"(the flags are {', '.join(FLAGS)})"
            )
    if problems:
        raise (FreezeFlagTypeError if type_only else InvalidFreezeConfigError)(_join(problems))
    return FreezeSelection(**values)


def _join(problems: Sequence[str]) -> str:
    if len(problems) == 1:
        return problems[0]
    return f"{len(problems)} problems in the freeze configuration:\n" + "\n".join(f"  - {p}" for p in problems)


# --------------------------------------------------------------------------------------------
# The rules, on plain values.
# --------------------------------------------------------------------------------------------


def _resolve_family_arg(family: FamilySpec | str | None) -> FamilySpec | None:
    if family is None or isinstance(family, FamilySpec):
        return family
    return REGISTRY.find(family)


def _check(
    selection: FreezeSelection,
    *,
    strategy: str | None,
    language_model_only: bool,
    lora: LoraSettings,
    provider: Any,
    family: FamilySpec | None,
    recompute: Mapping[str, Any],
    keys: _Keys,
    extra_problems: Sequence[str] = (),
) -> FreezeSelection:
    problems = list(extra_problems)
    if selection.any_set:
        flags = _flag_list(selection, keys.flags)
        # Rule 1: only Megatron applies the flags; every other strategy would silently ignore them.
        if strategy is None:
            problems.append(
                f"{flags} requires strategy=megatron, but {keys.strategy} is not set: the freeze flags "
                f"are applied by the Megatron-Bridge model provider. Set {keys.strategy}=megatron, or "
                "unset the flag(s)."
            )
        elif strategy.strip().lower() != MEGATRON:
            problems.append(
                f"{flags} requires strategy=megatron, but {keys.strategy}={strategy}: the freeze flags are "
                f"applied by the Megatron-Bridge model provider, and {strategy} would silently ignore them. "
                f"Set {keys.strategy}=megatron, or unset the flag(s)."
            )
        # Rule 2: a language-model-only run has no vision part.
        if language_model_only:
            problems.append(
                f"{flags} cannot be combined with {keys.language_model_only}=true: a language-model-only "
                f"run has no vision encoder or projection to choose from. Unset the flag(s), or set "
                f"{keys.language_model_only}=false."
            )
        # Rule 3: all three frozen and no adapters: nothing would train.
        if selection.all_set and not lora.enabled:
            problems.append(
                f"{flags}: all three parts are frozen and LoRA is off ({keys.lora_rank}={lora.rank}), so "
                f"nothing would train. Unset at least one flag, or enable LoRA ({keys.lora_rank} > 0) to "
                "train adapters on the frozen model."
            )
        # Rule 4: LoRA plus full-rank components is not supported yet.
        if lora.enabled and not selection.all_set:
            problems.append(
                f"{flags} with LoRA ({keys.lora_rank}={lora.rank}): LoRA plus full-rank components is not "
                f"supported yet (this selection leaves {selection.describe().removeprefix('train ')} "
                f"training at full rank next to the adapters). Use plain LoRA (unset the flags), LoRA with "
                f"all three flags true (adapters only), or set {keys.lora_rank}=0 to train the selected "
                "parts at full rank."
            )
    if problems:
        raise InvalidFreezeConfigError(_join(problems))

    # Rule 5: a flag on a provider no family covers (raised by the mixin's own check, before any build).
    if provider is not None:
        family = resolve_family(provider, selection) or family

    # Rule 7: the projection trains under full activation recompute on a family where that loses gradient.
    strategy_is_megatron = strategy is None or strategy.strip().lower() == MEGATRON
    if strategy_is_megatron and not language_model_only:
        full_keys = [k for k, v in recompute.items() if is_full(v)]
        flags = keys.flags
        check_projection_recompute(
            family,
            selection,
            recompute,
            asked=_flag_list(selection, flags),
            turn_off=" and ".join(f"{k}=null" for k in full_keys),
            freeze_projection=f"{flags}.freeze_vision_projection=true",
            warn=is_rank0(),
        )
        unknown = family is None and full_keys and selection.any_set and not selection.freeze_vision_projection
        if unknown and is_rank0():
            logger.warning(
                "bridge-freeze: %s with %s, but the model family is not known from the config, so the rule "
                "for full recompute (a Qwen3-VL-family projection loses gradient under it) is checked later, "
                "when the provider is built. To check it now, name the family (family=... in code, --family with "
                "bridge-freeze check-config).",
                " and ".join(f"{k}=full" for k in full_keys),
                _flag_list(selection, flags),
            )
    return selection


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
    given. With neither, rule 5 and the recompute rule cannot apply (the provider checks both again when it
    builds). ``recompute_granularity`` defaults to the provider's own. ``where`` is the config section
    the flags were read from, used in messages. Raises :class:`InvalidFreezeConfigError` (or
    :class:`UnsupportedFreezeFlagError` for a flag on an unsupported provider).
    """
    if not isinstance(selection, FreezeSelection):
        raise TypeError(f"selection must be a FreezeSelection, got {type(selection).__name__}")
    if recompute_granularity is None and provider is not None:
        recompute_granularity = getattr(provider, "recompute_granularity", None)
    keys = _Keys(
        strategy="strategy",
        language_model_only="language_model_only",
        lora_rank="lora.rank",
        flags=where,
        recompute="recompute_granularity",
    )
    return _check(
        selection,
        strategy=strategy,
        language_model_only=bool(language_model_only),
        lora=LoraSettings() if lora is None else lora,
        provider=provider,
        family=_resolve_family_arg(family),
        recompute={keys.recompute: recompute_granularity},
        keys=keys,
    )


# --------------------------------------------------------------------------------------------
# Config layouts.
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Layout:
    strategy: str
    language_model_only: str
    lora: str
    megatron_config: str
    model_path: str
    ref_megatron_config: str | None = None


_SFT = _Layout(
    strategy="strategy",
    language_model_only="model.language_model_only",
    lora="model.lora",
    megatron_config="megatron_config",
    model_path="model.path",
)
_RL = _Layout(
    strategy="trainer.strategy",
    language_model_only="trainer.policy.language_model_only",
    lora="trainer.policy.model.lora",
    megatron_config="trainer.policy.megatron_config",
    model_path="trainer.policy.model.path",
    ref_megatron_config="trainer.ref.megatron_config",
)


def load_config(path: str | os.PathLike[str] | None = None, overrides: Iterable[str] = ()) -> DictConfig:
    """A training config: the YAML file at ``path`` (if any) with dotted ``key=value`` overrides merged on top."""
    base = OmegaConf.load(path) if path is not None else OmegaConf.create({})
    if not isinstance(base, DictConfig):
        raise InvalidFreezeConfigError(f"{path} must hold a mapping at the top level, not a list")
    merged = OmegaConf.merge(base, OmegaConf.from_dotlist(list(overrides)))
    assert isinstance(merged, DictConfig)
    return merged


def family_from_model_path(path: str | os.PathLike[str] | None) -> FamilySpec | None:
    """The family of a local checkpoint (a directory with ``config.json``, or that file), by HF ``model_type``.

    ``None`` for a hub id, a missing path, an unreadable config or an unregistered ``model_type``.
    """
    if path is None or (isinstance(path, str) and not path):
        return None
    candidate = Path(os.path.expanduser(os.fspath(path)))
    config_file = candidate / "config.json" if candidate.is_dir() else candidate
    if not config_file.is_file() or config_file.suffix != ".json":
        return None
    try:
        model_type = json.loads(config_file.read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError, AttributeError) as exc:
        logger.debug("bridge-freeze: cannot read model_type from %s: %s", config_file, exc)
        return None
    return REGISTRY.for_hf_model_type(model_type) if isinstance(model_type, str) else None


def _setting_bool(value: Any, key: str, problems: list[str]) -> bool:
    if value is None or isinstance(value, bool):
        return bool(value)
    problems.append(f"{key} must be a boolean (true or false), got {_yaml(value)!r}")
    return bool(value)


def _read_lora(cfg: Any, layout: _Layout, problems: list[str]) -> LoraSettings:
    section = _section(cfg, layout.lora)
    rank = section.get("rank", 0)
    rank = 0 if rank is None else rank
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        problems.append(f"{layout.lora}.rank must be a non-negative integer (0: LoRA off), got {_yaml(rank)!r}")
        return LoraSettings()
    target = section.get("target_modules")
    return LoraSettings(
        rank=rank,
        alpha=section.get("alpha"),
        target_modules=tuple(target) if isinstance(target, list) else target,
    )


def _ref_problems(cfg: Any, layout: _Layout) -> list[str]:
    if layout.ref_megatron_config is None:
        return []
    ref = read_selection(_section(cfg, layout.ref_megatron_config), where=layout.ref_megatron_config)
    if not ref.any_set:
        return []
    return [
        f"{_flag_list(ref, layout.ref_megatron_config)}: the reference model never trains, so a freeze flag "
        f"there has no meaning. Remove it from {layout.ref_megatron_config}; to choose what the policy trains, "
        f"set the flag under {layout.megatron_config} instead."
    ]


def _validate_layout(
    cfg: Any, layout: _Layout, *, provider: Any, family: FamilySpec | str | None
) -> FreezeSelection:
    cfg = _as_config(cfg)
    mcfg = _section(cfg, layout.megatron_config)
    selection = read_selection(mcfg, where=layout.megatron_config)
    problems = _ref_problems(cfg, layout)

    strategy = _select(cfg, layout.strategy)
    strategy = None if strategy is None else str(strategy)
    setting_problems: list[str] = []
    language_model_only = _setting_bool(
        _select(cfg, layout.language_model_only), layout.language_model_only, setting_problems
    )
    lora = _read_lora(cfg, layout, setting_problems)
    # Malformed neighbouring settings only block a run that uses the flags (never break an existing run).
    if selection.any_set:
        problems.extend(setting_problems)

    recompute = {f"{layout.megatron_config}.recompute_granularity": mcfg.get("recompute_granularity")}
    tck = mcfg.get("transformer_config_kwargs")
    if isinstance(tck, Mapping):
        recompute[f"{layout.megatron_config}.transformer_config_kwargs.recompute_granularity"] = tck.get(
            "recompute_granularity"
        )

    resolved = _resolve_family_arg(family)
    if provider is None and resolved is None:
        model_path = _select(cfg, layout.model_path)
        resolved = family_from_model_path(model_path) if isinstance(model_path, str) else None

    keys = _Keys(
        strategy=layout.strategy,
        language_model_only=layout.language_model_only,
        lora_rank=f"{layout.lora}.rank",
        flags=layout.megatron_config,
        recompute=f"{layout.megatron_config}.recompute_granularity",
    )
    return _check(
        selection,
        strategy=strategy,
        language_model_only=language_model_only,
        lora=lora,
        provider=provider,
        family=resolved,
        recompute=recompute,
        keys=keys,
        extra_problems=problems,
    )


def validate_sft_config(
    cfg: DictConfig | Mapping[str, Any], *, provider: Any = None, family: FamilySpec | str | None = None
) -> FreezeSelection:
    """Validate an SFT config (``strategy``, ``model.*``, ``megatron_config.freeze_*``); returns the selection.

    The family comes from ``provider``, else ``family``, else ``model.path`` when it is a local
    checkpoint with a ``config.json``.
    """
    return _validate_layout(cfg, _SFT, provider=provider, family=family)


def validate_rl_config(
    cfg: DictConfig | Mapping[str, Any], *, provider: Any = None, family: FamilySpec | str | None = None
) -> FreezeSelection:
    """Validate an RL config (``trainer.strategy``, ``trainer.policy.*``); returns the policy's selection.

    Also rejects any freeze flag under ``trainer.ref.megatron_config`` (the reference model never
    trains). The family comes from ``provider``, else ``family``, else ``trainer.policy.model.path``.
    """
    return _validate_layout(cfg, _RL, provider=provider, family=family)


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
