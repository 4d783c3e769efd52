"""The compatibility lane: the plugin's Bridge-facing tests, ``demo`` and ``plan`` against other Bridge commits.

CI runs the pinned releases (Megatron-Bridge 0.6.2, megatron-core 0.19.2). The plugin's users pin other commits
(NeMo-RL: Bridge 8c46dc42 / megatron-core 14346b65; SkyRL: Bridge 91a15142 / megatron-core 64c3fb86). This script
takes a Bridge source tree and a megatron-core source tree, copies their ``megatron/bridge``, ``megatron/core`` and
``megatron/training`` into a side folder that shadows the venv's (on ``PYTHONPATH`` before site-packages;
``megatron`` is a namespace package), and runs each Bridge-facing test file, ``bridge-freeze demo`` and
``bridge-freeze plan --tiny`` there, one process each, printing one table row per run. Nothing is installed into
the venv.

``--whole-suite`` runs the whole suite instead (every ``test_*.py`` under pytest's ``testpaths``: no list kept
here), one pytest process per test folder (a large folder in runs of ``--chunk`` files: one process for the whole
suite ran out of memory), each writing its JUnit XML to a temporary folder, and prints one row per test file
(passed, failed, errors, skipped, seconds: the file's tests' own times, collection and imports not included).

A source is a directory (a checkout: ``src/megatron/bridge`` or ``megatron/core`` inside it is found), or
``GITDIR@COMMIT``: the commit's tree taken with ``git archive`` from a git directory (a bare mirror will do)::

    python scripts/compat_lane.py --bridge /mirrors/Megatron-Bridge.git@8c46dc42 \\
        --mcore /mirrors/Megatron-LM.git@14346b65 --side /tmp/lane-nemo-rl

docs/development.md lists the commits tested and how to add one.
"""

from __future__ import annotations

import argparse
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The test files that build, train or export through Bridge (run one process each, in this order).
TESTS = (
    "tests/unit/activation/test_activation.py",
    "tests/unit/integration/test_build_paths.py",
    "tests/unit/integration/test_subclass_provide.py",
    "tests/unit/integration/test_bridge_training.py",
    "tests/unit/integration/test_distributed.py",
    "tests/unit/families/test_uncovered_providers.py",
    "tests/unit/families/test_family_gradients.py",
    "tests/unit/families/test_family_layouts.py",
    "tests/unit/export/test_trainable_sync.py",
    "tests/unit/prewrap/test_expert_bias.py",
    "tests/unit/export/test_bridge_signatures.py",
)
#: The commands run after the tests (``bridge-freeze`` sub-commands).
COMMANDS = (("demo", "--steps", "2"), ("plan", "qwen3_vl", "--tiny", "--freeze-vision-model"))
#: Where each package lives inside its source tree, and where it goes in the side folder.
#: megatron-core's wheel ships ``megatron/training`` too (its pyproject's packages): both come from the mcore tree,
#: so Bridge never meets a ``megatron.training`` of another megatron-core release.
PACKAGES = {
    "bridge": (("src/megatron/bridge", "megatron/bridge"),),
    "mcore": (("megatron/core", "megatron/core"), ("megatron/training", "megatron/training")),
}
_SUMMARY = re.compile(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed)")


def materialise(source: str, inner: str, dest: Path) -> None:
    """Copy ``inner`` of ``source`` (a directory, or ``GITDIR@COMMIT``) to ``dest``."""
    if dest.exists():
        shutil.rmtree(dest)
    gitdir, sep, commit = source.rpartition("@")
    if sep and Path(gitdir).exists():
        archive = subprocess.run(["git", "-C", gitdir, "archive", "--format=tar", commit, inner],
                                 check=True, capture_output=True).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            members = [m for m in tar.getmembers() if m.name.startswith(inner)]
            for member in members:
                member.name = member.name[len(inner):].lstrip("/") or "."
            tar.extractall(dest, members=members, filter="data")
        return
    found = Path(source) / inner
    if not found.is_dir():
        raise SystemExit(f"compat_lane: {source} has no {inner}/ (give a checkout or GITDIR@COMMIT)")
    shutil.copytree(found, dest)


