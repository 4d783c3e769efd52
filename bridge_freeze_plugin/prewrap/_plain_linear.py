"""LoRA on a plain ``torch.nn.Linear``: refused before training where the installed Bridge's exports drop it.

Bridge's LoRA wraps a Megatron linear layer (``ColumnParallelLinear``, ``RowParallelLinear``, the TE ones) in an
adapter wrapper that keeps it as ``<target>.to_wrap``; its merged HF export merges those adapters into their base.
What it does with a target that is a plain ``torch.nn.Linear`` (the HF-implemented towers: Qwen2.5-VL's ``visual``,
Qwen2-Audio's ``audio_tower`` and projector, Nemotron Omni's sound encoder...) depends on the Bridge:

- Bridge up to 0.6.2 makes it a bare ``LinearAdapter``: a copy of the layer with ``linear_in`` / ``linear_out`` and
  no ``to_wrap``. The merge skips it (no base to merge into), the adapter-only exports keep ``.adapter.`` weights
  only, and the RL sync follows Bridge's export: the adapters train, and every export writes the tower as loaded.
- Later Bridges (0.7.0) wrap it as ``LoRALinear(to_wrap=<the Linear>, adapter=LinearAdapter)``, as a Megatron
  layer, and their exports carry it.

Which one happened is read from the built model, by structure, never by a version: a ``LinearAdapter`` held as the
``adapter`` of a module whose ``to_wrap`` is a ``torch.nn.Linear`` is carried; any other is bare
(:func:`linear_adapters` names the bare ones). While a flag is set (the plugin is asked),
:func:`check_linear_adapters` runs right after the PEFT hook and raises
:class:`~bridge_freeze_plugin.errors.UnexportableAdapterError` naming the bare ones. ``bridge-freeze check-config``
builds nothing: it refuses the same targets from the family's ``plain_linear`` table (``config/_lora_targets.py``)
unless :func:`bridge_lora_wraps_plain_linear` (Bridge's own ``LoRA.transform`` applied once to a tiny
``torch.nn.Linear``) finds that the installed Bridge keeps it as ``to_wrap``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sys
from collections.abc import Iterator
from typing import Any

from bridge_freeze_plugin.errors import UnexportableAdapterError, some_of
from bridge_freeze_plugin.prewrap._classify import as_chunks
from bridge_freeze_plugin.prewrap._context import BuildContext
from bridge_freeze_plugin.request import INFO, Part, label

#: Bridge's adapter for a plain ``torch.nn.Linear`` (recognised by its class, never by a name).
_LINEAR_ADAPTER = ("megatron.bridge.peft.lora_layers", "LinearAdapter")
#: Bridge's LoRA class (the probe applies its ``transform``).
_LORA = ("megatron.bridge.peft.lora", "LoRA")
_SHOWN = 8
logger = logging.getLogger("bridge_freeze_plugin")


def keeps_linear(wrapper: Any, adapter: Any) -> bool:
    """Whether ``wrapper`` holds ``adapter`` as its ``adapter`` next to a plain ``torch.nn.Linear`` as ``to_wrap``:
    the exported form (Bridge's merge and adapter exports read ``to_wrap`` / ``adapter``)."""
    import torch

    return (wrapper is not None and adapter is not None and getattr(wrapper, "adapter", None) is adapter
            and isinstance(getattr(wrapper, "to_wrap", None), torch.nn.Linear))


def linear_adapters(model: Any) -> list[str]:
    """The names (``chunk i: name`` with several chunks) of the bare ``LinearAdapter`` modules in ``model``: those
    no wrapper holds next to the original layer (``to_wrap``), which no Bridge export carries."""
    adapter = getattr(sys.modules.get(_LINEAR_ADAPTER[0]), _LINEAR_ADAPTER[1], None)
    if adapter is None:
        return []
    chunks = as_chunks(model)
    found = []
    for index, chunk in enumerate(chunks):
        modules = dict(chunk.named_modules())
        for name, module in modules.items():
            if isinstance(module, adapter) and not keeps_linear(modules.get(name.rpartition(".")[0]), module):
                found.append(f"chunk {index}: {name}" if len(chunks) > 1 else name)
    return found


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Bridge's import chatter (its warnings, INFO records, megatron-core's and torch's notes) kept out of what the
    probe's caller shows: a refusal is one line. Records at WARNING and above of the plugin's own logger pass."""
    import io
    import warnings

    names = ("megatron", "torch", "transformers", "py.warnings")
    saved = {name: logging.getLogger(name).level for name in names}
    disabled = logging.root.manager.disable
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):  # a print on import: not the output
        warnings.simplefilter("ignore")
        logging.disable(logging.INFO)  # loggers that set their own INFO level and handler (Bridge's import_utils)
        for name in names:
            logging.getLogger(name).setLevel(logging.ERROR)
        try:
            yield
        finally:
            logging.disable(disabled)
            for name, old in saved.items():
                logging.getLogger(name).setLevel(old)


@functools.cache
def bridge_lora_wraps_plain_linear() -> bool | None:
    """Whether the installed Bridge's LoRA keeps a plain ``torch.nn.Linear`` as ``to_wrap`` (its exports carry the
    adapters), found by applying its ``LoRA.transform`` to a 2x2 ``torch.nn.Linear`` once (nothing is built);
    ``None`` where Bridge's LoRA cannot be imported here (the answer is then unknown)."""
    import importlib

    import torch

    try:
        with _quiet():
            lora_class = getattr(importlib.import_module(_LORA[0]), _LORA[1])
        linear = torch.nn.Linear(2, 2)
        wrapped = lora_class(target_modules=["probe"], dim=1, alpha=1).transform(linear, name="probe", prefix="")
    except Exception as exc:  # noqa: BLE001 - any failure leaves the answer unknown (the caller stays strict)
        logger.debug("bridge-freeze: Bridge's LoRA could not be tried on a torch.nn.Linear: %r", exc)
        return None
    return getattr(wrapped, "to_wrap", None) is linear and keeps_linear(wrapped, getattr(wrapped, "adapter", None))


