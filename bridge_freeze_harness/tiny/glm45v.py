"""GLM-4.5V: real ``GLM45VModelProvider`` / ``GLM45VModel`` (HF Glm4v vision tower, Megatron MoE text model).

The text side is GLM-4.5-Air-shaped but tiny: layer 0 dense, layer 1 MoE (4 routed experts of width 32,
top-2, plus a shared expert), partial (50 %) M-RoPE, QKV bias. Like Bridge's own HF conversion
(``GLM45VBridge.provider_bridge``) it has no MTP layer; ``make_provider(mtp_num_layers=1)`` also builds
(the provider class default), thanks to :func:`cpu_patches`.

CPU-only deviations that do not change module or parameter names: the ``allgather`` token dispatcher
(``alltoall`` creates a CUDA stream in its ``__init__``), no grouped GEMM, no permute fusion, no shared
expert overlap.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from bridge_freeze_harness._hf_configs import TEXT, HFFamily
from bridge_freeze_harness.batches import TrainSpec, image_text_batch_with_token_types
from bridge_freeze_harness.tiny._common import TINY_LM, TINY_MOE_WITH_SHARED_EXPERT, finalized, local_mtp_block_spec

REAL = True

TINY_TEXT_MOE: dict[str, Any] = {
    **TINY_MOE_WITH_SHARED_EXPERT,
    "mtp_num_layers": 0,
    # rotary dim = kv_channels * rotary_percent = 16 * 0.5 = 8 -> 4 frequencies split over (t, h, w).
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


@contextlib.contextmanager
def cpu_patches() -> Iterator[None]:
    """Let an MTP layer build without TE (see :func:`~bridge_freeze_harness.tiny._common.local_mtp_block_spec`).

    Only matters when ``mtp_num_layers`` is non-zero.
    """
    with local_mtp_block_spec():
        yield


#: GLM's image markers (no BOS); the HF M-RoPE index needs ``mm_token_type_ids``.
TRAIN_SPECS = {
    "glm45v": TrainSpec(
        token_ids={
            "eos_token_id": 2,
            "image_start_token_id": 3,
            "image_end_token_id": 4,
            "image_token_id": 6,
            "video_token_id": 7,
        },
        roles={"start": "image_start_token_id", "image": "image_token_id", "end": "image_end_token_id",
               "eos": "eos_token_id"},
        projection_prefixes=("visual.merger.",),
        make_batch=image_text_batch_with_token_types,
    ),
}


def hf_checkpoint_config() -> Any:
    from transformers import Glm4vMoeConfig

    moe = TINY_MOE_WITH_SHARED_EXPERT
    text = {**TEXT, "eos_token_id": 2, "pad_token_id": 0, "attention_bias": True, "head_dim": TINY_LM["kv_channels"],
            "use_qk_norm": False,
            "moe_intermediate_size": moe["moe_ffn_hidden_size"], "n_routed_experts": moe["num_moe_experts"],
            "num_experts_per_tok": moe["moe_router_topk"], "n_shared_experts": 1, "first_k_dense_replace": 1,
            "n_group": 1, "topk_group": 1,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10_000.0, "mrope_section": [2, 1, 1],
                                "partial_rotary_factor": 0.5}}
    return Glm4vMoeConfig(text_config=text, vision_config=vision_config().to_dict(), image_token_id=6,
                          video_token_id=7, image_start_token_id=3, image_end_token_id=4, tie_word_embeddings=False)


def hf_cpu_fields(provider: Any) -> dict[str, Any]:
    """Bridge's GLM-4.5V conversion keeps the provider's ``mrope_section`` ([8, 12, 12], for head_dim 128)."""
    return {"mrope_section": [2, 1, 1]}


#: the tiny HF checkpoint recipe (collected by :data:`bridge_freeze_harness.hf_checkpoint.HF_FAMILIES`).
HF_CHECKPOINTS = {
    "glm45v": HFFamily("Glm4vMoeForConditionalGeneration", hf_checkpoint_config, hf_cpu_fields, grouped_experts=True),
}
