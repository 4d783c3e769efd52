"""Step-3.7: real ``Step37ModelProvider`` / ``Step37Model``.

Bridge's own model class built through its own provider: the Perception-Encoder vision tower
(``vision_model``: patch conv, pre-norm, absolute position embedding, 2 residual blocks with layer
scale, and the two ``vit_downsampler`` convolutions), the vision-text fusion module
``image_insert_embedding`` (it registers one submodule, the projector ``align_projector``; the
language model's embedding it also uses is kept out of its registered submodules) and the Step-3.5
hybrid text decoder (``language_model``: layer 0 full attention + dense MLP, layer 1 sliding-window
attention + MoE with 4 routed experts and a shared expert). The vision config is Bridge's own
``Step37VisionConfig``, made in code.

One CPU patch (:func:`cpu_patches`): Bridge's Step-3.5 layer spec builder (``build_step35_layer_spec``,
used exactly as Bridge's HF conversion sets it) asks megatron-core's decoder block spec for
TransformerEngine layers unconditionally; while building it gets the local ones. Module and parameter
names are unchanged. CPU-only deviations that do not change names: the ``allgather`` token dispatcher,
no grouped GEMM, no permute fusion, no shared expert overlap.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

from bridge_freeze_harness.patching import patched
from bridge_freeze_harness.tiny._common import TINY_LM, TINY_MOE_WITH_SHARED_EXPERT, finalized

REAL = True

TINY_TEXT: dict[str, Any] = {
    **TINY_MOE_WITH_SHARED_EXPERT,
    "mtp_num_layers": None,
    "normalization": "RMSNorm",
    "qk_layernorm": True,
    "gated_linear_unit": True,
    "add_bias_linear": False,
    "add_qkv_bias": False,
    "share_embeddings_and_output_weights": False,
    "layer_types": ["full_attention", "sliding_attention"],
    "attention_other_setting": {"num_attention_heads": 4, "num_attention_groups": 2, "head_dim": 16},
    "sliding_attention_setting": {
        "window_size": 16,
        "num_attention_heads": 4,
        "num_query_groups": 2,
        "kv_channels": 16,
    },
    "language_max_sequence_length": TINY_LM["seq_length"],
    "image_token_id": 120,
}


def vision_config() -> Any:
    from megatron.bridge.models.stepfun.configuration_step37 import Step37VisionConfig

    return Step37VisionConfig(width=64, layers=2, heads=4, image_size=32, patch_size=4, mlp_ratio=2.0)


def make_provider(**overrides: Any) -> Any:
    from megatron.bridge.models.stepfun.step35_bridge import build_step35_layer_spec
    from megatron.bridge.models.stepfun.step37_provider import Step37ModelProvider

    provider = Step37ModelProvider(
        **TINY_LM,
        **TINY_TEXT,
        transformer_layer_spec=build_step35_layer_spec,
        vision_config=vision_config(),
    )
    return finalized(provider, **overrides)


def _local_layers(fn: Any) -> Any:
    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        kwargs["use_transformer_engine"] = False
        return fn(*args, **kwargs)

    return call


@contextlib.contextmanager
def cpu_patches() -> Iterator[None]:
    """``build_step35_layer_spec`` -> megatron-core's local layer specs while building."""
    from megatron.bridge.models.stepfun import step35_bridge

    original = step35_bridge.get_gpt_decoder_block_spec
    with patched([(step35_bridge, "get_gpt_decoder_block_spec", _local_layers(original))]):
        yield
