"""Config reading, reliability round 3 (issue 22): one test per class of user mistake, built from the class.

Classes: 3 layout mis-detection; 4 unknown per-part LR keys; 5 Bridge ``model.lr_<part>``; 6 a layout default
over a user's value of the wrong type; 7 check-config's summary of patterns and LRs; 8 ``--json`` when reading
fails; 9 user mistakes end as config errors (exit 2); 13 ``_target_`` never imports other code; 14 defaults-list
entries stay in the config's folder; 17 the LoRA-target rule agrees with the real build. Then property-based
tests: random configs and overrides give a valid result or a typed config error, never another exception.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from bridge_freeze_plugin import FreezeSelection, InvalidFreezeConfigError, UnsupportedFreezeFlagError
from bridge_freeze_plugin.cli import main
from bridge_freeze_plugin.config import choose_layout, load, with_layout
from bridge_freeze_plugin.config._validation import load_run, validate_bridge_config, validate_sft_config
from bridge_freeze_plugin.errors import BridgeFreezeError, ConfigLoadError, PartLearningRateError
from bridge_freeze_plugin.optim import LR_KEYS, PartLearningRates, read_part_learning_rates

CONFIGS = Path(__file__).parents[2] / "fixtures" / "configs"
SFT_FILE = CONFIGS / "sft" / "sft_defaults.yaml"
RL_FILE = CONFIGS / "rl_dataclass" / "rl_defaults.yaml"
BRIDGE_FILE = CONFIGS / "bridge" / "run_config.yaml"
POLICY = "trainer.policy.megatron_config"
VISION = FreezeSelection(freeze_vision_model=True)
QWEN3 = "megatron.bridge.models.qwen_vl.qwen3_vl_provider.Qwen3VLModelProvider"
#: what the trainer's SFT/RL and Bridge's ConfigContainer hold at the top (Bridge's sections: config.py)
BRIDGE_SECTIONS = ("optimizer", "checkpoint", "peft", "ddp", "scheduler", "rerun_state_machine",
                   "optimizer_config_override_provider")


def check(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["check-config", *map(str, args)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def write(path: Path, data: object) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False) if not isinstance(data, str) else data)
    return path


def error_of(path, overrides=(), **kwargs) -> str:
    with pytest.raises(InvalidFreezeConfigError) as err:
        load_run(path, list(overrides), **kwargs).validate()
    return str(err.value)


# ---- 3: layout detection weighs all evidence; conflicting evidence is said; flags are never dropped -------


@pytest.mark.parametrize("section", BRIDGE_SECTIONS)
@pytest.mark.parametrize("sft_key", ["strategy", "megatron_config"])
def test_a_bridge_looking_section_does_not_outweigh_the_sft_keys(tmp_path, section, sft_key):
    """Before: an SFT config with an optimizer:/checkpoint: section was read as Bridge: its flags ignored."""
    data = {"model": {"path": "Qwen/Qwen3-VL-4B-Instruct"}, section: {"x": 1},
            "megatron_config": {"freeze_vision_model": True}}
    if sft_key == "strategy":
        data["strategy"] = "megatron"
    path = write(tmp_path / "sft.yaml", data)
    run = load_run(path)
    assert run.layout.name == "sft"
    assert run.validate() == VISION  # the flag is read, not dropped
    assert f"top-level {section}" in run.loaded.layout_reason and "conflicting evidence" in run.loaded.layout_reason
    assert load_run(path, layout="sft").validate() == VISION  # and forcing the SFT layout is accepted
    with pytest.raises(ConfigLoadError, match=r"written in the SFT layout .*not the Megatron-Bridge"):
        load_run(path, layout="bridge")


@pytest.mark.parametrize(("stray", "home"), [
    ("model.freeze_vision_model=true", "megatron_config.freeze_vision_model"),
    ("model.freeze_language_model=false", "megatron_config.freeze_language_model"),
    ("model.train_patterns=[vision_model.merger]", "megatron_config.train_patterns"),
    ("model.lr_vision_projection=0.001", "megatron_config.lr_vision_projection"),
    (f"{POLICY}.freeze_vision_model=true", "megatron_config.freeze_vision_model"),
    ("optimizer_config_override_provider.lr_vision_model=0.001", "megatron_config.lr_vision_model"),
])
def test_a_flag_where_the_detected_layout_does_not_read_it_is_refused_naming_its_place(stray, home):
    """Before: a stray model.freeze_* made an SFT config read as Bridge: its megatron_config flags were ignored."""
    # (a trainer: section decides the RL layout too: the file's layout must then be named)
    forced = "sft" if stray.startswith("trainer.") else None
    message = error_of(SFT_FILE, ["megatron_config.freeze_language_model=true", stray], layout=forced)
    assert f"{stray.partition('=')[0]} is not read in the SFT layout" in message and home in message


@pytest.mark.parametrize(("path", "stray", "layout", "decides"), [
    (RL_FILE, "megatron_config.freeze_vision_model=true", "rl", True),
    (RL_FILE, "model.freeze_vision_model=true", "rl", False),
    (RL_FILE, "optimizer_config_override_provider.lr_vision_model=0.001", "rl", False),
    (BRIDGE_FILE, f"{POLICY}.freeze_vision_model=true", "bridge", True),
    (BRIDGE_FILE, "megatron_config.lr_vision_model=0.001", "bridge", True),
])
def test_flags_of_another_layout_are_never_dropped(path, stray, layout, decides):
    """A key that decides another layout makes the file ambiguous (name the layout); named, or when it is only a
    hint, the key is refused where the chosen layout does not read it."""
    if decides:
        with pytest.raises(ConfigLoadError, match="matches several config layouts"):
            load_run(path, [stray])
    message = error_of(path, [stray], layout=layout)
    title = {"rl": "RL", "bridge": "Megatron-Bridge ConfigContainer"}[layout]
    assert re.search(rf"{re.escape(stray.partition('=')[0])} is not read in the {title} layout", message)


@pytest.mark.parametrize(("path", "stray", "home"), [
    (RL_FILE, "+trainer.critic.megatron_config.freeze_vision_model=true", f"{POLICY}.freeze_vision_model"),
    (RL_FILE, "+trainer.policy.model.train_patterns=[x]", f"{POLICY}.train_patterns"),
    (RL_FILE, "+trainer.ref.megatron_config.lr_vision_model=0.001", "the reference model never trains"),
    (SFT_FILE, "megatron_config.optimizer_config_kwargs.lr_vision_model=0.001", "megatron_config.lr_vision_model"),
    (SFT_FILE, "+model.lora.freeze_vision_projection=true", "megatron_config.freeze_vision_projection"),
    (BRIDGE_FILE, "+optimizer.lr_vision_projection=0.001", "optimizer_config_override_provider"),
    (BRIDGE_FILE, "+peft.lr_adapters=0.001", "optimizer_config_override_provider"),
    (BRIDGE_FILE, "+model.lrVision=0.001", "optimizer_config_override_provider"),
])
def test_a_plugin_key_anywhere_the_layout_does_not_read_it_is_refused(path, stray, home):
    """The same class, deeper: a flag or LR in any section the run does not read (a critic, the optimizer...)."""
    message = error_of(path, [*(["trainer.strategy=megatron"] if path == RL_FILE else []), stray])
    assert stray.lstrip("+").partition("=")[0] in message and home in message


def test_a_section_read_through_an_interpolation_is_not_refused():
    run = load_run(None, ["megatron_config=${base}", "base={freeze_vision_model: true}"])
    assert run.validate() == VISION and run.layout.name == "sft"


@pytest.mark.parametrize("extra", [{"strategy": "megatron"}, {"megatron_config": {"freeze_vision_model": True}},
                                   {"trainer": {"strategy": "megatron"}}])
def test_two_layouts_that_each_decide_are_an_error_that_names_both(tmp_path, extra):
    path = write(tmp_path / "both.yaml", {"model": {"_target_": QWEN3, "freeze_vision_model": True}, **extra})
    with pytest.raises(ConfigLoadError, match=r"matches several config layouts, and its evidence conflicts .*"
                                              r"Megatron-Bridge ConfigContainer: model\._target_"):
        load_run(path)


def test_the_conflict_is_said_in_check_configs_output(capsys, tmp_path):
    path = write(tmp_path / "sft.yaml", {"strategy": "megatron", "checkpoint": {"save": "/x"},
                                         "megatron_config": {"freeze_vision_model": True}})
    code, out, _ = check(capsys, path, "--json")
    doc = json.loads(out)
    assert code == 0 and doc["layout"] == "sft" and doc["selection"]["freeze_vision_model"] is True
    assert "conflicting evidence" in doc["layout_reason"] and "checkpoint" in doc["layout_reason"]


# ---- 4: a key shaped like a per-part LR that names no part is refused, with a suggestion ---------------------


UNKNOWN_LR_KEYS = {
    "lr_vision": "lr_vision_model", "lr_projector": "lr_vision_projection", "lr_llm": "lr_language_model",
    "vision_lr": "lr_vision_model", "min_lr_vision": "min_lr_vision_model", "lr_lora": "lr_adapters",
    "LR_vision_model": "lr_vision_model", "learning_rate_language_model": "lr_language_model",
    "projector_learning_rate": "lr_vision_projection", "lr_vison_model": "lr_vision_model", "lr_foo": None,
    "lrVision": "lr_vision_model", "minLrProjector": "min_lr_vision_projection", "llmLr": "lr_language_model",
}


@pytest.mark.parametrize("key", list(UNKNOWN_LR_KEYS))
@pytest.mark.parametrize("where", ["api", "PartLearningRates.of", "megatron_config", POLICY,
                                   "optimizer_config_override_provider"])
def test_unknown_lr_keys_are_refused_everywhere_they_are_read(key, where):
    """Before: lr_vision, lr_projector, lr_llm... passed silently (only close misspellings were caught)."""
    guess = UNKNOWN_LR_KEYS[key]
    with pytest.raises(PartLearningRateError) as err:
        if where == "api":
            read_part_learning_rates({key: 1e-3}, where="cfg")
        elif where == "PartLearningRates.of":
            PartLearningRates.of(**{key: 1e-3})
        elif where == "optimizer_config_override_provider":
            load_run(BRIDGE_FILE, [f"{where}._target_=bridge_freeze_plugin.optim.bridge.PartLROverrideProvider",
                                   f"+{where}.{key}=0.001"])
        else:
            load_run(None, ["trainer.strategy=megatron" if where == POLICY else "strategy=megatron",
                            f"{where}.{key}=0.001"])
    message = str(err.value)
    assert f"{key} is not a per-part learning rate key" in message and "lr_vision_projection" in message
    if guess is not None:
        assert f"did you mean {'' if where.startswith(('api', 'Part')) else where + '.'}" in message
        assert message.split("did you mean ")[1].split("?")[0].endswith(guess)
    else:
        assert "did you mean" not in message


def test_every_real_lr_key_is_still_read_and_the_global_ones_are_not_refused():
    rates = read_part_learning_rates({key: 1e-4 for key in LR_KEYS}, lora=True)
    assert rates.as_dict() == {key: 1e-4 for key in LR_KEYS}
    assert not read_part_learning_rates({"lr": 1e-4, "min_lr": 0.0, "unrelated_key": 1})


# ---- 5: Bridge layout: only LRs the run applies (on the optimizer override provider) are accepted -----------


@pytest.mark.parametrize("key", LR_KEYS)
def test_bridge_lr_on_the_model_provider_is_refused_saying_where_it_goes(key):
    """Before: model.lr_<part> passed check-config, though no Bridge run applies a provider field of that name."""
    message = error_of(BRIDGE_FILE, [f"+model.{key}=0.001", "peft={_target_: megatron.bridge.peft.lora.LoRA}"])
    assert f"model.{key} is not read in the Megatron-Bridge ConfigContainer layout" in message
    assert "optimizer_config_override_provider" in message and "PartLROverrideProvider" in message


def test_bridge_lrs_on_the_override_provider_as_bridge_writes_it_are_read(cpu_bridge, tmp_path):
    from megatron.training.config.container import ConfigContainerBase

    from bridge_freeze_plugin.optim import PartLROverrideProvider

    # How Bridge serialises the provider into run_config.yaml: megatron's own ConfigContainer conversion.
    written = ConfigContainerBase._convert_value_to_dict(PartLROverrideProvider(lr_vision_projection=1e-3))
    data = yaml.safe_load(BRIDGE_FILE.read_text())
    data["optimizer_config_override_provider"] = written
    path = write(tmp_path / "run_config.yaml", data)
    run = load_run(path, ["model.freeze_vision_model=True"])
    assert run.validate() == VISION
    assert run.settings.rates.values.as_dict() == {"lr_vision_projection": 1e-3}
    # another provider class applies no per-part LR: refused, naming the _target_ to set
    other = {**written, "_target_": "megatron.bridge.training.config.OptimizerConfigOverrideProvider"}
    path = write(tmp_path / "other.yaml", {**data, "optimizer_config_override_provider": other})
    with pytest.raises(PartLearningRateError, match=r"_target_ is megatron\.bridge.*applies no per-part"):
        load_run(path)
    # an LR for a part the flags freeze names the flag where it is (model.), not the LR's section
    with pytest.raises(PartLearningRateError, match=re.escape("(model.freeze_vision_projection=true)")):
        load_run(tmp_path / "run_config.yaml", ["model.freeze_vision_projection=True"])


# ---- 6: a layout default never overwrites what the user wrote --------------------------------------------


@pytest.mark.parametrize(("overrides", "key"), [
    (["megatron_config=5"], "megatron_config"),
    (["megatron_config=[1, 2]"], "megatron_config"),
    (["megatron_config=oops"], "megatron_config"),
    (["megatron_config.transformer_config_kwargs=5", "megatron_config.freeze_vision_model=true"],
     "megatron_config.transformer_config_kwargs"),
    (["model=5", "megatron_config.freeze_vision_model=true"], "model"),
    (["model.lora=[8]", "megatron_config.freeze_vision_model=true"], "model.lora"),
    (["trainer=5"], "trainer"),
    (["trainer.policy=[1]"], "trainer.policy"),
    (["trainer.algorithm=5", "trainer.policy.language_model_only=true"], "trainer.algorithm"),
    (["trainer.strategy=megatron", "generator.inference_engine=vllm", "trainer.policy.language_model_only=true"],
     "generator.inference_engine"),
])
def test_a_layout_default_never_overwrites_a_value_of_the_wrong_type(overrides, key):
    """Before: megatron_config=5 was replaced by the default's mapping and the config passed."""
    raw = load(None, overrides)
    written = OmegaConf.to_container(raw.cfg)
    for part in key.split("."):
        written = written[part]
    layout, reason = choose_layout(raw)
    filled = with_layout(raw, layout, reason)
    assert OmegaConf.to_container(filled.cfg).get(key.split(".")[0]) is not None
    assert OmegaConf.select(filled.cfg, key) == written  # the user's value stays
    assert not any(k.startswith(key + ".") for k in filled.defaulted)
    with pytest.raises(InvalidFreezeConfigError, match=rf"{re.escape(key)} must be a mapping of settings"):
        load_run(None, overrides).validate()


