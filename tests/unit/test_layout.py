"""Where the plugin imports what: its runtime path stays free of the CPU harness and of heavy libraries.

``bridge_freeze_harness`` (the CPU harness: TE stub, tiny configs, CPU training) is imported only by the
``bridge-freeze`` command's ``demo`` and ``plan`` (the ``cli`` and ``planning`` packages), lazily inside
functions. The runtime path (everything ``import bridge_freeze_plugin``, activation and a provider build
can reach, following every import, in function bodies too) never reaches it.
No module of ``bridge_freeze_plugin`` imports torch, megatron or transformers at module level: importing
the plugin (which every Megatron-Bridge import does, through activation) stays light.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "bridge_freeze_plugin"
TESTING = "bridge_freeze_harness"
#: The only modules that may import the harness (the command's demo and plan), and only inside a function body.
TESTING_IMPORTERS_UNDER = ("cli/", "planning/")
HEAVY = ("torch", "megatron", "transformers")


@dataclass(frozen=True)
class Import:
    module: str  # the imported module's dotted name ("" for a relative "from . import x")
    line: int
    in_function: bool  # inside a def / lambda body: runs only when called
    type_checking: bool  # under "if TYPE_CHECKING:": never runs


def _imports(tree: ast.AST) -> list[Import]:
    found: list[Import] = []

    def visit(node: ast.AST, in_function: bool, type_checking: bool) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            in_function = True
        if isinstance(node, ast.Import):
            found.extend(Import(a.name, node.lineno, in_function, type_checking) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            found.append(Import("" if node.level else (node.module or ""), node.lineno, in_function, type_checking))
        elif (  # importlib.import_module("x") / __import__("x") with a literal name
            isinstance(node, ast.Call)
            and (getattr(node.func, "attr", None) == "import_module" or getattr(node.func, "id", None) == "__import__")
            and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
        ):
            found.append(Import(node.args[0].value, node.lineno, in_function, type_checking))
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:  # only the body never runs; an else branch does
                visit(child, in_function, True)
            for child in node.orelse:
                visit(child, in_function, type_checking)
            return
        for child in ast.iter_child_nodes(node):
            visit(child, in_function, type_checking)

    visit(tree, False, False)
    return found


def _top(module: str) -> str:
    return module.split(".")[0]


MODULES = sorted(PACKAGE.rglob("*.py"))


def test_the_package_modules_are_found():
    names = {p.relative_to(PACKAGE).as_posix() for p in MODULES}
    assert {"__init__.py", "activation/_activate.py", "families/_registry.py", "activation/freezable.py",
            "prewrap/_pipeline.py"} <= names


def test_the_import_scanner_tells_module_level_from_function_bodies():
    tree = ast.parse(
        "import torch\n"
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    import megatron.core\nelse:\n    import megatron.bridge\n"
        "class A:\n    from bridge_freeze_harness import tiny\n"
        "def f():\n    from bridge_freeze_harness.tiny import build\n"
        "    importlib.import_module('transformers')\n"
    )
    seen = {(i.module, i.in_function, i.type_checking) for i in _imports(tree)}
    assert seen == {
        ("torch", False, False),
        ("typing", False, False),
        ("megatron.core", False, True),
        ("megatron.bridge", False, False),  # the else branch runs
        ("bridge_freeze_harness", False, False),  # a class body runs at import: module level
        ("bridge_freeze_harness.tiny", True, False),
        ("transformers", True, False),
    }


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.relative_to(PACKAGE).as_posix())
def test_test_support_only_in_cli_and_plan_and_only_inside_functions(path):
    rel = path.relative_to(PACKAGE).as_posix()
    uses = [i for i in _imports(ast.parse(path.read_text(), str(path))) if _top(i.module) == TESTING]
    if not rel.startswith(TESTING_IMPORTERS_UNDER):
        assert not uses, f"{rel} imports {TESTING} (lines {[i.line for i in uses]}); only the CLI's demo / plan may"
    at_module_level = [i.line for i in uses if not i.in_function]
    assert not at_module_level, f"{rel} imports {TESTING} at module level, lines {at_module_level}"


def test_the_command_does_import_the_harness_lazily():
    # The rule above is about the command: if it stopped importing the harness, the rule would be stale.
    uses = [
        i
        for path in MODULES
        if path.relative_to(PACKAGE).as_posix().startswith(TESTING_IMPORTERS_UNDER)
        for i in _imports(ast.parse(path.read_text()))
        if _top(i.module) == TESTING
    ]
    assert uses and all(i.in_function for i in uses)


def _module_of(path: Path) -> str:
    parts = ("bridge_freeze_plugin", *path.relative_to(PACKAGE).with_suffix("").parts)
    return ".".join(parts).removesuffix(".__init__")


def _resolve(module: str) -> Path | None:
    if not module.startswith("bridge_freeze_plugin"):
        return None
    if module == "bridge_freeze_plugin":
        return PACKAGE / "__init__.py"
    rel = Path(*module.split(".")[1:])
    for candidate in (PACKAGE / rel.with_suffix(".py"), PACKAGE / rel / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _runtime_closure() -> dict[str, set[str]]:
    """Every plugin module the runtime reaches (all imports followed, function bodies included)."""
    roots = [PACKAGE / "__init__.py", PACKAGE / "validation.py", *sorted((PACKAGE / "activation").glob("*.py")),
             *sorted((PACKAGE / "prewrap").glob("*.py"))]
    seen: dict[str, set[str]] = {}
    stack = [p for p in roots if p.is_file()]
    while stack:
        path = stack.pop()
        name = _module_of(path)
        if name in seen:
            continue
        imported = {i.module for i in _imports(ast.parse(path.read_text(), str(path))) if not i.type_checking}
        seen[name] = imported
        for module in imported:
            parts = module.split(".")
            for end in range(len(parts), 0, -1):  # "a.b.c" may be a module, or names in "a.b"
                found = _resolve(".".join(parts[:end]))
                if found is not None:
                    stack.append(found)
                    break
    return seen


def test_no_runtime_module_reaches_the_harness_by_any_import():
    closure = _runtime_closure()
    assert {"bridge_freeze_plugin.prewrap._pipeline", "bridge_freeze_plugin.activation"} <= set(closure)
    offenders = {m for m, imported in closure.items() if any(_top(i) == TESTING for i in imported)}
    assert not offenders, f"runtime modules importing {TESTING}: {sorted(offenders)}"
    command = {m for m in closure if m.startswith(("bridge_freeze_plugin.cli", "bridge_freeze_plugin.plan"))}
    assert not command, f"the runtime path reaches the command's modules: {sorted(command)}"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.relative_to(PACKAGE).as_posix())
def test_no_heavy_import_at_module_level(path):
    rel = path.relative_to(PACKAGE).as_posix()
    heavy = [
        (i.module, i.line)
        for i in _imports(ast.parse(path.read_text(), str(path)))
        if _top(i.module) in HEAVY and not i.in_function and not i.type_checking
    ]
    assert not heavy, f"{rel} imports {heavy} at module level; import them inside the function that needs them"


def test_importing_every_plugin_module_loads_no_test_support_nor_heavy_library():
    modules = ["bridge_freeze_plugin." + ".".join(p.relative_to(PACKAGE).with_suffix("").parts) for p in MODULES]
    modules = [m.removesuffix(".__init__") for m in modules if not m.endswith(".__main__")]  # __main__ runs the CLI
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "import bridge_freeze_plugin\n"
        "bridge_freeze_plugin.list_families()\n"
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & {{{TESTING!r}, *{HEAVY!r}}}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout
