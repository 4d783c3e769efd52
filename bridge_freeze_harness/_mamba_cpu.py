"""A pure-PyTorch stand-in for the mamba-ssm kernel megatron-core's ``MambaMixer`` trains with, for CPU runs.

``MambaMixer.forward`` in training (``use_mamba_mem_eff_path``, the default) calls exactly one kernel,
``mamba_split_conv1d_scan_combined`` (mamba-ssm's Triton SSD scan fused with ``causal_conv1d``); its gated output
norm is built from mamba-ssm's ``RMSNormGated`` (the build patches swap in ``local_layers.GatedRMSNorm``) and
called without a gate, because the kernel already multiplied by ``silu(z)``. The other kernels the module
imports (``causal_conv1d_fn``, ``mamba_chunk_scan_combined``, ``selective_state_update``, ...) serve only the
non-memory-efficient path and inference.

Written here from the Mamba-2 (SSD) formulation, per head ``h`` with group ``g(h)``:

    xBC = silu(causal_depthwise_conv1d(xBC))              split -> x [h, p], B [g, n], C [g, n]
    dt_t = softplus(dt_t + dt_bias),  a_t = dt_t * A       (A < 0: a decay)
    s_t = exp(a_t) * s_{t-1} + dt_t * x_t B_t^T             (state [p, n], s_0 = 0)
    y_t = s_t C_t + D * x_t,  out_t = y_t * silu(z_t)

:func:`ssd_chunked` evaluates the recurrence chunk by chunk (within a chunk as a masked quadratic form, across
chunks by carrying the state); tests/unit/integration/test_mamba_cpu.py checks it against the step-by-step one.
Autograd differentiates both; nothing here is fused or tuned. Packed sequences (``seq_idx``) are refused.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F


def causal_depthwise_conv1d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x`` [b, l, d], ``weight`` [d, w]: output t sees inputs t-w+1..t of its own channel only."""
    width = weight.shape[-1]
    padded = F.pad(x.transpose(1, 2), (width - 1, 0))
    return F.conv1d(padded, weight.unsqueeze(1), bias, groups=weight.shape[0]).transpose(1, 2)


def _heads(t: torch.Tensor, nheads: int) -> torch.Tensor:
    """[b, l, g, n] per group -> [b, l, h, n] per head (heads of one group are consecutive)."""
    return t.repeat_interleave(nheads // t.shape[2], dim=2)


def ssd_chunked(
    x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor, chunk_size: int
) -> torch.Tensor:
    """The recurrence, computed per chunk of ``chunk_size`` steps. ``x`` [b, l, h, p], ``dt`` [b, l, h] (after
    softplus), ``A`` [h], ``B`` / ``C`` [b, l, g, n]; returns ``y`` [b, l, h, p] without the ``D`` skip."""
    b, length, h, p = x.shape
    pad = (-length) % chunk_size  # padded steps have dt = 0: they neither decay nor add to the state
    if pad:
        x, dt, B, C = (F.pad(t, (0, 0) * (t.dim() - 2) + (0, pad)) for t in (x, dt, B, C))
    chunks, q = x.shape[1] // chunk_size, chunk_size
    x = x.reshape(b, chunks, q, h, p)
    dt = dt.reshape(b, chunks, q, h)
    B = _heads(B, h).reshape(b, chunks, q, h, -1)
    C = _heads(C, h).reshape(b, chunks, q, h, -1)
    log_decay = torch.cumsum(dt * A, dim=2)  # [b, c, q, h]: decay from the chunk start through step i
    # within a chunk: y_i += sum_{j<=i} exp(cum_i - cum_j) (C_i . B_j) dt_j x_j
    diff = log_decay[:, :, :, None, :] - log_decay[:, :, None, :, :]  # [b, c, i, j, h]
    causal = torch.ones(q, q, dtype=torch.bool, device=x.device).tril()
    weights = torch.exp(diff.masked_fill(~causal[None, None, :, :, None], float("-inf")))
    scores = torch.einsum("bcihn,bcjhn->bcijh", C, B) * weights * dt[:, :, None, :, :]
    y = torch.einsum("bcijh,bcjhp->bcihp", scores, x)
    # each chunk's own contribution to the state at its end, then carried across chunks
    to_end = torch.exp(log_decay[:, :, -1:, :] - log_decay) * dt  # [b, c, q, h]
    chunk_states = torch.einsum("bcjh,bcjhp,bcjhn->bchpn", to_end, x, B)
    state = x.new_zeros(b, h, p, B.shape[-1])
    carried = []
    for c in range(chunks):
        carried.append(state)
        state = torch.exp(log_decay[:, c, -1])[:, :, None, None] * state + chunk_states[:, c]
    entering = torch.stack(carried, dim=1)  # [b, c, h, p, n]: the state before each chunk
    y = y + torch.einsum("bcihn,bchpn,bcih->bcihp", C, entering, torch.exp(log_decay))
    return y.reshape(b, chunks * q, h, p)[:, :length]


def split_conv1d_scan(
    zxbcdt: torch.Tensor,
    conv1d_weight: torch.Tensor,
    conv1d_bias: torch.Tensor | None,
    dt_bias: torch.Tensor,
    A: torch.Tensor,
    D: torch.Tensor,
    chunk_size: int,
    *,
    headdim: int | None = None,
    ngroups: int = 1,
    seq_idx: torch.Tensor | None = None,
    norm_before_gate: bool = False,
    activation: str = "silu",
    **unused: Any,
) -> torch.Tensor:
    """What ``MambaMixer._ssm_training`` asks of ``mamba_split_conv1d_scan_combined``: ``zxbcdt`` [b, l, z|x|B|C|dt]
    -> ``y * silu(z)`` [b, l, d_inner]. ``D`` is [h] (with ``headdim``) or [h, p]."""
    if seq_idx is not None or norm_before_gate or activation != "silu" or unused.get("rmsnorm_weight") is not None:
        raise NotImplementedError(
            "the CPU Mamba scan handles MambaMixer's training call only: no packed sequences (seq_idx), "
            "gate before the norm, silu; run on a GPU with mamba-ssm for anything else"
        )
    nheads = dt_bias.shape[0]
    headdim = headdim if headdim is not None else D.shape[-1]
    d_inner = nheads * headdim
    xbc_dim = conv1d_weight.shape[0]
    z, xbc, dt = torch.split(zxbcdt, [d_inner, xbc_dim, nheads], dim=-1)
    xbc = F.silu(causal_depthwise_conv1d(xbc, conv1d_weight, conv1d_bias))
    x, B, C = torch.split(xbc, [d_inner, (xbc_dim - d_inner) // 2, (xbc_dim - d_inner) // 2], dim=-1)
    b, length = x.shape[:2]
    x = x.float().reshape(b, length, nheads, headdim)
    dt = F.softplus(dt.float() + dt_bias.float())
    B, C = (t.float().reshape(b, length, ngroups, -1) for t in (B, C))
    y = ssd_chunked(x, dt, A.float(), B, C, chunk_size)
    skip = D.float().reshape(nheads, -1)  # [h, 1] or [h, p]
    y = (y + x * skip).reshape(b, length, d_inner)
    return (y * F.silu(z.float())).to(zxbcdt.dtype)


def mamba_forward_patches() -> list[tuple[Any, str, Any]]:
    """(module, attribute, value) for :func:`bridge_freeze_harness.patching.patched`: the training kernel."""
    from megatron.core.ssm import mamba_mixer

    return [(mamba_mixer, "mamba_split_conv1d_scan_combined", split_conv1d_scan)]
