"""Checkpoints of what trains (issue 45 item 1), through Bridge's real ``pretrain()`` / ``finetune()``.

A base (the tiny Qwen3-VL, everything trained 2 iterations, a torch_dist checkpoint at 1 and 2) is the frozen base of
projection-only ``finetune()`` runs of 4 iterations (a checkpoint every 2). With ``save_trainable_only`` a save
holds the projection's tensors and their optimizer state only, and is smaller than the full save of the same run,
which trains alike (same losses, same projection tensors); a resume from iteration 2 on the same base ends with
iteration 4's checkpoint bit-identical to the uninterrupted run's, its frozen weights the base's (with the plain
and the distributed optimizer); so with LoRA on
the language model's attention next to the full-rank projection. A trainable-only checkpoint loaded without its
base, on another base, or as a base, and the field without a base, are refused before anything trains. The
expected names are written here (the projection's prefixes, LoRA's adapter names), never read from the plugin.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from _shared import PROJECTION_ONLY, QWEN3_PROJECTION

import bridge_freeze_plugin  # noqa: F401  (the plugin active, as in a user's job)
from bridge_freeze_harness.run_records import Recorder, iteration_dir, model_tensors, read_checkpoint
from bridge_freeze_plugin import FreezeSelection, TrainableOnlyCheckpointError, make_freezable

pytestmark = [pytest.mark.usefixtures("cpu_bridge"), pytest.mark.slow]

ITERS = 4
RNG = "rng_state"
SIDECAR = "bridge_freeze_base.json"
#: LoRA on the language model's attention (a scoped target: the projection trains at full rank next to it)
LORA_TARGETS = ["language_model.*linear_qkv"]
LORA_KEYS = {f"language_model.decoder.layers.self_attention.linear_qkv.adapter.{m}.weight"
             for m in ("linear_in", "linear_out")}


def _train(workdir: Path, *, field: bool = True, selection: FreezeSelection = PROJECTION_ONLY,
           pretrained: Path | None = None, load: Path | None = None, iters: int = ITERS, save_interval: int = 2,
           lora: bool = False, dist: bool = False) -> Recorder:
    """Bridge's ``finetune()`` (``pretrain()`` without ``pretrained``); ``load``: resume from its iteration 2."""
    from megatron.bridge.peft.lora import LoRA
    from megatron.bridge.training.utils.checkpoint_utils import read_run_config, read_train_state

    from bridge_freeze_harness.cpu_training import run_training, training_config
    from bridge_freeze_harness.train import make_provider

    read_run_config.cache_clear()  # Bridge caches both; a second run from the same iteration would reuse them
    read_train_state.cache_clear()
    provider = make_freezable(make_provider("qwen3_vl", hidden_dropout=0.0), selection)
    provider.save_trainable_only = field
    peft = LoRA(target_modules=list(LORA_TARGETS), dim=4, alpha=8) if lora else None
    cfg = training_config(provider, workdir, iters, save_interval=save_interval, load=load,
                          load_step=None if load is None else 2, pretrained_checkpoint=pretrained, peft=peft,
                          distributed_optimizer=dist)
    recorder = Recorder()
    run_training(cfg, callbacks=[recorder])
    return recorder


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Callable[[str], tuple[Path, Recorder]]:
    """Each run once, on first use: its checkpoint directory and its recorder."""
    root, done = tmp_path_factory.mktemp("trainable_only"), {}
    plans: dict[str, Callable[[], dict[str, Any]]] = {
        "base": lambda: {"field": False, "selection": FreezeSelection(), "iters": 2, "save_interval": 1},
        "full": lambda: {"field": False, "pretrained": base()},
        "trainable": lambda: {"pretrained": base()},
        "resumed": lambda: {"pretrained": base(), "load": checkpoints("trainable")},
        "trainable_dist": lambda: {"pretrained": base(), "dist": True},
        "resumed_dist": lambda: {"pretrained": base(), "load": checkpoints("trainable_dist"), "dist": True},
        "lora": lambda: {"pretrained": base(), "lora": True},
        "lora_resumed": lambda: {"pretrained": base(), "lora": True, "load": checkpoints("lora")},
    }

    def run(name: str) -> tuple[Path, Recorder]:
        if name not in done:
            plan = plans[name]()
            done[name] = (root / name / "checkpoints", _train(root / name, **plan))
        return done[name]

    def checkpoints(name: str) -> Path:
        return run(name)[0]

    def base() -> Path:
        return checkpoints("base")

    return run


