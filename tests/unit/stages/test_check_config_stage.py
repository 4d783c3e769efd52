"""``bridge-freeze check-config`` knows stages (issue 45 item 4a): on a Megatron-Bridge config that loads a
checkpoint, it says whether the config's selection matches the checkpoint's (its ``run_config.yaml``).

The checkpoints are directory trees as Bridge 0.6.2 writes them (a root with ``latest_train_state.pt`` or
Megatron-LM's ``latest_checkpointed_iteration.txt``, ``iter_0000002/run_config.yaml``), made here; the config is the
ConfigContainer fixture with ``checkpoint.*`` overrides. Expected values are written from what each case asks. Each
fails on the main of 2026-12-07 (266227e): check-config said ``OK: valid`` with no stage line for all of them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from bridge_freeze_plugin.cli import main

BRIDGE = Path(__file__).parents[2] / "fixtures" / "configs" / "bridge" / "run_config.yaml"
REFUSED = "freeze_language_model: true in the checkpoint, false in this run"


def _checkpoint(root: Path, *, step: int = 2, freeze_lm: bool = True, tracker: str = "train_state",
                save_optim: bool | None = None, run_config: bool = True) -> Path:
    """A checkpoint root whose iteration ``step`` was saved with ``freeze_language_model=freeze_lm``."""
    iteration = root / f"iter_{step:07d}"
    iteration.mkdir(parents=True)
    lm, optim = str(freeze_lm).lower(), str(save_optim).lower()
    text = BRIDGE.read_text().replace("freeze_language_model: false", f"freeze_language_model: {lm}")
    if save_optim is not None:
        text = text.replace("  save_interval: 100\n", f"  save_interval: 100\n  save_optim: {optim}\n")
    if run_config:
        (iteration / "run_config.yaml").write_text(text)
    else:
        (iteration / "metadata.json").write_text("{}")
    if tracker == "train_state":
        torch.save({"step": torch.tensor(step, dtype=torch.int64)}, root / "latest_train_state.pt")
    else:
        (root / "latest_checkpointed_iteration.txt").write_text(f"{step}\n")
    return root


def check(capsys, *overrides: str, json_doc: bool = False) -> tuple[int, str, str]:
    code = main(["check-config", str(BRIDGE), *overrides, *(["--json"] if json_doc else [])])
    out = capsys.readouterr()
    return code, out.out, out.err


def _stage_line(out: str) -> str:
    lines = [line for line in out.splitlines() if line.startswith("stage: ")]
    assert len(lines) == 1, out
    return lines[0]


@pytest.mark.parametrize("tracker", ["train_state", "legacy"])
def test_a_resume_with_optimizer_state_from_another_selection_fails_naming_the_change_and_the_ways_forward(
        tmp_path, capsys, tracker):
    root = _checkpoint(tmp_path / "ckpt", tracker=tracker)
    saved = root / "iter_0000002" / "run_config.yaml"
    code, out, err = check(capsys, f"+checkpoint.load={root}")
    assert code == 2 and "OK: valid" not in out
    assert REFUSED in err and str(saved) in err and "Qwen3VLModelProvider" in err
    assert "keep the checkpoint's selection (freeze_language_model=true)" in err
    assert "checkpoint.load_optim=false" in err and f"checkpoint.pretrained_checkpoint={root}" in err


def test_the_json_document_carries_the_stage_and_the_error(tmp_path, capsys):
    root = _checkpoint(tmp_path / "ckpt")
    code, out, _ = check(capsys, f"+checkpoint.load={root}", json_doc=True)
    doc = json.loads(out)
    assert code == 2 and doc["valid"] is False and doc["error_type"] == "SelectionChangedError"
    assert doc["stage"]["status"] == "refused" and doc["stage"]["optimizer_state"] is True
    assert doc["stage"]["checkpoint"] == str(root / "iter_0000002")
    assert doc["stage"]["changes"] == [{"key": "freeze_language_model", "checkpoint": True, "run": False}]


def test_the_same_selection_resumes(tmp_path, capsys):
    root = _checkpoint(tmp_path / "ckpt")
    code, out, _ = check(capsys, f"+checkpoint.load={root}", "model.freeze_language_model=true")
    line = _stage_line(out)
    assert code == 0 and line.startswith(f"stage: resumes {root / 'iter_0000002'} with its optimizer state")
    assert "latest_train_state.pt: step 2" in line and "is this config's" in line
    code, out, _ = check(capsys)  # a config that loads nothing has no stage line
    assert code == 0 and "stage: " not in out


@pytest.mark.parametrize(("overrides", "why"), [
    (["+checkpoint.load_optim=false"], "checkpoint.load_optim=false"),
    (["+checkpoint.finetune=true"], "checkpoint.finetune=true"),
])
def test_a_load_without_optimizer_state_is_a_new_stage(tmp_path, capsys, overrides, why):
    root = _checkpoint(tmp_path / "ckpt")
    code, out, _ = check(capsys, f"+checkpoint.load={root}", *overrides)
    line = _stage_line(out)
    assert code == 0 and line.startswith(f"stage: a new stage from {root / 'iter_0000002'}'s weights")
    assert f"no optimizer state: {why}" in line and f"saved with another selection ({REFUSED})" in line


def test_a_checkpoint_saved_without_optimizer_state_is_a_new_stage(tmp_path, capsys):
    root = _checkpoint(tmp_path / "ckpt", save_optim=False)
    code, out, _ = check(capsys, f"+checkpoint.load={root}")
    assert code == 0 and "saved without optimizer state (save_optim=false)" in _stage_line(out)


def test_pretrained_checkpoint_with_an_empty_load_is_bridges_finetune_path(tmp_path, capsys):
    root = _checkpoint(tmp_path / "stage1")
    code, out, _ = check(capsys, f"+checkpoint.load={tmp_path / 'stage2'}",
                         f"+checkpoint.pretrained_checkpoint={root}")
    line = _stage_line(out)
    assert code == 0 and line.startswith(f"stage: a new stage from {root / 'iter_0000002'}'s weights")
    assert f"checkpoint.load={tmp_path / 'stage2'} holds no checkpoint yet" in line
    assert "Bridge's finetune path from pretrained_checkpoint" in line


def test_ckpt_step_picks_the_iteration(tmp_path, capsys):
    root = _checkpoint(tmp_path / "ckpt", step=4, freeze_lm=False)
    _checkpoint(tmp_path / "other", step=2)  # not read
    (root / "iter_0000002").mkdir()
    (root / "iter_0000002" / "run_config.yaml").write_text(
        BRIDGE.read_text().replace("freeze_language_model: false", "freeze_language_model: true"))
    code, _, err = check(capsys, f"+checkpoint.load={root}", "+checkpoint.ckpt_step=2")
    assert code == 2 and REFUSED in err and str(root / "iter_0000002" / "run_config.yaml") in err
    code, out, _ = check(capsys, f"+checkpoint.load={root}")  # the tracker's iteration 4: the same selection
    assert code == 0 and _stage_line(out).startswith(f"stage: resumes {root / 'iter_0000004'}")


def test_an_iteration_directory_given_directly_is_the_one_loaded(tmp_path, capsys):
    root = _checkpoint(tmp_path / "ckpt")
    code, _, err = check(capsys, f"+checkpoint.load={root / 'iter_0000002'}")
    assert code == 2 and REFUSED in err


@pytest.mark.parametrize("case", ["missing", "empty", "no_run_config", "bad_step"])
def test_what_cannot_be_compared_is_said_and_nothing_crashes(tmp_path, capsys, case):
    if case == "missing":
        load, said = tmp_path / "nothere", f"checkpoint.load={tmp_path / 'nothere'} does not exist"
    elif case == "empty":
        (tmp_path / "empty").mkdir()
        load, said = tmp_path / "empty", "holds no checkpoint yet"
    elif case == "no_run_config":
        load = _checkpoint(tmp_path / "mlm", tracker="legacy", run_config=False)
        said = "which has no run_config.yaml"
    else:
        load = _checkpoint(tmp_path / "ckpt")
        said = f"checkpoint.ckpt_step=7 but {load / 'iter_0000007'} does not exist"
    extra = ["+checkpoint.ckpt_step=7"] if case == "bad_step" else []
    code, out, _ = check(capsys, f"+checkpoint.load={load}", *extra)
    assert code == 0 and said in _stage_line(out)

