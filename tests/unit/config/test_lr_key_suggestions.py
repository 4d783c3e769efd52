"""A learning-rate key that names no part is answered from the model's own parts (issue 37 item 11).

Before: ``lr_sound_projection`` on Qwen2-Audio said "did you mean lr_vision_projection?", a part that model does
not have, and listed every part's keys; ``lr_projection`` / ``lr_encoder`` there guessed the vision parts too. The
guess, and the keys listed, now come from the family's parts; a word that means a part the model lacks says so.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import bridge_freeze_plugin as bfp
from bridge_freeze_plugin.config._validation import load_run

CONFIGS = Path(__file__).parents[2] / "fixtures" / "configs"
BRIDGE_FILE = CONFIGS / "bridge" / "run_config.yaml"

#: The parts of each family, read off the Bridge model trees (the tests' own table, not the registry).
PARTS = {
    "qwen3_vl": ("language_model", "vision_model", "vision_projection"),
    "gemma3_vl": ("language_model", "vision_model", "vision_projection"),
    "qwen2_audio": ("language_model", "audio_model", "audio_projection"),
    "qwen3_asr": ("language_model", "audio_model", "audio_projection"),
    "qwen25_omni": ("language_model", "vision_model", "vision_projection", "audio_model", "audio_projection"),
}
LABEL = {"vision_model": "vision encoder", "vision_projection": "vision projection", "audio_model": "audio encoder",
         "audio_projection": "audio projection"}
ALL = ("language_model", "vision_model", "vision_projection", "audio_model", "audio_projection")
#: What a user's word means: one part, or a role whose first part the model has is the guess (vision first).
MEANS = {
    "lr_sound_projection": ("audio_projection",), "lr_sound_encoder": ("audio_model",), "lr_audio": ("audio_model",),
    "lr_vision": ("vision_model",), "lr_merger": ("vision_projection",),
    "lr_projection": ("vision_projection", "audio_projection"), "lr_projector": ("vision_projection",
                                                                                "audio_projection"),
    "lr_encoder": ("vision_model", "audio_model"),
}


def _message(family: str, key: str) -> str:
    with pytest.raises(bfp.PartLearningRateError) as err:
        load_run(None, [f"megatron_config.{key}=1e-4"], layout="sft", family=family).validate()
    return str(err.value)


@pytest.mark.parametrize("key", sorted(MEANS))
@pytest.mark.parametrize("family", sorted(PARTS))
def test_an_unknown_lr_key_is_answered_from_the_models_own_parts(family, key):
    message = _message(family, key)
    meant = [p for p in MEANS[key] if p in PARTS[family]]
    if meant:
        assert f"did you mean megatron_config.lr_{meant[0]}?" in message
    else:
        assert f"it would be the {LABEL[MEANS[key][0]]}, which the {family} model does not have" in message
        assert "did you mean" not in message
    listed = ", ".join(f"{kind}_{p}" for p in (*PARTS[family], "adapters") for kind in ("lr", "min_lr"))
    assert f"The keys of the {family} model are {listed}" in message
    for absent in set(ALL) - set(PARTS[family]):
        assert f"lr_{absent}" not in message  # no key of a part the model lacks, suggested or listed


def test_the_bridge_layout_finds_the_family_from_the_provider_target():
    target = "megatron.bridge.models.qwen_audio.qwen2_audio_provider.Qwen2AudioModelProvider"
    section = "optimizer_config_override_provider"
    with pytest.raises(bfp.PartLearningRateError) as err:
        load_run(BRIDGE_FILE, [f"model._target_={target}",
                               f"+{section}._target_=bridge_freeze_plugin.optim.bridge.PartLROverrideProvider",
                               f"+{section}.lr_sound_projection=1e-4"]).validate()
    assert f"did you mean {section}.lr_audio_projection?" in str(err.value)
    assert "vision" not in str(err.value)


def test_without_a_family_every_part_is_a_candidate():
    with pytest.raises(bfp.PartLearningRateError) as err:
        load_run(None, ["megatron_config.lr_sound_projection=1e-4"], layout="sft").validate()
    assert "did you mean megatron_config.lr_audio_projection?" in str(err.value)
    assert "The keys are lr_language_model" in str(err.value)
