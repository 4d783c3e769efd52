"""Synthetic training batches, and :class:`TrainSpec`: what one tiny configuration needs to train on the CPU.

Each family module holds its configurations' specs (``TRAIN_SPECS``, see :mod:`bridge_freeze_harness.tiny`);
the batch builders here are the shared pieces. Megatron conventions throughout: ``attention_mask`` is
boolean with ``True`` = masked out; ``labels`` are the next tokens; ``loss_mask`` is 0 where no loss counts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

#: Special token ids inside the tiny vocabulary (128) shared by the Qwen-style families; the real ones
#: are >= 151643 and cannot be looked up in a tiny embedding. Text tokens are drawn above them.
QWEN_TOKEN_IDS: dict[str, int] = {
    "bos_token_id": 1,
    "eos_token_id": 2,
    "vision_start_token_id": 3,
    "vision_end_token_id": 4,
    "image_token_id": 6,
    "video_token_id": 7,
}

#: A synthetic batch: tensors, and for a few families structured inputs (Step-3.7: a list of images).
Batch = dict[str, Any]


def causal_mask(seq_len: int) -> torch.Tensor:
    """Megatron's boolean mask convention: ``True`` = masked out; shape ``[1, 1, s, s]``."""
    return torch.ones(seq_len, seq_len, dtype=torch.bool).triu(1)[None, None]


def random_text(gen: torch.Generator, n: int, low: int, vocab: int) -> torch.Tensor:
    """``n`` random text token ids in ``[low, vocab)``."""
    return torch.randint(low, vocab, (n,), generator=gen)


def token_row(parts: Sequence[torch.Tensor | int]) -> torch.Tensor:
    """One sequence from single ids and id tensors, concatenated in order."""
    return torch.cat([p if torch.is_tensor(p) else torch.tensor([p]) for p in parts]).long()