def version_of(package_info: Path) -> str:
    """``MAJOR.MINOR.PATCH[PRE_RELEASE]`` read from a ``package_info.py`` (importing it would import the package)."""
    text = package_info.read_text(encoding="utf-8") if package_info.exists() else ""
    found = {k: v for k, v in re.findall(r"^(MAJOR|MINOR|PATCH|PRE_RELEASE) = ['\"]?([^'\"\n]*)", text, re.M)}
    return ".".join(found.get(k, "?") for k in ("MAJOR", "MINOR", "PATCH")) + found.get("PRE_RELEASE", "")


def lane_env(side: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(side)])  # the plugin first, then the shadowing sources
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "NO_VCS_VERSION": "1"})
    return env


def run(args: list[str], env: dict[str, str], timeout: int) -> tuple[str, float, str]:
    """(summary, seconds, last lines) of one process."""
    started = time.perf_counter()
    try:
        done = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timed out", time.perf_counter() - started, ""
    seconds = time.perf_counter() - started
    output = done.stdout + done.stderr
    # pytest's summary line ("... 3 passed, 1 skipped in 9.87s"): the last one (a process may log after it)
    summary = next((line for line in reversed(output.splitlines()) if _SUMMARY.search(line)
                    and re.search(r" in [\d.]+s", line)), "")
    counts = ", ".join(f"{n} {what}" for n, what in _SUMMARY.findall(summary))
    lines = output.splitlines()
    failures = [line for line in lines if line.startswith(("FAILED ", "ERROR "))]  # pytest's short summary
    return counts or f"exit {done.returncode}", seconds, "\n".join(failures[-10:] or lines[-5:])


#: The columns of the whole suite's per-file table (the seconds last).
COLUMNS = ("passed", "failed", "errors", "skipped")


def _file_of(case: ElementTree.Element) -> str:
    """The test file of a JUnit ``testcase`` (xunit1 names it, a collection error's too; else from its module)."""
    if case.get("file"):
        return case.get("file", "")
    module = [part for part in (case.get("classname") or case.get("name", "")).split(".") if part[:1].islower()]
    return "/".join(module) + ".py"


def per_file(junit: Path) -> dict[str, dict[str, float]]:
    """``{file: {passed, failed, errors, skipped, seconds}}`` from a pytest JUnit XML file."""
    table: dict[str, dict[str, float]] = defaultdict(lambda: dict.fromkeys((*COLUMNS, "seconds"), 0))
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        row = table[_file_of(case)]
        row["seconds"] += float(case.get("time") or 0)
        kinds = {child.tag for child in case}
        if "error" in kinds:  # a setup or teardown error (pytest counts a teardown's beside the pass; one row here)
            row["errors"] += 1
        elif "failure" in kinds:
            row["failed"] += 1
        elif "skipped" in kinds:
            row["skipped"] += 1
        else:
            row["passed"] += 1
    return dict(sorted(table.items()))


def suite_chunks(chunk: int) -> list[list[str]]:
    """The suite's test files (``test_*.py`` under pytest's ``testpaths``, ``tests``: no list kept here), by folder,
    a folder of more than ``chunk`` files in runs of ``chunk``."""
    by_folder: dict[Path, list[str]] = defaultdict(list)
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        by_folder[path.parent].append(str(path.relative_to(ROOT)))
    return [files[i:i + chunk] for _, files in sorted(by_folder.items()) for i in range(0, len(files), chunk)]


