"""Kimi K2.5-VL (vision tower from the checkpoint's remote code)."""

from bridge_freeze_plugin.families._spec import FamilySpec, OfflineConfig

FAMILIES = [
    FamilySpec(
        name="kimi_k25_vl",
        plain_linear=("vision_tower", "mm_projector"),  # HF torch.nn.Linear layers
        description="Kimi K2.5-VL (`vision_tower`, projection `mm_projector`)",
        providers=("megatron.bridge.models.kimi_vl.kimi_k25_vl_provider:KimiK25VLModelProvider",),
        language_model=("language_model",),
        vision_model=("vision_tower",),
        vision_projection=("mm_projector",),
        hf_model_types=("kimi_k25",),
        # remote code: its text config is DeepSeek-V3's, its vision config the harness's stand-in reads
        offline_configs=(
            OfflineConfig("kimi_k25", reader="bridge_freeze_harness.tiny.kimi_k25_vl:read_offline_config"),
        ),
        # what Bridge's LoRA matches a leaf-name target against (read off the built model)
        linear_leaves={
            "language_model": ("linear_fc1", "linear_fc2", "linear_kv_down_proj", "linear_kv_up_proj", "linear_proj",
                               "linear_q_down_proj", "linear_q_up_proj", "output_layer"),
            "vision_model": ("fc0", "fc1", "wo", "wqkv"),
            "vision_projection": ("0", "2"),
        },
    ),
]