def next_token_targets(
    input_ids: torch.Tensor, eos: int, no_loss_ids: Sequence[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(labels, loss_mask)``: labels are the next tokens; no loss on the last position nor on ``no_loss_ids``."""
    labels = torch.roll(input_ids, -1, dims=1)
    labels[:, -1] = eos
    loss_mask = torch.ones_like(labels, dtype=torch.float32)
    for token in no_loss_ids:
        loss_mask[labels == token] = 0.0
    loss_mask[:, -1] = 0.0
    return labels, loss_mask


def text_batch(rows: list[torch.Tensor], provider: Any, eos: int, no_loss_ids: Sequence[int]) -> Batch:
    """``input_ids`` / ``labels`` / ``loss_mask`` / causal ``attention_mask`` from equal-length rows."""
    input_ids = torch.stack(rows).long()
    seq_len = input_ids.shape[1]
    if seq_len > int(provider.seq_length):
        raise ValueError(f"synthetic sequence ({seq_len}) is longer than the provider's seq_length")
    labels, loss_mask = next_token_targets(input_ids, eos, no_loss_ids)
    return {"input_ids": input_ids, "attention_mask": causal_mask(seq_len), "labels": labels, "loss_mask": loss_mask}


def vision_geometry(provider: Any) -> tuple[int, int, int, int]:
    """(in_channels, temporal_patch_size, patch_size, spatial_merge_size) of a Qwen-style vision config."""
    vc = provider.vision_config
    channels = int(getattr(vc, "in_channels", 3))
    return channels, int(vc.temporal_patch_size), int(vc.patch_size), int(vc.spatial_merge_size)


#: Roles in a Qwen-style image-text sequence -> the provider field holding that role's token id.
QWEN_ROLES: dict[str, str] = {
    "bos": "bos_token_id",
    "start": "vision_start_token_id",
    "image": "image_token_id",
    "end": "vision_end_token_id",
    "eos": "eos_token_id",
}


def role_ids(spec: TrainSpec) -> dict[str, int]:
    """role -> token id for the roles whose provider field the spec sets (a family without a BOS has none)."""
    ids = spec.all_ids()
    return {role: ids[field] for role, field in spec.roles.items() if field in ids}


def text_range(spec: TrainSpec, vocab: int) -> tuple[int, int]:
    """``[low, high)`` for random text: above the special ids at the bottom, below those at the top of the vocab."""
    special = [int(v) for v in spec.all_ids().values()]
    low = max((v for v in special if v < vocab // 2), default=-1) + 1
    high = min((v for v in special if v >= vocab // 2), default=vocab)
    return low, high


def image_rows(provider: Any, spec: TrainSpec, batch_size: int, gen: torch.Generator, n_image_tokens: int) -> Batch:
    """Rows ``[bos] text [start] image*n [end] text eos`` (bracketed roles only where the spec has them)."""
    ids = role_ids(spec)
    low, high = text_range(spec, int(provider.vocab_size))

    def row() -> torch.Tensor:
        parts: list[torch.Tensor | int] = [ids["bos"]] if "bos" in ids else []
        parts.append(random_text(gen, spec.text_before, low, high))
        parts += [ids["start"]] if "start" in ids else []
        parts.append(torch.full((n_image_tokens,), ids["image"]))
        parts += [ids["end"]] if "end" in ids else []
        parts += [random_text(gen, spec.text_after, low, high), ids["eos"]]
        return token_row(parts)

    return text_batch([row() for _ in range(batch_size)], provider, ids["eos"], [ids["image"]])


def flat_patch_batch(
    provider: Any, spec: TrainSpec, batch_size: int, gen: torch.Generator, geometry: tuple[int, int, int, int]
) -> Batch:
    """One image of ``spec.image_grid_thw`` patches per row, as flattened patches plus ``image_grid_thw``.

    ``geometry`` is (channels, temporal patch, patch, merge); ``pixel_values`` is ``[b * t*h*w, C * Tp * P * P]``;
    one image token per merged ``merge x merge`` patch group.
    """
    channels, temporal_patch, patch, merge = geometry
    t, h, w = spec.image_grid_thw
    if h % merge or w % merge:
        raise ValueError(f"image grid {spec.image_grid_thw} is not a multiple of the merge size {merge}")
    batch = image_rows(provider, spec, batch_size, gen, t * h * w // (merge * merge))
    patch_dim = channels * temporal_patch * patch * patch
    batch["pixel_values"] = torch.randn(batch_size * t * h * w, patch_dim, generator=gen, dtype=provider.params_dtype)
    batch["image_grid_thw"] = torch.tensor([spec.image_grid_thw] * batch_size, dtype=torch.long)
    return batch


def image_text_batch(provider: Any, spec: TrainSpec, batch_size: int, gen: torch.Generator) -> Batch:
    """Qwen-style: :func:`flat_patch_batch` with the geometry of ``provider.vision_config``."""
    return flat_patch_batch(provider, spec, batch_size, gen, vision_geometry(provider))


def with_mm_token_types(batch: Batch, spec: TrainSpec) -> Batch:
    """Add ``mm_token_type_ids`` (0 text, 1 image), which the HF M-RoPE index of some families requires."""
    batch["mm_token_type_ids"] = (batch["input_ids"] == role_ids(spec)["image"]).int()
    return batch


def image_text_batch_with_token_types(provider: Any, spec: TrainSpec, batch_size: int, gen: torch.Generator) -> Batch:
    """:func:`image_text_batch` plus ``mm_token_type_ids``."""
    return with_mm_token_types(image_text_batch(provider, spec, batch_size, gen), spec)


BatchBuilder = Callable[[Any, "TrainSpec", int, torch.Generator], Batch]
LossFn = Callable[[Any, Mapping[str, torch.Tensor]], torch.Tensor]


def masked_mean_loss(output: Any, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """Mean of the model's per-token loss over ``loss_mask`` (a scalar)."""
    if isinstance(output, tuple):  # (per-token loss, loss_mask) on some paths
        output = output[0]
    mask = batch["loss_mask"].to(output.dtype)
    return (output * mask).sum() / mask.sum().clamp_min(1.0)


@dataclass(frozen=True)
class TrainSpec:
    """How to train one tiny configuration on the CPU: provider fields, synthetic batch, forward, loss."""

    #: provider fields set before the model is built so special tokens fit the tiny vocabulary.
    token_ids: Mapping[str, int] = field(default_factory=dict)
    #: special token ids the batch uses that are no provider field (e.g. a BOS the model never looks at).
    batch_ids: Mapping[str, int] = field(default_factory=dict)
    #: parameter-name prefixes of the vision projection (as a bare chunk names them).
    projection_prefixes: tuple[str, ...] = ()
    #: other provider fields for a CPU run (the fused cross entropy is torch.compile'd: seconds of
    #: inductor compilation on the first step, for the same numbers).
    cpu_overrides: Mapping[str, Any] = field(default_factory=lambda: {"cross_entropy_loss_fusion": False})
    #: role in the synthetic sequence -> provider field of its token id (see :data:`QWEN_ROLES`).
    roles: Mapping[str, str] = field(default_factory=lambda: dict(QWEN_ROLES))
    #: the synthetic batch: ``make_batch(provider, spec, batch_size, generator)``.
    make_batch: BatchBuilder = image_text_batch
    #: (t, h, w) of each synthetic image, in patches (for builders that use it).
    image_grid_thw: tuple[int, int, int] = (1, 8, 8)
    #: random text tokens before and after the image.
    text_before: int = 4
    text_after: int = 6
    #: batch key -> ``model.forward`` keyword; ``None``: every batch key under its own name.
    forward_keys: Mapping[str, str] | None = None
    #: the scalar loss from the model's output and the batch.
    loss: LossFn = masked_mean_loss

    def all_ids(self) -> dict[str, int]:
        return {**self.batch_ids, **self.token_ids}

    def forward_kwargs(self, batch: Mapping[str, torch.Tensor]) -> dict[str, Any]:
        keys = self.forward_keys if self.forward_keys is not None else {k: k for k in batch}
        return {kwarg: batch[key] for key, kwarg in keys.items() if key in batch}

    def check_token_ids(self, provider: Any) -> None:
        """Every special id this spec uses must fit the provider's vocabulary."""
        vocab = int(provider.vocab_size)
        for name in self.token_ids:
            value = int(getattr(provider, name))
            if not 0 <= value < vocab:
                raise ValueError(
                    f"{type(provider).__name__}.{name}={value} is outside the vocabulary ({vocab}); "
                    "build the provider with bridge_freeze_harness.train.make_provider"
                )
