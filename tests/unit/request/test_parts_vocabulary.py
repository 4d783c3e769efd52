"""The vocabulary of parts (issue 25): every name a part gives is generated from one table, a flag for a part the
family lacks is refused before any build, and a sixth part needs only its vocabulary entry and family data.

Expected names are written here by hand; the sixth-part test runs in a fresh interpreter with one entry added to
the vocabulary's source (nothing else changed) and checks every place a part's name reaches.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import bridge_freeze_plugin as bfp
from bridge_freeze_plugin import FreezeSelection, PartNotInFamilyError
from bridge_freeze_plugin.optim import LR_KEYS

PACKAGE = Path(bfp.__file__).resolve().parent

FIVE_FLAGS = ("freeze_language_model", "freeze_vision_model", "freeze_vision_projection", "freeze_audio_model",
              "freeze_audio_projection")


def test_every_name_of_a_part_comes_from_the_vocabulary():
    assert bfp.FLAGS == FIVE_FLAGS
    assert [p.value for p in bfp.Part] == ["language_model", "vision_model", "vision_projection", "audio_model",
                                           "audio_projection", "other"]
    assert tuple(f for f in FreezeSelection.__dataclass_fields__ if f.startswith("freeze_")) == (
        *FIVE_FLAGS, "freeze_patterns")
    assert {"lr_audio_model", "min_lr_audio_model", "lr_audio_projection", "min_lr_audio_projection"} <= set(LR_KEYS)
    import dataclasses

    assert {f.name for f in dataclasses.fields(bfp.FreezableVLMProvider)} >= set(FIVE_FLAGS)


@pytest.mark.parametrize(("command", "options"), [
    ("plan", ()),
    ("demo", ("--lr-language-model", "--lr-vision-projection", "--lr-audio-model", "--lr-audio-projection")),
])
def test_help_lists_every_part_option(capsys, command, options):
    from bridge_freeze_plugin.cli import main

    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = capsys.readouterr().out
    for option in ("--freeze-language-model", "--freeze-vision-model", "--freeze-vision-projection",
                   "--freeze-audio-model", "--freeze-audio-projection", *options):
        assert option in text, option


def test_a_family_without_an_audio_side_refuses_an_audio_flag_before_any_build(cpu_bridge, monkeypatch):
    from bridge_freeze_harness.tiny import make_provider

    provider = make_provider("qwen3_vl")
    provider.freeze_audio_model = True
    built = []
    monkeypatch.setattr(type(provider), "provide", lambda *a, **k: built.append(1), raising=False)
    with pytest.raises(PartNotInFamilyError) as err:
        provider.provide_distributed_model(wrap_with_ddp=False)
    message = str(err.value)
    assert "freeze_audio_model=True" in message and "qwen3_vl" in message and "no audio encoder" in message
    assert "Unset freeze_audio_model" in message
    assert not built


def test_a_false_audio_flag_is_absent_from_a_vlm_report(cpu_bridge):
    from bridge_freeze_harness.tiny import build_tiny_chunks, make_provider

    provider = make_provider("qwen3_vl")
    provider.freeze_language_model = True
    provider.freeze_audio_model = False
    chunks = build_tiny_chunks("qwen3_vl", provider=provider)
    report = bfp.last_report(provider)
    assert report is not None and chunks
    assert [c.part.value for c in report.parts] == ["language_model", "vision_model", "vision_projection"]
    assert report.as_dict()["selection"] == {"freeze_language_model": True, "freeze_vision_model": False,
                                             "freeze_vision_projection": False}
    assert "audio" not in report.format()


def test_a_learning_rate_for_a_part_the_family_lacks_is_refused():
    from bridge_freeze_plugin.config import load_run

    sft = Path(__file__).parents[2] / "fixtures" / "configs" / "sft" / "sft_defaults.yaml"
    with pytest.raises(PartNotInFamilyError) as err:
        load_run(sft, ["megatron_config.lr_audio_model=1e-5"], family="qwen3_vl").validate()
    assert "megatron_config.lr_audio_model" in str(err.value) and "no audio encoder" in str(err.value)


SIXTH_PART = textwrap.dedent('''
    import importlib.util, json, re, sys, types
    from pathlib import Path

    package = Path(sys.argv[1])
    source = (package / "request" / "_parts.py").read_text()
    # after the last entry (the audio projection's line, whatever options it carries)
    marker = re.search(r'^ *PartInfo\\("audio_projection",.*\\),$', source, re.M).group(0)
    source = source.replace(marker, marker + '\\n    PartInfo("speech_decoder", "speech decoder"),')
    module = types.ModuleType("bridge_freeze_plugin.request._parts")
    module.__file__ = str(package / "request" / "_parts.py")
    sys.modules["bridge_freeze_plugin.request._parts"] = module
    exec(compile(source, module.__file__, "exec"), module.__dict__)

    import torch
    import bridge_freeze_plugin as bfp
    from bridge_freeze_plugin.cli import main
    from bridge_freeze_plugin.optim import LR_KEYS
    from bridge_freeze_plugin.config import read_selection

    family = bfp.FamilySpec(name="toy_speech", providers=("toy.module:ToyProvider",),
                            language_model=("lm",), parts={"speech_decoder": ("talker",)})

    class Toy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lm = torch.nn.Linear(2, 2)
            self.talker = torch.nn.Linear(2, 2)

    model = Toy()
    selection = read_selection({"freeze_speech_decoder": True})
    report = bfp.apply_selection(model, family, selection)
    out = {
        "flags": list(bfp.FLAGS),
        "field": "freeze_speech_decoder" in bfp.FreezeSelection.__dataclass_fields__,
        "lr": "lr_speech_decoder" in LR_KEYS,
        "trainable": sorted(n for n, p in model.named_parameters() if p.requires_grad),
        "rows": [c.part.value for c in report.parts],
        "selection": report.as_dict()["selection"],
    }
    try:
        main(["plan", "--help"])
    except SystemExit:
        pass
    print(json.dumps(out))
''')


def test_a_sixth_part_is_one_vocabulary_entry_and_family_data():
    """Item 5: one entry added to the vocabulary (its source, in a fresh interpreter) and a family that has the
    part: the flag, the field, the LR key, the option, config reading, the freeze and the report all follow."""
    result = subprocess.run([sys.executable, "-c", SIXTH_PART, str(PACKAGE)], capture_output=True, text=True,
                            timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    *help_lines, last = result.stdout.strip().splitlines()
    out = json.loads(last)
    assert out["flags"][-1] == "freeze_speech_decoder" and out["field"] and out["lr"]
    assert out["trainable"] == ["lm.bias", "lm.weight"]
    assert out["rows"] == ["language_model", "speech_decoder"]
    assert out["selection"] == {"freeze_language_model": False, "freeze_speech_decoder": True}
    assert "--freeze-speech-decoder" in "\n".join(help_lines)
