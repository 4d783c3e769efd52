"""The ``bridge-freeze`` command: one module per sub-command, assembled here.

- ``families [--json]`` (:mod:`._families`): the registered families, their provider classes and part prefixes;
- ``demo [MODEL] [--freeze-...] [--steps N]`` (:mod:`._demo`): train a tiny real Bridge model on the CPU with a
  selection and check that exactly the selected parts changed;
- ``plan MODEL [--freeze-...] (--tiny | --hf-config PATH) [--json]`` (:mod:`._plan`): parameters and training
  memory per part, from the real Bridge model built on the meta device;
- ``check-config FILE [--rl] [key=value ...]`` (:mod:`._check_config`): validate a training config.

Errors are one readable line and a non-zero exit (a traceback only with ``--debug``). The ``--json``
documents are described in ``docs/cli.md``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from bridge_freeze_plugin.cli import _check_config as check_config
from bridge_freeze_plugin.cli import _demo as demo
from bridge_freeze_plugin.cli import _families as families
from bridge_freeze_plugin.cli import _plan as plan
from bridge_freeze_plugin.cli._common import EXIT_CHECK_FAILED, EXIT_OK, EXIT_USAGE, Parser, logging_flags, one_line
from bridge_freeze_plugin.cli._training_options import make_lora, part_learning_rates
from bridge_freeze_plugin.errors import BridgeFreezeError
from bridge_freeze_plugin.request import VOCABULARY, spoken

__all__ = ["build_parser", "main", "make_lora", "part_learning_rates"]

_SUBCOMMANDS = (families, demo, plan, check_config)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="bridge-freeze",
        description=("Choose which parts of a Megatron-Bridge multimodal model train "
                     f"({spoken((info.label for info in VOCABULARY), 'and')})."),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  bridge-freeze families\n  bridge-freeze demo qwen3_vl --freeze-vision-model --steps 5",
    )
    logging_flags(parser, sub=False)
    subparsers = parser.add_subparsers(dest="command", required=True)
    for module in _SUBCOMMANDS:
        module.add_parser(subparsers)
    return parser


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    args, extra = build_parser().parse_known_args(argv)
    if extra:
        # check-config's and plan's KEY=VALUE overrides may come after their options (FILE --rl a.b=c).
        if args.command in ("check-config", "plan") and not any(e.startswith("-") for e in extra):
            args.overrides = [*args.overrides, *extra]
        else:  # reported by the sub-command's parser, under its name
            args.parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    level = logging.DEBUG if args.debug else getattr(logging, str(args.log_level).upper(), logging.WARNING)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        return int(args.func(args))
    except BrokenPipeError:  # e.g. `bridge-freeze plan ... | head`: the reader left, not an error of ours
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK
    except BridgeFreezeError as exc:
        if args.debug:
            raise
        sys.stderr.write(f"bridge-freeze {args.command}: error: {one_line(str(exc))}\n")
        return EXIT_USAGE
    except Exception as exc:  # anything else: still one line (the traceback with --debug)
        if args.debug:
            raise
        sys.stderr.write(f"bridge-freeze {args.command}: unexpected error: {type(exc).__name__}: "
                         f"{one_line(str(exc))} (run with --debug for the traceback)\n")
        return EXIT_CHECK_FAILED
