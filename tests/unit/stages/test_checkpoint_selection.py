"""The selection a checkpoint's ``run_config.yaml`` holds, as the resume check reads it (no Bridge, no model)."""

from __future__ import annotations

import pytest

from bridge_freeze_plugin import FreezeSelection, InvalidPatternError, SelectionChange
from bridge_freeze_plugin.stages import changes, run_settings, saved_settings

FLAGS_OFF = {"freeze_language_model": False, "freeze_vision_model": False, "freeze_vision_projection": False,
             "freeze_audio_model": False, "freeze_audio_projection": False}


def test_a_flag_the_file_leaves_out_is_false_and_patterns_absent_are_none():
    assert saved_settings({"_target_": "x.Provider"}, "run_config.yaml") == {
        **FLAGS_OFF, "train_patterns": (), "freeze_patterns": ()}


def test_bridges_own_name_of_a_flag_freezes_that_part_as_on_a_provider():
    settings = saved_settings({"freeze_sound_encoder": True}, "run_config.yaml")
    assert settings["freeze_audio_model"] is True


def test_only_a_real_true_is_true():
    assert saved_settings({"freeze_language_model": "true"}, "f")["freeze_language_model"] is False


def test_changes_name_each_flag_and_pattern_list_that_differs_and_ignore_pattern_order():
    saved = saved_settings({"freeze_language_model": True, "freeze_patterns": ["a", "b"]}, "f")
    run = run_settings(FreezeSelection(freeze_vision_model=True, freeze_patterns=("b", "a")))
    assert changes(saved, run) == [SelectionChange("freeze_language_model", True, False),
                                   SelectionChange("freeze_vision_model", False, True)]
    run = run_settings(FreezeSelection(freeze_language_model=True, train_patterns=("c",), freeze_patterns=("a",)))
    assert changes(saved, run) == [SelectionChange("train_patterns", (), ("c",)),
                                   SelectionChange("freeze_patterns", ("a", "b"), ("a",))]


def test_a_pattern_list_that_is_not_a_list_names_the_file():
    with pytest.raises(InvalidPatternError, match=r"^/ckpt/iter_0000002/run_config.yaml: model\.train_patterns"):
        saved_settings({"train_patterns": 3}, "/ckpt/iter_0000002/run_config.yaml")
