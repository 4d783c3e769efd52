"""Offline stand-ins for the hub remote code Kimi K2.5-VL's model loads (``modeling_kimi_k25.py``).

Structural re-implementations, with the module and parameter names of the checkpoint keys Bridge maps one to
one (see :mod:`bridge_freeze_harness.tiny.kimi_k25_vl`, whose ``tiny_patches()`` hands them out); a simple forward.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel

TINY_VISION = {
    "vt_hidden_size": 32,
    "vt_num_hidden_layers": 2,
    "vt_num_attention_heads": 2,
    "vt_intermediate_size": 64,
    "patch_size": 4,
    "init_pos_emb_height": 8,
    "init_pos_emb_width": 8,
    "init_pos_emb_time": 4,
    "merge_kernel_size": (2, 2),
}


class KimiK25VisionConfig(PretrainedConfig):
    """What the hub's ``KimiK25Config.vision_config`` carries (tiny defaults)."""

    model_type = "kimi_k25_vision_offline"

    def __init__(self, text_hidden_size: int = 64, projector_ln_eps: float = 1e-5, **kwargs: Any) -> None:
        for key, value in TINY_VISION.items():
            setattr(self, key, kwargs.pop(key, value))
        self.merge_kernel_size = tuple(self.merge_kernel_size)
        self.text_hidden_size = text_hidden_size
        self.projector_ln_eps = projector_ln_eps
        super().__init__(**kwargs)


class VisionTowerConfig(PretrainedConfig):
    model_type = "moonvit3d_offline"

    def __init__(self, vision_config: Any = None, **kwargs: Any) -> None:
        vc = vision_config if vision_config is not None else KimiK25VisionConfig()
        self.hidden_size = vc.vt_hidden_size
        self.num_hidden_layers = vc.vt_num_hidden_layers
        self.num_attention_heads = vc.vt_num_attention_heads
        self.intermediate_size = vc.vt_intermediate_size
        self.patch_size = vc.patch_size
        self.init_pos_emb_height = vc.init_pos_emb_height
        self.init_pos_emb_width = vc.init_pos_emb_width
        self.init_pos_emb_time = vc.init_pos_emb_time
        self.merge_kernel_size = tuple(vc.merge_kernel_size)
        self.merge_type = "sd2_tpool"
        super().__init__(**kwargs)


class ProjectorConfig(PretrainedConfig):
    model_type = "kimi_k25_projector_offline"

    def __init__(self, vision_config: Any = None, **kwargs: Any) -> None:
        vc = vision_config if vision_config is not None else KimiK25VisionConfig()
        self.mm_hidden_size = vc.vt_hidden_size
        self.hidden_size = vc.text_hidden_size
        self.merge_kernel_size = tuple(vc.merge_kernel_size)
        self.projector_ln_eps = vc.projector_ln_eps
        super().__init__(**kwargs)


class Learnable2DInterpPosEmbDividedFixed(nn.Module):
    """Learned (H, W, C) table, resized to each image's grid, plus a fixed temporal sin-cos term."""

    def __init__(self, height: int, width: int, num_frames: int, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(height, width, dim))
        steps = torch.arange(num_frames, dtype=torch.float32)[:, None]
        freqs = torch.exp(-math.log(10000.0) * torch.arange(0, dim, 2, dtype=torch.float32) / dim)
        table = torch.cat([torch.sin(steps * freqs), torch.cos(steps * freqs)], dim=-1)
        self.register_buffer("time_weight", table.unsqueeze(1), persistent=False)

    def forward(self, x: torch.Tensor, grid_thws: torch.Tensor) -> torch.Tensor:
        parts = []
        for t, h, w in grid_thws.tolist():
            table = self.weight
            if (h, w) != tuple(table.shape[:2]):
                table = F.interpolate(table.permute(2, 0, 1)[None], size=(h, w), mode="bilinear")[0].permute(1, 2, 0)
            emb = table.reshape(1, h * w, -1) + self.time_weight[:t]
            parts.append(emb.reshape(t * h * w, -1))
        return x + torch.cat(parts)


class MoonVision3dPatchEmbed(nn.Module):
    def __init__(self, config: VisionTowerConfig) -> None:
        super().__init__()
        size = config.patch_size
        self.proj = nn.Conv2d(3, config.hidden_size, kernel_size=size, stride=size)
        self.pos_emb = Learnable2DInterpPosEmbDividedFixed(
            config.init_pos_emb_height, config.init_pos_emb_width, config.init_pos_emb_time, config.hidden_size
        )

    def forward(self, pixel_values: torch.Tensor, grid_thws: torch.Tensor) -> torch.Tensor:
        """``pixel_values``: (patches, 3, patch, patch) -> (patches, hidden)."""
        return self.pos_emb(self.proj(pixel_values).flatten(1), grid_thws)