# ---- 7: check-config shows the patterns and the per-part LRs, and what they mean -------------------------


@pytest.mark.parametrize(("overrides", "per_tensor", "whole_trained", "whole_frozen"), [
    (["megatron_config.freeze_patterns=['.*']"], ["language_model", "vision_model", "vision_projection"], [], []),
    (["megatron_config.freeze_vision_model=true", "megatron_config.freeze_patterns=[language_model.embedding]"],
     ["language_model", "vision_projection"], [], ["vision_model"]),
    (["megatron_config.freeze_language_model=true", "megatron_config.freeze_vision_model=true",
      "megatron_config.freeze_vision_projection=true", "megatron_config.train_patterns=[language_model.output_layer]"],
     ["language_model"], [], ["vision_model", "vision_projection"]),  # the pattern names no vision module
    (["megatron_config.freeze_language_model=true", "megatron_config.freeze_vision_model=true",
      "megatron_config.freeze_vision_projection=true", "megatron_config.train_patterns=['.*norm.*']"],
     ["language_model", "vision_model", "vision_projection"], [], []),
    (["megatron_config.freeze_vision_model=true", "megatron_config.train_patterns=[vision_model.decoder.layers.1]"],
     ["vision_model"], ["language_model", "vision_projection"], []),
])
def test_check_config_never_says_a_part_trains_whole_when_a_pattern_decides(capsys, overrides, per_tensor,
                                                                           whole_trained, whole_frozen):
    """Before: with freeze_patterns: ['.*'] check-config said every part trains, and listed no pattern."""
    code, out, _ = check(capsys, "--json", *overrides)
    doc = json.loads(out)
    assert code == 0, doc["error"]
    assert sorted(doc["pattern_parts"]) == per_tensor
    assert doc["trained_parts"] == whole_trained and doc["frozen_parts"] == whole_frozen
    for key, values in doc["patterns"].items():
        assert doc["settings"][f"megatron_config.{key}"]["value"] == values
    code, out, _ = check(capsys, *overrides)
    assert code == 0
    assert "decided per tensor by the patterns" in out and "patterns (megatron_config): " in out
    trains_line = next(line for line in out.splitlines() if line.startswith("trains: "))
    for part in per_tensor:
        assert f"{part}: " in trains_line
    assert "trains: language_model, vision_model, vision_projection;" not in out


