"""The run-time audit in Bridge's real training loop (``pretrain()`` on the CPU, the harness's tiny models and
synthetic batches): what it counts, what it names and why, what it holds, and how it is turned off or made strict.

Every expectation is written here from the tiny model's parameter names and the tests' own part table
(``_family_parts.py``), never from the plugin: the names of the tensors that learned, of those that got no gradient,
and how many tensors must hold. Each run is 4 iterations without a checkpoint (the audit covers the first 3 steps
by default, and checks once more after optimizer step 3).
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import pytest
from _family_parts import part_of

import bridge_freeze_plugin  # the plugin active, as in a user's job
from bridge_freeze_plugin import (
    FreezeSelection,
    FrozenPartTrainedError,
    TrainingAuditError,
    last_audit,
    make_freezable,
)

pytestmark = pytest.mark.usefixtures("cpu_bridge")

PROJECTION_ONLY = FreezeSelection(freeze_language_model=True, freeze_vision_model=True)
ITERS = 4


def _names(family: str) -> dict[str, str]:
    """Every parameter of the family's tiny model -> its part, by the tests' own table."""
    from bridge_freeze_harness.tiny import build_tiny_model
    from bridge_freeze_harness.train import make_provider

    model = build_tiny_model(family, make_provider(family))
    return {n: part_of(family, n) for n, _ in model.named_parameters()}


def _run(tmp_path: Path, family: str = "qwen3_vl", selection: FreezeSelection = PROJECTION_ONLY, *,
         hooks: tuple[Any, ...] = (), media: bool = True, fields: dict[str, Any] | None = None,
         part_lrs: Any = None, callbacks: list[Any] | None = None, iters: int = ITERS, bf16: bool = False) -> Any:
    """Bridge's ``pretrain()`` of the family's tiny provider with ``selection``; the provider (``last_audit``)."""
    from bridge_freeze_harness.cpu_training import run_training, synthetic_dataset_config, training_config
    from bridge_freeze_harness.train import make_provider

    provider = make_freezable(make_provider(family, hidden_dropout=0.0), selection)
    for key, value in (fields or {}).items():
        setattr(provider, key, value)
    for hook in hooks:
        provider.register_pre_wrap_hook(hook)
    cfg = training_config(provider, tmp_path, iters, family=family, optimizer_config_override_provider=part_lrs,
                          bf16_mixed=bf16)
    cfg.checkpoint.save = None  # nothing here reads a checkpoint
    if not media:
        cfg.dataset = synthetic_dataset_config(family, provider, media=False)
    run_training(cfg, family=family, callbacks=callbacks)
    return provider


def _pending(provider: Any) -> list[Any]:
    """The pending audits of ``provider``'s models."""
    from bridge_freeze_plugin.audit import PENDING

    return [a for a in (ref() for ref in PENDING.values()) if a is not None and a.provider is provider]


@pytest.fixture
def warnings_logged(caplog):
    caplog.set_level(logging.INFO, logger="bridge_freeze_plugin")
    return lambda: [r.getMessage() for r in caplog.records
                    if r.name == "bridge_freeze_plugin" and r.levelno == logging.WARNING
                    and r.getMessage().startswith("bridge-freeze audit:")]


def _finding(report: Any, cause: str) -> set[str]:
    return {n for f in report.findings if f.cause == cause for n in f.names}


def test_projection_only_every_projection_tensor_learns_and_everything_else_holds(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="bridge_freeze_plugin")
    names = _names("qwen3_vl")
    provider = _run(tmp_path)
    report = last_audit(provider)
    projection = {n for n, p in names.items() if p == "vision_projection"}
    assert report is not None and report.ok and report.findings == ()
    assert set(report.learned) == projection
    assert report.held_tensors == len(names) - len(projection)  # every frozen parameter
    assert {p.part.value: (p.trainable_tensors, p.with_gradient) for p in report.parts} == {
        "language_model": (0, 0), "vision_model": (0, 0), "vision_projection": (len(projection), len(projection))}
    assert all(n > 0 for n in report.part(bridge_freeze_plugin.Part.VISION_PROJECTION).grad_norms)
    blocks = [r.getMessage() for r in caplog.records if r.getMessage().startswith("bridge-freeze audit: Qwen3VL")
              and r.levelno == logging.INFO]
    assert len(blocks) == 1 and "every trainable tensor got a gradient: OK" in blocks[0]


def _detach_merger(chunks: list[Any]) -> list[Any]:
    """A stand-in for any bug of a build or a trainer: the main merger's output leaves the graph."""
    for chunk in chunks:
        chunk.vision_model.merger.register_forward_hook(lambda _m, _i, output: output.detach())
    return chunks


