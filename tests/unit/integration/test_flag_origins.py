"""Where each flag's value came from, said per flag in the report (issue 35 items 1 and 2).

The report names, for every flag of the family's parts, this run's setting, the provider's default or the saved
config (with its file) the provider was loaded from. The saved-config attribution follows the provider made from
the file (Bridge's ``load_model_config``) and its ``dataclasses.replace`` copies (NeMo-RL's ``model_overrides``), not
every provider of the same class: a fresh provider built after the process read a checkpoint's ``run_config.yaml``
is this run's own. Built on tiny Qwen3-VL-MoE (Bridge's class declares ``freeze_language_model`` true); the expected
trainable names are those outside the frozen parts' prefixes (``tests/unit/_family_parts.py``, written by hand).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from pathlib import Path

from _family_parts import part_of

FAMILY = "qwen3_vl_moe"


def _save(provider: object, folder: Path) -> str:
    """Bridge's save of the provider's config (what save_megatron_model writes in NeMo-RL's conversion cache)."""
    from bridge_freeze_harness.cpu_training import training_config

    folder.mkdir(parents=True, exist_ok=True)
    training_config(provider, folder.parent / "work", 1, family=FAMILY).to_yaml(str(folder / "run_config.yaml"))
    return str(folder / "run_config.yaml")


def _load(folder: Path) -> object:
    from megatron.bridge.training.model_load_save import load_model_config

    from bridge_freeze_harness.tiny import build_context

    with build_context(FAMILY):
        provider, _ = load_model_config(str(folder))
    return provider


def _built(provider: object, frozen: set[str], caplog) -> list[str]:
    """Build (as the harness does: wrap_with_ddp=False), check the exact trainable set, give the report's lines."""
    from bridge_freeze_harness.tiny import build_tiny_chunks

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="bridge_freeze_plugin"):
        chunks = build_tiny_chunks(FAMILY, provider)
    names = {n for c in chunks for n, _ in c.named_parameters()}
    trained = {n for c in chunks for n, p in c.named_parameters() if p.requires_grad}
    assert trained == {n for n in names if part_of(FAMILY, n) not in frozen}
    (block,) = [r.getMessage() for r in caplog.records
                if r.levelno == logging.INFO and r.getMessage().startswith("bridge-freeze:")]
    return [line.strip() for line in block.splitlines()]


def _training_warnings(provider: object, caplog) -> list[str]:
    """The WARNINGs the same report logs on a build wrapped for training (the harness's is not)."""
    from bridge_freeze_plugin import last_report
    from bridge_freeze_plugin.prewrap import log_report

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="bridge_freeze_plugin"):
        log_report(dataclasses.replace(last_report(provider), untrained=None))
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_each_flag_says_whether_this_run_set_it_or_it_is_the_default(cpu_bridge, caplog):
    from bridge_freeze_harness.tiny import make_provider

    provider = make_provider(FAMILY, freeze_vision_model=True)
    lines = _built(provider, {"vision_model"}, caplog)
    assert "freeze_vision_model=true: this run's setting" in lines
    assert "freeze_vision_projection=false: the provider's default" in lines
    assert ("freeze_language_model=false: the provider's default (the plugin's; the provider's class declares true)"
            in lines)
    provider.freeze_vision_projection = False  # written by the run's code (as a trainer writes its config)
    assert "freeze_vision_projection=false: this run's setting" in _built(provider, {"vision_model"}, caplog)


def test_a_fresh_provider_built_after_a_saved_config_was_read_is_this_runs_own(cpu_bridge, caplog, tmp_path):
    """The process read a checkpoint's run_config.yaml holding freeze_vision_model true (loaded, built), then
    builds a FRESH provider of the same class with the flag set by the user: no saved-config attribution, no
    WARNING (before: attributed to the file by provider class)."""
    from bridge_freeze_harness.tiny import make_provider

    folder = tmp_path / "iter_0000001"
    path = _save(make_provider(FAMILY, freeze_vision_model=True), folder)
    loaded = _load(folder)
    loaded_lines = _built(loaded, {"vision_model"}, caplog)
    fresh = make_provider(FAMILY, freeze_vision_model=True)
    lines = _built(fresh, {"vision_model"}, caplog)
    assert not any("saved config" in line for line in lines)
    assert _training_warnings(fresh, caplog) == []
    assert "freeze_vision_model=true: this run's setting" in lines
    assert f"freeze_vision_model=true: from the saved config {path} this provider was loaded from" in loaded_lines


