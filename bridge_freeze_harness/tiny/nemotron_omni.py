"""Nemotron Omni: real ``NemotronOmniModelProvider`` / ``NemotronOmniModel`` WITH its sound encoder and projection.

``provide()`` (Bridge's own) builds a real megatron-core ``LLaVAModel`` (``llava_model``) with a hybrid
``HybridModel`` language model (Mamba + attention + MoE layers, ``language_model_type="nemotron6-moe"`` as
Bridge's ``NemotronOmniBridge`` sets it), a real ``RADIOViTModel`` in dynamic-resolution mode, a real
``MultimodalProjector`` vision projection, Bridge's ``BridgeSoundEncoder`` (``llava_model.sound_model``: HF
transformers' ``ParakeetEncoder``, pure PyTorch, built from the provider's ``sound_config`` dict) and a second
``MultimodalProjector`` (``llava_model.sound_projection``), and wraps it in Bridge's ``NemotronOmniModel``.
Everything around ``provide()`` is Bridge's own code; the sound parts' tiny sizes are provider fields
(``sound_config``, ``sound_hidden_size``, ``sound_projection_hidden_size``), and :func:`tiny_patches` builds the
encoder without LayerDrop (its one patch there).

The Omni provider module has its own ``NemotronVLModelProvider`` base and names ``hybrid_stack_spec`` and
``LLaVAModel`` itself, so the patches are Nemotron-VL's applied to that module
(:mod:`bridge_freeze_harness.tiny.nemotron_vl`, points 1-4): :func:`cpu_patches` = points 1-3 (local hybrid
spec and final norm, a buildable Mamba mixer), :func:`tiny_patches` = point 4 (the vision tower and projection
sizes ``provide()`` hard-codes). Its ViT spec getter (TE) is swapped by the generic build patches.

Speed only (tiny configuration): megatron-core's ``squared_relu`` / ``fast_gelu`` (Nemotron's LM, projections and
RADIO activations) are ``torch.compile``'d (``megatron.core.jit.jit_fuser``): the first CPU forward compiles them
with inductor, seconds to a minute on a loaded 2-core machine. The tiny provider and :func:`tiny_patches` use the
same functions un-compiled (``inspect.unwrap``: the function ``torch.compile`` wrapped); no name or shape changes.

Forward on the CPU: with the Mamba layers (the harness's CPU scan, :mod:`bridge_freeze_harness._mamba_cpu`, under
``forward_patches``), or faster without them: build with ``make_provider(hybrid_layer_pattern=FORWARD_PATTERN)``;
feed :func:`forward_inputs` (an image through the
packed dynamic-resolution path and a sound clip) inside ``bridge_freeze_harness.forward.forward_patches``.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from typing import Any

import torch

from bridge_freeze_harness._bridge_steps import BridgeStep
from bridge_freeze_harness.batches import TrainSpec, causal_mask, next_token_targets, random_text, token_row
from bridge_freeze_harness.patching import patched
from bridge_freeze_harness.tiny._common import TINY_LM, TINY_MOE_WITH_SHARED_EXPERT, finalized
from bridge_freeze_harness.tiny.nemotron_vl import TINY_MAMBA, hybrid_build_patches, llava_loss, tiny_llava

REAL = True

#: One Mamba, one attention, one MoE layer: every layer kind of Nemotron-3 Omni's pattern.
TINY_PATTERN = "M*E"
#: No Mamba layer: pass as ``hybrid_layer_pattern`` where a test needs a CPU forward.
FORWARD_PATTERN = "*E"

#: Special ids at the top of the tiny vocabulary (the real ones are checkpoint values); all must be positive.
TOKEN_IDS: dict[str, int] = {
    "image_token_index": TINY_LM["vocab_size"] - 4,
    "img_start_token_id": TINY_LM["vocab_size"] - 3,
    "img_end_token_id": TINY_LM["vocab_size"] - 2,
    "sound_context_token_id": TINY_LM["vocab_size"] - 1,
}
BOS, EOS = 1, 2

TINY_SOUND_HIDDEN = 32
#: The checkpoint's ``sound_config`` (Parakeet) as the provider holds it: a dict.
TINY_SOUND_CONFIG: dict[str, Any] = {
    "hidden_size": TINY_SOUND_HIDDEN,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 2 * TINY_SOUND_HIDDEN,
    "num_mel_bins": 16,
    "subsampling_factor": 8,
    "conv_kernel_size": 9,
}
TINY_SOUND_FIELDS: dict[str, Any] = {
    "has_sound": True,
    "sound_config": TINY_SOUND_CONFIG,
    "sound_hidden_size": TINY_SOUND_HIDDEN,
    "sound_projection_hidden_size": 64,
}

#: Synthetic media: one 64x64 image (4x4 patches of 16, pixel-shuffled to 4 tokens) and 32 frames of mel
#: features (the 8x subsampling makes 4 sound embeddings, one per sound token in the text).
IMAGE_SIZE, PATCH = 64, 16
SOUND_FRAMES, SOUND_TOKENS = 32, 4


def _eager(compiled: Any) -> Any:
    """The Python function a ``torch.compile``'d one wraps (the function itself when not compiled)."""
    return inspect.unwrap(compiled)