class MLP2(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc0 = nn.Linear(dim, hidden)
        self.fc1 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc1(F.gelu(self.fc0(x), approximate="tanh"))


class MoonViTEncoderLayer(nn.Module):
    def __init__(self, config: VisionTowerConfig) -> None:
        super().__init__()
        dim = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.norm0 = nn.LayerNorm(dim)
        self.norm1 = nn.LayerNorm(dim)
        self.wqkv = nn.Linear(dim, 3 * dim)
        self.wo = nn.Linear(dim, dim)
        self.mlp = MLP2(dim, config.intermediate_size)

    def _attention(self, x: torch.Tensor, lengths: list[int]) -> torch.Tensor:
        outs = []
        for chunk in torch.split(self.wqkv(x), lengths):
            q, k, v = chunk.view(chunk.shape[0], 3, self.num_heads, -1).permute(1, 2, 0, 3)
            outs.append(F.scaled_dot_product_attention(q, k, v).transpose(0, 1).reshape(chunk.shape[0], -1))
        return self.wo(torch.cat(outs))

    def forward(self, x: torch.Tensor, lengths: list[int]) -> torch.Tensor:
        x = x + self._attention(self.norm0(x), lengths)
        return x + self.mlp(self.norm1(x))


class MoonViT3dEncoder(nn.Module):
    def __init__(self, config: VisionTowerConfig) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(MoonViTEncoderLayer(config) for _ in range(config.num_hidden_layers))
        self.final_layernorm = nn.LayerNorm(config.hidden_size)

    def forward(self, x: torch.Tensor, grid_thws: torch.Tensor) -> torch.Tensor:
        lengths = [t * h * w for t, h, w in grid_thws.tolist()]
        for block in self.blocks:
            x = block(x, lengths)
        return self.final_layernorm(x)


class MoonViT3dPretrainedModel(PreTrainedModel):
    """Vision tower: patch embedding, encoder, then 2x2 spatial merge with temporal mean-pooling."""

    config_class = VisionTowerConfig
    base_model_prefix = "vision_tower"

    def __init__(self, config: VisionTowerConfig) -> None:
        super().__init__(config)
        self.merge_kernel_size = tuple(config.merge_kernel_size)
        self.patch_embed = MoonVision3dPatchEmbed(config)
        self.encoder = MoonViT3dEncoder(config)

    def forward(self, pixel_values: torch.Tensor, grid_thws: torch.Tensor) -> list[torch.Tensor]:
        x = self.encoder(self.patch_embed(pixel_values, grid_thws), grid_thws)
        kh, kw = self.merge_kernel_size
        out, start = [], 0
        for t, h, w in grid_thws.tolist():
            seq = x[start : start + t * h * w].view(t, h // kh, kh, w // kw, kw, -1)
            merged = seq.permute(0, 1, 3, 2, 4, 5).mean(dim=0)
            out.append(merged.reshape((h // kh) * (w // kw), kh * kw, -1))
            start += t * h * w
        return out


class PatchMergerMLP(nn.Module):
    """Projector: per-patch LayerNorm, concatenate each merge window, two-layer GELU MLP."""

    def __init__(self, config: ProjectorConfig) -> None:
        super().__init__()
        merged = config.mm_hidden_size * config.merge_kernel_size[0] * config.merge_kernel_size[1]
        self.pre_norm = nn.LayerNorm(config.mm_hidden_size, eps=config.projector_ln_eps)
        self.proj = nn.Sequential(nn.Linear(merged, merged), nn.GELU(), nn.Linear(merged, config.hidden_size))

    def forward(self, x: list[torch.Tensor]) -> list[torch.Tensor]:
        return [self.proj(self.pre_norm(item).flatten(1)) for item in x]


REMOTE_CLASSES: dict[str, Any] = {
    "modeling_kimi_k25.MoonViT3dPretrainedModel": MoonViT3dPretrainedModel,
    "modeling_kimi_k25.MoonViT3dEncoder": MoonViT3dEncoder,
    "modeling_kimi_k25.PatchMergerMLP": PatchMergerMLP,
    "modeling_kimi_k25.ProjectorConfig": ProjectorConfig,
    "modeling_kimi_k25.VisionTowerConfig": VisionTowerConfig,
}
