"""The training options ``demo`` (and ``plan``, where they apply) take on top of the flags.

- ``--train PATTERN...`` / ``--freeze PATTERN...``: patterns refining the flags (``FreezeSelection``);
- ``--lora-rank N`` (0: off) and ``--lora-target-modules NAME...`` (Bridge's LoRA defaults when not given):
  Bridge's real LoRA as a pre-wrap hook; with flags, the parts whose flag is off train at full rank;
- ``--lr-language-model`` / ``--lr-vision-model`` / ``--lr-vision-projection``: a learning rate per part
  (unset: the global one; 0.0 honoured: that part must not change);
- ``--recompute full``: full activation recompute (uniform, one layer per chunk) on the provider.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Iterable
from typing import Any

from bridge_freeze_plugin.cli._common import MAX_LORA_RANK, bounded_int
from bridge_freeze_plugin.errors import CommandError
from bridge_freeze_plugin.request import INFO, SELECTABLE_PARTS, FreezeSelection, Part, check_lora_targets

LR_OPTIONS = {part.value: INFO[part].lr_key for part in SELECTABLE_PARTS}
FULL_RECOMPUTE = {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1}


def _learning_rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text!r}")
    return value


def add_pattern_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("patterns (anchored regular expressions over parameter or module names)")
    group.add_argument("--train", metavar="PATTERN", nargs="+", action="extend", default=[],
                       help="parameters or modules to train whatever their flag says")
    group.add_argument("--freeze", metavar="PATTERN", nargs="+", action="extend", default=[],
                       help="parameters or modules to freeze (a --train pattern wins)")


def add_lora_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("LoRA (with flags: the parts whose flag is off train at full rank)")
    group.add_argument("--lora-rank", metavar="N", type=bounded_int(0, MAX_LORA_RANK), default=0,
                       help=f"LoRA rank, 0 to {MAX_LORA_RANK:,} (0: off)")
    group.add_argument("--lora-target-modules", metavar="NAME", nargs="+", default=None,
                       help="LoRA target modules (default: Bridge's LoRA defaults, linear_qkv linear_proj "
                            "linear_fc1 linear_fc2)")


def add_training_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("training")
    for part, key in LR_OPTIONS.items():
        group.add_argument(f"--{key.replace('_', '-')}", metavar="LR", type=_learning_rate, default=None,
                           help=f"learning rate of the {part} (default: the global one; 0 keeps it unchanged)")
    group.add_argument("--recompute", choices=["none", "full"], default="none",
                       help="full activation recompute (uniform, 1 layer per chunk); default none")


def with_patterns(selection: FreezeSelection, args: argparse.Namespace) -> FreezeSelection:
    """``selection`` with the --train / --freeze patterns (compiled: an invalid one fails here)."""
    train, freeze = list(getattr(args, "train", [])), list(getattr(args, "freeze", []))
    if not train and not freeze:
        return selection
    return FreezeSelection(**selection.as_dict(), train_patterns=train, freeze_patterns=freeze)


def refuse_nothing_to_train(selection: FreezeSelection, lora_rank: int, parts: Iterable[Part] | None = None) -> None:
    """Every part (of ``parts``: the model's) frozen, no LoRA and no train pattern: nothing would train (refused
    before any build)."""
    if selection.freezes_all(parts) and not lora_rank and not selection.train_patterns:
        raise CommandError(
            "every part frozen and no LoRA (--lora-rank): nothing would train. Leave at least one --freeze-* "
            "flag off, add --lora-rank N to train adapters, or --train PATTERN"
        )


def check_lora_options(args: argparse.Namespace) -> None:
    """Refuse --lora-target-modules without --lora-rank, and targets Bridge's matcher cannot take (no import)."""
    if not args.lora_rank:
        if args.lora_target_modules:
            raise CommandError("--lora-target-modules needs --lora-rank N (N > 0)")
        return
    check_lora_targets(args.lora_target_modules or (), "--lora-target-modules")  # Bridge matches them as regexes


def make_lora(args: argparse.Namespace) -> Any | None:
    """Bridge's real LoRA for --lora-rank / --lora-target-modules (``None`` when --lora-rank is 0).

    Imports Bridge's PEFT package: on a machine without TransformerEngine, import Bridge through the CPU harness
    first (``bridge_freeze_harness.cpu_runtime.import_bridge``)."""
    check_lora_options(args)
    if not args.lora_rank:
        return None
    from megatron.bridge.peft.lora import LoRA

    lora = LoRA(dim=args.lora_rank, alpha=2 * args.lora_rank)
    if args.lora_target_modules:
        lora.target_modules = list(args.lora_target_modules)
    return lora


def part_learning_rates(args: argparse.Namespace, selection: FreezeSelection) -> dict[str, float]:
    """part -> LR for the parts given one; an LR for a part that will not train is refused: frozen by its flag
    and reached by no --train pattern (one that reaches it trains part of it)."""
    rates = {part: getattr(args, key) for part, key in LR_OPTIONS.items() if getattr(args, key, None) is not None}
    untrained = {p.value for p in selection.untrained_parts()}
    refused = sorted(set(rates) & untrained)
    if refused:
        option = refused[0].replace("_", "-")
        patterns = " and no --train pattern reaches it" if selection.train_patterns else ""
        raise CommandError(
            f"--lr-{option} is given, but --freeze-{option} freezes that part{patterns}: its learning rate would "
            f"never apply. Drop one of the two"
        )
    return rates
