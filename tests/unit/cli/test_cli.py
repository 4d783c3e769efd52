"""The command as a user runs it: a process of its own, its output and its exit code.

The installed ``bridge-freeze`` runs in a subprocess wherever the command itself is the subject (its entry point,
usage errors, help, what a fresh process prints, a full-size plan's peak memory). The commands that build or train
a model run as the same ``main(argv)`` in a process forked from a server that imported Bridge once
(``forked_command``, tests/unit/conftest.py): each still a process of its own, without a Bridge import each.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from _family_parts import part_of
from _shared import QWEN3_PROJECTION

EXE = shutil.which("bridge-freeze", path=os.path.dirname(sys.executable)) or "bridge-freeze"


def run(*args: str, timeout: int = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([EXE, *args], capture_output=True, text=True, timeout=timeout)


def test_families_json_lists_every_builtin_with_its_prefixes():
    out = run("families", "--json")
    assert out.returncode == 0, out.stderr
    families = {f["name"]: f for f in json.loads(out.stdout)["families"]}
    assert families["qwen3_vl"]["vision_projection"] == [
        "vision_model.merger",
        "vision_model.decoder.deepstack_merger_list",
    ]
    assert families["glm45v"]["vision_model"] == ["visual"]
    assert families["gemma4_vl"]["audio_model"] == ["audio_tower"]
    assert families["gemma4_vl"]["audio_projection"] == ["embed_audio"] and families["gemma4_vl"]["other"] == []
    assert families["qwen2_audio"]["parts"] == ["language_model", "audio_model", "audio_projection"]
    assert families["qwen3_vl"]["audio_model"] == [] and "audio_model" not in families["qwen3_vl"]["parts"]


DOCS_CLI = Path(__file__).resolve().parents[3] / "docs" / "cli.md"
JSON_TYPES = {"str": str, "bool": bool, "list[str]": list, "list[object]": list, "object": dict}


def _documented_keys(heading: str) -> dict[str, str]:
    """The key -> type table under one ``### heading`` of docs/cli.md (up to the next heading)."""
    text = DOCS_CLI.read_text()
    assert heading in text, heading
    section = text.split(heading, 1)[1].split("\n#", 1)[0]
    rows = re.findall(r"^\| `([^`]+)` \| ([^|]+?) \|", section, flags=re.MULTILINE)
    return dict(rows)


