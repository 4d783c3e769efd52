"""``check-config --recipe`` and ``plan --recipe`` (issue 48): the command's own edges.

Each runs ``bridge-freeze`` in a process forked from the suite's Bridge server (``forked_command``), the model's
``config.json`` given with ``--hf-config`` (the command serves it offline under the recipe's hub id); the recipe is
Bridge's Qwen3-VL-8B pretrain recipe, which freezes the language model and the vision encoder.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

CONFIG = Path(__file__).resolve().parents[2] / "fixtures" / "hf_configs" / "qwen3_vl" / "config.json"
RECIPE = "qwen3_vl_8b_pretrain_mock_config"


def test_an_unknown_recipe_gets_the_nearest_names(forked_command):
    done = forked_command("check-config", "--recipe", "qwen3_vl_8b_pretrain_config")
    assert done.returncode == 2
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith("bridge-freeze check-config: error: no recipe 'qwen3_vl_8b_pretrain_config'")
    nearest = line.split("the nearest: ")[1].split(". Give")[0].split(", ")
    assert "qwen3_vl_8b_pretrain_mock_config" in nearest  # the name the user meant, among difflib's nearest
    assert 1 < len(nearest) <= 5


def test_the_recipes_flags_and_an_override_each_with_its_source(forked_command):
    done = forked_command("check-config", "--recipe", RECIPE, "--hf-config", str(CONFIG),
                          "model.freeze_language_model=False", "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads(done.stdout)
    assert doc["valid"] is True
    assert doc["recipe"]["hub_ids"] == ["Qwen/Qwen3-VL-8B-Instruct"]
    assert doc["recipe"]["flags"] == {
        "model.freeze_language_model": {"value": False, "recipe_value": True, "source": "your override",
                                        "override": "model.freeze_language_model=False"},
        "model.freeze_vision_model": {"value": True, "recipe_value": True, "source": "the recipe", "override": None},
        "model.freeze_vision_projection": {"value": False, "recipe_value": False, "source": "the recipe",
                                           "override": None},
    }
    assert doc["trained_parts"] == ["language_model", "vision_projection"]
    assert doc["frozen_parts"] == ["vision_model"]


def test_without_the_override_the_recipe_trains_the_projection_only(forked_command):
    done = forked_command("check-config", "--recipe", RECIPE, "--hf-config", str(CONFIG))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "  model.freeze_language_model = true  (the recipe)" in done.stdout.splitlines()
    assert "trains: vision_projection; frozen: language_model, vision_model" in done.stdout.splitlines()


def test_an_override_bridge_refuses_is_one_line(forked_command):
    done = forked_command("check-config", "--recipe", RECIPE, "--hf-config", str(CONFIG), "model.no_such_field=1")
    assert done.returncode == 2
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith(f"bridge-freeze check-config: error: recipe {RECIPE}: Bridge's override code refuses "
                           "model.no_such_field=1")


def test_a_model_the_cache_lacks_is_refused_without_a_download(forked_command, tmp_path):
    done = forked_command("check-config", "--recipe", "qwen25_vl_3b_sft_config")
    assert done.returncode == 2
    line = done.stderr.strip().splitlines()[-1]
    assert "its model is Qwen/Qwen2.5-VL-3B-Instruct" in line and "give --hf-config PATH" in line


@pytest.mark.parametrize("argv, expected", [
    (("plan", "--recipe", RECIPE, "--tp", "2"), "with --recipe the layout, sequence, recompute and PEFT are the "
                                                "recipe's; --tp would not be what the run uses"),
    (("plan", "qwen3_vl", "--tiny", "model.freeze_vision_model=True"),
     "KEY=VALUE overrides are a recipe's: give them with --recipe NAME"),
    (("check-config", "--hf-config", str(CONFIG), "a.b=1"), "--hf-config serves the model's config.json to a recipe"),
])
def test_recipe_options_in_the_wrong_place(forked_command, argv, expected):
    done = forked_command(*argv)
    assert done.returncode == 2
    assert expected in done.stderr, done.stderr[-2000:]


def test_plan_takes_the_recipes_layout_and_selection(forked_command):
    done = forked_command("plan", "--recipe", RECIPE, "--hf-config", str(CONFIG), "model.freeze_language_model=False",
                          "model.pipeline_model_parallel_size=1", "--json", timeout=400)
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads(done.stdout)
    # the recipe's own: TP 4, micro-batch 2, sequence 4096 (Bridge 0.6.2's qwen3_vl_8b_pretrain recipe)
    assert doc["layout"]["tensor_model_parallel_size"] == 4
    assert doc["layout"]["pipeline_model_parallel_size"] == 1
    assert doc["recipe"]["layout_sources"]["tp"] == "the recipe"
    assert doc["recipe"]["layout_sources"]["pp"] == "your override: model.pipeline_model_parallel_size=1"
    assert (doc["activation"]["seq_length"], doc["activation"]["micro_batch_size"]) == (4096, 2)
    assert doc["selection"]["freeze_language_model"] is False and doc["selection"]["freeze_vision_model"] is True
    assert sorted(doc["trained_parts"]) == ["language_model", "vision_projection"]
