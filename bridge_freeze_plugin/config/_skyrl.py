"""SkyRL as released: a SkyRL layout as the SkyRL here reads a config, and the route its Megatron worker reads.

What SkyRL's loader refuses (keys that are no field of their section's class, a ``+`` prefix, its rewrites of legacy
keys, the values its classes refuse) is checked in one place, :func:`._skyrl_loader.check`, which runs SkyRL's own
code where skyrl is importable; it never checks a value's type. Released SkyRL's ``MegatronConfig`` has no
``freeze_language_model`` / ``freeze_vision_model`` / ``freeze_vision_projection`` (the review's fields); its
Megatron worker sets every ``transformer_config_kwargs`` item on the model provider (``setattr(provider, key,
value)`` before ``finalize()``), which is where the plugin reads its flags: so with such a SkyRL the flags and
patterns go under ``megatron_config.transformer_config_kwargs`` (:func:`adapt`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from bridge_freeze_plugin.config._layouts import BRIDGE_FIELDS, Layout, OwnSetting
from bridge_freeze_plugin.config._skyrl_fields import KWARGS, SkyRLFields, current
from bridge_freeze_plugin.config._skyrl_loader import check
from bridge_freeze_plugin.config._yaml_overrides import Override

#: SkyRL's own ``MegatronConfig`` freeze fields: pre-wrap hooks its worker registers (never a provider field).
SKYRL_HOOKS = ("freeze_moe_router", "freeze_dsa_indexer")
_HOOK_WHAT = {
    "freeze_moe_router": "the MoE routers (a pre-wrap hook freezes mlp.router.weight of every MoE layer of the "
                         "language model)",
    "freeze_dsa_indexer": "the dynamic-sparse-attention indexers (a pre-wrap hook; none in a model without DSA)",
}


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
    adapted = _flags_home(plain, skyrl, fields)
    return adapted, check(cfg, layout, overrides, fields)  # what SkyRL's loader refuses raises there


def _flags_home(layout: Layout, skyrl: str, fields: SkyRLFields) -> Layout:
    """``layout`` as this SkyRL's worker reads the flags: unchanged where its ``MegatronConfig`` has the review's
    fields; else their home is ``transformer_config_kwargs``."""
    homes = layout.homes
    if fields.has_review_fields(skyrl, homes.flags):
        return layout
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
