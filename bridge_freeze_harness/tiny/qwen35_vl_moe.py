"""Qwen3.5-VL MoE: real ``Qwen35VLMoEModelProvider`` / ``Qwen3VLModel``, hybrid GDN/attention + MoE.

Same hybrid language model and vision tower as :mod:`.qwen35_vl`, and the same CPU patches (see
there; a forward/backward needs :func:`forward_patches`), with every language-model MLP a routed
MoE plus a gated shared expert.

MoE CPU notes as in :mod:`.qwen3_vl_moe`: no grouped GEMM (local ``SequentialMLP`` experts),
``allgather`` dispatcher (the all-to-all one creates a CUDA stream), no permute fusion.
"""

from __future__ import annotations

from typing import Any

from bridge_freeze_harness.tiny._common import TINY_LM, finalized
from bridge_freeze_harness.tiny.qwen3_vl_moe import TINY_MOE
from bridge_freeze_harness.tiny.qwen35_vl import TINY_HYBRID, TINY_IMAGE, TINY_VISION, build_patches, forward_patches

__all__ = ["REAL", "build_patches", "forward_patches", "make_provider", "vision_config"]

REAL = True

#: Qwen3.5 MoE has one gated shared expert next to the routed ones.
TINY_SHARED_EXPERT: dict[str, Any] = {
    "moe_shared_expert_intermediate_size": 32,
    "moe_shared_expert_gate": True,
}


def vision_config() -> Any:
    from transformers.models.qwen3_5_moe.configuration_qwen3_5_moe import Qwen3_5MoeVisionConfig

    return Qwen3_5MoeVisionConfig(**TINY_VISION)


def make_provider(**overrides: Any) -> Any:
    from megatron.bridge.models.qwen_vl.qwen35_vl_provider import Qwen35VLMoEModelProvider

    provider = Qwen35VLMoEModelProvider(
        **TINY_LM,
        **TINY_HYBRID,
        **TINY_MOE,
        **TINY_SHARED_EXPERT,
        vision_config=vision_config(),
        **TINY_IMAGE,
    )
    return finalized(provider, **overrides)
