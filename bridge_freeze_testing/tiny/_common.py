"""Sizes shared by every tiny configuration (small enough for a 2-core CPU, big enough to be real)."""

from __future__ import annotations

from typing import Any

import torch

#: Language-model fields common to every tiny Megatron GPT-style text config.
TINY_LM: dict[str, Any] = {
    "num_layers": 2,
    "hidden_size": 64,
    "ffn_hidden_size": 128,
    "num_attention_heads": 4,
    "num_query_groups": 2,
    "kv_channels": 16,
    "vocab_size": 128,
    "seq_length": 64,
    "params_dtype": torch.float32,
    "bf16": False,
    "fp16": False,
    "use_cpu_initialization": True,
    "gradient_accumulation_fusion": False,
    "bias_activation_fusion": False,
    "bias_dropout_fusion": False,
    "masked_softmax_fusion": False,
    "persist_layer_norm": False,
    "apply_rope_fusion": False,
}


def finalized(provider: Any, **overrides: Any) -> Any:
    for name, value in overrides.items():
        if not hasattr(provider, name):
            raise AttributeError(f"{type(provider).__name__} has no field {name!r}")
        setattr(provider, name, value)
    provider.finalize()
    return provider
