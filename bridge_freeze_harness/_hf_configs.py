"""The tiny Hugging Face configs of :data:`bridge_freeze_harness.hf_checkpoint.HF_FAMILIES`, one builder per family,
and the provider fields each family's converted provider needs on the CPU (sizes of the harness's tiny Bridge
configuration: :data:`bridge_freeze_harness.tiny._common.TINY_LM`). Who imports this package, and why:
:mod:`bridge_freeze_harness`.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import torch

from bridge_freeze_harness.tiny._common import TINY_LM

_VOCAB = TINY_LM["vocab_size"]
_HIDDEN = TINY_LM["hidden_size"]
_HEAD_DIM = TINY_LM["kv_channels"]

#: Text-model fields shared by the tiny HF text configs (the HF names of :data:`TINY_LM`'s sizes).
_TEXT: dict[str, Any] = {
    "vocab_size": _VOCAB,
    "hidden_size": _HIDDEN,
    "intermediate_size": TINY_LM["ffn_hidden_size"],
    "num_hidden_layers": TINY_LM["num_layers"],
    "num_attention_heads": TINY_LM["num_attention_heads"],
    "num_key_value_heads": TINY_LM["num_query_groups"],
    "max_position_embeddings": TINY_LM["seq_length"],
    "tie_word_embeddings": False,
}

#: Qwen-style special ids inside the tiny vocabulary, as the HF configs name them (= batches.QWEN_TOKEN_IDS).
_QWEN_IDS: dict[str, int] = {
    "image_token_id": 6,
    "video_token_id": 7,
    "vision_start_token_id": 3,
    "vision_end_token_id": 4,
}
_TEXT_IDS: dict[str, int] = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}


def _qwen3_rope(mrope_section: list[int], **extra: Any) -> dict[str, Any]:
    return {"rope_type": "default", "rope_theta": 1_000_000.0, "mrope_section": mrope_section,
            "mrope_interleaved": True, **extra}


def _qwen25_vl() -> Any:
    from transformers import Qwen2_5_VLConfig

    from bridge_freeze_harness.tiny.qwen25_vl import vision_config

    text = {**_TEXT, **_TEXT_IDS, "rope_parameters": {"rope_type": "default", "rope_theta": 1_000_000.0,
                                                      "mrope_section": [2, 3, 3]}}
    return Qwen2_5_VLConfig(text_config=text, vision_config=vision_config().to_dict(), **_QWEN_IDS,
                            tie_word_embeddings=False)


def _qwen25_cpu(provider: Any) -> dict[str, Any]:
    """Bridge's Qwen2.5-VL conversion keeps the provider's ``mrope_section`` ([16, 24, 24], for head_dim 128):
    the tiny head_dim 16 needs the checkpoint's own."""
    return {"mrope_section": [2, 3, 3]}


def _qwen3_vl() -> Any:
    from transformers import Qwen3VLConfig

    from bridge_freeze_harness.tiny.qwen3_vl import TINY_VISION

    text = {**_TEXT, **_TEXT_IDS, "head_dim": _HEAD_DIM, "rope_parameters": _qwen3_rope([2, 3, 3])}
    return Qwen3VLConfig(text_config=text, vision_config={**TINY_VISION, "deepstack_visual_indexes": [0, 1]},
                         **_QWEN_IDS, tie_word_embeddings=False)


def _qwen3_vl_moe() -> Any:
    from transformers import Qwen3VLMoeConfig

    from bridge_freeze_harness.tiny.qwen3_vl import TINY_VISION
    from bridge_freeze_harness.tiny.qwen3_vl_moe import TINY_MOE

    text = {**_TEXT, **_TEXT_IDS, "head_dim": _HEAD_DIM, "rope_parameters": _qwen3_rope([2, 3, 3]),
            "moe_intermediate_size": TINY_MOE["moe_ffn_hidden_size"], "num_experts": TINY_MOE["num_moe_experts"],
            "num_experts_per_tok": TINY_MOE["moe_router_topk"]}
    return Qwen3VLMoeConfig(text_config=text, vision_config={**TINY_VISION, "deepstack_visual_indexes": [0, 1]},
                            **_QWEN_IDS, tie_word_embeddings=False)


def _qwen35_text() -> dict[str, Any]:
    from bridge_freeze_harness.tiny.qwen35_vl import TINY_HYBRID

    linear = {k: TINY_HYBRID[k] for k in ("linear_conv_kernel_dim", "linear_key_head_dim", "linear_value_head_dim",
                                          "linear_num_key_heads", "linear_num_value_heads")}
    rope = _qwen3_rope(TINY_HYBRID["mrope_section"], partial_rotary_factor=TINY_HYBRID["rotary_percent"])
    return {**_TEXT, **_TEXT_IDS, **linear, "head_dim": _HEAD_DIM, "rope_parameters": rope,
            "layer_types": ["linear_attention", "full_attention"]}


