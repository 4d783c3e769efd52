"""Qwen2.5-Omni: real ``Qwen25OmniModelProvider`` / ``Qwen25OmniModel``, the thinker built through ``provide()``.

What ``provide()`` builds (Bridge 0.6.2, ``modeling_qwen25_omni``): ``Qwen25OmniModel`` holds one module,
``thinker`` (``Qwen25OmniThinkerModel``), which holds

- ``thinker.visual``: transformers' ``Qwen2_5OmniVisionEncoder`` (``patch_embed``, ``blocks``, ``merger``: the
  patch merger that projects into the language model's width);
- ``thinker.audio_model``: transformers' ``Qwen2_5OmniAudioEncoder`` (``conv1``, ``conv2``, ``layers``,
  ``ln_post``, ``proj``: the linear into the language model's width, and ``audio_bos_eos_token``, an embedding
  the forward never reads);
- ``thinker.language_model``: Bridge's ``Qwen3VLGPTModel`` (a Megatron GPT with megatron-core's local layers here).

The talker and the token2wav vocoder are NOT built: the provider's ``talker_config`` / ``token2wav_config`` are
passed to ``Qwen25OmniModel.__init__``, which drops them (no module, no parameter, not even a stored attribute).

Tiny configuration: the HF thinker config (vision, audio, text sub-configs) is made in code, with sizes that
match the tiny Megatron language model (``out_hidden_size`` / ``output_dim`` = 64); the special token ids are
moved inside the tiny vocabulary (:data:`TOKEN_IDS`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from bridge_freeze_harness._bridge_steps import QWEN_OMNI_STEP
from bridge_freeze_harness._hf_configs import HFFamily
from bridge_freeze_harness.batches import TrainSpec, next_token_targets, random_text, text_range, token_row
from bridge_freeze_harness.tiny._common import TINY_LM, finalized

REAL = True

#: Patch geometry of the tiny vision tower (pixels per patch side, frames per patch, merge factor).
TINY_IMAGE = {"patch_size": 4, "temporal_patch_size": 2, "spatial_merge_size": 2}
#: Mel bins of the tiny audio encoder's input, and its chunk half-width (a chunk is ``2 * n_window`` frames).
AUDIO_MEL_BINS = 16
AUDIO_N_WINDOW = 8

#: Special token ids inside the tiny vocabulary (the real ones are >= 151643), as provider fields.
TOKEN_IDS: dict[str, int] = {
    "bos_token_id": 1,
    "eos_token_id": 2,
    "vision_start_token_id": 3,
    "vision_end_token_id": 4,
    "image_token_id": 6,
    "video_token_id": 7,
    "audio_token_id": 8,
    "audio_start_token_id": 9,
    "audio_end_token_id": 10,
}


def vision_config() -> Any:
    from transformers.models.qwen2_5_omni.configuration_qwen2_5_omni import Qwen2_5OmniVisionEncoderConfig

    return Qwen2_5OmniVisionEncoderConfig(
        depth=2,
        hidden_size=64,
        intermediate_size=128,
        num_heads=4,
        out_hidden_size=TINY_LM["hidden_size"],
        # 16 px windows = 4 patches = 2 merged tokens a side: an 8x8-patch image spans 2x2 windows;
        # block 1 attends over the whole image (as Qwen2.5-VL's tiny tower).
        window_size=16,
        fullatt_block_indexes=[1],
        **TINY_IMAGE,
    )


def audio_config() -> Any:
    from transformers.models.qwen2_5_omni.configuration_qwen2_5_omni import Qwen2_5OmniAudioEncoderConfig

    return Qwen2_5OmniAudioEncoderConfig(
        num_mel_bins=AUDIO_MEL_BINS,
        encoder_layers=2,
        encoder_attention_heads=4,
        encoder_ffn_dim=64,
        d_model=32,
        output_dim=TINY_LM["hidden_size"],
        max_source_positions=64,
        n_window=AUDIO_N_WINDOW,
    )


def thinker_config() -> Any:
    """The HF thinker config: Bridge reads its ``vision_config`` / ``audio_config``; the text part is informative."""
    from transformers.models.qwen2_5_omni.configuration_qwen2_5_omni import (
        Qwen2_5OmniTextConfig,
        Qwen2_5OmniThinkerConfig,
    )

    text = Qwen2_5OmniTextConfig(
        vocab_size=TINY_LM["vocab_size"],
        hidden_size=TINY_LM["hidden_size"],
        intermediate_size=TINY_LM["ffn_hidden_size"],
        num_hidden_layers=TINY_LM["num_layers"],
        num_attention_heads=TINY_LM["num_attention_heads"],
        num_key_value_heads=TINY_LM["num_query_groups"],
        max_position_embeddings=TINY_LM["seq_length"],
        tie_word_embeddings=False,
    )
    # Bridge's HF bridge reads the M-RoPE split from rope_scaling (kv_channels 16 -> 8 frequencies over t, h, w).
    text.rope_scaling = {"rope_type": "default", "mrope_section": [2, 3, 3]}
    return Qwen2_5OmniThinkerConfig(
        audio_config=audio_config(),
        vision_config=vision_config(),
        text_config=text,
        image_token_index=TOKEN_IDS["image_token_id"],
        video_token_index=TOKEN_IDS["video_token_id"],
        audio_token_index=TOKEN_IDS["audio_token_id"],
        audio_start_token_id=TOKEN_IDS["audio_start_token_id"],
        audio_end_token_id=TOKEN_IDS["audio_end_token_id"],
    )


def hf_config() -> Any:
    """The tiny HF ``Qwen2_5OmniConfig`` of a checkpoint: this thinker, no audio output (talker, token2wav unbuilt)."""
    from transformers import Qwen2_5OmniConfig

    return Qwen2_5OmniConfig(thinker_config=thinker_config().to_dict(), enable_audio_output=False)


def make_provider(**overrides: Any) -> Any:
    from megatron.bridge.models.qwen_omni.qwen25_omni_provider import Qwen25OmniModelProvider

    provider = Qwen25OmniModelProvider(
        **TINY_LM,
        thinker_config=thinker_config(),
        head_dim=TINY_LM["kv_channels"],
        # kv_channels 16 -> 8 rotary frequencies, split over (t, h, w).
        mrope_section=[2, 3, 3],
        # Untied output layer (as Qwen2.5-Omni 7B), so thinker.language_model.output_layer exists.
        share_embeddings_and_output_weights=False,
        **TINY_IMAGE,
        **TOKEN_IDS,
    )
    return finalized(provider, **overrides)


#: Synthetic media per row: one image of 8x8 patches (16 image tokens after the 2x2 merge) and 16 frames of
#: audio features (one 16-frame chunk; conv2 halves it to 8, the 2x average pool to 4 audio tokens).
IMAGE_GRID_THW = (1, 8, 8)
AUDIO_FRAMES = 16


def audio_token_count(frames: int) -> int:
    """Audio tokens the Qwen2.5-Omni audio encoder makes of ``frames`` mel frames (stride-2 conv, then pool 2)."""
    after_conv = (frames - 1) // 2 + 1
    return (after_conv - 2) // 2 + 1


def omni_rows(
    provider: Any, spec: TrainSpec, batch_size: int, gen: torch.Generator, audio_tokens: int
) -> dict[str, Any]:
    """``bos text [audio_start] audio* [audio_end] text [vision_start] image* [vision_end] text eos`` per row.

    No ``attention_mask``: the thinker hands its ``attention_mask`` to the M-RoPE index, which reads it as HF's
    padding mask ``[b, s]``, not Megatron's causal one; without it both take their causal / unpadded default.
    """
    ids = spec.all_ids()
    low, high = text_range(spec, int(provider.vocab_size))
    t, h, w = spec.image_grid_thw
    merge = int(provider.thinker_config.vision_config.spatial_merge_size)
    image_tokens = t * h * w // (merge * merge)

    def row() -> torch.Tensor:
        return token_row(
            [
                ids["bos_token_id"],
                random_text(gen, spec.text_before, low, high),
                ids["audio_start_token_id"],
                torch.full((audio_tokens,), ids["audio_token_id"]),
                ids["audio_end_token_id"],
                random_text(gen, 2, low, high),
                ids["vision_start_token_id"],
                torch.full((image_tokens,), ids["image_token_id"]),
                ids["vision_end_token_id"],
                random_text(gen, spec.text_after, low, high),
                ids["eos_token_id"],
            ]
        )

    input_ids = torch.stack([row() for _ in range(batch_size)]).long()
    if input_ids.shape[1] > int(provider.seq_length):
        raise ValueError(f"synthetic sequence ({input_ids.shape[1]}) is longer than the provider's seq_length")
    no_loss = [ids["image_token_id"], ids["audio_token_id"]]
    labels, loss_mask = next_token_targets(input_ids, ids["eos_token_id"], no_loss)
    return {"input_ids": input_ids, "labels": labels, "loss_mask": loss_mask}


def add_image(batch: dict[str, Any], provider: Any, spec: TrainSpec, gen: torch.Generator) -> None:
    """Flattened patches ``[b * t*h*w, C * Tp * P * P]`` and ``image_grid_thw`` (Qwen vision input).

    The geometry is the HF vision config's (what the encoder reads): a provider converted from a checkpoint keeps
    Bridge's default ``patch_size`` field (Qwen2.5-Omni's bridge does not copy it from the vision config).
    """
    batch_size = batch["input_ids"].shape[0]
    t, h, w = spec.image_grid_thw
    vision = provider.thinker_config.vision_config
    patch_dim = int(vision.in_channels) * int(vision.temporal_patch_size) * int(vision.patch_size) ** 2
    batch["pixel_values"] = torch.randn(batch_size * t * h * w, patch_dim, generator=gen, dtype=provider.params_dtype)
    batch["image_grid_thw"] = torch.tensor([spec.image_grid_thw] * batch_size, dtype=torch.long)


def add_audio(batch: dict[str, Any], provider: Any, gen: torch.Generator, frames: int) -> None:
    """Mel features ``[b, mel, frames]`` and an all-ones ``feature_attention_mask`` ``[b, frames]`` (HF layout)."""
    batch_size = batch["input_ids"].shape[0]
    mel = int(provider.thinker_config.audio_config.num_mel_bins)
    batch["input_features"] = torch.randn(batch_size, mel, frames, generator=gen, dtype=provider.params_dtype)
    batch["feature_attention_mask"] = torch.ones(batch_size, frames, dtype=torch.long)


def train_batch(provider: Any, spec: TrainSpec, batch_size: int, gen: torch.Generator) -> dict[str, Any]:
    """Text with one audio clip and one image per row, so every thinker part gets a gradient."""
    batch = omni_rows(provider, spec, batch_size, gen, audio_token_count(AUDIO_FRAMES))
    add_image(batch, provider, spec, gen)
    add_audio(batch, provider, gen, AUDIO_FRAMES)
    return batch


#: Audio AND image in every row. ``audio_bos_eos_token`` is never read by the forward (no gradient, ever).
TRAIN_SPECS = {
    "qwen25_omni": TrainSpec(
        token_ids=TOKEN_IDS,
        projection_prefixes=("thinker.visual.merger.",),
        make_batch=train_batch,
        image_grid_thw=IMAGE_GRID_THW,
    ),
}


def write_speakers(directory: Path) -> None:
    """``spk_dict.pt``: the speaker table published Qwen2.5-Omni checkpoints carry (transformers' from_pretrained
    of the model requires it, even with audio output off); a tiny one, one speaker."""
    torch.save({"Chelsie": {"bos_token": 0, "cond": torch.zeros(4), "ref_mel": torch.zeros(2, 4)}},
               directory / "spk_dict.pt")


#: the tiny HF checkpoint recipe (collected by :data:`bridge_freeze_harness.hf_checkpoint.HF_FAMILIES`).
HF_CHECKPOINTS = {
    "qwen25_omni": HFFamily("Qwen2_5OmniForConditionalGeneration", hf_config, extra_files=write_speakers),
}

#: Bridge's forward step that trains it (collected by :func:`bridge_freeze_harness.cpu_training.forward_step_of`).
FORWARD_STEPS = {
    # Bridge 0.6.2 has no step (nor recipe) of its own for Qwen2.5-Omni; its Qwen3-Omni step fits the model:
    # Qwen25OmniModel.forward takes the same keywords (input_ids, labels, loss_mask, the media keys above).
    "qwen25_omni": QWEN_OMNI_STEP,
}
