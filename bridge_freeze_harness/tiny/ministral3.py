"""Ministral 3 (VLM): real ``Ministral3ModelProvider`` / ``Ministral3Model``.

The model is Bridge's own class built through its own provider: an HF Pixtral vision tower
(``vision_tower``), the HF ``Mistral3MultiModalProjector`` (``multi_modal_projector``) and a
Megatron GPT language model (``language_model``). The HF side is built from a tiny
``Mistral3Config`` made in code (no model hub).

One CPU patch (:func:`cpu_patches`): Bridge's Ministral layer spec puts
``MinistralTEDotProductAttention`` (a subclass of TransformerEngine's attention, which cannot be
instantiated without CUDA) into the core-attention slot. While building, that name resolves to
megatron-core's local ``DotProductAttention`` instead. Core attention holds no parameters, so
parameter names and the module tree are unchanged; only the Llama-4 query scaling of the forward
pass is absent on the CPU.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from bridge_freeze_harness._hf_configs import HFFamily
from bridge_freeze_harness.batches import TrainSpec, image_rows
from bridge_freeze_harness.patching import patched
from bridge_freeze_harness.tiny._common import TINY_LM, finalized

REAL = True

#: Language-model fields of the tiny text config, mirrored into the HF ``text_config``.
_VOCAB = TINY_LM["vocab_size"]
_HIDDEN = TINY_LM["hidden_size"]
#: YaRN as in the real checkpoints (factor 16 over the original context), on a tiny context.
_YARN_FACTOR = 16.0
_MAX_POSITIONS = int(TINY_LM["seq_length"] * _YARN_FACTOR)


def hf_config() -> Any:
    """A tiny ``Mistral3Config`` (Pixtral vision tower + Ministral3 text config), made offline."""
    from transformers.models.ministral3.configuration_ministral3 import Ministral3Config
    from transformers.models.mistral3.configuration_mistral3 import Mistral3Config
    from transformers.models.pixtral.configuration_pixtral import PixtralVisionConfig

    vision = PixtralVisionConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        head_dim=16,
        image_size=64,
        patch_size=8,
    )
    text = Ministral3Config(
        vocab_size=_VOCAB,
        hidden_size=_HIDDEN,
        intermediate_size=TINY_LM["ffn_hidden_size"],
        num_hidden_layers=TINY_LM["num_layers"],
        num_attention_heads=TINY_LM["num_attention_heads"],
        num_key_value_heads=TINY_LM["num_query_groups"],
        head_dim=TINY_LM["kv_channels"],
        max_position_embeddings=_MAX_POSITIONS,
        rope_parameters={
            "type": "yarn",
            "rope_theta": 1000000.0,
            "factor": _YARN_FACTOR,
            "original_max_position_embeddings": TINY_LM["seq_length"],
            "max_position_embeddings": _MAX_POSITIONS,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
            "llama_4_scaling_beta": 0.1,
        },
    )
    return Mistral3Config(
        vision_config=vision,
        text_config=text,
        spatial_merge_size=2,
        tie_word_embeddings=False,
    )


def make_provider(**overrides: Any) -> Any:
    from megatron.bridge.models.ministral3.ministral3_provider import Ministral3ModelProvider

    config = hf_config()
    rope = config.text_config.rope_parameters
    provider = Ministral3ModelProvider(
        **TINY_LM,
        share_embeddings_and_output_weights=False,
        rotary_base=rope["rope_theta"],
        yarn_rotary_scaling_factor=rope["factor"],
        yarn_original_max_position_embeddings=rope["original_max_position_embeddings"],
        hf_config=config,
        image_token_id=config.image_token_index,
    )
    return finalized(provider, **overrides)


@contextlib.contextmanager
def cpu_patches() -> Iterator[None]:
    """Core attention -> megatron-core's local ``DotProductAttention`` while building."""
    from megatron.bridge.models.ministral3 import ministral3_provider
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    with patched([(ministral3_provider, "MinistralTEDotProductAttention", DotProductAttention)]):
        yield


#: One 32x32 picture: 4x4 Pixtral patches of 8 px, merged 2x2 by the projector -> 4 image tokens.
IMAGE_PIXELS = 32


def train_batch(provider: Any, spec: TrainSpec, batch_size: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """``bos text image*4 text eos`` per row; ``pixel_values [b, 3, H, W]`` and their ``image_sizes``."""
    vision = provider.hf_config.vision_config
    tokens = (IMAGE_PIXELS // vision.patch_size // provider.hf_config.spatial_merge_size) ** 2
    batch = image_rows(provider, spec, batch_size, gen, tokens)
    shape = (batch_size, 3, IMAGE_PIXELS, IMAGE_PIXELS)
    batch["pixel_values"] = torch.randn(*shape, generator=gen, dtype=provider.params_dtype)
    batch["image_sizes"] = torch.tensor([[IMAGE_PIXELS, IMAGE_PIXELS]] * batch_size)
    return batch


#: Mistral's BOS / EOS ids are 1 / 2 (no provider field holds them); the image placeholder is the HF config's.
TRAIN_SPECS = {
    "ministral3": TrainSpec(
        token_ids={"image_token_id": 10},
        batch_ids={"bos_token_id": 1, "eos_token_id": 2},
        projection_prefixes=("multi_modal_projector.",),
        make_batch=train_batch,
    ),
}


#: the tiny HF checkpoint recipe (collected by :data:`bridge_freeze_harness.hf_checkpoint.HF_FAMILIES`).
HF_CHECKPOINTS = {"ministral3": HFFamily("Mistral3ForConditionalGeneration", hf_config)}
