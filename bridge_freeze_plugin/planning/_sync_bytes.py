"""What one RL weight sync sends, from the plan's meta build: Bridge's HF export, full and trainable-only, in bytes.

An RL trainer pushes the policy to its inference engine with ``AutoBridge.export_hf_weights(model)`` (every HF
tensor) or with :func:`bridge_freeze_plugin.export_trainable_hf_weights` (the HF tensors that can have changed;
``docs/rl-weight-sync.md``). :func:`sync_bytes` sizes both streams on the model ``bridge-freeze plan`` built on
the meta device, with Bridge's own export: nothing of Bridge's conversion is re-implemented and no tensor holds
data.

1. The bridge sees, instead of a checkpoint, the tensor listing (names and shapes, meta tensors) that
   transformers' own model class for the config writes with ``save_pretrained`` (:func:`.sync_layout.bridge_for_plan`):
   Bridge's export depends on the checkpoint (mappings whose HF tensors it lacks are left out, routed experts
   are written fused or one tensor per expert as it stores them, a tied output layer only if it has one).
2. Bridge's conversion tasks for the meta model, built as its export builds them (``build_conversion_tasks``),
   with the sync's dtype recorded on each task (``weight_dtype``). Routed experts that the CPU build holds as
   ``SequentialMLP`` and Bridge maps only under their grouped-GEMM names get their task under that name
   (:func:`.sync_tasks.sequential_expert_tasks`).
3. :func:`bridge_freeze_plugin.export.trainable_conversion_tasks` keeps the tasks whose HF tensors can change:
   parameters with ``requires_grad``, LoRA-wrapped bases whose adapters train (merged by the export), a MoE
   router's expert bias that megatron-core updates, each with every task it shares an HF tensor with.
4. Bridge's ``export_hf_weights`` runs twice on the meta model: once over the kept tasks, once over the others
   (the two are unions of whole groups of linked tasks, so together they are exactly the full export). Each
   yields meta tensors of the exported HF shapes and dtype; their ``numel * element_size`` add up to the bytes.

The dtype: Bridge's export yields each HF tensor in the dtype the trainer holds its Megatron tensor in (bf16
weights under bf16 mixed precision) unless ``weight_dtype=`` casts every floating-point tensor to one dtype. The
plan counts every floating-point HF tensor in the plan's weight dtype (``--param-dtype``, bf16 by default): what
``export_hf_weights(model, weight_dtype=<that dtype>)`` sends, and what the default export of a model trained
in that dtype sends, except a MoE router's expert bias, which megatron-core keeps in fp32 (the default export
sends it in 4 bytes per expert and layer, the plan counts it in the weight dtype).

Cost: on a 235B-A22B model (25,000 conversion tasks) a few seconds of CPU, most of it Bridge's own task building
and per-task conversion on meta tensors (docs/cli.md has the measurement).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from bridge_freeze_plugin.errors import BridgeFreezeError, PlanError
from bridge_freeze_plugin.planning._sync_layout import add_mapped_names, bridge_for_plan
from bridge_freeze_plugin.planning._sync_tasks import export_size, left_out, pg_collection_once, sequential_expert_tasks

logger = logging.getLogger(__name__)

__all__ = ["TINY_UNAVAILABLE", "SyncBytes", "bridge_for_plan", "describe", "plan_sync", "sync_bytes", "torch_dtype"]

#: The plan's dtype names (``--param-dtype``) -> torch dtype attribute names.
_TORCH_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


@dataclass(frozen=True)
class SyncBytes:
    """The bytes and HF tensors one weight sync sends: Bridge's full export, and its trainable-only part."""

    #: the export dtype (torch's name: ``bfloat16``, ``float16``, ``float32``)
    dtype: str
    full_bytes: int
    trainable_bytes: int
    tensors: int
    trainable_tensors: int
    #: wall time of the sizing (in the text line; not in the JSON document)
    seconds: float = 0.0
    #: Megatron parameters of the model that no HF tensor of the export carries (Bridge has no mapping for
    #: them, or the checkpoint layout lacks the HF tensors it maps them to): their tensors and elements, and the
    #: first name (in the text line)
    left_out_tensors: int = 0
    left_out_parameters: int = 0
    left_out_first: str = ""
    #: how many of the left-out tensors train (their training would never reach the inference engine)
    left_out_trainable: int = 0

    @property
    def ratio(self) -> float:
        """``trainable_bytes / full_bytes`` (0.0 for an export with no bytes)."""
        return self.trainable_bytes / self.full_bytes if self.full_bytes else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "dtype": self.dtype,
            "full_bytes": self.full_bytes,
            "trainable_bytes": self.trainable_bytes,
            "ratio": self.ratio,
            "tensors": self.tensors,
            "trainable_tensors": self.trainable_tensors,
            "left_out_tensors": self.left_out_tensors,
            "left_out_parameters": self.left_out_parameters,
        }

    def describe(self) -> str:
        """One line: the two streams' bytes and tensors."""
        return (
            f"one RL weight sync ({self.dtype}): full {_si_bytes(self.full_bytes)} in {self.tensors:,} HF tensors "
            f"(export_hf_weights), trainable {_si_bytes(self.trainable_bytes)} in {self.trainable_tensors:,} "
            f"(export_trainable_hf_weights, {_percent(self.ratio)} of full); sized in {self.seconds:.1f} s"
            + (f"; not sent: {self.left_out_parameters:,} parameters in {self.left_out_tensors:,} Megatron tensors "
               f"that Bridge's export maps to no HF tensor of this layout (first: {self.left_out_first})"
               if self.left_out_tensors else "")
            + (f", {self.left_out_trainable:,} of which TRAIN: their training would never reach the inference "
               f"engine (export_trainable_hf_weights refuses such a model)" if self.left_out_trainable else "")
        )


