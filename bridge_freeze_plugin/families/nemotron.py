"""Nemotron-VL (Nano V2 VL) and Nemotron Omni: a LLaVA model under ``llava_model``; on Bridge 0.7.0 Nemotron Omni's
provider builds its parts at the top level instead (a layout of its own)."""

from bridge_freeze_plugin.families._spec import FamilySpec, OfflineConfig, ProviderLayout

_LLAVA = {
    "language_model": ("llava_model.language_model",),
    "vision_model": ("llava_model.vision_model",),
    "vision_projection": ("llava_model.vision_projection",),
}
_OMNI_LLAVA = {**_LLAVA, "audio_model": ("llava_model.sound_model",),
               "audio_projection": ("llava_model.sound_projection",)}
_OMNI_PROVIDERS = "megatron.bridge.models.nemotron_omni.nemotron_omni_provider"

FAMILIES = [
    FamilySpec(
        name="nemotron_vl",
        description="Nemotron Nano V2 VL (LLaVA: `llava_model.{language_model,vision_model,vision_projection}`)",
        providers=("megatron.bridge.models.nemotron_vl.nemotron_vl_provider:NemotronVLModelProvider",),
        # the published checkpoints (remote code) say NemotronH_Nano_VL_V2; Bridge writes nemotron_vl into the
        # configs it generates
        hf_model_types=("NemotronH_Nano_VL_V2", "nemotron_vl"),
        # remote code: a wrapper whose llm_config is transformers' nemotron_h (Bridge's conversion reads no other)
        offline_configs=(OfflineConfig("NemotronH_Nano_VL_V2", sub_configs=("llm_config",)),),
        # what Bridge's LoRA matches a leaf-name target against (read off the built model)
        linear_leaves={
            "language_model": ("in_proj", "linear_fc1", "linear_fc2", "linear_proj", "linear_qkv", "out_proj",
                               "output_layer"),
            "vision_model": ("embedder", "linear_fc1", "linear_fc2", "linear_proj", "linear_qkv"),
            "vision_projection": ("linear_fc1", "linear_fc2"),
        },
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
        providers=(f"{_OMNI_PROVIDERS}:NemotronOmniModelProvider",),
        # Nano (Bridge 0.6.x and 0.7.0) and Super (0.7.0)
        hf_model_types=("NemotronH_Nano_Omni_Reasoning_V3", "NemotronH_Super_Omni_Reasoning_V3"),
        # the same wrapper with a sound_config; NemotronOmniBridge reads sound_config and vision_config by attribute
        offline_configs=(OfflineConfig("NemotronH_Nano_Omni_Reasoning_V3", sub_configs=("llm_config",),
                                       objects=("vision_config", "sound_config")),),
        # what Bridge's LoRA matches a leaf-name target against (read off the built model)
        linear_leaves={
            "language_model": ("in_proj", "linear_fc1", "linear_fc2", "linear_proj", "linear_qkv", "out_proj",
                               "output_layer"),
            "vision_model": ("embedder", "linear_fc1", "linear_fc2", "linear_proj", "linear_qkv"),
            "vision_projection": ("linear_fc1", "linear_fc2"),
            "audio_model": ("k_proj", "linear", "linear1", "linear2", "o_proj", "q_proj", "relative_k_proj", "v_proj"),
            "audio_projection": ("linear_fc1", "linear_fc2"),
        },
        parts={"audio_model": ("llava_model.sound_model",), "audio_projection": ("llava_model.sound_projection",)},
        aliases=("freeze_sound_encoder", "freeze_sound_projection"),
        layouts=(
            # Bridge 0.7.0: this class builds NemotronOmniModel, its parts at the top level; the class declares
            # nemotron_omni_contract there (0.6.x's class of the same name builds the LLaVA model and does not)
            ProviderLayout(
                provider=f"{_OMNI_PROVIDERS}:NemotronOmniModelProvider",
                when_field="nemotron_omni_contract",
                parts={"language_model": ("language_model",), "vision_model": ("vision_model",),
                       "vision_projection": ("vision_projection",), "audio_model": ("sound_model",),
                       "audio_projection": ("sound_projection",)},
                description="Bridge 0.7.0's NemotronOmniModel, parts at the top level",
                plain_linear=("sound_model",),
            ),
            # Bridge 0.7.0's deprecated legacy provider (a subclass of the one above): the LLaVA model still
            ProviderLayout(provider=f"{_OMNI_PROVIDERS}:NemotronOmniLlavaModelProvider", parts=_OMNI_LLAVA,
                           description="the legacy LLaVA model, `llava_model.*`",
                           plain_linear=("llava_model.sound_model",)),
        ),
        **_LLAVA,
    ),
]
