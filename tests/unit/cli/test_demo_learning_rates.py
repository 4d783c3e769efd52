"""``demo --lr-<part>``: a learning rate for a part that will not train is refused before any work, and the message
says why in the user's terms (issue 37 items 10 and 11).

- no --freeze-* flag given: the demo's default selection (train the projections) is what freezes the part, so the
  message names that default as the flags that spell it and how to choose a selection instead, never "drop
  --freeze-<part>" (a flag the user never gave);
- a part the model does not have: refused up front (before, only Bridge's optimizer setup refused it, after the
  checkpoint was made), naming the learning-rate options of the model's own parts.

The command runs in-process (``main``): it refuses before any import of a model, any file or any training.
"""

from __future__ import annotations

import pytest

from bridge_freeze_plugin.cli import main

#: The parts of three demo families (vision-language, audio-language, both), read off their Bridge model trees
#: (tests/unit/_family_parts.py, test_family_qwen_audio.py, test_family_qwen_omni.py): the tests' own table.
PARTS = {
    "qwen3_vl": ("language-model", "vision-model", "vision-projection"),
    "qwen2_audio": ("language-model", "audio-model", "audio-projection"),
    "qwen25_omni": ("language-model", "vision-model", "vision-projection", "audio-model", "audio-projection"),
}
LABEL = {"language-model": "language model", "vision-model": "vision encoder", "vision-projection": "vision projection",
         "audio-model": "audio encoder", "audio-projection": "audio projection"}


def _demo(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(["demo", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bridge-freeze demo: error: ") and len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize(("family", "part"), [(f, p) for f, parts in PARTS.items() for p in parts
                                              if not p.endswith("projection")])
def test_an_lr_for_a_part_the_demos_default_freezes_names_the_default_and_how_to_choose(capsys, family, part):
    """Before: "--lr-vision-model is given, but --freeze-vision-model freezes that part ... Drop one of the two"."""
    err = _demo(capsys, family, f"--lr-{part}", "0.1")
    default = [f"--freeze-{p}" for p in PARTS[family] if not p.endswith("projection")]  # the demo trains projections
    assert f"--lr-{part} is given, but no --freeze-* flag is, so the demo's default selection applies" in err
    assert " ".join(default) in err and f"which freezes the {LABEL[part]}" in err
    assert f"this model's: {', '.join(f'--freeze-{p}' for p in PARTS[family])}" in err
    keep = [f for f in default if f != f"--freeze-{part}"]
    assert f"e.g. {' '.join(keep)} (the default without --freeze-{part}) trains the {LABEL[part]}" in err
    assert "--train-all trains every part" in err and "Drop one of the two" not in err


def test_an_lr_for_a_part_the_users_own_flag_freezes_still_says_drop_one(capsys):
    err = _demo(capsys, "qwen2_audio", "--freeze-audio-model", "--lr-audio-model", "0.1")
    assert "--lr-audio-model is given, but --freeze-audio-model freezes that part" in err
    assert "Drop one of the two" in err and "default" not in err


@pytest.mark.parametrize(("family", "part"), [(f, p) for f in PARTS for p in LABEL if p not in PARTS[f]])
def test_an_lr_for_a_part_the_model_lacks_is_refused_naming_its_own_parts(capsys, family, part):
    """Before: accepted, then refused by the optimizer setup after the checkpoint was built, as ``lr_<part>``."""
    err = _demo(capsys, family, "--train-all", f"--lr-{part}", "0.1")
    assert f"--lr-{part} is given, but {family} has no {LABEL[part]}" in err
    assert f"(its parts: {', '.join(LABEL[p] for p in PARTS[family])})" in err
    assert f"Its per-part learning rates: {', '.join(f'--lr-{p}' for p in PARTS[family])}" in err