def test_families_json_keys_are_exactly_the_documented_ones():
    documented = _documented_keys("### `families --json`")
    top = {k for k in documented if "[]." not in k}
    per_family = {k.split("[].", 1)[1]: t for k, t in documented.items() if k.startswith("families[].")}
    assert top == {"families"} and per_family  # the table was found and read

    out = run("families", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert set(doc) == top
    assert out.stdout.strip() == json.dumps(doc, indent=2, sort_keys=True)
    names = [f["name"] for f in doc["families"]]
    assert names == sorted(names) and len(names) >= 10
    for family in doc["families"]:
        assert set(family) == set(per_family), (family["name"], set(family) ^ set(per_family))
        for key, type_name in per_family.items():
            assert isinstance(family[key], JSON_TYPES[type_name]), (family["name"], key, type_name)
            if type_name == "list[str]":
                assert all(isinstance(item, str) for item in family[key]), (family["name"], key)


def test_help_of_every_subcommand_has_examples():
    for sub in ("families", "demo", "plan", "check-config"):
        out = run(sub, "--help")
        assert out.returncode == 0 and "examples:" in out.stdout, sub
        assert f"bridge-freeze {sub}" in out.stdout.split("examples:")[1], sub


# ---------------------------------------------------------------------------------------------
# demo: the user's flow (tiny HF checkpoint -> AutoBridge -> Bridge's finetune() -> HF export)
# ---------------------------------------------------------------------------------------------

#: The families the real-loop demo runs here (measured; the others are refused with the reason, below).
DEMO_FAMILIES = ["ernie45_vl", "exaone45_vl", "gemma3_vl", "gemma4_vl", "glm45v", "kimi_k25_vl", "minimax_m3_vl",
                 "ministral3", "qwen25_omni", "qwen25_vl", "qwen2_audio", "qwen35_vl", "qwen35_vl_moe", "qwen3_asr",
                 "qwen3_omni", "qwen3_vl", "qwen3_vl_moe"]

#: The registered families the demo cannot run here, and a phrase of the one-line reason it gives.
DEMO_REFUSED = {
    "nemotron_vl": "is remote code on the hub, not in transformers 5.12.1",
    "nemotron_omni": "is remote code on the hub, not in transformers 5.12.1",
    "step37": "transformers 5.12.1 has no Step-3.7 model class",
}

# The parts as HF names (transformers' save_pretrained layout), from the parts' definitions (README, "Which parts"),
# independent of the plugin's classification and of Bridge's mapping tables.
QWEN3_PARTS = {
    "language_model": r"^(model\.language_model\.|lm_head\.)",
    "vision_model": r"^model\.visual\.(?!merger\.|deepstack_merger_list\.)",
    "vision_projection": r"^model\.visual\.(merger|deepstack_merger_list\.\d+)\.",
}
QWEN2_AUDIO_PARTS = {  # the published layout; the fixed position table is built frozen: no part
    "language_model": r"^language_model\.",
    "audio_model": r"^audio_tower\.(?!embed_positions\.)",
    "audio_projection": r"^multi_modal_projector\.",
    "other": r"^audio_tower\.embed_positions\.",
}
# The Omni thinkers, as published (Qwen2.5-Omni-7B, Qwen3-Omni-30B-A3B): everything under "thinker."; the text model
# is "thinker.model." / "thinker.lm_head.", the vision tower "thinker.visual." with its merger(s) as the projection,
# the audio encoder "thinker.audio_tower." with its output linear(s) as the projection. No talker / vocoder tensors:
# the tiny checkpoints are written without audio output.
QWEN25_OMNI_PARTS = {
    "language_model": r"^thinker\.(model\.|lm_head\.)",
    "vision_model": r"^thinker\.visual\.(?!merger\.)",
    "vision_projection": r"^thinker\.visual\.merger\.",
    "audio_model": r"^thinker\.audio_tower\.(?!proj\.)",
    "audio_projection": r"^thinker\.audio_tower\.proj\.",
}
QWEN3_OMNI_PARTS = {  # the projection: the merger and the DeepStack mergers; the audio one: proj1 -> GELU -> proj2
    "language_model": r"^thinker\.(model\.|lm_head\.)",
    "vision_model": r"^thinker\.visual\.(?!merger\.|merger_list\.)",
    "vision_projection": r"^thinker\.visual\.(merger|merger_list\.\d+)\.",
    "audio_model": r"^thinker\.audio_tower\.(?!proj[12]\.)",
    "audio_projection": r"^thinker\.audio_tower\.proj[12]\.",
}
QWEN3_ASR_PARTS = {  # as published (Qwen3-ASR-0.6B): the projector proj1 -> GELU -> proj2 inside the audio tower
    "language_model": r"^thinker\.(model\.|lm_head\.)",
    "audio_model": r"^thinker\.audio_tower\.(?!proj[12]\.)",
    "audio_projection": r"^thinker\.audio_tower\.proj[12]\.",
}
QWEN35_PARTS = {  # Qwen3.5 and EXAONE 4.5: one merger, no DeepStack mergers
    "language_model": r"^(model\.language_model\.|lm_head\.)",
    "vision_model": r"^model\.visual\.(?!merger\.)",
    "vision_projection": r"^model\.visual\.merger\.",
}
GEMMA3_PARTS = {  # Gemma3ForConditionalGeneration as saved: SigLIP tower, projector, language_model.model
    "language_model": r"^language_model\.",
    "vision_model": r"^vision_tower\.",
    "vision_projection": r"^multi_modal_projector\.",
}
MINISTRAL3_PARTS = {  # Mistral3ForConditionalGeneration: Pixtral tower, the projector with its patch merger
    "language_model": r"^language_model\.",
    "vision_model": r"^vision_tower\.",
    "vision_projection": r"^multi_modal_projector\.",
}
ERNIE45_VL_PARTS = {  # the resampler is the projection; the text model's vision expert pool is language model
    "language_model": r"^model\.(?!vision_model\.|resampler_model\.)",
    "vision_model": r"^model\.vision_model\.",
    "vision_projection": r"^model\.resampler_model\.",
}
GLM45V_PARTS = {  # the merger is the projection; the downsampling conv before it is the vision tower's
    "language_model": r"^(model\.language_model\.|lm_head\.)",
    "vision_model": r"^model\.visual\.(?!merger\.)",
    "vision_projection": r"^model\.visual\.merger\.",
}
MINIMAX_M3_VL_PARTS = {  # two projection MLPs: the patch merger's and the projector
    "language_model": r"^language_model\.",
    "vision_model": r"^vision_tower\.",
    "vision_projection": r"^(multi_modal_projector|patch_merge_mlp)\.",
}
KIMI_K25_VL_PARTS = {  # as published: MoonViT3d tower, patch-merger projector, a DeepSeek-V3 language_model
    "language_model": r"^language_model\.",
    "vision_model": r"^vision_tower\.",
    "vision_projection": r"^mm_projector\.",
}
GEMMA4_PARTS = {  # each tower's projection is its embed_* module
    "language_model": r"^model\.language_model\.",
    "vision_model": r"^model\.vision_tower\.",
    "vision_projection": r"^model\.embed_vision\.",
    "audio_model": r"^model\.audio_tower\.",
    "audio_projection": r"^model\.embed_audio\.",
}
QWEN25_PARTS = {  # the legacy layout: no "model." before visual.
    "language_model": r"^(model\.|lm_head\.)",
    "vision_model": r"^visual\.(?!merger\.)",
    "vision_projection": r"^visual\.merger\.",
}


def _demo_table(stdout: str) -> dict[str, tuple[int, int, int]]:
    """The demo's per-part table (part, tensors, trainable, changed) as part -> (tensors, trainable, changed)."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split() == ["part", "tensors", "trainable", "changed"])
    rows = {}
    for line in lines[start + 1:]:
        cells = line.split()
        if len(cells) != 4:
            break
        rows[cells[0]] = tuple(int(c) for c in cells[1:])
    return rows


def _safetensors(directory: Path) -> dict:
    from safetensors.torch import load_file

    tensors = {}
    for file in sorted(directory.glob("*.safetensors")):
        tensors.update(load_file(str(file)))
    return tensors


def _run_demo(command, workdir: Path, *args: str):
    """``demo --workdir WORKDIR ARGS``; returns the process, and the input / exported HF tensors that changed."""
    import torch

    out = command("demo", "--workdir", str(workdir), *args)
    assert out.returncode == 0, out.stdout + out.stderr
    original, exported = _safetensors(workdir / "hf"), _safetensors(workdir / "export")
    assert set(original) == set(exported) and len(original) > 20
    changed = {n for n in original if not torch.equal(original[n], exported[n])}
    return out, original, changed


def _names(names, pattern: str) -> set[str]:
    return {n for n in names if re.search(pattern, n)}


def _expected_table(names, parts: dict[str, str], trainable: set[str], changed: set[str]) -> dict:
    table = {}
    for part, pattern in parts.items():
        members = _names(names, pattern)
        table[part] = (len(members), len(members & trainable), len(members & changed))
    assert sum(row[0] for row in table.values()) == len(names)  # the rules cover every tensor, once
    return table


#: A MoE router's score-correction bias that Bridge's provider never updates (moe_router_bias_update_rate 0): it stays
#: bit-identical while its router trains (GLM-4.5V's provider, Bridge 0.6.2); ERNIE's and MiniMax's move with theirs.
STILL_BIAS = {("glm45v",): r"\.mlp\.gate\.e_score_correction_bias$"}
#: Tensors that record a shape, not values: Kimi K2.5's INT4 experts (as published) carry one per packed weight.
SHAPE_RECORDS = {("kimi_k25_vl",): r"\.weight_shape$"}

#: (demo arguments, the HF parts, the parts that train, the OK line's description): one run per demo family.
_DEMO_CASES = [
    ((), QWEN3_PARTS, ("vision_projection",), "train vision_projection"),
    (("qwen25_vl", "--freeze-vision-model"), QWEN25_PARTS, ("language_model", "vision_projection"),
     "train language_model + vision_projection"),
    (("qwen2_audio",), QWEN2_AUDIO_PARTS, ("audio_projection",), "train audio_projection"),
    # the maker's HF class as Bridge vendors it (transformers 5.12.1 has none), through vlm_step
    (("qwen3_asr",), QWEN3_ASR_PARTS, ("audio_projection",), "train audio_projection"),
    # Bridge's own Qwen3-Omni step (audio and image in the batch) for both Omni thinkers
    (("qwen25_omni",), QWEN25_OMNI_PARTS, ("vision_projection", "audio_projection"),
     "train vision_projection + audio_projection"),
    (("qwen3_omni",), QWEN3_OMNI_PARTS, ("vision_projection", "audio_projection"),
     "train vision_projection + audio_projection"),
    # image_sizes carried into vlm_step's visual_inputs
    (("ministral3",), MINISTRAL3_PARTS, ("vision_projection",), "train vision_projection"),
    # the MoE routing types carried; the router's expert_bias moves with its router (the whole LM changes)
    (("ernie45_vl", "--freeze-vision-model", "--freeze-vision-projection"), ERNIE45_VL_PARTS,
     ("language_model",), "train language_model"),
    # grouped-GEMM experts trained and saved through torch_dist (the stand-in's sharded_state_dict)
    (("glm45v", "--freeze-vision-model"), GLM45V_PARTS, ("language_model", "vision_projection"),
     "train language_model + vision_projection"),
    (("minimax_m3_vl", "--freeze-vision-model"), MINIMAX_M3_VL_PARTS, ("language_model", "vision_projection"),
     "train language_model + vision_projection"),
    # the HF side from the harness's stand-ins for the hub's remote code; the routed experts trained and exported
    # INT4 as published (packed codes and scales change, the shape records do not)
    (("kimi_k25_vl", "--freeze-vision-model"), KIMI_K25_VL_PARTS, ("language_model", "vision_projection"),
     "train language_model + vision_projection"),
    # image and audio in vlm_step's visual_inputs; grouped-GEMM experts saved (frozen here)
    (("gemma4_vl",), GEMMA4_PARTS, ("vision_projection", "audio_projection"),
     "train vision_projection + audio_projection"),
    (("qwen3_vl_moe",), QWEN3_PARTS, ("vision_projection",), "train vision_projection"),
    (("qwen35_vl",), QWEN35_PARTS, ("vision_projection",), "train vision_projection"),
    (("qwen35_vl_moe",), QWEN35_PARTS, ("vision_projection",), "train vision_projection"),
    (("exaone45_vl",), QWEN35_PARTS, ("vision_projection",), "train vision_projection"),
    (("gemma3_vl",), GEMMA3_PARTS, ("vision_projection",), "train vision_projection"),
]
_DEMO_IDS = ["qwen3_vl-default", "qwen25_vl-freeze-vision", "qwen2_audio-default", "qwen3_asr-default",
     "qwen25_omni-default", "qwen3_omni-default", "ministral3-default", "ernie45_vl-language-model",
     "glm45v-freeze-vision", "minimax_m3_vl-freeze-vision", "kimi_k25_vl-freeze-vision", "gemma4_vl-default",
     "qwen3_vl_moe-default", "qwen35_vl-default", "qwen35_vl_moe-default", "exaone45_vl-default", "gemma3_vl-default"]


@pytest.mark.parametrize(("args", "parts", "trains", "described"), _DEMO_CASES, ids=_DEMO_IDS)
def test_demo_runs_the_real_flow_and_proves_it_from_the_export(forked_command, tmp_path, args, parts, trains,
                                                                described):
    workdir = tmp_path / "flow"
    out, original, changed = _run_demo(forked_command, workdir, *args, "--steps", "2")
    expected = set().union(*(_names(original, parts[p]) for p in trains))
    expected -= _names(original, STILL_BIAS.get(args[:1], "$^"))
    expected -= _names(original, SHAPE_RECORDS.get(args[:1], "$^"))
    assert changed == expected  # read here from the two safetensors files, not from the demo's output
    assert _demo_table(out.stdout) == _expected_table(original, parts, expected, changed)
    assert (f"OK: exactly the {len(expected)} HF tensors fed by a parameter training at a learning rate above 0 "
            f"changed, the other {len(original) - len(expected)} are bit-identical to the input checkpoint "
            f"({described})") in out.stdout
    assert "AutoBridge.from_hf_pretrained -> to_megatron_provider(load_weights=True)" in out.stdout
    # Bridge's finetune() saved its torch_dist checkpoint; the export is a loadable HF folder; all of it kept
    checkpoint = workdir / "checkpoints" / "iter_0000002"
    assert f"Bridge checkpoint: {checkpoint}" in out.stdout and (checkpoint / ".metadata").is_file()
    assert (workdir / "export" / "config.json").is_file() and (workdir / "bridge.log").stat().st_size > 0
    assert f"kept: {workdir}" in out.stdout
    assert re.search(r"^time: .*Bridge import [\d.]+ s.*; total [\d.]+ s$", out.stdout, flags=re.MULTILINE)
    progress = out.stderr.splitlines()  # the progress only: Bridge's own output went to bridge.log
    assert [re.fullmatch(r"finetune \[[#-]{24}\] (\d)/2 loss [\d.]+", line)[1] for line in progress] == ["1", "2"]
    _assert_the_audit_saw_exactly_what_trains(workdir, out.stdout, args[0] if args else "qwen3_vl", trains)


def _assert_the_audit_saw_exactly_what_trains(workdir: Path, stdout: str, family: str, trains: tuple[str, ...]) -> None:
    """The run-time audit in Bridge's finetune(): every tensor in Bridge's optimizer (read off the real optimizer)
    learned, or is an MoE expert no token reached, and each is of a part that trains (the tests' own table)."""
    written = json.loads((workdir / "audit.json").read_text())
    audit, optimizer = written["audit"], set(written["optimizer_names"])
    routed = {n for f in audit["findings"] if f["cause"] == "routing" for n in f["names"]}
    assert [f for f in audit["findings"] if f["warned"]] == [] and audit["ok"]
    assert set(audit["learned"]) | routed == optimizer and audit["learned"]
    assert {part_of(family, n) for n in optimizer} == set(trains)
    assert sum(p["trainable_tensors"] for p in audit["parts"]) == len(optimizer)
    assert audit["steps"] == 2 and audit["held"]["through_step"] == 1
    assert "optimizer step(s) 1-2: what learned" in stdout and "every trainable tensor got a gradient" in stdout


def test_demo_lora_merged_export_carries_adapters_and_full_rank_parts_and_lr_zero_is_bit_identical(
        forked_command, tmp_path):
    # The language model through LoRA on its attention (scoped by full names: the vision encoder trains at full
    # rank next to them), the vision encoder at full rank, the projection trainable at learning rate 0.
    out, original, changed = _run_demo(
        forked_command, tmp_path / "flow", "--freeze-language-model", "--lora-rank", "4", "--lora-target-modules",
        "language_model.*linear_qkv", "language_model.*linear_proj", "--lr-vision-projection", "0", "--steps", "2")
    adapters_merged = _names(original, r"^model\.language_model\.layers\.\d+\.self_attn\.[qkvo]_proj\.weight$")
    assert len(adapters_merged) == 8  # q, k, v, o of 2 layers
    vision = _names(original, QWEN3_PARTS["vision_model"])
    projection = _names(original, QWEN3_PARTS["vision_projection"])
    assert changed == adapters_merged | vision  # the projection at LR 0 stayed bit-identical
    trainable = adapters_merged | vision | projection
    assert _demo_table(out.stdout) == _expected_table(original, QWEN3_PARTS, trainable, changed)
    assert (f"(train vision_model + vision_projection + LoRA rank 4, merged; {len(projection)} trainable at "
            "learning rate 0 stayed bit-identical)") in out.stdout
    assert ("learning rates: language_model frozen, vision_model 0.01, vision_projection 0, adapters 0.01 "
            "(global 0.01)") in out.stdout


def test_demo_a_moe_language_model_at_lr_zero_stays_bit_identical_with_its_routers_expert_bias(
        forked_command, tmp_path):
    """Issue 46 item 4: MiniMax-M3-VL's routers' expert bias (HF ``e_score_correction_bias``) moved with the LM at
    learning rate 0, and the demo's own check printed FAIL. The LM trains at 0: nothing of it may change."""
    out, original, changed = _run_demo(forked_command, tmp_path / "flow", "minimax_m3_vl",
                                       "--freeze-vision-projection", "--lr-language-model", "0", "--steps", "2")
    language = _names(original, MINIMAX_M3_VL_PARTS["language_model"])
    assert _names(language, r"e_score_correction_bias$")  # the expert bias is exported, and held
    assert changed == _names(original, MINIMAX_M3_VL_PARTS["vision_model"])
    assert "OK: exactly the" in out.stdout and "FAIL" not in out.stdout


def test_demo_train_pattern_with_full_recompute(forked_command, tmp_path):
    out, original, changed = _run_demo(
        forked_command, tmp_path / "flow", "--freeze-language-model", "--freeze-vision-model", "--train",
        r"language_model\.decoder\.layers\.1", "--recompute", "full", "--steps", "1")
    expected = _names(original, r"^model\.language_model\.layers\.1\.") | _names(
        original, QWEN3_PARTS["vision_projection"])
    assert changed == expected
    assert _demo_table(out.stdout) == _expected_table(original, QWEN3_PARTS, expected, changed)
    assert "note: full activation recompute turned off in vision_model" in out.stdout
    assert "OK: exactly the" in out.stdout


def test_demo_lora_on_a_full_rank_part_fails_in_bridges_finetune_as_one_line(forked_command):
    # Bridge's default LoRA targets include the Qwen3-VL mergers' linears, which train at full rank here: the
    # plugin refuses inside Bridge's setup() (its PEFT pre-wrap hook), and the command says so in one line.
    out = forked_command("demo", "--lora-rank", "4", "--freeze-language-model", "--freeze-vision-model")
    assert out.returncode == 2, out.stdout + out.stderr
    assert len(out.stderr.splitlines()) == 1 and "Traceback" not in out.stderr
    assert out.stderr.startswith("bridge-freeze demo: error: ")
    assert "vision_model.merger.linear_fc1.weight (wrapped by LoRA" in out.stderr
    assert out.stdout == ""


def test_demo_verdict_names_a_changed_frozen_tensor_and_an_unchanged_trained_one():
    """The FAIL lines (reachable only through a bug, so checked here on hand-made tensors): a tensor no trained
    parameter feeds that changed, and one a parameter at a non-zero LR feeds that did not; LR 0 expects no change."""
    import torch

    from bridge_freeze_harness.demo_flow import compare
    from bridge_freeze_plugin.cli._demo import _verdict

    original = {name: torch.zeros(2) for name in ("frozen", "trained", "at_lr_zero", "stuck")}
    exported = {**original, "frozen": torch.ones(2), "trained": torch.ones(2)}
    sources = {"frozen": {"f"}, "trained": {"t"}, "at_lr_zero": {"z"}, "stuck": {"s"}}
    rows = {t.name: t for t in compare(original, exported, sources, {"t": 1e-2, "z": 0.0, "s": 1e-2}, None)}
    assert {n for n, t in rows.items() if t.trainable} == {"trained", "at_lr_zero", "stuck"}
    assert {n for n, t in rows.items() if t.expected} == {"trained", "stuck"}
    assert {n for n, t in rows.items() if t.changed} == {"frozen", "trained"}
    assert _verdict(list(rows.values())) == [
        "FAIL: 1 HF tensor(s) changed that no parameter training at a learning rate above 0 feeds, e.g. frozen",
        "FAIL: 1 HF tensor(s) fed by a trained parameter did not change, e.g. stuck",
    ]
    assert _verdict([rows["trained"], rows["at_lr_zero"]]) == []


def test_demo_refusals_are_one_line_before_any_work(tmp_path):
    for family, reason in DEMO_REFUSED.items():
        out = run("demo", family)
        assert out.returncode == 2, out.stdout + out.stderr
        assert out.stderr.startswith(f"bridge-freeze demo: error: the demo cannot run {family!r} here: ")
        assert reason in out.stderr and len(out.stderr.splitlines()) == 1
        assert out.stderr.rstrip().endswith(f"families it runs: {', '.join(DEMO_FAMILIES)}")
    out = run("demo", "--freeze-language-model", "--freeze-vision-model", "--freeze-vision-projection")
    assert out.returncode == 2 and "nothing would train" in out.stderr
    for freeze in (["--freeze-vision-model"], ["--freeze-language-model", "--freeze-audio-model"]):
        out = run("demo", "qwen25_omni", "--train-all", *freeze)  # issue 46 item 17: was --train-all dropped
        assert out.returncode == 2 and len(out.stderr.splitlines()) == 1, out.stderr
        assert f"--train-all (set no flag: train every part) cannot be given with {', '.join(freeze)}" in out.stderr
    # issue 46 item 16: check-config's rules run before the demo's build (was: unexpected error: NotImplementedError)
    out = run("demo", "qwen25_vl", "--lora-rank", "4", "--lora-target-modules", "visual.patch_embed.proj")
    assert out.returncode == 2 and len(out.stderr.splitlines()) == 1, out.stderr
    assert "peft.target_modules 'visual.patch_embed.proj' (reaches visual)" in out.stderr
    assert "UnexportableAdapterError" in out.stderr and "unexpected error" not in out.stderr
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "keep.txt").write_text("mine")
    out = run("demo", "--workdir", str(tmp_path / "used"))
    assert out.returncode == 2 and "exists and is not an empty directory" in out.stderr
    assert sorted(p.name for p in (tmp_path / "used").iterdir()) == ["keep.txt"]


def test_demo_refusals_import_no_model_code():
    """A refusal answers before torch, transformers, Bridge or a family's model code is imported (it read the
    family modules' sources): a user waits a fraction of a second for it, not the stack's import."""
    heavy = ("torch", "transformers", "megatron", "bridge_freeze_harness.demo_flow", "bridge_freeze_harness.tiny.")
    argvs = [["demo", family] for family in DEMO_REFUSED] + [
        ["demo", "--freeze-language-model", "--freeze-vision-model", "--freeze-vision-projection"],
        ["demo", "--train-all", "--freeze-vision-model"]]
    # (not the LoRA target on Qwen2.5-VL's HF tower: that rule tries the installed Bridge's own LoRA on a Linear)
    code = (
        "import sys\nfrom bridge_freeze_plugin.cli import main\n"
        f"codes = [main(argv) for argv in {argvs!r}]\n"
        f"print(codes, sorted(m for m in sys.modules if m.startswith({heavy!r}) and not m.endswith('tiny._index')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"{[2] * len(argvs)} []"


def test_the_demo_tests_cover_every_family_run_or_refused():
    """Every tiny configuration (every registered family among them) is run by the demo test above, or refused
    with its reason by the one before; and the demo's own list of what it runs is :data:`DEMO_FAMILIES`."""
    from bridge_freeze_harness.demo_scope import demo_families
    from bridge_freeze_harness.tiny import TINY_FAMILIES
    from bridge_freeze_plugin.registry import REGISTRY

    run_by_test = {args[0] if args else "qwen3_vl" for args, *_ in _DEMO_CASES}
    assert run_by_test == set(DEMO_FAMILIES) == set(demo_families())
    assert set(DEMO_FAMILIES).isdisjoint(DEMO_REFUSED)
    assert set(DEMO_FAMILIES) | set(DEMO_REFUSED) == set(TINY_FAMILIES) >= {family.name for family in REGISTRY}
    assert len({TINY_FAMILIES[name] for name in DEMO_FAMILIES}) >= 15  # families, not configurations


@pytest.mark.parametrize("steps", ["0", "-1", "two"])
def test_demo_steps_below_one_fail_at_parse_time(steps):
    out = run("demo", "--steps", steps)
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr == (f"bridge-freeze demo: error: argument --steps: must be an integer from 1 to 1,000,000, "
                          f"got {steps!r} "
                          "(see bridge-freeze demo --help)\n")
    assert out.stdout == ""  # refused before any model was built (the build prints its report on stdout)


BIG = "99999999999999999999999"
#: Every integer option of plan and demo, too large: refused by argparse, one line, before anything runs (issue 37
#: item 8: ``demo --steps 99999999999999999999999`` passed, trained, then ended in ``OverflowError`` in Bridge).
TOO_LARGE = [
    (("demo", "--steps", BIG), "argument --steps: must be an integer from 1 to 1,000,000"),
    (("demo", "--steps", "1000001"), "argument --steps: must be an integer from 1 to 1,000,000"),
    (("demo", "--seed", str(2**64)), "argument --seed: must be an integer from 0 to 2**64 - 1"),
    (("demo", "--lora-rank", BIG), "argument --lora-rank: must be an integer from 0 to 65,536"),
    (("plan", "qwen3_vl", "--tiny", "--lora-rank", "65537"),
     "argument --lora-rank: must be an integer from 0 to 65,536"),
    *[(("plan", "qwen3_vl", "--tiny", option, BIG), f"argument {name}: must be an integer from {low} to 2,147,483,647")
      for option, name, low in [
          ("--tp", "--tensor-model-parallel-size/--tp", 1), ("--pp", "--pipeline-model-parallel-size/--pp", 1),
          ("--vp", "--virtual-pipeline-model-parallel-size/--vp", 1),
          ("--ep", "--expert-model-parallel-size/--ep", 1), ("--etp", "--expert-tensor-parallel-size/--etp", 1),
          ("--dp", "--data-parallel-size/--dp", 1), ("--dp-size", "--dp-size", 1),
          ("--decoder-first-pipeline-num-layers", "--decoder-first-pipeline-num-layers", 1),
          ("--decoder-last-pipeline-num-layers", "--decoder-last-pipeline-num-layers", 1),
          ("--seq-length", "--seq-length", 1), ("--micro-batch-size", "--micro-batch-size", 1),
          ("--vision-tokens", "--vision-tokens", 0)]],
    (("plan", "qwen3_vl", "--tiny", "--max-layer-blocks", BIG * 2),
     "argument --max-layer-blocks: must be an integer from 0 to 2**63 - 1"),
    (("plan", "qwen3_vl", "--tiny", "--gpu-memory", "9" * 400), "argument --gpu-memory: must be a memory size up to"),
    (("plan", "qwen3_vl", "--tiny", "--gpu-memory", "2EiB"), "argument --gpu-memory: must be a memory size such as"),
    (("plan", "qwen3_vl", "--tiny", "--gpu-memory", "2000000TiB"), "argument --gpu-memory: must be a memory size up"),
]


@pytest.mark.parametrize(("args", "message"), TOO_LARGE)
def test_every_integer_option_has_a_maximum_checked_before_anything_runs(capsys, args, message):
    from bridge_freeze_plugin.cli import main

    with pytest.raises(SystemExit) as exited:
        main(list(args))
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("args", [("--tp", "65536", "--dp", "65536"), ("--pp", "2", "--tp", "2147483647")])
def test_a_world_larger_than_torch_numbers_is_refused_before_any_build(capsys, args):
    from bridge_freeze_plugin.cli import main

    assert main(["plan", "qwen3_vl", "--tiny", *args]) == 2
    err = capsys.readouterr().err
    assert "needs more than 2,147,483,647 GPUs, the most torch's process groups number" in err, err


# ---------------------------------------------------------------------------------------------
# usage errors, from every parser
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "prog", "message"),
    [
        (("plan", "qwen3_vl", "--tiny", "--param-dtype", "int8"), "bridge-freeze plan",
         "argument --param-dtype: invalid choice: 'int8'"),
        (("plan", "qwen3_vl", "--tiny", "--hf-config", "x"), "bridge-freeze plan",
         "argument --hf-config: not allowed with argument --tiny"),
        (("demo", "--seed", "-1"), "bridge-freeze demo", "argument --seed: must be an integer from 0 to 2**64 - 1"),
        (("families", "--bogus"), "bridge-freeze families", "unrecognized arguments: --bogus"),
        (("check-config",), "bridge-freeze check-config", "the following arguments are required: FILE"),
        (("check-config", "x.yaml", "--log-level", "loud"), "bridge-freeze check-config",
         "argument --log-level: invalid choice: 'LOUD'"),
        (("no-such-command",), "bridge-freeze", "argument command: invalid choice: 'no-such-command'"),
        ((), "bridge-freeze", "the following arguments are required: command"),
    ],
)
def test_usage_errors_are_one_line_without_the_usage_block(args, prog, message):
    out = run(*args)
    assert out.returncode == 2, out.stdout + out.stderr
    lines = out.stderr.splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith(f"{prog}: error: {message}"), lines[0]
    assert lines[0].endswith(f"(see {prog} --help)")
    assert "usage:" not in out.stderr and out.stdout == ""


