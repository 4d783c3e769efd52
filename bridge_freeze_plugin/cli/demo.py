"""``bridge-freeze demo``: train a tiny real Bridge VLM on the CPU with a selection, and check what changed.

Builds a tiny configuration through Bridge's real provider with the CPU harness (:mod:`bridge_freeze_harness`,
imported lazily; why it exists is said there), applies the selection (default: projection only), trains a few
AdamW steps on a synthetic batch and shows, per part, how many tensors train and how many changed. Exit 1 if a
frozen tensor changed or a trainable one did not.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from typing import Any

from bridge_freeze_plugin.cli._common import (
    EXIT_CHECK_FAILED,
    EXIT_OK,
    MAX_SEED,
    add_selection_flags,
    add_subcommand,
    bounded_int,
    finish_subcommand,
    out,
    quiet_third_party,
    selection_from,
)
from bridge_freeze_plugin.cli.training_options import (
    FULL_RECOMPUTE,
    add_lora_options,
    add_pattern_options,
    add_training_options,
    make_lora,
    part_learning_rates,
    refuse_nothing_to_train,
    with_patterns,
)
from bridge_freeze_plugin.counting import PartTally
from bridge_freeze_plugin.errors import CommandError
from bridge_freeze_plugin.selection import SELECTABLE_PARTS, FreezeSelection

#: The demo's global learning rate (AdamW).
GLOBAL_LR = 1e-2

#: The demo's default selection: the projection trains, the rest is frozen.
PROJECTION_ONLY = FreezeSelection(freeze_language_model=True, freeze_vision_model=True)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    demo = add_subcommand(
        subparsers, "demo", help="train a tiny real Bridge VLM on the CPU with a selection, and check what changed",
        epilog="examples:\n  bridge-freeze demo                       # Qwen3-VL, projection only\n"
               "  bridge-freeze demo qwen25_vl --freeze-vision-model --steps 3\n"
               "  bridge-freeze demo --lora-rank 4 --freeze-language-model --freeze-vision-model "
               "--lora-target-modules linear_qkv linear_proj\n"
               "  bridge-freeze demo --freeze-language-model --lr-vision-projection 0\n"
               "  bridge-freeze demo --freeze-language-model --train 'language_model\\.decoder\\.layers\\.1'\n"
               "  bridge-freeze demo --train-all --recompute full",
    )
    demo.add_argument("model", nargs="?", default="qwen3_vl", help="family to build (default qwen3_vl)")
    demo.add_argument("--steps", type=bounded_int(1), default=5, help="AdamW steps, at least 1 (default 5)")
    demo.add_argument("--seed", type=bounded_int(0, MAX_SEED, maximum_text="2**64 - 1"), default=0,
                      help="random seed for the weights and the synthetic batch (default 0)")
    add_selection_flags(demo)
    add_pattern_options(demo)
    add_lora_options(demo)
    add_training_options(demo)
    finish_subcommand(demo, run)
    return demo


class _Progress:
    """A one-line progress bar on stderr (a plain line per step when stderr is not a terminal)."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.tty = sys.stderr.isatty()

    def __call__(self, step: int, loss: float) -> None:
        done = step + 1
        width = 24
        filled = width * done // self.total
        bar = "#" * filled + "-" * (width - filled)
        line = f"train [{bar}] {done}/{self.total} loss {loss:.4f}"
        sys.stderr.write(("\r" + line) if self.tty else (line + "\n"))
        if self.tty and done == self.total:
            sys.stderr.write("\n")
        sys.stderr.flush()


def _check_request(model: str, selection: FreezeSelection, lora_rank: int = 0) -> None:
    """Refuse, before any build, a configuration that cannot train here or a selection that trains nothing."""
    from bridge_freeze_harness import train
    from bridge_freeze_harness.tiny import TINY_FAMILIES

    trainable = train.trainable_families()
    if model not in trainable:
        reason = train.cannot_train_reason(model) if model in TINY_FAMILIES else None
        why = f" ({reason})" if reason else ""
        raise CommandError(f"no demo training recipe for {model!r}{why}; choose one of: {', '.join(trainable)}")
    refuse_nothing_to_train(selection, lora_rank)


