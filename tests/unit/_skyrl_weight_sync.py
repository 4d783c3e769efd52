"""SkyRL 0.4.0's real weight sources (``skyrl.backends.skyrl_train.weight_sync.sources``) on the CPU.

The module imports vLLM's trainer-side weight contract at its top (``vllm.distributed.weight_transfer.base``:
``ParamMeta``, ``WeightSource``, ``materialize_full_tensor``). vLLM (the inference engine, CUDA wheels) is not
installed for the tests, so where it does not import, that one module is stubbed with those three names, as
vLLM defines them. Nothing else of SkyRL is stubbed: the sources call Bridge's real export.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any, NamedTuple

SOURCES = "skyrl.backends.skyrl_train.weight_sync.sources"
VLLM_BASE = "vllm.distributed.weight_transfer.base"


class ParamMeta(NamedTuple):
    """vLLM's ``ParamMeta``: one tensor of a source's declared stream."""

    name: str
    dtype: Any
    shape: tuple[int, ...]


class WeightSource:
    """vLLM's ``WeightSource`` base: ``metadata()`` and ``__iter__`` (subclasses define both)."""


def _stub_vllm_weight_transfer() -> None:
    """vLLM is the inference engine (an outer layer, CUDA-only wheels): its weight contract stubbed for SkyRL."""
    for name in ("vllm", "vllm.distributed", "vllm.distributed.weight_transfer"):
        module = sys.modules.setdefault(name, types.ModuleType(name))
        module.__path__ = []  # type: ignore[attr-defined]
    base = types.ModuleType(VLLM_BASE)
    base.ParamMeta = ParamMeta  # type: ignore[attr-defined]
    base.WeightSource = WeightSource  # type: ignore[attr-defined]
    base.materialize_full_tensor = lambda tensor: tensor  # type: ignore[attr-defined]  # a plain tensor is full
    sys.modules[VLLM_BASE] = base


def skyrl_sources() -> types.ModuleType:
    """SkyRL's ``weight_sync.sources`` (``ImportError`` where SkyRL is not installed)."""
    importlib.import_module("skyrl")
    try:
        importlib.import_module(VLLM_BASE)
    except ImportError:
        _stub_vllm_weight_transfer()
    return importlib.import_module(SOURCES)


def layout(stream: Any) -> list[tuple[str, tuple[int, ...], str]]:
    """``(name, shape, dtype)`` of each tensor of a ``(name, tensor)`` stream, in order (plain data)."""
    return [(name, tuple(tensor.shape), str(tensor.dtype)) for name, tensor in stream]


def meta_layout(metadata: Any) -> list[tuple[str, tuple[int, ...], str]]:
    """The same for a source's ``metadata()`` (``ParamMeta(name, dtype, shape)`` items)."""
    return [(meta.name, tuple(meta.shape), str(meta.dtype)) for meta in metadata]


def info_layout(info: dict[str, Any]) -> list[tuple[str, tuple[int, ...], str]]:
    """The same for ``trainable_hf_weights_info``'s ``name -> (shape, dtype)``."""
    return [(name, tuple(shape), str(dtype)) for name, (shape, dtype) in info.items()]


def same_stream(a: list[tuple[str, Any]], b: list[tuple[str, Any]]) -> bool:
    """Same names in the same order, same dtypes and values (bit for bit)."""
    return [n for n, _ in a] == [n for n, _ in b] and all(
        x.dtype == y.dtype and x.equal(y) for (_, x), (_, y) in zip(a, b, strict=True)
    )
