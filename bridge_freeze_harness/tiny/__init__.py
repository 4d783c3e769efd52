"""Tiny configurations of every VLM family the plugin covers, built through Bridge's real providers.

Each family has one module here, named after the family, that defines:

- ``make_provider(**overrides)``: a finalized Bridge provider with a tiny configuration
  (2 layers, hidden 64, float32, CPU initialisation); ``overrides`` are provider fields.
- ``REAL``: ``True`` when the model is the real Bridge class built through its real provider;
  ``False`` for a structural stand-in (same module names), in which case ``STAND_IN_REASON`` says why.
- optionally ``build_patches()``: a context manager with extra CPU patches that family needs
  while ``provide()`` runs (on top of :func:`~bridge_freeze_harness.local_specs.cpu_build_patches`).

Use :func:`build_tiny_model` / :func:`build_tiny_chunks` rather than the modules directly.
Modules are imported lazily, by name, so listing families imports no model code.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from types import ModuleType
from typing import Any

#: family name -> module (under this package) with its tiny configuration.
TINY_FAMILIES: dict[str, str] = {
    "qwen25_vl": "qwen25_vl",
    "qwen3_vl": "qwen3_vl",
    "qwen3_vl_moe": "qwen3_vl_moe",
    "qwen35_vl": "qwen35_vl",
    "qwen35_vl_moe": "qwen35_vl_moe",
    "glm45v": "glm45v",
    "gemma3_vl": "gemma3_vl",
    "gemma4_vl": "gemma4_vl",
    "nemotron_vl": "nemotron_vl",
    "ernie45_vl": "ernie45_vl",
    "ministral3": "ministral3",
    "kimi_k25_vl": "kimi_k25_vl",
    "minimax_m3_vl": "minimax_m3_vl",
    "step37": "step37",
    "exaone45_vl": "exaone45_vl",
}


def family_module(family: str) -> ModuleType:
    try:
        mod = TINY_FAMILIES[family]
    except KeyError:
        raise KeyError(f"no tiny configuration for family {family!r}; known: {sorted(TINY_FAMILIES)}") from None
    return importlib.import_module(f"{__name__}.{mod}")


def is_real(family: str) -> bool:
    return bool(family_module(family).REAL)


@contextlib.contextmanager
def build_context(family: str) -> Iterator[None]:
    """Everything needed around ``provide()`` / ``provide_distributed_model()`` on the CPU."""
    from bridge_freeze_harness.cpu_runtime import import_bridge, init_cpu_distributed
    from bridge_freeze_harness.local_specs import cpu_build_patches

    import_bridge()
    init_cpu_distributed()
    module = family_module(family)
    extra = getattr(module, "build_patches", None)
    with cpu_build_patches(), (extra() if extra else contextlib.nullcontext()):
        yield


def make_provider(family: str, **overrides: Any) -> Any:
    """A finalized tiny provider of ``family`` (imports Bridge, inits the CPU runtime)."""
    from bridge_freeze_harness.cpu_runtime import import_bridge, init_cpu_distributed

    import_bridge()
    init_cpu_distributed()
    return family_module(family).make_provider(**overrides)


def _ensure_pg_collection(provider: Any) -> None:
    from megatron.core.process_groups_config import ProcessGroupCollection

    if getattr(provider, "_pg_collection", None) is None:
        provider._pg_collection = ProcessGroupCollection.use_mpu_process_groups()


def build_tiny_model(family: str, provider: Any = None, **overrides: Any) -> Any:
    """One bare model chunk through ``provider.provide(pre_process=True, post_process=True)``."""
    provider = provider if provider is not None else make_provider(family, **overrides)
    with build_context(family):
        if family_module(family).REAL:
            _ensure_pg_collection(provider)
        return provider.provide(pre_process=True, post_process=True)


def build_tiny_chunks(family: str, provider: Any = None, **overrides: Any) -> list[Any]:
    """Bare chunks through ``provide_distributed_model(wrap_with_ddp=False, use_cpu_initialization=True)``."""
    provider = provider if provider is not None else make_provider(family, **overrides)
    with build_context(family):
        return provider.provide_distributed_model(
            wrap_with_ddp=False, use_cpu_initialization=True, mixed_precision_wrapper=None
        )
