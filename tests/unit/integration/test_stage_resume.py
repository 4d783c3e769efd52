"""A selection that changes between runs (issue 45 item 2), through Bridge's real ``pretrain()`` / ``finetune()``.

Stage 1 trains only Qwen3-VL's vision projection (the tiny model, 4 iterations, a torch_dist checkpoint every 2);
stage 2 trains the language model too. Resuming stage 2 from stage 1's iteration 2 with its optimizer state is
refused before anything loads or trains, with the plain and the distributed optimizer; so is a pattern change
that keeps every size (the projection's two DeepStack mergers swapped: megatron-core 0.19.2 loads it without a
word and gives merger 1's Adam moments to merger 0, docs/stages.md). The same selection still resumes bitwise,
and a new stage from the checkpoint without its optimizer state (``load_optim=False``; ``finetune()`` from it as
``pretrained_checkpoint``) is accepted. Expected values are written here from what each stage asked.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from _shared import PROJECTION_ONLY, PROJECTION_ONLY_FLAGS

import bridge_freeze_plugin  # noqa: F401  (the plugin active, as in a user's job)
from bridge_freeze_harness.run_records import Recorder, iteration_dir, read_checkpoint
from bridge_freeze_plugin import FreezeSelection, SelectionChange, SelectionChangedError, make_freezable

pytestmark = [pytest.mark.usefixtures("cpu_bridge"), pytest.mark.slow]

ITERS = 4
RNG = "rng_state"
LM_AND_PROJECTION = FreezeSelection(freeze_vision_model=True)
#: the two DeepStack mergers of the tiny Qwen3-VL have the same shapes: freezing one or the other trains as many
#: elements, in the same places of the distributed optimizer's flat buffer
MERGER_0, MERGER_1 = (rf"vision_model\.decoder\.deepstack_merger_list\.{i}" for i in (0, 1))


class _Log(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _train(workdir: Path, selection: FreezeSelection, *, dist: bool, load: Path | None = None,
           pretrained: Path | None = None, load_optim: bool = True) -> tuple[Recorder, str]:
    """Bridge's ``pretrain()`` (``finetune()`` with ``pretrained``) for ``ITERS`` iterations; ``load``: from its
    iteration 2. Returns the run's recorder and what the plugin logged."""
    from megatron.bridge.training.utils.checkpoint_utils import read_run_config, read_train_state

    from bridge_freeze_harness.cpu_training import run_training, training_config
    from bridge_freeze_harness.train import make_provider

    # Bridge caches both readers and trains on the TrainState object read_train_state returned: a second run in
    # this process from the same iteration would start where the first ended. Cleared as Bridge's tests clear them.
    read_run_config.cache_clear()
    read_train_state.cache_clear()
    provider = make_freezable(make_provider("qwen3_vl", hidden_dropout=0.0), selection)
    cfg = training_config(provider, workdir, ITERS, save_interval=2, load=load,
                          load_step=None if load is None else 2, pretrained_checkpoint=pretrained,
                          distributed_optimizer=dist)
    cfg.checkpoint.load_optim = load_optim
    recorder, log = Recorder(), _Log()
    plugin_logger = logging.getLogger("bridge_freeze_plugin")
    level = plugin_logger.level
    plugin_logger.addHandler(log)
    plugin_logger.setLevel(logging.INFO)
    try:
        run_training(cfg, callbacks=[recorder])
    finally:
        plugin_logger.removeHandler(log)
        plugin_logger.setLevel(level)
    return recorder, "\n".join(log.lines)


@pytest.fixture(scope="module")
def stage1(tmp_path_factory) -> Callable[[str], Path]:
    """Stage 1 (the projection only), once per optimizer (``plain`` / ``dist``), on first use: its checkpoints."""
    root, done = tmp_path_factory.mktemp("stage1"), {}

    def checkpoints(optimizer: str) -> Path:
        if optimizer not in done:
            _train(root / optimizer, PROJECTION_ONLY, dist=optimizer == "dist")
            done[optimizer] = root / optimizer / "checkpoints"
        return done[optimizer]

    return checkpoints