class EagerActivation:
    """megatron-core's activation ``name`` un-compiled, as a provider field that pickles (by name: the unwrapped
    function itself does not, since its qualified name leads to the compiled wrapper)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, x: Any) -> Any:
        from megatron.core import activations

        return _eager(getattr(activations, self.name))(x)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, EagerActivation) and other.name == self.name

    def __hash__(self) -> int:
        return hash(self.name)

    def __repr__(self) -> str:
        return f"EagerActivation({self.name!r})"


def make_provider(**overrides: Any) -> Any:
    """The tiny Omni provider, sound parts included (``has_sound=False`` drops them)."""
    from megatron.bridge.models.nemotron_omni import nemotron_omni_provider
    from megatron.bridge.models.nemotron_omni.nemotron_omni_provider import NemotronOmniModelProvider

    lm = {k: v for k, v in TINY_LM.items() if k != "num_layers"}  # finalize() derives it from the pattern
    moe = {k: v for k, v in TINY_MOE_WITH_SHARED_EXPERT.items() if k != "moe_layer_freq"}  # the pattern decides
    provider = NemotronOmniModelProvider(
        **lm,
        **moe,
        **TINY_MAMBA,
        **TOKEN_IDS,
        **TINY_SOUND_FIELDS,
        hybrid_layer_pattern=TINY_PATTERN,
        language_model_type="nemotron6-moe",
        activation_func=EagerActivation(nemotron_omni_provider.NemotronOmniModelProvider.activation_func.__name__),
        first_last_layers_bf16=False,
        cross_entropy_loss_fusion=False,
        dynamic_resolution=True,  # as Bridge's converter sets it (0.6.0's field defaults to False; 0.6.2 fixes True)
        **_contract(nemotron_omni_provider),
    )
    return finalized(provider, **overrides)


def _contract(module: Any) -> dict[str, str]:
    """Bridge 0.7.0's provider refuses to build without ``nemotron_omni_contract`` (its converter sets it):
    the expanded-sequence one, as a 0.7.0 conversion sets it; nothing where the field does not exist (0.6.x)."""
    name = getattr(module, "NEMOTRON_OMNI_EXPANDED_SEQUENCE_CONTRACT", None)
    return {} if name is None else {"nemotron_omni_contract": name}


def _expanded(provider: Any) -> bool:
    """Bridge 0.7.0's expanded-sequence model wants one image placeholder per projected feature (its processor
    expands them); the LLaVA path (0.6.x, and 0.7.0's legacy provider) one placeholder per image, which it expands."""
    from megatron.bridge.models.nemotron_omni import nemotron_omni_provider

    name = getattr(nemotron_omni_provider, "NEMOTRON_OMNI_EXPANDED_SEQUENCE_CONTRACT", None)
    return name is not None and getattr(provider, "nemotron_omni_contract", None) == name


def forward_inputs(provider: Any, batch_size: int = 1, seed: int = 0) -> dict[str, Any]:
    """``model(**inputs)`` keywords: ``bos text <image> text <sound>*4 text eos`` per row, one image and one
    sound clip per row. The image goes the packed dynamic-resolution way (``imgs_sizes`` +
    ``vision_packed_seq_params``, which the CPU attention turns into a block-diagonal mask).
    """
    return omni_batch(provider, None, batch_size, torch.Generator().manual_seed(seed))


def omni_batch(provider: Any, spec: Any, batch_size: int, gen: torch.Generator) -> dict[str, Any]:
    """:func:`forward_inputs` from a generator: the family's synthetic batch (``TrainSpec.make_batch``; ``spec``
    unused, the layout is fixed by :data:`TOKEN_IDS` and the media sizes above)."""
    from megatron.core.packed_seq_params import PackedSeqParams

    image, sound = TOKEN_IDS["image_token_index"], TOKEN_IDS["sound_context_token_id"]
    low, high = 3, min(TOKEN_IDS.values())
    patches = (IMAGE_SIZE // PATCH) ** 2
    features = patches // 4  # the pixel shuffle's projected features per image
    placeholders = features if _expanded(provider) else 1
    rows = [
        token_row([BOS, random_text(gen, 4, low, high), torch.full((placeholders,), image),
                   random_text(gen, 4, low, high), torch.full((SOUND_TOKENS,), sound), random_text(gen, 4, low, high),
                   EOS])
        for _ in range(batch_size)
    ]
    input_ids = torch.stack(rows)
    labels, loss_mask = next_token_targets(input_ids, EOS, [image, sound])
    combined = input_ids.shape[1] - placeholders + features  # a legacy image token becomes its features
    cu = torch.arange(batch_size + 1, dtype=torch.int32) * patches
    dtype = provider.params_dtype
    return {
        "images": torch.randn(1, batch_size * patches, 3 * PATCH * PATCH, generator=gen, dtype=dtype),
        "imgs_sizes": torch.tensor([[IMAGE_SIZE, IMAGE_SIZE]] * batch_size),
        "vision_packed_seq_params": PackedSeqParams(
            qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu.clone(), max_seqlen_q=patches, max_seqlen_kv=patches
        ),
        "input_ids": input_ids,
        "position_ids": None,
        "attention_mask": causal_mask(combined),
        "labels": labels,
        "loss_mask": loss_mask,
        "sound_clips": torch.randn(
            batch_size, SOUND_FRAMES, TINY_SOUND_CONFIG["num_mel_bins"], generator=gen, dtype=dtype
        ),
        "sound_length": torch.full((batch_size,), SOUND_FRAMES),
    }


def omni_loss(output: Any, batch: dict[str, Any]) -> torch.Tensor:
    """The LLaVA path returns ``(per-token loss, its mask)`` over the expanded sequence (:func:`llava_loss`);
    Bridge 0.7.0's expanded-sequence model the per-token loss alone, aligned with the batch's own ``loss_mask``
    (a pair only where it shards for context parallelism)."""
    return llava_loss(output if isinstance(output, tuple) else (output, batch["loss_mask"]), batch)


@contextlib.contextmanager
def cpu_patches() -> Iterator[None]:
    """Any Nemotron Omni build: Nemotron-VL's points 1-3 on the Omni provider module."""
    from megatron.bridge.models.nemotron_omni import nemotron_omni_provider

    with patched(hybrid_build_patches(nemotron_omni_provider)):
        yield


def _parakeet_config_without_layerdrop(**fields: Any) -> Any:
    """transformers' ``ParakeetEncoderConfig`` with ``layerdrop=0``: Bridge's ``BridgeSoundEncoder`` passes no
    LayerDrop field, so the default 0.1 skips a whole conformer layer at random in a train-mode forward (the tiny
    encoder's two layers would at random get no gradient); no name or shape changes."""
    from transformers import ParakeetEncoderConfig

    return ParakeetEncoderConfig(**fields, layerdrop=0.0)


@contextlib.contextmanager
def tiny_patches() -> Iterator[None]:
    """The tiny configuration only: the vision tower and projection sizes ``provide()`` hard-codes; the activations
    it names, un-compiled; the sound encoder without LayerDrop."""
    from megatron.bridge.models.nemotron_omni import nemotron_omni_provider as module
    from megatron.bridge.models.nemotron_omni import nemotron_omni_sound

    with patched(
        [
            (module, "LLaVAModel", tiny_llava),
            (module, "squared_relu", _eager(module.squared_relu)),
            (module, "fast_gelu", _eager(module.fast_gelu)),
            (nemotron_omni_sound, "ParakeetEncoderConfig", _parakeet_config_without_layerdrop),
        ]
    ):
        yield


@contextlib.contextmanager
def forward_patches() -> Iterator[None]:
    """A forward / backward of a Mamba layer: megatron-core's training kernel (mamba-ssm's
    ``mamba_split_conv1d_scan_combined``, CUDA-only) -> the harness's pure-PyTorch reference
    (:mod:`bridge_freeze_harness._mamba_cpu`)."""
    from bridge_freeze_harness._mamba_cpu import mamba_forward_patches

    with patched(mamba_forward_patches()):
        yield


#: why no HF checkpoint of it can be written here (collected by
#: :data:`bridge_freeze_harness.hf_checkpoint.NO_HF_CHECKPOINT`).
NO_HF_CHECKPOINT = {
    "nemotron_omni": (
        "its HF model (NemotronH_Nano_Omni_Reasoning_V3) is remote code on the hub, not in transformers 5.12.1, "
        "so no checkpoint can be written, converted or loaded back here"
    ),
}


def _omni_step_batch(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """What Bridge's ``training/nemotron_omni_step.py`` reads: ``input_ids``, ``labels``, ``loss_mask``, the
    sample's causal ``attention_mask``, the packed images as ``pixel_values`` (patches of every image along dim 1)
    with ``imgs_sizes``, and ``sound_clips`` / ``sound_length``. No ``vision_packed_seq_params``: the step builds
    them from ``imgs_sizes`` itself."""

    def cat(key: str, dim: int = 0) -> torch.Tensor:
        return torch.cat([s[key] for s in samples], dim=dim)

    return {"input_ids": cat("input_ids"), "labels": cat("labels"), "loss_mask": cat("loss_mask"),
            "attention_mask": samples[0]["attention_mask"], "position_ids": None,
            "pixel_values": cat("images", dim=1), "imgs_sizes": cat("imgs_sizes"),
            "sound_clips": cat("sound_clips"), "sound_length": cat("sound_length")}


#: Trains here with an image and a sound clip per row (:func:`omni_batch`), its Mamba layers on the CPU scan.
TRAIN_SPECS = {"nemotron_omni": TrainSpec(token_ids=TOKEN_IDS, make_batch=omni_batch, loss=omni_loss,
                                          projection_prefixes=("llava_model.vision_projection.",))}

#: In Bridge's loop it trains through Bridge's own ``nemotron_omni_step``, which casts the media to bfloat16 (a GPU
#: run's model is bf16): run it with Bridge's ``bf16_mixed`` recipe (``cpu_training.training_config(...,
#: bf16_mixed=True)``), which makes the model bfloat16 on the CPU too; a float32 model refuses the bf16 media.
FORWARD_STEPS = {"nemotron_omni": BridgeStep(
    "megatron.bridge.training.nemotron_omni_step:forward_step",
    keys=frozenset({"input_ids", "labels", "loss_mask", "attention_mask", "position_ids", "images", "imgs_sizes",
                    "vision_packed_seq_params", "sound_clips", "sound_length"}),
    collate=_omni_step_batch)}
