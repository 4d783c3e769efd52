"""Qwen2.5-VL: real ``Qwen25VLModelProvider`` / ``Qwen25VLModel``, Hugging Face vision tower.

The vision tower (``visual``: ``patch_embed``, ``blocks``, ``merger``) is the transformers
``Qwen2_5_VisionTransformerPretrainedModel``, built from a tiny ``Qwen2_5_VLVisionConfig``; the
language model (``language_model``) is a Megatron ``GPTModel`` with megatron-core's local layers.

The special token ids default to Qwen's real ones (151k+), far outside the tiny vocabulary of 128,
so :func:`make_provider` moves them to small ids (:data:`TOKEN_IDS`) that the embedding can look up.
"""

from __future__ import annotations

from typing import Any

from bridge_freeze_harness._hf_configs import QWEN_IDS, TEXT, TEXT_IDS, HFFamily
from bridge_freeze_harness.batches import TrainSpec
from bridge_freeze_harness.tiny._common import TINY_LM, finalized

REAL = True

#: Patch geometry of the tiny vision tower (pixels per patch side, frames per patch, merge factor).
TINY_IMAGE = {"patch_size": 4, "temporal_patch_size": 2, "spatial_merge_size": 2}

#: Special token ids inside the tiny vocabulary (the real ones are >= 151643).
TOKEN_IDS: dict[str, int] = {
    "bos_token_id": 1,
    "eos_token_id": 2,
    "vision_start_token_id": 3,
    "vision_end_token_id": 4,
    "vision_token_id": 5,
    "image_token_id": 6,
    "video_token_id": 7,
}


def vision_config() -> Any:
    from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig

    return Qwen2_5_VLVisionConfig(
        depth=2,
        hidden_size=64,
        intermediate_size=128,
        num_heads=4,
        out_hidden_size=64,
        # window_size is in pixels: 16 px = 4 patches = 2 merged tokens per window side, so an
        # 8x8-patch image spans 2x2 windows; block 1 attends over the full image.
        window_size=16,
        fullatt_block_indexes=[1],
        **TINY_IMAGE,
    )


def make_provider(**overrides: Any) -> Any:
    import torch.nn.functional as F
    from megatron.bridge.models.qwen_vl.qwen25_vl_provider import Qwen25VLModelProvider

    provider = Qwen25VLModelProvider(
        **TINY_LM,
        vision_config=vision_config(),
        # Qwen2.5 text model: RMSNorm, SwiGLU, bias on QKV only (as the Qwen2.5-VL bridge sets it).
        normalization="RMSNorm",
        gated_linear_unit=True,
        activation_func=F.silu,
        add_qkv_bias=True,
        add_bias_linear=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        # Untied output layer (as Qwen2.5-VL 7B/32B/72B; 3B ties them), so language_model.output_layer exists.
        share_embeddings_and_output_weights=False,
        # The fused cross entropy is torch.compile'd: seconds of compilation on a CPU's first step.
        cross_entropy_loss_fusion=False,
        # kv_channels 16 -> 8 rotary frequencies, split over (t, h, w).
        mrope_section=[2, 3, 3],
        **TOKEN_IDS,
    )
    return finalized(provider, **overrides)


TRAIN_SPECS = {"qwen25_vl": TrainSpec(token_ids=TOKEN_IDS, projection_prefixes=("visual.merger.",))}


def hf_checkpoint_config() -> Any:
    from transformers import Qwen2_5_VLConfig

    text = {**TEXT, **TEXT_IDS, "rope_parameters": {"rope_type": "default", "rope_theta": 1_000_000.0,
                                                    "mrope_section": [2, 3, 3]}}
    return Qwen2_5_VLConfig(text_config=text, vision_config=vision_config().to_dict(), **QWEN_IDS,
                            tie_word_embeddings=False)


def hf_cpu_fields(provider: Any) -> dict[str, Any]:
    """Bridge's Qwen2.5-VL conversion keeps the provider's ``mrope_section`` ([16, 24, 24], for head_dim 128):
    the tiny head_dim 16 needs the checkpoint's own."""
    return {"mrope_section": [2, 3, 3]}


#: the tiny HF checkpoint recipe (collected by :data:`bridge_freeze_harness.hf_checkpoint.HF_FAMILIES`).
HF_CHECKPOINTS = {"qwen25_vl": HFFamily("Qwen2_5_VLForConditionalGeneration", hf_checkpoint_config, hf_cpu_fields)}
