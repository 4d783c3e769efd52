"""Ernie-4.5-VL. Bridge's own freeze() leaves ``vision_tower.ln`` to no flag; here the whole
tower is the vision model."""

from bridge_freeze_plugin.families._spec import FamilySpec

FAMILIES = [
    FamilySpec(
        name="ernie45_vl",
        plain_linear=("vision_tower", "resampler_model"),  # HF torch.nn.Linear layers
        description="Ernie-4.5-VL (`vision_tower` HF path or `vision_model` with use_mg_vit, `resampler_model`)",
        providers=("megatron.bridge.models.ernie_vl.ernie45_vl_provider:Ernie45VLModelProvider",),
        language_model=("language_model",),
        vision_model=("vision_tower", "vision_model"),
        vision_projection=("resampler_model",),
        hf_model_types=("ernie4_5_vl_moe", "ernie4_5_moe_vl"),
        # what Bridge's LoRA matches a leaf-name target against (read off the built model)
        linear_leaves={
            "language_model": ("linear_fc1", "linear_fc2", "linear_proj", "linear_qkv", "output_layer"),
            "vision_model": ("fc1", "fc2", "proj", "qkv"),
            "vision_projection": ("fc1", "fc2", "mlp"),
        },
        # Measured (tests/unit/prewrap/test_recompute_fix.py): under full recompute the vision experts of the language
        # model's MoE get no gradient and the vision tower a wrong one, whatever trains.
        recompute_note=(
            "the language model's MoE layers read which tokens are image tokens from a module-level variable that "
            "is cleared after the forward, so the recompute in the backward routes image tokens to the text "
            "experts (no gradient for the vision experts, a wrong one for the vision tower and projection)"
        ),
        no_full_recompute=("language_model",),
        full_recompute_affects=("language_model", "vision_model", "vision_projection"),
    ),
]
