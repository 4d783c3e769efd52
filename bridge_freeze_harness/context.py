"""Build contexts: what surrounds ``provide()`` on a CPU / meta device, at any size or for a tiny configuration.

Three layers of patches, each undone on exit:

1. generic (:func:`~bridge_freeze_harness.local_specs.cpu_build_patches`): TransformerEngine layer specs and
   classes named by Bridge's model modules resolve to megatron-core's local ones;
2. the family's any-size CPU patches (``cpu_patches()`` of its family module): what ANY build of that family
   needs without TransformerEngine, whatever its configuration;
3. a tiny configuration's own patches (``tiny_patches()``), e.g. Kimi's offline stand-ins for hub remote code.

:func:`cpu_build_context` is 1 + 2 (a full-size build from a real ``config.json``);
:func:`bridge_freeze_harness.tiny.build_context` is 1 + 2 + 3.

On CUDA (:func:`device_build_context` with ``"cuda"``) the CPU device patch of layer 1 never runs: with
TransformerEngine importable nothing is patched (Bridge's own specs); without it, layer 1's TE-to-local swap
(:func:`~bridge_freeze_harness.local_specs.local_spec_patches`) and layer 2 apply, on an NCCL runtime
(:mod:`bridge_freeze_harness.gpu_runtime`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any, Literal

logger = logging.getLogger(__name__)

Device = Literal["cpu", "cuda"]
DEVICES: tuple[Device, ...] = ("cpu", "cuda")


def check_device(device: str) -> Device:
    if device not in DEVICES:
        raise ValueError(f"device {device!r}: the harness builds on one of {', '.join(DEVICES)}")
    return device  # type: ignore[return-value]


def module_patches(module: ModuleType | None, hook: str) -> contextlib.AbstractContextManager[Any]:
    """The context manager a family module's ``hook`` function gives, or a no-op when it has none."""
    factory: Callable[[], contextlib.AbstractContextManager[Any]] | None = getattr(module, hook, None)
    return factory() if factory is not None else contextlib.nullcontext()


@contextlib.contextmanager
def cpu_build_context(family_name: str | None) -> Iterator[None]:
    """Import Bridge, bring up the CPU runtime, and apply the generic + ``family_name``'s any-size CPU patches.

    ``family_name`` is a registry family name (``"qwen35_vl"``) or a tiny configuration name
    (``"qwen35_vl_moe"``); ``None``, or a family the harness has no module for, gets the generic patches
    only. No tiny-configuration patch is applied: this is the context for a real (full-size) build.
    """
    from bridge_freeze_harness.cpu_runtime import import_bridge, init_cpu_distributed
    from bridge_freeze_harness.local_specs import cpu_build_patches
    from bridge_freeze_harness.tiny._index import module_for_family

    import_bridge()
    init_cpu_distributed()
    module = module_for_family(family_name) if family_name is not None else None
    if family_name is not None and module is None:
        logger.debug("no harness module for family %r: generic CPU build patches only", family_name)
    with cpu_build_patches(), module_patches(module, "cpu_patches"):
        yield


@contextlib.contextmanager
def device_build_context(family_name: str | None, device: str = "cpu") -> Iterator[None]:
    """:func:`cpu_build_context` for ``"cpu"``; for ``"cuda"``, the same without any CPU device patch.

    On CUDA: Bridge imported, NCCL world 1 (:func:`~bridge_freeze_harness.gpu_runtime.init_gpu_distributed`);
    where TransformerEngine imports, no patch at all (Bridge's own specs); where it does not, the TE-to-local
    swap and the family's any-size patches, which name no device.
    """
    if check_device(device) == "cpu":
        with cpu_build_context(family_name):
            yield
        return
    from bridge_freeze_harness.cpu_runtime import import_bridge
    from bridge_freeze_harness.gpu_runtime import init_gpu_distributed

    import_bridge()
    init_gpu_distributed()
    with cuda_spec_patches(family_name):
        yield


@contextlib.contextmanager
def cuda_spec_patches(family_name: str | None) -> Iterator[None]:
    """The spec patches of a CUDA build, and no runtime: nothing where TE imports, else the TE-to-local swap
    and the family's any-size patches. Around Bridge's own loop (:mod:`~bridge_freeze_harness.gpu_training`)."""
    from bridge_freeze_harness.gpu_runtime import announce_specs
    from bridge_freeze_harness.local_specs import local_spec_patches
    from bridge_freeze_harness.tiny._index import module_for_family

    if announce_specs() == "transformer_engine":
        yield
        return
    module = module_for_family(family_name) if family_name is not None else None
    with local_spec_patches(), module_patches(module, "cpu_patches"):
        yield
