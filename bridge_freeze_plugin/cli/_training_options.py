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
from bridge_freeze_plugin.request import INFO, SELECTABLE_PARTS, FreezeSelection, Part, PartInfo, check_lora_targets

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
                           help=f"learning rate of the {INFO[Part(part)].label} (default: the global one; 0 keeps "
                                "it unchanged)")
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


def part_learning_rates(args: argparse.Namespace, selection: FreezeSelection, parts: Iterable[Part] | None = None,
                        default: FreezeSelection | None = None, model: str = "this model") -> dict[str, float]:
    """part -> LR for the parts given one; an LR for a part that will not train is refused: frozen by its flag
    and reached by no --train pattern (one that reaches it trains part of it), or a part ``model`` lacks (``parts``:
    its parts). ``default``: the selection the command uses when no --freeze-* flag is given (the demo's), which
    the message names when it is what freezes the part."""
    rates = {part: getattr(args, key) for part, key in LR_OPTIONS.items() if getattr(args, key, None) is not None}
    if parts is not None:
        _refuse_absent_parts(rates, tuple(parts), model)
    untrained = {p.value for p in selection.untrained_parts()}
    refused = [part for part in rates if part in untrained]
    if refused:
        info = INFO[Part(refused[0])]
        patterns = " and no --train pattern reaches it" if selection.train_patterns else ""
        if default is not None and not _flags_given(args):
            raise CommandError(_frozen_by_default(info, default, parts, patterns))
        raise CommandError(
            f"{info.lr_option} is given, but {info.option} freezes that part{patterns}: its learning rate would "
            f"never apply. Drop one of the two"
        )
    return rates


def _flags_given(args: argparse.Namespace) -> bool:
    """A --freeze-* flag or --train-all is given: the selection is the user's, not the command's default."""
    return getattr(args, "train_all", False) or any(getattr(args, INFO[p].flag, False) for p in SELECTABLE_PARTS)


def _frozen_by_default(info: PartInfo, default: FreezeSelection, parts: Iterable[Part] | None, patterns: str) -> str:
    """The message for an LR of a part the default selection (no --freeze-* flag given) freezes: it names the
    default as the flags that spell it, and how to choose a selection that trains the part."""
    parts = default.parts_of(parts)
    frozen = [INFO[p].option for p in parts if getattr(default, INFO[p].flag)]
    keep = [option for option in frozen if option != info.option]
    instead = (f"e.g. {' '.join(keep)} (the default without {info.option}) trains the {info.label}, or " if keep
               else "e.g. ")
    return (
        f"{info.lr_option} is given, but no --freeze-* flag is, so the demo's default selection applies "
        f"({default.describe(parts)}: {' '.join(frozen)}), which freezes the {info.label}{patterns}: its learning rate "
        f"would never apply. Choose the selection with the --freeze-* flags (any one given replaces the whole "
        f"default; this model's: {', '.join(INFO[p].option for p in parts)}): {instead}--train-all trains every "
        f"part. Or drop {info.lr_option}"
    )


def _refuse_absent_parts(rates: dict[str, float], parts: tuple[Part, ...], model: str) -> None:
    """An LR for a part the model does not have would never apply: refused, naming the options of its own parts."""
    absent = [INFO[Part(p)] for p in rates if Part(p) not in parts]
    if absent:
        raise CommandError(
            f"{', '.join(i.lr_option for i in absent)} {'is' if len(absent) == 1 else 'are'} given, but {model} has "
            f"no {' and '.join(i.label for i in absent)} (its parts: {', '.join(INFO[p].label for p in parts)}): "
            f"the learning rate would never apply. Its per-part learning rates: "
            f"{', '.join(INFO[p].lr_option for p in parts)}"
        )


def check_rules(model: str, selection: FreezeSelection, args: argparse.Namespace) -> None:
    """The rules ``check-config`` applies, on a command's run as a Bridge ``ConfigContainer`` would hold it (the
    flags, the patterns, LoRA): a selection the build would refuse is refused here, naming the target or key,
    before anything is built (a LoRA target reaching an HF tower's plain Linear or Conv3d ended as an unexpected
    error of Bridge's LoRA)."""
    from bridge_freeze_plugin.config import validate_bridge_config

    fields: dict[str, Any] = {INFO[part].flag: getattr(selection, INFO[part].flag) for part in SELECTABLE_PARTS}
    fields.update(train_patterns=list(selection.train_patterns), freeze_patterns=list(selection.freeze_patterns))
    cfg: dict[str, Any] = {"model": fields}
    if args.lora_rank:
        peft: dict[str, Any] = {"_target_": "megatron.bridge.peft.lora.LoRA", "dim": args.lora_rank,
                                "alpha": 2 * args.lora_rank}
        if args.lora_target_modules:
            peft["target_modules"] = list(args.lora_target_modules)
        cfg["peft"] = peft
    validate_bridge_config(cfg, family=model)
