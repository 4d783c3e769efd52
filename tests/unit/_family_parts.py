"""The parts of every tiny family, as regular expressions over parameter names, written from reading each
Bridge model's module tree (never read from the plugin's registry): the tests' independent expectation.

Shared by ``test_families.py`` (the trainable set of every selection) and ``test_family_gradients.py`` (the
gradients of a real forward + backward); the set of tiny configurations the harness's index must find
(:data:`TINY_CONFIGS`, ``integration/test_harness.py``); and, per family with a tiny HF checkpoint, which HF tensors
its round trip trains (:data:`HF_ROUNDTRIP_CASES`, ``integration/test_hf_roundtrip.py``). Adding a family adds its
entries here (docs/families.md, "Adding a family").
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# family -> (language model, vision encoder, vision projection, untouched other) as regexes over names.
# The projection pattern is checked first: in the Qwen and GLM families it lives inside the vision module.
_QWEN3 = (r"language_model\.", r"vision_model\.", r"vision_model\.(merger|decoder\.deepstack_merger_list)\.", None)
_LLAVA = r"llava_model\."
_OMNI = r"(?:llava_model\.)?"

_VLM: dict[str, tuple[str, str, str, str | None]] = {
    "qwen25_vl": (r"language_model\.", r"visual\.", r"visual\.merger\.", None),
    "qwen3_vl": _QWEN3,
    "qwen3_vl_moe": _QWEN3,
    "qwen35_vl": _QWEN3,
    "qwen35_vl_moe": _QWEN3,
    "glm45v": (r"language_model\.", r"visual\.", r"visual\.merger\.", None),
    "gemma3_vl": (r"language_model\.", r"vision_tower\.", r"multi_modal_projector\.", None),
    "nemotron_vl": (_LLAVA + r"language_model\.", _LLAVA + r"vision_model\.", _LLAVA + r"vision_projection\.", None),
    "ernie45_vl": (r"language_model\.", r"(vision_tower|vision_model)\.", r"resampler_model\.", None),
    "ministral3": (r"language_model\.", r"vision_tower\.", r"multi_modal_projector\.", None),
    "kimi_k25_vl": (r"language_model\.", r"vision_tower\.", r"mm_projector\.", None),
    # Two projector MLPs at the top level; the Lightning Indexer state belongs to no flag.
    "minimax_m3_vl": (
        r"language_model\.",
        r"vision_tower\.vision_model\.",
        r"(multi_modal_projector|patch_merge_mlp)\.",
        r"lightning_indexers\.\d+\.",
    ),
    "step37": (r"language_model\.", r"vision_model\.", r"image_insert_embedding\.align_projector\.", None),
    # The MTP block is not the language model here: Bridge's own freeze_mtp_model decides it, no flag of ours.
    "exaone45_vl": (
        r"language_model\.(?!mtp\.)",
        r"vision_model\.",
        r"vision_model\.merger\.",
        r"language_model\.mtp\.",
    ),
}

#: Families with an audio side: part -> regex (a name is tried against the projections first, then the encoders,
#: then the language model, then ``other``: :data:`ORDER`).
_AUDIO: dict[str, dict[str, str]] = {
    # transformers builds the fixed sinusoidal position table frozen (a buffer-like parameter): no part.
    "qwen2_audio": {"language_model": r"language_model\.", "audio_model": r"audio_tower\.",
                    "audio_projection": r"multi_modal_projector\.", "other": r"audio_tower\.embed_positions\."},
    "qwen3_asr": {"language_model": r"thinker\.language_model\.", "audio_model": r"thinker\.audio_model\.",
                  "audio_projection": r"thinker\.audio_model\.proj[12]\."},
    "gemma4_vl": {"language_model": r"language_model\.", "vision_model": r"vision_tower\.",
                  "vision_projection": r"embed_vision\.", "audio_model": r"audio_tower\.",
                  "audio_projection": r"embed_audio\."},
    # Nemotron-VL's LLaVA layout plus the sound encoder and its projection; Bridge 0.7.0's provider builds the same
    # modules at the top level (its legacy provider keeps llava_model.*).
    "nemotron_omni": {"language_model": _OMNI + r"language_model\.", "vision_model": _OMNI + r"vision_model\.",
                      "vision_projection": _OMNI + r"vision_projection\.", "audio_model": _OMNI + r"sound_model\.",
                      "audio_projection": _OMNI + r"sound_projection\."},
    # Only the thinker is built (Bridge drops the talker and the vocoder).
    "qwen25_omni": {"language_model": r"thinker\.language_model\.", "vision_model": r"thinker\.visual\.",
                    "vision_projection": r"thinker\.visual\.merger\.", "audio_model": r"thinker\.audio_model\.",
                    "audio_projection": r"thinker\.audio_model\.proj\."},
    "qwen3_omni": {"language_model": r"thinker\.language_model\.", "vision_model": r"thinker\.visual\.",
                   "vision_projection": r"thinker\.visual\.merger(_list\.\d+)?\.",
                   "audio_model": r"thinker\.audio_model\.", "audio_projection": r"thinker\.audio_model\.proj[12]\."},
}

#: The order a name is tried against a family's parts: the most specific (projections inside encoders) first.
ORDER = ("vision_projection", "audio_projection", "vision_model", "audio_model", "language_model", "other")


def _as_parts(row: tuple[str, str, str, str | None]) -> dict[str, str]:
    lm, vision, projection, other = row
    return {"language_model": lm, "vision_model": vision, "vision_projection": projection,
            **({"other": other} if other else {})}


#: family -> part -> regex, every tiny family.
PARTS: dict[str, dict[str, str]] = {**{name: _as_parts(row) for name, row in _VLM.items()}, **_AUDIO}
#: Every tiny configuration, written here (not read from the harness's index): the index must find exactly these.
TINY_CONFIGS = frozenset(PARTS)


def parts_of(family: str) -> tuple[str, ...]:
    """The parts (not ``other``) the family has, by the test's own table."""
    vocabulary_order = ("language_model", "vision_model", "vision_projection", "audio_model", "audio_projection")
    return tuple(p for p in vocabulary_order if p in PARTS[family])


