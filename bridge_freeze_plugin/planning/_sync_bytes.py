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
   (:func:`_sequential_expert_tasks`).
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

import contextlib
import logging
import re
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from bridge_freeze_plugin.errors import BridgeFreezeError, PlanError
from bridge_freeze_plugin.planning._sync_layout import add_mapped_names, bridge_for_plan

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

    from bridge_freeze_plugin.export import call_accepted, trainable_conversion_tasks

    started = time.perf_counter()
    weight_dtype = torch_dtype(dtype)
    chunks = unwrap_model(model if isinstance(model, list) else [model])
    model_bridge = bridge._model_bridge
    try:
        with _pg_collection_once():
            add_mapped_names(bridge, model_bridge, chunks)
            tasks = [t for t in call_accepted(model_bridge.build_conversion_tasks, bridge.hf_pretrained, chunks,
                                              weight_dtype=weight_dtype) if t is not None]
            tasks += _sequential_expert_tasks(model_bridge, chunks, tasks, weight_dtype)
            # Without LoRA adapters (Bridge knows them by ".adapter." in the name), merging changes nothing;
            # saying so spares Bridge three walks of the model.
            merge = merge_adapter_weights and any(
                ".adapter." in name for chunk in chunks for name, _ in chunk.named_parameters())
            kept = trainable_conversion_tasks(bridge, chunks, conversion_tasks=tasks, merge_adapter_weights=merge)
            kept_ids = {id(task) for task in kept}
            rest = [task for task in tasks if id(task) not in kept_ids]
            listing = getattr(getattr(getattr(bridge.hf_pretrained, "state", None), "source", None), "listing", None)
            options = {"cpu": False, "show_progress": False, "merge_adapter_weights": merge}
            trainable_bytes, trainable_tensors = _export_size(bridge, chunks, kept, listing, weight_dtype, options)
            rest_bytes, rest_tensors = _export_size(bridge, chunks, rest, listing, weight_dtype, options)
            left_out = _left_out(model_bridge, chunks, tasks)
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
        left_out_tensors=len(left_out),
        left_out_parameters=sum(left_out.values()),
        left_out_first=min(left_out, default=""),
    )
    if left_out:
        logger.debug("weight sync not sent: %s", sorted(left_out))
    logger.debug("weight sync sized in %.2f s: %s", result.seconds, result.describe())
    return result


def _left_out(model_bridge: Any, chunks: list[Any], tasks: list[Any]) -> dict[str, int]:
    """``name -> elements`` of the model's parameters that no conversion task exports (single chunk; else empty).

    A routed expert of the CPU build (``SequentialMLP``) counts as exported under its grouped-GEMM name too
    (:func:`_sequential_expert_tasks`); LoRA adapters are merged into their bases, not exported themselves."""
    if len(chunks) != 1:
        return {}
    covered = {task.param_name for task in tasks}
    left: dict[str, int] = {}
    for name, param in chunks[0].named_parameters():
        if model_bridge._is_adapter_param_name(name):
            continue
        plain = model_bridge._unwrap_name(name)
        found = _SEQUENTIAL_EXPERT.match(plain)
        names = {name, plain, model_bridge._get_lora_unwrapped_name(plain)}
        if found is not None:
            names.add(f"{found['experts']}.{found['linear']}.{found['kind']}{found['n']}")
        if not names & covered:
            left[name] = int(param.numel())
    return left


#: A routed expert's tensor as megatron-core's ``SequentialMLP`` names it (the CPU meta build's experts).
_SEQUENTIAL_EXPERT = re.compile(r"^(?P<experts>.+\.mlp\.experts)\.local_experts\.(?P<n>\d+)\."
                                r"(?P<linear>linear_fc[12])\.(?P<kind>weight|bias)$")


def _sequential_expert_tasks(model_bridge: Any, chunks: list[Any], tasks: list[Any], weight_dtype: Any) -> list[Any]:
    """Conversion tasks for routed experts that Bridge maps only under their grouped-GEMM names.

    The plan's meta build has no TransformerEngine, so megatron-core builds routed experts as ``SequentialMLP``
    (``experts.local_experts.<n>.linear_fc1.weight``). A GPU build with grouped GEMM holds the same tensors, of
    the same shapes, as ``TEGroupedMLP`` (``experts.linear_fc1.weight<n>``), and some of Bridge's bridges
    (GLM-4.5V, Gemma4-VL, MiniMax-M3) map only those names: the export would leave every routed expert out.
    Each such tensor that no task covers gets a task under its grouped name, with the mapping Bridge's registry
    gives that name (Bridge reads the expert number from it), so the sizes are those of the export a GPU build
    makes. Single chunk, single rank (the plan's whole-model build).
    """
    if len(chunks) != 1:
        return []
    from megatron.bridge.models.conversion.model_bridge import WeightConversionTask

    from bridge_freeze_plugin.export import call_accepted

    covered = {task.param_name for task in tasks}
    registry = None
    added = []
    for name, param in chunks[0].named_parameters():
        found = _SEQUENTIAL_EXPERT.match(name)
        if found is None or name in covered:
            continue
        if registry is None:
            registry = model_bridge.mapping_registry()
            language_model = getattr(chunks[0], "language_model", chunks[0])
            registry.set_process_groups_from_pg_collection(getattr(language_model, "pg_collection", None))
        grouped = f"{found['experts']}.{found['linear']}.{found['kind']}{found['n']}"
        mapping = registry.megatron_to_hf_lookup(grouped)
        if mapping is None:
            continue
        module = chunks[0].get_submodule(f"{found['experts']}.local_experts.{found['n']}.{found['linear']}")
        added.append(call_accepted(WeightConversionTask, param_name=grouped, global_param_name=grouped,
                                   mapping=mapping, pp_rank=0, vp_stage=0, megatron_module=module,
                                   param_weight=param, weight_dtype=weight_dtype))
    if added:
        logger.debug("weight sync: %d routed-expert tensors sized under their grouped-GEMM names", len(added))
    return added


