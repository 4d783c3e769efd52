"""Qwen3-ASR: real ``Qwen3ASRModelProvider`` / ``Qwen3ASRModel``, Bridge's vendored HF audio encoder.

Everything sits under ``thinker``: ``thinker.audio_model`` (Bridge's vendored transformers
``Qwen3ASRAudioEncoder``: ``conv2d1..3``, ``conv_out``, ``layers``, ``ln_post``, then the two-layer projector
``proj1`` -> GELU -> ``proj2`` into the language model's width) and ``thinker.language_model`` (Bridge's
``Qwen3VLGPTModel``, M-RoPE, QK layer norm, on megatron-core's local layers). The provider's ``provide()``
asks for ``get_gpt_layer_with_transformer_engine_spec``, which the generic build patches make local; no CPU
patch of its own is needed.

Audio geometry. The encoder cuts each utterance into chunks of ``2 * n_window`` mel frames, while its
output-length formula (``_get_feat_extract_output_lengths``) hard-codes 100-frame chunks: the tiny config
keeps ``n_window=50`` so both agree. 40 frames of 16 mel bins (one chunk) -> three stride-2 convolutions ->
5 audio tokens, which replace 5 ``audio_token_id`` placeholders in the text.

Forward. The thinker computes M-RoPE positions from ``attention_mask`` read as a ``[batch, seq]`` padding
mask, but passes the same ``attention_mask`` to the language model, which on the CPU needs the explicit
causal ``[1, 1, s, s]`` mask (megatron-core's default one is made on "cuda"). The synthetic batch therefore
gives the causal mask AND the positions the thinker would compute for an unpadded row (``0..s-1`` on all
three M-RoPE axes), so the thinker does not compute them.
"""

from __future__ import annotations

from typing import Any

import torch

from bridge_freeze_harness.batches import Batch, TrainSpec, random_text, text_batch, text_range, token_row
from bridge_freeze_harness.tiny._common import TINY_LM, finalized

REAL = True

#: HF audio encoder sizes (``Qwen3ASRAudioEncoderConfig`` fields): output_dim is the language model's width.
TINY_AUDIO: dict[str, Any] = {
    "num_mel_bins": 16,
    "encoder_layers": 2,
    "encoder_attention_heads": 2,
    "encoder_ffn_dim": 64,
    "d_model": 32,
    "output_dim": TINY_LM["hidden_size"],
    "downsample_hidden_size": 8,
    "max_source_positions": 32,
    "n_window": 50,
    "n_window_infer": 100,
}
#: One chunk of mel frames, and the audio tokens it gives (40 -> 20 -> 10 -> 5).
AUDIO_FRAMES, AUDIO_TOKENS = 40, 5

#: Special token ids inside the tiny vocabulary (the real ones are >= 151643). ``audio_token_id`` and
#: ``audio_start_token_id`` are provider fields; BOS / EOS are batch-only (the model never reads them).
TOKEN_IDS: dict[str, int] = {"audio_token_id": 5, "audio_start_token_id": 6}
BATCH_IDS: dict[str, int] = {"bos_token_id": 1, "eos_token_id": 2}
#: kv_channels 16 -> 8 rotary frequencies, split over the three M-RoPE axes.
MROPE_SECTION = [2, 3, 3]


def thinker_config() -> Any:
    """The tiny ``Qwen3ASRThinkerConfig`` (Bridge's vendored copy; its text sizes match :data:`TINY_LM`)."""
    from megatron.bridge.models.qwen3_asr.hf_qwen3_asr.configuration_qwen3_asr import Qwen3ASRThinkerConfig

    return Qwen3ASRThinkerConfig(
        audio_config=dict(TINY_AUDIO),
        text_config={
            "vocab_size": TINY_LM["vocab_size"],
            "hidden_size": TINY_LM["hidden_size"],
            "intermediate_size": TINY_LM["ffn_hidden_size"],
            "num_hidden_layers": TINY_LM["num_layers"],
            "num_attention_heads": TINY_LM["num_attention_heads"],
            "num_key_value_heads": TINY_LM["num_query_groups"],
            "head_dim": TINY_LM["kv_channels"],
        },
        **TOKEN_IDS,
    )


def make_provider(**overrides: Any) -> Any:
    from megatron.bridge.models.qwen3_asr.qwen3_asr_provider import Qwen3ASRModelProvider

    provider = Qwen3ASRModelProvider(
        **TINY_LM,
        thinker_config=thinker_config(),
        mrope_section=list(MROPE_SECTION),
        # Untied output layer, so thinker.language_model.output_layer exists.
        share_embeddings_and_output_weights=False,
        cross_entropy_loss_fusion=False,
        **TOKEN_IDS,
    )
    return finalized(provider, **overrides)


def audio_batch(provider: Any, spec: TrainSpec, batch_size: int, gen: torch.Generator) -> Batch:
    """``bos text audio*5 text eos`` per row, 40 mel frames per row, explicit M-RoPE positions (module docstring)."""
    ids = spec.all_ids()
    audio = int(provider.audio_token_id)
    low, high = text_range(spec, int(provider.vocab_size))
    rows = [
        token_row(
            [
                ids["bos_token_id"],
                random_text(gen, spec.text_before, low, high),
                torch.full((AUDIO_TOKENS,), audio),
                random_text(gen, spec.text_after, low, high),
                ids["eos_token_id"],
            ]
        )
        for _ in range(batch_size)
    ]
    batch = text_batch(rows, provider, ids["eos_token_id"], [audio])
    seq_len = batch["input_ids"].shape[1]
    batch["position_ids"] = torch.arange(seq_len).expand(3, batch_size, seq_len).contiguous()
    bins = int(provider.thinker_config.audio_config.num_mel_bins)
    batch["input_features"] = torch.randn(batch_size, bins, AUDIO_FRAMES, generator=gen, dtype=provider.params_dtype)
    batch["feature_attention_mask"] = torch.ones(batch_size, AUDIO_FRAMES, dtype=torch.long)
    return batch


TRAIN_SPECS = {
    "qwen3_asr": TrainSpec(token_ids=TOKEN_IDS, batch_ids=BATCH_IDS, roles={}, make_batch=audio_batch),
}
