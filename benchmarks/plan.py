"""Figure 5: ``bridge-freeze plan`` time and peak memory on full-size published configurations.

``plan`` works from a Hugging Face ``config.json`` alone (no weights). Measured in subprocesses (wall time,
CPU time user + system, and peak RSS from ``wait4``), with the machine's load average before and after each
run (the machines are shared; the load says how far from idle a figure is):

- ``plan_30b``: Qwen3-VL-30B-A3B's config (tests/fixtures/hf_configs/qwen3_vl_moe), the whole model;
- ``plan_235b``: Qwen3-VL-235B-A22B's sizes (tests/fixtures/hf_configs/qwen3_vl_moe_235b), the whole model;
- ``plan_235b_layout``: the same with per-rank figures for TP 4, PP 8 (10 / 12 layers on the first / last
  stage), EP 8, DP 8, distributed optimizer, full recompute (the docs' example);
- ``families``: the same CLI's cheapest sub-command, the baseline of ``time_ratio`` / ``peak_rss_ratio``.

Each arm repeated (``--quick``: once, and a tiny configuration's plan instead of the full-size ones);
medians. ``python -m benchmarks.plan`` runs the full set and
writes ``benchmarks/results/plan.json``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._timing import median

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "hf_configs"
PLAN_ARGS = ("--freeze-vision-model",)
LAYOUT_ARGS = ("--tp", "4", "--pp", "8", "--decoder-first-pipeline-num-layers", "10",
               "--decoder-last-pipeline-num-layers", "12", "--ep", "8", "--dp", "8", "--use-distributed-optimizer",
               "--recompute-granularity", "full", "--gpu-memory", "141GB")
OUT = Path(__file__).resolve().parent / "results" / "plan.json"


def _cli() -> list[str]:
    script = Path(sys.executable).with_name("bridge-freeze")
    return [str(script)] if script.exists() else [sys.executable, "-m", "bridge_freeze_plugin.cli"]


def _load() -> float:
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except OSError:
        return float("nan")


def _measure(args: list[str]) -> dict[str, Any]:
    """Wall and CPU seconds, peak RSS, return code, output tail and load averages of one subprocess."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    load_before = _load()
    start = time.perf_counter()
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        out.seek(0)
        tail = out.read().decode(errors="replace")[-3000:]
    return {
        "seconds": wall,
        "cpu_seconds": usage.ru_utime + usage.ru_stime,
        "peak_rss_mib": usage.ru_maxrss / 1024,  # ru_maxrss: KiB on Linux
        "code": os.waitstatus_to_exitcode(status),
        "tail": tail,
        "load_before": load_before,
        "load_after": _load(),
    }


def available() -> tuple[bool, str]:
    result = _measure([*_cli(), "plan", "--help"])
    if result["code"] != 0:
        return False, f"no `plan` sub-command in this bridge-freeze CLI (exit {result['code']})"
    if "--hf-config" not in result["tail"] and "--hf-config" not in result["tail"].replace("\n", " "):
        return False, "`bridge-freeze plan` has no --hf-config option"
    return True, ""


def _arms(quick: bool) -> dict[str, list[str]]:
    plan = [*_cli(), "plan", "--hf-config"]
    arms = {
        "families": [*_cli(), "families"],
        "plan_30b": [*plan, str(FIXTURES / "qwen3_vl_moe"), *PLAN_ARGS],
        "plan_235b": [*plan, str(FIXTURES / "qwen3_vl_moe_235b"), *PLAN_ARGS],
        "plan_235b_layout": [*plan, str(FIXTURES / "qwen3_vl_moe_235b"), *PLAN_ARGS, *LAYOUT_ARGS],
    }
    if quick:  # the smoke test: the figure's keys, not its numbers; a tiny plan has the same code path
        return {"families": arms["families"],
                "plan_tiny": [*_cli(), "plan", "qwen3_vl_moe", "--tiny", *PLAN_ARGS]}
    return arms


def run(quick: bool = False) -> dict[str, Any]:
    ok, why = available()
    if not ok:
        return {"available": False, "reason": why, "time_ratio": None, "peak_rss_ratio": None}
    repeat = 1 if quick else 3
    arms = _arms(quick)
    samples: dict[str, list[dict[str, Any]]] = {name: [] for name in arms}
    for r in range(repeat):
        for name in (list(arms) if r % 2 == 0 else list(arms)[::-1]):
            result = _measure(arms[name])
            if result["code"] != 0:
                return {"available": False, "reason": f"{name} failed: {result['tail'][-600:]}",
                        "time_ratio": None, "peak_rss_ratio": None}
            samples[name].append(result)
    out: dict[str, Any] = {"available": True, "repeat": repeat, "plan_args": list(PLAN_ARGS),
                           "layout_args": list(LAYOUT_ARGS), "cores": len(os.sched_getaffinity(0))}
    for name, values in samples.items():
        out[name] = {
            "seconds": median([v["seconds"] for v in values]),
            "cpu_seconds": median([v["cpu_seconds"] for v in values]),
            "peak_rss_mib": median([v["peak_rss_mib"] for v in values]),
            "load_before": [v["load_before"] for v in values],
            "load_after": [v["load_after"] for v in values],
        }
    out["ratio_arm"] = "plan_30b" if "plan_30b" in samples else "plan_tiny"
    base, full = samples["families"], samples[out["ratio_arm"]]
    out["time_ratio"] = median([f["seconds"] / b["seconds"] for f, b in zip(full, base, strict=True)])
    out["peak_rss_ratio"] = median([f["peak_rss_mib"] / b["peak_rss_mib"] for f, b in zip(full, base, strict=True)])
    if "plan_235b_layout" in samples:
        out["plan_235b_layout"]["output"] = samples["plan_235b_layout"][-1]["tail"].strip().splitlines()[-13:]
    return out


def table(result: dict[str, Any]) -> list[tuple[str, str, str]]:
    if not result["available"]:
        return [("plan (full-size Qwen3-VL-MoE)", "not available: " + result["reason"][:70], "")]
    rows = []
    for name, label in (("plan_tiny", "plan, tiny Qwen3-VL-MoE (--quick)"), ("plan_30b", "plan 30B-A3B"),
                        ("plan_235b", "plan 235B-A22B"),
                        ("plan_235b_layout", "plan 235B-A22B, 256-GPU layout")):
        if name in result:
            r = result[name]
            rows.append((label, f"{r['seconds']:.1f} s wall, {r['cpu_seconds']:.1f} s CPU, "
                                f"{r['peak_rss_mib']:.0f} MiB (load {max(r['load_before']):.1f})",
                         "< 30 s on 2 idle cores" if name == "plan_235b" else ""))
    ratios = f"{result['time_ratio']:.1f}x time, {result['peak_rss_ratio']:.2f}x RSS"
    rows.append((f"{result['ratio_arm']} / families", ratios, ""))
    return rows


if __name__ == "__main__":
    figure = run(quick="--quick" in sys.argv)
    document = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "command": "python -m benchmarks.plan",
                "figure": {k: v for k, v in figure.items()}}
    OUT.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
    for row in table(figure):
        print(" | ".join(part for part in row if part))
    print(f"written: {OUT}")
