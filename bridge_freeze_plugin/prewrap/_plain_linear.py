"""LoRA on a plain ``torch.nn.Linear`` trains adapters that no Bridge export carries: refused before training.

Bridge's LoRA wraps a Megatron linear layer (``ColumnParallelLinear``, ``RowParallelLinear``, the TE ones) in an
adapter wrapper that keeps it as ``<target>.to_wrap``; its merged HF export merges those adapters into their base.
A target that is a plain ``torch.nn.Linear`` (the HF-implemented towers: Qwen2.5-VL's ``visual``, Qwen2-Audio's
``audio_tower`` and projector, Nemotron Omni's sound encoder...) becomes ``LinearAdapter`` instead: a copy of the
layer with ``linear_in`` / ``linear_out`` and no ``to_wrap``. The merge skips it (no base to merge into), the
adapter-only exports keep ``.adapter.`` weights only, and the RL sync follows Bridge's export: the adapters train,
and every export writes the tower as it was loaded.

While a flag is set (the plugin is asked), :func:`check_linear_adapters` runs right after the PEFT hook and raises
:class:`~bridge_freeze_plugin.errors.UnexportableAdapterError` naming the modules; ``bridge-freeze check-config``
refuses the same targets from the family's ``plain_linear`` table (``config/_lora_targets.py``).
"""

from __future__ import annotations

import sys
from typing import Any

from bridge_freeze_plugin.errors import UnexportableAdapterError, some_of
from bridge_freeze_plugin.prewrap._classify import as_chunks
from bridge_freeze_plugin.prewrap._context import BuildContext
from bridge_freeze_plugin.request import INFO, Part, label

#: Bridge's adapter for a plain ``torch.nn.Linear`` (recognised by its class, never by a name).
_LINEAR_ADAPTER = ("megatron.bridge.peft.lora_layers", "LinearAdapter")
_SHOWN = 8


def linear_adapters(model: Any) -> list[str]:
    """The names (``chunk i: name`` with several chunks) of the ``LinearAdapter`` modules in ``model``."""
    adapter = getattr(sys.modules.get(_LINEAR_ADAPTER[0]), _LINEAR_ADAPTER[1], None)
    if adapter is None:
        return []
    chunks = as_chunks(model)
    found = []
    for index, chunk in enumerate(chunks):
        for name, module in chunk.named_modules():
            if isinstance(module, adapter):
                found.append(f"chunk {index}: {name}" if len(chunks) > 1 else name)
    return found


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
        f"(HF-implemented), which Bridge wraps as LinearAdapter: {shown}. No Bridge export carries their training "
        f"(the merged HF export merges only Megatron layers wrapped with to_wrap; the adapter exports keep "
        f"'.adapter.' weights only; the RL sync follows the export), so the trained adapters would be lost. Target "
        f"Megatron linear layers instead (e.g. {example}), or train that part at full rank "
        f"({flags or 'unset its freeze flag'}) with LoRA scoped away from it.",
        found,
    )
