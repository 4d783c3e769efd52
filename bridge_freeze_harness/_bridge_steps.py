"""Bridge's forward steps that train the tiny configurations in Bridge's loop, their batch layouts, and the
synthetic dataset laid out for them (:data:`FORWARD_STEPS`; used by :mod:`bridge_freeze_harness.cpu_training`,
which re-exports the public names). Who imports this package, and why: :mod:`bridge_freeze_harness`.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch

from bridge_freeze_harness._visual_inputs import visual_inputs_with
from bridge_freeze_harness.tiny._index import Declared


def _cat(samples: list[dict[str, Any]], key: str, dim: int = 0) -> torch.Tensor:
    return torch.cat([s[key] for s in samples], dim=dim)


#: image keys (Bridge's ``GenericVisualInputs``) and audio keys (its ``Qwen2AudioInputs``) of vlm_step's layout.
_VLM_IMAGE_KEYS = ("pixel_values", "image_grid_thw", "image_sizes", "image_position_ids", "mm_token_type_ids")
_VLM_AUDIO_KEYS = ("input_features", "feature_attention_mask")


def _vlm_step_batch(samples: list[dict[str, Any]], extra_image_keys: tuple[str, ...] = ()) -> dict[str, Any]:
    """What ``megatron/bridge/training/vlm_step.py`` reads: ``tokens``, ``labels``, ``loss_mask``,
    ``attention_mask``, ``position_ids`` (the sample's, else ``None``: the model computes M-RoPE ids) and one
    ``visual_inputs`` object: ``GenericVisualInputs`` for images, ``Qwen2AudioInputs`` for audio. vlm_step passes
    that one object only, so samples with images AND audio are refused (no field of either class holds both).
    ``extra_image_keys``: model inputs ``GenericVisualInputs`` has no field for; the object is then a subclass
    with those fields (:func:`visual_inputs_with`), which vlm_step hands on like the others."""
    from megatron.bridge.training.utils.visual_inputs import GenericVisualInputs, Qwen2AudioInputs

    first = samples[0]
    audio_keys = tuple(k for k in _VLM_AUDIO_KEYS if k not in extra_image_keys)
    if any(k in first for k in _VLM_IMAGE_KEYS) and any(k in first for k in audio_keys):
        raise NotImplementedError(
            "the synthetic batch has images and audio; Bridge's vlm_step passes one inputs object "
            "(GenericVisualInputs, which has no audio field, or Qwen2AudioInputs, which has no image one)")
    if any(k in first for k in audio_keys):
        inputs: Any = Qwen2AudioInputs(**{k: _cat(samples, k) for k in audio_keys if k in first})
    else:
        image_class = visual_inputs_with(extra_image_keys) if extra_image_keys else GenericVisualInputs
        image_keys = (*_VLM_IMAGE_KEYS, *extra_image_keys)
        inputs = image_class(**{k: _cat(samples, k) for k in image_keys if k in first})
    return {
        "tokens": _cat(samples, "input_ids"),
        "labels": _cat(samples, "labels"),
        "loss_mask": _cat(samples, "loss_mask"),
        "attention_mask": first["attention_mask"],  # [1, 1, s, s], shared by the batch
        # [b, s] or M-RoPE's [3, b, s]: the batch is the next-to-last dimension in both
        "position_ids": _cat(samples, "position_ids", dim=-2) if "position_ids" in first else None,
        "visual_inputs": inputs,
    }


def _named_keys_batch(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Every sample key under its own name, concatenated along the batch (``input_ids``, not ``tokens``), as
    Bridge's Qwen3-Omni collator (``models/qwen_omni/data/collate_fn.py``) hands a batch to its step: the media
    tensors are top-level keys, no inputs object. A shared ``attention_mask`` ``[1, 1, s, s]`` is kept as is;
    ``position_ids`` (``[b, s]`` or M-RoPE's ``[3, b, s]``) joins along its next-to-last dimension."""
    first = samples[0]
    batch: dict[str, Any] = {}
    for key in first:
        if key == "attention_mask":
            batch[key] = first[key]
        else:
            batch[key] = _cat(samples, key, dim=-2 if key == "position_ids" else 0)
    return batch


@dataclass(frozen=True)
class BridgeStep:
    """One of Bridge's own forward steps (or, where Bridge's cannot run on the CPU, the harness's, its family module
    saying why: Step-3.7), and the batch layout its ``get_batch`` reads.

    :class:`SyntheticVLMDataset` lays its samples out with ``collate`` and refuses a sample key outside ``keys``
    (a key the step would not carry to the model); :func:`run_training` hands ``function`` to Bridge's loop.
    """

    #: ``module:attribute`` of Bridge's forward step (imported when the run starts, through the harness's TE stub).
    function: str
    #: the synthetic-sample keys (:func:`bridge_freeze_harness.train.synthetic_batch`) the step carries to the model.
    keys: frozenset[str]
    #: samples of one micro-batch -> the batch the step's ``get_batch`` reads.
    collate: Callable[[list[dict[str, Any]]], dict[str, Any]]
    #: the most samples one micro-batch may hold (``None``: any), where more break the model (the reason beside
    #: the table entry).
    max_micro_batch: int | None = None

    def load(self) -> Callable[..., Any]:
        """The step function itself."""
        module, _, name = self.function.partition(":")
        return getattr(importlib.import_module(module), name)


#: ``megatron/bridge/training/vlm_step.py``: the media in one ``visual_inputs`` object (:func:`_vlm_step_batch`).
VLM_STEP = BridgeStep(
    "megatron.bridge.training.vlm_step:forward_step",
    keys=frozenset({"input_ids", "labels", "loss_mask", "attention_mask", "position_ids",
                    *_VLM_IMAGE_KEYS, *_VLM_AUDIO_KEYS}),
    collate=_vlm_step_batch,
)


def vlm_step_with(*extra_image_keys: str) -> BridgeStep:
    """:data:`VLM_STEP` whose ``visual_inputs`` also carries ``extra_image_keys`` (:func:`visual_inputs_with`)."""
    return replace(VLM_STEP, keys=VLM_STEP.keys | set(extra_image_keys),
                   collate=functools.partial(_vlm_step_batch, extra_image_keys=tuple(extra_image_keys)))


#: The media keys ``megatron/bridge/models/qwen_omni/qwen3_omni_step.py`` moves to the device and passes to the
#: model under their own names (its ``_MULTIMODAL_KEYS``, less its ``visual_inputs`` object).
QWEN_OMNI_MEDIA_KEYS = ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw",
                        "video_second_per_grid", "input_features", "feature_attention_mask", "audio_feature_lengths")

