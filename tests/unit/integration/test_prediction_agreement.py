"""check-config predicts the plugin's build, on every layout and every family with a tiny config (issue 35 item 2).

For each tiny family, each trainer layout's fixture gets a case, check-config predicts what trains, and the same
settings are built through the layout's real path with the plugin active; the parts with a trainable tensor (named
by the tests' own table, ``tests/unit/_family_parts.py``, never by the plugin) must be the predicted ones:

- SFT / RL: the trainer writes every flag of its section to the provider, then builds it;
- Bridge: the provider as Bridge saves it (``ConfigContainer.to_yaml``, the ``run_config.yaml``) is read back
  with Bridge's own ``load_model_config`` (``instantiate``) and built;
- NeMo-RL, in the order its worker sets up (nemo_rl/models/megatron/setup.py and community_import.py): the
  conversion (a fresh provider, the keys ``iter_vlm_config_overrides`` copies, ``provide_distributed_model(
  wrap_with_ddp=False)``, Bridge's save into ``<$NRL_MEGATRON_CHECKPOINT_DIR>/<model>/iter_0000000``), then
  ``load_model_config``, ``model_overrides`` merged with ``dataclasses.replace``, the same keys again, and the
  build. check-config is asked before the conversion (no cache: a fresh conversion) and after (the cache).

A build is made once per (family, selection) and kept for the process: the selection the real path leaves on the
provider decides which build it is.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from _family_parts import FROZEN_AS_BUILT, part_of, parts_of

from bridge_freeze_plugin import FreezeSelection
from bridge_freeze_plugin.cli import main

pytestmark = [pytest.mark.slow]

CONFIGS = Path(__file__).parents[2] / "fixtures" / "configs"
SFT_FILE = CONFIGS / "sft" / "sft_defaults.yaml"
RL_FILE = CONFIGS / "rl_dataclass" / "rl_defaults.yaml"
GRPO = CONFIGS / "nemo_rl" / "examples" / "configs" / "vlm_grpo_3B_megatron.yaml"
FAMILIES = sorted({"ernie45_vl", "exaone45_vl", "gemma3_vl", "gemma4_vl", "glm45v", "kimi_k25_vl", "minimax_m3_vl",
                   "ministral3", "nemotron_omni", "nemotron_vl", "qwen25_omni", "qwen25_vl", "qwen2_audio",
                   "qwen35_vl", "qwen35_vl_moe", "qwen3_asr", "qwen3_omni", "qwen3_vl", "qwen3_vl_moe", "step37"})
#: The keys NeMo-RL copies from policy.megatron_cfg to the provider (iter_vlm_config_overrides), the flags among them.
COPIED = ("freeze_vision_model", "freeze_vision_projection", "freeze_sound_encoder", "freeze_sound_projection")
_BUILT: dict[tuple[str, FreezeSelection], list[str]] = {}
#: The tiny configurations Bridge cannot instantiate back from a saved run_config.yaml, and why.
_NOT_RELOADABLE = {"kimi_k25_vl": "its tiny provider holds the harness's offline stand-in of Kimi's remote-code vision "
                                  "config (a private module), which Bridge's instantiate refuses",
                   "nemotron_omni": "its tiny provider holds the harness's eager activation stand-in, which Bridge's "
                                    "run_config.yaml cannot instantiate back (its saved file is read in "
                                    "test_saved_selection.py)"}


def _reloadable(name: str) -> None:
    if name in _NOT_RELOADABLE:
        pytest.skip(_NOT_RELOADABLE[name])


def _family_of(name: str) -> str:
    from bridge_freeze_harness.tiny import family_module

    return getattr(family_module(name), "FAMILY", None) or family_module(name).__name__.rsplit(".", 1)[-1]


def _trained_parts(name: str, provider: object) -> list[str]:
    """The parts with a trainable tensor in the build of ``provider`` (once per family and selection)."""
    import re

    from bridge_freeze_harness.tiny import build_tiny_chunks

    key = (name, FreezeSelection.from_object(provider))
    if key not in _BUILT:
        chunks = build_tiny_chunks(name, provider)
        family = _family_of(name)
        skip = FROZEN_AS_BUILT.get(family)
        trained = {part_of(family, n) for c in chunks for n, p in c.named_parameters()
                   if p.requires_grad and not (skip and re.match(skip, n))}
        _BUILT[key] = [p for p in parts_of(family) if p in trained]
    return _BUILT[key]


def _predicted(capsys, *args: object) -> list[str]:
    capsys.readouterr()  # what the builds printed before
    code = main(["check-config", "--json", *map(str, args)])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0 and doc["valid"], doc["error"]
    return doc["trained_parts"]


def _first_flag(name: str) -> str:
    """A flag of a part the family has besides the language model (its encoder)."""
    return f"freeze_{parts_of(_family_of(name))[1]}"


@pytest.mark.parametrize("name", FAMILIES)
def test_sft_and_rl_predictions_are_the_trainers_build(cpu_bridge, capsys, name):
    from bridge_freeze_harness.tiny import make_provider

    flag = _first_flag(name)
    built = _trained_parts(name, make_provider(name, **{flag: True}))  # the trainer writes its section's flags
    family = _family_of(name)
    assert _predicted(capsys, SFT_FILE, f"megatron_config.{flag}=true", "--family", family) == built
    assert _predicted(capsys, RL_FILE, f"trainer.policy.megatron_config.{flag}=true", "trainer.strategy=megatron",
                      "--family", family) == built


def _save(provider: object, folder: Path, family: str) -> Path:
    """Bridge's save of the provider's config (what save_checkpoint / save_megatron_model write)."""
    from bridge_freeze_harness.cpu_training import training_config

    folder.mkdir(parents=True, exist_ok=True)
    training_config(provider, folder.parent / "work", 1, family=family).to_yaml(str(folder / "run_config.yaml"))
    return folder


def _load(name: str, folder: Path) -> object:
    from megatron.bridge.training.model_load_save import load_model_config
    from megatron.bridge.utils.instantiate_utils import register_allowed_target_prefix

    from bridge_freeze_harness.tiny import build_context

    # The tiny providers hold the harness's CPU layer specs (stand-ins for TE's): let Bridge instantiate them too.
    register_allowed_target_prefix("bridge_freeze_harness.")
    with build_context(name):
        provider, _ = load_model_config(str(folder))
    return provider


@pytest.mark.parametrize("name", FAMILIES)
def test_a_bridge_run_config_prediction_is_the_build_bridge_loads(cpu_bridge, capsys, tmp_path, name):
    from bridge_freeze_harness.tiny import make_provider

    _reloadable(name)
    flag = _first_flag(name)
    folder = _save(make_provider(name, **{flag: True}), tmp_path / "iter_0000001", _family_of(name))
    predicted = _predicted(capsys, folder / "run_config.yaml", "--family", _family_of(name))
    assert predicted == _trained_parts(name, _load(name, folder))


def _nemo_rl_build(name: str, cache: Path, model: str, megatron_cfg: dict, overrides: dict) -> list[str]:
    """NeMo-RL's worker set-up on the tiny model: conversion when no cache, then the run's provider, built."""
    from bridge_freeze_harness.tiny import make_provider

    folder = cache / model / "iter_0000000"
    if not folder.exists():  # import_model_from_hf_name
        provider = make_provider(name)
        for key in COPIED:
            if key in megatron_cfg:
                setattr(provider, key, megatron_cfg[key])
        _trained_parts(name, provider)  # provide_distributed_model(wrap_with_ddp=False), once per selection
        _save(provider, folder, _family_of(name))
    provider = _load(name, folder)  # setup_model_config: load_model_config
    if overrides:
        provider = dataclasses.replace(provider, **overrides)
    for key in COPIED:
        if key in megatron_cfg:
            setattr(provider, key, megatron_cfg[key])
    return _trained_parts(name, provider)


def _nemo_rl_args(model: str, family: str, megatron_cfg: dict, overrides: dict) -> list[str]:
    args = [GRPO, f"policy.model_name={model}", "--family", family]
    args += [f"+policy.megatron_cfg.{k}={str(v).lower()}" for k, v in megatron_cfg.items()]
    return args + [f"+policy.megatron_cfg.model_overrides.{k}={str(v).lower()}" for k, v in overrides.items()]


@pytest.mark.parametrize("name", FAMILIES)
def test_a_nemo_rl_prediction_is_the_build_nemo_rls_setup_makes(cpu_bridge, capsys, monkeypatch, tmp_path, name):
    _reloadable(name)
    cache = tmp_path / "nemo_rl_cache"
    monkeypatch.setenv("NRL_MEGATRON_CHECKPOINT_DIR", str(cache))
    family, model = _family_of(name), f"tiny/{name}"
    for megatron_cfg, overrides in (({}, {}), ({}, {"freeze_language_model": True})):
        fresh = _predicted(capsys, *_nemo_rl_args(model, family, megatron_cfg, overrides))
        built = _nemo_rl_build(name, cache, model, megatron_cfg, overrides)
        assert fresh == built, (megatron_cfg, overrides)
        assert _predicted(capsys, *_nemo_rl_args(model, family, megatron_cfg, overrides)) == built  # the cache


def test_a_flag_removed_from_a_nemo_rl_config_stays_in_force_and_the_prediction_says_so(
        cpu_bridge, capsys, monkeypatch, tmp_path):
    """The conversion saved freeze_vision_model: true; the flag is then removed from the config: the cache keeps
    it (Qwen3-VL-MoE: language model and projection train), and check-config predicts that, from the cache."""
    cache = tmp_path / "nemo_rl_cache"
    monkeypatch.setenv("NRL_MEGATRON_CHECKPOINT_DIR", str(cache))
    name, model = "qwen3_vl_moe", "tiny/qwen3_vl_moe"
    _nemo_rl_build(name, cache, model, {"freeze_vision_model": True}, {})
    built = _nemo_rl_build(name, cache, model, {}, {})
    assert built == ["language_model", "vision_projection"]
    assert _predicted(capsys, *_nemo_rl_args(model, "qwen3_vl_moe", {}, {})) == built
