"""A few real training steps of a tiny Bridge VLM on the CPU: synthetic batch, loss, AdamW.

What a family needs to be trained here is data, one :class:`TrainSpec` in :data:`TRAIN_SPECS`:
the image grid of its synthetic picture, the provider fields that must hold special token ids
inside the tiny vocabulary, and the parameter-name prefixes of its vision projection.

Typical use::

    provider = make_provider("qwen3_vl")           # tiny provider + small special token ids
    model = build_tiny_model("qwen3_vl", provider)
    batch = synthetic_batch("qwen3_vl", provider)
    loss = loss_fn(model, batch)                    # enters forward_patches() itself
    loss.backward()
    losses = train_steps(model, "qwen3_vl", provider, steps=3)

CPU patches (see :func:`forward_patches`): megatron-core's local ``DotProductAttention`` refuses
packed-sequence (THD) parameters, which the Megatron vision encoders pass (one sequence per image
frame). While the patches are active it turns them into a block-diagonal mask built from
``cu_seqlens``. The language model's causal mask is not patched in: :func:`synthetic_batch`
provides it explicitly as ``attention_mask`` (megatron-core's default one is created on "cuda").

Test support: the plugin's runtime path never imports this module; ``bridge-freeze demo`` does, lazily.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

logger = logging.getLogger(__name__)

#: Special token ids inside the tiny vocabulary (128) shared by the Qwen families; the real ones
#: are >= 151643 and cannot be looked up in a tiny embedding. Text tokens are drawn above them.
QWEN_TOKEN_IDS: dict[str, int] = {
    "bos_token_id": 1,
    "eos_token_id": 2,
    "vision_start_token_id": 3,
    "vision_end_token_id": 4,
    "image_token_id": 6,
    "video_token_id": 7,
}


@dataclass(frozen=True)
class TrainSpec:
    """How to build a synthetic batch for one family, and where its vision projection lives."""

    #: provider fields set (before the model is built) so special tokens fit the tiny vocabulary.
    token_ids: Mapping[str, int]
    #: parameter-name prefixes of the vision projection (as a bare chunk names them).
    projection_prefixes: tuple[str, ...]
    #: other provider fields for a CPU run (the fused cross entropy is torch.compile'd: seconds of
    #: inductor compilation on the first step, for the same numbers).
    cpu_overrides: Mapping[str, Any] = field(default_factory=lambda: {"cross_entropy_loss_fusion": False})
    #: (t, h, w) of each synthetic image, in patches; h and w are multiples of the merge size.
    image_grid_thw: tuple[int, int, int] = (1, 8, 8)
    #: random text tokens before and after the image (besides bos / vision start / end / eos).
    text_before: int = 4
    text_after: int = 6
    #: keyword arguments of ``model.forward`` the batch keys map to (batch key -> forward kwarg).
    forward_keys: Mapping[str, str] = field(
        default_factory=lambda: {
            "input_ids": "input_ids",
            "attention_mask": "attention_mask",
            "labels": "labels",
            "loss_mask": "loss_mask",
            "pixel_values": "pixel_values",
            "image_grid_thw": "image_grid_thw",
        }
    )


TRAIN_SPECS: dict[str, TrainSpec] = {
    "qwen3_vl": TrainSpec(
        token_ids=QWEN_TOKEN_IDS,
        projection_prefixes=("vision_model.merger.", "vision_model.decoder.deepstack_merger_list."),
    ),
    "qwen25_vl": TrainSpec(
        token_ids={**QWEN_TOKEN_IDS, "vision_token_id": 5},
        projection_prefixes=("visual.merger.",),
    ),
}


def train_spec(family: str) -> TrainSpec:
    try:
        return TRAIN_SPECS[family]
    except KeyError:
        raise KeyError(f"no training spec for family {family!r}; known: {sorted(TRAIN_SPECS)}") from None


def make_provider(family: str, **overrides: Any) -> Any:
    """The family's tiny provider, special token ids inside the tiny vocabulary, CPU-friendly loss."""
    from bridge_freeze_harness import tiny

    spec = train_spec(family)
    return tiny.make_provider(family, **{**spec.token_ids, **spec.cpu_overrides, **overrides})


def projection_parameter_names(family: str, model: torch.nn.Module) -> list[str]:
    prefixes = train_spec(family).projection_prefixes
    return [name for name, _ in model.named_parameters() if name.startswith(prefixes)]


# --------------------------------------------------------------------------------------------
# Synthetic batch
# --------------------------------------------------------------------------------------------


def _vision_geometry(provider: Any) -> tuple[int, int, int, int]:
    """(in_channels, temporal_patch_size, patch_size, spatial_merge_size) of the vision tower."""
    vc = provider.vision_config
    return (
        int(getattr(vc, "in_channels", 3)),
        int(vc.temporal_patch_size),
        int(vc.patch_size),
        int(vc.spatial_merge_size),
    )