def _print_changes(model: Any, family: Any, trainable: set[str], changed: set[str]) -> None:
    """The per-part table: tensors, trainable tensors, changed tensors."""
    trains, changes = PartTally(), PartTally()
    for name, param in model.named_parameters():
        part = family.classify(name) if family is not None else None
        trains.add(part, int(param.numel()), name in trainable)
        changes.add(part, int(param.numel()), name in changed)
    out(f"  {'part':<18} {'tensors':>8} {'trainable':>10} {'changed':>8}")
    for count, moved in zip(trains.parts(), changes.parts(), strict=True):
        name = count.part.value if count.part is not None else "other"
        out(f"  {name:<18} {count.total_tensors:>8} {count.trainable_tensors:>10} {moved.trainable_tensors:>8}")


def _lr_of(rates: dict[str, float]) -> Any:
    """A parameter's learning rate: its part's (``bridge_freeze_part``, set by the freeze), else the global one."""
    from bridge_freeze_plugin.build.freeze import PART_ATTR

    return lambda param: rates.get(getattr(param, PART_ATTR, None), GLOBAL_LR)


def _verdict(trainable: set[str], changed: set[str]) -> list[str]:
    """The FAIL lines (none when exactly the tensors meant to change, ``trainable``, changed)."""
    frozen_changed = sorted(changed - trainable)
    trainable_unchanged = sorted(trainable - changed)
    lines = []
    if frozen_changed:
        lines.append(f"FAIL: {len(frozen_changed)} frozen tensor(s) changed, e.g. {', '.join(frozen_changed[:5])}")
    if trainable_unchanged:
        lines.append(f"FAIL: {len(trainable_unchanged)} trainable tensor(s) did not change, "
                     f"e.g. {', '.join(trainable_unchanged[:5])}")
    return lines


def run(args: argparse.Namespace) -> int:
    try:
        import torch
        import transformers  # noqa: F401  (before quiet_third_party: it sets its loggers' levels on import)

        from bridge_freeze_harness import train
        from bridge_freeze_harness.tiny import build_tiny_chunks
        from bridge_freeze_plugin import last_report, make_freezable
    except ImportError as exc:  # the demo needs the development stack (make demo installs it)
        raise CommandError(
            f"the demo needs torch and megatron-bridge ({exc}); run it through 'make demo', which sets them up"
        ) from exc

    selection = with_patterns(selection_from(args, PROJECTION_ONLY), args)
    _check_request(args.model, selection, args.lora_rank)
    rates = part_learning_rates(args, selection)
    torch.manual_seed(args.seed)
    started = time.perf_counter()
    with quiet_third_party(logging.getLogger().getEffectiveLevel()):
        provider = make_freezable(
            train.make_provider(args.model, **(FULL_RECOMPUTE if args.recompute == "full" else {})), selection)
        lora = make_lora(args)
        if lora is not None:
            provider.register_pre_wrap_hook(lora)
        (model,) = build_tiny_chunks(args.model, provider=provider)
    report = last_report(provider)
    out(report.format() if report is not None else provider.freeze_report(model).format())
    lr_of = _lr_of(rates)
    if rates:
        out("learning rates: " + ", ".join(f"{p.value} {rates.get(p.value, GLOBAL_LR):g}" for p in SELECTABLE_PARTS)
            + f" (global {GLOBAL_LR:g})")
    out()

    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    expected = {n for n, p in model.named_parameters() if p.requires_grad and lr_of(p) != 0.0}  # LR 0: unchanged
    losses = train.train_steps(model, args.model, provider, steps=args.steps, seed=args.seed, lr=GLOBAL_LR,
                               on_step=_Progress(args.steps), lr_of=lr_of)
    changed = {n for n, p in model.named_parameters() if not torch.equal(p.detach(), before[n])}
    out(f"after {args.steps} AdamW steps (loss {losses[0]:.4f} -> {losses[-1]:.4f}): tensors changed, by part")
    _print_changes(model, provider.freeze_family(), trainable, changed)
    out()
    failures = _verdict(expected, changed)
    for line in failures:
        out(line)
    if failures:
        return EXIT_CHECK_FAILED
    still = trainable - expected
    held = f"; {len(still)} trainable at learning rate 0 stayed unchanged" if still else ""
    out(f"OK: exactly the {len(expected)} tensors meant to change changed ({selection.describe()}{held}); "
        f"{time.perf_counter() - started:.1f} s")
    return EXIT_OK