@pytest.mark.parametrize(("args", "key", "section"), [
    (["megatron_config.lr_vision_projection=1e-3"], "lr_vision_projection", "megatron_config"),
    (["megatron_config.lr_language_model=0.0", "megatron_config.min_lr_language_model=0.0"],
     "lr_language_model", "megatron_config"),
    (["trainer.strategy=megatron", f"{POLICY}.lr_vision_model=1e-5"], "lr_vision_model", POLICY),
    ([BRIDGE_FILE, "+optimizer_config_override_provider={_target_: "
      "bridge_freeze_plugin.optim.bridge.PartLROverrideProvider, lr_vision_projection: 0.002}"],
     "lr_vision_projection", "optimizer_config_override_provider"),
])
def test_check_config_lists_every_per_part_lr_with_its_source(capsys, args, key, section):
    code, out, _ = check(capsys, "--json", *args)
    doc = json.loads(out)
    assert code == 0, doc["error"]
    row = doc["settings"][f"{section}.{key}"]
    assert row["source"].startswith("override") and isinstance(row["value"], float)
    part = key.removeprefix("lr_")
    assert doc["learning_rates"][part]["lr"] == row["value"]
    code, out, _ = check(capsys, *args)
    assert f"learning rates ({section}): {part}: lr {row['value']:g}" in out
    assert f"  {section}.{key} = {json.dumps(row['value'])}  (override" in out


