"""CPU patches a forward AND its backward need (the backward of a recomputed layer re-runs its forward).

Generic (:func:`cpu_forward_patches`):

- megatron-core's local ``DotProductAttention`` refuses packed-sequence (THD) parameters, which the Megatron
  vision encoders pass (one sequence per image frame); its forward turns them into a block-diagonal mask
  built from ``cu_seqlens`` (:func:`block_diagonal_mask`). Calls without packed parameters are unchanged.
- it also refuses an additive ``attention_bias`` (Gemma3-VL passes one: causal text plus bidirectional image
  blocks); a bias of 0 / -inf is exactly a boolean mask, which it accepts (:func:`_bias_as_mask`).
- the local softmax's default causal and sliding-window masks are made on the CPU (megatron-core makes them
  on "cuda"; note that with a sliding window it ignores the mask it is given); on CUDA, on "cuda".
- activation recompute (``recompute_granularity="full"``) saves / restores the CUDA RNG state around each
  recomputed chunk: without CUDA the CPU generator's state stands in (megatron-core saves and restores it too).
  The recompute runs during ``backward()``: run the backward inside these patches too.
- ``torch.cuda.current_device`` answers ``"cpu"`` where no CUDA device exists (megatron-core's
  ``GlobalMemoryBuffer``, the local attention's score buffer, asks it for a device).

The CPU device patches (the last two) never run with ``device="cuda"``; the rest are device-neutral.

:func:`forward_patches` adds a family module's own ``forward_patches()``. Who imports this package, and why:
:mod:`bridge_freeze_harness`.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator
from typing import Any

import torch

from bridge_freeze_harness.context import module_patches
from bridge_freeze_harness.patching import patched


def _segment_ids(cu_seqlens: torch.Tensor, length: int) -> torch.Tensor:
    positions = torch.arange(length, device=cu_seqlens.device)
    return torch.searchsorted(cu_seqlens[1:].long(), positions, right=True)


def block_diagonal_mask(cu_seqlens_q: torch.Tensor, cu_seqlens_kv: torch.Tensor, sq: int, sk: int) -> torch.Tensor:
    """``[1, 1, sq, sk]`` boolean mask (``True`` = masked): a token sees only its own packed sequence."""
    seg_q = _segment_ids(cu_seqlens_q, sq)
    seg_kv = _segment_ids(cu_seqlens_kv, sk)
    return (seg_q[:, None] != seg_kv[None, :])[None, None]


def _bias_as_mask(bias: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """An additive bias of 0 (attend) / a very negative value (do not) as a boolean mask, ``True`` = masked."""
    blocked = bias < torch.finfo(bias.dtype).min / 2
    if not torch.all(blocked | (bias == 0)):
        raise NotImplementedError("only a 0 / -inf attention bias (a mask) is handled by the CPU attention")
    return blocked if mask is None else blocked | mask.bool()


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
        if attention_bias is not None:
            attention_mask, attention_bias = _bias_as_mask(attention_bias, attention_mask), None
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


def _causal_mask(sq: int, device: str = "cpu") -> torch.Tensor:
    """``[sq, sq]``, ``True`` above the diagonal (a token does not see later ones), on ``device``."""
    positions = torch.arange(sq, device=device)
    return positions[None, :] > positions[:, None]


def _sliding_window_causal_mask(
    sq: int, skv: int, window_size: int | tuple[int, int], device: str = "cpu"
) -> torch.Tensor:
    """``[sq, skv]``, ``True`` outside ``[q - window[0], q + window[1]]`` (queries aligned to the last keys).

    A plain ``int`` window (Gemma3's config field, which megatron-core's own helper cannot index) is ``(w, 0)``.
    """
    if isinstance(window_size, int):
        window_size = (window_size, 0)
    query = torch.arange(sq, device=device)[:, None] + (skv - sq)
    key = torch.arange(skv, device=device)[None, :]
    return ~((key >= query - window_size[0]) & (key <= query + window_size[1]))


def _cpu_rng_state(*_args: Any, **_kwargs: Any) -> torch.Tensor:
    return torch.get_rng_state()


def _keep_rng_state(*_args: Any, **_kwargs: Any) -> None:
    """The CPU state is restored by megatron-core's own ``torch.set_rng_state`` next to this call."""


def _on_cpu(device: str | None) -> bool:
    """Whether the CPU device patches apply: ``"cpu"`` yes, ``"cuda"`` never, ``None``: where CUDA is absent."""
    if device is None:
        return not torch.cuda.is_available()
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device {device!r}: the harness runs forwards on 'cpu' or 'cuda'")
    return device == "cpu"


def _generic_patches(device: str | None = None) -> list[tuple[Any, str, Any]]:
    from megatron.core.fusions import fused_softmax
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    on_cpu = _on_cpu(device)
    masks_on = "cpu" if on_cpu else "cuda"
    patches: list[tuple[Any, str, Any]] = [
        (DotProductAttention, "forward", _packed_as_masked(DotProductAttention.forward)),
        # The local softmax's default causal / sliding-window masks, on the device the scores are on.
        (fused_softmax, "get_default_causal_mask", functools.partial(_causal_mask, device=masks_on)),
        (fused_softmax, "get_sliding_window_causal_mask",
         functools.partial(_sliding_window_causal_mask, device=masks_on)),
    ]
    if on_cpu:
        from megatron.core.tensor_parallel import random as mpu_random

        patches += [
            (torch.cuda, "current_device", _cpu_device),
            # Activation recompute saves and restores the CUDA RNG state around each recomputed chunk; the
            # CPU generator's state (saved and restored by the same code) is the only one there is.
            (mpu_random, "_get_cuda_rng_state", _cpu_rng_state),
            (mpu_random, "_set_cuda_rng_state", _keep_rng_state),
        ]
    return patches


_PATCH_LOCK = threading.RLock()
_PATCH_DEPTH = 0
_UNDO: list[contextlib.ExitStack] = []


@contextlib.contextmanager
def cpu_forward_patches(device: str | None = None) -> Iterator[None]:
    """The generic forward patches (module docstring); restored on exit; re-entrant.

    ``device``: ``"cpu"`` applies the CPU device patches, ``"cuda"`` never does, ``None`` applies them where
    CUDA is absent. A nested call keeps the outer call's patches.
    """
    global _PATCH_DEPTH
    with _PATCH_LOCK:
        if _PATCH_DEPTH == 0:
            stack = contextlib.ExitStack()
            stack.enter_context(patched(_generic_patches(device)))
            _UNDO.append(stack)
        _PATCH_DEPTH += 1
    try:
        yield
    finally:
        with _PATCH_LOCK:
            _PATCH_DEPTH -= 1
            if _PATCH_DEPTH == 0:
                _UNDO.pop().close()


@contextlib.contextmanager
def forward_patches(name: str | None = None, device: str | None = None) -> Iterator[None]:
    """Generic forward patches, plus those of tiny configuration ``name``'s family module when given.

    Run a forward AND its ``backward()`` inside (or use :func:`bridge_freeze_harness.train.loss_fn` /
    :func:`bridge_freeze_harness.train.forward_backward`). ``device`` as in :func:`cpu_forward_patches`.
    """
    from bridge_freeze_harness.cpu_runtime import fresh_training_state
    from bridge_freeze_harness.tiny import family_module

    module = family_module(name) if name is not None else None
    fresh_training_state()
    with cpu_forward_patches(device), module_patches(module, "forward_patches"):
        yield