def selections_of(family: str, every: bool = True) -> list:
    """The selections of the family's own parts: all of them, or (``every=False``, more than three parts) each
    part frozen alone and each part trained alone."""
    from bridge_freeze_plugin import FreezeSelection

    parts = parts_of(family)
    if every or len(parts) <= 3:
        return list(FreezeSelection.all_selections(parts))
    single = [FreezeSelection(**{f"freeze_{p}": True}) for p in parts]
    alone = [FreezeSelection(**{f"freeze_{q}": q != p for q in parts}) for p in parts]
    return [FreezeSelection(), *single, *alone]


# Parameters Bridge builds with requires_grad=False and never runs (checkpoint-only state): they never train.
FROZEN_AS_BUILT = {
    "minimax_m3_vl": r"lightning_indexers\.",
    "qwen2_audio": r"audio_tower\.embed_positions\.",
}

#: Families whose ``other`` modules lie inside a part's module (checked before the parts).
_OTHER_FIRST = {"qwen2_audio", "exaone45_vl"}

#: Parameters that train but that the forward never reads (no gradient ever reaches them).
NEVER_READ = {
    "qwen25_omni": r"thinker\.audio_model\.audio_bos_eos_token\.",
    # SigLIP's pooling head, only where the installed Bridge builds it (91a15142 keeps vision_use_head; 0.6.2 drops
    # it, so nothing matches there): the tower computes the pooled output, Gemma3-VL's forward discards it.
    "gemma3_vl": r"vision_tower\.head\.",
}


def part_of(family: str, name: str) -> str:
    table = PARTS[family]
    if "other" in table and re.match(table["other"], name) and family in _OTHER_FIRST:
        return "other"
    for part in ORDER:
        if part in table and re.match(table[part], name):
            return part
    raise AssertionError(f"{family}: the test's own table does not cover {name}")


# ---- The HF round trip (tests/unit/integration/test_hf_roundtrip.py): one entry per family with a tiny HF checkpoint

PROJECTION_ONLY = {"freeze_language_model": True, "freeze_vision_model": True}
VISION_ONLY = {"freeze_language_model": True, "freeze_vision_projection": True}
LANGUAGE_ONLY = {"freeze_vision_model": True, "freeze_vision_projection": True}
OMNI_PROJECTIONS = {"freeze_language_model": True, "freeze_vision_model": True, "freeze_audio_model": True}


