"""Loading a config as written: files that hold no settings, overrides that cannot be read, Hydra's +/++/~.

Each case here was accepted (or misreported) before: an empty, null or scalar file read as "nothing frozen,
valid"; a directory reported as a missing file; an override with an empty key segment silently dropped; an
override's YAML error reported as the file's; a Hydra ``+key`` read as a key named "+key".
"""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from bridge_freeze_plugin import FreezeSelection, InvalidFreezeConfigError
from bridge_freeze_plugin.config import load, parse_override
from bridge_freeze_plugin.config._validation import load_config, load_run, validate_sft_config
from bridge_freeze_plugin.errors import ConfigLoadError

SFT = "strategy: megatron\nmegatron_config:\n  freeze_vision_model: true\n  seed: 1\n"


@pytest.fixture
def sft(tmp_path):
    path = tmp_path / "sft.yaml"
    path.write_text(SFT)
    return path


@pytest.mark.parametrize(("text", "words"), [
    ("", ("is empty", "mapping of settings")),
    ("# nothing but a comment\n\n", ("is empty",)),
    ("null\n", ("holds null",)),
    ("~\n", ("holds null",)),
    ("hello\n", ("holds a str", "'hello'", "not a mapping")),
    ("42\n", ("holds a int",)),
    ("- strategy: megatron\n", ("holds a list", "not a mapping")),
])
def test_a_file_without_a_mapping_is_refused(tmp_path, text, words):
    path = tmp_path / "cfg.yaml"
    path.write_text(text)
    with pytest.raises(ConfigLoadError) as info:
        load_config(path)
    assert str(path) in str(info.value)
    for word in words:
        assert word in str(info.value), str(info.value)
    with pytest.raises(ConfigLoadError):  # and so is every check of it
        load_run(path)


def test_a_directory_is_not_reported_as_missing(tmp_path):
    with pytest.raises(ConfigLoadError, match="is a directory, not a config file"):
        load_config(tmp_path)
    with pytest.raises(ConfigLoadError, match="no such config file"):
        load_config(tmp_path / "missing.yaml")


def test_invalid_yaml_in_the_file_names_the_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("megatron_config: [1\n")
    with pytest.raises(ConfigLoadError, match=r"bad\.yaml is not valid YAML"):
        load_config(path)


@pytest.mark.parametrize("override", [
    "megatron_config..freeze_vision_model=true",
    "megatron_config.=true",
    "=true",
    ".freeze_vision_model=true",
    "megatron_config. .freeze_vision_model=true",
    "+=1",
    "~.a",
])
def test_an_override_with_an_empty_key_segment_is_refused(sft, override):
    with pytest.raises(ConfigLoadError) as info:
        load_config(sft, [override])
    assert "empty key segment" in str(info.value) and repr(override) in str(info.value)


@pytest.mark.parametrize("override", ["megatron_config.freeze_vision_model", "+megatron_config.x"])
def test_an_override_without_a_value_is_refused(sft, override):
    with pytest.raises(ConfigLoadError, match=r"is not of the form dotted\.key=value"):
        load_config(sft, [override])


def test_an_overrides_yaml_error_is_reported_as_the_overrides(sft):
    with pytest.raises(ConfigLoadError) as info:
        load_config(sft, ["megatron_config.freeze_language_model=[true"])
    message = str(info.value)
    assert message.startswith("override 'megatron_config.freeze_language_model=[true'")
    assert "is not valid YAML" in message and "sft.yaml" not in message


def test_a_mapping_valued_override_is_merged_and_checked(sft):
    cfg = load_config(sft, ["megatron_config={freeze_language_model: true}"])
    assert OmegaConf.to_container(cfg.megatron_config) == {
        "freeze_vision_model": True, "seed": 1, "freeze_language_model": True}
    assert validate_sft_config(cfg) == FreezeSelection(freeze_language_model=True, freeze_vision_model=True)
    with pytest.raises(InvalidFreezeConfigError, match=r"did you mean megatron_config\.freeze_vision_projection"):
        validate_sft_config(load_config(sft, ["megatron_config={freeze_vision_projektion: true}"]))


def test_hydra_add_override(sft):
    cfg = load_config(sft, ["+megatron_config.freeze_language_model=true"])
    assert cfg.megatron_config.freeze_language_model is True
    assert "+megatron_config.freeze_language_model" not in OmegaConf.to_container(cfg)
    with pytest.raises(ConfigLoadError) as info:
        load_config(sft, ["+megatron_config.freeze_vision_model=false"])
    assert "already has" in str(info.value) and "++megatron_config.freeze_vision_model=false" in str(info.value)


def test_hydra_force_add_override(sft):
    cfg = load_config(sft, ["++megatron_config.freeze_vision_model=false", "++model.path=/ckpt"])
    assert cfg.megatron_config.freeze_vision_model is False and cfg.model.path == "/ckpt"


def test_hydra_delete_override(sft):
    cfg = load_config(sft, ["~megatron_config.freeze_vision_model"])
    assert OmegaConf.to_container(cfg.megatron_config) == {"seed": 1}
    assert load_config(sft, ["~megatron_config.seed=1"]).megatron_config.keys() == {"freeze_vision_model"}
    with pytest.raises(ConfigLoadError, match="only if it is 2, but it is 1"):
        load_config(sft, ["~megatron_config.seed=2"])
    with pytest.raises(ConfigLoadError, match="which the config does not have"):
        load_config(sft, ["~megatron_config.freeze_language_model"])


def test_deleting_a_key_lets_the_layout_default_stand_in(sft):
    run = load_run(sft, ["~strategy"])
    assert run.settings.run.strategy.value == "megatron"
    assert run.settings.run.strategy.source == "default of the SFT layout"


def test_overrides_are_kept_as_parsed_in_order(sft):
    loaded = load(sft, ["strategy=fsdp", "+model.path=/x", "~megatron_config.seed"])
    assert [(o.operation, o.key, o.value) for o in loaded.overrides] == [
        ("set", "strategy", "fsdp"), ("add", "model.path", "/x"), ("delete", "megatron_config.seed", None)]
    assert parse_override("++a.b=[1, 2]").value == [1, 2]
    assert parse_override("a=True").value is True  # Bridge's Python-style booleans


def test_a_file_read_again_is_the_same_fresh_config_and_a_changed_file_is_read_anew(tmp_path):
    """The reader keeps what an unchanged file read to (a defaults list names the same files over and over): each
    read is a config of its own, and a file written since is read again."""
    import os

    from bridge_freeze_plugin.config._yaml_files import read_yaml_file

    path = tmp_path / "cfg.yaml"
    path.write_text("model:\n  freeze_vision_model: true\n  layers: [1, 2]\n  alias: ${model.layers}\n")
    first = read_yaml_file(path)
    first.model.layers.append(3)
    first.model.freeze_vision_model = False
    second = read_yaml_file(path)
    assert second is not first
    assert OmegaConf.to_container(second, resolve=True) == {
        "model": {"freeze_vision_model": True, "layers": [1, 2], "alias": [1, 2]}}
    stat = path.stat()
    path.write_text("model:\n  freeze_vision_model: false\n")
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # the same time stamp: the size still tells
    assert OmegaConf.to_container(read_yaml_file(path)) == {"model": {"freeze_vision_model": False}}
    path.write_text("model:\n  freeze_vision_model: falsy\n")  # same size, a later time stamp
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert OmegaConf.to_container(read_yaml_file(path)) == {"model": {"freeze_vision_model": "falsy"}}