# ---------------------------------------------------------------------------------------------
# plan
# ---------------------------------------------------------------------------------------------


def test_plan_tiny_json_totals_equal_the_real_tiny_model(cpu_bridge, forked_command):
    out = forked_command("plan", "qwen3_vl_moe", "--tiny", "--freeze-language-model", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert out.stdout.strip() == json.dumps(doc, indent=2, sort_keys=True)  # stable key order
    assert doc["schema_version"] == 1
    assert doc["model"]["family"] == "qwen3_vl_moe" and doc["model"]["device"] == "meta"
    assert doc["trained_parts"] == ["vision_model", "vision_projection"]

    # Independent check: the real tiny model, built with real storage on the CPU, counted here.
    from bridge_freeze_harness.tiny import build_tiny_model
    from bridge_freeze_plugin import get_family

    model = build_tiny_model("qwen3_vl_moe")
    family = get_family("qwen3_vl_moe")
    expected: dict[str, int] = {}
    for name, param in model.named_parameters():
        part = family.classify(name)
        expected[part.value] = expected.get(part.value, 0) + param.numel()
    assert doc["total"]["total"] == sum(p.numel() for p in model.parameters())
    assert {p["part"]: p["total"] for p in doc["parts"]} == expected
    assert doc["total"]["total_tensors"] == len(list(model.parameters())) == len(doc["parameters"])

    params = doc["parameters"]
    assert sum(p["numel"] for p in params) == doc["total"]["total"]
    assert all(p["trainable"] is (p["part"] != "language_model") for p in params)
    lm = next(p for p in doc["parts"] if p["part"] == "language_model")
    assert lm["trainable"] == 0 and lm["frozen"] == lm["total"] == expected["language_model"]
    # Default assumptions: bf16 weights, fp32 grads, Adam + fp32 master = 12 B/param.
    total = doc["total"]
    assert total["weight_bytes"] == 2 * total["total"]
    assert total["grad_bytes"] == 4 * total["trainable"]
    assert total["optimizer_bytes"] == 12 * total["trainable"]
    assert lm["saved_bytes"] == 16 * lm["total"]


#: Qwen3-VL-30B-A3B-Instruct's config.json, text and vision towers at full size (where it came from: its SOURCE).
QWEN3_VL_30B_A3B = Path(__file__).resolve().parents[2] / "fixtures" / "hf_configs" / "qwen3_vl_moe" / "config.json"


def test_plan_full_size_qwen3_vl_30b_a3b_under_4_gb(tmp_path):
    # No time bound here (timed tests are not allowed): benchmarks/plan.py measures the time.
    folder = tmp_path / "Qwen3-VL-30B-A3B-Instruct"
    folder.mkdir()
    shutil.copy(QWEN3_VL_30B_A3B, folder / "config.json")
    with tempfile.TemporaryFile("w+") as stdout, tempfile.TemporaryFile("w+") as stderr:
        proc = subprocess.Popen(
            # No MODEL: the family comes from the config (Bridge converts it to Qwen3VLMoEModelProvider).
            [EXE, "plan", "--hf-config", str(folder), "--freeze-language-model", "--dp-size", "8", "--json"],
            stdout=stdout, stderr=stderr, text=True,
        )
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own peak RSS, not the test session's
        proc.returncode = os.waitstatus_to_exitcode(status)
        stdout.seek(0)
        stderr.seek(0)
        text, errors = stdout.read(), stderr.read()
    assert proc.returncode == 0, errors
    peak_gb = usage.ru_maxrss * 1024 / 1e9  # ru_maxrss is in KiB on Linux
    assert peak_gb < 4, f"plan peaked at {peak_gb:.2f} GB"

    doc = json.loads(text)
    parts = {p["part"]: p for p in doc["parts"]}
    assert doc["model"]["provider"] == "Qwen3VLMoEModelProvider" and doc["model"]["family"] == "qwen3_vl_moe"
    assert doc["model"]["source"] == "hf-config" and doc["model"]["config_path"] == str(folder / "config.json")
    assert 31.0e9 < doc["total"]["total"] < 31.2e9  # Qwen3-VL-30B-A3B: 31.07 B parameters
    assert parts["language_model"]["trainable"] == 0 and parts["language_model"]["total"] > 30e9
    assert parts["vision_model"]["trainable"] == parts["vision_model"]["total"] > 0
    assert parts["vision_projection"]["trainable"] == parts["vision_projection"]["total"] > 0
    # 128 experts x 48 layers: every expert's tensors are listed, all frozen.
    experts = [p for p in doc["parameters"] if ".mlp.experts." in p["name"]]
    assert len(experts) >= 128 * 48 * 2 and not any(p["trainable"] for p in experts)
    # Distributed optimizer over 8 ranks: 12 B/param of optimizer state / 8; the fp32 grad buffer unsharded.
    lm = parts["language_model"]
    assert lm["saved_grad_bytes"] == 4 * lm["total"]
    assert lm["saved_optimizer_bytes"] == 12 * lm["total"] // 8
    assert doc["assumptions"]["dp_size"] == 8


def test_plan_text_output_and_changed_assumptions():
    out = run("plan", "Qwen25VLModelProvider", "--tiny", "--freeze-vision-model", "--param-dtype", "fp32",
              "--optimizer", "sgd")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("Qwen25VLModelProvider, family qwen25_vl (tiny test config)")
    assert "freeze_vision_model=true" in lines[1] and "train language_model + vision_projection" in lines[1]
    # fp32 weights: no master copy; SGD: one momentum buffer.
    assert "fp32 weights (4 B/param)" in lines[2] and "sgd with fp32 momentum buffer (4 B/trainable param)" in lines[2]
    rows = {line.split()[0]: line.split() for line in lines if line.startswith("  ")}
    assert set(rows) >= {"part", "language_model", "vision_model", "vision_projection", "total"}
    assert rows["vision_model"][1] == "0"
    assert "Traceback" not in out.stderr and "WARNING" not in out.stderr  # third-party chatter kept quiet


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("plan", "no_such_vlm", "--tiny"), "'no_such_vlm' is neither a registered family nor a provider class"),
        (("plan", "qwen3_vl"), "--tiny (the project's tiny test config) or --hf-config PATH"),
        (("plan", "qwen3_vl", "--hf-config", "/no/such/model"), "no config at /no/such/model"),
        (("plan", "qwen3_vl", "--tiny", "--dp-size", "0"),
         "argument --dp-size: must be an integer from 1 to 2,147,483,647, got '0'"),
        (("plan", "--tiny"), "give MODEL"),
    ],
)
def test_plan_failure_paths_are_one_line_and_exit_2(args, message):
    out = run(*args)
    assert out.returncode == 2, out.stdout + out.stderr
    assert message in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr
    assert out.stdout == ""


