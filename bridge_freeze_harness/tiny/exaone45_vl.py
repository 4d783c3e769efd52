"""EXAONE 4.5 (VL): real ``Exaone45ModelProvider`` / ``Exaone45Model``.

Bridge's own model class built through its own provider: a Megatron vision tower (``vision_model``:
patch embedding, 2 transformer layers, and the projection ``vision_model.merger`` inside it), the
EXAONE 4 Post-LN GPT language model (``language_model``) and, by default here, one multi-token
prediction layer (``language_model.mtp``; the released checkpoints carry one). The HF side is a tiny
``Exaone4_5_Config`` made in code (no model hub); ``make_provider(mtp_num_layers=None)`` builds without MTP.

CPU patches (:func:`cpu_patches`), none of which changes module or parameter names:

- EXAONE 4's layer spec puts Bridge's ``TERowParallelLinearLayerNorm`` (a TransformerEngine row-parallel
  linear followed by a ``post_layernorm``) into ``linear_proj`` and ``linear_fc2``. While building, that
  name resolves to :class:`~bridge_freeze_harness.local_layers.RowParallelLinearLayerNorm`: megatron-core's
  local ``RowParallelLinear`` with the same ``post_layernorm`` child.
- EXAONE's spec leaves the Q/K norm classes to megatron-core's default, TransformerEngine's ``TENorm``
  (``qk_layernorm=True``); while building, that default is megatron-core's local ``WrappedTorchNorm``.
- Bridge's EXAONE 4.5 MTP spec helper asks megatron-core for TransformerEngine MTP layers
  unconditionally; while building it gets the local ones
  (:func:`~bridge_freeze_harness.tiny._common.local_mtp_block_spec`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from bridge_freeze_harness._hf_configs import HFFamily
from bridge_freeze_harness.batches import QWEN_TOKEN_IDS, TrainSpec
from bridge_freeze_harness.patching import patched
from bridge_freeze_harness.tiny._common import TINY_LM, finalized, local_mtp_block_spec

REAL = True

#: What the installed Bridge must have to build this family (``tiny.bridge_lacks``; SkyRL's pin 91a15142 has no
#: EXAONE 4.5).
BRIDGE_NEEDS = {
    "exaone45_vl": {
        "megatron.bridge.models.exaone.exaone45.exaone45_provider:Exaone45ModelProvider": "the EXAONE 4.5 provider",
    },
}

_VOCAB = TINY_LM["vocab_size"]
_HIDDEN = TINY_LM["hidden_size"]


def hf_config() -> Any:
    """A tiny ``Exaone4_5_Config`` (vision tower + EXAONE 4 text config), made offline."""
    from transformers.models.exaone4_5.configuration_exaone4_5 import Exaone4_5_Config

    return Exaone4_5_Config(
        vision_config={
            "depth": 2,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_heads": 4,
            "num_key_value_heads": 4,
            "patch_size": 4,
            "temporal_patch_size": 2,
            "spatial_merge_size": 2,
            "window_size": 16,
            "out_hidden_size": _HIDDEN,
            "fullatt_block_indexes": [1],
        },
        text_config={
            "vocab_size": _VOCAB,
            "hidden_size": _HIDDEN,
            "intermediate_size": TINY_LM["ffn_hidden_size"],
            "num_hidden_layers": TINY_LM["num_layers"],
            "num_attention_heads": TINY_LM["num_attention_heads"],
            "num_key_value_heads": TINY_LM["num_query_groups"],
            "max_position_embeddings": TINY_LM["seq_length"],
        },
        image_token_id=120,
        video_token_id=121,
    )


def make_provider(**overrides: Any) -> Any:
    from megatron.bridge.models.exaone.exaone45.exaone45_provider import Exaone45ModelProvider

    config = hf_config()
    provider = Exaone45ModelProvider(
        **TINY_LM,
        share_embeddings_and_output_weights=False,
        vision_config=config.vision_config,
        hf_text_config=config.text_config,
        image_token_id=config.image_token_id,
        video_token_id=config.video_token_id,
        vision_token_id=config.image_token_id,
        mtp_num_layers=1,
    )
    return finalized(provider, **overrides)


@contextlib.contextmanager
def cpu_patches() -> Iterator[None]:
    """EXAONE's Post-LN row-parallel linear and the Q/K norms -> local equivalents; MTP spec without TE."""
    from megatron.bridge.models.exaone.exaone4 import exaone4_provider
    from megatron.core.transformer import attention
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    from bridge_freeze_harness.local_layers import RowParallelLinearLayerNorm

    patches = [
        (exaone4_provider, "TERowParallelLinearLayerNorm", RowParallelLinearLayerNorm),
        (attention, "TENorm", WrappedTorchNorm),
    ]
    with patched(patches), local_mtp_block_spec():
        yield


#: Trained WITHOUT the MTP block: Bridge 0.6.2's ``Exaone45Model.forward`` calls its language model with
#: ``input_ids=None`` (the embeddings go in as ``decoder_input``), and megatron-core's MTP layer embeds
#: ``input_ids`` again, so any forward with ``mtp_num_layers`` set fails (``embedding(): argument 'indices'
#: must be Tensor, not NoneType``), on any device. The built (untrained) configuration keeps its MTP block.
TRAIN_SPECS = {
    "exaone45_vl": TrainSpec(
        token_ids={**QWEN_TOKEN_IDS, "vision_token_id": QWEN_TOKEN_IDS["image_token_id"]},
        projection_prefixes=("vision_model.merger.",),
        cpu_overrides={"cross_entropy_loss_fusion": False, "mtp_num_layers": None},
    ),
}


#: the tiny HF checkpoint recipe (collected by :data:`bridge_freeze_harness.hf_checkpoint.HF_FAMILIES`).
HF_CHECKPOINTS = {"exaone45_vl": HFFamily("Exaone4_5_ForConditionalGeneration", hf_config)}
