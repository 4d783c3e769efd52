"""Sizes (issue 33 part 4): no module over 350 lines and no function over 60 lines, in the folders done so far.

A module's size is its line count; a function's, from its ``def`` line (decorators excluded) to its last line,
docstring included. The folders listed in :data:`FOLDERS` are checked; add a folder once it is split.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAX_MODULE_LINES = 350
MAX_FUNCTION_LINES = 60
FOLDERS = [
    "bridge_freeze_plugin/request",
    "bridge_freeze_plugin/families",
    "bridge_freeze_plugin/mixins",
    "bridge_freeze_plugin/optim",
    "bridge_freeze_plugin/planning",
    "bridge_freeze_plugin/cli",
    "bridge_freeze_plugin/config",
    "bridge_freeze_plugin/export",
    "bridge_freeze_plugin/prewrap",
    "bridge_freeze_plugin/activation",
    "bridge_freeze_plugin/audit",
    "bridge_freeze_plugin/stages",
    "bridge_freeze_plugin/recipes",
    "bridge_freeze_harness",
]
#: The folders still to split; once one complies, move its line to FOLDERS. Every folder is in one of the two lists.
TO_DO: list[str] = []


def _modules(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


def _long_functions(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [f"{node.name} ({node.end_lineno - node.lineno + 1} lines, line {node.lineno})"
            for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]


@pytest.mark.parametrize("folder", FOLDERS)
def test_no_module_over_350_lines(folder):
    long = {str(p.relative_to(ROOT)): n for p in _modules(folder)
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES}
    assert not long, f"split these by job into _-private modules of the same folder: {long}"


@pytest.mark.parametrize("folder", FOLDERS)
def test_no_function_over_60_lines(folder):
    long = {str(p.relative_to(ROOT)): found for p in _modules(folder) if (found := _long_functions(p))}
    assert not long, f"split these functions: {long}"


def test_every_folder_is_checked_or_listed_to_do():
    folders = {str(p.parent.relative_to(ROOT)) for p in (ROOT / "bridge_freeze_plugin").glob("*/__init__.py")}
    folders.add("bridge_freeze_harness")
    assert not set(FOLDERS) & set(TO_DO), "a folder is either checked or still to do"
    assert folders == set(FOLDERS) | set(TO_DO), "add the folder to FOLDERS (or, until it is split, to TO_DO)"
