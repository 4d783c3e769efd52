"""``bridge-freeze demo``: the user's flow on the CPU, end to end, with a selection; then proof from the export.

A tiny random Hugging Face checkpoint is written to a work directory, loaded through
``AutoBridge.from_hf_pretrained(dir)`` -> ``to_megatron_provider(load_weights=True)`` with the plugin's selection,
trained by Bridge's real ``finetune()`` (Bridge's optimizer, checkpointing and VLM step; the CPU harness,
:mod:`bridge_freeze_harness`, imported lazily, lets them run without CUDA), saved as a Bridge checkpoint and exported
with ``bridge.save_hf_pretrained``. The exported safetensors are then compared with the input checkpoint's: one
row per part (HF tensors, trainable, changed) and an OK line, or FAIL lines and exit 1. The whole flow is
:func:`bridge_freeze_harness.demo_flow.run_demo_flow`.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from bridge_freeze_plugin.cli._common import (
    EXIT_CHECK_FAILED,
    EXIT_OK,
    MAX_SEED,
    MAX_STEPS,
    add_selection_flags,
    add_subcommand,
    bounded_int,
    finish_subcommand,
    out,
    quiet_third_party,
    selection_from,
)
from bridge_freeze_plugin.cli._training_options import (
    FULL_RECOMPUTE,
    add_lora_options,
    add_pattern_options,
    add_training_options,
    check_lora_options,
    check_rules,
    make_lora,
    part_learning_rates,
    refuse_nothing_to_train,
    with_patterns,
)
from bridge_freeze_plugin.errors import BridgeFreezeError, CommandError
from bridge_freeze_plugin.request import DEFAULT_STEPS, INFO, SELECTABLE_PARTS, FreezeSelection


def _family_name(model: str) -> str:
    """The registry family of the tiny configuration ``model`` (``qwen35_vl_moe`` -> ``qwen35_vl``), read from the
    harness's index (no model code imported); ``model`` itself when the index does not know it."""
    from bridge_freeze_harness.tiny import TINY_FAMILIES

    return str(TINY_FAMILIES[model]) if model in TINY_FAMILIES else model


def _family_parts(model: str) -> tuple[Any, ...] | None:
    """The parts of the family ``model`` is a configuration of (``None``: not a registered family)."""
    from bridge_freeze_plugin.registry import REGISTRY

    family = REGISTRY.get_or_none(_family_name(model))
    return None if family is None else family.part_names()


def projection_only(model: str) -> FreezeSelection:
    """The demo's default: the family's projections train (every projection it has), every other part is frozen."""
    parts = FreezeSelection().parts_of(_family_parts(model))
    return FreezeSelection(**{INFO[p].flag: not INFO[p].projection for p in parts})

#: Bridge's own output (its prints, logs and warnings) goes to this file of the work directory.
BRIDGE_LOG = "bridge.log"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    demo = add_subcommand(
        subparsers, "demo",
        help="the user's flow on the CPU: tiny HF checkpoint -> Bridge finetune() -> HF export, and what changed",
        description=__doc__.split("\n\n", 1)[1].split("\n\n", 1)[0],
        epilog="examples:\n  bridge-freeze demo                       # Qwen3-VL, projection only\n"
               "  bridge-freeze demo qwen25_vl --freeze-vision-model --steps 3\n"
               "  bridge-freeze demo --lora-rank 4 --freeze-language-model --freeze-vision-model "
               "--lora-target-modules linear_qkv linear_proj\n"
               "  bridge-freeze demo --freeze-language-model --lr-vision-projection 0\n"
               "  bridge-freeze demo --freeze-language-model --train 'language_model\\.decoder\\.layers\\.1'\n"
               "  bridge-freeze demo --train-all --recompute full\n"
               "  bridge-freeze demo --workdir /tmp/flow      # keep the checkpoints and the export there",
    )
    demo.add_argument("model", nargs="?", default="qwen3_vl", help="family to run (default qwen3_vl)")
    demo.add_argument("--steps", type=bounded_int(1, MAX_STEPS), default=5,
                      help=f"training iterations of Bridge's finetune(), 1 to {MAX_STEPS:,} (default 5)")
    demo.add_argument("--seed", type=bounded_int(0, MAX_SEED, maximum_text="2**64 - 1"), default=0,
                      help="random seed of the HF checkpoint's weights and the synthetic data (default 0; "
                           "folded to 31 bits for Megatron's RNG)")
    demo.add_argument("--workdir", metavar="DIR", type=Path, default=None,
                      help="where the HF checkpoint, Bridge's checkpoint, the export and Bridge's log go (new or "
                           "empty; kept). Default: a temporary directory, removed at the end unless --keep")
    demo.add_argument("--keep", action="store_true", help="keep the temporary work directory and say where it is")
    add_selection_flags(demo)
    add_pattern_options(demo)
    add_lora_options(demo)
    add_training_options(demo)
    finish_subcommand(demo, run)
    return demo


