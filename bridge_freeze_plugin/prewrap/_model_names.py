"""Model-wide parameter names from one rank's chunks: the names the whole, unsplit model has.

Under pipeline parallelism each stage (and each virtual-pipeline chunk) numbers its transformer layers from 0:
``decoder.layers.0`` of the second of two stages is layer ``n/2`` of the model. Under expert parallelism each
rank numbers its experts from 0. Train / freeze patterns name the whole model, as ``bridge-freeze plan --json``
lists it, so each rank renames its own parameters: a megatron-core layer's index becomes ``layer_number - 1``
(the layer's own 1-based number in the whole model), a local expert's index ``ep_rank * num_local_experts + i``
(``local_experts.<i>``, and the ``weight<i>`` / ``bias<i>`` of grouped experts). Without pipeline or expert
parallelism every name already is model-wide and nothing is renamed. The last stage's copy of a tied
embedding (megatron-core marks it ``shared``: ``<lm>.output_layer.weight``) is named as the embedding it copies
(``<lm>.embedding.word_embeddings.weight``), so both copies always train or freeze together.
"""

from __future__ import annotations

import re
from typing import Any

from bridge_freeze_plugin.families import canonical_name
from bridge_freeze_plugin.prewrap._classify import as_chunks
from bridge_freeze_plugin.ranks import world

_LAYER = re.compile(r"(?:.*\.)?layers\.\d+")
_GROUPED = re.compile(r"(weight|bias)(\d+)")
_TIED_COPY, _TIED_ORIGINAL = "output_layer.weight", "embedding.word_embeddings.weight"


def parallel_layout() -> tuple[int, int, int]:
    """(pipeline size, expert-parallel size, expert-parallel rank); ``(1, 1, 0)`` without model parallelism."""
    if world() is None:
        return 1, 1, 0
    from megatron.core import parallel_state as ps

    if not ps.model_parallel_is_initialized():
        return 1, 1, 0
    return (ps.get_pipeline_model_parallel_world_size(), ps.get_expert_model_parallel_world_size(),
            ps.get_expert_model_parallel_rank())


def names_are_model_wide() -> bool:
    """True when this rank holds a name for every parameter of the model (no pipeline or expert split)."""
    pipeline, experts, _ = parallel_layout()
    return pipeline == 1 and experts == 1


def _is_megatron(module: Any) -> bool:
    return type(module).__module__.startswith("megatron.")


def _renames(chunk: Any, layers: bool, ep_rank: int | None) -> tuple[dict[str, str], dict[str, int]]:
    """(local layer path -> model-wide index, local experts path -> this rank's first expert number)."""
    segments: dict[str, str] = {}
    experts: dict[str, int] = {}
    for raw, module in chunk.named_modules():
        name = canonical_name(raw)
        number = getattr(module, "layer_number", None)
        if layers and isinstance(number, int) and _LAYER.fullmatch(name) and _is_megatron(module):
            segments[name] = str(number - 1)
        local = getattr(module, "num_local_experts", None)
        if ep_rank is not None and isinstance(local, int) and name.rpartition(".")[2] == "experts":
            experts[name] = ep_rank * local
    return segments, experts


def _rename(name: str, segments: dict[str, str], experts: dict[str, int]) -> str:
    local = name.split(".")
    out = list(local)
    for k in range(1, len(local) + 1):
        prefix = ".".join(local[:k])
        if prefix in segments:
            out[k - 1] = segments[prefix]
        offset = experts.get(prefix)
        if offset is None:
            continue
        rest = local[k:]
        grouped = _GROUPED.fullmatch(local[-1])
        if len(rest) >= 2 and rest[0] == "local_experts" and rest[1].isdigit():
            out[k + 1] = str(offset + int(rest[1]))
        elif grouped:
            out[-1] = f"{grouped.group(1)}{offset + int(grouped.group(2))}"
    return ".".join(out)


def model_wide_names(model: Any, buffers: bool = False) -> dict[int, str]:
    """``id(parameter)`` -> model-wide canonical name, for every parameter of this rank's chunks (``buffers``: and
    ``id(buffer)`` -> name for every buffer, renamed alike)."""
    pipeline, experts, ep_rank = parallel_layout()
    out: dict[int, str] = {}
    for chunk in as_chunks(model):
        if pipeline == 1 and experts == 1:
            segments, offsets = {}, {}
        else:
            segments, offsets = _renames(chunk, pipeline > 1, ep_rank if experts > 1 else None)
        tensors = [*chunk.named_parameters(), *(chunk.named_buffers() if buffers else ())]
        for name, param in tensors:
            if id(param) not in out:
                wide = _rename(canonical_name(name), segments, offsets)
                if getattr(param, "shared", False) and wide.endswith(_TIED_COPY):
                    wide = wide.removesuffix(_TIED_COPY) + _TIED_ORIGINAL
                out[id(param)] = wide
    return out