def _qwen35_vl() -> Any:
    from transformers import Qwen3_5Config

    from bridge_freeze_harness.tiny.qwen3_vl import TINY_VISION

    return Qwen3_5Config(text_config=_qwen35_text(), vision_config=dict(TINY_VISION), **_QWEN_IDS,
                         tie_word_embeddings=False)


def _qwen35_vl_moe() -> Any:
    from transformers import Qwen3_5MoeConfig

    from bridge_freeze_harness.tiny.qwen3_vl import TINY_VISION
    from bridge_freeze_harness.tiny.qwen3_vl_moe import TINY_MOE
    from bridge_freeze_harness.tiny.qwen35_vl import TINY_SHARED_EXPERT

    text = {**_qwen35_text(), "moe_intermediate_size": TINY_MOE["moe_ffn_hidden_size"],
            "shared_expert_intermediate_size": TINY_SHARED_EXPERT["moe_shared_expert_intermediate_size"],
            "num_experts": TINY_MOE["num_moe_experts"], "num_experts_per_tok": TINY_MOE["moe_router_topk"]}
    return Qwen3_5MoeConfig(text_config=text, vision_config=dict(TINY_VISION), **_QWEN_IDS,
                            tie_word_embeddings=False)


def _qwen35_cpu(provider: Any) -> dict[str, Any]:
    """As the tiny Qwen3.5 configs: the GDN's PyTorch conv path, no zero-centred gamma (torch norms lack it)."""
    return {"deterministic_mode": True, "layernorm_zero_centered_gamma": False}


def _glm45v() -> Any:
    from transformers import Glm4vMoeConfig

    from bridge_freeze_harness.tiny._common import TINY_MOE_WITH_SHARED_EXPERT as MOE
    from bridge_freeze_harness.tiny.glm45v import vision_config

    text = {**_TEXT, "eos_token_id": 2, "pad_token_id": 0, "attention_bias": True, "head_dim": _HEAD_DIM,
            "use_qk_norm": False,
            "moe_intermediate_size": MOE["moe_ffn_hidden_size"], "n_routed_experts": MOE["num_moe_experts"],
            "num_experts_per_tok": MOE["moe_router_topk"], "n_shared_experts": 1, "first_k_dense_replace": 1,
            "n_group": 1, "topk_group": 1,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10_000.0, "mrope_section": [2, 1, 1],
                                "partial_rotary_factor": 0.5}}
    return Glm4vMoeConfig(text_config=text, vision_config=vision_config().to_dict(), image_token_id=6,
                          video_token_id=7, image_start_token_id=3, image_end_token_id=4, tie_word_embeddings=False)


def _glm45v_cpu(provider: Any) -> dict[str, Any]:
    """Bridge's GLM-4.5V conversion keeps the provider's ``mrope_section`` ([8, 12, 12], for head_dim 128)."""
    return {"mrope_section": [2, 1, 1]}


def _gemma3_vl() -> Any:
    from transformers import Gemma3Config

    from bridge_freeze_harness.tiny.gemma3_vl import IMAGE_TOKEN_ID, TINY_VISION, vision_config

    # Gemma 3 ties the output layer to the embedding (Bridge converts it so).
    text = {**_TEXT, "tie_word_embeddings": True, "head_dim": _HEAD_DIM, "sliding_window": 16,
            "query_pre_attn_scalar": _HEAD_DIM,
            "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0,
            "layer_types": ["sliding_attention", "full_attention"]}
    # Gemma 3's SigLIP tower has no attention-pooling head (Bridge maps none).
    return Gemma3Config(text_config=text, vision_config={**vision_config().to_dict(), "vision_use_head": False},
                        mm_tokens_per_image=TINY_VISION["tokens_per_image"], image_token_index=IMAGE_TOKEN_ID,
                        boi_token_index=3, eoi_token_index=4, tie_word_embeddings=True)


def _gemma3_cpu(provider: Any) -> dict[str, Any]:
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


def _gemma4_vl() -> Any:
    from transformers import Gemma4Config

    from bridge_freeze_harness.tiny.gemma4_vl import TOKEN_IDS, audio_config, text_config, vision_config

    # transformers gives a global (full-attention) layer num_global_key_value_heads only with attention_k_eq_v,
    # num_key_value_heads otherwise; Bridge's Megatron model always the former: keep the two equal.
    # No per-layer input embeddings (Bridge's Gemma4-VL maps none; the MoE checkpoints have none).
    text = {**text_config().to_dict(), "num_global_key_value_heads": TINY_LM["num_query_groups"],
            "hidden_size_per_layer_input": 0}
    return Gemma4Config(text_config=text, vision_config=vision_config().to_dict(),
                        audio_config=audio_config().to_dict(), boi_token_id=3, eoi_token_id=4, boa_token_id=5,
                        eoa_token_index=6, **TOKEN_IDS)


def _ministral3() -> Any:
    from bridge_freeze_harness.tiny.ministral3 import hf_config

    return hf_config()


