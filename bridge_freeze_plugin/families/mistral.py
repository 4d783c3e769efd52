"""Ministral 3 (Mistral's VLM: Pixtral-style `vision_tower`, `multi_modal_projector`)."""

from bridge_freeze_plugin.families._spec import FamilySpec

FAMILIES = [
    FamilySpec(
        name="ministral3",
        plain_linear=("vision_tower", "multi_modal_projector"),  # HF torch.nn.Linear layers
        description="Ministral3 (`vision_tower`, projection `multi_modal_projector`)",
        providers=("megatron.bridge.models.ministral3.ministral3_provider:Ministral3ModelProvider",),
        language_model=("language_model",),
        vision_model=("vision_tower",),
        vision_projection=("multi_modal_projector",),
        hf_model_types=("mistral3",),
        # what Bridge's LoRA matches a leaf-name target against (read off the built model)
        linear_leaves={
            "language_model": ("linear_fc1", "linear_fc2", "linear_proj", "linear_qkv", "output_layer"),
            "vision_model": ("down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"),
            "vision_projection": ("linear_1", "linear_2", "merging_layer"),
        },
    ),
]
