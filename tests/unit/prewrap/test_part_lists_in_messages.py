"""Messages that list parts list the model's own parts, never a literal vision-language three (issue 37 item 12).

Before: an unmatched pattern on Qwen2-Audio was reported as matching "no parameter of language_model, vision_model
or vision_projection", a parameter outside every prefix was to be added to "the family's table (language_model /
vision_model / vision_projection / other)", and a language-model-only run "has no vision encoder or projection".
The builds are the real tiny Bridge models; the expected part lists are the tests' own (read off the model trees).
"""

from __future__ import annotations

import pytest
import torch

import bridge_freeze_plugin as bfp
from bridge_freeze_harness.tiny import build_tiny_chunks, make_provider
from bridge_freeze_plugin import FamilySpec, FreezeSelection, apply_selection
from bridge_freeze_plugin.config import load_run
from bridge_freeze_plugin.errors import InvalidFreezeConfigError, UnclassifiedParameterError, UnmatchedPatternError

#: family -> its parts, in the vocabulary's order (read off the Bridge model trees: tests/unit/_family_parts.py,
#: test_family_qwen_audio.py, test_family_qwen_omni.py).
PARTS = {
    "qwen3_vl": ("language_model", "vision_model", "vision_projection"),
    "qwen2_audio": ("language_model", "audio_model", "audio_projection"),
    "qwen3_asr": ("language_model", "audio_model", "audio_projection"),
}
LABEL = {"vision_model": "vision encoder", "vision_projection": "vision projection", "audio_model": "audio encoder",
         "audio_projection": "audio projection"}


def _or(words) -> str:
    words = list(words)
    return ", ".join(words[:-1]) + " or " + words[-1]


@pytest.mark.parametrize("family", sorted(PARTS))
def test_an_unmatched_pattern_names_the_models_own_parts(cpu_bridge, family):
    provider = bfp.make_freezable(make_provider(family), FreezeSelection(freeze_language_model=True))
    provider.train_patterns = ["no_such_module"]
    with pytest.raises(UnmatchedPatternError) as err:
        build_tiny_chunks(family, provider=provider)
    assert f"1 pattern(s) match no parameter of {_or(PARTS[family])} in the model" in str(err.value)


def test_a_parameter_outside_every_prefix_is_to_be_added_to_one_of_the_familys_parts():
    """A hand-made audio family (a plain module: the table is the subject) that forgets its projection."""
    model = torch.nn.Module()
    model.lm, model.tower, model.proj = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    family = FamilySpec(name="toy_audio", providers=("toy:Provider",), language_model=("lm",),
                        parts={"audio_model": ("tower",)})
    with pytest.raises(UnclassifiedParameterError) as err:
        apply_selection(model, family, FreezeSelection(freeze_audio_model=True))
    assert "Add their module to the family's table (language_model / audio_model / other)" in str(err.value)


@pytest.mark.parametrize("family", sorted(PARTS))
def test_a_language_model_only_run_names_the_parts_it_lacks(family):
    with pytest.raises(InvalidFreezeConfigError) as err:
        load_run(None, ["megatron_config.freeze_language_model=true", "model.language_model_only=true"],
                 layout="sft", family=family).validate()
    others = [LABEL[p] for p in PARTS[family][1:]]
    assert f"a language-model-only run has no {_or(others)} to choose from" in str(err.value)