def _refused(workdir: Path, selection: FreezeSelection, load: Path, *, dist: bool) -> SelectionChangedError:
    with pytest.raises(SelectionChangedError) as caught:
        _train(workdir, selection, dist=dist, load=load)
    assert not list((workdir / "checkpoints").glob("iter_*"))  # nothing trained, nothing saved
    return caught.value


@pytest.mark.parametrize("optimizer", ["plain", "dist"])
def test_resuming_with_the_language_model_unfrozen_is_refused_naming_the_change(stage1, tmp_path, optimizer):
    load = stage1(optimizer)
    error = _refused(tmp_path / "stage2", LM_AND_PROJECTION, load, dist=optimizer == "dist")
    saved_file = iteration_dir(load, 2) / "run_config.yaml"
    assert error.changes == (SelectionChange("freeze_language_model", True, False),)
    assert error.path == str(saved_file)
    message = str(error)
    assert "freeze_language_model: true in the checkpoint, false in this run" in message
    assert str(saved_file) in message and "Qwen3VLModelProvider" in message
    assert "keep the checkpoint's selection (freeze_language_model=true)" in message
    assert "checkpoint.load_optim=false" in message and f"checkpoint.pretrained_checkpoint={load}" in message


def test_a_pattern_change_that_keeps_every_size_is_refused_too(tmp_path):
    """On megatron-core alone this resume loads, merger 0 getting merger 1's Adam moments (docs/stages.md)."""
    first = FreezeSelection(**PROJECTION_ONLY_FLAGS, freeze_patterns=[MERGER_0])
    _train(tmp_path / "first", first, dist=True)  # the plain optimizer cannot save one layer of a stack alone
    second = FreezeSelection(**PROJECTION_ONLY_FLAGS, freeze_patterns=[MERGER_1])
    error = _refused(tmp_path / "second", second, tmp_path / "first" / "checkpoints", dist=True)
    assert error.changes == (SelectionChange("freeze_patterns", (MERGER_0,), (MERGER_1,)),)
    assert f"freeze_patterns: [{MERGER_0!r}] in the checkpoint, [{MERGER_1!r}] in this run" in str(error)


def test_the_same_selection_still_resumes_bitwise(stage1, tmp_path):
    load = stage1("dist")
    resumed, log = _train(tmp_path / "resumed", PROJECTION_ONLY, dist=True, load=load)
    assert len(resumed.losses) == ITERS - 2
    assert not iteration_dir(tmp_path / "resumed" / "checkpoints", 2).exists()  # it started from iteration 2
    a = read_checkpoint(iteration_dir(load, ITERS))
    b = read_checkpoint(iteration_dir(tmp_path / "resumed" / "checkpoints", ITERS))
    assert a.keys() == b.keys() and any(k.startswith("optimizer.") for k in a)
    assert [k for k in a if not k.startswith(RNG) and not _same(a[k], b[k])] == []
    assert f"resuming from {iteration_dir(load, 2)} with its optimizer state: the checkpoint's selection" in log


def test_a_new_stage_without_the_optimizer_state_is_accepted(stage1, tmp_path):
    load = stage1("dist")
    # load_optim=False: the checkpoint's weights (and iteration), a fresh optimizer for what trains now
    recorder, log = _train(tmp_path / "no_optim", LM_AND_PROJECTION, dist=True, load=load, load_optim=False)
    assert len(recorder.losses) == ITERS - 2
    assert "starts a new stage from its weights" in log and "checkpoint.load_optim=false" in log
    trained = set().union(*(g.names for g in recorder.groups))
    assert any(n.startswith("language_model.") for n in trained)
    # finetune() with the checkpoint as pretrained_checkpoint: its latest weights, iteration 0, no optimizer state
    recorder, _ = _train(tmp_path / "finetune", LM_AND_PROJECTION, dist=True, pretrained=load)
    assert len(recorder.losses) == ITERS
    saved = read_checkpoint(iteration_dir(load, ITERS))
    for name in ("vision_model.merger.linear_fc1.weight", "language_model.embedding.word_embeddings.weight"):
        assert torch.equal(recorder.initial[name], saved[name]), name


def _same(a: Any, b: Any) -> bool:
    if torch.is_tensor(a):
        return torch.is_tensor(b) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)
