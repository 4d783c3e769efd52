"""Kimi K2.5-VL (vision tower from the checkpoint's remote code)."""

from bridge_freeze_plugin.families._registry import FamilySpec, OfflineConfig

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
    ),
]
