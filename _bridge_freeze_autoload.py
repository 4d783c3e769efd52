"""bridge-freeze-plugin's start-up hook (loaded by ``bridge_freeze_plugin.pth``; standard library only).

Installing the plugin is enough to activate it: Python runs the ``.pth`` line at interpreter start-up,
which calls :func:`install`. That only adds a small import hook; nothing heavy is imported. When the
process later imports ``megatron.bridge`` (each torchrun rank, each Ray worker), the hook imports
``bridge_freeze_plugin`` and activates it right after ``megatron.bridge`` finished importing.

Opt out with ``BRIDGE_FREEZE_DISABLE_AUTOLOAD=1`` (as ``PYTEST_DISABLE_PLUGIN_AUTOLOAD`` does for
pytest): then only an explicit ``import bridge_freeze_plugin`` activates the plugin.

The post-import machinery here is generic and also used by the plugin for provider modules.
"""

from __future__ import annotations

import os
import sys

# This module runs at every interpreter start-up where the plugin is installed: it imports nothing
# beyond os and sys (already loaded). Annotations are strings; the names below are for type checkers.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import importlib.machinery
    from collections.abc import Callable
    from types import ModuleType
    from typing import Any

ENV_DISABLE = "BRIDGE_FREEZE_DISABLE_AUTOLOAD"
TRIGGER = "megatron.bridge"

#: How ``BRIDGE_FREEZE_DISABLE_AUTOLOAD`` is read (case and surrounding spaces ignored).
TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("", "0", "false", "no", "off")


def autoload_disabled() -> bool:
    """``BRIDGE_FREEZE_DISABLE_AUTOLOAD`` as a boolean: 1/true/yes/on disable, unset/empty/0/false/no/off do not.

    Any other value also disables autoload (the variable was set, so the user meant to opt out), with a
    warning naming the words understood.
    """
    value = os.environ.get(ENV_DISABLE, "").strip().lower()
    if value in TRUE_WORDS:
        return True
    if value in FALSE_WORDS:
        return False
    import warnings

    warnings.warn(
        f"bridge-freeze-plugin: {ENV_DISABLE}={os.environ[ENV_DISABLE]!r} is not a boolean; autoload is disabled. "
        f"Write one of {', '.join(TRUE_WORDS)} to disable it, or one of 0, false, no, off (or unset it) to keep it.",
        RuntimeWarning,
        stacklevel=2,
    )
    return True


class _RunAfterExec:
    """Delegates to the real loader, then runs the module's post-import callbacks."""

    def __init__(self, wrapped: Any, finder: PostImportFinder) -> None:
        self._wrapped = wrapped
        self._finder = finder

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._wrapped.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._wrapped.exec_module(module)
        self._finder.fire(module.__name__, module)

    def __getattr__(self, name: str) -> Any:  # resource readers, get_source, ...
        return getattr(self._wrapped, name)


class PostImportFinder:
    """Runs callbacks once a watched module has finished executing (or at once if already imported)."""

    def __init__(self) -> None:
        self._callbacks: dict[str, list[Callable[[ModuleType], None]]] = {}
        self._finding: set[str] = set()

    def watch(self, name: str, callback: Callable[[ModuleType], None]) -> None:
        module = sys.modules.get(name)
        if module is not None and not getattr(getattr(module, "__spec__", None), "_initializing", False):
            callback(module)
            return
        self._callbacks.setdefault(name, []).append(callback)
        if self not in sys.meta_path:
            sys.meta_path.insert(0, self)

    def fire(self, name: str, module: ModuleType) -> None:
        for callback in self._callbacks.pop(name, []):
            try:
                callback(module)
            except Exception as exc:  # noqa: BLE001 - a plugin bug must never break the host's import
                import warnings

                warnings.warn(f"bridge-freeze-plugin: activation after importing {name} failed: {exc!r}",
                              RuntimeWarning, stacklevel=2)
        if not self._callbacks and self in sys.meta_path:
            sys.meta_path.remove(self)

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self._callbacks or fullname in self._finding:
            return None
        self._finding.add(fullname)
        try:
            spec = None
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
        finally:
            self._finding.discard(fullname)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _RunAfterExec(spec.loader, self)
        return spec


#: The one finder of the process (shared with the plugin).
POST_IMPORT = PostImportFinder()


def _activate(_module: ModuleType) -> None:
    # Importing the plugin activates it once; a later deactivate() by the user is respected here.
    from bridge_freeze_plugin.activation import autoload_activate

    autoload_activate()


def install() -> None:
    """Called from the ``.pth`` line: watch for ``megatron.bridge`` unless opted out."""
    if autoload_disabled():
        return
    POST_IMPORT.watch(TRIGGER, _activate)