def test_debug_shows_the_traceback():
    out = run("plan", "no_such_vlm", "--tiny", "--debug")
    assert out.returncode != 0 and "Traceback" in out.stderr and "UnknownFamilyError" in out.stderr


# ---------------------------------------------------------------------------------------------
# check-config
# ---------------------------------------------------------------------------------------------

SFT_YAML = """\
strategy: megatron
model:
  path: /checkpoints/not-local
  lora: {rank: 0}
megatron_config:
  freeze_language_model: true
  freeze_vision_model: true
"""

RL_YAML = """\
trainer:
  strategy: megatron
  policy:
    model: {path: /checkpoints/not-local}
    megatron_config:
      freeze_vision_model: true
  ref:
    megatron_config: {}
"""


@pytest.fixture
def configs(tmp_path):
    (tmp_path / "sft.yaml").write_text(SFT_YAML)
    (tmp_path / "rl.yaml").write_text(RL_YAML)
    return tmp_path


def test_check_config_valid_sft_prints_the_effective_selection(configs):
    out = run("check-config", str(configs / "sft.yaml"))
    assert out.returncode == 0, out.stderr
    assert ("selection (megatron_config): freeze_language_model=true freeze_vision_model=true "
            "freeze_vision_projection=false") in out.stdout
    assert "trains: vision_projection; frozen: language_model, vision_model" in out.stdout
    assert out.stdout.rstrip().endswith("OK: valid")


