"""The ``bridge-freeze`` command.

Sub-commands:

- ``families [--json]``: the registered families, their provider classes and part prefixes;
- ``demo [MODEL] [--freeze-...] [--steps N]``: build a tiny real Bridge model on the CPU, apply a
  selection (default: projection only), train N AdamW steps on synthetic data, and show which
  parameters changed, by part. Exits 1 if a frozen tensor changed or a trainable one did not.

Errors are one readable line and a non-zero exit (a traceback only with ``--debug``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from bridge_freeze_plugin.errors import BridgeFreezeError
from bridge_freeze_plugin.registry import list_families
from bridge_freeze_plugin.selection import SELECTABLE_PARTS, FreezeSelection, Part

EXIT_OK, EXIT_CHECK_FAILED, EXIT_USAGE = 0, 1, 2


class CommandError(Exception):
    """A user-facing failure: printed as one line, exit code 2."""


def _out(text: str = "") -> None:
    sys.stdout.write(text + "\n")


# ---------------------------------------------------------------------------------------------
# families
# ---------------------------------------------------------------------------------------------


def cmd_families(args: argparse.Namespace) -> int:
    families = list_families()
    if args.json:
        _out(json.dumps({"families": [f.as_dict() for f in families]}, indent=2, sort_keys=True))
        return EXIT_OK
    for spec in families:
        _out(f"{spec.name}  [{spec.source}]  {spec.description}")
        for path in spec.providers:
            _out(f"    provider           {path}")
        for part in (*SELECTABLE_PARTS, Part.OTHER):
            prefixes = spec.prefixes(part)
            if prefixes:
                _out(f"    {part.value:<18} {', '.join(prefixes)}")
    return EXIT_OK


# ---------------------------------------------------------------------------------------------
# demo
# ---------------------------------------------------------------------------------------------


def _selection_from(args: argparse.Namespace, default: FreezeSelection) -> FreezeSelection:
    chosen = FreezeSelection(
        freeze_language_model=args.freeze_language_model,
        freeze_vision_model=args.freeze_vision_model,
        freeze_vision_projection=args.freeze_vision_projection,
    )
    return chosen if (chosen.any_set or args.train_all) else default


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


def cmd_demo(args: argparse.Namespace) -> int:
    try:
        import torch

        from bridge_freeze_plugin.mixins import make_freezable
        from bridge_freeze_testing import train
        from bridge_freeze_testing.tiny import build_tiny_chunks
    except ImportError as exc:  # the demo needs the development stack (make demo installs it)
        raise CommandError(
            f"the demo needs torch and megatron-bridge ({exc}); run it through 'make demo', which sets them up"
        ) from exc

    if args.model not in train.TRAIN_SPECS:
        raise CommandError(
            f"no demo training recipe for {args.model!r}; choose one of: {', '.join(sorted(train.TRAIN_SPECS))}"
        )
    selection = _selection_from(args, FreezeSelection(freeze_language_model=True, freeze_vision_model=True))
    if not selection.trained_parts():
        raise CommandError(
            "all three parts frozen: nothing would train (without LoRA). Leave at least one --freeze-* flag off"
        )
    torch.manual_seed(args.seed)
    started = time.perf_counter()
    provider = make_freezable(train.make_provider(args.model), selection)
    family = provider.freeze_family()
    (model,) = build_tiny_chunks(args.model, provider=provider)
    report = provider.freeze_report(model)
    _out(report.format())
    _out()

    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    progress = _Progress(args.steps)
    losses = train.train_steps(model, args.model, provider, steps=args.steps, seed=args.seed, on_step=progress)
    changed = {n for n, p in model.named_parameters() if not torch.equal(p.detach(), before[n])}

    rows: dict[str, list[int]] = {}
    for name in before:
        part = family.classify(name) if family else None
        row = rows.setdefault((part or Part.OTHER).value, [0, 0, 0])
        row[0] += 1
        row[1] += name in trainable
        row[2] += name in changed
    _out(f"after {args.steps} AdamW steps (loss {losses[0]:.4f} -> {losses[-1]:.4f}): tensors changed, by part")
    _out(f"  {'part':<18} {'tensors':>8} {'trainable':>10} {'changed':>8}")
    for part_name, (total, n_train, n_changed) in rows.items():
        _out(f"  {part_name:<18} {total:>8} {n_train:>10} {n_changed:>8}")

    frozen_changed = sorted(changed - trainable)
    trainable_unchanged = sorted(trainable - changed)
    _out()
    if frozen_changed or trainable_unchanged:
        if frozen_changed:
            _out(f"FAIL: {len(frozen_changed)} frozen tensor(s) changed, e.g. {', '.join(frozen_changed[:5])}")
        if trainable_unchanged:
            _out(f"FAIL: {len(trainable_unchanged)} trainable tensor(s) did not change, "
                 f"e.g. {', '.join(trainable_unchanged[:5])}")
        return EXIT_CHECK_FAILED
    _out(f"OK: exactly the {len(trainable)} trainable tensors changed ({selection.describe()}); "
         f"{time.perf_counter() - started:.1f} s")
    return EXIT_OK


# ---------------------------------------------------------------------------------------------
# parser
# ---------------------------------------------------------------------------------------------


def _add_selection_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("selection (default for demo: projection only)")
    group.add_argument("--freeze-language-model", action="store_true", help="freeze the language model")
    group.add_argument("--freeze-vision-model", action="store_true", help="freeze the vision encoder")
    group.add_argument("--freeze-vision-projection", action="store_true", help="freeze the vision projection")
    group.add_argument("--train-all", action="store_true", help="set no flag: train the whole model")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bridge-freeze",
        description="Choose which parts of a Megatron-Bridge VLM train (language model, vision encoder, projection).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  bridge-freeze families\n  bridge-freeze demo qwen3_vl --freeze-vision-model --steps 5",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks and DEBUG logs")
    parser.add_argument("--log-level", default="WARNING", help="logging level (default WARNING)")
    sub = parser.add_subparsers(dest="command", required=True)

    fam = sub.add_parser(
        "families", help="list the registered VLM families",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  bridge-freeze families\n  bridge-freeze families --json | jq '.families[].name'",
    )
    fam.add_argument("--json", action="store_true", help="machine-readable output")
    fam.set_defaults(func=cmd_families)

    demo = sub.add_parser(
        "demo", help="train a tiny real Bridge VLM on the CPU with a selection, and check what changed",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  bridge-freeze demo                       # Qwen3-VL, projection only\n"
               "  bridge-freeze demo qwen25_vl --freeze-vision-model --steps 3",
    )
    demo.add_argument("model", nargs="?", default="qwen3_vl", help="family to build (default qwen3_vl)")
    demo.add_argument("--steps", type=int, default=5, help="AdamW steps (default 5)")
    demo.add_argument("--seed", type=int, default=0)
    _add_selection_flags(demo)
    demo.set_defaults(func=cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = logging.DEBUG if args.debug else getattr(logging, str(args.log_level).upper(), logging.WARNING)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        return int(args.func(args))
    except (CommandError, BridgeFreezeError) as exc:
        if args.debug:
            raise
        sys.stderr.write(f"bridge-freeze {args.command}: error: {exc}\n")
        return EXIT_USAGE


def _run() -> Any:  # pragma: no cover - console-script shim
    sys.exit(main())


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