class _Progress:
    """A one-line progress bar (a plain line per step when the stream is not a terminal)."""

    def __init__(self, total: int, stream: IO[str]) -> None:
        self.total, self.stream = total, stream
        self.tty = stream.isatty()

    def __call__(self, step: int, loss: float) -> None:
        done = step + 1
        width = 24
        filled = width * done // self.total
        bar = "#" * filled + "-" * (width - filled)
        line = f"finetune [{bar}] {done}/{self.total} loss {loss:.4f}"
        self.stream.write(("\r" + line) if self.tty else (line + "\n"))
        if self.tty and done == self.total:
            self.stream.write("\n")
        self.stream.flush()


def _check_request(model: str, selection: FreezeSelection, lora_rank: int = 0) -> None:
    """Refuse, before anything is imported or written, a family the flow cannot run here or a selection that
    trains nothing."""
    from bridge_freeze_harness.demo_scope import demo_families, demo_refusal

    reason = demo_refusal(model)
    if reason is not None:
        raise CommandError(f"the demo cannot run {model!r} here: {reason}; families it runs: "
                           f"{', '.join(demo_families())}")
    refuse_nothing_to_train(selection, lora_rank, _family_parts(model))


def _workdir(args: argparse.Namespace) -> tuple[Path, bool]:
    """The work directory and whether it is a temporary one (removed at the end unless --keep)."""
    if args.workdir is None:
        return Path(tempfile.mkdtemp(prefix="bridge-freeze-demo-")), True
    workdir = args.workdir.expanduser().resolve()
    if workdir.exists() and (not workdir.is_dir() or any(workdir.iterdir())):
        raise CommandError(f"--workdir {args.workdir} exists and is not an empty directory: the demo writes its "
                           "checkpoints there; give a new or empty directory")
    workdir.mkdir(parents=True, exist_ok=True)
    return workdir, False


@contextlib.contextmanager
def _bridge_output_to(log: Path, level: int) -> Iterator[IO[str]]:
    """Everything written to stdout / stderr (Bridge's prints, logs and warnings, at the file-descriptor level,
    the checkpoint writer's process too) goes to ``log``; yields a stream to the real stderr for the progress.
    With --log-level INFO / --debug nothing is redirected: Bridge's output shows on stderr."""
    if level <= logging.INFO:
        with quiet_third_party(level):
            yield sys.stderr
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    progress = os.fdopen(os.dup(saved[1]), "w", buffering=1)
    try:
        with open(log, "w", encoding="utf-8") as sink:
            os.dup2(sink.fileno(), 1)
            os.dup2(sink.fileno(), 2)
            try:
                with quiet_third_party(level):
                    yield progress
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os.dup2(saved[0], 1)
                os.dup2(saved[1], 2)
    finally:
        progress.close()
        os.close(saved[0])
        os.close(saved[1])


