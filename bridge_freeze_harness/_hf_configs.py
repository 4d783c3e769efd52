"""What a tiny configuration's Hugging Face checkpoint recipe is made of: :class:`HFFamily` (declared by each family
module of :mod:`bridge_freeze_harness.tiny` in its ``HF_CHECKPOINTS``, collected by
:data:`bridge_freeze_harness.hf_checkpoint.HF_FAMILIES`) and the tiny HF text fields the recipes share (sizes of the
harness's tiny Bridge configuration: :data:`bridge_freeze_harness.tiny._common.TINY_LM`). Who imports this package,
and why: :mod:`bridge_freeze_harness`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bridge_freeze_harness.tiny._common import TINY_LM

#: Text-model fields shared by the tiny HF text configs (the HF names of :data:`TINY_LM`'s sizes).
TEXT: dict[str, Any] = {
    "vocab_size": TINY_LM["vocab_size"],
    "hidden_size": TINY_LM["hidden_size"],
    "intermediate_size": TINY_LM["ffn_hidden_size"],
    "num_hidden_layers": TINY_LM["num_layers"],
    "num_attention_heads": TINY_LM["num_attention_heads"],
    "num_key_value_heads": TINY_LM["num_query_groups"],
    "max_position_embeddings": TINY_LM["seq_length"],
    "tie_word_embeddings": False,
}

#: Qwen-style special ids inside the tiny vocabulary, as the HF configs name them (= batches.QWEN_TOKEN_IDS).
QWEN_IDS: dict[str, int] = {
    "image_token_id": 6,
    "video_token_id": 7,
    "vision_start_token_id": 3,
    "vision_end_token_id": 4,
}
TEXT_IDS: dict[str, int] = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}


def qwen3_rope(mrope_section: list[int], **extra: Any) -> dict[str, Any]:
    """Qwen3-VL's interleaved M-RoPE settings, with ``mrope_section`` for the tiny head_dim."""
    return {"rope_type": "default", "rope_theta": 1_000_000.0, "mrope_section": mrope_section,
            "mrope_interleaved": True, **extra}


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
    #: rewrites the saved tensors into the published checkpoint's storage, given the directory (Kimi K2.5: its routed
    #: experts INT4-packed), after ``published_prefixes``.
    stored_as: Callable[[Path], None] | None = None
    #: the module that defines ``model_class`` (a vendored copy where transformers has none).
    model_module: str = "transformers"
    #: what building, loading or running ``model_class`` needs under transformers 5.12.1 (a vendored class written
    #: for transformers 4), applied by :func:`hf_model_context`.
    model_patches: Callable[[], contextlib.AbstractContextManager[Any]] | None = None
    #: what ``AutoBridge.from_hf_pretrained`` of the checkpoint (and Bridge's ``finetune()`` from it) needs, applied by
    #: :func:`bridge_load_context` (Kimi K2.5: ``AutoConfig`` knowing the stand-in for the hub's config class).
    load_patches: Callable[[], contextlib.AbstractContextManager[Any]] | None = None
