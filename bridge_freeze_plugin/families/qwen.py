"""Qwen-VL families. In all of them the projection lives INSIDE the vision module."""

from bridge_freeze_plugin.families._spec import FamilySpec

_PKG = "megatron.bridge.models.qwen_vl"

# Qwen3-VL: the Megatron vision tower ``vision_model`` holds the main projection ``merger`` and
# the DeepStack mergers ``decoder.deepstack_merger_list``; the rest of it is the encoder.
_QWEN3_LAYOUT = {
    "language_model": ("language_model",),
    "vision_model": ("vision_model",),
    "vision_projection": ("vision_model.merger", "vision_model.decoder.deepstack_merger_list"),
}
# Under full activation recompute the vision config copies the LM's recompute settings, and the DeepStack
# mergers (run inside the checkpointed function, outputs returned in a Python list) get no gradient, the
# encoder layers before them a wrong one (measured: tests/unit/prewrap/test_recompute_fix.py). Qwen3.5-VL shares the
# layout but its vision config has no DeepStack indexes: its recompute gradients are right (same test).
_QWEN3_RECOMPUTE = {
    "recompute_note": (
        "the vision config copies the language model's recompute settings, and the DeepStack mergers run "
        "inside the checkpointed function and hand their outputs back in a Python list, which the checkpoint "
        "does not back-propagate (no gradient for the DeepStack mergers, a wrong one for the encoder layers "
        "before them)"
    ),
    "no_full_recompute": ("vision_model",),
    "full_recompute_affects": ("vision_model", "vision_projection"),
}
_QWEN3_PARTS = {**_QWEN3_LAYOUT, **_QWEN3_RECOMPUTE}

FAMILIES = [
    FamilySpec(
        name="qwen25_vl",
        plain_linear=("visual",),  # HF torch.nn.Linear layers
        description="Qwen2.5-VL (HF vision tower `visual`, projection `visual.merger`)",
        providers=(f"{_PKG}.qwen25_vl_provider:Qwen25VLModelProvider",),
        language_model=("language_model",),
        vision_model=("visual",),
        vision_projection=("visual.merger",),
        hf_model_types=("qwen2_5_vl",),
        # what Bridge's LoRA matches a leaf-name target against (read off the built model)
        linear_leaves={
            "language_model": ("linear_fc1", "linear_fc2", "linear_proj", "linear_qkv", "output_layer"),
            "vision_model": ("down_proj", "gate_proj", "proj", "qkv", "up_proj"),
            "vision_projection": ("0", "2"),
        },
    ),
    FamilySpec(
        name="qwen3_vl",
        description="Qwen3-VL dense (projection: merger + DeepStack mergers inside `vision_model`)",
        providers=(f"{_PKG}.qwen3_vl_provider:Qwen3VLModelProvider",),
        hf_model_types=("qwen3_vl",),
        # what Bridge's LoRA matches a leaf-name target against (read off the built model)
        linear_leaves={
            "language_model": ("linear_fc1", "linear_fc2", "linear_proj", "linear_qkv", "output_layer"),
            "vision_model": ("linear_fc1", "linear_fc2", "linear_proj", "linear_qkv"),
            "vision_projection": ("linear_fc1", "linear_fc2"),
        },
        **_QWEN3_PARTS,
    ),
    FamilySpec(
        name="qwen3_vl_moe",
        description="Qwen3-VL MoE; Bridge's provider freezes LM and vision encoder by default",
        providers=(f"{_PKG}.qwen3_vl_provider:Qwen3VLMoEModelProvider",),
        hf_model_types=("qwen3_vl_moe",),
        # Bridge 0.6.2's provider defaults these to true (read from its source)
        provider_flag_defaults=("freeze_language_model", "freeze_vision_model"),
        # what Bridge's LoRA matches a leaf-name target against (read off the built model)
        linear_leaves={
            "language_model": ("linear_fc1", "linear_fc2", "linear_proj", "linear_qkv", "output_layer"),
            "vision_model": ("linear_fc1", "linear_fc2", "linear_proj", "linear_qkv"),
            "vision_projection": ("linear_fc1", "linear_fc2"),
        },
        **_QWEN3_PARTS,
    ),
    FamilySpec(
        name="qwen35_vl",
        description="Qwen3.5-VL dense and MoE (same layout as Qwen3-VL; DeepStack list may be empty)",
        providers=(
            f"{_PKG}.qwen35_vl_provider:Qwen35VLModelProvider",
            f"{_PKG}.qwen35_vl_provider:Qwen35VLMoEModelProvider",
        ),
        hf_model_types=("qwen3_5", "qwen3_5_moe"),
        # what Bridge's LoRA matches a leaf-name target against (read off the built model)
        linear_leaves={
            "language_model": ("in_proj", "linear_fc1", "linear_fc2", "linear_proj", "linear_qkv", "out_proj",
                               "output_layer"),
            "vision_model": ("linear_fc1", "linear_fc2", "linear_proj", "linear_qkv"),
            "vision_projection": ("linear_fc1", "linear_fc2"),
        },
        **_QWEN3_LAYOUT,
    ),
]