def _print_table(tensors: list[Any], parts: tuple[Any, ...] | None) -> None:
    """Per part (the family's, and any a tensor comes from): exported HF tensors, those fed by a trainable Megatron
    parameter, those that changed."""
    listed = {p.value for p in FreezeSelection().parts_of(parts)}
    rows: dict[str, list[int]] = {p.value: [0, 0, 0] for p in SELECTABLE_PARTS}
    for t in tensors:
        row = rows.setdefault("other" if t.part is None else ("no-source" if t.part == "none" else t.part), [0, 0, 0])
        row[0] += 1
        row[1] += t.trainable
        row[2] += t.changed
    out(f"  {'part':<18} {'tensors':>8} {'trainable':>10} {'changed':>8}")
    for part, (total, trainable, changed) in rows.items():
        if total or part in listed:
            out(f"  {part:<18} {total:>8} {trainable:>10} {changed:>8}")


def _verdict(tensors: list[Any]) -> list[str]:
    """The FAIL lines (none when exactly the HF tensors fed by a parameter training at an LR above 0 changed)."""
    unexpected = sorted(t.name for t in tensors if t.changed and not t.expected)
    unchanged = sorted(t.name for t in tensors if t.expected and not t.changed)
    lines = []
    if unexpected:
        lines.append(f"FAIL: {len(unexpected)} HF tensor(s) changed that no parameter training at a learning rate "
                     f"above 0 feeds, e.g. {', '.join(unexpected[:5])}")
    if unchanged:
        lines.append(f"FAIL: {len(unchanged)} HF tensor(s) fed by a trained parameter did not change, "
                     f"e.g. {', '.join(unchanged[:5])}")
    return lines


def _seconds(seconds: dict[str, float], total: float) -> str:
    labels = {"start-up": "start-up (torch, transformers)", "import": "Bridge import", "checkpoint": "HF checkpoint",
              "train": "load + finetune + save", "export": "HF export", "compare": "comparison"}
    return ", ".join(f"{labels.get(k, k)} {v:.1f} s" for k, v in seconds.items()) + f"; total {total:.1f} s"


def _development_stack() -> Any:
    """The demo's flow module, with torch and transformers imported (a ``CommandError`` where they are missing)."""
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401  (before quiet_third_party: it sets its loggers' levels on import)

        from bridge_freeze_harness import demo_flow
    except ImportError as exc:  # the demo needs the development stack (make demo installs it)
        raise CommandError(
            f"the demo needs torch and megatron-bridge ({exc}); run it through 'make demo', which sets them up"
        ) from exc
    return demo_flow


#: The demo writes its run-time audit here, in its work directory (``AuditReport.as_dict()`` and the names in
#: Bridge's optimizer groups, for a reader that checks one against the other).
AUDIT_FILE = "audit.json"


def _provider_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The provider fields the demo sets: full recompute when asked, and an audit as long as the run (at most the
    default), so the run always ends with the audit's block."""
    fields: dict[str, Any] = dict(FULL_RECOMPUTE) if args.recompute == "full" else {}
    fields["audit_steps"] = min(args.steps, DEFAULT_STEPS)
    return fields


def run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    # Every refusal comes before torch, transformers or the harness's flow is imported: it answers at once.
    default = projection_only(args.model)
    selection = with_patterns(selection_from(args, default), args)
    _check_request(args.model, selection, args.lora_rank)
    rates = part_learning_rates(args, selection, _family_parts(args.model), default, args.model)
    check_lora_options(args)
    check_rules(_family_name(args.model), selection, args)
    workdir, temporary = _workdir(args)
    keep = args.keep or not temporary
    level = logging.getLogger().getEffectiveLevel()
    log = workdir / BRIDGE_LOG
    try:
        demo_flow = _development_stack()
        startup = time.perf_counter() - started
        with _bridge_output_to(log, level) as progress:
            result = demo_flow.run_demo_flow(
                args.model, workdir, selection=selection, steps=args.steps, seed=args.seed,
                make_peft=lambda: make_lora(args), part_lrs=rates,
                provider_fields=_provider_fields(args),
                on_step=_Progress(args.steps, progress))
    except BaseException as exc:
        if level > logging.INFO and not isinstance(exc, BridgeFreezeError):  # Bridge's output is in the log
            sys.stderr.write(f"bridge-freeze demo: Bridge's output is in {log} (work directory kept)\n")
        elif not keep:  # a refusal (one line, exit 2) or the output went to stderr: nothing to keep
            shutil.rmtree(workdir, ignore_errors=True)
        raise
    try:
        result.seconds = {"start-up": startup, **result.seconds}
        return _show(args, result, selection, rates, time.perf_counter() - started, keep)
    finally:
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)


