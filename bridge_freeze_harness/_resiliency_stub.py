"""A one-name ``nvidia_resiliency_ext`` stand-in that exists only while Bridge's ``training/pretrain.py`` executes.

``megatron/bridge/training/pretrain.py:19`` does ``from nvidia_resiliency_ext.inprocess import CallWrapper``, for
a type annotation only (``_pretrain(..., inprocess_call_wrapper: CallWrapper | None)``). The package cannot be
installed in the CPU environment: the only wheel that installs here (0.4.1; newer ones need glibc 2.39) makes
``import megatron.core`` fail (``dist_checkpointing/strategies/nvrx.py:85`` wants >= 0.6.0).

So, like :mod:`._te_stub`, a :data:`sys.meta_path` finder (:mod:`._stub_window`) wraps exactly that module:
while it executes, ``sys.modules`` holds a stub ``nvidia_resiliency_ext.inprocess`` with one class, ``CallWrapper``;
afterwards the stub is removed again, so every other module's ``try: import nvidia_resiliency_ext...`` still sees
no package. In-process restart (the only user of the real class) stays unavailable, as it is without the package.

Where the real package is importable, :func:`install` does nothing. Who imports this package, and why it is never
on the plugin's runtime path: :mod:`bridge_freeze_harness`.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from typing import Any

from bridge_freeze_harness._stub_window import StubWindowFinder

#: The Bridge module whose top-level code names ``nvidia_resiliency_ext.inprocess.CallWrapper``.
NEEDS_NVRX = "megatron.bridge.training.pretrain"


class CallWrapper:
    """Stand-in for ``nvidia_resiliency_ext.inprocess.CallWrapper`` (only ever used as an annotation here)."""

    def __init__(self, *_args: Any, **_kwargs: Any) -> None:
        raise RuntimeError(
            "nvidia_resiliency_ext is not installed: in-process restart is unavailable in the CPU test environment"
        )


def _make_stub() -> dict[str, types.ModuleType]:
    root = types.ModuleType("nvidia_resiliency_ext")
    root.__path__ = []  # a package, so "nvidia_resiliency_ext.inprocess" resolves
    inprocess = types.ModuleType("nvidia_resiliency_ext.inprocess")
    inprocess.CallWrapper = CallWrapper  # type: ignore[attr-defined]
    root.inprocess = inprocess  # type: ignore[attr-defined]
    return {"nvidia_resiliency_ext": root, "nvidia_resiliency_ext.inprocess": inprocess}


_FINDER = StubWindowFinder({NEEDS_NVRX}, _make_stub)


def real_package_available() -> bool:
    """True when ``nvidia_resiliency_ext`` itself is installed."""
    return importlib.util.find_spec("nvidia_resiliency_ext") is not None


def install() -> None:
    """Install the finder (idempotent). Does nothing where the real package is installed."""
    if _FINDER in sys.meta_path or real_package_available():
        return
    _FINDER.install()
