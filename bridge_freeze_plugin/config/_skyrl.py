"""SkyRL as released: its configs checked as its loader checks them, and the route its Megatron worker reads.

SkyRL's loader (``SkyRLTrainConfig.from_cli_overrides``, ``SFTConfig.from_cli_overrides``) builds its dataclasses
section by section and refuses a key that is no field of the section's class, and a ``+`` prefix (the RL loader
says so; the SFT loader reads ``+megatron_config`` as a field name). It rewrites some legacy keys first, and refuses
some values when it builds its classes: where skyrl is importable both are SkyRL's own code, run
(:mod:`._skyrl_loader`). It never checks a value's type. Released
SkyRL's ``MegatronConfig`` has no ``freeze_language_model`` / ``freeze_vision_model`` / ``freeze_vision_projection``
(the review's fields); its Megatron worker sets every ``transformer_config_kwargs`` item on the model provider
(``setattr(provider, key, value)`` before ``finalize()``), which is where the plugin reads its flags: so with such a
SkyRL the flags and patterns go under ``megatron_config.transformer_config_kwargs`` (:func:`adapt`).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from omegaconf import OmegaConf

from bridge_freeze_plugin.config._layouts import BRIDGE_FIELDS, Layout, OwnSetting
from bridge_freeze_plugin.config._skyrl_fields import SkyRLFields, current
from bridge_freeze_plugin.config._yaml_overrides import Override, brief
from bridge_freeze_plugin.errors import ConfigLoadError, InvalidFreezeConfigError
from bridge_freeze_plugin.optim import LR_KEYS, looks_like_lr_key
from bridge_freeze_plugin.request import ALIASES, FLAGS, PATTERN_KEYS

#: The free mapping of ``MegatronConfig`` that SkyRL's worker sets, item by item, on the model provider.
KWARGS = "transformer_config_kwargs"
#: SkyRL's own ``MegatronConfig`` freeze fields: pre-wrap hooks its worker registers (never a provider field).
SKYRL_HOOKS = ("freeze_moe_router", "freeze_dsa_indexer")
_HOOK_WHAT = {
    "freeze_moe_router": "the MoE routers (a pre-wrap hook freezes mlp.router.weight of every MoE layer of the "
                         "language model)",
    "freeze_dsa_indexer": "the dynamic-sparse-attention indexers (a pre-wrap hook; none in a model without DSA)",
}


def _plugin_key(key: str) -> bool:
    return key in FLAGS or key in ALIASES or key in PATTERN_KEYS or key in LR_KEYS or looks_like_lr_key(key)


def _unknown(fields: SkyRLFields, layout: Layout, where: str, key: str, cls: str) -> str:
    """Why SkyRL's loader refuses ``where.key`` (no field of ``cls``), and what to write instead."""
    dotted = f"{where}.{key}" if where else key
    name = fields.name(cls)
    said = (f"{dotted} is no field of SkyRL {fields.version}'s {name} ({fields.source}), so SkyRL's loader refuses "
            f"it (ValueError: Invalid fields {{'{key}'}} for {name})")
    if name == "MegatronConfig" and (_plugin_key(key) or difflib.get_close_matches(key, FLAGS, n=1, cutoff=0.8)):
        if where == layout.homes.reference_flags:
            return f"{said}. Remove it: the reference model never trains"
        if key in LR_KEYS or looks_like_lr_key(key):
            return (f"{said}. Remove it: a SkyRL {fields.version} run applies no per-part learning rate (it builds "
                    "its optimizer without them)")
        flag = key if _plugin_key(key) else difflib.get_close_matches(key, FLAGS, n=1, cutoff=0.8)[0]
        review = " (the review's fields: they need a SkyRL whose MegatronConfig has them)" if key in FLAGS else ""
        return (f"{said}{review}. With this SkyRL write {where}.{KWARGS}.{flag}: SkyRL's Megatron worker sets every "
                f"{KWARGS} item on the model provider, where the plugin reads it")
    close = difflib.get_close_matches(key, list(fields.fields(cls)), n=3, cutoff=0.6)
    hint = f"did you mean {' or '.join(f'{where}.{c}' if where else c for c in close)}?" if close else (
        f"{name}'s fields are {', '.join(sorted(fields.fields(cls)))}")
    return f"{said}; {hint}"


def _refused_keys(cfg: Any, fields: SkyRLFields, layout: Layout) -> list[str]:
    """Every key of ``cfg`` that SkyRL's loader refuses (no field of its section's class), with what to write."""
    assert layout.run.skyrl is not None
    top = OmegaConf.to_container(cfg, resolve=False) if OmegaConf.is_config(cfg) else cfg
    problems: list[str] = []
    stack: list[tuple[str, Any, str]] = [("", top, fields.roots[layout.run.skyrl])]
    while stack:
        where, node, cls = stack.pop()
        known = fields.fields(cls)
        for key, value in node.items():
            key = str(key)
            if key not in known:
                problems.append(_unknown(fields, layout, where, key, cls))
            elif known[key] is not None and isinstance(value, Mapping):
                stack.append((f"{where}.{key}" if where else key, value, known[key]))
    return sorted(problems)


