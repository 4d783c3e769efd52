"""docs/rl-weight-sync.md's SkyRL guard covers ``offload_kv_for_weight_sync`` (issue 46, the trainers' weight-sync
point): SkyRL 0.4.0 then sleeps the engine before every sync (its WorkerDispatch), so a trainable-only stream would
go to an engine whose frozen tensors have no value. Checked on SkyRL's own config class; fails on the main of
2026-12-07 (no guard: the worker subclass sees only ``cfg.trainer`` and served the trainable-only stream)."""

from __future__ import annotations

import importlib.util
import sys
import types

import pytest
from omegaconf import OmegaConf

from bridge_freeze_plugin.errors import TrainableSyncError
from bridge_freeze_plugin.export import require_engine_keeps_weights

KEY = "generator.inference_engine.offload_kv_for_weight_sync"


@pytest.fixture
def skyrl_config(monkeypatch):
    """SkyRL's SkyRLTrainConfig (its __post_init__ imports orjson / pybase64 for its wire codecs only)."""
    for name in ("orjson", "pybase64"):
        if importlib.util.find_spec(name) is None:
            monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    from skyrl.train.config import SkyRLTrainConfig

    return SkyRLTrainConfig


def test_an_engine_that_sleeps_before_each_sync_is_refused_naming_the_key_and_the_fix(skyrl_config):
    cfg = skyrl_config.from_cli_overrides(["trainer.placement.colocate_all=false", f"{KEY}=true",
                                           "trainer.policy.model.path=Qwen/Qwen3-VL-8B-Instruct"])
    with pytest.raises(TrainableSyncError, match=(
            r"asked for Qwen/Qwen3-VL-8B-Instruct with generator\.inference_engine\.offload_kv_for_weight_sync=true"
            r".*Set generator\.inference_engine\.offload_kv_for_weight_sync=false to keep the trainable-only sync, "
            r"or leave SkyRL's PolicyWorker in place")):
        require_engine_keeps_weights(cfg)
    with pytest.raises(TrainableSyncError, match=r"the policy with generator\.inference_engine\."):
        require_engine_keeps_weights(OmegaConf.create({"generator": {"inference_engine": {
            "offload_kv_for_weight_sync": True}}}))


def test_an_engine_that_keeps_its_weights_passes(skyrl_config):
    assert skyrl_config().generator.inference_engine.offload_kv_for_weight_sync is False  # SkyRL's default
    require_engine_keeps_weights(skyrl_config.from_cli_overrides(["trainer.placement.colocate_all=false"]))
    require_engine_keeps_weights({"generator": {"inference_engine": {"offload_kv_for_weight_sync": False}}})