# ---- 8: --json prints its document when the file fails while being read ---------------------------------


def _failing_inputs(tmp_path: Path) -> dict[str, list[str]]:
    (tmp_path / "dir").mkdir()
    deep = "x: " + "[" * 60 + "]" * 60 + "\n"
    return {
        "missing file": [str(tmp_path / "nope.yaml")],
        "directory": [str(tmp_path / "dir")],
        "not YAML": [str(write(tmp_path / "bad.yaml", "a: [1,\n"))],
        "empty": [str(write(tmp_path / "empty.yaml", ""))],
        "a list": [str(write(tmp_path / "list.yaml", "- 1\n"))],
        "too deep": [str(write(tmp_path / "deep.yaml", "strategy: megatron\n" + deep))],
        "escaping defaults": [str(write(tmp_path / "esc.yaml", "defaults:\n  - ../x\nstrategy: megatron\n"))],
        "no layout": [str(write(tmp_path / "odd.yaml", "epochs: 3\n"))],
        "bad override": ["megatron_config..x=1"],
        "override below a scalar": ["megatron_config=5", "megatron_config.freeze_vision_model=true"],
        "--rl and --layout disagree": ["--rl", "--layout", "sft", "strategy=megatron"],
        "layout conflict": ["strategy=megatron", "trainer.strategy=megatron"],
    }


