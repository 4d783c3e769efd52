"""Kimi K2.5-VL: real ``KimiK25VLModelProvider`` / ``KimiK25VLModel`` with an offline vision tower.

``KimiK25VLModel.__init__`` builds its vision side from HuggingFace *remote code*: it calls
``transformers.dynamic_module_utils.get_class_from_dynamic_module("modeling_kimi_k25.<Class>",
config.hf_model_path, trust_remote_code=True)`` for ``MoonViT3dPretrainedModel``, ``PatchMergerMLP``,
``ProjectorConfig``, ``VisionTowerConfig`` and ``MoonViT3dEncoder``, and reloads the vision config with
``safe_load_config_with_retry(config.hf_model_path, trust_remote_code=True)`` (``AutoConfig``). Both
need ``modeling_kimi_k25.py`` / ``config.json`` from the model repository on the hub, which is not
reachable here and whose code is not part of transformers. It also refuses ``hf_model_path=None``
even when no vision tower is built.

So the real provider and the real model class are used, and :func:`build_patches` answers those two
calls, for this module's offline ``hf_model_path`` only, with the local classes below. They are
structural re-implementations of the remote MoonViT3d tower and patch-merger projector: the same
module and parameter names as the checkpoint keys Bridge maps one to one (``vision_tower.**``,
``mm_projector.**``), i.e. ``patch_embed.{proj,pos_emb}``, ``encoder.blocks.N.{norm0,norm1,wqkv,wo,
mlp.fc0,mlp.fc1}``, ``encoder.final_layernorm``, ``mm_projector.{pre_norm,proj.0,proj.2}``, with a
simple forward. The language model is Bridge's real MLA + MoE GPT model on megatron-core's local
layers (first layer dense, second MoE, as Kimi K2's ``first_k_dense_replace=1``).
"""

from __future__ import annotations

import contextlib
import itertools
import math
import types
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel

from bridge_freeze_harness.tiny._common import TINY_LM, finalized

REAL = True
#: What is not real in this family's tiny model (REAL is about the provider and model class).
VISION_STAND_IN_REASON = (
    "vision_tower / mm_projector classes come from HF remote code (modeling_kimi_k25.py on the hub, "
    "loaded by get_class_from_dynamic_module); offline, local structural re-implementations are used"
)

#: ``hf_model_path`` values this module answers offline -> the vision config to hand back.
OFFLINE_PATH_PREFIX = "offline-tiny/kimi_k25_vl/"
_OFFLINE_VISION_CONFIGS: dict[str, Any] = {}
_counter = itertools.count()

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
TINY_MLA = {"q_lora_rank": 32, "kv_lora_rank": 16, "qk_head_dim": 16, "qk_pos_emb_head_dim": 8, "v_head_dim": 16}
TINY_MOE = {
    "num_moe_experts": 4,
    "moe_router_topk": 2,
    "moe_ffn_hidden_size": 32,
    "moe_shared_expert_intermediate_size": 32,
    "moe_layer_freq": [0, 1],
}
#: Special tokens inside the tiny vocabulary (the real ids are ~163k).
MEDIA_PLACEHOLDER_TOKEN_ID = TINY_LM["vocab_size"] - 1
PAD_TOKEN_ID = 0


# --- offline stand-ins for the remote modeling_kimi_k25 classes --------------------------------------


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


# --- patches and provider -----------------------------------------------------------------------------


def _is_offline(path: Any) -> bool:
    return isinstance(path, str) and path.startswith(OFFLINE_PATH_PREFIX)