def _ernie45_vl() -> Any:
    from bridge_freeze_harness.tiny.ernie45_vl import hf_config

    config = hf_config()
    # ERNIE's HF rotary embedding splits head_dim by mrope_section (default [22, 22, 20], for head_dim 128).
    config.text_config.rope_parameters = {**config.text_config.rope_parameters, "mrope_section": [3, 3, 2]}
    for name, value in {"image_start_token_id": 3, "image_end_token_id": 4, "image_token_id": 6,
                        "video_start_token_id": 7, "video_end_token_id": 8, "video_token_id": 9}.items():
        setattr(config, name, value)
    return config


def _minimax_m3_vl() -> Any:
    from transformers import MiniMaxM3VLConfig

    from bridge_freeze_harness.tiny._common import TINY_MOE_WITH_SHARED_EXPERT as MOE
    from bridge_freeze_harness.tiny.minimax_m3_vl import TINY_VISION

    text = {**_TEXT, **_TEXT_IDS, "head_dim": _HEAD_DIM, "rotary_dim": _HEAD_DIM,
            "intermediate_size": MOE["moe_ffn_hidden_size"], "dense_intermediate_size": TINY_LM["ffn_hidden_size"],
            "shared_intermediate_size": MOE["moe_shared_expert_intermediate_size"],
            "num_local_experts": MOE["num_moe_experts"], "num_experts_per_tok": MOE["moe_router_topk"],
            "mlp_layer_types": ["dense", "sparse"], "index_n_heads": 2, "index_head_dim": _HEAD_DIM}
    return MiniMaxM3VLConfig(text_config=text, vision_config=dict(TINY_VISION), image_token_index=120,
                             video_token_index=121, projector_hidden_size=_HIDDEN, tie_word_embeddings=False)


def _minimax_cpu(provider: Any) -> dict[str, Any]:
    """Bridge's MiniMax-M3 block spec with local layers; no zero-centred gamma (torch norms lack it)."""
    from functools import partial

    from megatron.bridge.models.minimax_m3.minimax_m3_bridge import minimax_m3_block_spec

    return {"transformer_layer_spec": partial(minimax_m3_block_spec, use_transformer_engine=False),
            "layernorm_zero_centered_gamma": False}


def _omni_speakers(directory: Path) -> None:
    """``spk_dict.pt``: the speaker table published Qwen2.5-Omni checkpoints carry (transformers' from_pretrained
    of the model requires it, even with audio output off); a tiny one, one speaker."""
    import torch

    torch.save({"Chelsie": {"bos_token": 0, "cond": torch.zeros(4), "ref_mel": torch.zeros(2, 4)}},
               directory / "spk_dict.pt")


def _tiny_hf_config(name: str) -> Any:
    """The HF config a family module writes itself (``hf_config()``: the Qwen Omni thinker-only configs)."""
    import importlib

    return importlib.import_module(f"bridge_freeze_harness.tiny.{name}").hf_config()


def _qwen2_audio() -> Any:
    from bridge_freeze_harness.tiny.qwen2_audio import hf_config

    config = hf_config()
    for name, value in {**_TEXT, **_TEXT_IDS}.items():
        setattr(config.text_config, name, value)
    for name, value in _TEXT_IDS.items():
        setattr(config, name, value)
    config.tie_word_embeddings = False
    return config


#: transformers 5.12.1 applies Qwen2-Audio's two key renamings (the model's and ``Qwen2AudioModel``'s) in reverse
#: on save and writes ``language_model.model.model.*``; the published checkpoints (Qwen2-Audio-7B), which
#: transformers loads and Bridge's mapping reads, have ``language_model.model.*``. Unrenamed, Bridge 0.6.2 raises
#: nothing, yet the converted language model is not the checkpoint's (measured: non-finite word embeddings).
_QWEN2_AUDIO_NAMES = {"language_model.model.model.": "language_model.model."}


def _qwen3_asr() -> Any:
    """Bridge's vendored ``Qwen3ASRConfig`` at the tiny sizes, its text rotary settings as Qwen3-ASR-0.6B's
    (``rope_scaling``: default type, interleaved M-RoPE, whose section the tiny head_dim needs: Bridge reads it)."""
    from megatron.bridge.models.qwen3_asr.hf_qwen3_asr.configuration_qwen3_asr import Qwen3ASRConfig

    from bridge_freeze_harness.tiny.qwen3_asr import MROPE_SECTION, thinker_config

    rope = {"rope_type": "default", "mrope_section": list(MROPE_SECTION), "mrope_interleaved": True,
            "interleaved": True}
    thinker = thinker_config(**_TEXT, rope_theta=1_000_000.0, rope_scaling=rope)
    return Qwen3ASRConfig(thinker_config=thinker)


def _qwen3_asr_patches() -> contextlib.AbstractContextManager[Any]:
    from bridge_freeze_harness.tiny.qwen3_asr import hf_model_patches

    return hf_model_patches()


def _exaone45_vl() -> Any:
    from bridge_freeze_harness.tiny.exaone45_vl import hf_config

    return hf_config()


#: tiny configuration name -> how to write its HF checkpoint (transformers has its model class).