def test_check_config_valid_rl_with_overrides_after_the_options(configs):
    out = run("check-config", str(configs / "rl.yaml"), "--rl", "--json",
              "trainer.policy.megatron_config.freeze_language_model=true")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert out.stdout.strip() == json.dumps(doc, indent=2, sort_keys=True)
    assert doc["valid"] is True and doc["layout"] == "rl" and doc["error"] is None
    assert doc["selection"] == {"freeze_language_model": True, "freeze_vision_model": True,
                                "freeze_vision_projection": False}
    assert doc["trained_parts"] == ["vision_projection"]
    assert doc["overrides"] == ["trainer.policy.megatron_config.freeze_language_model=true"]


def test_check_config_dotted_overrides_change_the_selection(configs):
    out = run("check-config", str(configs / "sft.yaml"), "megatron_config.freeze_language_model=false")
    assert out.returncode == 0, out.stderr
    assert "trains: language_model, vision_projection; frozen: vision_model" in out.stdout
    assert "+ 1 override(s)" in out.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("sft.yaml", "strategy=fsdp"), "requires strategy=megatron, but strategy=fsdp"),
        (("sft.yaml", "megatron_config.freeze_vision_projection=true"), "nothing would train"),
        (("sft.yaml", "megatron_config.freeze_vison_model=true"), "did you mean megatron_config.freeze_vision_model"),
        (("rl.yaml", "--rl", "trainer.ref.megatron_config.freeze_vision_model=true"),
         "the reference model never trains"),
        (("sft.yaml", "strategy=fsdp", "megatron_config.freeze_vision_projection=true"), "2 problems"),
        (("missing.yaml",), "no such config file:"),
        (("sft.yaml", "not-an-override"), "is not of the form dotted.key=value"),
    ],
)
def test_check_config_invalid_exits_2_with_one_line(configs, args, message):
    first, *rest = args
    out = run("check-config", str(configs / first), *rest)
    assert out.returncode == 2, out.stdout + out.stderr
    assert message in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr
    assert out.stderr.startswith("bridge-freeze check-config: error: ")


