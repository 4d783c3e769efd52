"""Registry inputs, empty parts, flag values and the opt-out variable."""

from __future__ import annotations

import dataclasses

import pytest

import bridge_freeze_plugin as bfp
from bridge_freeze_harness.tiny import build_tiny_chunks, make_provider
from bridge_freeze_plugin import (
    EmptyPartError,
    FamilyRegistrationError,
    FreezeFlagTypeError,
    FreezeSelection,
)

# ---- 8. registry inputs, empty parts, flag values, the opt-out variable ----


def _spec(**kw):
    base = {"providers": ["pkg.mod:Prov"], "language_model": ["lm"], "vision_model": ["vis"],
            "vision_projection": ["proj"]}
    return bfp.FamilySpec(name="toy", **{**base, **kw})


@pytest.mark.parametrize("providers", [[None], [3], None, 7])
def test_register_family_refuses_non_string_providers_with_a_typed_error(providers):
    with pytest.raises(FamilyRegistrationError, match="providers"):
        _spec(providers=providers)


def test_a_provider_class_object_is_accepted_as_its_import_path():
    class Prov:
        pass

    assert _spec(providers=[Prov]).providers == (f"{__name__}:{Prov.__qualname__}",)


@pytest.mark.parametrize("prefix", [" lm", "module.lm", "language_model.*", "a..b", "lm ", "a.b-c"])
def test_prefixes_that_can_never_match_are_refused(prefix):
    with pytest.raises(FamilyRegistrationError, match="can never match"):
        _spec(language_model=[prefix])


def test_a_wrong_table_that_leaves_a_part_empty_raises_naming_it(cpu_bridge):

    from megatron.bridge.models.qwen_vl.qwen25_vl_provider import Qwen25VLModelProvider

    @dataclasses.dataclass
    class TypoQwen25(Qwen25VLModelProvider):
        pass

    path = f"{TypoQwen25.__module__}:{TypoQwen25.__qualname__}"
    bfp.register_family("typo_qwen25", providers=[path], language_model=["language_model"],
                        vision_model=["visual"], vision_projection=["visual.mergr"])
    try:
        provider = make_provider("qwen25_vl")
        provider.__class__ = TypoQwen25
        provider.freeze_vision_model = True
        with pytest.raises(EmptyPartError, match=r"typo_qwen25.*vision_projection.*visual\.mergr"):
            build_tiny_chunks("qwen25_vl", provider=provider)
    finally:
        bfp.REGISTRY.unregister("typo_qwen25")


def test_a_numpy_bool_flag_is_named_as_such():
    import numpy  # in requirements/base.txt: a skip here would hide a broken install
    with pytest.raises(FreezeFlagTypeError, match=r"numpy\.bool") as err:
        FreezeSelection(freeze_language_model=numpy.True_)
    assert "of type bool" not in str(err.value)


@pytest.mark.parametrize(("value", "disabled"), [("", False), ("0", False), ("off", False), ("No", False),
                                                  ("1", True), ("true", True), (" ON ", True), ("yes", True)])
def test_the_opt_out_variable_is_read_as_a_boolean(monkeypatch, value, disabled):
    import _bridge_freeze_autoload as autoload

    monkeypatch.setenv(autoload.ENV_DISABLE, value)
    assert autoload.autoload_disabled() is disabled


def test_an_opt_out_value_that_is_not_a_boolean_disables_with_a_warning(monkeypatch):
    import _bridge_freeze_autoload as autoload

    monkeypatch.setenv(autoload.ENV_DISABLE, "maybe")
    with pytest.warns(RuntimeWarning, match="not a boolean"):
        assert autoload.autoload_disabled() is True
