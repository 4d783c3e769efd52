"""The command as a user runs it: a subprocess, its output and its exit code."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

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
    assert families["gemma4_vl"]["other"] == ["audio_tower", "embed_audio"]


def test_help_of_every_subcommand_has_examples():
    for sub in ("families", "demo"):
        out = run(sub, "--help")
        assert out.returncode == 0 and "examples:" in out.stdout


@pytest.mark.parametrize(
    ("args", "trained"),
    [
        ((), "vision_projection"),
        (("qwen25_vl", "--freeze-vision-model", "--steps", "2"), "language_model + vision_projection"),
    ],
)
def test_demo_trains_and_checks_what_changed(args, trained):
    out = run("demo", *args)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "OK: exactly the" in out.stdout and f"(train {trained})" in out.stdout
    assert "train [" in out.stderr  # the progress bar


def test_demo_failure_paths_are_one_line_and_nonzero():
    out = run("demo", "kimi_k25_vl")
    assert out.returncode == 2
    assert "no demo training recipe for 'kimi_k25_vl'" in out.stderr
    assert "Traceback" not in out.stderr
    out = run("demo", "--freeze-language-model", "--freeze-vision-model", "--freeze-vision-projection")
    assert out.returncode == 2 and "nothing would train" in out.stderr
