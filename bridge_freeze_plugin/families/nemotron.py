"""Nemotron-VL (Nano V2 VL) and Nemotron Omni: a LLaVA model under ``llava_model``."""

from bridge_freeze_plugin.families._registry import FamilySpec

_LLAVA = {
    "language_model": ("llava_model.language_model",),
    "vision_model": ("llava_model.vision_model",),
    "vision_projection": ("llava_model.vision_projection",),
}

FAMILIES = [
    FamilySpec(
        name="nemotron_vl",
        description="Nemotron Nano V2 VL (LLaVA: `llava_model.{language_model,vision_model,vision_projection}`)",
        providers=("megatron.bridge.models.nemotron_vl.nemotron_vl_provider:NemotronVLModelProvider",),
        # the published checkpoints (remote code) say NemotronH_Nano_VL_V2; Bridge writes nemotron_vl into the
        # configs it generates
        hf_model_types=("NemotronH_Nano_VL_V2", "nemotron_vl"),
        **_LLAVA,
    ),
    FamilySpec(
        name="nemotron_omni",
        plain_linear=("llava_model.sound_model",),  # HF torch.nn.Linear layers
        description=(
            "Nemotron Omni (Nemotron-VL's LLaVA layout plus the sound encoder `llava_model.sound_model` and its "
            "projection `llava_model.sound_projection`; Bridge's freeze_sound_encoder / freeze_sound_projection "
            "are read as freeze_audio_model / freeze_audio_projection)"
        ),
        providers=("megatron.bridge.models.nemotron_omni.nemotron_omni_provider:NemotronOmniModelProvider",),
        hf_model_types=("NemotronH_Nano_Omni_Reasoning_V3",),
        parts={"audio_model": ("llava_model.sound_model",), "audio_projection": ("llava_model.sound_projection",)},
        aliases=("freeze_sound_encoder", "freeze_sound_projection"),
        **_LLAVA,
    ),
]
