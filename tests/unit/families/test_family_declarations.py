"""The family facts beyond the parts (issue 33 part 2): the freeze flags a family's Bridge provider defaults to true
and the remote-code configs ``plan`` reads offline are declared in the family's module, checked when the family is
made like its other fields, and read from the registry.

Expected values are written here by hand (from Bridge 0.6.2's provider source and the published config.json files).
"""

from __future__ import annotations

import pytest

import bridge_freeze_plugin as bfp
from bridge_freeze_plugin.errors import FamilyRegistrationError
from bridge_freeze_plugin.families import FamilySpec, OfflineConfig


def _spec(**changes):
    fields = {"name": "my_vlm", "providers": ("my_pkg.provider:MyVLMProvider",), "language_model": ("lm",),
              "vision_model": ("tower",), "hf_model_types": ("my_vlm", "MyVLM_Remote")}
    return FamilySpec(**{**fields, **changes})


def test_the_builtin_declarations():
    """Bridge 0.6.2's Qwen3VLMoEModelProvider defaults the LM and the vision encoder to frozen; the remote-code
    types plan reads offline are Kimi K2.5's and the two Nemotron wrappers'."""
    assert {f.name: f.provider_flag_defaults for f in bfp.list_families() if f.provider_flag_defaults} == {
        "qwen3_vl_moe": ("freeze_language_model", "freeze_vision_model")}
    offline = {c.model_type: f.name for f in bfp.list_families() for c in f.offline_configs}
    assert offline == {"kimi_k25": "kimi_k25_vl", "NemotronH_Nano_VL_V2": "nemotron_vl",
                       "NemotronH_Nano_Omni_Reasoning_V3": "nemotron_omni"}


@pytest.mark.parametrize("flags", [("freeze_vision",), ("freeze_vision_model", "freeze_vision_model"),
                                   ("freeze_sound_encoder",)])
def test_a_flag_default_that_is_no_flag_or_given_twice_is_refused(flags):
    with pytest.raises(FamilyRegistrationError, match="provider_flag_defaults names the flags"):
        _spec(provider_flag_defaults=flags)


def test_a_flag_default_given_as_one_string_is_refused():
    with pytest.raises(FamilyRegistrationError, match="provider_flag_defaults must be a list of strings"):
        _spec(provider_flag_defaults="freeze_vision_model")


@pytest.mark.parametrize(("configs", "message"), [
    ((OfflineConfig("other_type", sub_configs=("text_config",)),), "must be one of its hf_model_types"),
    ((OfflineConfig("MyVLM_Remote"),), "one of the two"),
    ((OfflineConfig("MyVLM_Remote", sub_configs=("text_config",), reader="pkg.mod:read"),), "one of the two"),
    ((OfflineConfig("MyVLM_Remote", reader="pkg.mod.read"),), "one of the two"),
    ((OfflineConfig("MyVLM_Remote", sub_configs=("a",)), OfflineConfig("MyVLM_Remote", sub_configs=("b",))),
     "listed once"),
    (("MyVLM_Remote",), "must hold OfflineConfig"),
])
def test_a_wrong_offline_config_is_refused(configs, message):
    with pytest.raises(FamilyRegistrationError, match=message):
        _spec(offline_configs=configs)


def test_a_well_formed_declaration_is_kept():
    spec = _spec(provider_flag_defaults=["freeze_vision_model"],
                 offline_configs=[OfflineConfig("MyVLM_Remote", reader="my_pkg.offline:read")])
    assert spec.provider_flag_defaults == ("freeze_vision_model",)
    assert spec.offline_configs == (OfflineConfig("MyVLM_Remote", reader="my_pkg.offline:read"),)
