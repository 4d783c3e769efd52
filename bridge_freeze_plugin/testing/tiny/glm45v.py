"""GLM-4.5V: real ``GLM45VModelProvider`` / ``GLM45VModel`` (HF Glm4v vision tower, Megatron MoE text model)."""

from __future__ import annotations

from typing import Any

from bridge_freeze_plugin.testing.tiny._common import TINY_LM, finalized

REAL = True

#: A tiny GLM-4.5-Air-style text side: layer 0 dense, layer 1 MoE (4 experts of 32 + a shared expert),
#: one MTP layer, partial (50 %) M-RoPE. Fused / grouped kernels that need TE or CUDA are off.
TINY_TEXT_MOE: dict[str, Any] = {
    "num_moe_experts": 4,
    "moe_ffn_hidden_size": 32,
    "moe_shared_expert_intermediate_size": 32,
    "moe_router_topk": 2,
    "moe_layer_freq": [0, 1],
    "moe_grouped_gemm": False,
    "moe_permute_fusion": False,
    "moe_shared_expert_overlap": False,
    "moe_token_dispatcher_type": "alltoall",
    "mtp_num_layers": 1,
    # rotary dim = kv_channels * rotary_percent = 8 -> 4 frequency pairs split over (t, h, w).
    "mrope_section": [2, 1, 1],
}


def vision_config() -> Any:
    from transformers.models.glm4v.configuration_glm4v import Glm4vVisionConfig

    return Glm4vVisionConfig(
        depth=2,
        hidden_size=64,
        intermediate_size=128,
        num_heads=4,
        out_hidden_size=TINY_LM["hidden_size"],
        image_size=16,
        patch_size=4,
        temporal_patch_size=2,
        spatial_merge_size=2,
    )


def make_provider(**overrides: Any) -> Any:
    from megatron.bridge.models.glm_vl.glm_45v_provider import GLM45VModelProvider

    provider = GLM45VModelProvider(**TINY_LM, **TINY_TEXT_MOE, vision_config=vision_config())
    return finalized(provider, **overrides)