def test_nemo_rls_flow_attributes_the_cached_flag_to_its_file(cpu_bridge, caplog, tmp_path):
    """NeMo-RL's set-up: the conversion cache (written with freeze_vision_model true, since removed from the
    config) loaded with load_model_config, model_overrides merged with dataclasses.replace, the config's freeze_*
    keys copied with setattr, then built. The cached flag is said to come from the file, with a WARNING naming it."""
    from bridge_freeze_harness.tiny import make_provider

    folder = tmp_path / "nemo_rl" / "Qwen" / "iter_0000000"
    path = _save(make_provider(FAMILY, freeze_vision_model=True), folder)
    provider = dataclasses.replace(_load(folder), seq_length=64)  # model_overrides
    provider.freeze_vision_projection = True  # policy.megatron_cfg.freeze_vision_projection (iter_vlm_config_...)
    lines = _built(provider, {"vision_model", "vision_projection"}, caplog)
    assert f"freeze_vision_model=true: from the saved config {path} this provider was loaded from" in lines
    assert f"freeze_language_model=false: from the saved config {path} this provider was loaded from" in lines
    assert "freeze_vision_projection=true: this run's setting" in lines
    (warning,) = _training_warnings(provider, caplog)
    assert warning.startswith(f"bridge-freeze: freeze_vision_model=true on Qwen3VLMoEModelProvider: true in the "
                              f"saved config {path}")


def test_a_replace_that_changes_a_cached_flag_makes_it_this_runs_setting(cpu_bridge, caplog, tmp_path):
    from bridge_freeze_harness.tiny import make_provider

    folder = tmp_path / "iter_0000000"
    _save(make_provider(FAMILY, freeze_vision_model=True), folder)
    provider = dataclasses.replace(_load(folder), freeze_vision_model=False)
    lines = _built(provider, set(), caplog)
    assert "freeze_vision_model=false: this run's setting" in lines


def test_a_copy_whose_origin_is_unknown_falls_back_to_the_class_and_says_so(cpu_bridge, caplog, tmp_path):
    """copy.copy makes a provider without running its constructor: nothing ties it to a file, so a true flag that
    the saved config of its class read by this process holds true is said to be as in that file, hedged."""
    from bridge_freeze_harness.tiny import make_provider

    folder = tmp_path / "iter_0000000"
    path = _save(make_provider(FAMILY, freeze_vision_model=True), folder)
    provider = copy.copy(_load(folder))
    lines = _built(provider, {"vision_model"}, caplog)
    assert any(line.startswith(f"freeze_vision_model=true: as in the saved config {path} of this provider class")
               for line in lines)


def _save_converted(provider: object, folder: Path) -> str:
    """NeMo-RL's conversion cache: the container Bridge's save_megatron_model saves (model, optimizer, logger,
    checkpoint; nothing else), written with ConfigContainer.to_yaml."""
    from megatron.bridge.training import config as bc

    folder.mkdir(parents=True, exist_ok=True)
    cfg = bc.ConfigContainer(model=provider, train=None, optimizer=bc.OptimizerConfig(use_distributed_optimizer=False),
                             ddp=None, scheduler=None, dataset=None, logger=bc.LoggerConfig(), tokenizer=None,
                             checkpoint=bc.CheckpointConfig(save=str(folder)), dist=None)
    cfg.to_yaml(str(folder / "run_config.yaml"))
    return str(folder / "run_config.yaml")


def test_nemo_rls_strict_from_yaml_load_attributes_the_cached_flag_to_its_file(cpu_bridge, caplog, tmp_path):
    """Issue 46 item 10: NeMo-RL's set-up before July 2026 read its cache with megatron-core's
    ``ConfigContainer.from_yaml(path, mode=InstantiationMode.STRICT)`` and took ``.model`` (neither
    ``read_run_config`` nor Bridge's ``instantiate``): the cached flag read "this run's setting", with no WARNING."""
    from megatron.bridge.training.config import ConfigContainer
    from megatron.bridge.utils.instantiate_utils import InstantiationMode

    from bridge_freeze_harness.tiny import build_context, make_provider

    folder = tmp_path / "nemo_rl" / "Qwen" / "iter_0000000"
    path = _save_converted(make_provider(FAMILY, freeze_vision_model=True), folder)
    with build_context(FAMILY):
        provider = ConfigContainer.from_yaml(path, mode=InstantiationMode.STRICT).model
    provider.freeze_vision_projection = True  # policy.megatron_cfg.freeze_vision_projection (iter_vlm_config_...)
    lines = _built(provider, {"vision_model", "vision_projection"}, caplog)
    assert f"freeze_vision_model=true: from the saved config {path} this provider was loaded from" in lines
    assert f"freeze_language_model=false: from the saved config {path} this provider was loaded from" in lines
    assert "freeze_vision_projection=true: this run's setting" in lines
    (warning,) = _training_warnings(provider, caplog)
    assert warning.startswith(f"bridge-freeze: freeze_vision_model=true on Qwen3VLMoEModelProvider: true in the "
                              f"saved config {path}")
    # a container built from a dict (no file) is this run's own: nothing is attributed
    fresh = ConfigContainer.from_dict(ConfigContainer.from_yaml(path).to_dict(), mode=InstantiationMode.STRICT).model
    assert "freeze_vision_model=true: this run's setting" in _built(fresh, {"vision_model"}, caplog)