def _check_token_ids(provider: Any, spec: TrainSpec) -> int:
    """Return the vocabulary size after checking every special id the batch uses fits in it."""
    vocab = int(provider.vocab_size)
    for name in spec.token_ids:
        value = int(getattr(provider, name))
        if not 0 <= value < vocab:
            raise ValueError(
                f"{type(provider).__name__}.{name}={value} is outside the vocabulary ({vocab}); "
                "build the provider with bridge_freeze_harness.train.make_provider"
            )
    return vocab


def causal_mask(seq_len: int) -> torch.Tensor:
    """Megatron's boolean mask convention: ``True`` = masked out; shape ``[1, 1, s, s]``."""
    return torch.ones(seq_len, seq_len, dtype=torch.bool).triu(1)[None, None]


def synthetic_batch(family: str, provider: Any, *, batch_size: int = 1, seed: int = 0) -> dict[str, torch.Tensor]:
    """One image per sample, text around it, next-token labels; deterministic for a ``seed``.

    Keys: ``input_ids`` / ``labels`` / ``loss_mask`` ``[b, s]``, ``attention_mask`` ``[1, 1, s, s]``
    (causal, ``True`` = masked), ``pixel_values`` ``[b * t*h*w, C * Tp * P * P]`` and
    ``image_grid_thw`` ``[b, 3]``.
    """
    spec = train_spec(family)
    vocab = _check_token_ids(provider, spec)
    channels, temporal_patch, patch, merge = _vision_geometry(provider)
    t, h, w = spec.image_grid_thw
    if h % merge or w % merge:
        raise ValueError(f"image grid {spec.image_grid_thw} is not a multiple of the merge size {merge}")
    n_patches = t * h * w
    n_image_tokens = n_patches // (merge * merge)

    ids = spec.token_ids
    first_text_id = max(ids.values()) + 1
    gen = torch.Generator().manual_seed(seed)

    def text(n: int) -> torch.Tensor:
        return torch.randint(first_text_id, vocab, (n,), generator=gen)

    rows = []
    for _ in range(batch_size):
        rows.append(
            torch.cat(
                [
                    torch.tensor([ids["bos_token_id"]]),
                    text(spec.text_before),
                    torch.tensor([ids["vision_start_token_id"]]),
                    torch.full((n_image_tokens,), ids["image_token_id"]),
                    torch.tensor([ids["vision_end_token_id"]]),
                    text(spec.text_after),
                    torch.tensor([ids["eos_token_id"]]),
                ]
            )
        )
    input_ids = torch.stack(rows).long()
    seq_len = input_ids.shape[1]
    if seq_len > int(provider.seq_length):
        raise ValueError(f"synthetic sequence ({seq_len}) is longer than the provider's seq_length")

    labels = torch.roll(input_ids, -1, dims=1)
    labels[:, -1] = ids["eos_token_id"]
    loss_mask = (labels != ids["image_token_id"]).float()
    loss_mask[:, -1] = 0.0

    patch_dim = channels * temporal_patch * patch * patch
    pixel_values = torch.randn(batch_size * n_patches, patch_dim, generator=gen, dtype=provider.params_dtype)
    image_grid_thw = torch.tensor([spec.image_grid_thw] * batch_size, dtype=torch.long)

    return {
        "input_ids": input_ids,
        "attention_mask": causal_mask(seq_len),
        "labels": labels,
        "loss_mask": loss_mask,
        "pixel_values": pixel_values,
        "image_grid_thw": image_grid_thw,
    }


# --------------------------------------------------------------------------------------------
# CPU forward patches
# --------------------------------------------------------------------------------------------


def _segment_ids(cu_seqlens: torch.Tensor, length: int) -> torch.Tensor:
    positions = torch.arange(length, device=cu_seqlens.device)
    return torch.searchsorted(cu_seqlens[1:].long(), positions, right=True)


def block_diagonal_mask(cu_seqlens_q: torch.Tensor, cu_seqlens_kv: torch.Tensor, sq: int, sk: int) -> torch.Tensor:
    """``[1, 1, sq, sk]`` boolean mask (``True`` = masked): a token sees only its own packed sequence."""
    seg_q = _segment_ids(cu_seqlens_q, sq)
    seg_kv = _segment_ids(cu_seqlens_kv, sk)
    return (seg_q[:, None] != seg_kv[None, :])[None, None]


