"""Every provider class of Bridge 0.7.0 (NeMo-RL's pin, 8c46dc42) with a freeze flag field is covered by a family
or refused by name (issue 36, item 3).

CI has only the pinned Bridge installed, so the classes come from a listing generated from 0.7.0's source by
``scripts/gen_freeze_providers.py`` (committed: tests/fixtures/bridge_freeze_providers_8c46dc42.json): each class
with its in-tree ancestors (nearest first) and its ``freeze_*`` fields. Coverage is decided here from the listing and
the families' provider paths, as the registry's own lookup does with a class's MRO.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import bridge_freeze_plugin as bfp
from bridge_freeze_plugin.families import UNSUPPORTED_PROVIDERS

LISTING = Path(__file__).resolve().parents[2] / "fixtures" / "bridge_freeze_providers_8c46dc42.json"


def _listing() -> dict[str, dict]:
    return json.loads(LISTING.read_text(encoding="utf-8"))["classes"]


def _verdict(path: str, ancestors: list[str], family_paths: dict[str, str]) -> str | None:
    """The family name, ``"refused"``, or ``None``: the first of the class and its ancestors that decides."""
    for klass in [path, *ancestors]:
        if klass in UNSUPPORTED_PROVIDERS:
            return "refused"
        if klass in family_paths:
            return family_paths[klass]
    return None


def test_the_listing_is_0_7_0s_and_complete():
    document = json.loads(LISTING.read_text(encoding="utf-8"))
    assert (document["bridge"], document["version"]) == ("8c46dc42", "0.7.0")
    classes = document["classes"]
    assert len(classes) >= 25
    omni = classes["megatron.bridge.models.nemotron_omni.nemotron_omni_provider:NemotronOmniModelProvider"]
    assert {"freeze_sound_encoder", "freeze_language_model"} <= set(omni["freeze_fields"])  # inherited from the base


def test_every_070_provider_with_a_freeze_field_is_covered_or_refused_by_name():
    family_paths = {path: family.name for family in bfp.list_families() for path in family.providers}
    verdicts = {path: _verdict(path, info["ancestors"], family_paths) for path, info in _listing().items()
                if not path.rpartition(":")[2].startswith("_")}  # a private base is nobody's provider
    assert {path for path, verdict in verdicts.items() if verdict is None} == set()
    assert verdicts["megatron.bridge.models.qwen_vl.qwen35_vl_provider:Qwen35TokenClassificationModelProvider"] == (
        "qwen35_vl")
    assert verdicts["megatron.bridge.diffusion.models.nemotron_labs_diffusion.nemotron_labs_diffusion_provider:"
                    "NemotronLabsDiffusionModelProvider"] == "refused"


def test_every_refusal_names_a_class_of_0_7_0():
    """A refusal of a class 0.7.0 no longer ships is stale (0.6.2-only ones are checked by test_uncovered_providers)."""
    assert set(UNSUPPORTED_PROVIDERS) <= set(_listing())


DIFFUSION = "megatron.bridge.diffusion.models.nemotron_labs_diffusion.nemotron_labs_diffusion_provider"


def _diffusion_provider_class() -> type:
    """The real class, or (its module needs ``diffusers``, which Bridge does not require) a structural stand-in: a
    dataclass subclass of the real Ministral3 provider under the real class's module and name."""
    import dataclasses
    import importlib

    try:
        return importlib.import_module(DIFFUSION).NemotronLabsDiffusionModelProvider
    except ImportError:
        from megatron.bridge.models.ministral3.ministral3_provider import Ministral3ModelProvider

        name = "NemotronLabsDiffusionModelProvider"
        return dataclasses.dataclass(type(name, (Ministral3ModelProvider,),
                                          {"__module__": DIFFUSION, "__qualname__": name}))


def test_a_text_only_subclass_of_a_vlm_provider_is_refused_by_name(cpu_bridge):
    """Bridge's diffusion LM subclasses Ministral3's provider (its vision flags too) but builds a GPT model."""
    cls = _diffusion_provider_class()
    assert bfp.family_for_provider(cls) is None
    provider = cls.__new__(cls)  # no config needed: the refusal comes before anything is read
    provider.__dict__["freeze_vision_model"] = True
    for method in (provider.provide, provider.provide_distributed_model):
        with pytest.raises(bfp.UnsupportedFreezeFlagError, match="text-only diffusion language model"):
            method()
