"""MiniMax-M3-VL.

``vision_tower`` (Bridge's local CLIP-style tower, under ``vision_tower.vision_model``) is the vision
encoder; the projection is two MLPs at the model's top level: ``multi_modal_projector`` (per patch)
then ``patch_merge_mlp`` (per merged 2x2 group). Bridge's own freeze() covers all of them.
``lightning_indexers`` hold the text model's checkpoint-only Lightning Indexer tensors: Bridge builds
them with ``requires_grad=False`` and never runs them, so they are ``other`` (no flag makes them
trainable)."""

from bridge_freeze_plugin.families._spec import FamilySpec

FAMILIES = [
    FamilySpec(
        name="minimax_m3_vl",
        plain_linear=("vision_tower", "multi_modal_projector", "patch_merge_mlp"),  # HF torch.nn.Linear layers
        description="MiniMax-M3-VL (projection: `multi_modal_projector` + `patch_merge_mlp`)",
        providers=("megatron.bridge.models.minimax_m3.minimax_m3_bridge:MiniMaxM3VLModelProvider",),
        language_model=("language_model",),
        vision_model=("vision_tower",),
        vision_projection=("multi_modal_projector", "patch_merge_mlp"),
        other=("lightning_indexers",),
        hf_model_types=("minimax_m3_vl",),
        # what Bridge's LoRA matches a leaf-name target against (read off the built model)
        linear_leaves={
            "language_model": ("linear_fc1", "linear_fc2", "linear_proj", "linear_qkv", "output_layer"),
            "vision_model": ("fc1", "fc2", "k_proj", "out_proj", "q_proj", "v_proj"),
            "vision_projection": ("linear_1", "linear_2"),
        },
    ),
]