def test_check_config_json_is_printed_whatever_fails(capsys, tmp_path):
    """Before: --json printed nothing when the file failed while being read (docs/cli.md promises JSON)."""
    for what, args in _failing_inputs(tmp_path).items():
        code, out, err = check(capsys, "--json", *args)
        assert code == 2, (what, err)
        doc = json.loads(out)
        assert doc["valid"] is False and doc["error"] and doc["error_type"], what
        assert err.strip() == f"bridge-freeze check-config: error: {doc['error']}", what
        assert doc["schema_version"] == 1 and doc["selection"] is None


def test_check_config_json_keys_are_exactly_the_documented_ones(capsys, tmp_path):
    text = (Path(__file__).resolve().parents[3] / "docs" / "cli.md").read_text()
    table = text.split("### `check-config --json`", 1)[1].split("\n#", 1)[0]
    documented = set(re.findall(r"^\| `([^`]+)` \|", table, flags=re.MULTILINE))
    assert len(documented) > 15
    flag = "megatron_config.freeze_vision_model=true"
    for args in ([flag], ["strategy=fsdp", flag], [str(tmp_path / "missing.yaml")]):  # valid, invalid, unread
        _, out, _ = check(capsys, "--json", *args)
        assert set(json.loads(out)) == documented, args


# ---- 9: a user's mistake is a config error (exit 2), never an unexpected error (exit 1) ------------------


def _mistakes(tmp_path: Path) -> dict[str, list[str]]:
    nested = "{a: " * 80 + "1" + "}" * 80
    bomb = ", ".join(f"&{c} [" + ", ".join([f"*{p}"] * 9) + "]" for p, c in zip("abcdefg", "bcdefgh", strict=True))
    return {
        "deep file": [str(write(tmp_path / "deep.yaml", "strategy: megatron\nmegatron_config:\n  x: " + nested))],
        "very deep file": [str(write(tmp_path / "deeper.yaml", "x: " + "[" * 3000 + "]" * 3000))],
        "deep override value": [f"megatron_config.x={nested}"],
        "deep override key": [".".join(["a"] * 400) + "=1"],
        "env of an unset variable, strategy": ["strategy=${oc.env:BRIDGE_FREEZE_UNSET_VAR}",
                                               "megatron_config.freeze_vision_model=true"],
        "env of an unset variable, a flag": ["megatron_config.freeze_vision_model=${oc.env:BRIDGE_FREEZE_UNSET_VAR}"],
        "env of an unset variable, a section": ["megatron_config=${oc.env:BRIDGE_FREEZE_UNSET_VAR}"],
        "env of an unset variable, lora rank": ["model.lora.rank=${oc.env:BRIDGE_FREEZE_UNSET_VAR}",
                                                "megatron_config.freeze_vision_model=true"],
        "interpolation of a missing key": ["megatron_config.freeze_vision_model=${nowhere.at_all}"],
        "interpolation loop": ["megatron_config.x=${a}", "a=${megatron_config.x}"],
        "list for megatron_config": ["megatron_config=[1, 2]"],
        "list for model": ["model=[1, 2]", "megatron_config.freeze_vision_model=true"],
        "list for model.lora": ["model.lora=[8]", "megatron_config.freeze_vision_model=true"],
        "list for trainer.policy": ["trainer.policy=[1]"],
        "list for the Bridge lr section": ["model._target_=" + QWEN3, "optimizer_config_override_provider=[1]"],
        "scalar lora targets": ["model.lora.rank=8", "model.lora.target_modules=5",
                                "megatron_config.freeze_vision_model=true"],
        "repetition count past the regex limit": ["megatron_config.train_patterns=['a{4294967296}']"],
        "huge repetition count": ["megatron_config.freeze_patterns=['x{99999999999999999999}']"],
        "groups nested too deep": ["megatron_config.freeze_patterns=['" + "(" * 3000 + "a" + ")" * 3000 + "']"],
        "alias bomb in an override": [f"megatron_config.x=[&a [1, 1, 1, 1, 1, 1, 1, 1, 1], {bomb}]"],
        "alias bomb in a file": [str(write(tmp_path / "bomb.yaml", f"strategy: megatron\nx: [&a [1, 1], {bomb}]\n"))],
        "self-referential alias": [str(write(tmp_path / "self.yaml", "strategy: megatron\nx: &a [1, *a]\n"))],
        "argument too long for a file name": ["megatron_config.x=" + "y" * 5000],
        "a device for a file": [os.devnull],
        "a pipe for a file": [str(_fifo(tmp_path / "pipe.yaml"))],
        "a file past the size limit": [str(_sparse(tmp_path / "huge.yaml"))],
        "a NUL byte in the file name": ["sft\x00.yaml"],
    }


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def _sparse(path: Path) -> Path:
    with path.open("wb") as file:
        file.truncate(64 * 1024 * 1024)  # no data written: the size alone is refused
    return path


