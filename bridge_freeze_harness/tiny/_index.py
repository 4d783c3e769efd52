"""The index of family modules, derived from the modules themselves: no list to edit when a family is added.

Every public module of :mod:`bridge_freeze_harness.tiny` (a name without a leading underscore) is one
family module. Two of its module-level assignments name what it provides, and are read from its source
(a literal, parsed with :mod:`ast`) so that listing names imports no model code:

- ``CONFIGS = {"<tiny config name>": "<provider factory function>", ...}``; absent, the module has one
  configuration named after the module, built by ``make_provider``;
- ``FAMILY = "<registry family name>"``; absent, the module's name.

The rest of the protocol (patches, training, the HF checkpoint recipe, the forward step) is read from the imported
module; see the package docstring. :class:`Declared` collects one of its per-configuration tables (``HF_CHECKPOINTS``,
``NO_HF_CHECKPOINT``, ``FORWARD_STEPS``) from every family module; ``NO_HF_CHECKPOINT`` (reasons, a literal) is read
from the source as ``CONFIGS`` and ``FAMILY`` are, so that listing the families without a checkpoint imports nothing.
``BRIDGE_NEEDS`` (a literal too) says what the installed Bridge must have to build a configuration
(:func:`bridge_lacks`).
"""

from __future__ import annotations

import ast
import functools
import importlib
import pkgutil
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

PACKAGE = "bridge_freeze_harness.tiny"
_DIR = Path(__file__).resolve().parent
#: The module-level literals read from a family module's source.
_LITERALS = ("CONFIGS", "FAMILY", "NO_HF_CHECKPOINT", "BRIDGE_NEEDS")


@dataclass(frozen=True)
class Entry:
    """One tiny configuration: where it lives and which function builds its provider."""

    module: str  # module name under the package
    factory: str  # provider factory function in that module
    family: str  # the registry family the module covers


def _literals(path: Path) -> dict[str, object]:
    """Module-level ``NAME = <literal>`` assignments of :data:`_LITERALS` in ``path``."""
    found: dict[str, object] = {}
    for node in ast.parse(path.read_text(encoding="utf-8"), filename=str(path)).body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name) and target.id in _LITERALS and node.value is not None:
                    found[target.id] = ast.literal_eval(node.value)
    return found


def scan(directory: Path) -> dict[str, Entry]:
    """tiny configuration name -> :class:`Entry`, for every family module (public ``.py`` file) in ``directory``."""
    index: dict[str, Entry] = {}
    for info in sorted(pkgutil.iter_modules([str(directory)]), key=lambda i: i.name):
        if info.name.startswith("_") or info.ispkg:
            continue
        literals = _literals(directory / f"{info.name}.py")
        configs = literals.get("CONFIGS", {info.name: "make_provider"})
        family = str(literals.get("FAMILY", info.name))
        if not isinstance(configs, dict) or not configs:
            raise TypeError(f"{info.name}: CONFIGS must be a non-empty dict literal (name -> factory function)")
        for name, factory in configs.items():
            if name in index:
                raise ValueError(f"tiny configuration {name!r} is declared by {index[name].module} and {info.name}")
            index[name] = Entry(info.name, str(factory), family)
    return index


@functools.cache
def entries() -> dict[str, Entry]:
    """The index of this package's family modules (computed once)."""
    return scan(_DIR)


def entry(name: str) -> Entry:
    try:
        return entries()[name]
    except KeyError:
        raise KeyError(f"no tiny configuration {name!r}; known: {sorted(entries())}") from None


def module_of(name: str) -> ModuleType:
    """The family module that holds tiny configuration ``name``."""
    return importlib.import_module(f"{PACKAGE}.{entry(name).module}")


def module_for_family(family: str) -> ModuleType | None:
    """The family module covering registry family (or tiny configuration) ``family``; ``None`` if none does."""
    if family in entries():
        return module_of(family)
    for item in entries().values():
        if item.family == family:
            return importlib.import_module(f"{PACKAGE}.{item.module}")
    return None


class TinyIndex(Mapping[str, str]):
    """Read-only mapping tiny configuration name -> module name (computed on first use)."""

    def __getitem__(self, name: str) -> str:
        return entry(name).module

    def __iter__(self) -> Iterator[str]:
        return iter(entries())

    def __len__(self) -> int:
        return len(entries())

    def __repr__(self) -> str:
        return f"TinyIndex({dict(self)!r})"


