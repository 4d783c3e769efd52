"""The HF layout a plan's weight sync is sized against: which HF tensors Bridge's export finds "in the checkpoint".

Bridge's export depends on the checkpoint it was loaded from; a plan has only a config. :func:`bridge_for_plan`
gives Bridge the tensor listing transformers' own class writes for the config, and :func:`add_mapped_names` adds
the HF tensors Bridge maps that this listing lacks but the maker's checkpoints hold. :mod:`.sync_bytes` sizes the
export against the result.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

logger = logging.getLogger(__name__)

__all__ = ["add_mapped_names", "bridge_for_plan"]


def bridge_for_plan(hf_config: Any) -> Any:
    """The ``AutoBridge`` that exports a model converted from ``hf_config``, as if from its checkpoint.

    Bridge's export depends on the checkpoint it was loaded from, not only on the config: it leaves out mappings
    whose HF tensors the checkpoint lacks, writes routed experts fused or one tensor per expert as the checkpoint
    stores them, and writes a tied output layer only if the checkpoint has one. The bridge made here sees the
    tensor listing (names and shapes, on the meta device: no data) that transformers' own model class for the
    config writes with ``save_pretrained`` (its state dict, tied aliases dropped, its save-time renaming and
    re-fusing applied), which is the layout of a checkpoint written by the installed transformers. A config
    whose model class transformers does not have (remote code) gets Bridge's config-only bridge
    (``AutoBridge.from_hf_config``): every mapping, experts one tensor each.
    """
    from megatron.bridge import AutoBridge

    listing = _checkpoint_listing(hf_config)
    if listing is None:
        return AutoBridge.from_hf_config(hf_config)
    from megatron.bridge.models.hf_pretrained.causal_lm import PreTrainedCausalLM
    from megatron.bridge.models.hf_pretrained.state import StateDict

    pretrained = PreTrainedCausalLM()
    pretrained.config = hf_config
    pretrained._state_dict_accessor = StateDict(_listing_source(listing))
    return AutoBridge(pretrained)


def _checkpoint_listing(hf_config: Any) -> dict[str, Any] | None:
    """``name -> meta tensor`` of what ``save_pretrained`` of transformers' model class for ``hf_config`` writes;
    ``None`` when transformers has no such class (or cannot build it on the meta device)."""
    import copy

    import torch
    import transformers

    architectures = getattr(hf_config, "architectures", None) or []
    model_class = getattr(transformers, architectures[0], None) if architectures else None
    if model_class is None:
        return None
    try:
        from transformers.core_model_loading import revert_weight_conversion
        from transformers.modeling_utils import remove_tied_weights_from_state_dict

        with torch.device("meta"):
            model = model_class(copy.deepcopy(hf_config))
        state = model.state_dict()
        # transformers finds tied aliases through the parameters (on the meta device); buffers are never tied.
        params = {name for name, _ in model.named_parameters(remove_duplicate=False)}
        untied = remove_tied_weights_from_state_dict({k: v for k, v in state.items() if k in params}, model)
        state = {k: v for k, v in state.items() if k in untied or k not in params}
        return dict(revert_weight_conversion(model, state))
    except Exception as exc:  # noqa: BLE001 - transformers' own class for this config: any failure means no listing
        logger.info("no HF tensor listing from transformers' %s (%s): Bridge's config-only export layout",
                    model_class.__name__, exc)
        return None


def _listing_source(listing: dict[str, Any]) -> Any:
    """A Bridge ``StateSource`` over a tensor listing (meta tensors), whose key list answers ``in`` from a set
    (Bridge asks it once per conversion task: about 25,000 times for a 235B model)."""
    from megatron.bridge.models.hf_pretrained.state import StateSource

    class Keys(list):  # type: ignore[type-arg]
        def __init__(self, keys: list[str]) -> None:
            super().__init__(keys)
            self._set = frozenset(keys)

        def __contains__(self, key: object) -> bool:
            return key in self._set

    class ListingSource(StateSource):
        def __init__(self) -> None:
            self._keys = Keys(sorted(listing))
            self.listing = listing  # read by the sizing (shapes only)

        def get_all_keys(self) -> list[str]:
            return self._keys

        def add_names(self, names: Iterable[str]) -> None:
            """List HF names the checkpoint is taken to hold without a tensor (see :func:`add_mapped_names`)."""
            self._keys = Keys(sorted({*self._keys, *names}))

        def load_tensors(self, keys: list[str]) -> dict[str, Any]:
            return {key: listing[key] for key in keys if key in listing}

    return ListingSource()


#: Megatron's routed experts (``SequentialMLP`` / grouped GEMM), not the shared experts (``.mlp.shared_experts.``)
_ROUTED_EXPERT = ".mlp.experts."


def add_mapped_names(bridge: Any, model_bridge: Any, chunks: list[Any]) -> list[str]:
    """Take the checkpoint to hold the HF tensors Bridge maps that transformers' save layout lacks; return them.

    The listing (:func:`bridge_for_plan`) is what the installed transformers writes, which is not always the
    maker's checkpoint: transformers' class may not build a module the checkpoint carries (the multi-token-
    prediction layers of Qwen3.5 and EXAONE 4.5: ``mtp.*``), and its save-time renaming can differ from the
    published names (transformers 5.12 writes Qwen2-Audio's language model as ``language_model.model.model.*``;
    the published checkpoint and Bridge's mapping say ``language_model.model.*``). Bridge's export leaves out a
    mapping whose HF tensors the checkpoint lacks, so the sync would be sized without them (Qwen2-Audio's whole
    language model). Bridge's mappings name the tensors of the checkpoints Bridge converts, so a parameter
    whose mapping names only tensors absent from the listing is sized as Bridge names it: those names are
    listed (without a tensor: nothing reads one for a one-to-one or split mapping). Left as they are: mappings
    with some of their names listed (the layout decides), grouped expert exports (the listing's fused tensor
    shapes the export), routed experts (the listing says whether the checkpoint stores them fused or one tensor
    per expert, and Bridge maps both), a tied output layer (Bridge leaves it out itself). Single chunk, single
    rank.
    """
    source = getattr(getattr(bridge.hf_pretrained, "state", None), "source", None)
    if source is None or not hasattr(source, "add_names") or len(chunks) != 1:
        return []
    import itertools

    from megatron.bridge.models.conversion.utils import persistent_buffers

    keys = source.get_all_keys()
    registry = model_bridge.mapping_registry()
    language_model = getattr(chunks[0], "language_model", chunks[0])
    registry.set_process_groups_from_pg_collection(getattr(language_model, "pg_collection", None))
    absent: list[str] = []
    for name, _ in itertools.chain(chunks[0].named_parameters(), persistent_buffers(chunks[0])):
        if ("_extra_state" in name or model_bridge._is_adapter_param_name(name) or "output_layer" in name
                or _ROUTED_EXPERT in name):
            continue
        mapping = registry.megatron_to_hf_lookup(model_bridge._get_lora_unwrapped_name(model_bridge._unwrap_name(name)))
        if mapping is None or mapping.allow_hf_name_mismatch or getattr(mapping, "is_grouped_export", False):
            continue
        names = [mapping.hf_param] if isinstance(mapping.hf_param, str) else list(mapping.hf_param.values())
        if names and not any(hf_name in keys for hf_name in names):
            absent.extend(names)
    if absent:
        source.add_names(absent)
        logger.info("weight sync: %d HF tensors Bridge maps are not in the layout transformers writes for this "
                    "config (first: %s); sized as Bridge's mapping names them", len(absent), sorted(absent)[0])
    return absent
