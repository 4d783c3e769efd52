"""Ernie-4.5-VL. Bridge's own freeze() leaves ``vision_tower.ln`` to no flag; here the whole
tower is the vision model."""

from bridge_freeze_plugin.registry import FamilySpec

FAMILIES = [
    FamilySpec(
        name="ernie45_vl",
        description="Ernie-4.5-VL (`vision_tower` HF path or `vision_model` with use_mg_vit, `resampler_model`)",
        providers=("megatron.bridge.models.ernie_vl.ernie45_vl_provider:Ernie45VLModelProvider",),
        language_model=("language_model",),
        vision_model=("vision_tower", "vision_model"),
        vision_projection=("resampler_model",),
        hf_model_types=("ernie4_5_vl_moe", "ernie4_5_moe_vl"),
    ),
]
