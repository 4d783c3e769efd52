"""Ministral 3 (Mistral's VLM: Pixtral-style `vision_tower`, `multi_modal_projector`)."""

from bridge_freeze_plugin.families._registry import FamilySpec

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
    ),
]