def test_a_detached_projection_is_named_with_what_the_audit_saw(tmp_path, warnings_logged):
    names = _names("qwen3_vl")
    report = last_audit(_run(tmp_path, hooks=(_detach_merger,)))
    merger = {n for n in names if n.startswith("vision_model.merger.")}
    projection = {n for n, p in names.items() if p == "vision_projection"}
    assert merger and not report.ok
    assert _finding(report, "detached") == merger and {f.cause for f in report.findings} == {"detached"}
    assert set(report.learned) == projection - merger  # the DeepStack mergers still learn
    (line,) = warnings_logged()
    assert f"{len(merger)} trainable tensor(s) of the vision projection got no gradient" in line
    assert "vision_model.merger.linear_fc1.weight" in line and "detach" in line


def test_text_only_batches_name_the_trained_vision_side_with_what_freezing_it_saves(tmp_path, warnings_logged):
    names = _names("qwen3_vl")
    selection = FreezeSelection(freeze_language_model=True)  # the vision encoder and the projection train
    report = last_audit(_run(tmp_path, selection=selection, media=False))
    vision = {n for n, p in names.items() if p == "vision_model"}
    projection = {n for n, p in names.items() if p == "vision_projection"}
    assert _finding(report, "no_input") == vision | projection and report.learned == ()
    by_part = {f.part.value: f for f in report.findings}
    from bridge_freeze_harness.tiny import build_tiny_model
    from bridge_freeze_harness.train import make_provider

    sizes = {n: p.numel() for n, p in build_tiny_model("qwen3_vl", make_provider("qwen3_vl")).named_parameters()}
    for part, members in (("vision_model", vision), ("vision_projection", projection)):
        elements = sum(sizes[n] for n in members)
        # fp32 weights and fp32 gradients here: 4 B of gradient, Adam's two fp32 moments (8 B), no master copy
        assert by_part[part].saving == (4 * elements, 8 * elements)
    lines = warnings_logged()
    assert len(lines) == 2
    assert all("modules ran in the audited steps (batches without image input)" in line and "that saves" in line
               for line in lines)
    assert any("freeze_vision_model=True" in line for line in lines)


def test_full_recompute_without_the_fix_names_the_deepstack_mergers(tmp_path, warnings_logged):
    names = _names("qwen3_vl")
    fields = {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1,
              "full_recompute_policy": "refuse"}  # no flag set: the plugin only warns, and leaves recompute on
    report = last_audit(_run(tmp_path, selection=FreezeSelection(), fields=fields))
    deepstack = {n for n in names if n.startswith("vision_model.decoder.deepstack_merger_list.")}
    assert deepstack and _finding(report, "recompute") == deepstack
    assert {f.cause for f in report.findings} == {"recompute"}
    assert set(report.learned) == set(names) - deepstack
    (line,) = warnings_logged()
    assert "recompute_granularity='full'" in line


def test_with_the_plugins_fix_full_recompute_trains_every_tensor(tmp_path):
    names = _names("qwen3_vl")
    fields = {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1}
    report = last_audit(_run(tmp_path, selection=FreezeSelection(), fields=fields))
    assert report.ok and set(report.learned) == set(names)


def test_a_part_at_learning_rate_0_is_said_and_held_with_its_routers_expert_bias(tmp_path, warnings_logged):
    """ERNIE-4.5-VL's language model routes with an expert bias that megatron-core moves in finalize_model_grads:
    at learning rate 0 it must hold too (round 5: it moved)."""
    from bridge_freeze_harness.tiny import build_tiny_model
    from bridge_freeze_harness.train import make_provider
    from bridge_freeze_plugin.optim import PartLROverrideProvider

    model = build_tiny_model("ernie45_vl", make_provider("ernie45_vl"))
    names = {n: part_of("ernie45_vl", n) for n, _ in model.named_parameters()}
    biases = {n for n, _ in model.named_buffers() if n.endswith(".expert_bias") and n.startswith("language_model.")}
    selection = FreezeSelection(freeze_vision_model=True)
    provider = _run(tmp_path, "ernie45_vl", selection, part_lrs=PartLROverrideProvider(lr_language_model=0.0))
    report = last_audit(provider)
    language = {n for n, p in names.items() if p == "language_model"}
    vision = {n for n, p in names.items() if p == "vision_model"}
    assert biases and report.zero_lr_parts == ("language_model",)
    assert report.held_tensors == len(language) + len(vision)
    assert report.held_buffers >= len(biases)
    assert "note: language_model trains at learning rate 0" in report.format()
    assert not [line for line in warnings_logged() if "language model" in line]


class _MoveExpertBias:
    """A Bridge callback undoing the plugin's hold on the routers (what round 5 found): the bias moves again."""

    def on_train_start(self, context: Any) -> None:
        for chunk in context.model:
            for module in chunk.modules():
                if getattr(module, "expert_bias", None) is not None:
                    module.frozen_expert_bias = False


