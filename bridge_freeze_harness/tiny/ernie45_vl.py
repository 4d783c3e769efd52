"""ERNIE-4.5-VL: real ``Ernie45VLModelProvider`` / ``Ernie45VLModel``.

Default: the HF vision tower (``vision_tower``) and HF resampler (``resampler_model``) built from a tiny
``Ernie4_5_VLMoeConfig``; ``make_provider(use_mg_vit=True)`` builds the Megatron-native ViT instead
(``vision_model``, with ``vision_tower`` a parameter-free adapter around it).

The text side is a tiny dual-pool MoE: layer 0 dense, layer 1 ``ErnieMultiTypeMoE`` with a text pool
(4 experts of width 32) and a vision pool (4 experts of width 16), top-2, plus shared experts.
Without TE Bridge's ERNIE decoder spec has no fused LayerNorm+linear (a plain linear, no norm at all), so
:func:`cpu_patches` gives every build of the family, at any size, the harness's local fused norm + linear
with TE's names: the attention ``linear_qkv`` and the dense layer's ``linear_fc1`` carry their
``layer_norm_weight`` (the checkpoint's ``input_layernorm`` / ``post_attention_layernorm``) as on a TE
machine. The ``allgather`` token dispatcher stands in for ``alltoall`` (which creates a CUDA stream in its
``__init__``); this changes no parameter names.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from bridge_freeze_harness._bridge_steps import vlm_step_with
from bridge_freeze_harness._hf_configs import HFFamily
from bridge_freeze_harness.batches import TrainSpec, flat_patch_batch
from bridge_freeze_harness.tiny._common import TINY_LM, finalized

REAL = True

#: (text pool, vision pool) expert widths and the shared-expert multiplier, as in the HF config.
MOE_WIDTHS = (32, 16)
NUM_SHARED_EXPERTS = 2

TINY_VISION: dict[str, Any] = {
    "depth": 2,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_heads": 4,
    "patch_size": 4,
    "spatial_merge_size": 2,
    "temporal_merge_size": 2,
}


def hf_config() -> Any:
    """A tiny HF ``Ernie4_5_VLMoeConfig``: the resampler reads it, the vision tower its ``vision_config``."""
    from transformers.models.ernie4_5_vl_moe.configuration_ernie4_5_vl_moe import Ernie4_5_VLMoeConfig

    text = {
        "vocab_size": TINY_LM["vocab_size"],
        "hidden_size": TINY_LM["hidden_size"],
        "intermediate_size": TINY_LM["ffn_hidden_size"],
        "num_hidden_layers": TINY_LM["num_layers"],
        "num_attention_heads": TINY_LM["num_attention_heads"],
        "num_key_value_heads": TINY_LM["num_query_groups"],
        "moe_intermediate_size": list(MOE_WIDTHS),
        "moe_num_experts": 4,
        "moe_k": 2,
        "moe_num_shared_experts": NUM_SHARED_EXPERTS,
        "mlp_layer_types": ["dense", "sparse"],
    }
    return Ernie4_5_VLMoeConfig(text_config=text, vision_config=dict(TINY_VISION))


def make_provider(**overrides: Any) -> Any:
    from megatron.bridge.models.ernie_vl.ernie45_vl_provider import Ernie45VLModelProvider

    config = hf_config()
    provider = Ernie45VLModelProvider(
        **TINY_LM,
        hf_config=config,
        vision_config=config.vision_config,
        normalization="RMSNorm",
        gated_linear_unit=True,
        add_qkv_bias=False,
        add_bias_linear=False,
        hidden_dropout=0.0,
        rotary_interleaved=True,
        rotary_base=500000.0,
        share_embeddings_and_output_weights=True,
        # kv_channels 16 -> 8 rotary frequencies: 6 interleaved H/W + 2 temporal (freq_allocation = last).
        mrope_section=[3, 3, 2],
        num_moe_experts=4,
        moe_ffn_hidden_size=MOE_WIDTHS[0],
        moe_intermediate_size=MOE_WIDTHS,
        moe_shared_expert_intermediate_size=MOE_WIDTHS[0] * NUM_SHARED_EXPERTS,
        moe_router_topk=2,
        moe_layer_freq=[0, 1],
        moe_router_pre_softmax=False,
        moe_router_load_balancing_type="aux_loss",
        moe_aux_loss_coeff=0.001,
        moe_router_score_function="sigmoid",
        moe_router_enable_expert_bias=True,
        moe_router_dtype="fp32",
        moe_grouped_gemm=False,
        moe_permute_fusion=False,
        moe_token_dispatcher_type="allgather",
    )
    return finalized(provider, **overrides)


@contextlib.contextmanager
def cpu_patches() -> Iterator[None]:
    """Any ERNIE-4.5-VL build without TE: the fused norm + linear as a local module with TE's names.

    Bridge's decoder spec falls back to a plain ``ColumnParallelLinear`` without TE ("No fused LN+Linear
    without TE"), so the model would have no ``linear_qkv.layer_norm_weight`` / dense
    ``linear_fc1.layer_norm_weight``: a full-size plan would leave out every layer's ``input_layernorm`` and
    the dense layers' ``post_attention_layernorm`` (28 x 2,560 + 2,560 parameters of ERNIE-4.5-VL-28B-A3B),
    and a checkpoint's norms would be neither loaded nor exported.
    :class:`~bridge_freeze_harness.local_layers.LayerNormColumnParallelLinear` takes its place.
    """
    from megatron.bridge.models.ernie_vl.modeling_ernie45_vl import ernie_decoder_layer_spec as spec

    from bridge_freeze_harness.local_layers import LayerNormColumnParallelLinear
    from bridge_freeze_harness.patching import patched

    original = spec._get_linear_modules

    def linear_modules() -> tuple[Any, ...]:
        column, row, attention, _, norm = original()
        return column, row, attention, LayerNormColumnParallelLinear, norm

    with patched([(spec, "_get_linear_modules", linear_modules)]):
        yield


def train_batch(provider: Any, spec: TrainSpec, batch_size: int, gen: torch.Generator) -> dict[str, Any]:
    """Flattened ``C * P * P`` patches of an 8x8-patch image (16 image tokens) between image start / end markers.

    ``mm_token_type_ids`` (M-RoPE) and ``moe_mm_token_type_ids`` (MoE routing: image tokens go to the vision
    expert pool, text tokens to the text pool, so both pools train) mark the image tokens with 1.
    """
    geometry = (3, 1, TINY_VISION["patch_size"], TINY_VISION["spatial_merge_size"])
    batch = flat_patch_batch(provider, spec, batch_size, gen, geometry)
    batch["pixel_values"] = batch["pixel_values"].mul(64.0).add(128.0)  # raw 0-255-like values: Bridge normalises
    image = (batch["input_ids"] == spec.token_ids["image_token_id"]).int()
    batch["mm_token_type_ids"] = image
    batch["moe_mm_token_type_ids"] = image
    return batch


TRAIN_SPECS = {
    "ernie45_vl": TrainSpec(
        token_ids={"image_start_token_id": 3, "image_end_token_id": 4, "image_token_id": 6,
                   "video_start_token_id": 7, "video_end_token_id": 8, "video_token_id": 9},
        batch_ids={"bos_token_id": 1, "eos_token_id": 2},
        roles={"bos": "bos_token_id", "start": "image_start_token_id", "image": "image_token_id",
               "end": "image_end_token_id", "eos": "eos_token_id"},
        projection_prefixes=("resampler_model.",),
        make_batch=train_batch,
    ),
}


def hf_checkpoint_config() -> Any:
    config = hf_config()
    # ERNIE's HF rotary embedding splits head_dim by mrope_section (default [22, 22, 20], for head_dim 128).
    config.text_config.rope_parameters = {**config.text_config.rope_parameters, "mrope_section": [3, 3, 2]}
    for name, value in {"image_start_token_id": 3, "image_end_token_id": 4, "image_token_id": 6,
                        "video_start_token_id": 7, "video_end_token_id": 8, "video_token_id": 9}.items():
        setattr(config, name, value)
    return config


#: the tiny HF checkpoint recipe (collected by :data:`bridge_freeze_harness.hf_checkpoint.HF_FAMILIES`).
HF_CHECKPOINTS = {"ernie45_vl": HFFamily("Ernie4_5_VLMoeForConditionalGeneration", hf_checkpoint_config)}

#: Bridge's forward step that trains it (collected by :func:`bridge_freeze_harness.cpu_training.forward_step_of`).
FORWARD_STEPS = {
    # Ernie45VLModel.forward routes each token to the text or the vision expert pool by moe_mm_token_type_ids;
    # without it every token goes to the text pool (ernie_moe_layer.py:204-211) and the vision pool never trains.
    "ernie45_vl": vlm_step_with("moe_mm_token_type_ids"),
}