def _bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.iterdir() if p.is_file())


def test_a_trainable_only_save_holds_the_projection_and_its_optimizer_state(runs):
    full_dir, full = runs("full")
    only_dir, only = runs("trainable")
    assert only.losses == full.losses and len(only.losses) == ITERS  # the field changes no step
    full_ckpt, only_ckpt = read_checkpoint(iteration_dir(full_dir, ITERS)), read_checkpoint(iteration_dir(only_dir, 4))
    projection = {k for k in model_tensors(full_ckpt) if QWEN3_PROJECTION.match(k)}
    assert projection and set(model_tensors(only_ckpt)) == projection
    assert all(torch.equal(only_ckpt[k], full_ckpt[k]) for k in projection)
    optimizer_keys = {k for k in only_ckpt if k.startswith("optimizer.state.")}
    assert optimizer_keys == {k for k in full_ckpt if k.startswith("optimizer.state.")}  # both: the projection's
    common = [ckpt[k][0] for ckpt in (only_ckpt, full_ckpt) for k in ckpt if k.startswith("common_state")]
    assert [c["iteration"] for c in common] == [ITERS, ITERS]  # the iteration, the scheduler, the RNG kept
    assert common[0]["opt_param_scheduler"] == common[1]["opt_param_scheduler"]
    assert {k.split("/")[0] for k in only_ckpt if k.startswith(RNG)} == {RNG}
    frozen_bytes = sum(t.numel() * t.element_size() for k, t in model_tensors(full_ckpt).items() if k not in projection)
    saved_full, saved_only = _bytes(iteration_dir(full_dir, 4)), _bytes(iteration_dir(only_dir, 4))
    assert saved_full - saved_only >= frozen_bytes  # every frozen tensor left out (the record file is small)
    assert (iteration_dir(only_dir, 2) / SIDECAR).is_file() and not (iteration_dir(full_dir, 2) / SIDECAR).exists()
    saved = yaml.safe_load((iteration_dir(only_dir, 4) / "run_config.yaml").read_text())
    assert saved["model"]["save_trainable_only"] is True and saved["peft"] is None  # as the user's config wrote it


def _same(a: Any, b: Any) -> bool:
    if torch.is_tensor(a):
        return torch.is_tensor(b) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _resumes_bitwise(runs, first: str, resumed: str) -> dict[str, Any]:
    first_dir, uninterrupted = runs(first)
    resumed_dir, again = runs(resumed)
    assert again.losses == uninterrupted.losses[2:]
    assert not iteration_dir(resumed_dir, 2).exists()  # it started from iteration 2
    a, b = read_checkpoint(iteration_dir(first_dir, ITERS)), read_checkpoint(iteration_dir(resumed_dir, ITERS))
    assert a.keys() == b.keys() and any(k.startswith("optimizer.") for k in a)
    assert [k for k in a if not k.startswith(RNG) and not _same(a[k], b[k])] == []
    base = read_checkpoint(iteration_dir(runs("base")[0], 2))
    for name in ("language_model.embedding.word_embeddings.weight", "vision_model.patch_embed.proj.weight"):
        assert torch.equal(again.initial[name], base[name]), name  # the frozen base, not an initialisation
    return b


def _projection(runs) -> set[str]:
    """The projection's checkpoint keys, read from the full run's checkpoint by the prefixes written above."""
    return {k for k in model_tensors(read_checkpoint(iteration_dir(runs("full")[0], 2))) if QWEN3_PROJECTION.match(k)}


def _record(iteration: Path) -> dict[str, Any]:
    return json.loads((iteration / SIDECAR).read_text())


@pytest.mark.parametrize("optimizer", ["plain", "dist"])
def test_a_resume_from_a_trainable_only_checkpoint_continues_bitwise(runs, optimizer):
    suffix = "_dist" if optimizer == "dist" else ""
    saved = _resumes_bitwise(runs, f"trainable{suffix}", f"resumed{suffix}")
    assert set(model_tensors(saved)) == _projection(runs)  # it resumed from (and saved) the projection alone


def test_with_lora_the_adapters_and_the_full_rank_projection_are_saved_and_resume_bitwise(runs):
    saved = _resumes_bitwise(runs, "lora", "lora_resumed")
    assert set(model_tensors(saved)) == _projection(runs) | LORA_KEYS
    base = runs("base")[0]
    record = _record(iteration_dir(runs("lora")[0], 2))["base"]
    assert (record["pretrained_checkpoint"], record["loaded_from"]) == (str(base), str(iteration_dir(base, 2)))


