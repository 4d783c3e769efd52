from __future__ import annotations

import pytest

from bridge_freeze_plugin import FLAGS, FreezeSelection, Part


def test_defaults_train_everything():
    sel = FreezeSelection()
    assert not sel.any_set
    assert sel.frozen_parts() == frozenset()
    assert sel.trained_parts() == {Part.LANGUAGE_MODEL, Part.VISION_MODEL, Part.VISION_PROJECTION}


def test_all_selections_are_the_eight_distinct_ones():
    sels = list(FreezeSelection.all_selections())
    assert len(sels) == 8 and len(set(sels)) == 8
    assert FreezeSelection() in sels
    assert FreezeSelection(True, True, True) in sels


def test_projection_only():
    sel = FreezeSelection(freeze_language_model=True, freeze_vision_model=True)
    assert sel.trained_parts() == {Part.VISION_PROJECTION}
    assert sel.set_flags() == ("freeze_language_model", "freeze_vision_model")
    assert sel.describe() == "train vision_projection"


@pytest.mark.parametrize("bad", [1, "true", None, 0.0])
def test_values_must_be_real_booleans(bad):
    with pytest.raises(TypeError, match="freeze_vision_model must be a bool"):
        FreezeSelection(freeze_vision_model=bad)


def test_from_object_and_mapping():
    class P:
        freeze_language_model = True

    assert FreezeSelection.from_object(P()) == FreezeSelection(freeze_language_model=True)
    assert FreezeSelection.from_mapping({"freeze_vision_projection": True, "x": 1}) == FreezeSelection(
        freeze_vision_projection=True
    )
    assert FLAGS == ("freeze_language_model", "freeze_vision_model", "freeze_vision_projection",
                     "freeze_audio_model", "freeze_audio_projection")
