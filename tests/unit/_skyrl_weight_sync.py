"""SkyRL 0.4.0's real weight sources (``skyrl.backends.skyrl_train.weight_sync.sources``) on the CPU.

The module imports vLLM's trainer-side weight contract at its top (``vllm.distributed.weight_transfer.base``:
``ParamMeta``, ``WeightSource``, ``materialize_full_tensor``). vLLM (the inference engine, CUDA wheels) is not
installed for the tests, so where it does not import, that one module is stubbed with those three names, as
vLLM defines them. Nothing else of SkyRL is stubbed: the sources call Bridge's real export.

:func:`skyrl_megatron_worker` imports SkyRL's Megatron worker module (``_build_weight_source``, the seam the docs
use) and its config classes, with the outer layers they import at their top stubbed (:data:`OUTER_LAYERS`) only
while they are imported: afterwards the stubs and the two Bridge names are gone again, so no other test sees them.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Iterator
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


@contextlib.contextmanager
def _vllm_contract_stubbed() -> Iterator[None]:
    """vLLM is the inference engine (an outer layer, CUDA-only wheels): its weight contract stubbed for SkyRL while
    SkyRL's modules are imported (they keep what they imported), removed afterwards; nothing where vLLM imports."""
    try:
        importlib.import_module(VLLM_BASE)
    except ImportError:
        pass
    else:
        yield
        return
    names = ("vllm", "vllm.distributed", "vllm.distributed.weight_transfer", VLLM_BASE)
    for name in names[:-1]:
        sys.modules[name] = types.ModuleType(name)
        sys.modules[name].__path__ = []  # type: ignore[attr-defined]
    base = types.ModuleType(VLLM_BASE)
    base.ParamMeta = ParamMeta  # type: ignore[attr-defined]
    base.WeightSource = WeightSource  # type: ignore[attr-defined]
    base.materialize_full_tensor = lambda tensor: tensor  # type: ignore[attr-defined]  # a plain tensor is full
    sys.modules[VLLM_BASE] = base
    try:
        yield
    finally:
        for name in names:
            sys.modules.pop(name, None)


def skyrl_sources() -> types.ModuleType:
    """SkyRL's ``weight_sync.sources`` (``ImportError`` where SkyRL is not installed)."""
    importlib.import_module("skyrl")
    with _vllm_contract_stubbed():
        return importlib.import_module(SOURCES)


#: What SkyRL's worker and config modules import at their top that is not installed for the tests: why each is stubbed.
OUTER_LAYERS = {
    "ray": "the actor framework SkyRL runs its workers in; here the worker's method is called in-process",
    "vllm": "the inference engine (CUDA-only wheels); nothing of it runs on the trainer side tested here",
    "jaxtyping": "tensor-shape annotations of SkyRL's training batches",
    "orjson": "the JSON codec of SkyRL's HTTP client to the inference servers",
    "pybase64": "the base64 codec of SkyRL's HTTP client to the inference servers",
    "nvidia_resiliency_ext": "async checkpoint saving; its only installable wheel breaks megatron-core here "
    "(bridge_freeze_harness/_resiliency_stub.py)",
}
#: SkyRL 0.4.0's megatron_model_wrapper imports these from megatron.bridge.peft.utils; Bridge 0.6.2 lacks them
#: (SkyRL pins a newer Bridge commit). Expert-parallel LoRA gradient sync: not on the weight-sync path.
SKYRL_BRIDGE_NAMES = ("enable_expert_parallel_grad_sync_in_finalize", "finalize_model_grads_with_expert_adapter_sync")


class _Placeholder:
    """Any attribute, call or subscript of a stubbed outer layer; a decorator returns what it decorates."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return args[0] if len(args) == 1 and not kwargs and callable(args[0]) else _Placeholder()

    def __getattr__(self, name: str) -> Any:
        return _Placeholder()

    def __class_getitem__(cls, item: Any) -> Any:
        return cls

    def __getitem__(self, item: Any) -> Any:
        return _Placeholder()

    def __or__(self, other: Any) -> Any:
        return _Placeholder()

    __ror__ = __or__


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder


class _OuterLayerFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name.partition(".")[0] in OUTER_LAYERS and name != VLLM_BASE:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec: Any) -> Any:
        return _StubModule(spec.name)

    def exec_module(self, module: Any) -> None:
        module.__path__ = []


@contextlib.contextmanager
def _outer_layers_stubbed() -> Iterator[None]:
    import megatron.bridge.peft.utils as peft_utils

    before = set(sys.modules)
    finder = _OuterLayerFinder()
    sys.meta_path.insert(0, finder)
    added = [name for name in SKYRL_BRIDGE_NAMES if not hasattr(peft_utils, name)]
    for name in added:
        setattr(peft_utils, name, _Placeholder())
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
        for name in added:
            delattr(peft_utils, name)
        for name in set(sys.modules) - before:
            if name.partition(".")[0] in OUTER_LAYERS:
                del sys.modules[name]


def skyrl_megatron_worker() -> tuple[types.ModuleType, types.ModuleType]:
    """SkyRL's ``workers.megatron.megatron_worker`` and ``train.config.config`` modules (``ImportError`` where
    SkyRL is not installed); the weight sources first, with vLLM's weight contract as :func:`skyrl_sources` has it."""
    skyrl_sources()
    with _vllm_contract_stubbed(), _outer_layers_stubbed():
        worker = importlib.import_module("skyrl.backends.skyrl_train.workers.megatron.megatron_worker")
        config = importlib.import_module("skyrl.train.config.config")
    return worker, config


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
