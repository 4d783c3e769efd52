"""Gemma4-VL (MoE): real ``Gemma4VLModelProvider`` / ``Gemma4VLModel``, HF Gemma4 vision and audio towers.

The model has five top-level parts: ``vision_tower`` and ``embed_vision`` (the vision projection),
``audio_tower`` and ``embed_audio`` (built only when ``audio_config`` is set; the default tiny
configuration sets it so the audio parts exist, ``make_provider(audio_config=None)`` drops them),
and the Megatron ``language_model``.

CPU changes, all through provider fields (no patches):

- ``transformer_layer_spec``: Bridge's own ``_gemma4_block_spec`` with ``use_transformer_engine=False``
  (the default decides from ``HAVE_TE``, which is true whenever megatron-core's TE extension module
  imports, even without TransformerEngine) and megatron-core's local ``DotProductAttention`` in place of
  ``Gemma4TEDotProductAttention`` (a TE subclass). Layer, attention, MoE layer and router classes stay
  Gemma4's own (``Gemma4TransformerLayer``, ``Gemma4SelfAttention``, ``Gemma4MoELayer``,
  ``Gemma4TopKRouter``).
- MoE: ``moe_grouped_gemm=False`` (local per-expert MLPs), ``moe_permute_fusion=False`` and the
  ``allgather`` token dispatcher (``alltoall`` creates a ``torch.cuda.Stream`` in its constructor).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import torch

from bridge_freeze_harness._bridge_steps import vlm_step_with
from bridge_freeze_harness._hf_configs import HFFamily
from bridge_freeze_harness.batches import TrainSpec, random_text, text_batch, text_range, token_row
from bridge_freeze_harness.patching import patched
from bridge_freeze_harness.tiny._common import TINY_LM, finalized

REAL = True

#: What the installed Bridge must have to build this family (``tiny.bridge_lacks``): without the ``audio_config``
#: field (SkyRL's pin 91a15142) Bridge builds Gemma 4 without its audio tower, two of the family's parts; that
#: Bridge has no ``modeling_gemma4`` either (the block spec the CPU patches wrap).
BRIDGE_NEEDS = {
    "gemma4_vl": {
        "megatron.bridge.models.gemma_vl.gemma4_vl_provider:Gemma4VLModelProvider.audio_config":
            "the provider field for Gemma 4's audio tower",
        "megatron.bridge.models.gemma.modeling_gemma4:_gemma4_block_spec": "Gemma 4's layer spec",
    },
}

TINY_VISION_HIDDEN = 32
TINY_AUDIO_HIDDEN = 32
#: MoE sizes (the shared expert uses TINY_LM's ffn_hidden_size).
TINY_MOE = {"num_moe_experts": 4, "moe_router_topk": 2, "moe_ffn_hidden_size": 32}
#: Layer 1 sliding-window attention, layer 2 global attention (Gemma4's real pattern is 5:1).
ATTN_PATTERN = (1, 1)
GLOBAL_HEAD_DIM = 32
#: Placeholders inside the tiny vocabulary (the real ids, ~258k, are past its end).
TOKEN_IDS = {
    "image_token_id": TINY_LM["vocab_size"] - 3,
    "video_token_id": TINY_LM["vocab_size"] - 2,
    "audio_token_id": TINY_LM["vocab_size"] - 1,
}


def local_block_spec(config: Any) -> Any:
    """Gemma4's MoE block spec built on megatron-core's local layers (no TE)."""
    from megatron.bridge.models.gemma.modeling_gemma4 import _gemma4_block_spec
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    spec = _gemma4_block_spec(config, use_transformer_engine=False)
    for layer_spec in spec.layer_specs:
        layer_spec.submodules.self_attention.submodules.core_attention = DotProductAttention
    return spec


def vision_config() -> Any:
    from transformers.models.gemma4.configuration_gemma4 import Gemma4VisionConfig

    return Gemma4VisionConfig(
        hidden_size=TINY_VISION_HIDDEN,
        intermediate_size=2 * TINY_VISION_HIDDEN,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=TINY_VISION_HIDDEN // 2,
        patch_size=4,
        position_embedding_size=64,
        pooling_kernel_size=2,
    )


def text_config() -> Any:
    """HF text config: ``embed_vision`` / ``embed_audio`` read its hidden size, forward its pad id."""
    from transformers.models.gemma4.configuration_gemma4 import Gemma4TextConfig

    return Gemma4TextConfig(
        vocab_size=TINY_LM["vocab_size"],
        hidden_size=TINY_LM["hidden_size"],
        intermediate_size=TINY_LM["ffn_hidden_size"],
        num_hidden_layers=TINY_LM["num_layers"],
        num_attention_heads=TINY_LM["num_attention_heads"],
        num_key_value_heads=TINY_LM["num_query_groups"],
        head_dim=TINY_LM["kv_channels"],
        global_head_dim=GLOBAL_HEAD_DIM,
        num_global_key_value_heads=1,
        layer_types=["sliding_attention", "full_attention"],
        sliding_window=16,
        enable_moe_block=True,
        num_experts=TINY_MOE["num_moe_experts"],
        top_k_experts=TINY_MOE["moe_router_topk"],
        moe_intermediate_size=TINY_MOE["moe_ffn_hidden_size"],
        vocab_size_per_layer_input=TINY_LM["vocab_size"],
        hidden_size_per_layer_input=8,
    )


def audio_config() -> Any:
    from transformers.models.gemma4.configuration_gemma4 import Gemma4AudioConfig

    return Gemma4AudioConfig(
        hidden_size=TINY_AUDIO_HIDDEN,
        num_hidden_layers=2,
        num_attention_heads=2,
        subsampling_conv_channels=[8, 4],
        output_proj_dims=TINY_AUDIO_HIDDEN,
    )


def make_provider(**overrides: Any) -> Any:
    from megatron.bridge.models.gemma_vl.gemma4_vl_provider import Gemma4VLModelProvider

    provider = Gemma4VLModelProvider(
        **TINY_LM,
        **TINY_MOE,
        vision_config=vision_config(),
        text_config=text_config(),
        audio_config=audio_config(),
        transformer_layer_spec=local_block_spec,
        moe_shared_expert_intermediate_size=TINY_LM["ffn_hidden_size"],
        moe_grouped_gemm=False,
        moe_permute_fusion=False,
        moe_token_dispatcher_type="allgather",
        global_head_dim=GLOBAL_HEAD_DIM,
        num_global_key_value_heads=1,
        window_size=16,
        interleaved_attn_pattern=ATTN_PATTERN,
        **TOKEN_IDS,
    )
    return finalized(provider, **overrides)


#: Synthetic media: an 8x8-patch image (16 soft tokens after the 2x2 pooling) and 16 frames of audio
#: features (8 bins: the tiny subsampling projection's input width) -> 4 audio tokens.
IMAGE_GRID = (8, 8)
AUDIO_FRAMES, AUDIO_BINS, AUDIO_TOKENS = 16, 8, 4


def train_batch(provider: Any, spec: TrainSpec, batch_size: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """``bos text image*16 text audio*4 eos`` per row; patches + (x, y) patch positions; audio features."""
    gh, gw = IMAGE_GRID
    image_tokens = gh * gw // (vision_config().pooling_kernel_size ** 2)
    low, high = text_range(spec, int(provider.vocab_size))
    rows = [
        token_row(
            [
                spec.token_ids["bos_token_id"],
                random_text(gen, spec.text_before, low, high),
                torch.full((image_tokens,), spec.token_ids["image_token_id"]),
                random_text(gen, spec.text_after, low, high),
                torch.full((AUDIO_TOKENS,), spec.token_ids["audio_token_id"]),
                spec.token_ids["eos_token_id"],
            ]
        )
        for _ in range(batch_size)
    ]
    no_loss = [spec.token_ids["image_token_id"], spec.token_ids["audio_token_id"]]
    batch = text_batch(rows, provider, spec.token_ids["eos_token_id"], no_loss)
    patch = vision_config().patch_size
    dtype = provider.params_dtype
    batch["pixel_values"] = torch.rand(batch_size, gh * gw, 3 * patch * patch, generator=gen, dtype=dtype)
    ys, xs = torch.meshgrid(torch.arange(gh), torch.arange(gw), indexing="ij")
    batch["image_position_ids"] = torch.stack([xs.flatten(), ys.flatten()], dim=-1).expand(batch_size, -1, -1)
    batch["input_features"] = torch.randn(batch_size, AUDIO_FRAMES, AUDIO_BINS, generator=gen, dtype=dtype)
    return batch


#: Image AND audio in every row, so the audio parts (``audio_tower``, ``embed_audio``) get gradients too.
TRAIN_SPECS = {
    "gemma4_vl": TrainSpec(
        token_ids={"bos_token_id": 2, "eos_token_id": 1, **TOKEN_IDS},
        projection_prefixes=("embed_vision.",),
        make_batch=train_batch,
    ),
}


def _local_layers(fn: Any) -> Any:
    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **{**kwargs, "use_transformer_engine": False})

    return call


@contextlib.contextmanager
def cpu_patches() -> Iterator[None]:
    """Any Gemma4 build: Bridge's default spec (``_gemma4_block_spec`` with TE) on local layers.

    Its decoder block spec is asked for local layers; its TE core attention is megatron-core's local
    ``DotProductAttention``; the post-norm row-parallel ``linear_proj`` it adds with TE is
    :class:`~bridge_freeze_harness.local_layers.RowParallelLinearLayerNorm` (TE's names).
    """
    from megatron.bridge.models.gemma import modeling_gemma4
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    from bridge_freeze_harness.local_layers import RowParallelLinearLayerNorm

    patches = [
        (modeling_gemma4, "get_gpt_decoder_block_spec", _local_layers(modeling_gemma4.get_gpt_decoder_block_spec)),
        (modeling_gemma4, "Gemma4TEDotProductAttention", DotProductAttention),
        (modeling_gemma4, "TERowParallelLinearLayerNorm", RowParallelLinearLayerNorm),
    ]
    with patched(patches):
        yield


def hf_checkpoint_config() -> Any:
    from transformers import Gemma4Config

    # transformers gives a global (full-attention) layer num_global_key_value_heads only with attention_k_eq_v,
    # num_key_value_heads otherwise; Bridge's Megatron model always the former: keep the two equal.
    # No per-layer input embeddings (Bridge's Gemma4-VL maps none; the MoE checkpoints have none).
    text = {**text_config().to_dict(), "num_global_key_value_heads": TINY_LM["num_query_groups"],
            "hidden_size_per_layer_input": 0}
    return Gemma4Config(text_config=text, vision_config=vision_config().to_dict(),
                        audio_config=audio_config().to_dict(), boi_token_id=3, eoi_token_id=4, boa_token_id=5,
                        eoa_token_index=6, **TOKEN_IDS)


#: the tiny HF checkpoint recipe (collected by :data:`bridge_freeze_harness.hf_checkpoint.HF_FAMILIES`).
HF_CHECKPOINTS = {"gemma4_vl": HFFamily("Gemma4ForConditionalGeneration", hf_checkpoint_config, grouped_experts=True)}

#: Bridge's forward step that trains it (collected by :func:`bridge_freeze_harness.cpu_training.forward_step_of`).
FORWARD_STEPS = {
    # Gemma4VLModel.forward takes the audio as input_features next to the image; Bridge 0.6.2's own Gemma4 collate
    # (gemma4_vl_collate_fn -> GenericVisualInputs) drops it, so audio_tower / embed_audio would get no gradient.
    "gemma4_vl": vlm_step_with("input_features"),
}
