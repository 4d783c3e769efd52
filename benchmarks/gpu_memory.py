"""GPU figure: what each selection holds and costs on one CUDA device, measured, with ``plan``'s figures beside it.

``python -m benchmarks.gpu_memory [--repeats N] [--steps N] [--budget-s S] [--out PATH]`` (``make bench`` runs it
as figure ``gpu``; without CUDA it records the plan's figures and says the measurement was skipped).

One Qwen3-VL-shaped configuration, ``tests/fixtures/gpu_bench/config.json`` (0.93 B parameters), read both by
``bridge-freeze plan`` (here, in this process: the per-rank figures of TP = PP = 1, DP 1, distributed optimizer,
bf16 weights, fp32 gradients and Adam state, the batch's micro-batch size, sequence and vision patches) and by
every measured arm (:mod:`benchmarks._gpu_arm`, one process each: selections x arms, interleaved, the whole
round repeated; per arm the median over repeats and the spread [min, max]).

Compared to the byte, per arm: weights, gradient buffers (DDP pads each bucket: both the padded buffer and the
trainable elements x 4 B are given), optimizer state (Adam's moments + the fp32 main copy of bf16 weights, which
plan counts as 12 B per trainable parameter). Activations: ``plan`` estimates the layers' saved tensors; without
TransformerEngine or flash attention, megatron-core's local attention keeps the S x S scores and their softmax per
layer, which the estimate does not cover: ``attention_scores_bytes`` sizes them for the batch (vision layers:
the harness's CUDA forward packs all images of the batch into one masked sequence, so T x T over all patches).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks._gpu_arm import BATCH_SIZE, FAMILY, LORA, SELECTIONS

ROOT = Path(__file__).resolve().parents[1]
CONFIG_DIR = ROOT / "tests" / "fixtures" / "gpu_bench"
OUT = Path(__file__).resolve().parent / "results" / "gpu_memory.json"
ARM_TIMEOUT_S = 240


def batch_geometry() -> dict[str, int]:
    """Sequence length and vision patches per sample of the arms' synthetic batch (built here, on the CPU)."""
    from bridge_freeze_harness.cpu_runtime import import_bridge
    from bridge_freeze_harness.train import synthetic_batch

    import_bridge()  # the TE stub first, where TE does not import
    from bridge_freeze_plugin.planning import hf_config_provider

    provider, _ = hf_config_provider(CONFIG_DIR)
    batch = synthetic_batch(FAMILY, provider, batch_size=BATCH_SIZE)
    return {"seq_length": int(batch["input_ids"].shape[1]), "micro_batch_size": BATCH_SIZE,
            "vision_tokens": int(batch["pixel_values"].shape[0]) // BATCH_SIZE}


def plan_args(selection: str, geometry: dict[str, int]) -> list[str]:
    flags, lora, _ = SELECTIONS[selection]
    args = ["plan", "--hf-config", str(CONFIG_DIR), *(f"--{f.replace('_', '-')}" for f in flags),
            "--param-dtype", "bf16", "--grad-dtype", "fp32", "--use-distributed-optimizer",
            "--seq-length", str(geometry["seq_length"]), "--micro-batch-size", str(geometry["micro_batch_size"]),
            "--vision-tokens", str(geometry["vision_tokens"]), "--json"]
    if lora:
        args += ["--lora-rank", str(LORA["dim"]), "--lora-target-modules", *LORA["target_modules"]]
    return args


def plan_figures(selection: str, geometry: dict[str, int]) -> dict[str, Any]:
    """``bridge-freeze plan --json`` for the selection, in this process (Bridge imported once); rank 0's figures."""
    from bridge_freeze_plugin.cli import main as cli

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli(plan_args(selection, geometry))
    if code:
        raise RuntimeError(f"plan for {selection!r} exited {code}")
    rank = json.loads(out.getvalue())["per_rank"][0]
    return {k: rank[k] for k in ("parameters", "trainable", "weight_bytes", "grad_bytes", "optimizer_bytes",
                                 "activation_bytes", "total_bytes")}


def attention_scores_bytes(geometry: dict[str, int]) -> dict[str, int]:
    """Scores + softmax (bf16) that megatron-core's local attention keeps per layer, summed over layers."""
    cfg = json.loads((CONFIG_DIR / "config.json").read_text())
    text, vision = cfg["text_config"], cfg["vision_config"]
    s, b, patches = geometry["seq_length"], geometry["micro_batch_size"], geometry["vision_tokens"]
    lm = text["num_hidden_layers"] * b * text["num_attention_heads"] * s * s * 2 * 2
    packed = b * patches
    vis = vision["depth"] * vision["num_heads"] * packed * packed * 2 * 2
    return {"language_model": lm, "vision_model": vis}


def _arm(selection: str, arm: str, steps: int, workdir: Path, timeout_s: float = ARM_TIMEOUT_S) -> dict[str, Any]:
    out = workdir / f"{selection.replace(' ', '_')}.{arm}.{time.monotonic_ns()}.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    if arm != "plugin":
        env["BRIDGE_FREEZE_DISABLE_AUTOLOAD"] = "1"
    started = time.perf_counter()
    command = [sys.executable, *(["-S"] if sys.flags.no_site else []), "-m", "benchmarks._gpu_arm",
               str(CONFIG_DIR), selection, arm, str(steps), str(out)]
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return {"selection": selection, "arm": arm, "error": f"no result within {timeout_s:.0f} s (killed)"}
    if done.returncode != 0:
        return {"selection": selection, "arm": arm, "error": (done.stdout + done.stderr)[-2000:]}
    result = json.loads(out.read_text())
    result["process_seconds"] = round(time.perf_counter() - started, 1)
    return result


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def compare(measured: dict[str, Any], plan: dict[str, Any]) -> dict[str, Any]:
    """Measured bytes minus plan's, each difference with what explains it (0 needs no explanation)."""
    optimizer = measured["optimizer_state_bytes"] + measured["main_param_bytes"]
    diffs = {
        "weights": measured["weight_bytes"] - plan["weight_bytes"],
        "grad_unpadded": measured["grad_bytes_unpadded"] - plan["grad_bytes"],
        "grad_buffer_padding": measured["grad_buffer_bytes"] - measured["grad_bytes_unpadded"],
        "optimizer": optimizer - plan["optimizer_bytes"],
        "trainable": measured["trainable_elements"] - plan["trainable"],
    }
    notes = []
    if diffs["grad_buffer_padding"]:
        notes.append("grad_buffer_padding: DDP pads each bucket of its buffer (plan counts trainable elements)")
    if measured.get("optimizer_step_bytes"):
        notes.append(f"Adam's per-parameter step counters ({measured['optimizer_step_bytes']} B) are in neither")
    if measured["arm"] != "plugin" and any(diffs[k] for k in ("weights", "grad_unpadded", "optimizer")):
        notes.append("plan models the plugin's selection; this arm does not use the plugin")
    return {"diff_bytes": diffs, "notes": notes}


def summarize(results: list[dict[str, Any]], plans: dict[str, Any]) -> list[dict[str, Any]]:
    """Per (selection, arm): exact bytes (identical in every repeat), medians and spreads, plan beside them."""
    rows = []
    for selection, (_, _, arms) in SELECTIONS.items():
        for arm in arms:
            runs = [r for r in results if r["selection"] == selection and r["arm"] == arm and "error" not in r]
            errors = [r["error"] for r in results if r["selection"] == selection and r["arm"] == arm and "error" in r]
            row: dict[str, Any] = {"selection": selection, "arm": arm, "repeats": len(runs), "errors": errors,
                                   "plan": plans.get(selection)}
            if runs:
                first = runs[0]
                exact = ("trainable_elements", "weight_bytes", "grad_buffer_bytes", "grad_bytes_unpadded",
                         "optimizer_state_bytes", "optimizer_step_bytes", "main_param_bytes", "in_buffers",
                         "trainable")
                row.update({k: first[k] for k in exact})
                row["exact_bytes_same_in_every_repeat"] = all(all(r[k] == first[k] for k in exact) for r in runs)
                row["buffers_hold_exactly_the_trainable"] = all(r["in_buffers"] == r["trainable"] for r in runs)
                row["trainable_on_cuda"] = all(r["trainable_on_cuda"] for r in runs)
                row["losses_fell"] = all(r["losses_fell"] for r in runs)
                row["specs"] = first["specs"]
                row["step_s"] = _spread([r["step_median_s"] for r in runs])
                row["memory_after_step1"] = _spread([r["memory_after_step1"] for r in runs])
                row["peak_memory"] = _spread([r["peak_memory"] for r in runs])
                if row["plan"]:
                    row["against_plan"] = compare(first, row["plan"])
                    row["peak_minus_state"] = row["peak_memory"]["median"] - first["weight_bytes"] - (
                        first["grad_buffer_bytes"] + first["optimizer_state_bytes"] + first["main_param_bytes"])
            rows.append(row)
    return rows


def run(quick: bool = False, *, repeats: int | None = None, steps: int | None = None,
        budget_s: float | None = None) -> dict[str, Any]:
    """The figure: plan's per-rank figures always; the measured arms where CUDA is available."""
    import torch

    started = time.perf_counter()
    repeats = repeats or (1 if quick else 3)
    steps = steps or (4 if quick else 8)
    geometry = batch_geometry()
    plans = {selection: plan_figures(selection, geometry) for selection in SELECTIONS}
    figure: dict[str, Any] = {"config": str(CONFIG_DIR.relative_to(ROOT) / "config.json"), "geometry": geometry,
                              "attention_scores_bytes": attention_scores_bytes(geometry), "plan": plans,
                              "repeats": repeats, "steps": steps}
    if not torch.cuda.is_available():
        figure["skipped"] = "no CUDA device on this machine: plan's figures only, nothing measured"
        return figure
    figure["device"] = torch.cuda.get_device_name(0)
    results: list[dict[str, Any]] = []
    # Every selection's plugin arm first: a time budget that ends a round early still covers each selection.
    pairs = [(s, a) for s, (_, _, arms) in SELECTIONS.items() for a in arms]
    order = [p for p in pairs if p[1] == "plugin"] + [p for p in pairs if p[1] != "plugin"]
    workdir = Path(os.environ.get("TMPDIR", "/tmp")) / f"gpu_memory.{os.getpid()}"
    workdir.mkdir(parents=True, exist_ok=True)
    for round_ in range(repeats):
        for selection, arm in order if round_ % 2 == 0 else list(reversed(order)):  # interleaved, both orders
            spent = time.perf_counter() - started
            if budget_s is not None and results and spent + max(r.get("process_seconds", 0) for r in results) \
                    > budget_s:
                figure["stopped_early"] = f"time budget {budget_s:.0f}s: round {round_ + 1} incomplete"
                break
            print(f"[gpu] round {round_ + 1}/{repeats}: {selection} / {arm}", file=sys.stderr, flush=True)
            left = ARM_TIMEOUT_S if budget_s is None else max(30.0, budget_s - spent)
            results.append(_arm(selection, arm, steps, workdir, timeout_s=min(ARM_TIMEOUT_S, left)))
        if "stopped_early" in figure:
            break
    figure["arms"] = summarize(results, plans)
    figure["seconds"] = round(time.perf_counter() - started, 1)
    return figure


def _gib(value: float) -> str:
    return f"{value / 2**30:.2f} GiB"


def table(figure: dict[str, Any]) -> list[tuple[str, str, str]]:
    if "skipped" in figure:
        return [("gpu: measured", f"skipped ({figure['skipped']})", "")]
    rows = []
    for row in figure["arms"]:
        name = f"gpu {row['selection']} / {row['arm']}"
        if not row["repeats"]:
            rows.append((name, "not measured" + (f": {row['errors'][0][-200:]}" if row["errors"] else ""), ""))
            continue
        diff = row.get("against_plan", {}).get("diff_bytes", {})
        rows.append((name, f"{row['trainable_elements']:,} trainable, buffers=trainable "
                     f"{row['buffers_hold_exactly_the_trainable']}, after step 1 "
                     f"{_gib(row['memory_after_step1']['median'])}, peak {_gib(row['peak_memory']['median'])}, step "
                     f"{row['step_s']['median']:.3f} s [{row['step_s']['min']:.3f}, {row['step_s']['max']:.3f}], "
                     f"vs plan: grad {diff.get('grad_unpadded')} B, optimizer {diff.get('optimizer')} B",
                     "plan's bytes exactly"))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_memory", description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="interleaved rounds of every arm (default 3)")
    parser.add_argument("--steps", type=int, default=8, help="training steps per arm (default 8)")
    parser.add_argument("--budget-s", type=float, default=None, help="start no arm that would end past this")
    parser.add_argument("--out", type=Path, default=OUT, help=f"JSON output (default {OUT})")
    args = parser.parse_args(argv)
    figure = run(repeats=args.repeats, steps=args.steps, budget_s=args.budget_s)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figure, indent=1) + "\n")
    for name, value, _ in table(figure):
        print(f"{name}: {value}")
    print(f"written: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
