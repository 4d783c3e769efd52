"""EXAONE 4.5 (VL).

The projection ``vision_model.merger`` lives inside the vision module. The multi-token prediction
block ``language_model.mtp`` is ``other``: Bridge gives it its own flag, ``freeze_mtp_model``, and its
freeze() makes MTP trainable exactly when that flag is off, whatever ``freeze_language_model`` says
(it re-enables MTP after freezing the language model). As ``other``, no flag of ours touches it, so
Bridge's ``freeze_mtp_model`` (which the plugin leaves on the provider) keeps deciding, as in Bridge."""

from bridge_freeze_plugin.families._spec import FamilySpec

FAMILIES = [
    FamilySpec(
        name="exaone45_vl",
        description="EXAONE 4.5 VL (projection `vision_model.merger`; MTP follows Bridge's freeze_mtp_model)",
        providers=("megatron.bridge.models.exaone.exaone45.exaone45_provider:Exaone45ModelProvider",),
        language_model=("language_model",),
        vision_model=("vision_model",),
        vision_projection=("vision_model.merger",),
        other=("language_model.mtp",),
        hf_model_types=("exaone4_5",),
        # what Bridge's LoRA matches a leaf-name target against (read off the built model)
        linear_leaves={
            "language_model": ("linear_fc1", "linear_fc2", "linear_proj", "linear_qkv", "output_layer"),
            "vision_model": ("linear_fc1", "linear_fc2", "linear_proj", "linear_qkv"),
            "vision_projection": ("linear_fc1", "linear_fc2"),
            "other": ("eh_proj", "linear_fc1", "linear_fc2", "linear_proj", "linear_qkv"),
        },
    ),
]
