"""Everything the plugin reads from a provider round-trips through Bridge's ``run_config.yaml`` (issue 22 item 10).

The plugin reads the three flags (Bridge's own fields), the train / freeze patterns and
``full_recompute_policy``. On a PLAINLY imported provider (no ``make_freezable``), the patterns used to be
plain attributes: Bridge's ``to_cfg_dict`` walks ``dataclasses.fields`` only, so a resumed run silently
trained another set. Now they are fields of every patched class. A ``run_config.yaml`` written with the
plugin also loads without it (Bridge's lenient ``instantiate`` drops the keys, with a warning).
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap

import pytest

import bridge_freeze_plugin as bfp
from bridge_freeze_harness.tiny import TINY_FAMILIES, build_tiny_chunks, make_provider
from bridge_freeze_plugin.activation._provider_fields import PLUGIN_FIELDS


def _lane_path() -> dict[str, str]:
    """The caller's PYTHONPATH, where it has one: the fresh interpreter runs the Bridge this test wrote with (the
    compatibility lane's side folder shadows the venv's; without it the child met the venv's 0.6.2)."""
    return {"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else {}


def _round_trip(provider):
    """What Bridge does with ``cfg.model``: to_dict + safe YAML (Bridge's representers), then instantiate."""
    import yaml
    from megatron.bridge.training.utils.config_utils import _ConfigContainerBase
    from megatron.bridge.utils.instantiate_utils import InstantiationMode, instantiate
    from megatron.training.config.yaml_utils import safe_yaml_representers

    as_dict = _ConfigContainerBase._convert_value_to_dict(provider)
    with safe_yaml_representers():
        text = yaml.safe_dump(as_dict)
    return as_dict, text, instantiate(yaml.safe_load(text), mode=InstantiationMode.LENIENT)


@pytest.mark.parametrize("name", sorted(TINY_FAMILIES))
def test_every_plain_provider_has_the_plugin_fields(cpu_bridge, name):
    provider = make_provider(name)
    names = {f.name for f in dataclasses.fields(provider)}
    assert set(PLUGIN_FIELDS) <= names
    assert (provider.train_patterns, provider.freeze_patterns, provider.full_recompute_policy) == ((), (), "fix")


def test_patterns_and_policy_on_a_plain_provider_survive_run_config(cpu_bridge):
    layer_1 = r"language_model\.decoder\.layers\.1\..*"
    provider = make_provider("qwen3_vl")
    assert not isinstance(provider, bfp.FreezableVLMProvider)  # plainly imported, patched in place
    provider.freeze_language_model = True
    provider.freeze_vision_model = True
    provider.train_patterns = [layer_1]
    provider.full_recompute_policy = "refuse"
    as_dict, _, loaded = _round_trip(provider)
    assert as_dict["train_patterns"] == [layer_1] and as_dict["full_recompute_policy"] == "refuse"
    assert type(loaded) is type(provider)
    assert list(loaded.train_patterns) == [layer_1] and loaded.full_recompute_policy == "refuse"
    trained = {n for c in build_tiny_chunks("qwen3_vl", provider=loaded) for n, p in c.named_parameters()
               if p.requires_grad}
    names = {n for c in build_tiny_chunks("qwen3_vl", provider=make_provider("qwen3_vl")) for n, _ in
             c.named_parameters()}
    expected = {n for n in names if n.startswith(("vision_model.merger.", "vision_model.decoder.deepstack_merger_list.",
                                                  "language_model.decoder.layers.1."))}
    assert trained == expected


def test_dataclasses_replace_and_keyword_construction_take_the_plugin_fields(cpu_bridge):
    provider = make_provider("qwen3_vl")
    again = dataclasses.replace(provider, freeze_patterns=[r"language_model\.embedding\..*"])
    assert list(again.freeze_patterns) == [r"language_model\.embedding\..*"]
    fresh = type(provider)(num_layers=2, hidden_size=64, num_attention_heads=4, train_patterns=["x"])
    assert fresh.train_patterns == ["x"]


def test_a_run_config_written_with_the_plugin_loads_without_it(cpu_bridge, tmp_path):
    provider = make_provider("qwen3_vl")
    provider.train_patterns = [r"vision_model\.merger\..*"]
    _, text, _ = _round_trip(provider)
    (tmp_path / "model.yaml").write_text(text)
    script = textwrap.dedent(f"""
        import logging, yaml
        from bridge_freeze_harness.cpu_runtime import import_bridge
        import_bridge()
        from megatron.bridge.utils.instantiate_utils import InstantiationMode, instantiate
        import sys
        assert "bridge_freeze_plugin" not in sys.modules
        loaded = instantiate(yaml.safe_load(open({str(tmp_path / 'model.yaml')!r})), mode=InstantiationMode.LENIENT)
        assert not hasattr(loaded, "train_patterns"), "the plugin must not be loaded here"
        print("LOADED", type(loaded).__name__)
    """)
    env = {"BRIDGE_FREEZE_DISABLE_AUTOLOAD": "1", "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", **_lane_path()}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "LOADED Qwen3VLModelProvider" in done.stdout


# ---- issue 46 item 5: NeMo-RL's conversion cache loads in STRICT mode without the plugin -----------------------

#: The flags each provider class declares itself (Bridge's fields), read from Bridge 0.6.2's source by hand.
DECLARED_FLAGS = {"qwen3_vl": {"freeze_language_model", "freeze_vision_model", "freeze_vision_projection"},
                  "qwen2_audio": {"freeze_language_model", "freeze_audio_model", "freeze_audio_projection"}}
PLUGIN_KEYS = {"train_patterns", "freeze_patterns", "full_recompute_policy", "vision_recompute_policy",
               "audit_steps", "audit_strict", "freeze_language_model", "freeze_vision_model",
               "freeze_vision_projection", "freeze_audio_model", "freeze_audio_projection"}


def _conversion_cache(provider, folder) -> str:
    """The run_config.yaml of NeMo-RL's conversion: the container Bridge's save_megatron_model saves (the model, an
    optimizer and a logger and checkpoint section, nothing else), written with ConfigContainer.to_yaml."""
    from megatron.bridge.training import config as bc

    folder.mkdir(parents=True)
    cfg = bc.ConfigContainer(model=provider, train=None, optimizer=bc.OptimizerConfig(use_distributed_optimizer=False),
                             ddp=None, scheduler=None, dataset=None, logger=bc.LoggerConfig(), tokenizer=None,
                             checkpoint=bc.CheckpointConfig(save=str(folder)), dist=None)
    cfg.to_yaml(str(folder / "run_config.yaml"))
    return str(folder / "run_config.yaml")


def _model_section(path: str) -> dict:
    import yaml

    with open(path) as handle:
        return yaml.safe_load(handle)["model"]


def test_a_conversion_cache_written_with_the_plugin_loads_strictly_without_it(cpu_bridge, tmp_path):
    """The cache of a provider with nothing set holds none of the plugin's fields, only the flags its class declares
    (before: freeze_audio_* on a vision-only provider, the patterns, both recompute policies, the audit's fields),
    and NeMo-RL's own STRICT load (ConfigContainer.from_yaml) takes it in a process without the plugin."""
    paths = {name: _conversion_cache(make_provider(name), tmp_path / name / "iter_0000000") for name in DECLARED_FLAGS}
    for name, path in paths.items():
        assert PLUGIN_KEYS & _model_section(path).keys() == DECLARED_FLAGS[name]
    script = textwrap.dedent(f"""
        import sys
        from bridge_freeze_harness.cpu_runtime import import_bridge
        import_bridge()
        from megatron.bridge.training.config import ConfigContainer
        from megatron.bridge.utils.instantiate_utils import InstantiationMode
        assert "bridge_freeze_plugin.activation" not in sys.modules
        for path in {sorted(paths.values())!r}:
            loaded = ConfigContainer.from_yaml(path, mode=InstantiationMode.STRICT)
            assert not hasattr(loaded.model, "train_patterns"), "the plugin must not be loaded here"
            print("LOADED", type(loaded.model).__name__)
    """)
    env = {"BRIDGE_FREEZE_DISABLE_AUTOLOAD": "1", "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", **_lane_path()}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    loaded = [line for line in done.stdout.splitlines() if line.startswith("LOADED")]
    assert loaded == ["LOADED Qwen2AudioModelProvider", "LOADED Qwen3VLModelProvider"]


def test_what_is_set_is_written_and_a_strict_load_with_the_plugin_gets_it_back(cpu_bridge, tmp_path):
    """A pattern, a policy, the audit off and a flag the class does not declare set true are written (a load that
    dropped them would train another set); what holds its default is not, and STRICT reads the file back."""
    from megatron.bridge.training.config import ConfigContainer
    from megatron.bridge.utils.instantiate_utils import InstantiationMode

    provider = make_provider("qwen3_vl")
    provider.freeze_patterns = [r"vision_model\.patch_embed\..*"]
    provider.full_recompute_policy = "refuse"
    provider.audit_steps = 0
    provider.freeze_audio_model = True  # refused at a build (no audio part), but asked: written, never dropped
    path = _conversion_cache(provider, tmp_path / "iter_0000000")
    section = _model_section(path)
    assert {k: section[k] for k in PLUGIN_KEYS & section.keys()} == {
        "freeze_language_model": False, "freeze_vision_model": False, "freeze_vision_projection": False,
        "freeze_patterns": [r"vision_model\.patch_embed\..*"], "full_recompute_policy": "refuse", "audit_steps": 0,
        "freeze_audio_model": True}
    loaded = ConfigContainer.from_yaml(path, mode=InstantiationMode.STRICT).model
    assert type(loaded) is type(provider)
    assert list(loaded.freeze_patterns) == [r"vision_model\.patch_embed\..*"]
    assert (loaded.full_recompute_policy, loaded.audit_steps, loaded.freeze_audio_model) == ("refuse", 0, True)
    assert (loaded.train_patterns, loaded.vision_recompute_policy, loaded.audit_strict) == ((), None, False)
    assert loaded.freeze_audio_projection is False


def test_deactivate_gives_bridge_its_serialiser_and_loaders_back(cpu_bridge):
    from megatron.bridge.training.utils.config_utils import _ConfigContainerBase
    from megatron.training.config.container import ConfigContainerBase

    def wrapped() -> list[bool]:
        return [hasattr(vars(owner)[name].__func__, "__bridge_freeze_wrapped__") for owner, name in (
            (_ConfigContainerBase, "_convert_value_to_dict"), (ConfigContainerBase, "from_yaml"),
            (ConfigContainerBase, "from_dict"))]

    assert wrapped() == [True, True, True]
    bfp.deactivate()
    try:
        assert wrapped() == [False, False, False]
    finally:
        bfp.activate()
    assert wrapped() == [True, True, True]
