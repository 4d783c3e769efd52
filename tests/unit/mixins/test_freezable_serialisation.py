"""A make_freezable provider pickles in a fresh process, deep-copies and survives Bridge's run_config round trip."""

from __future__ import annotations

import copy
import json
import os
import pickle
import subprocess
import sys
import textwrap

import pytest
from _shared import PROJECTION_ONLY, names, projection_names, trainable

from bridge_freeze_harness.tiny import build_tiny_model, make_provider
from bridge_freeze_plugin import (
    FreezeSelection,
    make_freezable,
)

# ---- 1. a make_freezable provider pickles, deep-copies and survives Bridge's run_config round trip ----


def test_freezable_provider_pickles_and_unpickles_in_a_fresh_process(cpu_bridge, tmp_path):
    provider = make_freezable(make_provider("qwen3_vl"), PROJECTION_ONLY)
    again = pickle.loads(pickle.dumps(provider))
    assert type(again) is type(provider) and again.freeze_selection == PROJECTION_ONLY
    assert copy.deepcopy(provider).freeze_selection == PROJECTION_ONLY
    path = tmp_path / "provider.pkl"
    path.write_bytes(pickle.dumps(provider))
    script = textwrap.dedent(
        f"""
        import json, pickle
        from bridge_freeze_harness.cpu_runtime import import_bridge
        from bridge_freeze_harness.tiny import build_tiny_model
        import_bridge()  # TransformerEngine's CPU stand-in (a GPU machine imports Bridge as it is)
        provider = pickle.loads(open({str(path)!r}, "rb").read())
        model = build_tiny_model("qwen3_vl", provider=provider)
        print(json.dumps(sorted(n for n, p in model.named_parameters() if p.requires_grad)))
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=240,
                         env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    model = build_tiny_model("qwen3_vl", provider=make_provider("qwen3_vl"))
    assert set(json.loads(out.stdout.strip().splitlines()[-1])) == projection_names(model)


def _bridge_yaml_round_trip(provider):
    """What Bridge does with ``cfg.model`` in run_config.yaml: to_dict + safe YAML, then instantiate."""
    import yaml
    from megatron.bridge.training.utils.config_utils import _ConfigContainerBase
    from megatron.bridge.utils.instantiate_utils import InstantiationMode, instantiate
    from megatron.training.config.yaml_utils import safe_yaml_representers

    as_dict = _ConfigContainerBase._convert_value_to_dict(provider)
    with safe_yaml_representers():
        text = yaml.safe_dump(as_dict)
    return as_dict["_target_"], instantiate(yaml.safe_load(text), mode=InstantiationMode.LENIENT)


def test_freezable_provider_survives_bridges_run_config_round_trip(cpu_bridge):
    provider = make_freezable(make_provider("qwen3_vl"), PROJECTION_ONLY)
    target, loaded = _bridge_yaml_round_trip(provider)
    assert not any(segment.startswith("_") for segment in target.split("."))
    assert type(loaded) is type(provider) and loaded.freeze_selection == PROJECTION_ONLY
    model = build_tiny_model("qwen3_vl", provider=loaded)
    assert trainable(model) == projection_names(model)


def test_the_generated_module_only_extends_provider_classes():
    from bridge_freeze_plugin.mixins import freezable as generated

    forged = generated.class_name(subprocess.Popen)  # a class no family names, outside Bridge's allowlist
    with pytest.raises(AttributeError):
        getattr(generated, forged)


def test_patterns_written_by_make_freezable_reach_the_build_and_survive_run_config(cpu_bridge):
    layer_1 = r"language_model\.decoder\.layers\.1"
    selection = FreezeSelection(True, True, False, train_patterns=[layer_1])
    provider = make_freezable(make_provider("qwen3_vl"), selection)
    model = build_tiny_model("qwen3_vl", provider=provider)
    expected = projection_names(model) | {n for n in names(model) if n.startswith("language_model.decoder.layers.1.")}
    assert len(expected) > len(projection_names(model)) and trainable(model) == expected
    _, loaded = _bridge_yaml_round_trip(provider)
    assert list(loaded.train_patterns) == [layer_1]
    again = build_tiny_model("qwen3_vl", provider=loaded)
    assert trainable(again) == expected


FORMER_PREFIXES = ["bridge_freeze_plugin.mixins.generated.", "bridge_freeze_plugin.activation.freezable."]


@pytest.mark.parametrize("former", FORMER_PREFIXES)
def test_a_run_config_written_by_an_earlier_version_loads_through_bridges_instantiate(cpu_bridge, former):
    """Issue 47 item 3: every ``_target_`` path an earlier version wrote resolves, to the same class."""
    import yaml
    from megatron.bridge.training.utils.config_utils import _ConfigContainerBase
    from megatron.bridge.utils.instantiate_utils import InstantiationMode, instantiate
    from megatron.training.config.yaml_utils import safe_yaml_representers

    provider = make_freezable(make_provider("qwen3_vl"), PROJECTION_ONLY)
    as_dict = _ConfigContainerBase._convert_value_to_dict(provider)
    home = "bridge_freeze_plugin.mixins.freezable."
    assert as_dict["_target_"].startswith(home)  # what this version writes
    as_dict["_target_"] = former + as_dict["_target_"][len(home):]
    with safe_yaml_representers():
        text = yaml.safe_dump(as_dict)
    assert f"_target_: {former}Freezable" in text
    loaded = instantiate(yaml.safe_load(text), mode=InstantiationMode.STRICT)
    assert type(loaded) is type(provider) and loaded.freeze_selection == PROJECTION_ONLY
    model = build_tiny_model("qwen3_vl", provider=loaded)
    assert trainable(model) == projection_names(model)


@pytest.mark.parametrize("former", FORMER_PREFIXES)
def test_a_former_path_extends_only_what_the_allowlist_accepts(cpu_bridge, former):
    """The forwarders keep the rule: a forged name for a class outside Bridge's allowlist is refused."""
    import importlib

    from bridge_freeze_plugin.mixins import generated_class_name

    module = importlib.import_module(former.rstrip("."))
    with pytest.raises(AttributeError):
        getattr(module, generated_class_name(subprocess.Popen))


def test_the_former_public_module_paths_import_and_forward_to_their_homes():
    """Issue 47 item 4: bridge_freeze_plugin.registry, .mixins, .validation (the names the docs gave)."""
    import bridge_freeze_plugin as bfp
    import bridge_freeze_plugin.mixins as mixins
    import bridge_freeze_plugin.registry as registry
    import bridge_freeze_plugin.validation as validation

    assert registry.REGISTRY is bfp.REGISTRY and registry.register_family is bfp.register_family
    assert registry.get_family("qwen3_vl") is bfp.get_family("qwen3_vl")
    assert mixins.FreezableVLMProvider is bfp.FreezableVLMProvider and mixins.make_freezable is bfp.make_freezable
    assert validation.validate_config is bfp.validate_config
    assert validation.validate_sft_config is bfp.validate_sft_config
