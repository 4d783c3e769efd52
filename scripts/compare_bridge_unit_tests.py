#!/usr/bin/env python3
"""Run Megatron-Bridge's own unit tests with bridge-freeze-plugin active and opted out; compare the outcomes.

The plugin patches Bridge's provider classes and a few Bridge functions while it is active. Bridge's own unit
tests are the widest check that those patches change nothing Bridge's code or tests rely on. This script

1. extracts Bridge's ``tests/unit_tests`` (and its ``pyproject.toml``, for the pytest markers) from the bare
   mirror of Bridge's repository at the commit whose ``src/megatron/bridge`` matches the installed 0.6.2 wheel
   best (see ``docs/bridge-unit-tests.md``), into a scratch directory outside the repository;
2. installs, into a separate target directory (never the project's venv), the two import-time dependencies
   ``megatron.bridge.recipes`` needs and the venv lacks (diffusers, hydra-core);
3. runs the selected test paths twice, one after the other, each in its own ``python -m pytest`` subprocess
   with ``--junitxml``: once with the plugin active through its autoload (the ``.pth`` hook fires when
   ``megatron.bridge`` is imported), once opted out with ``BRIDGE_FREEZE_DISABLE_AUTOLOAD=1``. Both load
   ``scripts/bridge_unit_tests_plugin.py`` (TE stub, one torch thread, and a record of whether the plugin was
   really active), and the script refuses a run whose state was not the one asked for;
4. compares per-test outcomes (passed / failed / error / skipped) and writes ``differences.json``.

Exit status: 0 when every difference is in :data:`INTENDED` (each entry says why that difference is
intended), 1 when a difference is not, 2 when a run could not be done or was not in the state it asked for.

Usage (from the repository root; the defaults run the subset documented in ``docs/bridge-unit-tests.md``)::

    .venv/bin/python scripts/compare_bridge_unit_tests.py
    .venv/bin/python scripts/compare_bridge_unit_tests.py --paths tests/unit_tests/peft -k lora
    .venv/bin/python scripts/compare_bridge_unit_tests.py --reuse   # compare the last two runs' XML again
"""

from __future__ import annotations

import argparse
import collections
import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
SCRIPTS_DIR = Path(__file__).resolve().parent
PLUGIN_MODULE = "bridge_unit_tests_plugin"  # scripts/bridge_unit_tests_plugin.py
STATE_FILE_ENV = "BRIDGE_UNIT_TESTS_STATE_FILE"
DISABLE_ENV = "BRIDGE_FREEZE_DISABLE_AUTOLOAD"

#: Bridge's repository, mirrored as a bare git directory.
BRIDGE_MIRROR = Path("/work/.mirror/NVIDIA-NeMo+Megatron-Bridge/repo")
#: Head of Bridge's r0.6.0 branch in the mirror: 761 of the installed 0.6.2 wheel's 816 ``.py`` files are
#: byte-identical to it (no other commit of the mirror matches more; no v0.6.2 tag or bump commit exists there).
BRIDGE_REF = "6124fbe38a68eea9c4f4be3aa5e084bd5d461d98"

#: Import-time dependencies of ``megatron.bridge.recipes`` (flux -> diffusers; omegaconf_utils -> hydra) that the
#: project's venv does not have. Installed with ``--no-deps`` into a separate directory put on PYTHONPATH.
EXTRA_DEPS = ("diffusers==0.42.1", "hydra-core==1.3.8", "antlr4-python3-runtime==4.9.3")
EXTRA_IMPORTS = ("diffusers", "hydra._internal.config_loader_impl")

#: The default selection (relative to the extracted tests' root): what runs on 2 shared CPU cores in about
#: six minutes a run. See docs/bridge-unit-tests.md for what is left out and why.
DEFAULT_PATHS = (
    "tests/unit_tests/models",
    "tests/unit_tests/peft",
    "tests/unit_tests/recipes",
)
DEFAULT_DESELECT: tuple[str, ...] = (
    # Starts a fresh interpreter that imports megatron.bridge without the TE stub: fails in both runs here, and
    # takes 15-75 s of a run.
    "tests/unit_tests/models/test_autobridge_registration_matrix.py",
)

#: Differences that are intended: test id pattern (fnmatch on "module.Class::test") -> why.
#: Only a difference whose test matches an entry here is allowed; everything else fails the script.
INTENDED: dict[str, str] = {}

