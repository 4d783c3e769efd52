"""Bridge's REAL training loop with the plugin active, on the CPU (issue 21): ``pretrain()``, ``finetune()``,
``setup()``, ``setup_optimizer()`` and the torch_dist checkpoints they write, on a tiny real Qwen3-VL.

The CPU patches are :func:`bridge_freeze_harness.cpu_training.cpu_training`; the data is the harness's synthetic
batches in ``vlm_step``'s layout. Every run is done once per module (``runs``) and read back: a Bridge callback
records what the DDP grad buffers and the optimizer hold and each parameter's initial value
(:class:`~bridge_freeze_harness.run_records.Recorder`), and the checkpoints are read with torch's own reader.
Expected sets are written here from the tiny model's parameter names (prefixes below), not with the plugin.
No dropout (``hidden_dropout=0``): a bitwise resume needs the same random stream, which ``load_rng=False`` does not
restore. The DP2 run (2 processes over gloo), when selected, starts in the background with the module's first run.
"""

from __future__ import annotations

import logging
import re
import threading
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from _shared import PROJECTION_ONLY, join_or_kill, start_forked
from _shared import QWEN3_PROJECTION as PROJECTION

import bridge_freeze_plugin  # noqa: F401  (the plugin active, as in a user's job)
from bridge_freeze_harness.cpu_runtime import free_port
from bridge_freeze_harness.run_records import Recorder, iteration_dir, model_tensors, read_checkpoint
from bridge_freeze_plugin import FreezeSelection, make_freezable

#: Qwen3-VL's projection: the merger and the DeepStack mergers (inside ``vision_model``).
VISION = re.compile(r"^vision_model\.")
#: LoRA's adapters on a Megatron linear.
ADAPTER = re.compile(r"\.adapter\.linear_(in|out)\.weight$")
#: torch_dist stacks the layers of a ModuleList into one tensor per module (leading dimension: the layer).
STACKED = re.compile(r"^(?P<head>.*\.(?:layers|deepstack_merger_list))\.(?P<index>\d+)\.(?P<tail>.*)$")
ITERS = 4
RNG = "rng_state"  # load_rng=False: a resumed run's generator state differs (no dropout: never drawn from)


#: megatron-core's local GPT layer saves the language model's layer norms under TransformerEngine's fused names
#: (its ``sharded_state_dict_keys_map``), so a checkpoint loads into either implementation.
LM_NORM_KEYS = {"input_layernorm.": "self_attention.linear_qkv.layer_norm_",
                "pre_mlp_layernorm.": "mlp.linear_fc1.layer_norm_"}


def checkpoint_entry(name: str) -> tuple[str, int | None]:
    """A parameter's checkpoint key and its index in a stacked entry."""
    name = name.replace(".to_wrap.", ".")  # LoRA's wrapped linear keeps the linear's own key
    if name.startswith("language_model.decoder.layers."):
        for local, fused in LM_NORM_KEYS.items():
            name = name.replace(f".{local}", f".{fused}")
    match = STACKED.match(name)
    return (f"{match['head']}.{match['tail']}", int(match["index"])) if match else (name, None)