def whole_suite(env: dict[str, str], timeout: int, chunk: int) -> int:
    """The whole suite in the lane, one pytest process per folder (or run of ``chunk`` files of one: the whole
    suite in one process grew past this 23 GB machine's memory at about half way on 0.7.0 and was killed), each
    writing its JUnit XML; pytest's output streams through (``-rfE``: each process ends by naming its failures).
    Then one table row per file. 1 if anything failed."""
    table: dict[str, dict[str, float]] = {}
    problems = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="compat-lane-") as tmp:
        for index, files in enumerate(suite_chunks(chunk)):
            junit = Path(tmp) / f"junit-{index}.xml"
            args = [sys.executable, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider", "-o",
                    "junit_family=xunit1", "--continue-on-collection-errors", f"--junitxml={junit}", *files]
            out(f"--- {len(files)} files from {files[0]}", sys.stderr)
            try:
                code = subprocess.run(args, cwd=ROOT, env=env, timeout=timeout, check=False).returncode
            except subprocess.TimeoutExpired:
                code = "timed out"
            if code not in (0, 1) or not junit.exists():
                problems.append(f"{', '.join(files)}: pytest exit {code}{'' if junit.exists() else ', no JUnit XML'}")
            if junit.exists():
                table.update(per_file(junit))
    seconds = time.perf_counter() - started
    totals = dict.fromkeys((*COLUMNS, "seconds"), 0.0)
    for row in table.values():
        totals = {key: totals[key] + row[key] for key in totals}
    out(f"\nwhole suite: {seconds:.0f} s; " + ", ".join(f"{int(totals[c])} {c}" for c in COLUMNS)
        + f" in {len(table)} files")
    for problem in problems:
        out(f"NOT RUN TO THE END: {problem}")
    out("| file | " + " | ".join(COLUMNS) + " | seconds |\n|---|" + "---|" * (len(COLUMNS) + 1))
    for name, row in sorted(table.items()):
        out(f"| {name} | " + " | ".join(str(int(row[c])) for c in COLUMNS) + f" | {row['seconds']:.1f} |")
    out("| **all** | " + " | ".join(str(int(totals[c])) for c in COLUMNS) + f" | {totals['seconds']:.1f} |")
    return 1 if problems or totals["failed"] or totals["errors"] else 0


def out(line: str, stream=sys.stdout) -> None:
    stream.write(line + "\n")
    stream.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bridge", required=True, help="Megatron-Bridge checkout, or GITDIR@COMMIT")
    parser.add_argument("--mcore", required=True, help="Megatron-LM (megatron-core) checkout, or GITDIR@COMMIT")
    parser.add_argument("--side", required=True, type=Path, help="side folder (made or replaced)")
    parser.add_argument("--tests", nargs="*", default=list(TESTS), help="test files (default: the Bridge-facing ones)")
    parser.add_argument("--no-commands", action="store_true", help="skip demo and plan")
    parser.add_argument("--timeout", type=int, default=None,
                        help="seconds per process (default 1800; 3600 with --whole-suite)")
    parser.add_argument("--whole-suite", action="store_true",
                        help="the whole suite, one pytest process per test folder, a row per file from JUnit XML")
    parser.add_argument("--chunk", type=int, default=10,
                        help="with --whole-suite: at most this many files per pytest process (default 10)")
    options = parser.parse_args(argv)
    for key, source in (("bridge", options.bridge), ("mcore", options.mcore)):
        for inner, target in PACKAGES[key]:
            materialise(source, inner, options.side / target)
    env = lane_env(options.side)
    versions = {key: version_of(options.side / places[0][1] / "package_info.py") for key, places in PACKAGES.items()}
    out(f"in the lane ({options.side}): Megatron-Bridge {versions['bridge']} ({options.bridge}), "
        f"megatron-core {versions['mcore']} ({options.mcore})")
    if options.whole_suite:
        return whole_suite(env, options.timeout or 3600, options.chunk)
    timeout = options.timeout or 1800
    out("| run | result | seconds |\n|---|---|---|")
    failed = False
    runs = [[sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test] for test in options.tests]
    if not options.no_commands:
        runs += [[sys.executable, "-m", "bridge_freeze_plugin.cli", *command] for command in COMMANDS]
    for args in runs:
        name = args[-1] if "pytest" in args else "bridge-freeze " + " ".join(args[3:])
        summary, seconds, tail = run(args, env, timeout)
        out(f"| {name} | {summary} | {seconds:.0f} |")
        if "failed" in summary or "error" in summary or (summary.startswith(("exit", "timed")) and summary != "exit 0"):
            failed = True
            out("\n".join(f"    {line}" for line in tail.splitlines()), sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
