"""SkyRL 0.4.0's own weight source syncs only what trains: ``trainable_param_filter`` and
``FullThenTrainableSource`` against SkyRL's REAL ``MegatronWeightSource`` (``skyrl.backends.skyrl_train.
weight_sync.sources``) on tiny REAL models built from HF checkpoints.

SkyRL's Megatron worker builds its source once (``_build_weight_source``), as ``MegatronWeightSource(bridge,
actor_module, dtype)``; the source takes ``param_filter=`` (a predicate on the conversion tasks' Megatron names)
and runs Bridge's export with the tasks it keeps. Checked here: with the plugin's filter its ``metadata()`` and
its stream are exactly ``export_trainable_hf_weights``'s (names, shapes, dtypes, values, order); the one-source
"full first, then what trains" holds round by round; ``merge_lora=false`` (SkyRL syncs adapters alone) is refused
by the filter and by SkyRL's own adapter source (the plugin's guard on Bridge's adapter export).
Expert parallel 2: tests/unit/export/test_refit_info.py (one EP2 run for both files).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

# SkyRL 0.4.0 is installed for the tests (requirements/skyrl-tests.txt, by scripts/bootstrap.sh): without it the
# install is broken, and this file fails to import instead of skipping
import skyrl  # noqa: F401
from _refit_worker import LORA_TARGETS, PROJECTION_ONLY, build, skyrl_facts
from _skyrl_weight_sync import layout, meta_layout, same_stream, skyrl_megatron_worker, skyrl_sources

#: What trains, per case: (family, build fields, LoRA targets).
CASES = {
    "projection_only": ("qwen3_vl", PROJECTION_ONLY, None),
    "lora_next_to_the_projection": ("qwen3_vl", PROJECTION_ONLY, LORA_TARGETS),
    "moe_vision_frozen": ("qwen3_vl_moe", {"freeze_vision_model": True}, None),
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, cpu_bridge):
    from bridge_freeze_harness.hf_checkpoint import write_tiny_hf_checkpoint

    root = tmp_path_factory.mktemp("hf")
    written: dict[str, Path] = {}

    def get(family: str) -> Path:
        if family not in written:
            written[family] = write_tiny_hf_checkpoint(family, root / family, seed=0)
        return written[family]

    return get


def built(checkpoints: Any, case: str) -> tuple[Any, list[Any]]:
    family, fields, lora = CASES[case]
    return build(checkpoints(family), family, lora=lora, **fields)


@pytest.mark.parametrize("case", sorted(CASES))
def test_skyrls_source_with_the_plugins_filter_is_the_trainable_export(case, checkpoints):
    bridge, chunks = built(checkpoints, case)
    facts = skyrl_facts(bridge, chunks)
    full = layout(bridge.export_hf_weights(chunks, cpu=True, show_progress=False))
    assert facts["metadata"] == facts["expected"]  # what the engine is told
    assert facts["streamed"] == facts["expected"] and facts["same_values"]  # what it gets
    assert 0 < len(facts["expected"]) < len(full)


def test_one_source_sends_everything_first_then_what_trains(checkpoints, monkeypatch):
    from bridge_freeze_plugin.export import (
        FullThenTrainableSource,
        export_trainable_hf_weights,
        trainable_param_filter,
    )

    sources = skyrl_sources()
    bridge, chunks = built(checkpoints, "projection_only")
    full = list(bridge.export_hf_weights(chunks, cpu=True, show_progress=False))
    trainable = list(export_trainable_hf_weights(bridge, chunks, cpu=True, show_progress=False))
    dtype = full[0][1].dtype

    class PluginWeightSource(FullThenTrainableSource, sources.WeightSource):
        """What a SkyRL worker's _build_weight_source would return (a vLLM WeightSource)."""

    source = PluginWeightSource(
        sources.MegatronWeightSource(bridge, chunks, dtype),
        sources.MegatronWeightSource(bridge, chunks, dtype, param_filter=trainable_param_filter(bridge, chunks)),
    )
    assert isinstance(source, sources.WeightSource)
    exports = []
    original = bridge.export_hf_weights
    monkeypatch.setattr(bridge, "export_hf_weights", lambda *a, **k: exports.append(1) or original(*a, **k))

    def one_round() -> tuple[list[Any], list[tuple[str, Any]]]:
        declared = meta_layout(source.metadata())  # an engine reads it before each round
        return declared, list(source)

    assert source.full_sync_pending
    first_partial = iter(source)  # a round that stops early (an engine error) is not a full sync
    next(first_partial)
    first_partial.close()
    assert source.full_sync_pending
    declared, sent = one_round()
    assert declared == layout(full) and same_stream(sent, full)
    for _ in range(2):
        declared, sent = one_round()
        assert declared == layout(trainable) and same_stream(sent, trainable)
    source.require_full()  # e.g. the engine woke from a sleep that dropped its weights
    declared, sent = one_round()
    assert declared == layout(full) and same_stream(sent, full)
    # metadata() ran no export after the source was built (both read when it was): only the 5 rounds exported
    assert len(exports) == 5