RUNS = ("active", "opted_out")
OUTCOME_RANK = {"passed": 0, "skipped": 1, "failed": 2, "error": 3}


@dataclass
class TestResult:
    outcome: str
    message: str = ""
    text: str = ""
    time: float = 0.0


@dataclass
class RunResult:
    name: str
    tests: dict[str, TestResult] = field(default_factory=dict)
    wall_s: float = 0.0
    returncode: int | None = None
    state: dict[str, Any] = field(default_factory=dict)


def say(text: str) -> None:
    """The script's output (a command-line report, so stdout, not logging)."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


# --------------------------------------------------------------------------------------------------------------
# Set-up: the tests and the extra dependencies.
# --------------------------------------------------------------------------------------------------------------


#: What is taken from Bridge's repository: the tests, the markers (pyproject.toml), and what tests read from the
#: repository itself (example scripts the MIMO tests load, the perf scripts test_override_precedence imports and
#: their helpers in scripts/common).
EXTRACTED = (
    "tests/__init__.py", "tests/unit_tests", "pyproject.toml", "examples", "scripts/performance", "scripts/common",
)


def installed_bridge(python: str) -> Path:
    """The installed ``megatron/bridge`` package directory (found without importing it)."""
    code = "import importlib.util; print(importlib.util.find_spec('megatron.bridge').submodule_search_locations[0])"
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout
    return Path(out.strip())


def extract_tests(mirror: Path, ref: str, dest: Path, python: str) -> None:
    """:data:`EXTRACTED` of ``ref`` into ``dest``, and ``src/megatron/bridge`` -> the installed package.

    A few recipe tests glob Bridge's source tree by path (``parents[3] / "src" / ...``); the link makes them
    read the installed 0.6.2 code, which is what both runs import.
    """
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryFile() as archive:
        proc = subprocess.run(
            ["git", "--git-dir", str(mirror), "archive", "--format=tar", ref, *EXTRACTED],
            stdout=archive, stderr=subprocess.PIPE, text=False, check=False,
        )
        if proc.returncode != 0:
            raise SystemExit(f"git archive {ref} failed in {mirror}: {proc.stderr.decode(errors='replace')}")
        archive.seek(0)
        with tarfile.open(fileobj=archive) as tar:
            tar.extractall(dest, filter="data")
    link = dest / "src" / "megatron" / "bridge"
    link.parent.mkdir(parents=True, exist_ok=True)
    if not link.is_symlink():
        link.symlink_to(installed_bridge(python), target_is_directory=True)
    (dest / ".bridge_ref").write_text(_marker(ref), encoding="utf-8")


def _marker(ref: str) -> str:
    return f"{ref}\n" + "\n".join(EXTRACTED) + "\n"


def ensure_tests(tests_root: Path, mirror: Path, ref: str, python: str) -> None:
    marker = tests_root / ".bridge_ref"
    if marker.is_file():
        if marker.read_text(encoding="utf-8") == _marker(ref):
            return
        say(f"{tests_root} holds another extraction (this script's marker differs): extracting again")
        shutil.rmtree(tests_root)
    elif (tests_root / "tests" / "unit_tests").is_dir():
        return  # tests put there by hand (--tests-root pointing at a checkout): used as they are
    if not mirror.is_dir():
        raise SystemExit(f"no Bridge tests in {tests_root} and no mirror at {mirror}: pass --tests-root or --mirror")
    say(f"extracting Bridge's unit tests of {ref[:12]} into {tests_root}")
    extract_tests(mirror, ref, tests_root, python)


def ensure_deps(python: str, deps_dir: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(deps_dir)}
    probe = "import importlib\n" + "\n".join(f"importlib.import_module({m!r})" for m in EXTRA_IMPORTS)
    if deps_dir.is_dir() and subprocess.run([python, "-c", probe], env=env, capture_output=True).returncode == 0:
        return
    say(f"installing {', '.join(EXTRA_DEPS)} into {deps_dir} (not the venv)")
    subprocess.run(
        [python, "-m", "pip", "install", "--quiet", "--no-deps", "--upgrade", "--target", str(deps_dir), *EXTRA_DEPS],
        check=True,
    )


# --------------------------------------------------------------------------------------------------------------
# Running pytest.
# --------------------------------------------------------------------------------------------------------------


def run_env(run: str, deps_dir: Path, state_file: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.pop(DISABLE_ENV, None)
    if run == "opted_out":
        env[DISABLE_ENV] = "1"
    paths = [str(SCRIPTS_DIR), str(deps_dir)]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env[STATE_FILE_ENV] = str(state_file)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def pytest_command(python: str, paths: list[str], junit: Path, keyword: str | None, deselect: list[str]) -> list[str]:
    cmd = [
        python, "-m", "pytest",
        "-p", "no:cacheprovider",
        "-p", PLUGIN_MODULE,
        "-o", "addopts=",  # Bridge's addopts (--verbose --durations=0 --strict-markers) are for its CI
        "-q", "--no-header", "-rN",
        "--continue-on-collection-errors",
        f"--junitxml={junit}",
    ]
    if keyword:
        cmd += ["-k", keyword]
    for nodeid in deselect:
        cmd += ["--deselect", nodeid]
    return cmd + paths


def run_pytest(run: str, args: argparse.Namespace, out_dir: Path) -> RunResult:
    junit = out_dir / f"{run}.xml"
    state_file = out_dir / f"{run}.state.json"
    log = out_dir / f"{run}.log"
    for stale in (junit, state_file):
        stale.unlink(missing_ok=True)
    cmd = pytest_command(args.python, args.paths, junit, args.keyword, args.deselect)
    say(f"[{run}] {' '.join(cmd)}  (log: {log})")
    start = time.monotonic()
    with log.open("w", encoding="utf-8") as handle:
        try:
            proc = subprocess.run(
                cmd, cwd=args.tests_root, env=run_env(run, args.deps_dir, state_file),
                stdout=handle, stderr=subprocess.STDOUT, timeout=args.timeout, check=False,
            )
            returncode: int | None = proc.returncode
        except subprocess.TimeoutExpired:
            returncode = None
    wall = time.monotonic() - start
    say(f"[{run}] exit {returncode} after {wall:.0f} s")
    if returncode is None:
        raise RunFailed(f"{run}: pytest ran past --timeout={args.timeout} s (see {log})")
    result = load_run(run, out_dir)
    result.wall_s, result.returncode = wall, returncode
    return result


class RunFailed(Exception):
    """A run produced no usable result, or was not in the plugin state it asked for."""


def load_run(run: str, out_dir: Path) -> RunResult:
    junit = out_dir / f"{run}.xml"
    state_file = out_dir / f"{run}.state.json"
    if not junit.is_file():
        raise RunFailed(f"{run}: pytest wrote no {junit} (see {out_dir / (run + '.log')})")
    result = RunResult(run, tests=parse_junit(junit))
    result.state = json.loads(state_file.read_text(encoding="utf-8")) if state_file.is_file() else {}
    check_state(result)
    return result


def check_state(result: RunResult) -> None:
    """The active run had the plugin active from the start; the opted-out run never imported it."""
    want_active = result.name == "active"
    for moment in ("at_start", "at_finish"):
        state = result.state.get(moment)
        if state is None:
            raise RunFailed(f"{result.name}: no plugin state recorded {moment} (was {PLUGIN_MODULE} loaded?)")
        if want_active and not state["plugin_active"]:
            raise RunFailed(f"{result.name}: the plugin was not active {moment}; is it installed (.pth)?")
        if not want_active and state["plugin_imported"]:
            raise RunFailed(f"{result.name}: bridge_freeze_plugin was imported {moment} despite {DISABLE_ENV}=1")


# --------------------------------------------------------------------------------------------------------------
# Results.
# --------------------------------------------------------------------------------------------------------------


def parse_junit(path: Path) -> dict[str, TestResult]:
    """Test id (``module.Class::name``) -> worst outcome over its phases (setup / call / teardown)."""
    tests: dict[str, TestResult] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        test_id = f"{case.get('classname', '')}::{case.get('name', '')}"
        outcome, message, text = "passed", "", ""
        for child in case:
            kind = {"failure": "failed", "error": "error", "skipped": "skipped"}.get(child.tag)
            if kind is None:
                continue
            if OUTCOME_RANK[kind] >= OUTCOME_RANK[outcome]:
                outcome, message, text = kind, child.get("message") or "", child.text or ""
        result = TestResult(outcome, message, text, float(case.get("time") or 0.0))
        previous = tests.get(test_id)
        if previous is None or OUTCOME_RANK[result.outcome] > OUTCOME_RANK[previous.outcome]:
            tests[test_id] = result
    return tests


def cause(result: TestResult) -> str:
    """A failure's cause in one line: the last ``E  `` line of the traceback (else the message)."""
    lines = [line[1:].strip() for line in result.text.splitlines() if line.startswith("E ")]
    exception_lines = [line for line in lines if re.match(r"^[\w.]+(Error|Exception|Exit|Interrupt)\b", line)]
    line = (exception_lines or lines or [result.message or result.outcome])[-1 if exception_lines else 0]
    return line[:300]


