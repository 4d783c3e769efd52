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

import torch

from bridge_freeze_harness._bridge_steps import BridgeStep
from bridge_freeze_harness.batches import TrainSpec, image_rows
from bridge_freeze_harness.patching import patched
from bridge_freeze_harness.tiny._common import TINY_LM, TINY_MOE_WITH_SHARED_EXPERT, finalized
from bridge_freeze_harness.tiny._step37_step import STEP37_KEYS, collate

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


def _step35_layer_spec() -> Any:
    """The layer spec Bridge's Step-3.5 converter sets: ``build_step35_layer_spec``, or the same function under
    the private name an older Bridge gives it (``_build_step35_layer_spec``: 91a15142, SkyRL's pin)."""
    from megatron.bridge.models.stepfun import step35_bridge

    public = getattr(step35_bridge, "build_step35_layer_spec", None)
    return public if public is not None else step35_bridge._build_step35_layer_spec


def make_provider(**overrides: Any) -> Any:
    from megatron.bridge.models.stepfun.step37_provider import Step37ModelProvider

    provider = Step37ModelProvider(
        **TINY_LM,
        **TINY_TEXT,
        transformer_layer_spec=_step35_layer_spec(),
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


def _random_in_proj(init: Any) -> Any:
    @functools.wraps(init)
    def call(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        torch.nn.init.normal_(self.in_proj_weight, std=0.02)

    return call


@contextlib.contextmanager
def tiny_patches() -> Iterator[None]:
    """The vision attention's ``in_proj_weight`` random, as a loaded checkpoint's, instead of Bridge's zeros.

    Bridge creates it with ``torch.zeros`` (the checkpoint fills it). Zero queries, keys and values give the
    attention a zero output, so ``attn.out_proj`` and ``ln_1`` of every vision block would get all-zero
    gradients in a tiny (never loaded) model. Names and shapes are unchanged.
    """
    from megatron.bridge.models.stepfun.modelling_step37 import utils

    attention = utils.EncoderVisionAttention
    with patched([(attention, "__init__", _random_in_proj(attention.__init__))]):
        yield


#: One 32x32 picture per row: 8x8 patches of 4 px, then the two ``vit_downsampler`` convolutions -> 4 features.
IMAGE_PIXELS, IMAGE_FEATURES = 32, 4


def train_batch(provider: Any, spec: TrainSpec, batch_size: int, gen: torch.Generator) -> dict[str, Any]:
    """``bos text <im_start> image*4 <im_end> text eos`` per row; ``images``: Step-3.7's ``ImageForInsert`` list.

    The model inserts each image's features right after its ``<im_start>`` token (the ``start`` role).
    """
    from megatron.bridge.models.stepfun.modelling_step37.image_insert_embedding import ImageForInsert

    batch = image_rows(provider, spec, batch_size, gen, IMAGE_FEATURES)
    pixels = torch.randn(batch_size, 3, IMAGE_PIXELS, IMAGE_PIXELS, generator=gen, dtype=provider.params_dtype)
    batch["images"] = [ImageForInsert(insert_start_token=spec.all_ids()["vision_start_token_id"], images=pixels)]
    return batch


TRAIN_SPECS = {
    "step37": TrainSpec(
        token_ids={"image_token_id": TINY_TEXT["image_token_id"]},
        batch_ids={"bos_token_id": 1, "eos_token_id": 2, "vision_start_token_id": 3, "vision_end_token_id": 4},
        projection_prefixes=("image_insert_embedding.align_projector.",),
        make_batch=train_batch,
    ),
}


#: The harness's own step trains it in Bridge's loop (:mod:`._step37_step`): Bridge's only Step-3.7 step
#: (``step37_flickr8k_step``) hands the model THD-packed Flickr8k sequences, which the CPU's local attention refuses;
#: this one calls the model as that step does (``list[ImageForInsert]``, Bridge's loss) on BSHD rows.
FORWARD_STEPS = {
    "step37": BridgeStep("bridge_freeze_harness.tiny._step37_step:forward_step", keys=STEP37_KEYS, collate=collate),
}


#: why no HF checkpoint of it can be written here (collected by
#: :data:`bridge_freeze_harness.hf_checkpoint.NO_HF_CHECKPOINT`).
NO_HF_CHECKPOINT = {
    "step37": (
        "transformers 5.12.1 has no Step-3.7 model class: Bridge registers only its config (Step37Config) with "
        "AutoConfig; the model (Step3p7ForConditionalGeneration) is remote code, so no transformers checkpoint "
        "can be written or loaded back"
    ),
}