def _source_value(module: str, attr: str) -> ast.expr | None:
    """The value of the last module-level ``attr = ...`` in family module ``module``'s source, unevaluated."""
    path = _DIR / f"{module}.py"
    value = None
    for node in ast.parse(path.read_text(encoding="utf-8"), filename=str(path)).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == attr for t in node.targets):
            value = node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == attr:
            value = node.value
    return value


def cannot_train_reason(name: str) -> str | None:
    """Why tiny configuration ``name`` cannot train on the CPU (its module's ``CANNOT_TRAIN``), or ``None``.

    Read from the module's source where it can be (a string ``CANNOT_TRAIN``, a ``TRAIN_SPECS`` dict display
    with literal keys), so that asking imports no model code; a table built by code is read from the module.
    """
    module = entry(name).module
    reason = _source_value(module, "CANNOT_TRAIN")
    if reason is not None:
        return str(ast.literal_eval(reason))
    specs = _source_value(module, "TRAIN_SPECS")
    if isinstance(specs, ast.Dict) and all(isinstance(key, ast.Constant) for key in specs.keys):
        names = {key.value for key in specs.keys if isinstance(key, ast.Constant)}
    else:
        loaded = module_of(name)
        if getattr(loaded, "CANNOT_TRAIN", None) is not None:
            return str(loaded.CANNOT_TRAIN)
        names = set(getattr(loaded, "TRAIN_SPECS", {}))
    if name not in names:
        return f"the family module {PACKAGE}.{module} declares neither TRAIN_SPECS[{name!r}] nor CANNOT_TRAIN"
    return None


@functools.cache
def declared(attr: str) -> dict[str, Any]:
    """Tiny configuration name -> its value in the dict ``attr`` of its family module, every family module (imported,
    or read from its source for a literal table) that defines ``attr``; a module may declare only its own
    configurations."""
    found: dict[str, Any] = {}
    for module in sorted({item.module for item in entries().values()}):
        if attr in _LITERALS:
            table = _literals(_DIR / f"{module}.py").get(attr, {})
        else:
            table = getattr(importlib.import_module(f"{PACKAGE}.{module}"), attr, {})
        for name, value in table.items():
            if entries().get(name, Entry("", "", "")).module != module:
                raise ValueError(f"{module}.{attr} declares {name!r}, which is not one of its tiny configurations")
            found[name] = value
    return found


class Declared(Mapping[str, Any]):
    """Read-only mapping tiny configuration name -> what its family module declares in its dict ``attr``
    (:func:`declared`, collected on first use)."""

    def __init__(self, attr: str) -> None:
        self.attr = attr

    def __getitem__(self, name: str) -> Any:
        return declared(self.attr)[name]

    def __iter__(self) -> Iterator[str]:
        return iter(declared(self.attr))

    def __len__(self) -> int:
        return len(declared(self.attr))

    def __repr__(self) -> str:
        return f"Declared({self.attr!r}: {sorted(self)!r})"


_ABSENT = object()


class BridgeLacks(RuntimeError):
    """The installed Bridge cannot build a tiny configuration (:func:`bridge_lacks` says why)."""


def present(need: str) -> bool:
    """Whether ``"package.module:Name.attr"`` exists in the installed packages (the part after ``:`` optional).

    A module that is not there, an attribute that is not there or is ``None`` (an optional import that failed)
    is absent; a dataclass field is present whatever its default. An import that fails for another reason than
    the named module's absence raises: that is a bug to see, not a missing feature.
    """
    module, _, path = need.partition(":")
    try:
        found: Any = importlib.import_module(module)
    except ModuleNotFoundError as error:
        if error.name and (module == error.name or module.startswith(error.name + ".")):
            return False
        raise
    for attr in path.split(".") if path else ():
        if attr in getattr(found, "__dataclass_fields__", {}):
            found = getattr(found, attr, None)  # a field: present, whatever its default
            continue
        found = getattr(found, attr, _ABSENT)
        if found is _ABSENT or found is None:
            return False
    return True


def bridge_lacks(name: str) -> str | None:
    """Why the installed Bridge (or a library its model code calls) cannot build tiny configuration ``name``, in
    one line, or ``None``.

    A family module declares ``BRIDGE_NEEDS = {"<config>": {"<need>": "<what it is for>", ...}}`` (a literal):
    each need is ``"module:attr.path"``, or alternatives joined by ``" | "`` (one present is enough); the first
    need with nothing present is the reason. Detected by what exists, never by a version number.
    """
    for need, why in declared("BRIDGE_NEEDS").get(name, {}).items():
        options = [option.strip() for option in need.split("|")]
        if not any(present(option) for option in options):
            return f"the installed Bridge cannot build {name}: no {' or '.join(options)} ({why})"
    return None