def cause_group(text: str) -> str:
    """A cause with the details that vary between tests blanked, for grouping."""
    text = re.sub(r"0x[0-9a-f]+", "0x…", text)
    text = re.sub(r"'[^']*'", "'…'", text)
    text = re.sub(r"\d+", "N", text)
    return text[:160]


def nodeid_of(test_id: str, tests_root: Path) -> str:
    """A junit test id (``pkg.module.Class::name``) as a pytest node id (``pkg/module.py::Class::name``)."""
    classname, _, name = test_id.partition("::")
    parts = classname.split(".")
    for cut in range(len(parts), 0, -1):
        path = Path(*parts[:cut]).with_suffix(".py")
        if (tests_root / path).is_file():
            return "::".join([path.as_posix(), *parts[cut:], name] if name else [path.as_posix(), *parts[cut:]])
    return test_id


def reproduce_command(nodeid: str, run: str, args: argparse.Namespace) -> str:
    """One shell line running ``nodeid`` alone as ``run`` does."""
    env = f"PYTHONPATH={SCRIPTS_DIR}:{args.deps_dir}"
    if run == "opted_out":
        env += f" {DISABLE_ENV}=1"
    return (f"cd {args.tests_root} && {env} {args.python} -m pytest -p no:cacheprovider -p {PLUGIN_MODULE} "
            f"-o addopts= -q '{nodeid}'")


