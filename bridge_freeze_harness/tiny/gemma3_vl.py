"""Gemma3-VL: real ``Gemma3VLModelProvider`` / ``Gemma3VLModel``, HF SigLIP vision tower.

Gemma3's own layer spec (``gemma3_layer_spec``) is TransformerEngine-only (fused layer-norm linears,
a TE core-attention subclass), so the language model is built from megatron-core's local GPT layer
spec with Gemma3's real ``Gemma3SelfAttention`` class, and with ``layernorm_zero_centered_gamma=False``
(the torch norms reject zero-centred gamma). Module names down to ``language_model.decoder.layers``
and every vision-side name are the real ones; inside a layer the norms sit where the local spec puts
them (``input_layernorm`` / ``pre_mlp_layernorm`` instead of TE's fused ``linear_qkv.layer_norm_weight``,
no ``post_layernorm`` after ``linear_proj`` / ``linear_fc2``). Numerics are not Gemma's.

Gemma3-VL's fixed ``attention_backend=fused`` makes megatron-core set ``NVTE_*`` variables in
``os.environ``; :func:`~bridge_freeze_harness.local_specs.cpu_build_patches` isolates every build from them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from bridge_freeze_harness._hf_configs import TEXT, HFFamily
from bridge_freeze_harness.batches import TrainSpec, image_rows
from bridge_freeze_harness.patching import patched
from bridge_freeze_harness.tiny._common import TINY_LM, finalized

REAL = True

#: SigLIP: 16x16 pixels, 4x4 patches -> 16 patches per image, pooled 2x2 -> 4 tokens per image.
TINY_VISION = {"hidden_size": 32, "image_size": 16, "patch_size": 4, "tokens_per_image": 4}
#: Image placeholder inside the tiny vocabulary (the real id, 262144, is past its end).
IMAGE_TOKEN_ID = TINY_LM["vocab_size"] - 1


def local_layer_spec(config: Any) -> Any:
    """megatron-core's local GPT layer spec with Gemma3's self-attention class (no TE)."""
    from megatron.bridge.models.gemma.gemma3_provider import Gemma3SelfAttention
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    spec = get_gpt_layer_local_spec(qk_layernorm=config.qk_layernorm, normalization=config.normalization)
    spec.submodules.self_attention.module = Gemma3SelfAttention
    return spec


def vision_config() -> Any:
    from transformers import SiglipVisionConfig

    return SiglipVisionConfig(
        hidden_size=TINY_VISION["hidden_size"],
        intermediate_size=2 * TINY_VISION["hidden_size"],
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=TINY_VISION["image_size"],
        patch_size=TINY_VISION["patch_size"],
    )


def projector_config() -> Any:
    from megatron.bridge.models.gemma_vl.modeling_gemma3_vl import Gemma3VLMultimodalProjectorConfig

    return Gemma3VLMultimodalProjectorConfig(
        input_size=TINY_VISION["hidden_size"],
        hidden_size=TINY_LM["hidden_size"],
        image_size=TINY_VISION["image_size"],
        patch_dim=TINY_VISION["patch_size"],
        tokens_per_image=TINY_VISION["tokens_per_image"],
        layernorm_zero_centered_gamma=False,
        params_dtype=TINY_LM["params_dtype"],
        use_cpu_initialization=True,
    )


def make_provider(**overrides: Any) -> Any:
    from megatron.bridge.models.gemma_vl.gemma3_vl_provider import Gemma3VLModelProvider

    provider = Gemma3VLModelProvider(
        **TINY_LM,
        vision_config=vision_config(),
        vision_projector_config=projector_config(),
        mm_tokens_per_image=TINY_VISION["tokens_per_image"],
        layernorm_zero_centered_gamma=False,
        transformer_layer_spec=local_layer_spec,
        window_size=16,
        image_token_id=IMAGE_TOKEN_ID,
    )
    return finalized(provider, **overrides)


def train_batch(provider: Any, spec: TrainSpec, batch_size: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """One 16x16 RGB picture per row (``pixel_values [b, 3, H, W]``, SigLIP's input), 4 image tokens for it."""
    batch = image_rows(provider, spec, batch_size, gen, TINY_VISION["tokens_per_image"])
    size = TINY_VISION["image_size"]
    batch["pixel_values"] = torch.randn(batch_size, 3, size, size, generator=gen, dtype=provider.params_dtype)
    return batch


#: Gemma's BOS/EOS (2/1) are inside the tiny vocabulary already; no vision start/end markers are needed.
TRAIN_SPECS = {
    "gemma3_vl": TrainSpec(
        token_ids={"bos_token_id": 2, "eos_token_id": 1, "image_token_id": IMAGE_TOKEN_ID},
        projection_prefixes=("multi_modal_projector.",),
        make_batch=train_batch,
    ),
}


def _zero_centred_norm(default: Any) -> Any:
    """A norm builder: the local ``Norm`` for a config with zero-centred gamma, else ``default``."""

    def build(config: Any, hidden_size: int, eps: float = 1e-5, **kwargs: Any) -> Any:
        from bridge_freeze_harness.local_layers import Norm

        norm = Norm if getattr(config, "layernorm_zero_centered_gamma", False) else default
        return norm(config=config, hidden_size=hidden_size, eps=eps, **kwargs)

    return build


@contextlib.contextmanager
def cpu_patches() -> Iterator[None]:
    """Any Gemma3 build (e.g. a full-size config, whose spec is Bridge's TE-only ``gemma3_layer_spec``).

    The TE classes that spec names resolve to :mod:`bridge_freeze_harness.local_layers` ones with TE's
    parameter names (fused ``linear_qkv.layer_norm_weight``, ``linear_proj.post_layernorm``, zero-centred
    gamma) and megatron-core's local ``DotProductAttention``. The tiny configuration does not need this (it
    builds from the local GPT spec, see above), but it runs under it too.

    Two more norms are built outside that spec: the projector's ``mm_soft_embed_norm``
    (``modeling_gemma3_vl.TENorm``) and the decoder's ``final_layernorm`` (megatron-core's
    ``transformer_block.LayerNormImpl``, torch's norm without TE). A real Gemma 3 config has zero-centred gamma,
    which torch's norm refuses: with it, both become the local ``Norm`` (same ``weight`` name); without it (the
    tiny configuration) they stay what they were.
    """
    from megatron.bridge.models.gemma import gemma3_provider
    from megatron.bridge.models.gemma_vl import modeling_gemma3_vl
    from megatron.core.transformer import transformer_block
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    from bridge_freeze_harness.local_layers import LayerNormColumnParallelLinear, Norm, RowParallelLinearLayerNorm

    patches = [
        (gemma3_provider, "TELayerNormColumnParallelLinear", LayerNormColumnParallelLinear),
        (gemma3_provider, "TERowParallelLinearLayerNorm", RowParallelLinearLayerNorm),
        (gemma3_provider, "Gemma3TEDotProductAttention", DotProductAttention),
        (gemma3_provider, "TENorm", Norm),
        (modeling_gemma3_vl, "TENorm", _zero_centred_norm(modeling_gemma3_vl.TENorm)),
        (transformer_block, "LayerNormImpl", _zero_centred_norm(transformer_block.LayerNormImpl)),
    ]
    with patched(patches):
        yield


def hf_checkpoint_config() -> Any:
    from transformers import Gemma3Config

    head_dim = TINY_LM["kv_channels"]
    # Gemma 3 ties the output layer to the embedding (Bridge converts it so).
    text = {**TEXT, "tie_word_embeddings": True, "head_dim": head_dim, "sliding_window": 16,
            "query_pre_attn_scalar": head_dim,
            "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0,
            "layer_types": ["sliding_attention", "full_attention"]}
    # Gemma 3's SigLIP tower has no attention-pooling head (Bridge maps none).
    return Gemma3Config(text_config=text, vision_config={**vision_config().to_dict(), "vision_use_head": False},
                        mm_tokens_per_image=TINY_VISION["tokens_per_image"], image_token_index=IMAGE_TOKEN_ID,
                        boi_token_index=3, eoi_token_index=4, tie_word_embeddings=True)


def hf_cpu_fields(provider: Any) -> dict[str, Any]:
    """No zero-centred gamma, in the language model and the projector's own config (CPU-initialised float32).

    The projector's ``mm_soft_embed_norm`` and the decoder's final norm are ``TENorm``, megatron-core's torch norm
    without TE, which refuses it (``AssertionError: zero_centered_gamma not supported by torch LayerNorm``).
    Names and shapes are unchanged; norm numerics are not Gemma's (as in the tiny configuration).
    """
    import copy

    projector = copy.copy(provider.vision_projector_config)
    projector.layernorm_zero_centered_gamma = False
    projector.params_dtype = torch.float32
    projector.use_cpu_initialization = True
    # Bridge sets only the projector's widths; its image geometry keeps the defaults (896 px, 14 px patches,
    # 256 tokens): take the checkpoint's.
    vision = provider.vision_config
    projector.image_size = vision.image_size
    projector.patch_dim = vision.patch_size
    projector.tokens_per_image = provider.mm_tokens_per_image
    return {"vision_projector_config": projector, "layernorm_zero_centered_gamma": False}


#: the tiny HF checkpoint recipe (collected by :data:`bridge_freeze_harness.hf_checkpoint.HF_FAMILIES`).
HF_CHECKPOINTS = {"gemma3_vl": HFFamily("Gemma3ForConditionalGeneration", hf_checkpoint_config, hf_cpu_fields)}