def describe(sync: SyncBytes | None, unavailable: str | None) -> str:
    """The plan's text line about the weight sync: the figures, or why there are none."""
    if sync is not None:
        return sync.describe()
    return f"one RL weight sync: not sized ({unavailable})"


def _percent(ratio: float) -> str:
    return f"{100.0 * ratio:.2f}%" if ratio >= 0.0001 or ratio == 0.0 else f"{100.0 * ratio:.2g}%"


def _si_bytes(n: int) -> str:
    """``471.3 GB (439.0 GiB)``: decimal units, as transfer sizes are quoted, and the table's binary ones."""
    if n < 1000:
        return f"{n} B"
    return f"{_scaled(n, 1000, ('kB', 'MB', 'GB', 'TB'))} ({_scaled(n, 1024, ('KiB', 'MiB', 'GiB', 'TiB'))})"


def _scaled(n: int, base: int, units: tuple[str, ...]) -> str:
    value = n / base
    for unit in units[:-1]:
        if value < base:
            return f"{value:.1f} {unit}"
        value /= base
    return f"{value:.1f} {units[-1]}"


def torch_dtype(name: str) -> Any:
    """The torch dtype of a plan dtype name (``bf16`` / ``fp16`` / ``fp32``) or of a torch name (``bfloat16``)."""
    import torch

    attr = _TORCH_DTYPES.get(name, name)
    dtype = getattr(torch, attr, None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise PlanError(f"the weight-sync dtype must be one of {', '.join(_TORCH_DTYPES)}, got {name!r}")
    return dtype


#: Why a ``--tiny`` plan has no sync figure.
TINY_UNAVAILABLE = (
    "a --tiny plan builds the project's tiny test configuration, which is not converted from an HF config, so "
    "Bridge has no HF layout to export it to; plan --hf-config PATH sizes the sync"
)


def plan_sync(hf_config: Any | None, model: Any, dtype: str) -> tuple[SyncBytes | None, str | None]:
    """The sync figures of a plan's meta build, or ``(None, why not)``: ``hf_config`` is the HF config the
    model was converted from (``None`` for a ``--tiny`` plan). A failure of Bridge's export on the meta device
    is logged as a warning and returned as the reason; the plan's other figures stand without it."""
    if hf_config is None:
        return None, TINY_UNAVAILABLE
    try:
        return sync_bytes(bridge_for_plan(hf_config), model, dtype), None
    except PlanError as exc:
        logger.warning("%s", exc)
        return None, str(exc)


def sync_bytes(bridge: Any, model: Any, dtype: str = "bf16", *, merge_adapter_weights: bool = True) -> SyncBytes:
    """The bytes of one weight sync of ``model`` (chunks built on the meta device, the selection applied).

    ``bridge``: the ``AutoBridge`` the model converts with (:func:`bridge_for_plan`); ``dtype``: the export
    dtype (``bf16`` / ``fp16`` / ``fp32``, or torch's names); ``merge_adapter_weights``: as in Bridge's export
    (with merging off, LoRA bases are exported as loaded and are not counted as trainable).
    Needs the single-process runtime the plan's build runs in (a world of one rank).
    """
    from megatron.bridge.models.conversion.utils import unwrap_model

    started = time.perf_counter()
    weight_dtype = torch_dtype(dtype)
    chunks = unwrap_model(model if isinstance(model, list) else [model])
    try:
        (trainable_bytes, trainable_tensors), (rest_bytes, rest_tensors), missing = _measure(
            bridge, chunks, weight_dtype, merge_adapter_weights)
    except BridgeFreezeError:
        raise
    except Exception as exc:  # Bridge's export of this model on the meta device: one readable line
        from bridge_freeze_plugin.planning._model_choice import error_line

        config_only = getattr(getattr(bridge.hf_pretrained, "state", None), "source", None) is None
        why = (" (Bridge had the config only: transformers has no model class for it that lists the checkpoint's "
               "tensors)") if config_only else ""
        raise PlanError(
            f"sizing the weight sync of {type(chunks[0]).__name__} ({_describe(bridge)}) with Megatron-Bridge's "
            f"export on the meta device failed{why}: {error_line(exc)}; the other plan figures do not depend on it"
        ) from exc
    result = SyncBytes(
        dtype=str(weight_dtype).removeprefix("torch."),
        full_bytes=trainable_bytes + rest_bytes,
        trainable_bytes=trainable_bytes,
        tensors=trainable_tensors + rest_tensors,
        trainable_tensors=trainable_tensors,
        seconds=time.perf_counter() - started,
        left_out_tensors=len(missing),
        left_out_parameters=sum(missing.values()),
        left_out_first=min(missing, default=""),
        left_out_trainable=sum(p.requires_grad for n, p in chunks[0].named_parameters() if n in missing)
        if len(chunks) == 1 else 0,
    )
    if missing:
        logger.debug("weight sync not sent: %s", sorted(missing))
    logger.debug("weight sync sized in %.2f s: %s", result.seconds, result.describe())
    return result


def _describe(bridge: Any) -> str:
    pretrained = getattr(bridge, "hf_pretrained", None)
    config = getattr(pretrained, "config", pretrained)
    architectures = getattr(config, "architectures", None) or []
    return architectures[0] if architectures else type(config).__name__


def _measure(bridge: Any, chunks: list[Any], weight_dtype: Any,
             merge_adapter_weights: bool) -> tuple[tuple[int, int], tuple[int, int], dict[str, int]]:
    """Steps 2 to 4 of the module docstring: ``(trainable bytes, tensors)``, ``(the others' bytes, tensors)``
    and the parameters no task exports (:func:`.sync_tasks.left_out`)."""
    from bridge_freeze_plugin.export import call_accepted, trainable_conversion_tasks

    model_bridge = bridge._model_bridge
    with pg_collection_once():
        add_mapped_names(bridge, model_bridge, chunks)
        tasks = [t for t in call_accepted(model_bridge.build_conversion_tasks, bridge.hf_pretrained, chunks,
                                          weight_dtype=weight_dtype) if t is not None]
        tasks += sequential_expert_tasks(model_bridge, chunks, tasks, weight_dtype)
        # Without LoRA adapters (Bridge knows them by ".adapter." in the name), merging changes nothing;
        # saying so spares Bridge three walks of the model.
        merge = merge_adapter_weights and any(
            ".adapter." in name for chunk in chunks for name, _ in chunk.named_parameters())
        # what no task exports is counted (left_out) and said in the plan's line, not refused
        kept = trainable_conversion_tasks(bridge, chunks, conversion_tasks=tasks, merge_adapter_weights=merge,
                                          require_every_trainable=False)
        kept_ids = {id(task) for task in kept}
        rest = [task for task in tasks if id(task) not in kept_ids]
        listing = getattr(getattr(getattr(bridge.hf_pretrained, "state", None), "source", None), "listing", None)
        options = {"cpu": False, "show_progress": False, "merge_adapter_weights": merge}
        return (export_size(bridge, chunks, kept, listing, weight_dtype, options),
                export_size(bridge, chunks, rest, listing, weight_dtype, options),
                left_out(model_bridge, chunks, tasks))