def intended_reason(test_id: str, intended: dict[str, str]) -> str | None:
    for pattern, reason in intended.items():
        if fnmatch.fnmatchcase(test_id, pattern):
            return reason
    return None


def compare(active: RunResult, opted_out: RunResult, intended: dict[str, str]) -> dict[str, Any]:
    differences = []
    both_failed: dict[str, list[str]] = collections.defaultdict(list)
    counts = {run.name: collections.Counter(r.outcome for r in run.tests.values()) for run in (active, opted_out)}
    for test_id in sorted(set(active.tests) | set(opted_out.tests)):
        a, o = active.tests.get(test_id), opted_out.tests.get(test_id)
        a_out = a.outcome if a else "absent"
        o_out = o.outcome if o else "absent"
        if a_out == o_out:
            if a_out in ("failed", "error") and a is not None:
                both_failed[cause_group(cause(a))].append(test_id)
            continue
        reason = intended_reason(test_id, intended)
        differences.append({
            "test": test_id,
            "active": a_out,
            "opted_out": o_out,
            "active_cause": cause(a) if a and a_out in ("failed", "error") else None,
            "opted_out_cause": cause(o) if o and o_out in ("failed", "error") else None,
            "active_traceback_tail": (a.text[-3000:] if a and a_out in ("failed", "error") else None),
            "opted_out_traceback_tail": (o.text[-3000:] if o and o_out in ("failed", "error") else None),
            "intended": reason is not None,
            "reason": reason,
        })
    groups = sorted(both_failed.items(), key=lambda item: -len(item[1]))
    return {
        "counts": {name: dict(counter) for name, counter in counts.items()},
        "wall_s": {active.name: round(active.wall_s), opted_out.name: round(opted_out.wall_s)},
        "differences": differences,
        "unexpected": [d["test"] for d in differences if not d["intended"]],
        "failed_in_both": {
            "total": sum(len(v) for v in both_failed.values()),
            "by_cause": [{"cause": c, "count": len(ids), "examples": ids[:3]} for c, ids in groups],
        },
    }


