"""Checkpoint and resume per family, in Bridge's real ``finetune()`` from a tiny HF checkpoint (issue 38).

For each family the demo newly runs (Ministral 3 and ERNIE-4.5-VL: the batch keys their step takes; GLM-4.5V,
MiniMax-M3-VL and Gemma 4: the grouped-GEMM experts' torch_dist layout), the user's flow with the language model
(its routed experts included) and the projections training: ``AutoBridge.from_hf_pretrained`` ->
``to_megatron_provider(load_weights=True)`` -> the selection -> ``finetune()`` for 4 iterations with the
distributed optimizer, a checkpoint every 2; then a second run resumes from the first one's iteration 2. Its
iteration-4 checkpoint (model, optimizer state and step, scheduler, iteration; not the RNG state, which
``load_rng=False`` leaves) is bitwise the uninterrupted run's, and its losses are the uninterrupted run's last two.
No dropout: a bitwise resume needs the same random stream. The selection is checked on Bridge's optimizer: the
vision encoder's parameters (by name, below) are in no group, the language model's (its experts too) are.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch

import bridge_freeze_plugin  # noqa: F401  (the plugin active, as in a user's job)
from bridge_freeze_harness.run_records import Recorder, iteration_dir, read_checkpoint
from bridge_freeze_plugin import FreezeSelection, make_freezable

pytestmark = [pytest.mark.usefixtures("cpu_bridge"), pytest.mark.slow]

ITERS = 4
RNG = "rng_state"

#: family -> its vision encoder's Megatron parameter names (frozen here; from the family table, docs/families.md)
#: and whether its language model has routed experts.
CASES = {
    "ministral3": (r"^vision_tower\.", False),
    "ernie45_vl": (r"^vision_tower\.", True),
    "glm45v": (r"^visual\.(?!merger\.)", True),
    "minimax_m3_vl": (r"^vision_tower\.", True),
    "gemma4_vl": (r"^vision_tower\.", True),
}


def _same(a: Any, b: Any) -> bool:
    if torch.is_tensor(a):
        return torch.is_tensor(b) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _finetune(family: str, hf_dir: Path, workdir: Path, load: Path | None = None) -> Recorder:
    from megatron.bridge import AutoBridge

    from bridge_freeze_harness.cpu_training import run_training, training_config
    from bridge_freeze_harness.hf_checkpoint import cpu_provider, hf_build_patches

    bridge = AutoBridge.from_hf_pretrained(str(hf_dir))
    provider = make_freezable(cpu_provider(bridge, family, hidden_dropout=0.0, attention_dropout=0.0),
                              FreezeSelection(freeze_vision_model=True))
    cfg = training_config(provider, workdir, ITERS, family=family, save_interval=2, pretrained_checkpoint=hf_dir,
                          load=load, load_step=None if load is None else 2, distributed_optimizer=True, lr=1e-2)
    recorder = Recorder()
    with hf_build_patches(family):
        run_training(cfg, family=family, callbacks=[recorder])
    return recorder


@pytest.mark.parametrize("family", sorted(CASES))
def test_finetune_from_hf_resumes_bitwise_with_the_selection_kept(family, tmp_path):
    from bridge_freeze_harness.hf_checkpoint import write_tiny_hf_checkpoint

    vision, has_experts = CASES[family]
    hf_dir = write_tiny_hf_checkpoint(family, tmp_path / "hf", seed=0)
    full = _finetune(family, hf_dir, tmp_path / "full")
    resumed = _finetune(family, hf_dir, tmp_path / "resumed", load=tmp_path / "full" / "checkpoints")
    assert not iteration_dir(tmp_path / "resumed" / "checkpoints", 2).exists()  # it started from full's iteration 2
    a = read_checkpoint(iteration_dir(tmp_path / "full" / "checkpoints", ITERS))
    b = read_checkpoint(iteration_dir(tmp_path / "resumed" / "checkpoints", ITERS))
    assert a.keys() == b.keys() and any(k.startswith("optimizer.") for k in a)
    assert [k for k in a if not k.startswith(RNG) and not _same(a[k], b[k])] == []
    assert resumed.losses == full.losses[2:]
    # the selection: the vision encoder is in no optimizer group, the language model is (its experts too)
    frozen = {n for n in full.initial if re.search(vision, n)}
    trained = set().union(*(g.names for g in full.groups))
    assert frozen and not trained & frozen
    assert any(n.startswith("language_model.") for n in trained)
    experts = {n for n in trained if ".experts." in n}
    assert bool(experts) == has_experts
    if has_experts:  # saved with their optimizer state under the grouped GEMM's keys
        assert any(k.startswith("optimizer.") and "mlp.experts.experts.linear_fc1.weight" in k for k in a), sorted(a)