def _refused(workdir: Path, **plan: Any) -> TrainableOnlyCheckpointError:
    with pytest.raises(TrainableOnlyCheckpointError) as caught:
        _train(workdir, **plan)
    assert not (workdir / "checkpoints").exists() or not list((workdir / "checkpoints").glob("iter_*"))
    return caught.value


def test_the_field_without_a_base_is_refused_before_the_build(tmp_path):
    error = _refused(tmp_path / "no_base")
    assert error.given == "" and "checkpoint.pretrained_checkpoint" in str(error)
    assert "save_trainable_only=true" in str(error) and "Qwen3VLModelProvider" in str(error)
    nowhere = tmp_path / "nowhere"
    error = _refused(tmp_path / "missing_base", pretrained=nowhere)
    assert error.given == str(nowhere) and f"checkpoint.pretrained_checkpoint={nowhere}, which does not exist" in str(
        error)


def test_a_trainable_only_checkpoint_without_its_base_is_refused_naming_both(runs, tmp_path):
    only_dir, base = runs("trainable")[0], runs("base")[0]
    error = _refused(tmp_path / "plain_resume", field=False, load=only_dir)  # pretrain(): no base at all
    assert error.checkpoint == str(iteration_dir(only_dir, 2)) and error.base == str(base)
    message = str(error)
    assert str(iteration_dir(only_dir, 2)) in message and str(base) in message
    assert f"checkpoint.pretrained_checkpoint={base}" in message and "save_trainable_only is false" in message
    # finetune() from it as if it were a full checkpoint: it cannot be a base
    error = _refused(tmp_path / "as_base", field=False, pretrained=iteration_dir(only_dir, 2))
    assert error.checkpoint == str(iteration_dir(only_dir, 2)) and "cannot be the base" in str(error)


def test_a_trainable_only_checkpoint_on_another_base_is_refused_naming_both(runs, tmp_path):
    only_dir, base = runs("trainable")[0], runs("base")[0]
    other = iteration_dir(base, 1)  # the same run's iteration 1: same files, same sizes, other weights
    error = _refused(tmp_path / "wrong_base", pretrained=other, load=only_dir)
    assert (error.base, error.given) == (str(base), str(other))
    message = str(error)
    assert str(base) in message and str(other) in message and str(iteration_dir(only_dir, 2)) in message
    assert f"checkpoint.pretrained_checkpoint={base}" in message
    error = _refused(tmp_path / "lora_wrong_base", pretrained=other, load=runs("lora")[0], lora=True)
    assert (error.base, error.given) == (str(base), str(other))


def test_a_selection_training_part_of_a_stacked_tensor_is_refused_before_it_trains(runs, tmp_path):
    """megatron-core saves Qwen3-VL's two DeepStack mergers as one tensor; a save of merger 1 alone fails in it."""
    one_merger = FreezeSelection(freeze_language_model=True, freeze_vision_model=True,
                                 freeze_patterns=[r"vision_model\.decoder\.deepstack_merger_list\.0"])
    error = _refused(tmp_path / "one_merger", selection=one_merger, pretrained=runs("base")[0])
    stacked = [f"vision_model.decoder.deepstack_merger_list.{name}" for name in
               ("linear_fc1.bias", "linear_fc1.weight", "linear_fc2.bias", "linear_fc2.weight", "patch_norm.bias",
                "patch_norm.weight")]  # merger 1 trains, merger 0 not: each of their six tensors
    assert f"and not the others ({', '.join(stacked)})" in str(error)


def test_an_extra_hf_save_with_the_field_is_refused_before_the_build(runs, tmp_path):
    """Bridge's extra HF save of a PEFT run is an adapter folder: with no adapters it would hold nothing trained."""
    from bridge_freeze_harness.cpu_training import run_training, training_config
    from bridge_freeze_harness.train import make_provider

    provider = make_freezable(make_provider("qwen3_vl", hidden_dropout=0.0), PROJECTION_ONLY)
    provider.save_trainable_only = True
    cfg = training_config(provider, tmp_path, ITERS, pretrained_checkpoint=runs("base")[0])
    cfg.checkpoint.also_save_hf_checkpoint = True
    with pytest.raises(TrainableOnlyCheckpointError, match="also_save_hf_checkpoint=true"):
        run_training(cfg)  # finetune(): its runtime_config_update validates the config before setup()
    assert cfg.peft is None and not (tmp_path / "checkpoints").exists()
