"""What Bridge saves of a built provider says what was built (issue 37 item 7), and check-config reads it so.

Nemotron Omni's provider declares Bridge's own names of the audio flags (``freeze_sound_encoder`` /
``freeze_sound_projection``). A run that froze the sound encoder with Bridge's name used to save
``freeze_sound_encoder: true`` next to ``freeze_audio_model: false`` (the build took the alias, and never wrote the
merged selection back), which check-config then refused as two settings that disagree. The expected trainable
names are those of the tiny model outside the frozen part's prefix (``tests/unit/_family_parts.py``, written by
hand), never computed by the code under test.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from _family_parts import part_of

from bridge_freeze_plugin import FreezeSelection
from bridge_freeze_plugin.config import load_run

#: Bridge's alias on Nemotron Omni's provider -> the plugin's flag it means, and the part (every alias pair of every
#: family: Nemotron Omni is the only provider declaring them, tests/unit/config/test_config_trainers.py checks that).
PAIRS = {"freeze_sound_encoder": ("freeze_audio_model", "audio_model"),
         "freeze_sound_projection": ("freeze_audio_projection", "audio_projection")}


def _saved_run_config(tmp_path: Path, alias: str) -> tuple[Path, list[object], object]:
    """Build tiny Nemotron Omni with Bridge's alias set (and nothing else), save its ConfigContainer as Bridge's
    ``save_checkpoint`` does (``to_yaml``); the file, the chunks and the provider."""
    from bridge_freeze_harness.cpu_training import training_config
    from bridge_freeze_harness.tiny import build_tiny_chunks, make_provider

    provider = make_provider("nemotron_omni", **{alias: True})
    chunks = build_tiny_chunks("nemotron_omni", provider)
    path = tmp_path / "run_config.yaml"
    training_config(provider, tmp_path / "work", 1, family="nemotron_omni").to_yaml(str(path))
    return path, chunks, provider


@pytest.mark.parametrize("alias", sorted(PAIRS))
def test_the_build_writes_the_merged_selection_back_so_the_saved_file_agrees(cpu_bridge, tmp_path, alias):
    flag, part = PAIRS[alias]
    path, chunks, provider = _saved_run_config(tmp_path, alias)
    names = {n for c in chunks for n, _ in c.named_parameters()}
    trained = {n for c in chunks for n, p in c.named_parameters() if p.requires_grad}
    assert trained == {n for n in names if part_of("nemotron_omni", n) != part}
    assert getattr(provider, flag) is True and getattr(provider, alias) is True
    model = yaml.safe_load(path.read_text(encoding="utf-8"))["model"]
    assert (model[flag], model[alias]) == (True, True)
    assert load_run(path).validate() == FreezeSelection(**{flag: True})


@pytest.mark.parametrize("alias", sorted(PAIRS))
def test_a_run_config_saved_before_the_fix_is_read_as_the_build_read_it(tmp_path, alias):
    """A file written before: the alias true, the flag false (every field saved). The build froze the part."""
    flag, _ = PAIRS[alias]
    source = Path(__file__).parents[2] / "fixtures" / "configs" / "bridge" / "run_config.yaml"
    cfg = yaml.safe_load(source.read_text(encoding="utf-8"))
    cfg["model"].update({"_target_": "megatron.bridge.models.nemotron_omni.nemotron_omni_provider."
                                      "NemotronOmniModelProvider", alias: True, flag: False})
    path = tmp_path / "run_config.yaml"
    path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    assert load_run(path).validate() == FreezeSelection(**{flag: True})


def test_a_flag_from_a_saved_config_is_said_per_flag_with_a_warning_naming_the_file(cpu_bridge, tmp_path, caplog):
    """Issue 35 item 1: NeMo-RL reloads its conversion cache with Bridge's load_model_config at every set-up; a
    flag the cache holds true (here freeze_vision_model, set when the cache was written, since removed from the
    config) is said in the report as coming from that file, and a WARNING names it. A fresh provider's report
    says nothing of the kind (in a process that read no saved config of its class)."""
    import logging

    from megatron.bridge.training.model_load_save import load_model_config

    from bridge_freeze_harness.cpu_training import training_config
    from bridge_freeze_harness.tiny import build_context, build_tiny_chunks, make_provider

    folder = tmp_path / "cache" / "iter_0000000"
    folder.mkdir(parents=True)
    converted = make_provider("qwen3_vl_moe", freeze_vision_model=True)
    training_config(converted, tmp_path / "work", 1, family="qwen3_vl_moe").to_yaml(str(folder / "run_config.yaml"))
    with build_context("qwen3_vl_moe"):
        provider, _ = load_model_config(str(folder))
    caplog.set_level(logging.INFO, logger="bridge_freeze_plugin")
    chunks = build_tiny_chunks("qwen3_vl_moe", provider)
    names = {n for c in chunks for n, _ in c.named_parameters()}
    trained = {n for c in chunks for n, p in c.named_parameters() if p.requires_grad}
    assert trained == {n for n in names if part_of("qwen3_vl_moe", n) != "vision_model"}
    saved = str(folder / "run_config.yaml")
    (report,) = [r.getMessage() for r in caplog.records
                 if r.levelno == logging.INFO and "bridge-freeze:" in r.getMessage()]
    assert f"freeze_vision_model=true: from the saved config {saved} this provider was loaded from" in report
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and saved in r.getMessage()]
    assert warnings == []  # the harness's build is not wrapped for training (wrap_with_ddp=False): no warning
    import dataclasses

    from bridge_freeze_plugin import last_report
    from bridge_freeze_plugin.prewrap import log_report

    assert dict(last_report(provider).saved_flags) == {"freeze_vision_model": saved}
    log_report(dataclasses.replace(last_report(provider), untrained=None))  # the same report, of a training build
    (warning,) = [r.getMessage() for r in caplog.records
                  if r.levelno == logging.WARNING and r.getMessage().startswith("bridge-freeze:")]
    assert warning.startswith("bridge-freeze: freeze_vision_model=true on Qwen3VLMoEModelProvider: true in the "
                              f"saved config {saved}, which this run built its provider from")
    caplog.clear()
    from bridge_freeze_plugin.prewrap import forget_saved

    forget_saved()  # a process that read no saved config (tests/unit/integration/test_flag_origins.py: one that did)
    fresh = make_provider("qwen3_vl_moe", freeze_vision_model=True)
    build_tiny_chunks("qwen3_vl_moe", fresh)
    assert "as in the saved config" not in "\n".join(r.getMessage() for r in caplog.records)
