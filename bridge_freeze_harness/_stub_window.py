"""Stub modules that exist only while chosen modules execute: the mechanism behind both harness stubs.

:func:`stub_window_finder` makes a :data:`sys.meta_path` finder for a set of module names. When one of them is
imported, its real loader runs with ``sys.modules`` holding the stub modules ``make_stubs()`` returns (so its
top-level ``import`` finds them); afterwards each stub name is restored to what it was (removed when it was
absent), so every other module keeps seeing no package. :mod:`._te_stub` (TransformerEngine) and
:mod:`._resiliency_stub` (``nvidia_resiliency_ext``) use it. Who imports this package: :mod:`bridge_freeze_harness`.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Callable, Collection, Mapping
from typing import Any

#: Builds a fresh set of stub modules, by module name.
StubFactory = Callable[[], Mapping[str, types.ModuleType]]


class _StubDuringExec(importlib.abc.Loader):
    """The wrapped loader, run with the stubs in ``sys.modules``; the previous entries put back afterwards."""

    def __init__(self, wrapped: importlib.abc.Loader, make_stubs: StubFactory) -> None:
        self._wrapped = wrapped
        self._make_stubs = make_stubs

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self._wrapped.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        stubs = self._make_stubs()
        saved = {name: sys.modules.get(name) for name in stubs}
        sys.modules.update(stubs)
        try:
            self._wrapped.exec_module(module)
        finally:
            for name, previous in saved.items():
                if previous is None:
                    sys.modules.pop(name, None)
                else:
                    sys.modules[name] = previous


class StubWindowFinder(importlib.abc.MetaPathFinder):
    """Finds the modules in ``targets`` on the normal path and wraps their loader in a stub window."""

    def __init__(self, targets: Collection[str], make_stubs: StubFactory) -> None:
        self.targets = frozenset(targets)
        self._make_stubs = make_stubs

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.targets:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _StubDuringExec(spec.loader, self._make_stubs)
        return spec

    def install(self) -> None:
        """Put the finder first on :data:`sys.meta_path` (idempotent)."""
        if self not in sys.meta_path:
            sys.meta_path.insert(0, self)