#: Bridge's Qwen3-Omni thinker step: ``input_ids``, ``labels``, ``loss_mask`` and the media as top-level keys
#: (:func:`_named_keys_batch`). It sets ``position_ids`` to ``None`` itself (the thinker computes its M-RoPE ids
#: from the whole ``input_ids``) and passes ``attention_mask`` on when the dataset has one; the Omni samples have
#: none (the thinker reads one as HF's ``[b, s]`` padding mask), so the language model takes its causal default.
QWEN_OMNI_STEP = BridgeStep(
    "megatron.bridge.models.qwen_omni.qwen3_omni_step:forward_step",
    keys=frozenset({"input_ids", "labels", "loss_mask", "attention_mask", "position_ids", *QWEN_OMNI_MEDIA_KEYS}),
    collate=_named_keys_batch,
)


def _llava_step_batch(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """What ``megatron/bridge/training/llava_step.py`` reads: ``tokens``, ``labels``, ``loss_mask``, the images as
    ``pixel_values`` (tiles along the batch) and ``num_patches`` (LLaVA's ``num_image_tiles``, one per image);
    ``attention_mask`` / ``position_ids`` ``None`` (the hybrid language model builds its causal mask and positions)."""
    return {"tokens": _cat(samples, "input_ids"), "labels": _cat(samples, "labels"),
            "loss_mask": _cat(samples, "loss_mask"), "pixel_values": _cat(samples, "images"),
            "num_patches": _cat(samples, "num_image_tiles"), "attention_mask": None, "position_ids": None}


#: Bridge's LLaVA step (Nemotron-VL): ``model(images=..., num_image_tiles=...)`` from the keys above.
LLAVA_STEP = BridgeStep(
    "megatron.bridge.training.llava_step:forward_step",
    keys=frozenset({"input_ids", "labels", "loss_mask", "attention_mask", "position_ids", "images",
                    "num_image_tiles"}),
    collate=_llava_step_batch,
)


#: tiny configuration -> Bridge's forward step that trains it, where that is not :data:`VLM_STEP`: each family module's
#: ``FORWARD_STEPS`` (:mod:`bridge_freeze_harness.tiny`), collected on first use.
FORWARD_STEPS: Mapping[str, BridgeStep] = Declared("FORWARD_STEPS")


def forward_step_of(family: str) -> BridgeStep:
    """The :class:`BridgeStep` that trains tiny configuration ``family`` (:data:`FORWARD_STEPS`, else vlm_step's)."""
    return FORWARD_STEPS.get(family, VLM_STEP)


#: The keys of a text sample; every other key of a synthetic sample carries media (an image, audio, their sizes).
TEXT_KEYS = frozenset({"input_ids", "labels", "loss_mask", "attention_mask", "position_ids"})
#: Words in a provider's ``*_token_id`` fields that name a media placeholder (an image token, a vision start...).
_MEDIA_WORDS = ("image", "video", "vision", "audio", "sound")


def text_only(sample: dict[str, Any], provider: Any) -> dict[str, Any]:
    """``sample`` without its media: the media keys dropped, and each media placeholder token (the provider's
    ``*_token_id`` fields that name an image, video, vision, audio or sound token) replaced by an ordinary text token
    (the vocabulary's last), so the model runs its language model alone: a text-only batch of a VLM."""
    placeholders = {int(getattr(provider, name)) for name in dir(provider)
                    if name.endswith("_token_id") and any(w in name for w in _MEDIA_WORDS)
                    and isinstance(getattr(provider, name, None), int)}
    text = int(provider.vocab_size) - 1
    out = {k: v for k, v in sample.items() if k in TEXT_KEYS and k != "position_ids"}
    for key in ("input_ids", "labels"):
        tokens = out[key].clone()
        for token in placeholders:
            tokens[tokens == token] = text
        out[key] = tokens
    return out


class SyntheticVLMDataset(torch.utils.data.Dataset):
    """Sample ``i`` is the tiny configuration's synthetic batch of one with seed ``seed + i`` (deterministic).

    :meth:`collate_fn` lays samples out as the family's Bridge step reads them (:func:`forward_step_of`):
    vlm_step's ``tokens`` / ``visual_inputs`` layout, or the Omni step's top-level keys. ``media=False``: text-only
    samples (:func:`text_only`), what a VLM trained on text data gets.
    """

    def __init__(self, family: str, provider: Any, samples: int, seed: int = 0, media: bool = True) -> None:
        from bridge_freeze_harness.train import train_spec

        if train_spec(family).forward_keys is not None:
            raise ValueError(f"tiny configuration {family!r} renames its batch keys for the model's forward; Bridge's "
                             "steps pass them under their own names: train it with bridge_freeze_harness.train")
        self.family, self.provider, self.samples, self.seed = family, provider, samples, seed
        self.media = media
        self.step = forward_step_of(family)

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, index: int) -> dict[str, Any]:
        from bridge_freeze_harness.train import synthetic_batch

        sample = synthetic_batch(self.family, self.provider, batch_size=1, seed=self.seed + int(index))
        if not self.media:
            sample = text_only(sample, self.provider)
        unknown = set(sample) - self.step.keys
        if unknown:
            raise NotImplementedError(
                f"the synthetic batch of {self.family!r} has {sorted(unknown)}, which {self.step.function} does not "
                "carry to the model; give the family another BridgeStep (FORWARD_STEPS in its tiny module)")
        return sample

    def collate_fn(self, samples: list[dict[str, Any]]) -> dict[str, Any]:
        limit = self.step.max_micro_batch
        if limit is not None and len(samples) > limit:
            raise ValueError(f"{self.family!r} trains with at most {limit} sample(s) per micro-batch here, got "
                             f"{len(samples)} (FORWARD_STEPS in its tiny module says why)")
        return self.step.collate(samples)
