"""The ``bridge-freeze`` command.

Sub-commands:

- ``families [--json]``: the registered families, their provider classes and part prefixes;
- ``demo [MODEL] [--freeze-...] [--steps N]``: build a tiny real Bridge model on the CPU, apply a
  selection (default: projection only), train N AdamW steps on synthetic data, and show which
  parameters changed, by part. Exits 1 if a frozen tensor changed or a trainable one did not.
- ``plan MODEL [--freeze-...] (--tiny | --hf-config PATH) [--json]``: build the real Bridge model on
  the meta device and show, per part, trainable / total parameters and the gradient-buffer and
  optimizer-state bytes a training run holds and freezing saves (:mod:`bridge_freeze_plugin.plan`).
- ``check-config FILE [--rl] [key=value ...]``: validate a training config
  (:mod:`bridge_freeze_plugin.validation`) and print the effective selection; exit 2 when invalid.

Errors are one readable line and a non-zero exit (a traceback only with ``--debug``); usage errors
(a bad option or value, caught by argparse) too: ``bridge-freeze plan: error: ... (see bridge-freeze
plan --help)``, exit 2, no usage block. The ``--json`` documents are described in ``docs/cli.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

from bridge_freeze_plugin.errors import BridgeFreezeError, InvalidFreezeConfigError, UnsupportedFreezeFlagError
from bridge_freeze_plugin.registry import REGISTRY, list_families
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
        import transformers  # noqa: F401  (before _quiet_third_party: it sets its loggers' levels on import)

        from bridge_freeze_harness import train
        from bridge_freeze_harness.tiny import build_tiny_chunks
        from bridge_freeze_plugin.mixins import make_freezable
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
    with _quiet_third_party(logging.getLogger().getEffectiveLevel()):
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
# plan
# ---------------------------------------------------------------------------------------------


def _human_bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _flags_line(selection: FreezeSelection) -> str:
    return " ".join(f"{k}={'true' if v else 'false'}" for k, v in selection.as_dict().items())


@contextlib.contextmanager
def _quiet_third_party(level: int) -> Iterator[None]:
    """Keep Megatron / transformers chatter (warnings, INFO lines, prints) off the command's output.

    Anything printed while building goes to stderr (stdout stays the command's result, e.g. JSON);
    third-party warnings and log records below ERROR show only with --log-level INFO / --debug.
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


def _installed(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def cmd_plan(args: argparse.Namespace) -> int:
    try:
        from bridge_freeze_plugin import plan as planning
    except ImportError as exc:  # pragma: no cover - plan.py itself imports nothing heavy
        raise CommandError(str(exc)) from exc
    assumptions = planning.MemoryAssumptions(
        param_dtype=args.param_dtype,
        grad_dtype=args.grad_dtype,
        optimizer=args.optimizer,
        state_dtype=args.state_dtype,
        dp_size=args.dp_size,
    )
    selection = FreezeSelection(
        freeze_language_model=args.freeze_language_model,
        freeze_vision_model=args.freeze_vision_model,
        freeze_vision_projection=args.freeze_vision_projection,
    )
    hf_config = args.hf_config
    if not args.tiny and hf_config is None:
        if args.model is not None and os.path.exists(args.model):
            raise CommandError(
                f"MODEL is a family or provider class name; to plan from {args.model}, "
                f"write: bridge-freeze plan FAMILY --hf-config {args.model}"
            )
        raise CommandError("say which configuration to build: --tiny (the project's tiny test config) "
                           "or --hf-config PATH (a local config.json or model folder)")
    if args.model is None and not hf_config:
        raise CommandError("give MODEL (a family or provider class name); only --hf-config can go without it")
    if args.model is not None:
        planning.resolve_model(args.model)  # cheap checks first: no torch import for a typo
    if hf_config is not None:
        planning.config_file(hf_config)
    missing = [name for name in ("torch", "megatron.bridge", "transformers") if not _installed(name)]
    if missing:
        raise CommandError(f"plan needs {', '.join(missing)} installed (it builds the real Bridge model)")
    import torch  # noqa: F401  (first: torch and transformers set their loggers' levels on import,
    import transformers  # noqa: F401  so _quiet_third_party must come after them)

    with _quiet_third_party(logging.getLogger().getEffectiveLevel()):
        result = planning.plan_model(args.model, selection, assumptions, tiny=args.tiny, hf_config=hf_config)
    if args.json:
        _out(result.to_json())
        return EXIT_OK
    where = "tiny test config" if result.source == "tiny" else result.config_path
    _out(f"{result.provider}, family {result.family} ({where}): built on the meta device in "
         f"{result.build_seconds:.1f} s, {result.total.total_tensors:,} tensors")
    _out(f"selection: {_flags_line(result.selection)} ({result.selection.describe()})")
    _out(f"assumes: {result.assumptions.describe()}")
    _out()
    header = (f"  {'part':<18} {'trainable':>15} {'total':>15} {'weights':>11} {'grad buffer':>11} "
              f"{'optimizer':>11} {'saved':>11}")
    _out(header)
    for row in (*result.parts, result.total):
        name = row.part.value if row.part is not None else "total"
        _out(f"  {name:<18} {row.trainable:>15,} {row.total:>15,} {_human_bytes(row.weight_bytes):>11} "
             f"{_human_bytes(row.grad_bytes):>11} {_human_bytes(row.optimizer_bytes):>11} "
             f"{_human_bytes(row.saved_bytes):>11}")
    total = result.total
    full = total.saved_bytes + total.grad_bytes + total.optimizer_bytes
    pct = 100.0 * total.saved_bytes / full if full else 0.0
    _out()
    _out(f"saved by freezing: {_human_bytes(total.saved_bytes)} of the {_human_bytes(full)} of gradient buffer + "
         f"optimizer state a full fine-tune would hold ({pct:.1f}%)")
    _out("figures are for the whole model (tensor/pipeline/expert parallel size 1): each model-parallel "
         "rank holds its share; --json lists every parameter")
    return EXIT_OK


# ---------------------------------------------------------------------------------------------
# check-config
# ---------------------------------------------------------------------------------------------


def cmd_check_config(args: argparse.Namespace) -> int:
    try:
        import yaml
        from omegaconf import OmegaConf
        from omegaconf.errors import OmegaConfBaseException

        from bridge_freeze_plugin import validation
    except ImportError as exc:
        raise CommandError(f"check-config needs omegaconf ({exc})") from exc

    path = Path(args.file)
    if not path.is_file():
        raise CommandError(f"no such config file: {args.file}")
    for item in args.overrides:
        key, sep, _ = item.partition("=")
        if not sep or not key.strip():
            raise CommandError(f"override {item!r} is not of the form dotted.key=value")
    try:
        cfg = validation.load_config(path, args.overrides)
    except (OSError, ValueError, yaml.YAMLError, OmegaConfBaseException) as exc:
        raise CommandError(f"cannot load {args.file}: {_one_line(str(exc))}") from exc

    layout = "rl" if args.rl else "sft"
    family = None
    if args.family:
        family = REGISTRY.find(args.family)
    else:
        model_path = OmegaConf.select(cfg, "trainer.policy.model.path" if args.rl else "model.path", default=None)
        if isinstance(model_path, str):
            family = validation.family_from_model_path(model_path)
    doc: dict[str, Any] = {
        "schema_version": 1,
        "config": str(args.file),
        "layout": layout,
        "overrides": list(args.overrides),
        "family": family.name if family else None,
    }
    try:
        selection = validation.validate_config(cfg, args.rl, family=family)
    except (InvalidFreezeConfigError, UnsupportedFreezeFlagError) as exc:
        if args.json:
            _out(json.dumps({**doc, "valid": False, "error": _one_line(str(exc)), "selection": None,
                             "trained_parts": None, "frozen_parts": None}, indent=2, sort_keys=True))
        raise
    trained = [p.value for p in SELECTABLE_PARTS if p in selection.trained_parts()]
    frozen = [p.value for p in SELECTABLE_PARTS if p in selection.frozen_parts()]
    if args.json:
        _out(json.dumps({**doc, "valid": True, "error": None, "selection": selection.as_dict(),
                         "trained_parts": trained, "frozen_parts": frozen}, indent=2, sort_keys=True))
        return EXIT_OK
    where = "trainer.policy.megatron_config" if args.rl else "megatron_config"
    extra = f" + {len(args.overrides)} override(s)" if args.overrides else ""
    _out(f"config: {args.file} ({layout.upper()} layout{extra})")
    _out(f"family: {family.name if family else 'unknown (pass --family NAME, or a local model path, to check rule 7)'}")
    _out(f"selection ({where}): {_flags_line(selection)}")
    _out(f"trains: {', '.join(trained) or 'nothing but LoRA adapters'}; frozen: {', '.join(frozen) or 'nothing'}")
    _out("OK: valid")
    return EXIT_OK


# ---------------------------------------------------------------------------------------------
# parser
# ---------------------------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are one line on stderr, exit 2 (no usage block).

    ``add_subparsers`` makes the sub-parsers of the same class, so every sub-command reports the same
    way, under its own name: ``bridge-freeze plan: error: ... (see bridge-freeze plan --help)``.
    """

    def error(self, message: str) -> NoReturn:
        text = " ".join(line.strip() for line in message.splitlines() if line.strip())
        self.exit(EXIT_USAGE, f"{self.prog}: error: {text} (see {self.prog} --help)\n")


def _bounded_int(minimum: int, maximum: int | None = None, *, maximum_text: str = "") -> Callable[[str], int]:
    """An argparse ``type``: an integer in [minimum, maximum], else a usage error at parse time."""
    if maximum is None:
        what = f"an integer >= {minimum}"
    else:
        what = f"an integer from {minimum} to {maximum_text or maximum}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None
        if value < minimum or (maximum is not None and value > maximum):
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
        return value

    return parse


#: torch.manual_seed takes up to 2**64 - 1; negative seeds are refused rather than wrapped.
_MAX_SEED = 2**64 - 1


def _add_selection_flags(parser: argparse.ArgumentParser, *, demo: bool = True) -> None:
    title = "selection (default for demo: projection only)" if demo else "selection (default: train everything)"
    group = parser.add_argument_group(title)
    group.add_argument("--freeze-language-model", action="store_true", help="freeze the language model")
    group.add_argument("--freeze-vision-model", action="store_true", help="freeze the vision encoder")
    group.add_argument("--freeze-vision-projection", action="store_true", help="freeze the vision projection")
    if demo:
        group.add_argument("--train-all", action="store_true", help="set no flag: train the whole model")


def _logging_flags(parser: argparse.ArgumentParser, *, sub: bool) -> None:
    """--debug / --log-level, accepted before or after the sub-command."""
    default: Any = argparse.SUPPRESS if sub else None
    parser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS if sub else False,
                        help="show tracebacks and DEBUG logs")
    parser.add_argument("--log-level", default=default if sub else "WARNING",
                        choices=["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"], type=str.upper,
                        help="logging level (default WARNING; INFO also shows Megatron's own messages)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="bridge-freeze",
        description="Choose which parts of a Megatron-Bridge VLM train (language model, vision encoder, projection).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  bridge-freeze families\n  bridge-freeze demo qwen3_vl --freeze-vision-model --steps 5",
    )
    _logging_flags(parser, sub=False)
    sub = parser.add_subparsers(dest="command", required=True)

    fam = sub.add_parser(
        "families", help="list the registered VLM families",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  bridge-freeze families\n  bridge-freeze families --json | jq '.families[].name'",
    )
    fam.add_argument("--json", action="store_true", help="machine-readable output")
    _logging_flags(fam, sub=True)
    fam.set_defaults(func=cmd_families, parser=fam)

    demo = sub.add_parser(
        "demo", help="train a tiny real Bridge VLM on the CPU with a selection, and check what changed",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  bridge-freeze demo                       # Qwen3-VL, projection only\n"
               "  bridge-freeze demo qwen25_vl --freeze-vision-model --steps 3",
    )
    demo.add_argument("model", nargs="?", default="qwen3_vl", help="family to build (default qwen3_vl)")
    demo.add_argument("--steps", type=_bounded_int(1), default=5, help="AdamW steps, at least 1 (default 5)")
    demo.add_argument("--seed", type=_bounded_int(0, _MAX_SEED, maximum_text="2**64 - 1"), default=0,
                      help="random seed for the weights and the synthetic batch (default 0)")
    _add_selection_flags(demo)
    _logging_flags(demo, sub=True)
    demo.set_defaults(func=cmd_demo, parser=demo)

    plan = sub.add_parser(
        "plan", help="build the real Bridge model on the meta device: parameters and memory per part",
        description="Build the real Megatron-Bridge model on the meta device (no weights, no memory, no GPU), "
                    "apply a selection, and show per part the trainable and total parameters, the weights, the "
                    "gradient buffer and the optimizer state a training run holds, and what freezing saves.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n"
               "  bridge-freeze plan qwen3_vl --tiny --freeze-vision-model\n"
               "  bridge-freeze plan qwen3_vl_moe --hf-config /ckpt/Qwen3-VL-30B-A3B-Instruct "
               "--freeze-language-model\n"
               "  bridge-freeze plan Qwen3VLMoEModelProvider --hf-config config.json --dp-size 8 --json "
               "| jq '.total'\n"
               "  bridge-freeze plan glm45v --tiny --param-dtype fp32 --optimizer sgd\n\n"
               "MODEL is a family name (bridge-freeze families) or a provider class name. Figures are for the\n"
               "whole model (tensor/pipeline/expert parallel size 1). The --json document is described in\n"
               "docs/cli.md.",
    )
    plan.add_argument("model", metavar="MODEL", nargs="?",
                      help="family name or provider class name (optional with --hf-config: the config tells)")
    source = plan.add_mutually_exclusive_group()
    source.add_argument("--tiny", action="store_true", help="use the project's tiny test configuration")
    source.add_argument("--hf-config", metavar="PATH",
                        help="a local HF config.json, or a model folder holding one (no hub access)")
    _add_selection_flags(plan, demo=False)
    est = plan.add_argument_group("memory estimate assumptions")
    dtypes = ["fp32", "bf16", "fp16"]
    est.add_argument("--param-dtype", choices=dtypes, default="bf16", help="weights (default bf16)")
    est.add_argument("--grad-dtype", choices=dtypes, default="fp32",
                     help="DDP gradient buffer (default fp32, as with grad_reduce_in_fp32)")
    est.add_argument("--optimizer", choices=["adam", "sgd"], default="adam",
                     help="adam: exp_avg + exp_avg_sq; sgd: a momentum buffer (default adam)")
    est.add_argument("--state-dtype", choices=dtypes, default="fp32",
                     help="optimizer state tensors (default fp32); an fp32 master copy is added "
                          "unless --param-dtype fp32")
    est.add_argument("--dp-size", type=_bounded_int(1), default=1,
                     help="data-parallel ranks the distributed optimizer shards optimizer state over, "
                          "at least 1 (default 1)")
    plan.add_argument("--json", action="store_true",
                      help="machine-readable output, including every parameter (schema: docs/cli.md)")
    _logging_flags(plan, sub=True)
    plan.set_defaults(func=cmd_plan, parser=plan)

    check = sub.add_parser(
        "check-config", help="validate a training config's freeze flags and print the effective selection",
        description="Validate a training config (YAML + dotted overrides) with bridge_freeze_plugin.validation. "
                    "Exit 0 and the effective selection when valid; exit 2 and the error when not.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n"
               "  bridge-freeze check-config sft.yaml\n"
               "  bridge-freeze check-config sft.yaml megatron_config.freeze_vision_model=true\n"
               "  bridge-freeze check-config rl.yaml --rl trainer.policy.megatron_config.freeze_language_model=true\n"
               "  bridge-freeze check-config sft.yaml --family qwen3_vl --json\n\n"
               "The config layouts and rules are in docs/configuration.md.",
    )
    check.add_argument("file", metavar="FILE", help="the training config (YAML)")
    # default=[]: without a default, argparse (< 3.13) lists a nargs="*" positional as required in errors.
    check.add_argument("overrides", metavar="KEY=VALUE", nargs="*", default=[],
                       help="dotted overrides merged over FILE")
    check.add_argument("--rl", action="store_true", help="RL layout (trainer.strategy, trainer.policy.*)")
    check.add_argument("--family", help="the model family (name or provider class), if model.path does not tell")
    check.add_argument("--json", action="store_true", help="machine-readable output (schema: docs/cli.md)")
    _logging_flags(check, sub=True)
    check.set_defaults(func=cmd_check_config, parser=check)
    return parser


def _one_line(message: str) -> str:
    """A (possibly multi-line) message as one line: '2 problems ...: a; b'."""
    lines = [line.strip() for line in str(message).splitlines() if line.strip()]
    if len(lines) <= 1:
        return lines[0] if lines else ""
    rest = [line[2:] if line.startswith("- ") else line for line in lines[1:]]
    return f"{lines[0]} {'; '.join(rest)}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        # check-config's KEY=VALUE overrides may come after its options (FILE --rl a.b=c).
        if args.command == "check-config" and not any(e.startswith("-") for e in extra):
            args.overrides = [*args.overrides, *extra]
        else:  # reported by the sub-command's parser, under its name
            args.parser.error(f"unrecognized arguments: {' '.join(extra)}")
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
    except (CommandError, BridgeFreezeError) as exc:
        if args.debug:
            raise
        sys.stderr.write(f"bridge-freeze {args.command}: error: {_one_line(str(exc))}\n")
        return EXIT_USAGE
    except Exception as exc:  # anything else: still one line (the traceback with --debug)
        if args.debug:
            raise
        sys.stderr.write(f"bridge-freeze {args.command}: unexpected error: {type(exc).__name__}: "
                         f"{_one_line(str(exc))} (run with --debug for the traceback)\n")
        return EXIT_CHECK_FAILED


def _run() -> Any:  # pragma: no cover - console-script shim
    sys.exit(main())


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