def check_linear_adapters(model: Any, context: BuildContext, peft: Any, hook_label: str) -> None:
    """Raise :class:`UnexportableAdapterError` if LoRA made any ``LinearAdapter`` (only while a flag is set)."""
    if not context.selection.any_set or context.family is None:
        return
    found = linear_adapters(model)
    if not found:
        return
    family = context.family
    parts = sorted({family.classify(f"{name.rpartition(': ')[2]}.weight") or Part.OTHER for name in found},
                   key=lambda part: part.value)
    shown = some_of(found, _SHOWN)
    where = " and ".join(label(part) if part in INFO else "modules of no part" for part in parts)
    flags = ", ".join(f"{INFO[p].flag}=False" for p in parts if p in INFO)
    lm = family.prefixes(Part.LANGUAGE_MODEL)
    example = f"'{lm[0]}.*linear_qkv'" if lm else "a Megatron linear layer"
    raise UnexportableAdapterError(
        f"{context.asked} with LoRA ({type(peft).__name__}, target_modules={getattr(peft, 'target_modules', None)}, "
        f"hook {hook_label}): {len(found)} LoRA target(s) in the {where} are plain torch.nn.Linear modules "
        f"(HF-implemented), which this Bridge replaced with a bare LinearAdapter (no to_wrap): {shown}. No export of "
        f"this Bridge carries their training (the merged HF export merges only layers kept as to_wrap; the adapter "
        f"exports keep '.adapter.' weights only; the RL sync follows the export), so the trained adapters would be "
        f"lost. Target Megatron linear layers instead (e.g. {example}), or train that part at full rank "
        f"({flags or 'unset its freeze flag'}) with LoRA scoped away from it, or use a Bridge whose LoRA keeps the "
        f"Linear as to_wrap (Megatron-Bridge 0.7.0 does; its exports carry these adapters).",
        found,
    )
