"""Stage 2 from stage 1, end to end with Bridge's real ``finetune()`` and full checkpoints (issue 45 item 3).

Per family (Qwen3-VL; Gemma 3, an HF-tower family), from a tiny random HF checkpoint, as docs/stages.md writes it:

- stage 1: ``finetune()`` from the HF folder (``checkpoint.pretrained_checkpoint``) with only the projection
  training (``freeze_language_model``, ``freeze_vision_model``), 2 iterations, a torch_dist checkpoint at the end;
- stage 2: a new stage from stage 1's checkpoint: ``finetune()`` with it as ``pretrained_checkpoint`` (its weights,
  no optimizer state, iteration 0), a fresh ``checkpoint.load`` / ``save``, the language model and the projection
  training (``freeze_vision_model``); the provider is built without the HF weights, so every weight it starts
  from is stage 1's.

At each stage the tensors that changed are exactly those of the parts that train (part names from
``_family_parts``, written from the models' module trees, never the plugin's registry), and the rest is bit-identical
to the previous stage's output (in memory, and stage 2's checkpoint against stage 1's). Bridge's own HF export
(``export_hf_weights``) of the final model differs from the HF folder in exactly the HF tensors of the language model
and the projection (regexes over HF names written here), keeps the vision tower's bit for bit, and carries both
stages: the projection's tensors differ from stage 1's export too, the language model's first changed in stage 2.
Before each stage runs, ``bridge-freeze check-config`` on its config as Bridge writes it (``ConfigContainer.to_yaml``,
the ``run_config.yaml`` format) says the stage line of the recipe, and refuses stage 2's selection resuming stage 1
with its optimizer state. Only ``cpu_training``'s CPU patches stand between these runs and a GPU's (the harness's
outer layer: no CUDA here). Fails on the main of 2026-12-07 (266227e): check-config had no stage line; the rest of
the flow is the recipe's proof, and ran there too.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from _family_parts import part_of

import bridge_freeze_plugin  # noqa: F401  (the plugin active, as in a user's job)
from bridge_freeze_harness.run_records import Recorder, iteration_dir, model_tensors, read_checkpoint
from bridge_freeze_plugin import FreezeSelection, make_freezable

pytestmark = [pytest.mark.usefixtures("cpu_bridge"), pytest.mark.slow]

ITERS = 2
STAGE1 = FreezeSelection(freeze_language_model=True, freeze_vision_model=True)  # the projection alone
STAGE2 = FreezeSelection(freeze_vision_model=True)  # the language model with the projection
#: family -> (its projection's HF tensors, its language model's HF tensors), as its tiny checkpoint names them
HF_NAMES = {
    "qwen3_vl": (r"^model\.visual\.(merger|deepstack_merger_list\.\d+)\.", r"^(model\.language_model\.|lm_head\.)"),
    "gemma3_vl": (r"^multi_modal_projector\.", r"^(language_model\.|lm_head\.)"),
}


class _Stage(Recorder):
    """The :class:`Recorder` (the weights each stage starts from), plus the trained model and its weights."""

    model: Any = None
    final: dict[str, torch.Tensor]

    def on_train_end(self, context: Any) -> None:
        from bridge_freeze_harness.run_records import named_parameters

        self.model = context.model
        self.final = {n: p.detach().clone() for n, p in named_parameters(context.model).items()}


def _stage(family: str, hf_dir: Path, workdir: Path, selection: FreezeSelection, pretrained: Path,
           *, hf_weights: bool, check: Callable[[Path], None]) -> tuple[_Stage, dict[str, torch.Tensor]]:
    """One stage: Bridge's ``finetune()`` from ``pretrained``; its recorder and Bridge's HF export of its model.
    ``check`` is called with the stage's config, as Bridge writes it (``run_config.yaml``), before it runs."""
    from megatron.bridge import AutoBridge

    from bridge_freeze_harness.cpu_training import run_training, training_config
    from bridge_freeze_harness.hf_checkpoint import bridge_load_context, cpu_provider, hf_build_patches

    with bridge_load_context(family):
        bridge = AutoBridge.from_hf_pretrained(str(hf_dir))
    provider = make_freezable(cpu_provider(bridge, family, load_weights=hf_weights), selection)
    cfg = training_config(provider, workdir, ITERS, family=family, pretrained_checkpoint=pretrained,
                          distributed_optimizer=True, lr=1e-2)
    cfg.checkpoint.load = str(workdir / "checkpoints")  # as a user writes it: the stage resumes itself if restarted
    workdir.mkdir(parents=True, exist_ok=True)
    cfg.to_yaml(str(workdir / "config.yaml"))
    check(workdir / "config.yaml")
    stage = _Stage()
    with hf_build_patches(family), bridge_load_context(family):
        run_training(cfg, family=family, callbacks=[stage])
        export = {n: t.clone() for n, t in bridge.export_hf_weights(stage.model, cpu=True, show_progress=False)}
    return stage, export


