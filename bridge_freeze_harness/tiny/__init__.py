"""Family modules: everything the harness knows about each VLM family, built through Bridge's real providers.

Why this package exists, and who may import it: :mod:`bridge_freeze_harness` (the package docstring).

One module per family (not per tiny configuration: Qwen3.5-VL's dense and MoE configurations share one
module, as they share one registry family, its CPU patches and its forward). Adding a family is adding a
module: the index (:mod:`._index`) is derived from the modules themselves. A family module defines:

- ``CONFIGS`` (optional, a dict literal): tiny configuration name -> the module's function that returns a
  finalized provider of it (tiny sizes: 2 layers, hidden 64, float32, CPU initialisation), called with
  provider fields as keyword overrides. Default: ``{<module name>: "make_provider"}``;
- ``FAMILY`` (optional, a string literal): the plugin registry's family name. Default: the module name;
- ``REAL``: ``True`` when the model is the real Bridge class built through its real provider;
- ``cpu_patches()`` (optional): a context manager with the CPU patches ANY build of the family needs
  without TransformerEngine (TE-only specs or classes swapped for local ones), at any size;
- ``tiny_patches()`` (optional): patches only the tiny configurations need (e.g. offline stand-ins);
- ``forward_patches()`` (optional): patches a forward / backward of the family needs on the CPU;
- ``TRAIN_SPECS`` (a dict: configuration name -> :class:`~bridge_freeze_harness.batches.TrainSpec`), or
  ``CANNOT_TRAIN`` (a one-line string literal: why the family cannot run a forward on the CPU); written as a dict
  display with the names as literal keys, so that which configurations train is read from the source
  (:func:`._index.cannot_train_reason`: the demo's refusals import no model code);
- ``HF_CHECKPOINTS`` (a dict: configuration name -> :class:`~bridge_freeze_harness._hf_configs.HFFamily`, its tiny
  Hugging Face checkpoint recipe), or ``NO_HF_CHECKPOINT`` (a dict literal: configuration name -> why none can be
  written here, read from the source);
  collected by :mod:`bridge_freeze_harness.hf_checkpoint`;
- ``BRIDGE_NEEDS`` (optional, a dict literal: configuration name -> ``{"module:attr.path": "what it is for"}``,
  alternatives joined by ``" | "``): what the installed Bridge must have to build the configuration; where one is
  absent, :func:`make_provider` raises :class:`BridgeLacks` and :func:`bridge_lacks` gives the one-line reason (a
  test skips with it). Only for what an older Bridge lacks (a provider module, a field): the harness adapts where
  it can;
- ``FORWARD_STEPS`` (optional, a dict: configuration name -> the
  :class:`~bridge_freeze_harness.cpu_training.BridgeStep` that trains it in Bridge's loop; default: ``vlm_step``'s),
  collected by :func:`bridge_freeze_harness.cpu_training.forward_step_of`.

A family's other homes: its plugin family module (``bridge_freeze_plugin/families/<vendor>.py``), its entry in the
tests' independent expectations (``tests/unit/_family_parts.py``) and its row in ``docs/families.md``.

Use :func:`build_tiny_model` / :func:`build_tiny_chunks` rather than the modules directly. Listing names
(:data:`TINY_FAMILIES`) reads the modules' sources, not their code: no model code is imported.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import ModuleType
from typing import Any

from bridge_freeze_harness.tiny._index import BridgeLacks, TinyIndex, bridge_lacks, entry, module_of

#: tiny configuration name -> family module name (derived from the modules; read-only).
TINY_FAMILIES: TinyIndex = TinyIndex()


def family_module(name: str) -> ModuleType:
    """The family module that holds tiny configuration ``name`` (``KeyError`` naming the known ones)."""
    return module_of(name)


def is_real(name: str) -> bool:
    return bool(family_module(name).REAL)


@contextlib.contextmanager
def build_context(name: str, device: str = "cpu") -> Iterator[None]:
    """Everything a tiny build of ``name`` needs around ``provide()`` / ``provide_distributed_model()``.

    ``"cpu"``: the generic and the family's any-size CPU patches (:func:`bridge_freeze_harness.cpu_build_context`)
    plus the tiny configuration's own ones. ``"cuda"``: the same without the CPU device patch, or with no spec
    patch at all where TransformerEngine imports
    (:func:`~bridge_freeze_harness.context.device_build_context`).
    """
    from bridge_freeze_harness.context import device_build_context, module_patches

    with device_build_context(name, device), module_patches(family_module(name), "tiny_patches"):
        yield


def make_provider(name: str, device: str = "cpu", **overrides: Any) -> Any:
    """A finalized tiny provider of configuration ``name`` (imports Bridge, brings up the device's runtime).

    ``"cpu"``: gloo and CPU initialisation. ``"cuda"``: NCCL world 1, and ``use_cpu_initialization=False``
    unless ``overrides`` say otherwise (the weights are made on the GPU).
    """
    from bridge_freeze_harness.context import check_device
    from bridge_freeze_harness.cpu_runtime import import_bridge, init_cpu_distributed

    import_bridge()
    if check_device(device) == "cuda":
        from bridge_freeze_harness.gpu_runtime import init_gpu_distributed

        init_gpu_distributed()
        overrides.setdefault("use_cpu_initialization", False)
    else:
        init_cpu_distributed()
    if (lacks := bridge_lacks(name)) is not None:
        raise BridgeLacks(lacks)
    return getattr(family_module(name), entry(name).factory)(**overrides)


def _ensure_pg_collection(provider: Any) -> None:
    from megatron.core.process_groups_config import ProcessGroupCollection

    if getattr(provider, "_pg_collection", None) is None:
        provider._pg_collection = ProcessGroupCollection.use_mpu_process_groups()


def build_tiny_model(name: str, provider: Any = None, device: str = "cpu", **overrides: Any) -> Any:
    """One bare model chunk through ``provider.provide(pre_process=True, post_process=True)``."""
    provider = provider if provider is not None else make_provider(name, device, **overrides)
    with build_context(name, device):
        if family_module(name).REAL:
            _ensure_pg_collection(provider)
        return provider.provide(pre_process=True, post_process=True)


def build_tiny_chunks(name: str, provider: Any = None, **overrides: Any) -> list[Any]:
    """Bare chunks through ``provide_distributed_model(wrap_with_ddp=False, use_cpu_initialization=True)``."""
    provider = provider if provider is not None else make_provider(name, **overrides)
    with build_context(name):
        return provider.provide_distributed_model(
            wrap_with_ddp=False, use_cpu_initialization=True, mixed_precision_wrapper=None
        )
