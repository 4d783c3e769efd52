"""Step-3.7.

``vision_model`` (Perception-Encoder trunk and its two ``vit_downsampler`` convolutions) is the vision
encoder. ``image_insert_embedding`` registers one submodule, the projection ``align_projector`` (the
language model's word embedding it also uses is held outside its registered submodules, so it stays
``language_model.embedding``); anything else that appears there one day falls under no prefix and
makes a freeze fail loudly. Bridge's own freeze() covers all of them."""

from bridge_freeze_plugin.families._spec import FamilySpec

FAMILIES = [
    FamilySpec(
        name="step37",
        plain_linear=("vision_model", "image_insert_embedding.align_projector"),  # HF torch.nn.Linear layers
        description="Step-3.7 (projection `image_insert_embedding.align_projector`, Step-3.5 text decoder)",
        providers=("megatron.bridge.models.stepfun.step37_provider:Step37ModelProvider",),
        language_model=("language_model",),
        vision_model=("vision_model",),
        vision_projection=("image_insert_embedding.align_projector",),
        hf_model_types=("step3p7",),
        # what Bridge's LoRA matches a leaf-name target against (read off the built model)
        linear_leaves={
            "language_model": ("linear_fc1", "linear_fc2", "linear_proj", "linear_qkv", "output_layer"),
            "vision_model": ("c_fc", "c_proj", "out_proj"),
            "vision_projection": ("align_projector",),
        },
    ),
]
