"""GLM-4.5V. Bridge's own freeze() leaves visual.embeddings, visual.post_conv_layernorm,
visual.downsample and visual.post_layernorm to no flag; here the whole ``visual`` tower
except its merger is the vision model."""

from bridge_freeze_plugin.families._spec import FamilySpec

FAMILIES = [
    FamilySpec(
        name="glm45v",
        plain_linear=("visual",),  # HF torch.nn.Linear layers
        description="GLM-4.5V (HF Glm4v vision tower `visual`, projection `visual.merger`)",
        providers=("megatron.bridge.models.glm_vl.glm_45v_provider:GLM45VModelProvider",),
        language_model=("language_model",),
        vision_model=("visual",),
        vision_projection=("visual.merger",),
        hf_model_types=("glm4v_moe",),
        # what Bridge's LoRA matches a leaf-name target against (read off the built model)
        linear_leaves={
            "language_model": ("linear_fc1", "linear_fc2", "linear_proj", "linear_qkv", "output_layer"),
            "vision_model": ("down_proj", "gate_proj", "proj", "qkv", "up_proj"),
            "vision_projection": ("down_proj", "gate_proj", "proj", "up_proj"),
        },
    ),
]
