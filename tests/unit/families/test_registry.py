"""The registry: one call registers a family, duplicates are refused, lookup is lazy and honours
subclasses, and each parameter goes to the part with the most specific prefix."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bridge_freeze_plugin import (
    FamilyRegistrationError,
    FamilySpec,
    Part,
    UnknownFamilyError,
    list_families,
    register_family,
)
from bridge_freeze_plugin.families import class_path
from bridge_freeze_plugin.registry import FamilyRegistry


def _spec(name="toy", providers=("tests.toy:ToyProvider",), **kw):
    parts = {"language_model": ["lm"], "vision_model": ["vis"], "vision_projection": ["vis.proj"]}
    parts.update(kw)
    return FamilySpec(name=name, providers=tuple(providers), **parts)


class ToyProvider:
    pass


class UserToyProvider(ToyProvider):
    pass


def test_register_and_list_in_one_call():
    reg = FamilyRegistry()
    spec = register_family(
        "toy", providers=["x.y:P"], language_model=["lm"], vision_model=["v"], vision_projection=["p"],
        registry=reg,
    )
    assert [s.name for s in reg] == ["toy"]
    assert reg.get("toy") is spec
    assert "toy" in reg and len(reg) == 1


def test_duplicate_name_is_refused():
    reg = FamilyRegistry()
    reg.register(_spec())
    with pytest.raises(FamilyRegistrationError, match="'toy' is already registered"):
        reg.register(_spec(providers=("other.mod:Other",)))


def test_duplicate_provider_is_refused():
    reg = FamilyRegistry()
    reg.register(_spec())
    with pytest.raises(FamilyRegistrationError, match="already covered by family 'toy'"):
        reg.register(_spec(name="toy2"))


def test_unregister_frees_name_and_provider():
    reg = FamilyRegistry()
    reg.register(_spec())
    reg.unregister("toy")
    reg.register(_spec())
    assert reg.names() == ["toy"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"providers": ()}, "names no provider class"),
        ({"providers": ("no_colon.Class",)}, "package.module:ClassName"),
        ({"language_model": []}, "no module prefix for language_model"),
        ({"vision_model": [], "vision_projection": []}, "no module prefix for any part besides the language model"),
        ({"parts": {"sound_model": ["x"]}}, "parts names 'sound_model', which is not a part"),
        ({"parts": {"vision_model": ["x"]}}, r"vision_model is given both as a keyword \[.vis.\] and in parts="),
        ({"language_model": "lm"}, "must be a list of strings"),
        ({"vision_model": ["vis."]}, "bad prefix"),
        ({"vision_model": ["lm"]}, "listed under both language_model and vision_model"),
    ],
)
def test_malformed_specs_are_refused(kwargs, message):
    with pytest.raises(FamilyRegistrationError, match=message):
        _spec(**kwargs)


def test_a_copy_of_a_spec_is_the_same_spec():
    """dataclasses.replace (how an entry point's family gets its source) passes the merged table back in."""
    import dataclasses

    spec = _spec(parts={"audio_model": ["aud"]})
    copy = dataclasses.replace(spec, source="acme-vlm")
    assert copy.source == "acme-vlm"
    assert {p.value: list(copy.prefixes(p)) for p in copy.part_names()} == {
        "language_model": ["lm"], "vision_model": ["vis"], "vision_projection": ["vis.proj"], "audio_model": ["aud"],
    }
    with pytest.raises(FamilyRegistrationError, match=r"given both as a keyword \['vis'\] and in parts= \['v2'\]"):
        _spec(parts={"vision_model": ["v2"]})


def test_most_specific_prefix_wins():
    spec = _spec(other=["audio"])
    assert spec.classify("lm.layers.0.weight") is Part.LANGUAGE_MODEL
    assert spec.classify("vis.blocks.0.weight") is Part.VISION_MODEL
    assert spec.classify("vis.proj.fc.weight") is Part.VISION_PROJECTION
    assert spec.classify("vis.proj") is Part.VISION_PROJECTION
    # Prefixes match whole module names, not string beginnings.
    assert spec.classify("vis.projector.weight") is Part.VISION_MODEL
    assert spec.classify("lmhead.weight") is None
    assert spec.classify("audio.enc.weight") is Part.OTHER
    # Names after Float16Module / DDP wrapping classify the same.
    assert spec.classify("module.module.vis.proj.fc.weight") is Part.VISION_PROJECTION


def test_subclass_lookup_and_find():
    reg = FamilyRegistry()
    reg.register(_spec(providers=(class_path(ToyProvider),)))
    assert reg.for_provider(UserToyProvider()).name == "toy"
    assert reg.for_provider(UserToyProvider).name == "toy"
    assert reg.for_provider(object()) is None
    assert reg.find("ToyProvider").name == "toy"
    assert reg.find("toy").name == "toy"
    with pytest.raises(UnknownFamilyError, match="neither a registered family"):
        reg.find("Nope")


def test_unknown_family_error_lists_known():
    reg = FamilyRegistry()
    reg.register(_spec())
    with pytest.raises(UnknownFamilyError, match="registered families: toy"):
        reg.get("missing")


EXPECTED_BUILTINS = {
    "qwen25_vl", "qwen3_vl", "qwen3_vl_moe", "qwen35_vl", "glm45v", "kimi_k25_vl", "gemma3_vl",
    "gemma4_vl", "nemotron_vl", "ernie45_vl", "ministral3", "minimax_m3_vl", "step37", "exaone45_vl",
}


def test_builtins_cover_every_family_of_the_product():
    names = {s.name for s in list_families()}
    assert EXPECTED_BUILTINS <= names


def test_listing_families_imports_no_model_code():
    code = (
        "import sys, json, bridge_freeze_plugin as b\n"
        "fams = [f.as_dict() for f in b.list_families()]\n"
        "heavy = sorted(m for m in ('torch', 'megatron', 'megatron.bridge', 'transformers') if m in sys.modules)\n"
        "print(json.dumps({'n': len(fams), 'heavy': heavy}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    result = json.loads(out.stdout)
    assert result["heavy"] == []
    assert result["n"] >= len(EXPECTED_BUILTINS)


def test_every_builtin_provider_path_resolves_to_that_class(cpu_bridge):
    for spec in list_families():
        if spec.source != "builtin":
            continue
        for path, cls in zip(spec.providers, spec.resolve_providers(), strict=True):
            assert class_path(cls) == path, f"{spec.name}: {path} resolves to {class_path(cls)}"
