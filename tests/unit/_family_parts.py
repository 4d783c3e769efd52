"""The parts of every tiny family, as regular expressions over parameter names, written from reading each
Bridge model's module tree (never read from the plugin's registry): the tests' independent expectation.

Shared by ``test_families.py`` (the trainable set of every selection) and ``test_family_gradients.py`` (the
gradients of a real forward + backward).
"""

from __future__ import annotations

import re

# family -> (language model, vision encoder, vision projection, untouched other) as regexes over names.
# The projection pattern is checked first: in the Qwen and GLM families it lives inside the vision module.
_QWEN3 = (r"language_model\.", r"vision_model\.", r"vision_model\.(merger|decoder\.deepstack_merger_list)\.", None)
_LLAVA = r"llava_model\."

PARTS: dict[str, tuple[str, str, str, str | None]] = {
    "qwen25_vl": (r"language_model\.", r"visual\.", r"visual\.merger\.", None),
    "qwen3_vl": _QWEN3,
    "qwen3_vl_moe": _QWEN3,
    "qwen35_vl": _QWEN3,
    "qwen35_vl_moe": _QWEN3,
    "glm45v": (r"language_model\.", r"visual\.", r"visual\.merger\.", None),
    "gemma3_vl": (r"language_model\.", r"vision_tower\.", r"multi_modal_projector\.", None),
    "gemma4_vl": (r"language_model\.", r"vision_tower\.", r"embed_vision\.", r"(audio_tower|embed_audio)\."),
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

# Parameters Bridge builds with requires_grad=False and never runs (checkpoint-only state): they never train.
FROZEN_AS_BUILT = {
    "minimax_m3_vl": r"lightning_indexers\.",
}


def part_of(family: str, name: str) -> str:
    lm, vision, projection, other = PARTS[family]
    if re.match(projection, name):
        return "vision_projection"
    if re.match(vision, name):
        return "vision_model"
    if re.match(lm, name):
        return "language_model"
    if other and re.match(other, name):
        return "other"
    raise AssertionError(f"{family}: the test's own table does not cover {name}")