def test_every_user_mistake_exits_2_with_one_line(capsys, tmp_path):
    """Before: deep nesting, ${oc.env:UNSET}, a list where a mapping belongs and huge repetition counts ended
    as "unexpected error" (exit 1)."""
    for what, args in _mistakes(tmp_path).items():
        code, _, err = check(capsys, *args)
        assert "unexpected error" not in err, (what, err)
        assert code in (0, 2), what
        if code == 2:
            assert err.startswith("bridge-freeze check-config: error: ") and err.count("\n") == 1, what
            assert len(err) < 1200, what  # one readable line, not a dump of the nested value


# ---- 13: a config's _target_ never makes check-config import other code ----------------------------------


@pytest.fixture
def planted(tmp_path, monkeypatch):
    """A module next to the config, on sys.path (as under ``python -m`` / PYTHONPATH=.): importing it prints to
    stdout and leaves a marker file."""
    marker = tmp_path / "imported.txt"
    for name in ("evil_provider", "evil_pkg"):
        sys.modules.pop(name, None)
    source = f"print('IMPORTED'); open({str(marker)!r}, 'w').write('x')\nclass Provider: pass\n"
    (tmp_path / "evil_provider.py").write_text(source)
    (tmp_path / "evil_pkg").mkdir()
    (tmp_path / "evil_pkg" / "__init__.py").write_text(source)
    (tmp_path / "evil_pkg" / "sub.py").write_text("class Provider: pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return marker


def _generated_name(path: str) -> str:
    from bridge_freeze_plugin.mixins import encode_class_path as _encode

    return f"bridge_freeze_plugin.activation.freezable.FreezableProvider_x{_encode(path)}"


@pytest.mark.parametrize("target", [
    "evil_provider.Provider", "evil_pkg.sub.Provider", "evil_pkg.Provider",
    _generated_name("evil_provider:Provider"),
    "megatron.bridge.models._no_such_private.Provider",
])
def test_check_config_never_imports_a_target_outside_bridge(capsys, planted, target):
    """Before: check-config imported the module a config's model._target_ named (running it, corrupting --json)."""
    code, out, _ = check(capsys, "--json", f"model._target_={target}", "model.freeze_vision_model=True")
    assert not planted.exists() and "IMPORTED" not in out
    assert not any(name.startswith("evil_") for name in sys.modules)
    doc = json.loads(out)  # stdout is the document only
    assert code == 2 and doc["error_type"] == "UnsupportedFreezeFlagError" and "--family" in doc["error"]
    # naming the family (compared by name) is the way on
    code, out, _ = check(capsys, "--json", f"model._target_={target}", "model.freeze_vision_model=True",
                         "--family", "qwen3_vl")
    assert code == 0 and json.loads(out)["family"] == "qwen3_vl" and not planted.exists()


def test_bridge_and_generated_targets_are_still_recognised_by_name():
    from bridge_freeze_plugin.config._family import family_from_target
    from bridge_freeze_plugin.mixins import generated_class_name as class_name

    class Qwen3VLModelProvider:  # named and placed as Bridge's class, to ask for its generated name only
        pass

    Qwen3VLModelProvider.__module__ = QWEN3.rpartition(".")[0]
    Qwen3VLModelProvider.__qualname__ = "Qwen3VLModelProvider"
    generated = f"bridge_freeze_plugin.activation.freezable.{class_name(Qwen3VLModelProvider)}"
    assert family_from_target(QWEN3).name == "qwen3_vl"
    assert family_from_target(generated).name == "qwen3_vl"
    cfg = {"model": {"_target_": generated, "freeze_vision_model": True}, "peft": None}
    assert validate_bridge_config(cfg) == VISION


# ---- 14: a defaults-list entry stays inside the config's folder -------------------------------------------


@pytest.mark.parametrize("entry", [
    "- ../outside", "- ../../outside", "- sub/../../outside", "- group: ../outside", "- group@_global_: ../../x",
    "- /../outside", "- ./outside", "- a//b", "- ~/outside", "- 'a\\\\b'", "- 'c:/x'",
])
def test_a_defaults_entry_cannot_leave_the_config_folder(tmp_path, entry):
    """Before: ../x was read from outside the config's folder (and absolute paths, then crash)."""
    (tmp_path / "outside.yaml").write_text("stolen: true\n")
    folder = tmp_path / "configs" / "run"
    folder.mkdir(parents=True)
    path = write(folder / "sft.yaml", f"defaults:\n  {entry}\nstrategy: megatron\n")
    with pytest.raises(ConfigLoadError) as err:
        load_run(path)
    assert "\n" not in str(err.value) and "leaves the config's folder" in str(err.value)


def test_an_absolute_entry_is_the_config_folder_not_the_file_system(tmp_path):
    outside = tmp_path / "outside.yaml"
    outside.write_text("stolen: true\n")
    folder = tmp_path / "configs"
    folder.mkdir()
    path = write(folder / "sft.yaml", f"defaults:\n  - {outside.with_suffix('')}\nstrategy: megatron\n")
    with pytest.raises(ConfigLoadError, match=r"does not exist .*a leading '/' is the config's folder"):
        load_run(path)
    # Hydra's absolute group path: /group: option is the folder's group/option.yaml
    (folder / "extra").mkdir()
    (folder / "extra" / "a.yaml").write_text("seed: 7\n")
    path = write(folder / "ok.yaml", "defaults:\n  - /extra@_global_: a\nstrategy: megatron\n")
    assert load_run(path).loaded.cfg.seed == 7


# ---- 17: the LoRA-target rule agrees with the real build -------------------------------------------------

#: targets in Bridge's wildcard syntax, on Qwen3-VL (the projection lives inside vision_model)
TARGETS = [
    "vision_model.*linear_qkv", "vision_model.*linear_fc1", "vision_model.decoder.*linear_fc2",
    "vision_model.decoder.layers.*.self_attention.linear_qkv", "vision_model.merger.linear_fc*", "vision_model.*",
    "language_model.*linear_qkv", "language_model.decoder.layers.0.self_attention.linear_qkv", "linear_proj",
]
#: the full-rank parts differ in each (LoRA with a partial selection: the parts whose flag is off train at full rank)
SELECTIONS = [
    FreezeSelection(freeze_language_model=True, freeze_vision_model=True),  # the projection at full rank
    FreezeSelection(freeze_language_model=True, freeze_vision_projection=True),  # the vision encoder
    FreezeSelection(freeze_vision_model=True, freeze_vision_projection=True),  # the language model
]


def _build(selection: FreezeSelection, target: str) -> str:
    """The real build with Bridge's LoRA: ``ok``, ``overlap`` (LoraOverlapError) or ``fails`` (Bridge's LoRA
    cannot wrap what the target matches: ``vision_model.*`` reaches norms too)."""
    from megatron.bridge.peft.lora import LoRA

    from bridge_freeze_harness.tiny import build_tiny_chunks, make_provider
    from bridge_freeze_plugin import LoraOverlapError, make_freezable

    provider = make_freezable(make_provider("qwen3_vl"), selection)
    provider.register_pre_wrap_hook(LoRA(target_modules=[target], dim=4, alpha=8))
    try:
        build_tiny_chunks("qwen3_vl", provider=provider)
    except LoraOverlapError:
        return "overlap"
    except Exception:  # noqa: BLE001 - any other failure: the build does not accept it either
        return "fails"
    return "ok"


def _config_refuses(selection: FreezeSelection, target: str) -> bool:
    flags = [f"megatron_config.{k}={'true' if v else 'false'}" for k, v in selection.as_dict().items()]
    try:
        load_run(None, [*flags, "model.lora.rank=8", f"model.lora.target_modules=['{target}']"],
                 family="qwen3_vl").validate()
    except InvalidFreezeConfigError as exc:
        assert "target_modules" in str(exc)
        return True
    return False


def test_the_lora_target_rule_never_refuses_what_the_build_accepts(cpu_bridge):
    """Before: check-config refused vision_model.*linear_qkv (no adapter lands in the merger) that plan builds."""
    verdicts = {}
    for selection in SELECTIONS:
        for target in TARGETS:
            verdicts[selection.describe(), target] = config, build = (_config_refuses(selection, target),
                                                                      _build(selection, target))
            assert not config or build != "ok", (selection.describe(), target)
    projection, encoder, language = (s.describe() for s in SELECTIONS)
    assert verdicts[projection, "vision_model.*linear_qkv"] == (False, "ok")  # the example
    assert verdicts[encoder, "vision_model.merger.linear_fc*"] == (False, "ok")
    # targets certain to land in a full-rank part are refused before the build, as the build refuses them
    for key in [(projection, "vision_model.merger.linear_fc*"), (encoder,
                "vision_model.decoder.layers.*.self_attention.linear_qkv"), (language, "language_model.*linear_qkv"),
                (language, "language_model.decoder.layers.0.self_attention.linear_qkv")]:
        assert verdicts[key] == (True, "overlap"), key
    assert verdicts[projection, "vision_model.*"][0] is True


# ---- property-based: any config, any override: a valid result or a typed config error -------------------

_KEYS = st.sampled_from([
    "strategy", "megatron_config", "model", "trainer", "policy", "ref", "lora", "rank", "path", "_target_",
    "freeze_vision_model", "freeze_language_model", "freeze_patterns", "train_patterns", "lr_vision_model",
    "lr_vision", "min_lr_adapters", "peft", "dim", "optimizer", "checkpoint", "generator", "language_model_only",
    "transformer_config_kwargs", "recompute_granularity", "optimizer_config_override_provider", "x",
])
_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 10**12), st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["megatron", "fsdp", "full", "selective", "${oc.env:BRIDGE_FREEZE_UNSET_VAR}", "${model}",
                     "${nowhere}", "???", ".*", "(", "a{4294967296}", QWEN3, "evil_provider.Provider",
                     "bridge_freeze_plugin.optim.bridge.PartLROverrideProvider", "linear_qkv",
                     "vision_model.*linear_qkv"]),
    st.text(max_size=8),
)
_VALUES = st.recursive(_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(_KEYS, inner, max_size=4)), max_leaves=12)
_CONFIGS = st.dictionaries(_KEYS, _VALUES, max_size=5)
_OVERRIDE_KEYS = st.lists(_KEYS, min_size=1, max_size=5).map(".".join)
_OVERRIDE_VALUES = st.one_of(
    _SCALARS.map(lambda v: json.dumps(v) if not isinstance(v, str) else v),
    st.sampled_from(["[1, 2]", "{a: 1}", "[&a [1, 1], [*a, *a]]", "{a: {b: {c: 1}}}", "[", "'x'", "[.*]"]),
)
_OVERRIDES = st.lists(st.tuples(st.sampled_from(["", "+", "++", "~"]), _OVERRIDE_KEYS, _OVERRIDE_VALUES).map(
    lambda t: f"{t[0]}{t[1]}" if t[0] == "~" else f"{t[0]}{t[1]}={t[2]}"), max_size=4)
