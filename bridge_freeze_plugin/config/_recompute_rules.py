"""Rules the build applies that check-config says up front: the provider's ``full_recompute_policy``, megatron-core's
recompute check, and a train pattern on the MoE routers next to a trainer's ``freeze_moe_router`` hook (the settings
they judge are read by :mod:`._setting_readers`).

- ``full_recompute_policy`` (and its former name ``vision_recompute_policy``) is a provider field the plugin adds; it
  lives where the patterns do. ``"fix"`` (the default) turns full recompute off where it breaks gradients;
  ``"refuse"`` makes a flag set next to it an error at the build (no flag set: a warning, recompute kept); any other
  value is refused at the build (``prewrap._recompute_fix.policy_of``).
- megatron-core's ``TransformerConfig.__post_init__`` checks ``recompute_granularity`` with ``recompute_method`` and
  ``recompute_num_layers`` when the provider is finalized: written here as the plugin's own rule, on the keys a
  layout sets on the provider as written (:attr:`StrategyKeys.provider_recompute`), where all three are known.
- A trainer's ``freeze_moe_router`` hook runs after the plugin's freeze: a train pattern that trains the routers of
  a frozen language model, and nothing else of it, departs from the selection after that hook (the build's
  :class:`~bridge_freeze_plugin.errors.FreezeGuaranteeError`).
"""

from __future__ import annotations

import difflib

from bridge_freeze_plugin.config._run_settings import RunSettings
from bridge_freeze_plugin.config._values import as_yaml
from bridge_freeze_plugin.families import FamilySpec
from bridge_freeze_plugin.prewrap import POLICIES, POLICY_ATTR
from bridge_freeze_plugin.request import Part

#: megatron-core's accepted values
_GRANULARITIES = ("full", "selective")
_METHODS = ("uniform", "block")
#: representative parameter names of a MoE language-model layer, below the language model's prefix: the router's,
#: and the others (a train pattern matching one of these trains more than the routers)
ROUTER_NAMES = ("decoder.layers.0.mlp.router.weight", "decoder.layers.0.mlp.router.bias")
_OTHER_LEAVES = (
    "input_layernorm.weight", "self_attention.linear_qkv.weight", "self_attention.linear_qkv.layer_norm_weight",
    "self_attention.linear_proj.weight", "self_attention.q_layernorm.weight", "self_attention.k_layernorm.weight",
    "pre_mlp_layernorm.weight", "mlp.linear_fc1.weight", "mlp.linear_fc2.weight", "mlp.experts.linear_fc1.weight0",
    "mlp.experts.linear_fc2.weight0", "mlp.experts.local_experts.0.linear_fc1.weight",
    "mlp.shared_experts.linear_fc1.weight", "mlp.shared_experts.linear_fc2.weight", "mlp.shared_experts.gate_weight",
)
OTHER_LM_NAMES = (*(f"decoder.layers.0.{leaf}" for leaf in _OTHER_LEAVES), "embedding.word_embeddings.weight",
                  "decoder.final_layernorm.weight", "output_layer.weight")


def policy_of(s: RunSettings) -> str:
    """The provider's policy as the build reads it: "refuse" under either name refuses."""
    return "refuse" if any(p.value == "refuse" for p in s.run.recompute_policy) else "fix"


def policy_refusal(s: RunSettings, family: FamilySpec, full_keys: list[str]) -> str:
    """The build's refusal under ``full_recompute_policy='refuse'`` (``prewrap._recompute_fix.refuse``), in keys."""
    from bridge_freeze_plugin.config._rules import asked
    from bridge_freeze_plugin.prewrap import affected_parts

    policy = next(p for p in s.run.recompute_policy if p.value == "refuse")
    freeze = " and ".join(f"{s.sources.flags_key}.freeze_{p}=true" for p in family.full_recompute_affects)
    return (
        f"{asked(s)} trains the {' and '.join(affected_parts(family, s.selection))} under full recompute "
        f"({' and '.join(f'{k}=full' for k in full_keys)}), with {policy.written}: on the {family.name} family "
        f"{family.recompute_note or 'that gives wrong gradients'}. The build refuses it (InvalidFreezeConfigError). "
        f"Let the plugin turn recompute off in {', '.join(family.no_full_recompute)} only (remove {policy.key}, or "
        f"set it to fix), turn full recompute off (null, or selective), or freeze those parts ({freeze})")


