"""LoRA targets that land on plain ``torch.nn.Linear`` modules: refused by the config as the build refuses them.

Bridge's LoRA up to 0.6.2 turns a plain ``torch.nn.Linear`` (an HF-implemented tower) into a bare ``LinearAdapter``,
whose training no Bridge export carries (``prewrap/_plain_linear.py``); a later Bridge (0.7.0) keeps the layer as
``to_wrap`` and exports it. Which one is installed is found by trying Bridge's own ``LoRA.transform`` on a tiny
``torch.nn.Linear`` once (``prewrap.bridge_lora_wraps_plain_linear``), never from a version: where it keeps the
layer, nothing here is refused; where it cannot be tried (Bridge's LoRA does not import here), the rule stays. The
family's table lists those modules (``plain_linear``
prefixes); a target whose literal head (the text before the first ``*``) lies under one of them reaches such
modules for certain and is refused while a flag is set. A target whose head lies above such a prefix (``*qkv``,
``vis*``) may reach them: left to the build, which refuses it if it does (warned here). A leaf name (``qkv``,
SkyRL's ``all-linear`` list) reaches the modules of that name that the family's ``linear_leaves`` table lists; with
no table, it and a regex are left to the build without a word, as the full-rank overlap rule leaves them. An
empty target list (Bridge's LoRA then wraps every linear module) reaches them unless ``exclude_modules`` is written.
"""

from __future__ import annotations

import logging

from bridge_freeze_plugin.config._run_settings import RunSettings
from bridge_freeze_plugin.families import FamilySpec
from bridge_freeze_plugin.prewrap import bridge_lora_wraps_plain_linear
from bridge_freeze_plugin.ranks import is_rank0
from bridge_freeze_plugin.request import Part

logger = logging.getLogger("bridge_freeze_plugin")

#: Characters that make a target more than a wildcard path (Bridge compiles targets as regular expressions).
_REGEX_CHARACTERS = frozenset("[](){}?+^$|\\")


def _plain_linear_reach(target: str, family: FamilySpec) -> tuple[list[str], list[str]]:
    """``(prefixes it certainly reaches, prefixes it may reach)`` among the family's ``plain_linear``."""
    prefixes = family.plain_linear
    if _REGEX_CHARACTERS & set(target):
        return [], []  # a regex: only the built model tells (it refuses what it must)
    if "." not in target and "*" not in target:
        return _leaf_reach(target, family)
    head = target.partition("*")[0]
    certain = [p for p in prefixes if head.startswith(p + ".") or head == p]
    may = [p for p in prefixes if p not in certain and (p + ".").startswith(head)]
    return certain, may


def _leaf_reach(leaf: str, family: FamilySpec) -> tuple[list[str], list[str]]:
    """A leaf name reaches every module of that name: the ``plain_linear`` prefixes over a part that has one for
    certain, those inside such a part maybe (no leaf table: left to the build)."""
    if not family.linear_leaves:
        return [], []
    holders = [prefix for part in (*family.part_names(), Part.OTHER) if leaf in (family.linear_leaves_of(part) or ())
               for prefix in family.prefixes(part)]
    certain = [p for p in family.plain_linear if any(h == p or h.startswith(p + ".") for h in holders)]
    may = [p for p in family.plain_linear if p not in certain and any(p.startswith(h + ".") for h in holders)]
    return certain, may


def lora_targets_are_exportable(s: RunSettings, family: FamilySpec | None) -> list[str]:
    """A LoRA target that certainly lands on plain ``torch.nn.Linear`` modules, while a flag is set: a problem."""
    if not s.lora.enabled or not s.selection.any_set or family is None or not family.plain_linear:
        return []
    section = (s.lora_read.rank.key or "lora.rank").rpartition(".")[0]
    targets = s.lora.target_modules
    if targets is None:  # Bridge's default leaf names (linear_qkv, ...): Megatron layers
        return []
    if targets == ():
        reach = {"[] (empty: every linear module)": ([], list(family.plain_linear)) if s.lora.exclude_modules
                 else (list(family.plain_linear), [])}
    else:
        reach = {repr(t): _plain_linear_reach(str(t), family) for t in ([targets] if isinstance(targets, str)
                                                                        else targets)}
    found = [f"{t} (reaches {', '.join(certain)})" for t, (certain, _) in reach.items() if certain]
    maybe = [f"{t} (may reach {', '.join(may)})" for t, (certain, may) in reach.items() if may and not certain]
    if not found and not maybe:
        return []
    # Only now is the installed Bridge's LoRA tried (it imports Bridge: seconds), and once per process.
    wraps = bridge_lora_wraps_plain_linear()
    if wraps:  # the installed Bridge keeps a plain Linear as to_wrap: its exports carry the adapters
        return []
    if maybe and is_rank0():
        logger.warning(
            "bridge-freeze: LoRA target_modules %s: adapters there may land on plain torch.nn.Linear modules of "
            "%s (HF-implemented), whose training no Bridge export carries; the build refuses them if they do "
            "(UnexportableAdapterError, before training).", ", ".join(maybe), family.name,
        )
    if not found:
        return []
    lm = family.prefixes(Part.LANGUAGE_MODEL)
    return [
        f"{section}.target_modules {', '.join(found)}: on {family.name} those modules are plain torch.nn.Linear "
        f"layers (HF-implemented), which {_whose(wraps)} wraps as a bare LinearAdapter (no to_wrap), and no "
        f"export of it carries their training (the merged HF export merges only layers kept as to_wrap; the "
        f"adapter exports keep '.adapter.' weights only; the RL sync follows the export): the trained adapters "
        f"would be lost, and the build would refuse them (UnexportableAdapterError). Target Megatron linear "
        f"layers (e.g. '{lm[0]}.*linear_qkv'), or train that part at full rank (its freeze flag false) with LoRA "
        f"scoped away from it, or use a Bridge whose LoRA keeps the Linear as to_wrap (Megatron-Bridge 0.7.0)."
    ]


def _whose(wraps: bool | None) -> str:
    """Whose LoRA the refusal speaks of: the installed Bridge's, tried (``False``), or untried (``None``)."""
    if wraps is None:
        return "Bridge's LoRA up to 0.6.2 (the installed Bridge's LoRA could not be tried here, as it does not import)"
    return "the installed Bridge's LoRA (tried on a torch.nn.Linear)"
