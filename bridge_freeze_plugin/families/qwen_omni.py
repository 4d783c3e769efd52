"""Qwen omni families (Qwen2.5-Omni, Qwen3-Omni): the thinker's five parts; the talker and vocoder are not built.

Bridge 0.6.2's providers build ``<Model>.thinker`` only: ``thinker.language_model`` (Megatron),
``thinker.visual`` (transformers' vision encoder, its ``merger`` projecting into the language model) and
``thinker.audio_model`` (transformers' audio encoder, its last linear layer(s) projecting into the language model).
The talker and the token2wav (2.5) / code2wav (3) vocoder are never built: the providers take their HF configs
(``talker_config``, ``token2wav_config`` / ``code2wav_config``) and the models make no module of them (Qwen2.5-Omni
drops them, Qwen3-Omni keeps them as plain config attributes), so they have no parameter: nothing for ``other``,
and no flag could select them.

Bridge's own ``freeze_vision_model`` freezes all of ``thinker.visual`` (the merger too) and its ``freeze_audio_model``
all of ``thinker.audio_model`` (its projection too); on a registered provider the plugin's five flags govern, and
the projections are parts of their own.
"""

from bridge_freeze_plugin.families._spec import FamilySpec

_PKG = "megatron.bridge.models.qwen_omni"
_NOT_BUILT = (
    "the talker and the {vocoder} vocoder are not built: provide() takes their configs but makes no module of them "
    "(no parameter, nothing for a flag or for other)"
)

FAMILIES = [
    FamilySpec(
        name="qwen25_omni",
        plain_linear=("thinker.visual", "thinker.audio_model"),  # HF torch.nn.Linear layers
        description=(
            "Qwen2.5-Omni thinker (HF vision tower `thinker.visual`, projection `thinker.visual.merger`; HF audio "
            "encoder `thinker.audio_model`, projection `thinker.audio_model.proj`); "
            + _NOT_BUILT.format(vocoder="token2wav")
        ),
        providers=(f"{_PKG}.qwen25_omni_provider:Qwen25OmniModelProvider",),
        language_model=("thinker.language_model",),
        vision_model=("thinker.visual",),
        vision_projection=("thinker.visual.merger",),
        parts={"audio_model": ("thinker.audio_model",), "audio_projection": ("thinker.audio_model.proj",)},
        hf_model_types=("qwen2_5_omni",),
        # what Bridge's LoRA matches a leaf-name target against (read off the built model)
        linear_leaves={
            "language_model": ("linear_fc1", "linear_fc2", "linear_proj", "linear_qkv", "output_layer"),
            "vision_model": ("down_proj", "gate_proj", "k", "proj", "q", "up_proj", "v"),
            "vision_projection": ("0", "2"),
            "audio_model": ("fc1", "fc2", "k_proj", "out_proj", "q_proj", "v_proj"),
            "audio_projection": ("proj",),
        },
    ),
    FamilySpec(
        name="qwen3_omni",
        plain_linear=("thinker.visual", "thinker.audio_model"),  # HF torch.nn.Linear layers
        description=(
            "Qwen3-Omni MoE thinker (HF vision tower `thinker.visual`, projection: `merger` + DeepStack `merger_list`; "
            "HF audio encoder `thinker.audio_model`, projection `proj1` + `proj2`); "
            + _NOT_BUILT.format(vocoder="code2wav")
        ),
        providers=(f"{_PKG}.qwen3_omni_provider:Qwen3OmniModelProvider",),
        language_model=("thinker.language_model",),
        vision_model=("thinker.visual",),
        vision_projection=("thinker.visual.merger", "thinker.visual.merger_list"),
        parts={
            "audio_model": ("thinker.audio_model",),
            "audio_projection": ("thinker.audio_model.proj1", "thinker.audio_model.proj2"),
        },
        hf_model_types=("qwen3_omni_moe",),
        # what Bridge's LoRA matches a leaf-name target against (read off the built model)
        linear_leaves={
            "language_model": ("linear_fc1", "linear_fc2", "linear_proj", "linear_qkv", "output_layer"),
            "vision_model": ("linear_fc1", "linear_fc2", "proj", "qkv"),
            "vision_projection": ("0", "2"),
            "audio_model": ("conv_out", "fc1", "fc2", "k_proj", "out_proj", "q_proj", "v_proj"),
            "audio_projection": ("proj1", "proj2"),
        },
    ),
]
