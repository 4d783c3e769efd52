"""Run the benchmark suite: ``python -m benchmarks.run [--quick] [--only a,b] [--out PATH]``.

Writes one JSON file (default ``benchmarks/results/latest.json``) and prints a short table. Every
figure is a ratio against a baseline measured in the same run (repeated, medians): the machines are
shared and absolute times mean little. See ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

FIGURES: dict[str, str] = {
    "overhead": "benchmarks.overhead",
    "memory": "benchmarks.memory",
    "step": "benchmarks.step_time",
    "activation": "benchmarks.activation",
    "plan": "benchmarks.plan",
    "recompute": "benchmarks.recompute",
    "sync": "benchmarks.sync",
    "audit": "benchmarks.audit",
    "gpu": "benchmarks.gpu_memory",  # measured on CUDA only; elsewhere plan's figures and "skipped"
}
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "latest.json"


def machine() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gib = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_gib = round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    import torch

    return {
        "cpu": cpu,
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "memory_gib": mem_gib,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "platform": platform.platform(),
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer sizes and repeats (smoke test; numbers are rough)")
    parser.add_argument("--only", default="", help=f"comma-separated subset of: {', '.join(FIGURES)}")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON output (default {DEFAULT_OUT})")
    return parser.parse_args(argv)


def print_table(rows: list[tuple[str, str, str]]) -> None:
    width = max(len(r[0]) for r in rows)
    for name, value, target in rows:
        print(f"{name:<{width}}  {value}" + (f"   [{target}]" if target else ""))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    only = [f.strip() for f in args.only.split(",") if f.strip()] or list(FIGURES)
    unknown = sorted(set(only) - set(FIGURES))
    if unknown:
        print(f"unknown figure(s): {', '.join(unknown)}; choose from {', '.join(FIGURES)}", file=sys.stderr)
        return 2
    started = time.time()
    result: dict[str, Any] = {
        "command": "python -m benchmarks.run" + (" --quick" if args.quick else "")
        + (f" --only {','.join(only)}" if args.only else ""),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "quick": args.quick,
        "machine": machine(),
        "figures": {},
        "seconds": {},
    }
    rows: list[tuple[str, str, str]] = []
    for name in only:
        module = importlib.import_module(FIGURES[name])
        t0 = time.perf_counter()
        print(f"[{name}] running...", file=sys.stderr, flush=True)
        figure = module.run(quick=args.quick)
        result["figures"][name] = figure
        result["seconds"][name] = round(time.perf_counter() - t0, 1)
        rows += module.table(figure)
    result["total_seconds"] = round(time.time() - started, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, sort_keys=False) + "\n")
    print_table(rows)
    print(f"\nwritten: {args.out} ({result['total_seconds']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