def saved(checkpoint: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    key, index = checkpoint_entry(name)
    return checkpoint[key] if index is None else checkpoint[key][index]


def same(a: Any, b: Any) -> bool:
    """Bitwise equality through nested checkpoint entries."""
    if torch.is_tensor(a):
        return torch.is_tensor(b) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@dataclass
class Run:
    save: Path
    recorder: Recorder
    log: str
    _checkpoints: dict[int, dict[str, Any]] = field(default_factory=dict)

    def checkpoint(self, iteration: int) -> dict[str, Any]:
        if iteration not in self._checkpoints:
            self._checkpoints[iteration] = read_checkpoint(iteration_dir(self.save, iteration))
        return self._checkpoints[iteration]

    def model(self, iteration: int) -> dict[str, torch.Tensor]:
        return model_tensors(self.checkpoint(iteration))

    @property
    def names(self) -> set[str]:
        return set(self.recorder.initial)


ADAPTER_LR = {"lr_adapters": 5e-3}
PART_LRS = {"lr_vision_model": 0.0, "lr_vision_projection": 2e-2}
RUNS: dict[str, dict[str, Any]] = {
    "plain": {"iters": ITERS, "save_interval": 2},
    "dist": {"iters": ITERS, "save_interval": 2, "distributed_optimizer": True},
    "plain_resume": {"iters": ITERS, "save_interval": 2, "load_from": "plain"},
    "dist_resume": {"iters": ITERS, "save_interval": 2, "distributed_optimizer": True, "load_from": "dist"},
    "lr_plain": {"iters": 1, "selection": FreezeSelection(freeze_language_model=True), "part_lrs": PART_LRS},
    "lr_dist": {"iters": 1, "selection": FreezeSelection(freeze_language_model=True), "part_lrs": PART_LRS,
                "distributed_optimizer": True},
    # LoRA on the frozen LM's and vision encoder's attention, the projection at full rank; from "plain"'s weights
    "lora": {"iters": ITERS, "save_interval": 2, "lora": True, "pretrained": "plain", "distributed_optimizer": True,
             "bf16_mixed": True, "part_lrs": ADAPTER_LR},
    "lora_resume": {"iters": ITERS, "save_interval": 2, "lora": True, "pretrained": "plain",
                    "distributed_optimizer": True, "bf16_mixed": True, "part_lrs": ADAPTER_LR, "load_from": "lora"},
    # the DP2 run's reference: one process, the same two samples per iteration as two micro-batches
    "gbs2": {"iters": 2, "distributed_optimizer": True, "global_batch_size": 2},
}


class Runs:
    """Each named run of :data:`RUNS`, done once, on first use."""

    def __init__(self, root: Path) -> None:
        self.root, self.done = root, {}

    def get(self, name: str) -> Run:
        if name not in self.done:
            self.done[name] = self._train(name, **RUNS[name])
        return self.done[name]

    def _train(self, name: str, *, iters: int, selection: FreezeSelection = PROJECTION_ONLY, lora: bool = False,
               load_from: str | None = None, pretrained: str | None = None, part_lrs: dict | None = None,
               **options: Any) -> Run:
        from megatron.bridge.peft.lora import LoRA

        from bridge_freeze_harness.cpu_training import run_training, training_config
        from bridge_freeze_harness.train import make_provider
        from bridge_freeze_plugin.optim import PartLROverrideProvider

        provider = make_freezable(make_provider("qwen3_vl", hidden_dropout=0.0), selection)
        cfg = training_config(
            provider, self.root / name, iters,
            load=None if load_from is None else self.get(load_from).save, load_step=None if load_from is None else 2,
            pretrained_checkpoint=None if pretrained is None else self.get(pretrained).save,
            peft=LoRA(target_modules=["linear_qkv", "linear_proj"], dim=4, alpha=8) if lora else None,
            optimizer_config_override_provider=PartLROverrideProvider(**part_lrs) if part_lrs else None, **options)
        recorder, capture = Recorder(), _Capture()
        plugin_logger = logging.getLogger("bridge_freeze_plugin")
        level = plugin_logger.level
        plugin_logger.addHandler(capture)
        plugin_logger.setLevel(logging.INFO)
        try:
            run_training(cfg, callbacks=[recorder])  # finetune() with LoRA, pretrain() otherwise
        finally:
            plugin_logger.removeHandler(capture)
            plugin_logger.setLevel(level)
        return Run(Path(cfg.checkpoint.save), recorder, "\n".join(capture.lines))


class DataParallelRun:
    """``pretrain()`` on 2 ranks over gloo (tests/unit/_training_worker.py), started at once in a background thread.

    The ranks are forked from the session's forkserver, which imported Bridge once (``bridge_forkserver``). A hard
    timeout: a rank still alive then is killed (only the processes started here) and the test fails.
    """

    WORLD, ITERS, TIMEOUT_S = 2, 2, 240.0

    def __init__(self, workdir: Path, forkserver: Any) -> None:
        self.workdir, self.forkserver = workdir, forkserver
        self.hung: list[int] = []
        self.error: str | None = None
        self.thread = threading.Thread(target=self._launch_or_record, daemon=True)
        self.thread.start()

    def _launch_or_record(self) -> None:
        try:
            self._launch()
        except Exception:  # noqa: BLE001  (the test reports it)
            self.error = traceback.format_exc()

    def _launch(self) -> None:
        port = free_port()
        procs = []
        for rank in range(self.WORLD):  # each rank's output in rank<N>.log
            log = self.workdir / f"rank{rank}.log"
            procs.append(start_forked(self.forkserver, log, log, "_training_worker", "rank_main", rank, self.WORLD,
                                      str(self.workdir), self.ITERS, port))
        self.hung = join_or_kill(procs, self.TIMEOUT_S)

    def results(self) -> list[dict[str, Any]]:
        self.thread.join(self.TIMEOUT_S + 30)
        assert self.error is None, f"starting the ranks failed:\n{self.error}"
        assert not self.hung, f"ranks {self.hung} were still running after {self.TIMEOUT_S}s and were killed"
        out = []
        for rank in range(self.WORLD):
            path = self.workdir / f"rank{rank}.pt"
            log = self.workdir / f"rank{rank}.log"
            assert path.exists(), f"rank {rank} wrote no result:\n{log.read_text()[-3000:] if log.exists() else ''}"
            result = torch.load(path, weights_only=False)
            assert result["ok"], f"rank {rank} failed:\n{result['traceback']}"
            out.append(result)
        return out


@pytest.fixture(scope="module")
def dp2(tmp_path_factory, bridge_forkserver) -> Iterator[DataParallelRun]:
    run = DataParallelRun(tmp_path_factory.mktemp("dp2"), bridge_forkserver)
    yield run
    run.thread.join(DataParallelRun.TIMEOUT_S + 30)  # never leave ranks behind


@pytest.fixture(scope="module")
def runs(request, cpu_bridge, tmp_path_factory) -> Runs:
    if any(item.name.startswith("test_dp2") for item in request.session.items):
        request.getfixturevalue("dp2")  # start the 2-rank run now: it overlaps this process's runs
    return Runs(tmp_path_factory.mktemp("bridge_training"))


# ---------------------------------------------------------------- a. what trains, what is saved


@pytest.mark.parametrize("optimizer", ["plain", "dist"])
def test_pretrain_trains_exactly_the_projection_and_never_touches_a_frozen_tensor(runs, optimizer):
    run = runs.get(optimizer)
    trained = {n for n in run.names if PROJECTION.match(n)}
    assert trained and trained < run.names
    assert run.recorder.grad_buffer_names == trained  # the DDP grad buffer: exactly the trainable tensors
    assert run.recorder.grad_buffer_numel == sum(run.recorder.initial[n].numel() for n in trained)
    assert set().union(*(g.names for g in run.recorder.groups)) == trained  # and the optimizer
    early, final = run.model(2), run.model(ITERS)
    assert set(final) == {checkpoint_entry(n)[0] for n in run.names}  # the whole model is saved
    for name in sorted(run.names):
        start = run.recorder.initial[name]
        if name in trained:
            assert not torch.equal(saved(final, name), start), f"{name} did not train"
        else:
            assert torch.equal(saved(early, name), start) and torch.equal(saved(final, name), start), name


# ---------------------------------------------------------------- b. resume


@pytest.mark.parametrize("optimizer", ["plain", "dist"])
def test_resume_from_the_middle_matches_an_uninterrupted_run_bitwise(runs, optimizer):
    full, resumed = runs.get(optimizer), runs.get(f"{optimizer}_resume")
    assert not iteration_dir(resumed.save, 2).exists()  # it started from the other run's iteration 2
    a, b = full.checkpoint(ITERS), resumed.checkpoint(ITERS)
    assert a.keys() == b.keys()
    assert any(k.startswith("optimizer.") for k in a)
    different = [k for k in a if not k.startswith(RNG) and not same(a[k], b[k])]
    assert different == []  # model, optimizer state and step, scheduler, iteration
    assert resumed.recorder.losses == full.recorder.losses[2:]


# ---------------------------------------------------------------- c. per-part learning rates


@pytest.mark.parametrize("optimizer", ["plain", "dist"])
def test_per_part_learning_rates_are_applied_by_bridges_setup_optimizer(runs, optimizer):
    run = runs.get(f"lr_{optimizer}")
    projection = {n for n in run.names if PROJECTION.match(n)}
    vision = {n for n in run.names if VISION.match(n)} - projection
    assert set().union(*(g.names for g in run.recorder.groups)) == vision | projection
    for name in vision:  # lr_vision_model=0.0: in a group at 0, and bitwise unchanged
        group = run.recorder.group_of(name)
        assert (group.max_lr, group.min_lr, group.lr) == (0.0, 0.0, 0.0), name
    for name in projection:  # its own peak; its minimum keeps the global ratio (min_lr / lr = 0.1)
        group = run.recorder.group_of(name)
        assert (group.max_lr, group.lr) == (2e-2, 2e-2) and group.min_lr == pytest.approx(2e-3, rel=1e-12), name
    assert "per-part learning rates applied: vision_model 0 (min 0), vision_projection 0.02 (min 0.002)" in run.log
    final = run.model(1)
    assert all(torch.equal(saved(final, n), run.recorder.initial[n]) for n in vision)
    assert all(not torch.equal(saved(final, n), run.recorder.initial[n]) for n in projection)


# ---------------------------------------------------------------- d. LoRA with a full-rank projection


def test_lora_finetune_saves_exactly_the_adapters_and_the_full_rank_projection(runs):
    run, base = runs.get("lora"), runs.get("plain")
    adapters = {n for n in run.names if ADAPTER.search(n)}
    projection = {n for n in run.names if PROJECTION.match(n)}
    assert {n.split(".")[0] for n in adapters} == {"language_model", "vision_model"}
    assert not any(PROJECTION.match(n) for n in adapters)
    assert run.recorder.grad_buffer_names == adapters | projection
    final = run.model(ITERS)
    assert set(final) == {checkpoint_entry(n)[0] for n in adapters | projection}
    # every base weight (the projection too) came from the pretrained checkpoint, cast to bf16 (bf16_mixed)
    base_final = base.model(ITERS)
    for name in run.names - adapters:
        start = run.recorder.initial[name]
        assert torch.equal(start, saved(base_final, name).to(start.dtype)), name
    for name in adapters | {n for n in projection if ".linear_fc" in n and n.endswith(".weight")}:
        assert not torch.equal(saved(final, name), run.recorder.initial[name]), f"{name} did not train"
    for name in adapters:
        assert (run.recorder.group_of(name).max_lr, run.recorder.group_of(name).min_lr) == pytest.approx((5e-3, 5e-4))
    assert all(run.recorder.group_of(n).max_lr == 1e-3 for n in projection)
    assert "per-part learning rates applied: adapters 0.005 (min 0.0005)" in run.log


def test_lora_finetune_resumes_bitwise(runs):
    full, resumed = runs.get("lora"), runs.get("lora_resume")
    a, b = full.checkpoint(ITERS), resumed.checkpoint(ITERS)
    assert a.keys() == b.keys()
    assert [k for k in a if not k.startswith(RNG) and not same(a[k], b[k])] == []
    assert resumed.recorder.losses == full.recorder.losses[2:]


# ---------------------------------------------------------------- e. data parallel 2 over gloo


def test_dp2_distributed_optimizer_reduces_grads_and_keeps_frozen_tensors(runs, dp2):
    reference = runs.get("gbs2")  # runs here while the ranks run in their processes
    ranks = dp2.results()
    trained = {n for n in reference.names if PROJECTION.match(n)}
    for result in ranks:
        assert result["grad_buffer_names"] == trained
        assert result["grad_buffer_numel"] == sum(reference.recorder.initial[n].numel() for n in trained)
        assert result["initial"].keys() == reference.recorder.initial.keys()
        assert all(torch.equal(result["initial"][n], reference.recorder.initial[n]) for n in reference.names)
    assert ranks[0]["losses"] == ranks[1]["losses"]  # the DP-averaged loss, the same on both ranks
    assert ranks[0]["losses"] == pytest.approx(reference.recorder.losses, rel=1e-5)
    dp = model_tensors(read_checkpoint(iteration_dir(dp2.workdir / "checkpoints", DataParallelRun.ITERS)))
    single = reference.model(DataParallelRun.ITERS)
    for name in sorted(reference.names):
        start = reference.recorder.initial[name]
        if name in trained:  # each rank saw one sample: only averaged gradients give the 2-sample step
            assert not torch.equal(saved(dp, name), start), name
            torch.testing.assert_close(saved(dp, name), saved(single, name), rtol=1e-5, atol=1e-6, msg=name)
        else:
            assert torch.equal(saved(dp, name), start), name