def test_merge_lora_false_is_refused(checkpoints):
    """With merge_lora=false SkyRL sends the adapters alone (its MegatronLoraAdapterSource): the projection that
    trains at full rank next to them would never reach the engine."""
    from megatron.bridge.peft.lora import LoRA

    from bridge_freeze_plugin.errors import AdapterExportError, TrainableSyncError
    from bridge_freeze_plugin.export import trainable_param_filter

    sources = skyrl_sources()
    bridge, chunks = built(checkpoints, "lora_next_to_the_projection")
    with pytest.raises(TrainableSyncError, match=r"merge_lora=false.*merge_lora=true"):
        trainable_param_filter(bridge, chunks, merge_lora=False)
    adapter_source = sources.MegatronLoraAdapterSource(
        dtype=chunks[0].config.params_dtype, experts_per_shared_adapter=1, bridge=bridge, actor_module=chunks,
        lora_cls=LoRA(target_modules=LORA_TARGETS, dim=4, alpha=8), base_model_name_or_path="tiny",
    )
    with pytest.raises(AdapterExportError, match=r"vision_projection"):
        adapter_source.prepare()  # SkyRL's first step of every adapter sync


def test_the_worker_seam_of_the_docs_on_skyrls_worker_class(checkpoints):
    """docs/rl-weight-sync.md's SkyRL wiring on SkyRL's real Megatron worker class and config: SkyRL's own
    ``_build_weight_source`` makes the full source; the subclass wraps it, except under ``colocate_all`` (SkyRL's
    default: vLLM sleeps at level 2, every sync full), where SkyRL's source is returned as it is."""
    from bridge_freeze_plugin.export import (
        FullThenTrainableSource,
        export_trainable_hf_weights,
        trainable_param_filter,
    )

    worker_module, config_module = skyrl_megatron_worker()
    sources = skyrl_sources()
    bridge, chunks = built(checkpoints, "projection_only")
    full = list(bridge.export_hf_weights(chunks, cpu=True, show_progress=False))
    trainable = list(export_trainable_hf_weights(bridge, chunks, cpu=True, show_progress=False))
    dtype = full[0][1].dtype

    class PluginWeightSource(FullThenTrainableSource, sources.WeightSource):
        pass

    class FreezePolicyWorker(worker_module.MegatronPolicyWorkerBase):
        def _build_weight_source(self, dtype: Any, backend: str) -> Any:
            source = super()._build_weight_source(dtype, backend)
            if self.cfg.placement.colocate_all or type(source) is not sources.MegatronWeightSource:
                return source
            keep = trainable_param_filter(self.bridge, self.actor_module)
            trainable = sources.MegatronWeightSource(self.bridge, self.actor_module, dtype, param_filter=keep)
            return PluginWeightSource(source, trainable)

    def worker(colocate_all: bool) -> Any:
        cfg = config_module.SkyRLTrainConfig().trainer  # SkyRL's defaults
        cfg.placement.colocate_all = colocate_all
        # No Ray actor and no init_model (GPU set-up): the attributes _build_weight_source reads, as they set them.
        made = object.__new__(FreezePolicyWorker)
        made.cfg, made.bridge, made.actor_module = cfg, bridge, chunks
        made._is_lora, made._serialized_fp8_config = cfg.policy.model.lora.rank > 0, None
        return made

    assert config_module.SkyRLTrainConfig().trainer.placement.colocate_all  # SkyRL's default placement
    colocated = worker(True)._build_weight_source(dtype, "ipc")
    assert type(colocated) is sources.MegatronWeightSource
    for _ in range(2):
        assert meta_layout(colocated.metadata()) == layout(full) and same_stream(list(colocated), full)
    source = worker(False)._build_weight_source(dtype, "nccl")
    assert isinstance(source, sources.WeightSource)
    for expected in (full, trainable, trainable):
        assert meta_layout(source.metadata()) == layout(expected) and same_stream(list(source), expected)
