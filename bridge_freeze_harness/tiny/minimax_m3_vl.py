"""MiniMax-M3-VL: real ``MiniMaxM3VLModelProvider`` / ``MiniMaxM3VLModel``.

Bridge's own model class built through its own provider: Bridge's local CLIP-style vision tower
(``vision_tower.vision_model``), two projector MLPs (``multi_modal_projector`` on each patch, then
``patch_merge_mlp`` on each merged 2x2 group) and a Megatron GPT MoE language model (``language_model``:
layer 0 dense, layer 1 MoE with 4 routed experts + a shared expert, QK norm, no tied output layer).
``lightning_indexer_layers=[1]`` builds one ``lightning_indexers.1`` module: checkpoint-only state
that Bridge creates with ``requires_grad=False`` and never runs.

The text layer spec is set the way Bridge's own HF conversion sets it
(``partial(minimax_m3_block_spec, use_transformer_engine=HAVE_TE)``), here with ``False``. The published
config has zero-centred norms (``use_gemma_norm``), which megatron-core's torch norm refuses; every CPU build
gives such a config the harness's ``Norm`` (:func:`~bridge_freeze_harness.local_specs.zero_centred_torch_norms`;
same parameters). The tiny configuration has none, so it is unaffected.
CPU-only deviations that do not change module or parameter names: the ``allgather`` token dispatcher,
no grouped GEMM, no permute fusion, no shared expert overlap.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch

from bridge_freeze_harness._hf_configs import TEXT, TEXT_IDS, HFFamily
from bridge_freeze_harness.batches import TrainSpec, flat_patch_batch
from bridge_freeze_harness.tiny._common import TINY_LM, TINY_MOE_WITH_SHARED_EXPERT, finalized

REAL = True

#: What the installed Bridge must have to build this family (``tiny.bridge_lacks``; SkyRL's pin 91a15142 has no
#: MiniMax-M3).
BRIDGE_NEEDS = {
    "minimax_m3_vl": {
        "megatron.bridge.models.minimax_m3.minimax_m3_bridge:MiniMaxM3VLModelProvider": "the MiniMax-M3-VL provider",
    },
}

#: Field names of the checkpoint's ``vision_config`` (a plain dict is accepted by the model).
TINY_VISION: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "patch_size": 4,
    "temporal_patch_size": 2,
    "spatial_merge_size": 2,
}

TINY_TEXT_MOE: dict[str, Any] = {
    **TINY_MOE_WITH_SHARED_EXPERT,
    "mtp_num_layers": None,
}


def make_provider(**overrides: Any) -> Any:
    from megatron.bridge.models.minimax_m3.minimax_m3_bridge import MiniMaxM3VLModelProvider, minimax_m3_block_spec

    provider = MiniMaxM3VLModelProvider(
        **TINY_LM,
        **TINY_TEXT_MOE,
        transformer_layer_spec=partial(minimax_m3_block_spec, use_transformer_engine=False),
        normalization="RMSNorm",
        qk_layernorm=True,
        gated_linear_unit=True,
        add_bias_linear=False,
        position_embedding_type="rope",
        share_embeddings_and_output_weights=False,
        vision_config=dict(TINY_VISION),
        spatial_merge_size=TINY_VISION["spatial_merge_size"],
        projector_hidden_size=64,
        lightning_indexer_layers=[1],
        index_n_heads=2,
        index_head_dim=16,
        image_token_id=120,
        video_token_id=121,
    )
    return finalized(provider, **overrides)


def train_batch(provider: Any, spec: TrainSpec, batch_size: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Qwen-style flattened patches of an 8x8-patch image (16 image tokens), geometry from :data:`TINY_VISION`."""
    geometry = (3, TINY_VISION["temporal_patch_size"], TINY_VISION["patch_size"], TINY_VISION["spatial_merge_size"])
    return flat_patch_batch(provider, spec, batch_size, gen, geometry)


#: No provider field holds BOS / EOS; the image / video placeholders are the tiny configuration's.
TRAIN_SPECS = {
    "minimax_m3_vl": TrainSpec(
        token_ids={"image_token_id": 120, "video_token_id": 121},
        batch_ids={"bos_token_id": 1, "eos_token_id": 2},
        projection_prefixes=("multi_modal_projector.", "patch_merge_mlp."),
        make_batch=train_batch,
    ),
}


def hf_checkpoint_config() -> Any:
    from transformers import MiniMaxM3VLConfig

    moe, head_dim = TINY_MOE_WITH_SHARED_EXPERT, TINY_LM["kv_channels"]
    text = {**TEXT, **TEXT_IDS, "head_dim": head_dim, "rotary_dim": head_dim,
            "intermediate_size": moe["moe_ffn_hidden_size"], "dense_intermediate_size": TINY_LM["ffn_hidden_size"],
            "shared_intermediate_size": moe["moe_shared_expert_intermediate_size"],
            "num_local_experts": moe["num_moe_experts"], "num_experts_per_tok": moe["moe_router_topk"],
            "mlp_layer_types": ["dense", "sparse"], "index_n_heads": 2, "index_head_dim": head_dim}
    return MiniMaxM3VLConfig(text_config=text, vision_config=dict(TINY_VISION), image_token_index=120,
                             video_token_index=121, projector_hidden_size=TINY_LM["hidden_size"],
                             tie_word_embeddings=False)


def hf_cpu_fields(provider: Any) -> dict[str, Any]:
    """Bridge's MiniMax-M3 block spec with local layers; no zero-centred gamma (torch norms lack it)."""
    from megatron.bridge.models.minimax_m3.minimax_m3_bridge import minimax_m3_block_spec

    return {"transformer_layer_spec": partial(minimax_m3_block_spec, use_transformer_engine=False),
            "layernorm_zero_centered_gamma": False}


#: the tiny HF checkpoint recipe (collected by :data:`bridge_freeze_harness.hf_checkpoint.HF_FAMILIES`).
HF_CHECKPOINTS = {
    "minimax_m3_vl": HFFamily("MiniMaxM3SparseForConditionalGeneration", hf_checkpoint_config, hf_cpu_fields,
                              grouped_experts=True),
}
