"""Qwen3-VL MoE: real ``Qwen3VLMoEModelProvider`` / ``Qwen3VLModel`` with a sparse-MoE language model.

The vision tower and its projection (``vision_model.merger`` plus the DeepStack mergers) are the
same as Qwen3-VL dense; only the language model's MLPs are routed experts.

CPU notes:

- ``moe_grouped_gemm=False`` (the provider asks for grouped GEMM in its spec; megatron-core's local
  backend builds a ``SequentialMLP`` either way, so experts appear as ``mlp.experts.local_experts.N``).
- ``moe_token_dispatcher_type="allgather"``: the provider's default all-to-all dispatcher creates a
  CUDA stream in its constructor.
- ``moe_permute_fusion=False`` (fused permutation needs TransformerEngine).

Bridge's own defaults for this provider are kept, including ``freeze_language_model=True`` and
``freeze_vision_model=True`` (a known trap: a "full" fine-tune trains only the projection).
Pass ``freeze_language_model=False, freeze_vision_model=False`` for an all-trainable model.
"""

from __future__ import annotations

from typing import Any

from bridge_freeze_harness._hf_configs import QWEN_IDS, TEXT, TEXT_IDS, HFFamily, qwen3_rope
from bridge_freeze_harness.batches import QWEN_TOKEN_IDS, TrainSpec
from bridge_freeze_harness.tiny._common import TINY_LM, finalized
from bridge_freeze_harness.tiny.qwen3_vl import TINY_IMAGE, vision_config

REAL = True

#: Language-model MoE fields: 4 small experts, top-2 routing, every layer sparse.
TINY_MOE: dict[str, Any] = {
    "num_moe_experts": 4,
    "moe_router_topk": 2,
    "moe_ffn_hidden_size": 32,
    "moe_grouped_gemm": False,
    "moe_permute_fusion": False,
    "moe_token_dispatcher_type": "allgather",
    "moe_aux_loss_coeff": 1e-3,
}

#: What the Qwen3 MoE text config maps to (RMSNorm, SwiGLU, no linear biases, untied output layer).
QWEN3_TEXT: dict[str, Any] = {
    "normalization": "RMSNorm",
    "gated_linear_unit": True,
    "add_bias_linear": False,
    "add_qkv_bias": False,
    "share_embeddings_and_output_weights": False,
}


def make_provider(**overrides: Any) -> Any:
    from megatron.bridge.models.qwen_vl.qwen3_vl_provider import Qwen3VLMoEModelProvider

    provider = Qwen3VLMoEModelProvider(
        **TINY_LM,
        **TINY_MOE,
        **QWEN3_TEXT,
        head_dim=TINY_LM["kv_channels"],
        vision_config=vision_config(),
        mrope_section=[2, 3, 3],
        deepstack_visual_indexes=[0, 1],
        **TINY_IMAGE,
    )
    return finalized(provider, **overrides)


#: As Qwen3-VL dense. Bridge's defaults freeze LM and vision encoder; training starts from all three trainable.
TRAIN_SPECS = {
    "qwen3_vl_moe": TrainSpec(
        token_ids=QWEN_TOKEN_IDS,
        projection_prefixes=("vision_model.merger.", "vision_model.decoder.deepstack_merger_list."),
        cpu_overrides={
            "cross_entropy_loss_fusion": False, "freeze_language_model": False, "freeze_vision_model": False
        },
    ),
}


def hf_checkpoint_config() -> Any:
    from transformers import Qwen3VLMoeConfig

    from bridge_freeze_harness.tiny.qwen3_vl import TINY_VISION

    text = {**TEXT, **TEXT_IDS, "head_dim": TINY_LM["kv_channels"], "rope_parameters": qwen3_rope([2, 3, 3]),
            "moe_intermediate_size": TINY_MOE["moe_ffn_hidden_size"], "num_experts": TINY_MOE["num_moe_experts"],
            "num_experts_per_tok": TINY_MOE["moe_router_topk"]}
    return Qwen3VLMoeConfig(text_config=text, vision_config={**TINY_VISION, "deepstack_visual_indexes": [0, 1]},
                            **QWEN_IDS, tie_word_embeddings=False)


#: the tiny HF checkpoint recipe (collected by :data:`bridge_freeze_harness.hf_checkpoint.HF_FAMILIES`).
HF_CHECKPOINTS = {"qwen3_vl_moe": HFFamily("Qwen3VLMoeForConditionalGeneration", hf_checkpoint_config)}
