"""Tiny random Hugging Face checkpoints on disk, per family, and the CPU provider Bridge converts them to.

The user's flow is ``AutoBridge.from_hf_pretrained(dir)`` -> ``to_megatron_provider(load_weights=True)`` ->
flags -> build -> train -> ``export_hf_weights`` / ``save_hf_pretrained``. This module gives that flow a
checkpoint to start from without the model hub:

- :func:`write_tiny_hf_checkpoint` builds the family's transformers model class from a tiny config made in
  code (sizes of the harness's tiny Bridge configuration: 2 text layers, hidden 64, vocabulary 128), moves
  EVERY floating-point tensor of its state dict away from its initial value by seeded Gaussian noise (norm
  weights included, so a weight that Bridge does not load cannot pass a comparison with the file) and saves
  it with ``save_pretrained`` (safetensors, float32, ``config.json`` and ``generation_config.json``) with a
  tiny word-level tokenizer (Bridge's ``save_hf_pretrained`` saves the source's tokenizer; nothing else is read);
- :func:`cpu_provider` turns the ``AutoBridge`` of such a folder into a provider that builds and trains on the
  CPU: Bridge's own conversion, then only CPU settings (float32, no fused kernels, the ``allgather`` MoE
  dispatcher, no grouped GEMM), the tiny special token ids of the family's train spec, and the few
  per-family fields listed in :data:`HF_FAMILIES`. Build it with :func:`bridge_freeze_harness.tiny.build_tiny_chunks`
  (the family's CPU build patches apply).

A family whose HF class transformers 5.12.1 lacks but Bridge vendors (Qwen3-ASR) names that class's module
(``model_module``) and the patches that close its transformers-5 gaps (``model_patches``, entered by
:func:`hf_model_context` around every build, load and forward of it). Families whose Hugging Face checkpoint
cannot be written offline are in :data:`NO_HF_CHECKPOINT`, with the reason. Who imports this package, and why:
:mod:`bridge_freeze_harness`.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from bridge_freeze_harness.cpu_runtime import CPU_FUSIONS_OFF
from bridge_freeze_harness.tiny._common import TINY_LM

logger = logging.getLogger(__name__)

#: Standard deviation of the noise added to every floating-point tensor of a written checkpoint.
NOISE_STD = 0.02

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

#: Provider fields with no CPU implementation in a MoE model (names and shapes unchanged).
_CPU_MOE: dict[str, Any] = {
    "moe_grouped_gemm": False,
    "moe_permute_fusion": False,
    "moe_shared_expert_overlap": False,
    "moe_token_dispatcher_type": "allgather",
}

#: Provider fields every CPU build from a converted checkpoint gets.
_CPU_FIELDS: dict[str, Any] = {
    **CPU_FUSIONS_OFF,
    "params_dtype": torch.float32,
    "pipeline_dtype": torch.float32,
    "bf16": False,
    "fp16": False,
    "use_cpu_initialization": True,
}


@dataclass(frozen=True)
class HFFamily:
    """How to write one tiny configuration's HF checkpoint, and what its converted provider needs on the CPU."""

    #: the transformers model class (``save_pretrained`` writes, ``from_pretrained`` reads the checkpoint).
    model_class: str
    #: the tiny transformers config of the checkpoint.
    config: Callable[[], Any]
    #: provider fields set after Bridge's conversion, besides the generic CPU ones: provider -> fields.
    cpu_fields: Callable[[Any], Mapping[str, Any]] = field(default=lambda provider: {})
    #: Bridge maps this family's routed experts only as TE grouped-GEMM parameters
    #: (``mlp.experts.linear_fc1.weight<i>``): build them so (:func:`grouped_experts_on_cpu`).
    grouped_experts: bool = False
    #: saved tensor-name prefix -> the prefix published checkpoints use, rewritten in the safetensors after
    #: ``save_pretrained`` (where transformers 5.12.1 saves names no published checkpoint has).
    published_prefixes: Mapping[str, str] = field(default_factory=dict)
    #: files a published checkpoint carries beside the weights, written by this function into the directory.
    extra_files: Callable[[Path], None] | None = None
    #: the module that defines ``model_class`` (a vendored copy where transformers has none).
    model_module: str = "transformers"
    #: what building, loading or running ``model_class`` needs under transformers 5.12.1 (a vendored class written
    #: for transformers 4), applied by :func:`hf_model_context`.
    model_patches: Callable[[], contextlib.AbstractContextManager[Any]] | None = None


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
HF_FAMILIES: dict[str, HFFamily] = {
    "qwen25_vl": HFFamily("Qwen2_5_VLForConditionalGeneration", _qwen25_vl, _qwen25_cpu),
    "qwen3_vl": HFFamily("Qwen3VLForConditionalGeneration", _qwen3_vl),
    "qwen3_vl_moe": HFFamily("Qwen3VLMoeForConditionalGeneration", _qwen3_vl_moe),
    "qwen35_vl": HFFamily("Qwen3_5ForConditionalGeneration", _qwen35_vl, _qwen35_cpu),
    "qwen35_vl_moe": HFFamily("Qwen3_5MoeForConditionalGeneration", _qwen35_vl_moe, _qwen35_cpu),
    "glm45v": HFFamily("Glm4vMoeForConditionalGeneration", _glm45v, _glm45v_cpu, grouped_experts=True),
    "gemma3_vl": HFFamily("Gemma3ForConditionalGeneration", _gemma3_vl, _gemma3_cpu),
    "gemma4_vl": HFFamily("Gemma4ForConditionalGeneration", _gemma4_vl, grouped_experts=True),
    "ministral3": HFFamily("Mistral3ForConditionalGeneration", _ministral3),
    "ernie45_vl": HFFamily("Ernie4_5_VLMoeForConditionalGeneration", _ernie45_vl),
    "minimax_m3_vl": HFFamily(
        "MiniMaxM3SparseForConditionalGeneration", _minimax_m3_vl, _minimax_cpu, grouped_experts=True
    ),
    "exaone45_vl": HFFamily("Exaone4_5_ForConditionalGeneration", _exaone45_vl),
    "qwen2_audio": HFFamily("Qwen2AudioForConditionalGeneration", _qwen2_audio,
                            published_prefixes=_QWEN2_AUDIO_NAMES),
    "qwen25_omni": HFFamily("Qwen2_5OmniForConditionalGeneration", lambda: _tiny_hf_config("qwen25_omni"),
                            extra_files=_omni_speakers),
    "qwen3_omni": HFFamily("Qwen3OmniMoeForConditionalGeneration", lambda: _tiny_hf_config("qwen3_omni")),
    # transformers 5.12.1 has no Qwen3-ASR class: the maker's, as Bridge vendors it, with its transformers-5 gaps
    # closed while it is built, loaded or run (tiny/qwen3_asr.py: hf_model_patches).
    "qwen3_asr": HFFamily("Qwen3ASRForConditionalGeneration", _qwen3_asr,
                          model_module="megatron.bridge.models.qwen3_asr.hf_qwen3_asr.modeling_qwen3_asr",
                          model_patches=_qwen3_asr_patches),
}

