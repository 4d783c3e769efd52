"""Qwen3-Omni (MoE thinker): real ``Qwen3OmniModelProvider`` / ``Qwen3OmniModel``, the thinker built by ``provide()``.

What ``provide()`` builds (Bridge 0.6.2, ``modeling_qwen3_omni``): ``Qwen3OmniModel`` holds one module,
``thinker`` (``Qwen3OmniThinkerModel``), which holds

- ``thinker.visual``: transformers' ``Qwen3OmniMoeVisionEncoder`` (``patch_embed``, ``pos_embed``, ``blocks``,
  ``merger``: the patch merger into the language model's width, and ``merger_list``: the DeepStack mergers whose
  outputs are added to the first language-model layers' hidden states);
- ``thinker.audio_model``: transformers' ``Qwen3OmniMoeAudioEncoder`` (``conv2d1``-``conv2d3``, ``conv_out``,
  ``layers``, ``ln_post``, then ``proj1`` -> GELU -> ``proj2``: the MLP into the language model's width);
- ``thinker.language_model``: Bridge's ``Qwen3VLGPTModel``, a sparse-MoE Megatron GPT (every layer routed
  experts, QK layernorm; megatron-core's local layers here).

The talker and the code2wav vocoder are NOT built: ``Qwen3OmniModel`` keeps the provider's ``talker_config`` /
``code2wav_config`` as plain attributes (``talker_transformer_config`` / ``code2wav_transformer_config``, HF config
objects, no module, no parameter); Bridge's HF bridge warns that it converts thinker weights only.

CPU notes (provider fields, no patches): ``moe_grouped_gemm=False`` (local per-expert MLPs,
``mlp.experts.local_experts.N``), ``moe_permute_fusion=False``, the ``allgather`` dispatcher (the provider's
``alltoall`` default creates a CUDA stream in its constructor).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from bridge_freeze_harness._bridge_steps import QWEN_OMNI_STEP
from bridge_freeze_harness._hf_configs import HFFamily
from bridge_freeze_harness.batches import TrainSpec
from bridge_freeze_harness.tiny._common import TINY_LM, finalized
from bridge_freeze_harness.tiny.qwen3_vl_moe import TINY_MOE
from bridge_freeze_harness.tiny.qwen25_omni import TOKEN_IDS, add_audio, add_image, omni_rows

REAL = True

TINY_IMAGE = {"patch_size": 4, "temporal_patch_size": 2, "spatial_merge_size": 2}
AUDIO_MEL_BINS = 16
#: A chunk is ``2 * n_window`` = 16 frames; three stride-2 convolutions make 2 tokens of each chunk.
AUDIO_N_WINDOW = 8
#: Two chunks of audio per row -> 4 audio tokens.
AUDIO_FRAMES = 32


def vision_config() -> Any:
    from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import Qwen3OmniMoeVisionEncoderConfig

    return Qwen3OmniMoeVisionEncoderConfig(
        depth=2,
        hidden_size=64,
        intermediate_size=128,
        num_heads=4,
        out_hidden_size=TINY_LM["hidden_size"],
        num_position_embeddings=64,
        deepstack_visual_indexes=[0, 1],
        **TINY_IMAGE,
    )


def audio_config() -> Any:
    from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import Qwen3OmniMoeAudioEncoderConfig

    return Qwen3OmniMoeAudioEncoderConfig(
        num_mel_bins=AUDIO_MEL_BINS,
        encoder_layers=2,
        encoder_attention_heads=4,
        encoder_ffn_dim=64,
        d_model=32,
        output_dim=TINY_LM["hidden_size"],
        max_source_positions=64,
        n_window=AUDIO_N_WINDOW,
        n_window_infer=4 * AUDIO_N_WINDOW,
        downsample_hidden_size=8,
    )


def thinker_config() -> Any:
    """The HF thinker config: Bridge reads its ``vision_config`` / ``audio_config``; the text part is informative."""
    from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import (
        Qwen3OmniMoeTextConfig,
        Qwen3OmniMoeThinkerConfig,
    )

    text = Qwen3OmniMoeTextConfig(
        vocab_size=TINY_LM["vocab_size"],
        hidden_size=TINY_LM["hidden_size"],
        intermediate_size=TINY_LM["ffn_hidden_size"],
        num_hidden_layers=TINY_LM["num_layers"],
        num_attention_heads=TINY_LM["num_attention_heads"],
        num_key_value_heads=TINY_LM["num_query_groups"],
        head_dim=TINY_LM["kv_channels"],
        moe_intermediate_size=TINY_MOE["moe_ffn_hidden_size"],
        num_experts=TINY_MOE["num_moe_experts"],
        num_experts_per_tok=TINY_MOE["moe_router_topk"],
        max_position_embeddings=TINY_LM["seq_length"],
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 3, 3]},
    )
    return Qwen3OmniMoeThinkerConfig(
        audio_config=audio_config(),
        vision_config=vision_config(),
        text_config=text,
        audio_token_id=TOKEN_IDS["audio_token_id"],
        image_token_id=TOKEN_IDS["image_token_id"],
        video_token_id=TOKEN_IDS["video_token_id"],
        audio_start_token_id=TOKEN_IDS["audio_start_token_id"],
    )


def hf_config() -> Any:
    """The tiny HF ``Qwen3OmniMoeConfig`` of a checkpoint: this thinker, no audio output (talker, code2wav unbuilt)."""
    from transformers import Qwen3OmniMoeConfig

    return Qwen3OmniMoeConfig(thinker_config=thinker_config().to_dict(), enable_audio_output=False)


def make_provider(**overrides: Any) -> Any:
    from megatron.bridge.models.qwen_omni.qwen3_omni_provider import Qwen3OmniModelProvider

    provider = Qwen3OmniModelProvider(
        **TINY_LM,
        **TINY_MOE,
        thinker_config=thinker_config(),
        # Qwen3 text: RMSNorm, SwiGLU, QK layernorm, no linear biases, untied output layer.
        share_embeddings_and_output_weights=False,
        mrope_section=[2, 3, 3],
        **TINY_IMAGE,
        **TOKEN_IDS,
    )
    return finalized(provider, **overrides)


def audio_token_count(frames: int) -> int:
    """Audio tokens of ``frames`` mel frames: three stride-2 convolutions per ``2 * n_window``-frame chunk."""
    chunk = 2 * AUDIO_N_WINDOW
    tokens = 0
    for start in range(0, frames, chunk):
        length = min(chunk, frames - start)
        for _ in range(3):
            length = (length - 1) // 2 + 1
        tokens += length
    return tokens


def train_batch(provider: Any, spec: TrainSpec, batch_size: int, gen: torch.Generator) -> dict[str, Any]:
    """Text with one audio clip and one image, so every thinker part gets a gradient: a batch of one row only.

    Bridge 0.6.2's ``Qwen3OmniThinkerModel.get_audio_features`` splits the audio encoder's output per clip with
    the encoder's ``_get_feat_extract_output_lengths``, which transformers 5.12.1 gives the Qwen2.5-Omni formula
    (8 tokens for 32 frames, where this encoder's three stride-2 convolutions make 4): with two clips or more it
    takes the wrong rows and raises "Audio features and audio tokens do not match".
    """
    if batch_size != 1:
        raise ValueError(
            f"the qwen3_omni training batch is a batch of one (asked for {batch_size} rows): Bridge 0.6.2's "
            "Qwen3OmniThinkerModel.get_audio_features splits several audio clips with the wrong per-clip lengths "
            "(the audio encoder's _get_feat_extract_output_lengths); train with batch_size=1"
        )
    batch = omni_rows(provider, spec, batch_size, gen, audio_token_count(AUDIO_FRAMES))
    add_image(batch, provider, spec, gen)
    add_audio(batch, provider, gen, AUDIO_FRAMES)
    return batch


#: Audio AND image in every row (the DeepStack mergers get theirs through the first two LM layers).
TRAIN_SPECS = {
    "qwen3_omni": TrainSpec(
        token_ids=TOKEN_IDS,
        projection_prefixes=("thinker.visual.merger.", "thinker.visual.merger_list."),
        make_batch=train_batch,
        image_grid_thw=(1, 8, 8),
    ),
}


#: the tiny HF checkpoint recipe (collected by :data:`bridge_freeze_harness.hf_checkpoint.HF_FAMILIES`).
HF_CHECKPOINTS = {"qwen3_omni": HFFamily("Qwen3OmniMoeForConditionalGeneration", hf_config)}

#: Bridge's forward step that trains it (collected by :func:`bridge_freeze_harness.cpu_training.forward_step_of`).
FORWARD_STEPS = {
    # One audio clip per micro-batch: with two or more, Bridge 0.6.2's Qwen3OmniThinkerModel.get_audio_features
    # splits the encoder's output with the wrong per-clip lengths and raises "Audio features and audio tokens do
    # not match" (train_batch above). A micro-batch of one sample is what works.
    "qwen3_omni": replace(QWEN_OMNI_STEP, max_micro_batch=1),
}
