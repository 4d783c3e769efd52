"""Nemotron-VL (Nano V2 VL): a LLaVA model under ``llava_model``."""

from bridge_freeze_plugin.registry import FamilySpec

FAMILIES = [
    FamilySpec(
        name="nemotron_vl",
        description="Nemotron Nano V2 VL (LLaVA: `llava_model.{language_model,vision_model,vision_projection}`)",
        providers=("megatron.bridge.models.nemotron_vl.nemotron_vl_provider:NemotronVLModelProvider",),
        language_model=("llava_model.language_model",),
        vision_model=("llava_model.vision_model",),
        vision_projection=("llava_model.vision_projection",),
        hf_model_types=("nemotron_vl",),
    ),
]
