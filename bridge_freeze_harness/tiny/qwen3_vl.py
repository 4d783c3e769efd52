"""Qwen3-VL (dense): real ``Qwen3VLModelProvider`` / ``Qwen3VLModel``, Megatron vision tower."""

from __future__ import annotations

from typing import Any

from bridge_freeze_harness._hf_configs import QWEN_IDS, TEXT, TEXT_IDS, HFFamily, qwen3_rope
from bridge_freeze_harness.batches import QWEN_TOKEN_IDS, TrainSpec
from bridge_freeze_harness.tiny._common import TINY_LM, finalized

REAL = True
TINY_IMAGE = {"patch_size": 4, "temporal_patch_size": 2, "spatial_merge_size": 2}
#: The vision tower sizes shared by the Qwen3-VL and Qwen3.5-VL tiny configs (HF vision config fields).
TINY_VISION = {
    "depth": 2,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_heads": 4,
    "out_hidden_size": 64,
    "num_position_embeddings": 64,
    **TINY_IMAGE,
}


def vision_config() -> Any:
    from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLVisionConfig

    return Qwen3VLVisionConfig(**TINY_VISION, deepstack_visual_indexes=[0, 1])


def make_provider(**overrides: Any) -> Any:
    from megatron.bridge.models.qwen_vl.qwen3_vl_provider import Qwen3VLModelProvider

    provider = Qwen3VLModelProvider(
        **TINY_LM,
        vision_config=vision_config(),
        mrope_section=[2, 3, 3],
        deepstack_visual_indexes=[0, 1],
        out_hidden_size=64,
        **TINY_IMAGE,
    )
    return finalized(provider, **overrides)


#: One image of 8x8 patches (16 image tokens) between text, Qwen special ids inside the tiny vocabulary.
TRAIN_SPECS = {
    "qwen3_vl": TrainSpec(
        token_ids=QWEN_TOKEN_IDS,
        projection_prefixes=("vision_model.merger.", "vision_model.decoder.deepstack_merger_list."),
    ),
}


def hf_checkpoint_config() -> Any:
    from transformers import Qwen3VLConfig

    text = {**TEXT, **TEXT_IDS, "head_dim": TINY_LM["kv_channels"], "rope_parameters": qwen3_rope([2, 3, 3])}
    return Qwen3VLConfig(text_config=text, vision_config={**TINY_VISION, "deepstack_visual_indexes": [0, 1]},
                         **QWEN_IDS, tie_word_embeddings=False)


#: the tiny HF checkpoint recipe (collected by :data:`bridge_freeze_harness.hf_checkpoint.HF_FAMILIES`).
HF_CHECKPOINTS = {"qwen3_vl": HFFamily("Qwen3VLForConditionalGeneration", hf_checkpoint_config)}
