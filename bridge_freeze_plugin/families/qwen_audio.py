"""Qwen audio-language families: Qwen2-Audio and Qwen3-ASR (no vision parts; audio encoder + audio projection).

Prefixes read off the real tiny builds (``bridge_freeze_harness/tiny/qwen2_audio.py``, ``qwen3_asr.py``) and off
Bridge 0.6.2's own ``freeze()`` of each model:

- Qwen2-Audio (``Qwen2AudioModel``): ``audio_tower`` (transformers' Whisper-style ``Qwen2AudioEncoder``) is the
  audio encoder, ``multi_modal_projector`` (one linear into the language model's width) the projection, as
  Bridge's ``freeze(freeze_audio_model=..., freeze_audio_projection=...)`` splits them. Its
  ``audio_tower.embed_positions`` is a fixed sinusoidal table that transformers builds with
  ``requires_grad=False`` and Bridge never makes trainable: it is ``other`` (no flag makes it train; it stays as
  built, frozen), so training the encoder trains what Bridge's freeze would leave trainable, no more.
- Qwen3-ASR (``Qwen3ASRModel``): everything is under ``thinker``. ``thinker.audio_model`` (the vendored
  ``Qwen3ASRAudioEncoder``) ends in a two-layer projector ``proj1`` -> GELU -> ``proj2`` into the language model's
  width (after the encoder's final norm ``ln_post``): that is the audio projection, the rest the encoder (as the
  Qwen-VL tables put a merger inside the vision module). Bridge's own ``freeze_audio_model`` freezes the whole
  ``audio_model``, projector included, and Bridge has no projection flag: with the plugin, ``freeze_audio_model``
  alone leaves ``proj1`` / ``proj2`` training; set ``freeze_audio_projection`` too for Bridge's behaviour.
"""

from bridge_freeze_plugin.families._spec import FamilySpec

FAMILIES = [
    FamilySpec(
        name="qwen2_audio",
        plain_linear=("audio_tower", "multi_modal_projector"),  # HF torch.nn.Linear layers
        description="Qwen2-Audio (HF `audio_tower`, projection `multi_modal_projector`; fixed positions untouched)",
        providers=("megatron.bridge.models.qwen_audio.qwen2_audio_provider:Qwen2AudioModelProvider",),
        language_model=("language_model",),
        parts={"audio_model": ("audio_tower",), "audio_projection": ("multi_modal_projector",)},
        other=("audio_tower.embed_positions",),
        hf_model_types=("qwen2_audio",),
        # what Bridge's LoRA matches a leaf-name target against (read off the built model)
        linear_leaves={
            "language_model": ("linear_fc1", "linear_fc2", "linear_proj", "linear_qkv", "output_layer"),
            "audio_model": ("fc1", "fc2", "k_proj", "out_proj", "q_proj", "v_proj"),
            "audio_projection": ("linear",),
        },
    ),
    FamilySpec(
        name="qwen3_asr",
        plain_linear=("thinker.audio_model",),  # HF torch.nn.Linear layers
        description="Qwen3-ASR (`thinker.audio_model`, projection: its `proj1` + `proj2`)",
        providers=("megatron.bridge.models.qwen3_asr.qwen3_asr_provider:Qwen3ASRModelProvider",),
        language_model=("thinker.language_model",),
        parts={
            "audio_model": ("thinker.audio_model",),
            "audio_projection": ("thinker.audio_model.proj1", "thinker.audio_model.proj2"),
        },
        hf_model_types=("qwen3_asr",),
        # what Bridge's LoRA matches a leaf-name target against (read off the built model)
        linear_leaves={
            "language_model": ("linear_fc1", "linear_fc2", "linear_proj", "linear_qkv", "output_layer"),
            "audio_model": ("conv_out", "fc1", "fc2", "k_proj", "out_proj", "q_proj", "v_proj"),
            "audio_projection": ("proj1", "proj2"),
        },
    ),
]
