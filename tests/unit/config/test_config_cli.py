"""``bridge-freeze check-config`` on the inputs users really give it (in-process, through the CLI's ``main``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bridge_freeze_plugin.cli import main

CONFIGS = Path(__file__).parents[2] / "fixtures" / "configs"
SFT = CONFIGS / "sft" / "sft_defaults.yaml"
RL = CONFIGS / "rl_dataclass" / "rl_defaults.yaml"
RL_LEGACY = CONFIGS / "rl_legacy" / "ppo_base.yaml"
BRIDGE = CONFIGS / "bridge" / "run_config.yaml"
POLICY = "trainer.policy.megatron_config"


def check(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["check-config", *map(str, args)])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize(("text", "words"), [
    ("", "is empty"), ("null\n", "holds null"), ("hello\n", "holds a str"), ("- a\n", "holds a list"),
])
def test_a_file_without_settings_is_not_valid(tmp_path, capsys, text, words):
    path = tmp_path / "cfg.yaml"
    path.write_text(text)
    code, out, err = check(capsys, path)
    assert code == 2 and "OK: valid" not in out
    assert err.startswith("bridge-freeze check-config: error: ") and words in err


def test_a_directory_is_named_as_one(tmp_path, capsys):
    code, _, err = check(capsys, tmp_path)
    assert code == 2 and "is a directory, not a config file" in err and "no such config file" not in err


@pytest.mark.parametrize("override", ["megatron_config..freeze_vision_model=true", "a.=1", ".a=1"])
def test_an_override_with_an_empty_segment_is_refused(capsys, override):
    code, out, err = check(capsys, SFT, override)
    assert code == 2 and "empty key segment" in err and "OK: valid" not in out


def test_an_overrides_yaml_error_is_the_overrides(capsys):
    code, _, err = check(capsys, SFT, "megatron_config.freeze_vision_model=[true")
    assert code == 2 and "override 'megatron_config.freeze_vision_model=[true'" in err
    assert "cannot load" not in err


def test_overrides_without_a_file(capsys):
    code, out, _ = check(capsys, "megatron_config.freeze_vision_model=true")
    assert code == 0, out
    assert "config: no file" in out and "SFT layout" in out
    assert "  strategy = megatron  (default of the SFT layout)" in out
    assert out.rstrip().endswith("OK: valid")
    code, _, err = check(capsys, f"{POLICY}.freeze_vision_model=true")
    assert code == 2 and "trainer.strategy=fsdp (default of the RL layout)" in err


def test_every_applied_override_is_echoed_with_its_source(capsys):
    code, out, _ = check(capsys, RL_LEGACY, f"+{POLICY}.freeze_vision_model=true", "~trainer.algorithm.use_kl_loss")
    assert code == 0, out
    assert f"override: +{POLICY}.freeze_vision_model=true (adds {POLICY}.freeze_vision_model)" in out
    assert "override: ~trainer.algorithm.use_kl_loss (deletes trainer.algorithm.use_kl_loss)" in out
    assert "defaults list: megatron_config/policy.yaml, megatron_config/ref.yaml" in out
    assert (f"  {POLICY}.transformer_config_kwargs.recompute_granularity = full  "
            "(ppo_base.yaml's defaults list > megatron_config/policy.yaml)") in out
    assert "trains: language_model, vision_projection; frozen: vision_model" in out


def test_the_layout_is_detected_and_a_forced_one_must_agree(capsys):
    code, out, _ = check(capsys, RL, "--json", f"{POLICY}.freeze_vision_model=true", "trainer.strategy=megatron")
    doc = json.loads(out)
    assert code == 0 and doc["layout"] == "rl" and doc["selection"]["freeze_vision_model"] is True
    assert doc["settings"]["trainer.strategy"] == {"value": "megatron",
                                                  "source": "override 'trainer.strategy=megatron'"}
    code, _, err = check(capsys, SFT, "--rl")
    assert code == 2 and "written in the SFT layout" in err
    code, _, err = check(capsys, SFT, "--rl", "--layout", "sft")
    assert code == 2 and "disagree" in err


def test_bridge_run_config(capsys):
    code, out, _ = check(capsys, BRIDGE, "model.freeze_vision_model=True")
    assert code == 0, out
    assert "Megatron-Bridge ConfigContainer layout" in out
    assert "family: qwen3_vl (from model._target_ (the provider class))" in out
    # (run_config.yaml writes recompute_method / _num_layers null: megatron-core needs both for full recompute)
    code, out, _ = check(capsys, BRIDGE, "model.freeze_vision_model=True", "model.recompute_granularity=full",
                         "model.recompute_method=uniform", "model.recompute_num_layers=1")
    assert code == 0, out  # adjusted when the model is built, not refused
    assert "adjusted when the model is built: model.recompute_granularity=full" in out


def test_a_lora_config_whose_targets_reach_no_hf_tower_imports_no_model_code():
    """The plain-Linear rule tries the installed Bridge's own LoRA (it imports Bridge: seconds) only for a target
    that reaches a family's plain torch.nn.Linear modules: a LoRA on the language model answers at once."""
    import subprocess
    import sys

    code = (
        "import sys\nfrom bridge_freeze_plugin.cli import main\n"
        "code = main(['check-config', '--layout', 'bridge', '--family', 'qwen25_vl', "
        "'model.freeze_language_model=true', 'model.freeze_vision_model=true', "
        "'peft._target_=megatron.bridge.peft.lora.LoRA', \"peft.target_modules=['language_model.*linear_qkv']\"])\n"
        "print(code, sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'megatron', 'transformers')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "0 []"
