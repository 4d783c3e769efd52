"""Pure-PyTorch stand-ins for the TransformerEngine classes some Bridge layer specs name directly.

Each keeps TE's parameter names (what the plugin classifies and checkpoints map), on megatron-core's local
linears: a fused norm + linear (``layer_norm_weight`` / ``layer_norm_bias``), a row-parallel linear followed
by a norm (``post_layernorm``), a norm that also handles zero-centred gamma (megatron-core's torch norm does
not), and Mamba2's gated RMSNorm. Used by family modules' ``cpu_patches()`` (see :mod:`bridge_freeze_harness`).
Importing this module imports megatron-core.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
import torch.nn.functional as F
from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear


def _normalize(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, config: Any) -> torch.Tensor:
    """LayerNorm or RMSNorm of ``x`` over its last dim, as ``config.normalization`` says (zero-centred gamma too)."""
    if config.layernorm_zero_centered_gamma:
        weight = weight + 1
    shape = (x.shape[-1],)
    if config.normalization == "LayerNorm":
        return F.layer_norm(x, shape, weight, bias, config.layernorm_epsilon)
    return F.rms_norm(x, shape, weight, config.layernorm_epsilon)


def _norm_parameters(module: torch.nn.Module, size: int, config: Any, prefix: str) -> None:
    """Register ``<prefix>weight`` (and ``<prefix>bias`` for LayerNorm) on ``module``, initialised as TE does."""
    init = torch.zeros if config.layernorm_zero_centered_gamma else torch.ones
    params = {f"{prefix}weight": torch.nn.Parameter(init(size, dtype=config.params_dtype))}
    bias = None
    if config.normalization == "LayerNorm":
        bias = torch.nn.Parameter(torch.zeros(size, dtype=config.params_dtype))
        params[f"{prefix}bias"] = bias
    for name, param in params.items():
        param.sequence_parallel = bool(config.sequence_parallel)
        module.register_parameter(name, param)
    if bias is None:
        setattr(module, f"{prefix}bias", None)


class Norm(torch.nn.Module):
    """TE ``TENorm``'s place: ``weight`` (+ ``bias``), LayerNorm or RMSNorm, zero-centred gamma allowed."""

    def __init__(self, config: Any, hidden_size: int, eps: float | None = None, **_kwargs: Any) -> None:
        super().__init__()
        self.config = config
        _norm_parameters(self, hidden_size, config, "")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _normalize(x, self.weight, self.bias, self.config)


class LayerNormColumnParallelLinear(ColumnParallelLinear):
    """TE ``LayerNormLinear``'s place: a norm (``layer_norm_weight`` / ``_bias``) then a column-parallel linear."""

    _ACCEPTED = frozenset(inspect.signature(ColumnParallelLinear.__init__).parameters)

    def __init__(self, input_size: int, output_size: int, *, config: Any, **kwargs: Any) -> None:
        kwargs = {k: v for k, v in kwargs.items() if k in self._ACCEPTED}
        super().__init__(input_size, output_size, config=config, **kwargs)
        self.norm_config = config
        _norm_parameters(self, input_size, config, "layer_norm_")

    def forward(self, input_: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        normed = _normalize(input_, self.layer_norm_weight, self.layer_norm_bias, self.norm_config)
        return super().forward(normed, *args, **kwargs)


class RowParallelLinearLayerNorm(RowParallelLinear):
    """Bridge's ``TERowParallelLinearLayerNorm``'s place: a row-parallel linear, then ``post_layernorm``."""

    _ACCEPTED = frozenset(inspect.signature(RowParallelLinear.__init__).parameters)

    def __init__(self, input_size: int, output_size: int, *, config: Any, **kwargs: Any) -> None:
        kwargs = {k: v for k, v in kwargs.items() if k in self._ACCEPTED}
        super().__init__(input_size, output_size, config=config, **kwargs)
        self.post_layernorm = Norm(config, output_size)

    def forward(self, x: torch.Tensor) -> Any:
        output, bias = super().forward(x)
        return self.post_layernorm(output), bias


class GatedRMSNorm(torch.nn.Module):
    """Group-wise RMSNorm of ``x * silu(z)`` (gate before norm, unless told otherwise): Mamba2's output norm."""

    def __init__(
        self,
        hidden_size: int,
        eps: float = 1e-5,
        group_size: int | None = None,
        norm_before_gate: bool = False,
        device: Any = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.eps = eps
        self.group_size = group_size or hidden_size
        self.norm_before_gate = norm_before_gate
        self.weight = torch.nn.Parameter(torch.ones(hidden_size, device=device, dtype=dtype))

    def forward(self, x: torch.Tensor, z: torch.Tensor | None = None) -> torch.Tensor:
        if z is not None and not self.norm_before_gate:
            x = x * F.silu(z)
        grouped = x.reshape(*x.shape[:-1], -1, self.group_size)
        grouped = grouped * torch.rsqrt(grouped.pow(2).mean(-1, keepdim=True) + self.eps)
        out = grouped.reshape(x.shape) * self.weight
        if z is not None and self.norm_before_gate:
            out = out * F.silu(z)
        return out
