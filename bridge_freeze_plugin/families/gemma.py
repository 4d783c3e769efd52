"""Gemma-VL 3 and 4."""

from bridge_freeze_plugin.families._spec import FamilySpec

_PKG = "megatron.bridge.models.gemma_vl"

FAMILIES = [
    FamilySpec(
        name="gemma3_vl",
        plain_linear=("vision_tower",),  # HF torch.nn.Linear layers
        description="Gemma3-VL (SigLIP `vision_tower`, projection `multi_modal_projector`)",
        providers=(f"{_PKG}.gemma3_vl_provider:Gemma3VLModelProvider",),
        language_model=("language_model",),
        vision_model=("vision_tower",),
        vision_projection=("multi_modal_projector",),
        hf_model_types=("gemma3",),
        # what Bridge's LoRA matches a leaf-name target against (read off the built model)
        linear_leaves={
            "language_model": ("linear_fc1", "linear_fc2", "linear_proj", "linear_qkv", "output_layer"),
            "vision_model": ("fc1", "fc2", "k_proj", "out_proj", "q_proj", "v_proj"),
            "vision_projection": ("proj",),
        },
    ),
    FamilySpec(
        name="gemma4_vl",
        plain_linear=("vision_tower", "embed_vision", "audio_tower", "embed_audio"),  # HF torch.nn.Linear layers
        description=(
            "Gemma4-VL (`vision_tower`, projection `embed_vision`; audio encoder `audio_tower`, its projection "
            "`embed_audio`)"
        ),
        providers=(
            f"{_PKG}.gemma4_vl_provider:Gemma4VLModelProvider",
            f"{_PKG}.gemma4_vl_provider:Gemma4DenseVLProvider",
        ),
        language_model=("language_model",),
        vision_model=("vision_tower",),
        vision_projection=("embed_vision",),
        parts={"audio_model": ("audio_tower",), "audio_projection": ("embed_audio",)},
        hf_model_types=("gemma4",),
        # what Bridge's LoRA matches a leaf-name target against (read off the built model)
        linear_leaves={
            "language_model": ("linear_fc1", "linear_fc2", "linear_proj", "linear_qkv", "output_layer"),
            "vision_model": ("input_proj", "linear"),
            "vision_projection": ("embedding_projection",),
            "audio_model": ("input_proj_linear", "linear", "output_proj", "relative_k_proj"),
            "audio_projection": ("embedding_projection",),
        },
    ),
]
