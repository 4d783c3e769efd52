"""Figure 4: what the installed, auto-activated plugin adds to interpreter start-up and to ``import megatron.bridge``.

Each arm is a fresh subprocess of the same interpreter, in the same environment; the only difference
between the arms is ``BRIDGE_FREEZE_DISABLE_AUTOLOAD`` (unset: the plugin activates; ``1``: opted out).
Wall-clock times, arms interleaved, median of per-repeat differences and ratios.

The opt-out still runs the ``.pth`` line (it has to, to read the variable), so the on/off difference
misses the import of the start-up module itself. For ``python -c pass`` the headline figure is
therefore against no plugin at all: both arms start with ``-S`` and then process the environment's
``.pth`` files exactly as ``site`` would, one arm skipping ``bridge_freeze_plugin.pth`` -- same
interpreter, same environment, the plugin's ``.pth`` line is the only difference. ``-X importtime``
says what that line imports.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

from benchmarks._timing import median

ENV_DISABLE = "BRIDGE_FREEZE_DISABLE_AUTOLOAD"
PASS_TARGET_MS = 20.0
BRIDGE_TARGET = 0.05
_IMPORT_BRIDGE = (
    "from bridge_freeze_harness import _te_stub; _te_stub.install(); import megatron.bridge, sys; "
    "m = sys.modules.get('bridge_freeze_plugin.activation'); print('active' if m and m.is_active() else 'inactive')"
)


def _env(autoload: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != ENV_DISABLE}
    if not autoload:
        env[ENV_DISABLE] = "1"
    env.setdefault("PYTHONWARNINGS", "ignore")
    return env


def _run(code: str, autoload: bool, flags: tuple[str, ...] = ()) -> tuple[float, str]:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, *flags, "-c", code], env=_env(autoload), capture_output=True, text=True,
                          check=True)
    lines = proc.stdout.strip().splitlines()  # Megatron logs INFO lines to stdout; ours is the last
    return time.perf_counter() - start, lines[-1] if lines else ""


def _site_dir() -> str:
    import sysconfig

    return sysconfig.get_paths()["purelib"]


def _emulated_site(skip_plugin: bool) -> str:
    """Code for ``python -S``: add site-packages and run its ``.pth`` files, as ``site`` does."""
    skip = ("bridge_freeze_plugin.pth",) if skip_plugin else ()
    return (
        f"import os, site, sys; d = {_site_dir()!r}; sys.path.append(d)\n"
        f"for n in sorted(os.listdir(d)):\n"
        f"    if n.endswith('.pth') and n not in {skip!r}: site.addpackage(d, n, set())\n"
    )


def _paired(code: str, repeat: int, *, against_no_plugin: bool = False) -> dict[str, Any]:
    """Arms ``on`` / ``off``: autoload on / opted out; or (``against_no_plugin``) the plugin's
    ``.pth`` run / not run at all, autoload on."""

    def arm(on_arm: bool) -> tuple[float, str]:
        if against_no_plugin:
            return _run(_emulated_site(skip_plugin=not on_arm) + code, True, ("-S",))
        return _run(code, on_arm)

    on: list[float] = []
    off: list[float] = []
    outputs: set[tuple[bool, str]] = set()
    arm(True), arm(False)  # warm the file cache
    for r in range(repeat):
        for autoload in ((True, False) if r % 2 == 0 else (False, True)):
            seconds, out = arm(autoload)
            (on if autoload else off).append(seconds)
            outputs.add((autoload, out))
    return {
        "repeat": repeat,
        "on_ms": 1e3 * median(on),
        "off_ms": 1e3 * median(off),
        "added_ms": 1e3 * median([a - b for a, b in zip(on, off, strict=True)]),
        "ratio": median([a / b for a, b in zip(on, off, strict=True)]),
        "outputs": sorted(f"{'on' if a else 'off'}: {o}" for a, o in outputs if o),
    }


def startup_module_import_ms(repeat: int = 5) -> float:
    """``-X importtime`` cumulative time of ``_bridge_freeze_autoload`` (what the ``.pth`` line imports)."""
    samples = []
    for _ in range(repeat):
        proc = subprocess.run([sys.executable, "-X", "importtime", "-c", "pass"], env=_env(True),
                              capture_output=True, text=True, check=True)
        total = 0
        for line in proc.stderr.splitlines():
            if line.rstrip().endswith("_bridge_freeze_autoload"):
                total = int(line.split("|")[1])  # cumulative microseconds
        samples.append(total / 1e3)
    return median(samples)


def run(quick: bool = False) -> dict[str, Any]:
    repeat = 10 if quick else 40
    bare = _paired("pass", repeat, against_no_plugin=True)
    bare["opt_out"] = {k: v for k, v in _paired("pass", repeat).items() if k != "outputs"}
    bare["startup_module_importtime_ms"] = startup_module_import_ms(3 if quick else 9)
    bare["target_ms"] = PASS_TARGET_MS
    bare["ok"] = bare["added_ms"] < PASS_TARGET_MS
    if quick:
        bridge: dict[str, Any] = {"skipped": "--quick (each import of megatron.bridge takes seconds)",
                                  "ratio": None, "added_ms": None, "ok": None}
    else:
        bridge = _paired(_IMPORT_BRIDGE, repeat=7)
        bridge["activated_when_on"] = "on: active" in bridge["outputs"]
        bridge["ok"] = bridge["ratio"] - 1.0 < BRIDGE_TARGET
    bridge["target_ratio"] = 1.0 + BRIDGE_TARGET
    return {"python_c_pass": bare, "import_megatron_bridge": bridge}


def table(result: dict[str, Any]) -> list[tuple[str, str, str]]:
    bare = result["python_c_pass"]
    bridge = result["import_megatron_bridge"]
    rows = [(
        "activation: python -c pass",
        f"{bare['added_ms']:+.1f} ms vs no plugin ({bare['ratio']:.2f}x of {bare['off_ms']:.0f} ms; "
        f"autoload on vs opted out {bare['opt_out']['added_ms']:+.1f} ms)",
        f"< {PASS_TARGET_MS:.0f} ms",
    )]
    if bridge.get("ratio") is None:
        rows.append(("activation: import megatron.bridge", "skipped (--quick)", "< +5%"))
    else:
        rows.append((
            "activation: import megatron.bridge",
            f"{bridge['ratio']:.3f}x ({bridge['added_ms']:+.0f} ms of {bridge['off_ms']:.0f} ms)",
            "< +5%",
        ))
    return rows