def policy_problems(s: RunSettings) -> list[str]:
    """A policy that is no policy (``refus``): the build refuses it whenever it consults the policy."""
    out = []
    for setting in s.run.recompute_policy:
        if isinstance(setting.value, str) and setting.value in POLICIES:
            continue
        close = difflib.get_close_matches(str(setting.value).strip().lower(), POLICIES, n=1, cutoff=0.6)
        hint = f"; did you mean {setting.key}={close[0]}?" if close else ""
        out.append(f"{setting.written}: {setting.key.rpartition('.')[2] if setting.key else POLICY_ATTR} must be one "
                   f"of {', '.join(POLICIES)} ('fix', the default, turns full recompute off only where it breaks "
                   f"gradients; 'refuse' makes that an error), and the build refuses any other value{hint}")
    return out


def megatron_core_problems(s: RunSettings) -> list[str]:
    """megatron-core's recompute check (``TransformerConfig.__post_init__``), on each provider section whose three
    settings are known; a setting not known here is left to megatron-core at the build."""
    out = []
    for granularity, method, layers in s.run.provider_recompute:
        g = granularity.value
        said = f"megatron-core refuses it when the provider is finalized ({s.trainer}'s build stops there)"
        if g not in _GRANULARITIES:
            out.append(f"{granularity.written}: recompute_granularity must be full, selective or null; {said}")
            continue
        if method is not None and method.value is not None and method.value not in _METHODS:
            out.append(f"{method.written}: recompute_method must be uniform, block or null; {said}")
        if g == "full" and method is not None and method.value is None:
            out.append(f"{granularity.written} with {method.written}: full recompute needs recompute_method uniform "
                       f"or block; {said}. Set {method.key}=uniform")
        if g == "full" and layers is not None and layers.value is None:
            out.append(f"{granularity.written} with {layers.written}: full recompute needs recompute_num_layers "
                       f"between 1 and the layers per pipeline stage; {said}. Set {layers.key}=1")
        if g == "selective" and layers is not None and layers.value is not None:
            out.append(f"{granularity.written} with {layers.written}: selective recompute needs "
                       f"recompute_num_layers=null (megatron-core: 'When using recompute_granularity: selective "
                       f"recompute_num_layers must be None'); {said}. Set {layers.key}=null (and "
                       f"{layers.key.rpartition('.')[0]}.recompute_method=null)")
    return out


def router_pattern_problems(s: RunSettings, family: FamilySpec | None) -> list[str]:
    """A train pattern that trains the MoE routers of a frozen language model, and nothing else of it, next to a
    trainer's ``freeze_moe_router`` hook: the hook freezes them after the plugin's freeze, and the build refuses
    the result (FreezeGuaranteeError; on a model without routers the pattern matches nothing: UnmatchedPatternError).
    """
    selection = s.selection
    hooks = [own for own in s.sources.own_freeze if own.name == "freeze_moe_router" and own.value is True]
    if not hooks or not selection.train_patterns or not selection.any_set:
        return []
    if Part.LANGUAGE_MODEL not in selection.frozen_parts():
        return []  # the routers train by the flag; the hook narrows a part that still trains (accepted)
    prefixes = family.prefixes(Part.LANGUAGE_MODEL) if family is not None else ("language_model",)
    patterns = selection.patterns
    routers = [f"{p}.{n}" for p in prefixes for n in ROUTER_NAMES if patterns.decide(f"{p}.{n}", False)]
    others = [f"{p}.{n}" for p in prefixes for n in OTHER_LM_NAMES if patterns.decide(f"{p}.{n}", False)]
    if not routers or others:
        return []
    hook = hooks[0]
    key = s.key_of("train_patterns")
    return [
        f"{key}={as_yaml(list(selection.train_patterns))} trains the MoE routers ({routers[0]}...) of the language "
        f"model, which {s.key_of('freeze_language_model')}=true freezes, and nothing else of it, while "
        f"{hook.key}=true freezes those routers with a pre-wrap hook that runs after the plugin's freeze: the build "
        "refuses it (FreezeGuaranteeError: the router weights the selection trains are frozen after pre-wrap hook "
        "freeze_moe_router; on a model without MoE routers the pattern matches nothing, UnmatchedPatternError). "
        f"Set {hook.key}=false to train the routers, or remove the router pattern to keep them frozen"
    ]