@contextlib.contextmanager
def build_patches() -> Iterator[None]:
    """Answer the two hub look-ups of ``KimiK25VLModel.__init__`` for offline tiny paths only."""
    from megatron.bridge.models.hf_pretrained import safe_config_loader
    from megatron.bridge.models.kimi_vl import modeling_kimi_k25_vl

    original_get_class = modeling_kimi_k25_vl.get_class_from_dynamic_module
    original_load_config = safe_config_loader.safe_load_config_with_retry

    def get_class(class_reference: str, pretrained_model_name_or_path: Any, *args: Any, **kwargs: Any) -> Any:
        if _is_offline(pretrained_model_name_or_path):
            return REMOTE_CLASSES[class_reference]
        return original_get_class(class_reference, pretrained_model_name_or_path, *args, **kwargs)

    def load_config(path: Any, *args: Any, **kwargs: Any) -> Any:
        if _is_offline(path):
            return types.SimpleNamespace(vision_config=_OFFLINE_VISION_CONFIGS[path])
        return original_load_config(path, *args, **kwargs)

    modeling_kimi_k25_vl.get_class_from_dynamic_module = get_class
    safe_config_loader.safe_load_config_with_retry = load_config
    try:
        yield
    finally:
        modeling_kimi_k25_vl.get_class_from_dynamic_module = original_get_class
        safe_config_loader.safe_load_config_with_retry = original_load_config


def _mla_local_core_attention() -> type:
    """megatron-core's local ``DotProductAttention``, accepting the head sizes MLA passes.

    ``MLASelfAttention`` hands its core attention ``k_channels`` / ``v_channels``, which only the TE
    class accepts; the local class reads head sizes from ``kv_channels`` instead, so the tiny
    configuration keeps ``kv_channels == v_head_dim``.
    """
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    class MLALocalDotProductAttention(DotProductAttention):
        def __init__(self, *args: Any, k_channels: int | None = None, v_channels: int | None = None, **kwargs: Any):
            del k_channels, v_channels
            super().__init__(*args, **kwargs)

    return MLALocalDotProductAttention


def local_block_spec(config: Any) -> Any:
    """Bridge's Kimi choice (``get_gpt_decoder_block_spec``) on megatron-core's local layers."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec

    spec = get_gpt_decoder_block_spec(config, use_transformer_engine=False)
    core_attention = _mla_local_core_attention()
    for layer_spec in spec.layer_specs:
        layer_spec.submodules.self_attention.submodules.core_attention = core_attention
    return spec


def vision_config() -> KimiK25VisionConfig:
    return KimiK25VisionConfig(text_hidden_size=TINY_LM["hidden_size"])


def make_provider(**overrides: Any) -> Any:
    from megatron.bridge.models.kimi_vl.kimi_k25_vl_provider import KimiK25VLModelProvider

    vc = overrides.pop("vision_config", None) or vision_config()
    path = overrides.pop("hf_model_path", None) or f"{OFFLINE_PATH_PREFIX}{next(_counter)}"
    if _is_offline(path):
        _OFFLINE_VISION_CONFIGS[path] = vc
    provider = KimiK25VLModelProvider(
        **TINY_LM,
        **TINY_MLA,
        **TINY_MOE,
        transformer_layer_spec=local_block_spec,
        normalization="RMSNorm",
        gated_linear_unit=True,
        add_bias_linear=False,
        share_embeddings_and_output_weights=False,
        qk_layernorm=True,
        multi_latent_attention=True,
        position_embedding_type="rope",
        rope_type="rope",
        moe_grouped_gemm=False,
        moe_permute_fusion=False,
        moe_token_dispatcher_type="allgather",
        moe_router_pre_softmax=True,
        moe_router_score_function="sigmoid",
        moe_router_enable_expert_bias=True,
        moe_router_load_balancing_type="seq_aux_loss",
        moe_aux_loss_coeff=1e-3,
        vision_config=vc,
        hf_model_path=path,
        trust_remote_code=True,
        image_token_id=MEDIA_PLACEHOLDER_TOKEN_ID,
        media_placeholder_token_id=MEDIA_PLACEHOLDER_TOKEN_ID,
        pad_token_id=PAD_TOKEN_ID,
    )
    return finalized(provider, **overrides)
