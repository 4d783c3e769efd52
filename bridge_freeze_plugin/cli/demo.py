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
from bridge_freeze_plugin.counting import PartTally
from bridge_freeze_plugin.errors import CommandError
from bridge_freeze_plugin.selection import FreezeSelection

#: The demo's default selection: the projection trains, the rest is frozen.
PROJECTION_ONLY = FreezeSelection(freeze_language_model=True, freeze_vision_model=True)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    demo = add_subcommand(
        subparsers, "demo", help="train a tiny real Bridge VLM on the CPU with a selection, and check what changed",
        epilog="examples:\n  bridge-freeze demo                       # Qwen3-VL, projection only\n"
               "  bridge-freeze demo qwen25_vl --freeze-vision-model --steps 3",
    )
    demo.add_argument("model", nargs="?", default="qwen3_vl", help="family to build (default qwen3_vl)")
    demo.add_argument("--steps", type=bounded_int(1), default=5, help="AdamW steps, at least 1 (default 5)")
    demo.add_argument("--seed", type=bounded_int(0, MAX_SEED, maximum_text="2**64 - 1"), default=0,
                      help="random seed for the weights and the synthetic batch (default 0)")
    add_selection_flags(demo)
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


def _check_request(model: str, selection: FreezeSelection) -> None:
    """Refuse, before any build, a configuration that cannot train here or a selection that trains nothing."""
    from bridge_freeze_harness import train
    from bridge_freeze_harness.tiny import TINY_FAMILIES

    trainable = train.trainable_families()
    if model not in trainable:
        reason = train.cannot_train_reason(model) if model in TINY_FAMILIES else None
        why = f" ({reason})" if reason else ""
        raise CommandError(f"no demo training recipe for {model!r}{why}; choose one of: {', '.join(trainable)}")
    if not selection.trained_parts():
        raise CommandError(
            "all three parts frozen: nothing would train (without LoRA). Leave at least one --freeze-* flag off"
        )


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


def _verdict(trainable: set[str], changed: set[str]) -> list[str]:
    """The FAIL lines (none when exactly the trainable tensors changed)."""
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
        from bridge_freeze_plugin import make_freezable
    except ImportError as exc:  # the demo needs the development stack (make demo installs it)
        raise CommandError(
            f"the demo needs torch and megatron-bridge ({exc}); run it through 'make demo', which sets them up"
        ) from exc

    selection = selection_from(args, PROJECTION_ONLY)
    _check_request(args.model, selection)
    torch.manual_seed(args.seed)
    started = time.perf_counter()
    with quiet_third_party(logging.getLogger().getEffectiveLevel()):
        provider = make_freezable(train.make_provider(args.model), selection)
        (model,) = build_tiny_chunks(args.model, provider=provider)
    out(provider.freeze_report(model).format())
    out()

    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    losses = train.train_steps(model, args.model, provider, steps=args.steps, seed=args.seed,
                               on_step=_Progress(args.steps))
    changed = {n for n, p in model.named_parameters() if not torch.equal(p.detach(), before[n])}
    out(f"after {args.steps} AdamW steps (loss {losses[0]:.4f} -> {losses[-1]:.4f}): tensors changed, by part")
    _print_changes(model, provider.freeze_family(), trainable, changed)
    out()
    failures = _verdict(trainable, changed)
    for line in failures:
        out(line)
    if failures:
        return EXIT_CHECK_FAILED
    out(f"OK: exactly the {len(trainable)} trainable tensors changed ({selection.describe()}); "
        f"{time.perf_counter() - started:.1f} s")
    return EXIT_OK