_TYPED = (InvalidFreezeConfigError, UnsupportedFreezeFlagError, BridgeFreezeError)


@settings(max_examples=80, deadline=2000, suppress_health_check=[HealthCheck.too_slow])
@given(data=_CONFIGS, overrides=_OVERRIDES, layout=st.sampled_from([None, "sft", "rl", "bridge"]))
def test_any_config_reads_to_a_result_or_a_typed_config_error(data, overrides, layout):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "cfg.yaml"
        path.write_text(yaml.safe_dump(data))
        try:
            run = load_run(path, overrides, layout=layout)
            assert isinstance(run.validate(), FreezeSelection)
            run.adjustments()
        except _TYPED:
            pass


@settings(max_examples=50, deadline=2000, suppress_health_check=[HealthCheck.too_slow])
@given(data=_CONFIGS)
def test_the_api_on_any_mapping_gives_a_result_or_a_typed_config_error(data):
    for validate in (validate_sft_config, validate_bridge_config):
        try:
            assert isinstance(validate(data), FreezeSelection)
        except _TYPED:
            pass


@settings(max_examples=60, deadline=3000,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=_CONFIGS, overrides=_OVERRIDES)
def test_check_config_on_any_input_exits_0_or_2_and_json_always_parses(capsys, data, overrides):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "cfg.yaml"
        path.write_text(yaml.safe_dump(data))
        code, out, err = check(capsys, "--json", path, *overrides)
    assert code in (0, 2), err
    doc = json.loads(out)
    assert doc["valid"] is (code == 0)