def plugin_revision() -> dict[str, Any]:
    """Which plugin code was tested: HEAD and whether bridge_freeze_plugin/ had uncommitted changes."""
    def git(*argv: str) -> str:
        proc = subprocess.run(["git", "-C", str(REPO_ROOT), *argv], capture_output=True, text=True, check=False)
        return proc.stdout.strip()

    dirty = git("status", "--porcelain", "--", "bridge_freeze_plugin", "_bridge_freeze_autoload.py")
    return {"head": git("rev-parse", "HEAD"), "uncommitted_plugin_files": dirty.splitlines()}


def print_summary(report: dict[str, Any]) -> None:
    say(f"\noutcomes: {json.dumps(report['counts'])}")
    say(f"wall time (s): {json.dumps(report['wall_s'])}")
    fib = report["failed_in_both"]
    say(f"failed or errored in BOTH runs (not differences): {fib['total']}")
    for group in fib["by_cause"][:15]:
        say(f"  {group['count']:5d}  {group['cause']}")
    diffs = report["differences"]
    say(f"\ndifferences: {len(diffs)} ({len(report['unexpected'])} not intended)")
    for d in diffs:
        tag = "intended" if d["intended"] else "UNEXPECTED"
        say(f"  [{tag}] {d['test']}: active={d['active']} opted_out={d['opted_out']}")
        for key in ("active_cause", "opted_out_cause"):
            if d[key]:
                say(f"      {key}: {d[key]}")
        if d["reason"]:
            say(f"      reason: {d['reason']}")
        if d.get("reproduce"):
            say(f"      reproduce: {d['reproduce']['active']}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tests-root", type=Path, default=Path("/tmp/bridge-tests"),
                        help="where Bridge's tests are (extracted there when absent); default /tmp/bridge-tests")
    parser.add_argument("--mirror", type=Path, default=BRIDGE_MIRROR, help="Bridge's bare git mirror")
    parser.add_argument("--ref", default=BRIDGE_REF, help="Bridge commit whose tests to extract")
    parser.add_argument("--deps-dir", type=Path, default=Path("/tmp/bridge-tests-deps"),
                        help="target directory for diffusers / hydra-core (never the venv)")
    parser.add_argument("--out-dir", type=Path, default=Path("/tmp/bridge-tests-runs"),
                        help="junit XML, logs and differences.json go here")
    parser.add_argument("--python", default=str(REPO_ROOT / ".venv" / "bin" / "python"))
    parser.add_argument("--paths", nargs="+", default=list(DEFAULT_PATHS),
                        help="test paths relative to --tests-root (default: %(default)s)")
    parser.add_argument("-k", dest="keyword", default=None, help="pytest -k expression for both runs")
    parser.add_argument("--deselect", nargs="*", default=list(DEFAULT_DESELECT), help="node ids to leave out")
    parser.add_argument("--timeout", type=int, default=1200, help="seconds allowed per run (default %(default)s)")
    parser.add_argument("--only", choices=RUNS, help="do one run only (then --reuse compares)")
    parser.add_argument("--reuse", action="store_true", help="compare the XML already in --out-dir; run nothing")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.tests_root = args.tests_root.resolve()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    revision_before = None if args.reuse else plugin_revision()
    try:
        if args.reuse:
            results = {run: load_run(run, args.out_dir) for run in RUNS}
        else:
            if shutil.which(args.python) is None and not Path(args.python).exists():
                raise RunFailed(f"no Python at {args.python}")
            ensure_tests(args.tests_root, args.mirror, args.ref, args.python)
            ensure_deps(args.python, args.deps_dir)
            runs = [args.only] if args.only else list(RUNS)
            results = {run: run_pytest(run, args, args.out_dir) for run in runs}
            if args.only:
                return 0
    except RunFailed as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    report = compare(results["active"], results["opted_out"], INTENDED)
    for diff in report["differences"]:
        nodeid = nodeid_of(diff["test"], args.tests_root)
        diff["reproduce"] = {run: reproduce_command(nodeid, run, args) for run in RUNS}
    report["selection"] = {"paths": args.paths, "keyword": args.keyword, "deselect": args.deselect}
    report["bridge_tests"] = {"root": str(args.tests_root), "ref": args.ref}
    # The checkout can move while the runs go on (other people commit): both ends are recorded.
    report["plugin"] = {"before_runs": revision_before, "after_runs": plugin_revision()}
    out = args.out_dir / "differences.json"
    out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print_summary(report)
    say(f"\nwritten: {out}")
    return 1 if report["unexpected"] else 0


if __name__ == "__main__":
    sys.exit(main())