#: tiny configuration name -> why no HF checkpoint of it can be written here (measured, one line each).
NO_HF_CHECKPOINT: dict[str, str] = {
    "nemotron_omni": (
        "its HF model (NemotronH_Nano_Omni_Reasoning_V3) is remote code on the hub, not in transformers 5.12.1; "
        "its Mamba layers also cannot run a forward on the CPU (CUDA-only mamba-ssm kernels)"
    ),
    "kimi_k25_vl": (
        "its HF model (KimiK25ForConditionalGeneration, model_type kimi_k25) is remote code on the hub, not in "
        "transformers 5.12.1: AutoConfig raises 'Unrecognized model identifier: kimi_k25' offline, so no "
        "checkpoint can be written, converted or loaded back here"
    ),
    "nemotron_vl": (
        "its HF model (NemotronH_Nano_VL_V2, model_type nemotron_vl) is remote code on the hub, not in "
        "transformers 5.12.1 (AutoConfig: 'Unrecognized model identifier: nemotron_vl'); its Mamba layers also "
        "cannot run a forward on the CPU (CUDA-only mamba-ssm kernels)"
    ),
    "step37": (
        "transformers 5.12.1 has no Step-3.7 model class: Bridge registers only its config (Step37Config) with "
        "AutoConfig; the model (Step3p7ForConditionalGeneration) is remote code, so no transformers checkpoint "
        "can be written or loaded back"
    ),
}