def _packed_as_masked(original: Any) -> Any:
    """Wrap ``DotProductAttention.forward``: THD packed input -> one batch row + block-diagonal mask."""

    @functools.wraps(original)
    def forward(
        self: Any,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        attn_mask_type: Any = None,
        attention_bias: torch.Tensor | None = None,
        packed_seq_params: Any = None,
    ) -> torch.Tensor:
        if packed_seq_params is None:
            return original(
                self, query, key, value, attention_mask, attn_mask_type=attn_mask_type, attention_bias=attention_bias
            )
        if packed_seq_params.qkv_format != "thd":
            raise NotImplementedError(f"packed format {packed_seq_params.qkv_format!r} is not handled on the CPU")
        cu_q = packed_seq_params.cu_seqlens_q_padded
        cu_q = packed_seq_params.cu_seqlens_q if cu_q is None else cu_q
        cu_kv = packed_seq_params.cu_seqlens_kv_padded
        cu_kv = packed_seq_params.cu_seqlens_kv if cu_kv is None else cu_kv
        # THD tensors are [t, heads, dim]; the local kernel wants [s, b, heads, dim].
        if query.dim() == 3:
            query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
        mask = block_diagonal_mask(cu_q, cu_kv, query.shape[0], key.shape[0]).to(query.device)
        if attention_mask is not None:
            mask = mask | attention_mask.bool()
        return original(self, query, key, value, mask, attn_mask_type=attn_mask_type, attention_bias=attention_bias)

    return forward


def _cpu_device() -> str:
    return "cpu"


_PATCH_LOCK = threading.RLock()
_PATCH_DEPTH = 0


@contextlib.contextmanager
def forward_patches() -> Iterator[None]:
    """CPU patches a forward/backward of the tiny models needs; restored on exit; re-entrant.

    - ``megatron.core.transformer.dot_product_attention.DotProductAttention.forward`` accepts THD
      packed-sequence parameters (by masking, see :func:`block_diagonal_mask`). Calls without
      packed parameters reach the original unchanged.
    - ``torch.cuda.current_device`` answers ``"cpu"`` where no CUDA device exists: megatron-core's
      ``GlobalMemoryBuffer`` (the local attention's score buffer) asks it for a device.
    """
    global _PATCH_DEPTH
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    with _PATCH_LOCK:
        original_forward = DotProductAttention.forward
        original_current_device = torch.cuda.current_device
        if _PATCH_DEPTH == 0:
            DotProductAttention.forward = _packed_as_masked(original_forward)  # type: ignore[method-assign]
            if not torch.cuda.is_available():
                torch.cuda.current_device = _cpu_device  # type: ignore[assignment]
        _PATCH_DEPTH += 1
    try:
        yield
    finally:
        with _PATCH_LOCK:
            _PATCH_DEPTH -= 1
            if _PATCH_DEPTH == 0:
                DotProductAttention.forward = original_forward  # type: ignore[method-assign]
                torch.cuda.current_device = original_current_device  # type: ignore[assignment]


# --------------------------------------------------------------------------------------------
# Loss and training loop
# --------------------------------------------------------------------------------------------


def _forward_kwargs(batch: Mapping[str, torch.Tensor], spec: TrainSpec | None) -> dict[str, torch.Tensor]:
    keys = spec.forward_keys if spec is not None else {k: k for k in batch}
    return {kwarg: batch[key] for key, kwarg in keys.items() if key in batch}


def loss_fn(model: torch.nn.Module, batch: Mapping[str, torch.Tensor], family: str | None = None) -> torch.Tensor:
    """One forward of ``model`` on ``batch``; the mean next-token loss over ``loss_mask`` (a scalar).

    Enters :func:`forward_patches` for the forward. Without ``family`` every batch key is passed
    to ``model.forward`` by its own name (true of the Qwen families); with it, the family's
    :attr:`TrainSpec.forward_keys` say which keys go where.
    """
    spec = train_spec(family) if family is not None else None
    with forward_patches():
        output = model(**_forward_kwargs(batch, spec))
    if isinstance(output, tuple):  # (per-token loss, loss_mask) on context-parallel paths
        output = output[0]
    mask = batch["loss_mask"].to(output.dtype)
    return (output * mask).sum() / mask.sum().clamp_min(1.0)


def train_steps(
    model: torch.nn.Module,
    family: str,
    provider: Any,
    steps: int,
    lr: float = 1e-2,
    *,
    weight_decay: float = 0.1,
    batch_size: int = 1,
    seed: int = 0,
    on_step: Callable[[int, float], None] | None = None,
) -> list[float]:
    """``steps`` AdamW steps over the parameters with ``requires_grad`` (only); returns the losses."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the model has no trainable parameter")
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    batch = synthetic_batch(family, provider, batch_size=batch_size, seed=seed)
    model.train()
    losses: list[float] = []
    for step in range(steps):
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model, batch, family)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
        logger.debug("%s step %d loss %.4f", family, step, losses[-1])
        if on_step is not None:
            on_step(step, losses[-1])
    return losses