def test_check_config_reports_the_full_recompute_adjustment_instead_of_refusing(configs):
    out = run("check-config", str(configs / "sft.yaml"), "--family", "qwen3_vl",
              "megatron_config.recompute_granularity=full")
    assert out.returncode == 0, out.stdout + out.stderr
    (line,) = [x for x in out.stdout.splitlines() if x.startswith("adjusted when the model is built: ")]
    assert "turns full recompute off in vision_model only" in line and "DeepStack" in line
    assert out.stdout.rstrip().endswith("OK: valid")
    doc = json.loads(run("check-config", str(configs / "sft.yaml"), "--family", "qwen3_vl", "--json",
                         "megatron_config.recompute_granularity=full").stdout)
    assert doc["valid"] is True and len(doc["adjustments"]) == 1


def test_check_config_invalid_json_still_reports_on_stdout(configs):
    out = run("check-config", str(configs / "sft.yaml"), "--json", "strategy=fsdp")
    assert out.returncode == 2
    doc = json.loads(out.stdout)
    assert doc["valid"] is False and "requires strategy=megatron" in doc["error"] and doc["selection"] is None


def test_plan_shows_lora_adapters_next_to_a_full_rank_projection(forked_command):
    out = forked_command("plan", "qwen3_vl", "--tiny", "--freeze-language-model", "--freeze-vision-model",
                         "--lora-rank", "8", "--lora-target-modules", "linear_qkv", "linear_proj", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    params = doc["parameters"]
    adapters = {p["name"] for p in params if p.get("adapter")}
    assert adapters and all(".adapter.linear_" in n for n in adapters)
    assert {p["name"] for p in params if p["trainable"]} == adapters | {p["name"] for p in params
                                                                      if QWEN3_PROJECTION.match(p["name"])}
    parts = {p["part"]: p for p in doc["parts"]}
    assert parts["vision_projection"].get("adapters", 0) == 0
    assert parts["language_model"]["adapters"] == parts["language_model"]["trainable"] > 0
    assert doc["total"]["adapters"] == sum(p["numel"] for p in params if p.get("adapter"))
    text = forked_command("plan", "qwen3_vl", "--tiny", "--freeze-language-model", "--freeze-vision-model",
                          "--lora-rank", "8", "--lora-target-modules", "linear_qkv", "linear_proj")
    assert text.returncode == 0 and "full-rank" in text.stdout and "adapters" in text.stdout


def test_plan_refusals_for_lora_and_patterns(forked_command):
    overlap = forked_command("plan", "qwen3_vl", "--tiny", "--freeze-language-model", "--freeze-vision-model",
                             "--lora-rank", "8")
    assert overlap.returncode == 2 and "vision_model.merger.linear_fc1.weight (wrapped by LoRA" in overlap.stderr
    nothing = forked_command("plan", "qwen3_vl", "--tiny", "--freeze-language-model", "--freeze-vision-model",
                             "--freeze-vision-projection")
    assert nothing.returncode == 2 and "nothing would train" in nothing.stderr
    typo = forked_command("plan", "qwen3_vl", "--tiny", "--freeze-language-model", "--train",
                          r"language_model\.decoder\.layer\.1")
    assert typo.returncode == 2 and "language_model.decoder.layers" in typo.stderr  # the nearest real names


def test_plan_train_pattern_adds_exactly_the_patterned_layer(forked_command):
    out = forked_command("plan", "qwen3_vl", "--tiny", "--freeze-language-model", "--train",
                         r"language_model\.decoder\.layers\.1", "--json")
    assert out.returncode == 0, out.stderr
    lm = [p for p in json.loads(out.stdout)["parameters"] if p["part"] == "language_model"]
    assert {p["name"] for p in lm if p["trainable"]} == {
        p["name"] for p in lm if p["name"].startswith("language_model.decoder.layers.1.")}