def hf_family(name: str) -> HFFamily:
    """The :class:`HFFamily` of tiny configuration ``name`` (``KeyError`` with the reason or the known names)."""
    if name in HF_FAMILIES:
        return HF_FAMILIES[name]
    if name in NO_HF_CHECKPOINT:
        raise KeyError(f"no tiny HF checkpoint for {name!r}: {NO_HF_CHECKPOINT[name]}")
    raise KeyError(f"no tiny HF checkpoint for {name!r}; families with one: {sorted(HF_FAMILIES)}")


def model_class(name: str) -> type:
    """The HF model class of tiny configuration ``name``'s checkpoint (transformers', or a vendored copy: build,
    load and run it inside :func:`hf_model_context`)."""
    import importlib

    family = hf_family(name)
    return getattr(importlib.import_module(family.model_module), family.model_class)


def hf_model_context(name: str) -> contextlib.AbstractContextManager[Any]:
    """What building, loading or running :func:`model_class` of ``name`` needs (its ``model_patches``), or a
    no-op."""
    patches = hf_family(name).model_patches
    return patches() if patches is not None else contextlib.nullcontext()


def hf_config(name: str) -> Any:
    """The tiny transformers config of ``name``'s checkpoint (float32, its model class as architecture)."""
    family = hf_family(name)
    config = family.config()
    config.architectures = [family.model_class]
    config.dtype = torch.float32
    return config


def randomize_(state: Mapping[str, torch.Tensor], seed: int) -> None:
    """Add seeded Gaussian noise (``NOISE_STD``) to every floating-point tensor of ``state``, in place.

    Each tensor is drawn from its own generator (seed and name), so a tensor's values do not depend on
    which other tensors the model has. Values keep their scale (a norm weight stays near 1) but no element
    keeps a constant initial value; an infinite one (an unset clipping bound) becomes a random finite one
    beyond +-1000.
    """
    import zlib

    with torch.no_grad():
        for name, tensor in state.items():
            if not tensor.is_floating_point():
                continue
            gen = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
            noise = torch.randn(tensor.shape, generator=gen, dtype=torch.float32).to(tensor.dtype)
            infinite = ~torch.isfinite(tensor)
            tensor.add_(noise * NOISE_STD)
            if infinite.any():  # e.g. Gemma4's audio clipping bounds (+-inf): far, finite, random bounds
                tensor[infinite] = torch.sign(tensor[infinite]) * (1_000.0 + noise[infinite].abs())


