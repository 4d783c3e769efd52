"""The timing helper every figure shares: interleaved repeats, per-repeat ratios, medians.

The machines these run on are shared and noisy, so no figure is an absolute time: each repeat times
the baseline and the candidate back to back (in alternating order), the ratio is taken within the
repeat, and the median over repeats is reported.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any


def time_once(fn: Callable[[], Any], number: int = 1) -> float:
    """Seconds per call of ``fn`` (``number`` calls in a row, garbage collector off)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        start = time.perf_counter()
        for _ in range(number):
            fn()
        return (time.perf_counter() - start) / number
    finally:
        if enabled:
            gc.enable()


def median(values: list[float]) -> float:
    return float(statistics.median(values))


def compare(
    arms: Mapping[str, Callable[[], Any]],
    *,
    baseline: str,
    repeat: int,
    number: int = 1,
    warmup: int = 1,
    setups: Mapping[str, Callable[[], Any]] | None = None,
) -> dict[str, Any]:
    """Time every arm ``repeat`` times, interleaved; ratios against ``baseline`` within each repeat.

    ``setups[arm]``, when given, runs (untimed) before each timing of that arm.

    Returns ``{"repeat", "number", "seconds": {arm: median}, "ratio": {arm: median ratio},
    "ratio_min_max": {arm: [min, max]}}``.
    """
    names = list(arms)
    setups = setups or {}

    def prepare(name: str) -> None:
        if name in setups:
            setups[name]()

    for _ in range(warmup):
        for name in names:
            prepare(name)
            arms[name]()
    samples: dict[str, list[float]] = {name: [] for name in names}
    ratios: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeat):
        order = names if r % 2 == 0 else names[::-1]
        this: dict[str, float] = {}
        for name in order:
            prepare(name)
            this[name] = time_once(arms[name], number)
        for name in names:
            samples[name].append(this[name])
            ratios[name].append(this[name] / this[baseline])
    return {
        "repeat": repeat,
        "number": number,
        "seconds": {n: median(v) for n, v in samples.items()},
        "ratio": {n: median(v) for n, v in ratios.items()},
        "ratio_min_max": {n: [min(v), max(v)] for n, v in ratios.items()},
    }
