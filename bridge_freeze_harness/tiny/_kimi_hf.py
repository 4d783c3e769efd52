"""Kimi K2.5-VL's Hugging Face side, offline: the checkpoint's config and model classes, and its INT4 expert storage.

The published checkpoint (``moonshotai/Kimi-K2.5``) is remote code: ``config.json`` has ``model_type`` ``kimi_k25``
and an ``auto_map`` into ``configuration_kimi_k25.py`` / ``modeling_kimi_k25.py`` on the hub, which transformers
5.12.1 does not have and which cannot be fetched here. Its layout is simple, though, and is what Bridge's
``KimiK25VLBridge`` maps: ``vision_tower.**`` and ``mm_projector.**`` (MoonViT3d and the patch merger: the harness's
structural stand-ins, :mod:`._kimi_remote_code`) and ``language_model.**``, a DeepSeek-V3 causal LM (transformers has
that one). Its routed experts are stored INT4 (compressed-tensors' pack-quantized, symmetric, groups of 32: each
``...experts.<e>.<proj>.weight`` is ``weight_packed`` int32 with eight 4-bit codes offset by 8, ``weight_scale`` per
group in bfloat16 and ``weight_shape``), and Bridge's export writes them back so.

:func:`registered_config` registers :class:`KimiK25Config` with transformers' ``AutoConfig`` for a block (the
family's ``load_patches``: :func:`bridge_freeze_harness.hf_checkpoint.bridge_load_context`) so that
``AutoBridge.from_hf_pretrained`` reads the tiny ``config.json`` without remote code. It is done here, in the harness,
not in the plugin: the class is a stand-in for the hub's code, and a user's process must keep reading the real one.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, DeepseekV3Config, DeepseekV3ForCausalLM, PretrainedConfig, PreTrainedModel

from bridge_freeze_harness.tiny._kimi_remote_code import (
    KimiK25VisionConfig,
    MoonViT3dPretrainedModel,
    PatchMergerMLP,
    ProjectorConfig,
    VisionTowerConfig,
)

#: Elements per INT4 scale (compressed-tensors' ``group_size`` in the published ``quantization_config``).
INT4_GROUP = 32
#: The routed experts' weights, stored INT4 in the published checkpoint (shared experts and dense MLPs are not).
ROUTED_EXPERT = re.compile(r"^language_model\.model\.layers\.\d+\.mlp\.experts\.\d+\.(gate|up|down)_proj\.weight$")


class KimiK25Config(PretrainedConfig):
    """What the hub's ``KimiK25Config`` carries: a DeepSeek-V3 text config, the vision config, the media token."""

    model_type = "kimi_k25"
    sub_configs = {"text_config": DeepseekV3Config, "vision_config": KimiK25VisionConfig}

    def __init__(self, text_config: Any = None, vision_config: Any = None, media_placeholder_token_id: int = 0,
                 ignore_index: int = -100, **kwargs: Any) -> None:
        if not isinstance(text_config, PretrainedConfig):
            text_config = DeepseekV3Config(**{k: v for k, v in (text_config or {}).items() if k != "model_type"})
        if not isinstance(vision_config, PretrainedConfig):
            vision_config = KimiK25VisionConfig(**{k: v for k, v in (vision_config or {}).items()
                                                   if k != "model_type"})
        self.text_config = text_config
        self.vision_config = vision_config
        self.media_placeholder_token_id = media_placeholder_token_id
        self.ignore_index = ignore_index
        super().__init__(**kwargs)


class KimiK25ForConditionalGeneration(PreTrainedModel):
    """The checkpoint's layout: ``vision_tower``, ``mm_projector`` and a DeepSeek-V3 ``language_model``."""

    config_class = KimiK25Config
    base_model_prefix = ""

    def __init__(self, config: KimiK25Config) -> None:
        super().__init__(config)
        self.vision_tower = MoonViT3dPretrainedModel(VisionTowerConfig(config.vision_config))
        self.mm_projector = PatchMergerMLP(ProjectorConfig(config.vision_config))
        self.language_model = DeepseekV3ForCausalLM(config.text_config)
        self.post_init()


@contextlib.contextmanager
def registered_config() -> Iterator[None]:
    """``AutoConfig`` reads ``kimi_k25`` with :class:`KimiK25Config` inside the block; on exit the mapping is as it
    was (a later ``bridge-freeze plan`` of a published config in the same process must not see the stand-in)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    extra = CONFIG_MAPPING._extra_content  # where AutoConfig.register puts it; no public way to take it back
    before = extra.get(KimiK25Config.model_type)
    AutoConfig.register(KimiK25Config.model_type, KimiK25Config, exist_ok=True)
    try:
        yield
    finally:
        if before is None:
            extra.pop(KimiK25Config.model_type, None)
        else:
            extra[KimiK25Config.model_type] = before


def pack_int4(weight: torch.Tensor) -> dict[str, torch.Tensor]:
    """``weight`` (out, in) as the published checkpoint stores a routed expert: codes ``round(w / scale)`` in
    [-7, 7] with ``scale = max|w| / 7`` per group of :data:`INT4_GROUP`, offset by 8, eight per int32, lowest nibble
    first; the bfloat16 scale kept to :data:`SCALE_BITS` significant bits (:func:`_short_scale`)."""
    out_features, in_features = weight.shape
    groups = weight.float().reshape(out_features, in_features // INT4_GROUP, INT4_GROUP)
    scale = _short_scale(groups.abs().amax(dim=-1) / 7.0)
    codes = (groups / scale.float().unsqueeze(-1)).round().clamp(-7, 7).to(torch.int32) + 8
    nibbles = codes.reshape(out_features, in_features // 8, 8)
    packed = torch.zeros(out_features, in_features // 8, dtype=torch.int32)
    for i in range(8):
        packed |= nibbles[..., i] << (4 * i)
    return {"weight_packed": packed, "weight_scale": scale,
            "weight_shape": torch.tensor([out_features, in_features], dtype=torch.int32)}


#: Significant bits of a stored scale: with 5, every ``code * scale`` (codes up to 7: 3 bits) is exact in bfloat16.
SCALE_BITS = 5


def _short_scale(scale: torch.Tensor) -> torch.Tensor:
    """``scale`` rounded to :data:`SCALE_BITS` significant bits, in bfloat16. Bridge loads an INT4 expert as
    bfloat16 ``code * scale`` and exports it with ``scale = max|w| / 7``: that gives the stored scale back only when
    ``7 * scale`` is a bfloat16 (measured: arbitrary bfloat16 scales come back one unit in the last place off, see
    ``test_hf_roundtrip.py``), so the tiny checkpoint's scales are ones whose round trip is exact."""
    mantissa, exponent = torch.frexp(scale)
    return torch.ldexp(torch.round(mantissa * 2**SCALE_BITS) / 2**SCALE_BITS, exponent).to(torch.bfloat16)


def store_experts_int4(directory: Path) -> None:
    """Rewrite ``directory``'s safetensors with each routed expert weight stored INT4 (:func:`pack_int4`)."""
    from safetensors.torch import load_file, save_file

    for file in sorted(Path(directory).glob("*.safetensors")):
        stored: dict[str, torch.Tensor] = {}
        for name, tensor in load_file(str(file)).items():
            if ROUTED_EXPERT.match(name):
                base = name.removesuffix(".weight")
                stored.update({f"{base}.{key}": value for key, value in pack_int4(tensor).items()})
            else:
                stored[name] = tensor
        save_file(stored, str(file), metadata={"format": "pt"})