def tiny_tokenizer() -> Any:
    """A word-level tokenizer over the tiny vocabulary: token ``<i>`` is id ``i`` (pad/unk ``<0>``, bos ``<1>``,
    eos ``<2>``). Bridge's ``save_hf_pretrained`` saves the source checkpoint's tokenizer (``AutoTokenizer``),
    so a checkpoint without one cannot be exported as a folder."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel(vocab={f"<{i}>": i for i in range(_VOCAB)}, unk_token="<0>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<0>", unk_token="<0>", bos_token="<1>",
                                   eos_token="<2>")


def rename_saved_tensors(directory: Path, prefixes: Mapping[str, str]) -> None:
    """Rewrite every ``*.safetensors`` file of ``directory`` with each tensor name's prefix in ``prefixes`` replaced
    (the file's index, if any, is rewritten to match); nothing to do without ``prefixes``."""
    import json

    from safetensors.torch import load_file, save_file

    if not prefixes:
        return

    def renamed(name: str) -> str:
        for old, new in prefixes.items():
            if name.startswith(old):
                return new + name[len(old):]
        return name

    for file in sorted(Path(directory).glob("*.safetensors")):
        tensors = load_file(str(file))
        save_file({renamed(k): v for k, v in tensors.items()}, str(file), metadata={"format": "pt"})
    for index in Path(directory).glob("*.safetensors.index.json"):
        data = json.loads(index.read_text(encoding="utf-8"))
        data["weight_map"] = {renamed(k): v for k, v in data.get("weight_map", {}).items()}
        index.write_text(json.dumps(data, indent=2), encoding="utf-8")


def write_tiny_hf_checkpoint(family: str, directory: Path, seed: int = 0) -> Path:
    """Write a tiny random HF checkpoint of tiny configuration ``family`` into ``directory``; returns it.

    The model class is built from :func:`hf_config` (initialised from ``torch.manual_seed(seed)``), every
    floating-point tensor gets seeded noise (:func:`randomize_`), and ``save_pretrained`` writes
    ``config.json``, ``generation_config.json`` and ``model.safetensors`` (float32), plus :func:`tiny_tokenizer`'s
    ``tokenizer.json`` / ``tokenizer_config.json``. No hub access.
    """
    directory = Path(directory)
    config = hf_config(family)
    cls = model_class(family)
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        with hf_model_context(family):
            model = cls(config)
    finally:
        torch.random.set_rng_state(state)
    model.eval()
    randomize_(dict(model.named_parameters()) | dict(model.named_buffers()), seed)
    directory.mkdir(parents=True, exist_ok=True)
    with hf_model_context(family):
        model.save_pretrained(directory, safe_serialization=True)
    rename_saved_tensors(directory, hf_family(family).published_prefixes)
    if hf_family(family).extra_files is not None:
        hf_family(family).extra_files(directory)
    tiny_tokenizer().save_pretrained(directory)
    logger.info("wrote a tiny random %s checkpoint (%s) to %s", family, cls.__name__, directory)
    return directory


def cpu_provider(bridge: Any, family: str, *, load_weights: bool = True, **fields: Any) -> Any:
    """``bridge.to_megatron_provider(load_weights=...)`` set up for a CPU build and training, finalized.

    After Bridge's conversion only these change: the generic CPU fields (float32, no fused kernels), the MoE
    CPU fields when the model has experts, the family's :class:`HFFamily` ``cpu_fields``, the special token
    ids and CPU overrides of its train spec (tiny vocabulary), then ``fields`` (e.g. the freeze flags).
    """
    from bridge_freeze_harness.train import cannot_train_reason, train_spec

    provider = bridge.to_megatron_provider(load_weights=load_weights)
    settings: dict[str, Any] = dict(_CPU_FIELDS)
    if getattr(provider, "num_moe_experts", None):
        settings.update(_CPU_MOE)
        settings["moe_grouped_gemm"] = hf_family(family).grouped_experts
    settings.update(hf_family(family).cpu_fields(provider))
    if cannot_train_reason(family) is None:
        spec = train_spec(family)
        settings.update({**spec.token_ids, **spec.cpu_overrides})
    settings.update(fields)
    for name, value in settings.items():
        if not hasattr(provider, name):
            raise AttributeError(f"{type(provider).__name__} (converted from {family!r}) has no field {name!r}")
        setattr(provider, name, value)
    provider.finalize()
    return provider


# --- building a converted provider on the CPU -----------------------------------------------------------


class _GroupedLinear(torch.nn.Module):
    """TE ``GroupedLinear``'s place: one weight per expert (``weight0`` ...), each applied to its expert's rows.

    TE's parameter names, on plain ``F.linear``; what ``TEGroupedMLP`` calls it with: the permuted tokens and
    the number of tokens of each expert. Returns ``(output, bias)`` as TE's wrappers do.
    """

    def __init__(self, num_gemms: int, input_size: int, output_size: int, *, config: Any, init_method: Callable,
                 bias: bool, skip_bias_add: bool, is_expert: bool = True, **_unused: Any) -> None:
        super().__init__()
        self.num_gemms = num_gemms
        self.skip_bias_add = skip_bias_add
        for i in range(num_gemms):
            weight = torch.nn.Parameter(torch.empty(output_size, input_size, dtype=config.params_dtype))
            init_method(weight)
            weight.allreduce = not is_expert
            self.register_parameter(f"weight{i}", weight)
            if bias:
                param = torch.nn.Parameter(torch.zeros(output_size, dtype=config.params_dtype))
                param.allreduce = not is_expert
                self.register_parameter(f"bias{i}", param)
        self.use_bias = bias

    def forward(self, x: torch.Tensor, m_splits: list[int]) -> tuple[torch.Tensor, Any]:
        weights = [getattr(self, f"weight{i}") for i in range(self.num_gemms)]
        biases = [getattr(self, f"bias{i}") for i in range(self.num_gemms)] if self.use_bias else None
        add_bias = biases is not None and not self.skip_bias_add
        outputs = [
            torch.nn.functional.linear(rows, weight, biases[i] if add_bias else None)
            for i, (rows, weight) in enumerate(zip(torch.split(x, m_splits), weights, strict=True))
        ]
        return torch.cat(outputs), (biases if biases is not None and self.skip_bias_add else None)


    #: ``"column"`` or ``"row"``: how TE splits this linear's weights over tensor parallelism.
    parallel_mode = ""

    def sharded_state_dict(self, prefix: str = "", sharded_offsets: tuple = (), metadata: dict | None = None) -> Any:
        """The torch_dist keys TE's grouped linear writes (:mod:`._grouped_sharding`)."""
        from bridge_freeze_harness._grouped_sharding import grouped_sharded_state_dict

        return grouped_sharded_state_dict(self, self.parallel_mode, prefix, sharded_offsets, metadata)


class ColumnParallelGroupedLinear(_GroupedLinear):
    """Experts' ``linear_fc1`` (TE's ``TEColumnParallelGroupedLinear``'s place)."""

    parallel_mode = "column"


class RowParallelGroupedLinear(_GroupedLinear):
    """Experts' ``linear_fc2`` (TE's ``TERowParallelGroupedLinear``'s place)."""

    parallel_mode = "row"


def _register_grouped_linears() -> None:
    """Tell Bridge's ``AutoMapping`` how the stand-ins are split under tensor parallelism, as it knows TE's.

    Bridge recognises a module's parallelism by its class name; the registration (process-wide, idempotent)
    names only these two classes, and stays: a model built with them is exported after its build.
    """
    from megatron.bridge.models.conversion.param_mapping import AutoMapping

    AutoMapping.register_module_type(ColumnParallelGroupedLinear.__name__, "column")
    AutoMapping.register_module_type(RowParallelGroupedLinear.__name__, "row")


@contextlib.contextmanager
def grouped_experts_on_cpu() -> Iterator[None]:
    """megatron-core's local backend builds grouped-GEMM experts as ``TEGroupedMLP`` on :class:`_GroupedLinear`.

    Without it the local backend builds a ``SequentialMLP`` (``experts.local_experts.N.linear_fc1.weight``),
    names that Bridge's GLM-4.5V, Gemma4-VL and MiniMax-M3 mappings do not have (loading stops with
    ``No mapping found for megatron_param: ...local_experts.0.linear_fc1.weight``).
    """
    from megatron.core.models.backends import LocalSpecProvider
    from megatron.core.transformer.moe.experts import GroupedMLPSubmodules, TEGroupedMLP

    from bridge_freeze_harness.patching import patched

    _register_grouped_linears()
    original = LocalSpecProvider.grouped_mlp_modules

    def grouped_mlp_modules(self: Any, moe_use_grouped_gemm: bool) -> Any:
        if not moe_use_grouped_gemm:
            return original(self, moe_use_grouped_gemm)
        from functools import partial

        return partial(TEGroupedMLP, submodules=GroupedMLPSubmodules(
            linear_fc1=ColumnParallelGroupedLinear, linear_fc2=RowParallelGroupedLinear, activation_func=None))

    with patched([(LocalSpecProvider, "grouped_mlp_modules", grouped_mlp_modules)]):
        yield


@contextlib.contextmanager
def hf_build_patches(family: str) -> Iterator[None]:
    """What a build of a provider converted from ``family``'s checkpoint needs besides the tiny build context."""
    with contextlib.ExitStack() as stack:
        if hf_family(family).grouped_experts:
            stack.enter_context(grouped_experts_on_cpu())
        yield


def build_hf_chunks(family: str, provider: Any) -> list[Any]:
    """Bare chunks of a converted provider through ``provide_distributed_model`` (Bridge's pre-wrap hooks run:
    the HF weights load) inside the family's tiny build context and :func:`hf_build_patches`."""
    from bridge_freeze_harness.tiny import build_tiny_chunks

    with hf_build_patches(family):
        return build_tiny_chunks(family, provider=provider)