def _refused_overrides(overrides: Iterable[Override], fields: SkyRLFields, layout: Layout) -> list[str]:
    """The overrides SkyRL's loader refuses for their prefix (``+``, ``++``, ``~``): it reads ``key=value`` only."""
    assert layout.run.skyrl is not None
    root = fields.name(fields.roots[layout.run.skyrl])
    out = []
    for override in overrides:
        if override.operation == "set":
            continue
        text = override.text.strip()
        bare = text.lstrip("+~")
        said = ("ValueError: The '+' prefix for adding new config fields is not supported"
                if root == "SkyRLTrainConfig" and text.startswith("+") else  # its loader says so; SFTConfig's does not
                f"ValueError: Invalid fields {{'{text.split('.')[0].split('=')[0]}'}} for {root}")
        fix = (f"write {brief(bare)} (every field exists already: key=value sets it)" if override.operation != "delete"
               else f"remove it (a field cannot be deleted; write {brief(bare.split('=')[0])}=VALUE to set it)")
        out.append(f"override {brief(repr(override.text))}: SkyRL {fields.version}'s loader reads key=value only and "
                   f"refuses the '{text[0]}' prefix ({said}); {fix}")
    return out


def _hooks(by: str) -> dict[str, OwnSetting]:
    from bridge_freeze_plugin.request import Part

    return {key: OwnSetting(what, by, narrows=Part.LANGUAGE_MODEL) for key, what in _HOOK_WHAT.items()}


def _kwargs_refused(megatron: str) -> dict[str, str]:
    return {key: (f"is SkyRL's own MegatronConfig field, no field of Bridge's providers: in {KWARGS} SkyRL sets it "
                  f"on the provider, where nothing reads it. Write {megatron}.{key}") for key in SKYRL_HOOKS}


def adapt(cfg: Any, layout: Layout, overrides: Iterable[Override] = (), fields: SkyRLFields | None = None,
          ) -> tuple[Layout, str | None]:
    """``layout`` as the installed (or listed) SkyRL reads ``cfg``: what its loader refuses is refused here; its
    hooks are its own settings; without the review's fields the flags' home is ``transformer_config_kwargs``.

    Returns the layout (no longer marked as SkyRL's: adapting twice is adapting once) and what it was checked
    against (``None``: not checked, ``BRIDGE_FREEZE_SKYRL_FIELDS=none``).
    """
    if layout.run.skyrl is None:
        return layout, None
    skyrl, homes = layout.run.skyrl, layout.homes
    own = {pattern: dict(keys) if isinstance(keys, Mapping) else keys for pattern, keys in homes.own.items()}
    for megatron in (homes.flags, homes.reference_flags):
        if megatron is not None:
            own[megatron] = {**_hooks(layout.trainer), **own.get(megatron, {})}
    plain = replace(layout, homes=replace(homes, own=own), run=replace(layout.run, skyrl=None))
    fields = fields or current()
    if fields is None:
        return plain, None
    problems = _refused_overrides(overrides, fields, layout)
    if problems:
        raise ConfigLoadError(_joined(problems))
    judged, rewrites = cfg, None
    if fields.installed:  # SkyRL's own loader: its rewrites of the command line come before its key check
        from bridge_freeze_plugin.config._skyrl_loader import apply_rewrites

        judged, rewrites = apply_rewrites(cfg, [o.text for o in overrides], skyrl, fields)
    problems = _refused_keys(judged, fields, layout)
    if problems:
        raise InvalidFreezeConfigError(_joined(problems))
    checked = "; ".join(filter(None, [f"checked against {fields.source}", rewrites, _values(judged, skyrl, fields)]))
    if fields.has_review_fields(skyrl, homes.flags):
        return plain, checked
    return _in_kwargs(plain, skyrl, fields), checked


def _values(cfg: Any, skyrl: str, fields: SkyRLFields) -> str:
    """SkyRL's own construction of ``cfg`` (it refuses values: :func:`._skyrl_loader.construct`), or why not."""
    if not fields.installed:
        return ("values not checked: SkyRL refuses some values when it builds its config, and skyrl is not "
                "importable here to build it")
    from bridge_freeze_plugin.config._skyrl_loader import construct

    return construct(cfg, skyrl, fields)


def _in_kwargs(layout: Layout, skyrl: str, fields: SkyRLFields) -> Layout:
    """``layout`` read by a SkyRL without the review's fields: the flags' home is ``transformer_config_kwargs``."""
    homes = layout.homes
    policy, ref = f"{homes.flags}.{KWARGS}", homes.reference_flags and f"{homes.reference_flags}.{KWARGS}"
    own = {**homes.own, policy: dict(BRIDGE_FIELDS)}
    refused = {**homes.refused, policy: _kwargs_refused(homes.flags)}
    if ref is not None:
        own[ref] = dict(BRIDGE_FIELDS)
        refused[ref] = _kwargs_refused(homes.reference_flags or "")
    optimizer = f"{homes.flags.rpartition('.')[0]}.optimizer_config.lr".lstrip(".")
    lmo = layout.model.language_model_only
    return replace(
        layout, title=f"{layout.title} (SkyRL {fields.version})",
        homes=replace(homes, flags=policy, reference_flags=ref, own=own, refused=refused),
        strategy=replace(layout.strategy,
                         recompute=tuple(k for k in layout.strategy.recompute if fields.accepts(skyrl, k))),
        model=replace(layout.model,
                      language_model_only=lmo if lmo is not None and fields.accepts(skyrl, lmo) else None),
        rates=replace(layout.rates, refused=(
            f"SkyRL {fields.version} builds its optimizer without the plugin's per-part learning rates, and one set "
            f"on the model provider is never applied; remove it (every part trains on {optimizer})")),
    )


def _joined(problems: list[str]) -> str:
    if len(problems) == 1:
        return problems[0]
    return f"{len(problems)} keys SkyRL's loader refuses:\n" + "\n".join(f"  - {p}" for p in problems)