def test_an_expert_bias_that_moves_at_learning_rate_0_is_an_error_naming_it(tmp_path):
    from bridge_freeze_harness.run_records import Recorder
    from bridge_freeze_plugin.optim import PartLROverrideProvider

    class Mover(Recorder, _MoveExpertBias):
        def on_train_start(self, context: Any) -> None:
            Recorder.on_train_start(self, context)
            _MoveExpertBias.on_train_start(self, context)

    with pytest.raises(FrozenPartTrainedError, match=r"language_model\.decoder\.layers\.\d+\.mlp\.router\.expert_bias"
                       r"|expert_bias") as raised:
        _run(tmp_path, "ernie45_vl", FreezeSelection(freeze_vision_model=True),
             part_lrs=PartLROverrideProvider(lr_language_model=0.0), callbacks=[Mover()])
    assert "step 1, before any optimizer step" in str(raised.value)
    assert "frozen_expert_bias" in str(raised.value)


class _WriteFrozen:
    """A Bridge callback standing in for anything that writes a frozen weight (a hook, an in-place op)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def on_train_step_end(self, context: Any) -> None:
        import torch

        (chunk,) = context.model
        while hasattr(chunk, "module"):  # DDP (and Float16Module) around the model
            chunk = chunk.module
        with torch.no_grad():
            dict(chunk.named_parameters())[self.name].add_(1.0)


def test_a_frozen_weight_written_after_an_optimizer_step_is_an_error_naming_it(tmp_path):
    from bridge_freeze_harness.run_records import Recorder

    name = "language_model.decoder.layers.0.mlp.linear_fc1.weight"

    class Writer(Recorder, _WriteFrozen):
        def __init__(self) -> None:
            Recorder.__init__(self)
            _WriteFrozen.__init__(self, name)

        def on_train_step_end(self, context: Any) -> None:
            Recorder.on_train_step_end(self, context)
            _WriteFrozen.on_train_step_end(self, context)

    with pytest.raises(FrozenPartTrainedError) as raised:
        _run(tmp_path, callbacks=[Writer()])
    message = str(raised.value)
    assert "step 2, after optimizer step 1" in message and name in message
    assert "freeze_language_model=True" in message


def test_strict_mode_raises_instead_of_warning(tmp_path, monkeypatch):
    with pytest.raises(TrainingAuditError, match=r"vision_model\.merger\.linear_fc1\.weight.*strict audit"):
        _run(tmp_path, hooks=(_detach_merger,), fields={"audit_strict": True})
    monkeypatch.setenv("BRIDGE_FREEZE_AUDIT_STRICT", "1")
    with pytest.raises(TrainingAuditError):
        _run(tmp_path / "env", hooks=(_detach_merger,))


@pytest.mark.parametrize("how", ["field", "variable"])
def test_the_audit_turned_off_runs_nothing(tmp_path, monkeypatch, caplog, how):

    caplog.set_level(logging.INFO, logger="bridge_freeze_plugin")
    if how == "variable":
        monkeypatch.setenv("BRIDGE_FREEZE_AUDIT_STEPS", "0")
    provider = _run(tmp_path, hooks=(_detach_merger,), fields={"audit_steps": 0} if how == "field" else None)
    assert last_audit(provider) is None and not _pending(provider)
    assert not [r for r in caplog.records if r.getMessage().startswith("bridge-freeze audit")]


def test_audit_steps_sets_how_many_steps_and_the_audit_is_gone_after(tmp_path):

    provider = _run(tmp_path, fields={"audit_steps": 1}, iters=3)
    report = last_audit(provider)
    assert report.steps == 1 and report.held_through == 0 and len(report.part(
        bridge_freeze_plugin.Part.VISION_PROJECTION).grad_norms) == 1
    assert not _pending(provider)  # checked once more after optimizer step 1, then removed


def test_a_malformed_setting_fails_before_the_model_is_built(monkeypatch):
    from bridge_freeze_harness.train import make_provider
    from bridge_freeze_plugin import InvalidFreezeConfigError

    provider = make_provider("qwen3_vl")
    provider.audit_steps = "three"
    with pytest.raises(InvalidFreezeConfigError, match=r"audit_steps='three' on Qwen3VLModelProvider"):
        provider.provide_distributed_model(wrap_with_ddp=True, use_cpu_initialization=True)
    provider.audit_steps = 3
    monkeypatch.setenv("BRIDGE_FREEZE_AUDIT_STRICT", "maybe")
    with pytest.raises(InvalidFreezeConfigError, match="BRIDGE_FREEZE_AUDIT_STRICT='maybe'"):
        provider.provide_distributed_model(wrap_with_ddp=True, use_cpu_initialization=True)


def test_the_block_lists_each_part_with_its_counts(tmp_path):
    report = last_audit(_run(tmp_path, selection=FreezeSelection(freeze_vision_model=True)))
    rows = {m["part"]: (int(m["t"].replace(",", "")), m["g"]) for m in re.finditer(
        r"^  (?P<part>\w+)\s+(?P<t>[\d,]+)\s+(?P<g>[\d,-]+)", report.format(), flags=re.MULTILINE)}
    names = _names("qwen3_vl")
    counts = {p: sum(1 for v in names.values() if v == p) for p in ("language_model", "vision_projection")}
    assert rows["language_model"] == (counts["language_model"], str(counts["language_model"]))
    assert rows["vision_projection"] == (counts["vision_projection"], str(counts["vision_projection"]))
    assert rows["vision_model"] == (0, "-")


def test_a_model_dropped_untrained_takes_its_audit_with_it_and_an_inference_forward_starts_nothing():
    import gc
    import weakref

    import torch

    from bridge_freeze_harness.cpu_training import cpu_training
    from bridge_freeze_harness.ddp_steps import build_ddp_chunks
    from bridge_freeze_harness.forward import forward_patches
    from bridge_freeze_harness.train import make_provider, synthetic_batch, train_spec
    from bridge_freeze_plugin.audit import audit_of

    provider = make_freezable(make_provider("qwen3_vl"), PROJECTION_ONLY)
    with cpu_training("qwen3_vl"), forward_patches("qwen3_vl"):
        chunks = build_ddp_chunks(provider, "qwen3_vl", distributed_optimizer=False, bf16=False, device="cpu")
        audit = audit_of(chunks)
        assert audit is not None and audit.held is None
        modules = list(chunks[0].modules())
        assert not [m for m in modules if m._forward_hooks]  # nothing hooked until the model trains
        batch = synthetic_batch("qwen3_vl", provider)
        with torch.no_grad():  # a log-probability pass, say
            chunks[0](**train_spec("qwen3_vl").forward_kwargs(batch))
        assert audit.held is None and not [m for m in modules if m._forward_hooks]
    gone = weakref.ref(audit)
    del chunks, audit, modules
    gc.collect()
    assert gone() is None


class _StatisticsMoveAgain:
    """A Bridge callback undoing the plugin's eval-mode forward of frozen BatchNorms (what round 4 found)."""

    def on_train_start(self, context: Any) -> None:
        from bridge_freeze_plugin.prewrap import STATS_ATTR

        for chunk in context.model:
            for module in chunk.modules():
                if getattr(module, STATS_ATTR, False):
                    setattr(module, STATS_ATTR, False)