def _show_audit(result: Any) -> list[str]:
    """The run-time audit's block (and its file in the work directory); its warnings, which fail the demo."""
    import json

    if result.audit is None:
        out("the run-time audit did not run (BRIDGE_FREEZE_AUDIT_STEPS=0?)")
        out()
        return []
    out(result.audit.format())
    out()
    (result.workdir / AUDIT_FILE).write_text(json.dumps(
        {"audit": result.audit.as_dict(), "optimizer_names": result.optimizer_names}, indent=1), encoding="utf-8")
    return [f"FAIL: {line}" for line in result.audit.warnings()]


def _show(args: argparse.Namespace, result: Any, selection: FreezeSelection, rates: dict[str, float],
          total: float, keep: bool) -> int:
    from bridge_freeze_harness.demo_flow import GLOBAL_LR
    from bridge_freeze_harness.hf_checkpoint import hf_family

    if result.report is not None:
        out(result.report.format())
    if rates:
        frozen = set(selection.untrained_parts())
        listed = result.report.part_names if result.report is not None else selection.parts_of()
        parts = [f"{p.value} frozen" if p in frozen else f"{p.value} {rates.get(p.value, GLOBAL_LR):g}"
                 for p in listed]
        adapters = f", adapters {GLOBAL_LR:g}" if args.lora_rank else ""
        out(f"learning rates: {', '.join(parts)}{adapters} (global {GLOBAL_LR:g})")
    out()
    where = (lambda p: str(p)) if keep else (lambda p: str(p.relative_to(result.workdir)))
    n = len(result.tensors)
    out(f"1. tiny random HF checkpoint ({hf_family(args.model).model_class}, {n} tensors): {where(result.hf_dir)}")
    out("2. AutoBridge.from_hf_pretrained -> to_megatron_provider(load_weights=True) -> the selection")
    losses = " -> ".join(f"{loss:.4f}" for loss in (result.losses[:1] + result.losses[1:][-1:]))
    out(f"3. Bridge's finetune(), {args.steps} iteration(s), loss {losses}; Bridge checkpoint: "
        f"{where(result.checkpoint_dir)}")
    out(f"4. bridge.save_hf_pretrained(model): {where(result.export_dir)}")
    out()
    audit_warnings = _show_audit(result)
    out("exported HF tensors against the input checkpoint, by part (trainable: fed by a trainable parameter)")
    _print_table(result.tensors, _family_parts(args.model))
    out()
    out(f"time: {_seconds(result.seconds, total)}")
    if keep:
        out(f"kept: {result.workdir} (Bridge's output: {result.workdir / BRIDGE_LOG})")
    failures = _verdict(result.tensors) + audit_warnings
    for line in failures:
        out(line)
    if failures:
        return EXIT_CHECK_FAILED
    changed = sum(t.changed for t in result.tensors)
    held = sum(t.trainable and not t.expected for t in result.tensors)
    at_zero = f"; {held} trainable at learning rate 0 stayed bit-identical" if held else ""
    lora = f" + LoRA rank {args.lora_rank}, merged" if args.lora_rank else ""
    asked = selection.describe(_family_parts(args.model))
    out(f"OK: exactly the {changed} HF tensors fed by a parameter training at a learning rate above 0 changed, the "
        f"other {n - changed} are bit-identical to the input checkpoint ({asked}{lora}{at_zero})")
    return EXIT_OK