#: Files a published checkpoint carries that Bridge 0.6.2's export does not copy (its Qwen2.5-Omni bridge names no
#: ADDITIONAL_FILE_PATTERNS, so save_hf_pretrained drops the speaker table transformers' loader requires).
BRIDGE_EXPORT_DROPS = {"qwen25_omni": "spk_dict.pt"}


@dataclass(frozen=True)
class Case:
    """One family's HF round trip (integration/test_hf_roundtrip.py): the flags set, and which HF tensors then
    train (a regex over HF names)."""

    flags: dict[str, bool]
    trains: str


# HF names as the checkpoints lay them out (transformers' save_pretrained). What trains follows from the parts:
# language model / vision encoder / vision projection, and what is no flag's part (trains unless frozen otherwise).
QWEN3_PROJECTION = r"^model\.visual\.(merger|deepstack_merger_list\.\d+)\."
HF_ROUNDTRIP_CASES: dict[str, Case] = {
    # Qwen2.5-VL (legacy layout, no "model." before visual.): the vision encoder is visual. minus its merger.
    "qwen25_vl": Case(VISION_ONLY, r"^visual\.(?!merger\.)"),
    "qwen3_vl": Case(PROJECTION_ONLY, QWEN3_PROJECTION),
    "qwen3_vl_moe": Case(PROJECTION_ONLY, QWEN3_PROJECTION),
    "qwen35_vl": Case(PROJECTION_ONLY, r"^model\.visual\.merger\."),  # no DeepStack mergers in Qwen3.5
    # The language model with its routed experts (one fused HF tensor per layer and projection).
    "qwen35_vl_moe": Case(LANGUAGE_ONLY, r"^(model\.language_model\.|lm_head\.)"),
    # Only the merger: visual.embeddings / post_conv_layernorm / downsample / post_layernorm are the vision
    # encoder's (Bridge's own freeze leaves them training).
    "glm45v": Case(PROJECTION_ONLY, r"^model\.visual\.merger\."),
    "gemma3_vl": Case(VISION_ONLY, r"^vision_tower\."),
    # The audio tower and its embedding are no flag's part: they train next to the projection, except the
    # audio layers' clipping bounds (buffers: nothing trains them).
    "gemma4_vl": Case(PROJECTION_ONLY,
                      r"^model\.(embed_vision\.|embed_audio\.|audio_tower\.(?!.*\.(input|output)_(min|max)$))"),
    "ministral3": Case(VISION_ONLY, r"^vision_tower\."),
    # Only the resampler: the vision tower's final ln is the encoder's (Bridge's own freeze leaves it training).
    "ernie45_vl": Case(PROJECTION_ONLY, r"^model\.resampler_model\."),
    # The language model, except the routers' expert-score bias: a buffer that Bridge's training loop updates
    # from the routing counts (finalize_model_grads), not the optimizer step run here.
    "minimax_m3_vl": Case(LANGUAGE_ONLY, r"^language_model\.(?!.*\.e_score_correction_bias$)"),
    "exaone45_vl": Case(LANGUAGE_ONLY, r"^(model\.language_model\.|lm_head\.)"),
    # The audio encoder alone; its fixed position table is no part (built frozen).
    "qwen2_audio": Case({"freeze_language_model": True, "freeze_audio_projection": True},
                        r"^audio_tower\.(?!embed_positions\.)"),
    # Both projections (the Omni thinker's audio projection lives inside the audio tower in HF names too).
    "qwen25_omni": Case(OMNI_PROJECTIONS, r"^thinker\.(visual\.merger\.|audio_tower\.proj\.)"),
    "qwen3_omni": Case(OMNI_PROJECTIONS, r"^thinker\.(visual\.merger(_list\.\d+)?\.|audio_tower\.proj[12]\.)"),
    # The audio projection alone: Qwen3-ASR's projector (proj1 -> GELU -> proj2) sits inside the HF audio tower,
    # whose sinusoidal positions are a non-persistent buffer (not in the file).
    "qwen3_asr": Case({"freeze_language_model": True, "freeze_audio_model": True},
                      r"^thinker\.audio_tower\.proj[12]\."),
    # The vision tower and its projector (the stand-ins for the hub's remote code, as published: vision_tower.**,
    # mm_projector.**); the language model frozen, its INT4-stored routed experts included.
    "kimi_k25_vl": Case({"freeze_language_model": True}, r"^(vision_tower|mm_projector)\."),
}
