"""Where the plugin imports what: its runtime path stays free of the CPU harness and of heavy libraries, and the
top level is the subsystems (the folders), each behind its face.

``bridge_freeze_harness`` (the CPU harness: TE stub, tiny configs, CPU training) is imported only by the
``bridge-freeze`` command's ``demo`` and ``plan`` (the ``cli`` and ``planning`` packages), lazily inside
functions. The runtime path (everything ``import bridge_freeze_plugin``, activation and a provider build
can reach, following every import, in function bodies too) never reaches it.
No module of ``bridge_freeze_plugin`` imports torch, megatron or transformers at module level: importing
the plugin (which every Megatron-Bridge import does, through activation) stays light.
"""

from __future__ import annotations

import ast
import json
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
    assert {"__init__.py", "activation/_activate.py", "registry.py", "mixins/__init__.py", "mixins/freezable.py",
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
    roots = [PACKAGE / "__init__.py", PACKAGE / "config" / "_validation.py",
             *sorted((PACKAGE / "activation").glob("*.py")), *sorted((PACKAGE / "prewrap").glob("*.py"))]
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


# ---- The top level is the subsystems ----------------------------------------------------------------------------
# Only errors, ranks, the registry (a design home), the former validation module and the package's __init__ stand at
# the top; every other module is in a folder (a subsystem)
# whose __init__.py is its face (``__all__``). Behind the face, modules are ``_``-private, except the family tables
# (data, one public module per vendor, as timm's model modules), cli/__main__.py, and the two modules whose classes'
# paths Bridge writes into run_config.yaml as ``_target_`` (it refuses a path with a private segment). Across folders,
# the library imports only faces (module-level and function-level imports alike); the folders' import graph has no
# circle; a test imports faces, errors, ranks and the top-level package, or the modules of the folder it lives in.
# The checks run on a map of files (path -> source) so that each one is also shown to fail on a planted violation.

PKG = "bridge_freeze_plugin"
TESTS = PACKAGE.parent / "tests"
#: The design's registry home and the former validation module (one line forwarding to config's face) stand there too.
TOP_LEVEL = {"__init__.py", "errors.py", "ranks.py", "registry.py", "validation.py"}
#: mixins/freezable.py holds the classes whose path Bridge writes as ``_target_``; mixins/generated.py and
#: activation/freezable.py are the paths earlier versions wrote, forwarding to it; optim/bridge.py and
#: stages/bridge.py hold classes a Bridge config names as ``_target_`` too.
PUBLIC_BEHIND_FACE = {"cli/__main__.py", "mixins/freezable.py", "mixins/generated.py", "activation/freezable.py",
                      "optim/bridge.py", "stages/bridge.py"}
FAMILY_DATA = ("FAMILIES", "UNSUPPORTED_PROVIDERS")  # what a public module of families/ defines (data only)


def _package_files() -> dict[str, str]:
    return {p.relative_to(PACKAGE).as_posix(): p.read_text() for p in MODULES}


def _test_files() -> dict[str, str]:
    return {p.relative_to(TESTS).as_posix(): p.read_text() for p in sorted(TESTS.rglob("*.py"))}


def _dotted(rel: str) -> str:
    return ".".join((PKG, *Path(rel).with_suffix("").parts)).removesuffix(".__init__")


def _folder(module: str) -> str:
    """The subsystem of a package module: its folder, or the module itself at the top (errors, ranks, the package)."""
    parts = module.split(".")
    return module if len(parts) == 1 or f"{parts[1]}.py" in TOP_LEVEL else parts[1]


def _targets(source: str) -> list[tuple[str, int]]:
    """Every dotted name a module imports, as ``module.name`` for ``from module import name`` (function bodies,
    TYPE_CHECKING blocks and literal ``importlib.import_module`` names included)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found += [(f"{node.module}.{a.name}", node.lineno) for a in node.names]
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and (getattr(node.func, "attr", None) == "import_module"
                   or getattr(node.func, "id", None) == "__import__")):
            found.append((node.args[0].value, node.lineno))
    return found


def _imported_modules(files: dict[str, str], source: str) -> list[tuple[str, int]]:
    """The package modules ``source`` imports: each target cut to its longest prefix that is a module of ``files``."""
    modules = {_dotted(rel) for rel in files}
    out = []
    for target, line in _targets(source):
        parts = target.split(".")
        for end in range(len(parts), 0, -1):
            if ".".join(parts[:end]) in modules:
                out.append((".".join(parts[:end]), line))
                break
    return out


def top_level_offenders(files: dict[str, str]) -> list[str]:
    return sorted(rel for rel in files if "/" not in rel and rel not in TOP_LEVEL)


def public_offenders(files: dict[str, str]) -> list[str]:
    """Modules behind a face with a public name that no rule allows."""
    out = []
    for rel, source in files.items():
        name = rel.rsplit("/", 1)[-1]
        if "/" not in rel or name.startswith("_") or rel in PUBLIC_BEHIND_FACE:
            continue
        if rel.startswith("families/") and rel.count("/") == 1:
            defined = {t.id for n in ast.parse(source).body if isinstance(n, (ast.Assign, ast.AnnAssign))
                       for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Name)}
            if defined & set(FAMILY_DATA):
                continue
        out.append(rel)
    return sorted(out)


def _is_face(module: str) -> bool:
    return module.count(".") == 1 or module == PKG


def private_import_offenders(files: dict[str, str]) -> list[str]:
    """Library imports of another folder's module other than its face (errors, ranks and the package are faces)."""
    out = []
    for rel, source in files.items():
        here = _folder(_dotted(rel))
        for module, line in _imported_modules(files, source):
            if _folder(module) != here and not (_is_face(module) or "/" not in _rel_of(module)):
                out.append(f"{rel}:{line} imports {module}")
    return sorted(out)


def _rel_of(module: str) -> str:
    return "/".join(module.split(".")[1:]) or "__init__"


def folder_graph(files: dict[str, str]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for rel, source in files.items():
        here = _folder(_dotted(rel))
        graph.setdefault(here, set()).update(
            _folder(m) for m, _ in _imported_modules(files, source) if _folder(m) != here)
    return graph


def folder_circle(graph: dict[str, set[str]]) -> list[str]:
    """One circle of the folder graph (the folders in order, the first repeated at the end), or []."""
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = 2
        path.pop()
        return []

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return []


def test_import_offenders(files: dict[str, str], tests: dict[str, str]) -> list[str]:
    """Test imports of a package module other than a face, unless the test lives in that module's folder
    (tests/unit/<folder>/)."""
    out = []
    for rel, source in tests.items():
        parts = rel.split("/")
        home = parts[1] if parts[0] == "unit" and len(parts) > 2 else None
        for module, line in _imported_modules(files, source):
            if not (_is_face(module) or "/" not in _rel_of(module) or _folder(module) == home):
                out.append(f"tests/{rel}:{line} imports {module}")
    return sorted(out)


test_import_offenders.__test__ = False  # a checker, not a test


def test_only_errors_ranks_and_the_package_stand_at_the_top():
    assert not top_level_offenders(_package_files())


def test_behind_each_face_the_modules_are_private():
    assert not public_offenders(_package_files())


def test_the_library_imports_only_faces_across_folders():
    assert not private_import_offenders(_package_files())


def test_the_folder_import_graph_has_no_circle():
    graph = folder_graph(_package_files())
    assert {"request", "families", "prewrap", "activation", "mixins", "config", "planning", "cli",
            f"{PKG}.registry"} <= set(graph)
    assert graph[f"{PKG}.registry"] >= {"families"} and f"{PKG}.registry" not in graph["families"]
    assert graph["families"] >= {"request"} and "families" not in graph["request"]
    assert not folder_circle(graph)


def test_tests_import_faces_or_their_own_folders_modules():
    assert not test_import_offenders(_package_files(), _test_files())


def test_every_face_declares_what_it_hands_on_and_has_it():
    faces = sorted(rel for rel in _package_files() if rel.endswith("/__init__.py"))
    code = (
        "import importlib, json\n"
        f"out = {{}}\nfor name in {[_dotted(f) for f in faces]!r}:\n"
        "    face = importlib.import_module(name)\n"
        "    names = getattr(face, '__all__', None)\n"
        "    out[name] = None if names is None else [n for n in names if not hasattr(face, n)]\n"
        "print(json.dumps(out))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    missing = {face: names for face, names in json.loads(out.stdout).items() if names != []}
    assert not missing, f"faces without __all__ (None) or with names they lack: {missing}"


PLANTED = [
    ("a loose module at the top", top_level_offenders, {"loose.py": ""}, {}, "loose.py"),
    ("a public module behind a face", public_offenders, {"prewrap/helpers.py": ""}, {}, "prewrap/helpers.py"),
    ("machinery named as a family table", public_offenders, {"families/lookup.py": "def f():\n    pass\n"}, {},
     "families/lookup.py"),
    ("another folder's private module, in a function", private_import_offenders,
     {"export/_planted.py": "def f():\n    from bridge_freeze_plugin.prewrap._hooks import HookChain\n"}, {},
     "export/_planted.py:2 imports bridge_freeze_plugin.prewrap._hooks"),
    ("another folder's private module, named through its package", private_import_offenders,
     {"optim/_planted.py": "from bridge_freeze_plugin.prewrap import _freeze\n"}, {},
     "optim/_planted.py:1 imports bridge_freeze_plugin.prewrap._freeze"),
    ("another folder's public module that is not its face", private_import_offenders,
     {"prewrap/_planted.py": "from bridge_freeze_plugin.families.unsupported import UNSUPPORTED_PROVIDERS\n"}, {},
     "prewrap/_planted.py:1 imports bridge_freeze_plugin.families.unsupported"),
    ("a circle between folders", lambda files: folder_circle(folder_graph(files)),
     {"request/_planted.py": "def f():\n    from bridge_freeze_plugin.families import get_family\n"}, {},
     "families"),
    ("a test importing another folder's private module", None,
     {}, {"unit/config/test_planted.py": "from bridge_freeze_plugin.prewrap._hooks import HookChain\n"},
     "tests/unit/config/test_planted.py:1 imports bridge_freeze_plugin.prewrap._hooks"),
]


@pytest.mark.parametrize(("what", "check", "files", "tests", "expected"), PLANTED, ids=[p[0] for p in PLANTED])
def test_each_layout_check_finds_a_planted_violation(what, check, files, tests, expected):
    package = {**_package_files(), **files}
    if check is None:
        found = test_import_offenders(package, {**_test_files(), **tests})
        allowed = test_import_offenders(package, {"unit/prewrap/test_planted.py": tests[next(iter(tests))]})
        assert not allowed  # the same import from a test of that folder is fine
    else:
        found = check(package)
    assert any(expected in item for item in found), (what, found)


def test_every_test_file_has_a_basename_of_its_own():
    """pytest imports test files by basename (no __init__.py in tests/): a second file of the same name fails the
    whole suite's collection ("import file mismatch")."""
    seen: dict[str, list[str]] = {}
    for path in sorted(TESTS.rglob("test_*.py")):
        seen.setdefault(path.name, []).append(path.relative_to(TESTS).as_posix())
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}
