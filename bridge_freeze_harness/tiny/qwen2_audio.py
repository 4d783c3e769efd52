"""Qwen2-Audio: real ``Qwen2AudioModelProvider`` / ``Qwen2AudioModel``, Hugging Face audio tower and projector.

Three top-level modules: ``audio_tower`` (transformers' Whisper-style ``Qwen2AudioEncoder``: ``conv1``,
``conv2``, ``embed_positions``, ``layers``, ``layer_norm``), ``multi_modal_projector`` (one ``linear``, from
the encoder's width to the language model's) and the Megatron ``language_model`` (a ``GPTModel`` on
megatron-core's local layers, Qwen2 settings as Bridge's ``Qwen2AudioBridge`` sets them). Both HF modules are
built from a tiny ``Qwen2AudioConfig`` (the provider's ``hf_config``). No CPU patch is needed: the provider
builds its language model through the default GPT layer spec, which the generic build patches make local.

``audio_tower.embed_positions.weight`` is built with ``requires_grad=False`` by transformers (fixed
sinusoidal positions, loaded from the checkpoint) and Bridge never changes it.

The encoder takes exactly ``2 * max_source_positions`` mel frames (it refuses any other length); with
:data:`TINY_AUDIO` that is 32 frames of 16 bins -> 16 after the stride-2 convolution -> 8 audio tokens after
the encoder's average pooling, which replace 8 expanded ``<|AUDIO|>`` placeholders in the text.
"""

from __future__ import annotations

from typing import Any

import torch

from bridge_freeze_harness._hf_configs import TEXT, TEXT_IDS, HFFamily
from bridge_freeze_harness.batches import Batch, TrainSpec, random_text, text_batch, text_range, token_row
from bridge_freeze_harness.tiny._common import TINY_LM, finalized

REAL = True

#: What the installed Bridge must have to build this family (``tiny.bridge_lacks``): ``Qwen2AudioModel.__init__``
#: binds transformers' ``_merge_input_ids_with_audio_features``, which transformers 5 dropped from
#: ``Qwen2AudioForConditionalGeneration``; a Bridge that finds it elsewhere has ``_QWEN2_AUDIO_MERGE_METHOD``
#: (SkyRL's pin 91a15142 looks only there, and fails at build).
BRIDGE_NEEDS = {
    "qwen2_audio": {
        "megatron.bridge.models.qwen_audio.modeling_qwen2_audio:_QWEN2_AUDIO_MERGE_METHOD"
        " | transformers:Qwen2AudioForConditionalGeneration._merge_input_ids_with_audio_features":
            "the transformers merge method Bridge's Qwen2AudioModel binds",
    },
}

#: HF audio encoder sizes (``Qwen2AudioEncoderConfig`` fields); no dropout, no layer drop.
TINY_AUDIO: dict[str, Any] = {
    "d_model": 32,
    "encoder_layers": 2,
    "encoder_attention_heads": 2,
    "encoder_ffn_dim": 64,
    "num_mel_bins": 16,
    "max_source_positions": 16,
    "dropout": 0.0,
    "attention_dropout": 0.0,
    "activation_dropout": 0.0,
    "encoder_layerdrop": 0.0,
}
#: Mel frames the encoder accepts (its two convolutions' strides are 1 and 2), and audio tokens they give.
AUDIO_FRAMES = 2 * TINY_AUDIO["max_source_positions"]
AUDIO_TOKENS = AUDIO_FRAMES // 4

#: Special token ids inside the tiny vocabulary (the real ones are >= 151643); provider fields.
TOKEN_IDS: dict[str, int] = {
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "audio_token_id": 5,
}


def hf_config() -> Any:
    """The tiny ``Qwen2AudioConfig`` (audio encoder + Qwen2 text sizes matching :data:`TINY_LM`)."""
    from transformers import Qwen2AudioConfig

    return Qwen2AudioConfig(
        audio_config=dict(TINY_AUDIO),
        text_config={
            "vocab_size": TINY_LM["vocab_size"],
            "hidden_size": TINY_LM["hidden_size"],
            "intermediate_size": TINY_LM["ffn_hidden_size"],
            "num_hidden_layers": TINY_LM["num_layers"],
            "num_attention_heads": TINY_LM["num_attention_heads"],
            "num_key_value_heads": TINY_LM["num_query_groups"],
        },
        audio_token_index=TOKEN_IDS["audio_token_id"],
    )


def make_provider(**overrides: Any) -> Any:
    import torch.nn.functional as F
    from megatron.bridge.models.qwen_audio.qwen2_audio_provider import Qwen2AudioModelProvider

    provider = Qwen2AudioModelProvider(
        **TINY_LM,
        hf_config=hf_config(),
        # Qwen2 text model, as Qwen2AudioBridge.provider_bridge sets it.
        normalization="RMSNorm",
        gated_linear_unit=True,
        activation_func=F.silu,
        add_qkv_bias=True,
        add_bias_linear=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        # Untied output layer (as Qwen2-Audio-7B), so language_model.output_layer exists.
        share_embeddings_and_output_weights=False,
        cross_entropy_loss_fusion=False,
        **TOKEN_IDS,
    )
    return finalized(provider, **overrides)


def audio_batch(provider: Any, spec: TrainSpec, batch_size: int, gen: torch.Generator) -> Batch:
    """``bos text audio*8 text eos`` per row (expanded placeholders), 32 mel frames per row, all valid."""
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
    bins = int(provider.hf_config.audio_config.num_mel_bins)
    batch["input_features"] = torch.randn(batch_size, bins, AUDIO_FRAMES, generator=gen, dtype=provider.params_dtype)
    batch["feature_attention_mask"] = torch.ones(batch_size, AUDIO_FRAMES, dtype=torch.long)
    return batch


TRAIN_SPECS = {
    "qwen2_audio": TrainSpec(
        token_ids=TOKEN_IDS,
        roles={},
        make_batch=audio_batch,
    ),
}


def hf_checkpoint_config() -> Any:
    config = hf_config()
    for name, value in {**TEXT, **TEXT_IDS}.items():
        setattr(config.text_config, name, value)
    for name, value in TEXT_IDS.items():
        setattr(config, name, value)
    config.tie_word_embeddings = False
    return config


#: transformers 5.12.1 applies Qwen2-Audio's two key renamings (the model's and ``Qwen2AudioModel``'s) in reverse
#: on save and writes ``language_model.model.model.*``; the published checkpoints (Qwen2-Audio-7B), which
#: transformers loads and Bridge's mapping reads, have ``language_model.model.*``. Unrenamed, Bridge 0.6.2 raises
#: nothing, yet the converted language model is not the checkpoint's (measured: non-finite word embeddings).
PUBLISHED_NAMES = {"language_model.model.model.": "language_model.model."}

#: the tiny HF checkpoint recipe (collected by :data:`bridge_freeze_harness.hf_checkpoint.HF_FAMILIES`).
HF_CHECKPOINTS = {
    "qwen2_audio": HFFamily("Qwen2AudioForConditionalGeneration", hf_checkpoint_config,
                            published_prefixes=PUBLISHED_NAMES),
}