def _check_config(capsys, config: Path, *overrides: str) -> tuple[int, str, str]:
    from bridge_freeze_plugin.cli import main

    code = main(["check-config", str(config), *overrides])
    out = capsys.readouterr()
    return code, "\n".join(line for line in out.out.splitlines() if line.startswith("stage: ")), out.err


def _changed(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> set[str]:
    assert before.keys() == after.keys()
    return {n for n in before if not torch.equal(before[n], after[n])}


def _of(family: str, names: Any, *parts: str) -> set[str]:
    return {n for n in names if part_of(family, n) in parts}


@pytest.mark.parametrize("family", sorted(HF_NAMES))
def test_stage_two_from_stage_one_keeps_what_is_frozen_and_exports_both_stages(family, tmp_path, capsys):
    from bridge_freeze_harness._hf_compare import read_safetensors
    from bridge_freeze_harness.hf_checkpoint import write_tiny_hf_checkpoint

    hf_dir = write_tiny_hf_checkpoint(family, tmp_path / "hf", seed=0)
    stage1_iter = iteration_dir(tmp_path / "stage1" / "checkpoints", ITERS)
    lines: list[str] = []

    def check(config: Path) -> None:  # check-config on each stage's config before it runs: docs/stages.md's line
        code, line, _ = _check_config(capsys, config)
        assert code == 0
        lines.append(line)
        if stage1_iter.exists():  # stage 2's selection resuming stage 1 with its optimizer state: refused
            code, _, err = _check_config(capsys, config, f"checkpoint.load={stage1_iter.parent}")
            assert code == 2 and "freeze_language_model: true in the checkpoint, false in this run" in err

    one, export1 = _stage(family, hf_dir, tmp_path / "stage1", STAGE1, hf_dir, hf_weights=True, check=check)
    assert lines[0].startswith(f"stage: a new stage from the Hugging Face weights in {hf_dir}")
    two, export2 = _stage(family, hf_dir, tmp_path / "stage2", STAGE2, stage1_iter.parent, hf_weights=False,
                          check=check)
    assert lines[1].startswith(f"stage: a new stage from {stage1_iter}'s weights")
    assert "saved with another selection (freeze_language_model: true in the checkpoint, false in this run)" \
        in lines[1]

    # stage 1: only the projection changed; stage 2 starts from stage 1's output, every tensor of it
    names = one.initial.keys()
    assert _of(family, names, "vision_projection") and _of(family, names, "language_model")
    assert _of(family, names, "vision_model")  # frozen in both stages
    assert _changed(one.initial, one.final) == _of(family, names, "vision_projection")
    assert _changed(one.final, two.initial) == set()
    # stage 2: the language model and the projection changed, the vision encoder is stage 1's bit for bit
    assert _changed(two.initial, two.final) == _of(family, names, "vision_projection", "language_model")
    saved1 = model_tensors(read_checkpoint(iteration_dir(tmp_path / "stage1" / "checkpoints", ITERS)))
    saved2 = model_tensors(read_checkpoint(iteration_dir(tmp_path / "stage2" / "checkpoints", ITERS)))
    assert _changed(saved1, saved2) == _of(family, saved1, "vision_projection", "language_model")

    # Bridge's HF export of the final model holds both stages' training, and the HF vision tower unchanged
    projection, language = (re.compile(p) for p in HF_NAMES[family])
    original = read_safetensors(hf_dir)
    trained = {n for n in export2 if projection.match(n) or language.match(n)}
    assert {n for n in export1 if projection.match(n)} and {n for n in export2 if language.match(n)}
    assert _changed({n: original[n] for n in export2}, export2) == trained
    assert _changed(export1, export2) == trained  # the projection moved again, the language model moved first
    assert _changed({n: original[n] for n in export1}, export1) == {n for n in export1 if projection.match(n)}
