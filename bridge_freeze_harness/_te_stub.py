"""A TransformerEngine stand-in that exists only while the Bridge modules that import it execute.

``megatron.bridge`` imports ``transformer_engine.pytorch`` unconditionally from two modules
(``peft/lora_layers.py`` and ``models/gpt_full_te_layer_autocast_spec.py``; Bridge 0.6.0 from ``peft/lora.py``
too). Without CUDA the real TransformerEngine cannot load, so on a CPU machine ``import megatron.bridge`` fails.

This module installs a :data:`sys.meta_path` finder (:mod:`._stub_window`) that wraps exactly those modules:
while each one executes, ``sys.modules`` holds a stub ``transformer_engine`` package; afterwards the stub
is removed again. Every other module (megatron-core in particular) keeps seeing no
TransformerEngine, so ``HAVE_TE`` stays ``False`` and the local (pure PyTorch) layers are used.

Where the real TransformerEngine loads, ``install()`` does nothing. :func:`te_placeholders_as_types` (run by the
harness's Bridge import) makes megatron-core's no-TE placeholders for TE classes answer ``isinstance``. Who
imports this package, and why it is never on the plugin's runtime path: :mod:`bridge_freeze_harness`.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from bridge_freeze_harness._stub_window import StubWindowFinder

#: Modules whose top-level code needs ``transformer_engine`` to import (``peft.lora``: Bridge 0.6.0 only, 91a15142;
#: a listed module that imports no TE is unaffected).
NEEDS_TE = frozenset(
    {
        "megatron.bridge.peft.lora_layers",
        "megatron.bridge.peft.lora",
        "megatron.bridge.models.gpt_full_te_layer_autocast_spec",
    }
)
#: megatron-core's module that binds its TE class names to ``MagicMock`` placeholders when TE is absent.
TE_EXTENSION = "megatron.core.extensions.transformer_engine"


class _StubMeta(type):
    """Any attribute of a stub class is another stub class (``te.ops.Sequential`` works)."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        stub = _StubMeta(name, (), {"__module__": "transformer_engine.pytorch"})
        setattr(cls, name, stub)
        return stub


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        stub = _StubMeta(name, (), {"__module__": self.__name__})
        setattr(self, name, stub)
        return stub


def _make_stub() -> dict[str, types.ModuleType]:
    root = _StubModule("transformer_engine")
    root.__path__ = []  # a package, so "transformer_engine.pytorch" resolves
    torch_mod = _StubModule("transformer_engine.pytorch")
    root.pytorch = torch_mod
    return {"transformer_engine": root, "transformer_engine.pytorch": torch_mod}


_FINDER = StubWindowFinder(NEEDS_TE, _make_stub)


def real_transformer_engine_available() -> bool:
    """True when a working TransformerEngine can be imported (a GPU machine)."""
    try:
        import transformer_engine.pytorch  # noqa: F401
    except Exception:  # noqa: BLE001 - any failure means "not usable here"
        return False
    return True


def install() -> None:
    """Install the finder (idempotent). Does nothing where the real TransformerEngine loads."""
    if _FINDER in sys.meta_path or real_transformer_engine_available():
        return
    _FINDER.install()


def te_placeholders_as_types() -> None:
    """Each TE class name megatron-core binds to a ``MagicMock`` instance without TE becomes a ``MagicMock`` subclass.

    Why: Bridge 0.7.0's Qwen3-VL attention asks ``isinstance(core_attention, TEDotProductAttention)`` on the no-TE
    path, and an instance as the second argument raises ``TypeError``; a subclass answers ``False`` (and calling it
    makes a mock, as the instance did). Rebinds the name in megatron-core's module and in every loaded
    ``megatron.*`` module that imported it; later imports get the subclass. A class a loaded module derived from a
    placeholder (megatron-core 0.20's inference linears, which its multi-token-prediction layers ask ``isinstance``
    against) becomes a ``MagicMock`` subclass as well. Does nothing where TE loads.
    """
    import importlib
    from unittest import mock

    extension = importlib.import_module(TE_EXTENSION)
    if getattr(extension, "HAVE_TE", True):
        return
    swaps = {id(value): (name, type(name, (mock.MagicMock,), {"__module__": TE_EXTENSION}))
             for name, value in vars(extension).items()
             if name.startswith("TE") and isinstance(value, mock.NonCallableMock)}
    for module_name, module in list(sys.modules.items()):
        if module is None or not module_name.startswith("megatron"):
            continue
        for name, value in list(vars(module).items()):
            swap = swaps.get(id(value))
            if swap is not None and swap[0] == name:
                setattr(module, name, swap[1])
            elif _derived_from_a_placeholder(value, name, module_name):
                setattr(module, name, type(name, (mock.MagicMock,), {"__module__": module_name, "__qualname__": name}))


def _derived_from_a_placeholder(value: Any, name: str, module_name: str) -> bool:
    """Whether ``value`` is what ``class <name>(<placeholder>): ...`` in ``module_name`` bound.

    Why: megatron-core 0.20 writes ``class InferenceColumnParallelLinear(TEColumnParallelLinear)``, and its
    multi-token-prediction layer asks ``isinstance`` against that class. Over a ``MagicMock`` instance a class
    statement calls ``MagicMock(name, bases, namespace)``: the name is bound to a new instance whose
    ``return_value`` is the class body's namespace. Its ``__qualname__`` and ``__module__`` tell the class apart from
    any other mock. A class derived from such a class is one too.
    """
    from unittest import mock

    if not isinstance(value, mock.NonCallableMock):
        return False
    namespace = vars(value).get("_mock_return_value")
    return (isinstance(namespace, dict) and namespace.get("__qualname__") == name
            and namespace.get("__module__") == module_name)
