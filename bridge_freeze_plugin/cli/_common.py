"""What every ``bridge-freeze`` sub-command shares: output, the one-line-error parser, argument types and flags.

Usage errors (a bad option or value, caught by argparse) are one line, exit 2, no usage block:
``bridge-freeze plan: error: ... (see bridge-freeze plan --help)``.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NoReturn

from bridge_freeze_plugin.errors import CommandError
from bridge_freeze_plugin.request import FLAGS, INFO, VOCABULARY, FreezeSelection, Part

EXIT_OK, EXIT_CHECK_FAILED, EXIT_USAGE = 0, 1, 2

#: torch.manual_seed takes up to 2**64 - 1; negative seeds are refused rather than wrapped.
MAX_SEED = 2**64 - 1
#: The largest count plan and demo take for a size the run hands to torch / megatron-core as a 32-bit integer
#: (a parallel size, a world, a sequence length, a batch): every integer option has a maximum, checked by argparse
#: before anything runs (an unbounded one ran and then failed deep inside, e.g. ``OverflowError`` in Bridge).
MAX_COUNT = 2**31 - 1
#: ``demo --steps``: CPU iterations of a tiny model (about a second each); Bridge's data loader sizes its dataset
#: as iterations x global batch, which must fit an index (``--steps 10**23`` ended in ``OverflowError``).
MAX_STEPS = 1_000_000
#: ``--lora-rank``: above any model's hidden size (a rank past a layer's width only adds parameters).
MAX_LORA_RANK = 65_536


def out(text: str = "") -> None:
    """Write one line of the command's result to stdout (the library never prints; the command does here)."""
    sys.stdout.write(text + "\n")


def one_line(message: str) -> str:
    """A (possibly multi-line) message as one line: '2 problems ...: a; b'."""
    lines = [line.strip() for line in str(message).splitlines() if line.strip()]
    if len(lines) <= 1:
        return lines[0] if lines else ""
    rest = [line[2:] if line.startswith("- ") else line for line in lines[1:]]
    return f"{lines[0]} {'; '.join(rest)}"


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are one line on stderr, exit 2 (no usage block).

    ``add_subparsers`` makes the sub-parsers of the same class, so every sub-command reports the same
    way, under its own name: ``bridge-freeze plan: error: ... (see bridge-freeze plan --help)``.
    """

    def error(self, message: str) -> NoReturn:
        text = " ".join(line.strip() for line in message.splitlines() if line.strip())
        self.exit(EXIT_USAGE, f"{self.prog}: error: {text} (see {self.prog} --help)\n")


def bounded_int(minimum: int, maximum: int = MAX_COUNT, *, maximum_text: str = "") -> Callable[[str], int]:
    """An argparse ``type``: an integer in [minimum, maximum] (default :data:`MAX_COUNT`), else a usage error at
    parse time."""
    what = f"an integer from {minimum} to {maximum_text or f'{maximum:,}'}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None
        if value < minimum or value > maximum:
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
        return value

    return parse


def logging_flags(parser: argparse.ArgumentParser, *, sub: bool) -> None:
    """--debug / --log-level, accepted before or after the sub-command."""
    parser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS if sub else False,
                        help="show tracebacks and DEBUG logs")
    parser.add_argument("--log-level", default=argparse.SUPPRESS if sub else "WARNING",
                        choices=["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"], type=str.upper,
                        help="logging level (default WARNING; INFO also shows Megatron's own messages)")


def add_subcommand(subparsers: Any, name: str, **kwargs: Any) -> argparse.ArgumentParser:
    """A sub-command's parser; its description and examples (``epilog``) are printed as written."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        name, formatter_class=argparse.RawDescriptionHelpFormatter, **kwargs
    )
    return parser


def finish_subcommand(parser: argparse.ArgumentParser, run: Callable[[argparse.Namespace], int]) -> None:
    """Add the logging flags (last in --help) and say which function runs the sub-command."""
    logging_flags(parser, sub=True)
    parser.set_defaults(func=run, parser=parser)


def add_selection_flags(parser: argparse.ArgumentParser, *, demo: bool = True) -> None:
    """One --freeze-<part> option per part of the vocabulary (and, for the demo, --train-all)."""
    title = "selection (default for demo: projection only)" if demo else "selection (default: train everything)"
    group = parser.add_argument_group(title)
    for info in VOCABULARY:
        extra = "" if info.assumed else " (a family that has one)"
        group.add_argument(info.option, action="store_true", help=f"freeze the {info.label}{extra}")
    if demo:
        group.add_argument("--train-all", action="store_true", help="set no flag: train the whole model")


def selection_from(args: argparse.Namespace, default: FreezeSelection | None = None) -> FreezeSelection:
    """The selection the --freeze-* flags ask for; ``default`` when none is given (and not --train-all)."""
    chosen = FreezeSelection(**{flag: bool(getattr(args, flag, False)) for flag in FLAGS})
    if getattr(args, "train_all", False) and chosen.any_set:
        given = [info.option for info in VOCABULARY if getattr(args, info.flag, False)]
        raise CommandError(f"--train-all (set no flag: train every part) cannot be given with {', '.join(given)}: "
                           f"give --train-all alone to train the whole model, or only the --freeze-* options for the "
                           f"parts to freeze")
    if default is None or chosen.any_set or getattr(args, "train_all", False):
        return chosen
    return default


def flags_line(selection: FreezeSelection, parts: Iterable[Part] | None = None) -> str:
    """``freeze_language_model=true freeze_vision_model=false ...``: the flags of ``parts`` (the model's)."""
    return " ".join(f"{INFO[p].flag}={'true' if getattr(selection, INFO[p].flag) else 'false'}"
                    for p in selection.parts_of(parts))


@contextlib.contextmanager
def quiet_third_party(level: int) -> Iterator[None]:
    """Keep Megatron / transformers chatter (warnings, INFO lines, prints) off the command's output.

    Anything printed while building goes to stderr (stdout stays the command's result, e.g. JSON);
    third-party warnings and log records below ERROR show only with --log-level INFO / --debug.
    Import torch and transformers first: they set their loggers' levels on import.
    """
    names = ("megatron", "transformers", "torch", "py.warnings")
    saved = {name: logging.getLogger(name).level for name in names}
    disabled = logging.root.manager.disable
    with contextlib.redirect_stdout(sys.stderr), warnings.catch_warnings():
        if level > logging.INFO:
            warnings.simplefilter("ignore")
            logging.disable(logging.INFO)  # also loggers that set their own INFO level
            for name in names:
                logging.getLogger(name).setLevel(logging.ERROR)
        try:
            yield
        finally:
            logging.disable(disabled)
            for name, old in saved.items():
                logging.getLogger(name).setLevel(old)