@contextlib.contextmanager
def _pg_collection_once() -> Iterator[None]:
    """Bridge asks, per parameter and per task, which process-group collection the model carries
    (``model_bridge._get_pg_collection_from_model``: an unwrap of the model each time, about 250,000 times and
    2 s of a 235B sizing). The answer cannot change while the sizing runs: each model's is looked up once."""
    from megatron.bridge.models.conversion import model_bridge as module

    original = getattr(module, "_get_pg_collection_from_model", None)
    if original is None:  # another Bridge version: nothing to spare
        yield
        return
    answers: dict[int, tuple[Any, Any]] = {}

    def once(megatron_model: Any) -> Any:
        first = megatron_model[0] if isinstance(megatron_model, list) and megatron_model else megatron_model
        held = answers.get(id(first))
        if held is None or held[0] is not first:
            held = (first, original(megatron_model))
            answers[id(first)] = held
        return held[1]

    module._get_pg_collection_from_model = once
    try:
        yield
    finally:
        module._get_pg_collection_from_model = original


def _describe(bridge: Any) -> str:
    pretrained = getattr(bridge, "hf_pretrained", None)
    config = getattr(pretrained, "config", pretrained)
    architectures = getattr(config, "architectures", None) or []
    return architectures[0] if architectures else type(config).__name__


def _export_size(bridge: Any, chunks: list[Any], tasks: list[Any], listing: dict[str, Any] | None,
                 weight_dtype: Any, options: dict[str, Any]) -> tuple[int, int]:
    """Bytes and number of the HF tensors Bridge's export of ``tasks`` yields.

    Routed experts stored fused in the checkpoint (Bridge's grouped export: one HF tensor per layer and
    projection, stacked from one task per expert) are sized without running their tasks: the stacked tensor
    is the group's per-expert tensors, so it has the sum of their elements, which must also be the element
    count of the listing's tensor of that name (Bridge reshapes the stack to it); the sync dtype applies.
    Any group that does not meet both goes through the export with the other tasks. On a 235B-A22B model
    this spares running 24,000 of its 25,000 tasks (about 2.5 s of CPU).
    """
    by_group: dict[str, list[Any]] = {}
    if listing is not None:
        for task in tasks:
            if getattr(task.mapping, "is_grouped_export", False) and task.param_weight is not None:
                by_group.setdefault(str(task.mapping.group_key), []).append(task)
    elements, sized, skipped = 0, 0, set()
    for key, members in by_group.items():
        total = sum(int(task.param_weight.numel()) for task in members)
        held = listing.get(key) if listing is not None else None
        if held is not None and int(held.numel()) == total and all(t.param_weight.is_floating_point()
                                                                    for t in members):
            elements += total
            sized += 1
            skipped.update(id(task) for task in members)
    remaining = [task for task in tasks if id(task) not in skipped]
    if sized:
        logger.debug("weight sync: %d fused expert tensors sized from their %d tasks", sized, len(skipped))
    exported_bytes, exported = _size(bridge.export_hf_weights(chunks, conversion_tasks=remaining, **options),
                                     weight_dtype)
    return exported_bytes + elements * weight_dtype.itemsize, exported + sized


def _size(stream: Iterable[tuple[str, Any]], weight_dtype: Any) -> tuple[int, int]:
    """Bytes and number of the tensors a (meta) export stream yields; checks each HF name comes once.
    A floating-point tensor counts in the sync dtype, as Bridge's cast sends it (a Bridge whose tasks take no
    ``weight_dtype`` yields the meta build's dtype: the figure is the same on every Bridge)."""
    total, names = 0, set()
    for name, tensor in stream:
        if name in names:
            raise PlanError(f"Megatron-Bridge's export yields HF tensor {name} twice; cannot size the weight sync")
        names.add(name)
        size = weight_dtype.itemsize if tensor.is_floating_point() else tensor.element_size()
        total += tensor.numel() * size
    return total, len(names)
