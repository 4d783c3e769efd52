"""List every Bridge class that declares or inherits a freeze flag field (``freeze_*``), read from a source tree.

CI has only the pinned Bridge installed; the plugin must still answer for the providers of the commits its users
pin (issue 36, item 3). This script reads a Bridge source tree without importing it (``ast``: class bodies'
annotated ``freeze_*`` fields, bases resolved through each module's ``from ... import``), and writes a JSON
listing that ``tests/unit/families/test_freeze_providers_listing.py`` checks against the plugin's families and
its refusals (``bridge_freeze_plugin/families/unsupported.py``)::

    python scripts/gen_freeze_providers.py --bridge /mirrors/Megatron-Bridge.git@8c46dc42 \\
        --out tests/fixtures/bridge_freeze_providers_8c46dc42.json

A source is a checkout (``src/megatron/bridge`` inside it) or ``GITDIR@COMMIT`` (``git archive``, a bare mirror
will do), as for ``scripts/compat_lane.py``.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compat_lane import materialise, version_of  # a sibling script, not a package

FREEZE = "freeze_"
PROVIDER_BASE = ":ModelProviderMixin"


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root.parent.parent).with_suffix("").parts)  # megatron/bridge/...
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(tree: ast.Module, module: str, is_package: bool) -> dict[str, str]:
    """Local name -> ``module:Name`` for the module's ``from X import Name [as local]``."""
    found: dict[str, str] = {}
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):  # imports under try / if at the top level too
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                found[alias.asname or alias.name] = f"{base}:{alias.name}"
    return found


def scan(root: Path) -> dict[str, dict]:
    """``module:Class`` -> {bases (resolved paths or names), declared freeze fields} for every class in ``root``."""
    classes: dict[str, dict] = {}
    imports: dict[str, dict[str, str]] = {}
    for path in sorted(root.rglob("*.py")):
        module = _module_name(root, path)
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        imports[module] = _imports(tree, module, path.name == "__init__.py")
        for node in tree.body:
            if not isinstance(node, ast.ClassDef):
                continue
            declared = [s.target.id for s in node.body if isinstance(s, ast.AnnAssign)
                        and isinstance(s.target, ast.Name) and s.target.id.startswith(FREEZE)]
            bases = [ast.unparse(b.value if isinstance(b, ast.Subscript) else b) for b in node.bases]  # Mixin[T]
            classes[f"{module}:{node.name}"] = {"module": module, "bases": bases, "declared": declared}
    resolved = {path: [_resolve(b, info["module"], classes, imports) for b in info["bases"]]
                for path, info in classes.items()}
    for path, info in classes.items():
        info["bases"] = resolved[path]
    return classes


def _resolve(name: str, module: str, classes: dict[str, dict], imports: dict[str, dict[str, str]]) -> str:
    """A base class expression as ``module:Class`` where the tree defines it (re-exports followed), else as is."""
    candidate = f"{module}:{name}"
    for _ in range(8):
        if candidate in classes:
            return candidate
        where, _, local = candidate.partition(":")
        target = imports.get(where, {}).get(local)
        if target is None:
            return name
        candidate = target
    return name


def ancestors(path: str, classes: dict[str, dict]) -> list[str]:
    """The in-tree base classes of ``path``, nearest first (depth-first, each once)."""
    seen: list[str] = []
    stack = list(reversed(classes[path]["bases"]))
    while stack:
        base = stack.pop()
        if base in classes and base not in seen:
            seen.append(base)
            stack.extend(reversed(classes[base]["bases"]))
    return seen


def listing(root: Path) -> dict[str, dict]:
    """Each model provider (a ``ModelProviderMixin`` subclass: PEFT's ``VLMLoRA`` has the flags too) with a freeze
    field of its own or inherited: its in-tree ancestors and its fields."""
    classes = scan(root)
    out: dict[str, dict] = {}
    for path in sorted(classes):
        chain = ancestors(path, classes)
        fields = sorted({f for p in [path, *chain] for f in classes[p]["declared"]})
        if fields and any(p.endswith(PROVIDER_BASE) for p in chain):
            out[path] = {"ancestors": chain, "freeze_fields": fields, "declared": classes[path]["declared"]}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bridge", required=True, help="Megatron-Bridge checkout, or GITDIR@COMMIT")
    parser.add_argument("--out", required=True, type=Path)
    options = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "megatron" / "bridge"
        materialise(options.bridge, "src/megatron/bridge", root)
        found = listing(root)
        version = version_of(root / "package_info.py")
    document = {"bridge": options.bridge.rpartition("@")[2] or options.bridge, "version": version,
                "generated_by": "scripts/gen_freeze_providers.py", "classes": found}
    options.out.write_text(json.dumps(document, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    sys.stdout.write(f"{len(found)} classes with a freeze field in Megatron-Bridge {version} -> {options.out}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