OMNI_FROZEN_ENCODERS = FreezeSelection(freeze_vision_model=True, freeze_audio_model=True)


def test_a_frozen_sound_encoders_batchnorm_statistics_are_held(tmp_path):
    """Nemotron Omni's conformer sound encoder (BatchNorm) frozen: its statistics are among what holds (Bridge's
    nemotron_omni_step hands bf16 media: the bf16_mixed recipe)."""
    from bridge_freeze_harness.tiny import build_tiny_model
    from bridge_freeze_harness.train import make_provider

    model = build_tiny_model("nemotron_omni", make_provider("nemotron_omni"))
    # under llava_model. in the LLaVA model (0.6.x), at the top level of 0.7.0's NemotronOmniModel
    statistics = {n for n, _ in model.named_buffers() if re.match(r"(llava_model\.)?sound_model\.", n)
                  and n.rpartition(".")[2] in ("running_mean", "running_var")}
    report = last_audit(_run(tmp_path, "nemotron_omni", OMNI_FROZEN_ENCODERS, fields={"audit_steps": 1}, iters=2,
                             bf16=True))
    assert statistics and report.held_buffers >= len(statistics) and report.steps == 1


def test_batchnorm_statistics_that_move_in_a_frozen_encoder_are_an_error_naming_them(tmp_path):
    from bridge_freeze_harness.run_records import Recorder

    class Mover(Recorder, _StatisticsMoveAgain):
        def on_train_start(self, context: Any) -> None:
            Recorder.on_train_start(self, context)
            _StatisticsMoveAgain.on_train_start(self, context)

    with pytest.raises(FrozenPartTrainedError, match=r"(llava_model\.)?sound_model\..*running_mean") as raised:
        _run(tmp_path, "nemotron_omni", OMNI_FROZEN_ENCODERS, fields={"audit_steps": 1}, iters=2, bf16=True,
             callbacks=[Mover()])
    message = str(raised.value)
    assert "step 1, before any optimizer step" in message and "running statistics move" in message
