"""NeMo-RL's conversion cache as check-config reads it (issue 46 items 6 and 14, and the trainers' point on who
saved a cached flag).

NeMo-RL (``validate_model_paths`` / ``handle_model_import``) reuses ``<dir>/<model>`` whenever its ``iter_0000000``
exists and converts again only with ``force_reconvert_from_hf``; ``setup_model_config`` then raises
``FileNotFoundError`` for a missing ``run_config.yaml`` and fails loading one that is no YAML mapping with a
provider. So such a folder is refused by name, with what to do, never read as "none yet" (before: "none yet, this
run converts first"); an unreadable file (not UTF-8, nested past the bound, larger than any saved config) is one
line naming it (before: "unexpected error: UnicodeDecodeError / RecursionError", and 41 s for 13.8 MB).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml

from bridge_freeze_plugin.cli import main

GRPO = Path(__file__).parents[2] / "fixtures" / "configs" / "nemo_rl" / "examples" / "configs" / \
    "vlm_grpo_3B_megatron.yaml"
MODEL = "Qwen/Qwen2.5-VL-3B-Instruct"  # the example's policy.model_name
QWEN3_MOE = "Qwen/Qwen3-VL-30B-A3B-Instruct"
MOE_TARGET = "megatron.bridge.models.qwen_vl.qwen3_vl_provider.Qwen3VLMoEModelProvider"
MO = "policy.megatron_cfg.model_overrides"


@pytest.fixture(autouse=True)
def cache_dir(monkeypatch, tmp_path) -> Path:
    monkeypatch.setenv("NRL_MEGATRON_CHECKPOINT_DIR", str(tmp_path / "nemo_rl_cache"))
    return tmp_path / "nemo_rl_cache"


def _check(capsys, *args: str) -> dict:
    code = main(["check-config", "--json", str(GRPO), *args])
    doc = json.loads(capsys.readouterr().out)
    assert (code == 0) == doc["valid"]
    return doc


def _run_config(cache_dir: Path, model: str = MODEL) -> Path:
    iteration = cache_dir / model / "iter_0000000"
    iteration.mkdir(parents=True)
    return iteration / "run_config.yaml"


def _refusal(cache_dir: Path, problem: str) -> str:
    folder = cache_dir / MODEL
    return (f"NeMo-RL reuses its conversion cache {folder} (found via $NRL_MEGATRON_CHECKPOINT_DIR: iter_0000000 "
            f"exists there, so it does not convert again), and the saved provider it builds from cannot be read: "
            f"{problem}. Delete {folder} (the next run converts again) or set "
            "policy.megatron_cfg.force_reconvert_from_hf=true")


BAD_FILES = {
    "missing": (None, "there is no {path}"),
    "directory": ("dir", "{path} is a directory, not the file Bridge saves"),
    "not YAML": ("model: [\n", "{path} is not valid YAML for Bridge's safe reader: while parsing a flow node did "
                               "not find expected node content in \"<unicode string>\", line 2, column 1"),
    "a Python tag": ("model: !!python/object:os.system {}\n",
                     "{path} is not valid YAML for Bridge's safe reader: could not determine a constructor for the "
                     "tag 'tag:yaml.org,2002:python/object:os.system' in \"<unicode string>\", line 1, column 8"),
    "a list": ("- 1\n", "{path} holds a list at the top level, not the mapping of sections Bridge saves"),
    "no provider": ("model:\n  num_layers: 2\n", "{path} holds no saved provider (a model section with its "
                                                 "_target_)"),
    "not UTF-8": (b"model:\n  _target_: x\n  a: \xff\n", "{path} is not UTF-8 text ('utf-8' codec can't decode byte "
                                                         "0xff in position 26: invalid start byte): a saved config "
                                                         "is YAML, in UTF-8"),
    "nested deep": ("a: " + "[" * 5000 + "]" * 5000 + "\n",
                    "{path} nests more than 32 levels deep (mappings and lists): no training config does; check for "
                    "a runaway or generated structure and flatten it"),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_a_reused_folder_whose_run_config_cannot_be_read_is_refused_by_name(capsys, cache_dir, case):
    content, problem = BAD_FILES[case]
    path = _run_config(cache_dir)
    if content == "dir":
        path.mkdir()
    elif isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    doc = _check(capsys)
    assert doc["error_type"] == "ConfigLoadError"
    assert doc["error"] == _refusal(cache_dir, problem.format(path=path))


def test_a_cache_larger_than_any_saved_config_is_refused_at_once(capsys, cache_dir):
    """13.8 MB (before: parsed, 41 s): refused from its size, before a byte of it is parsed."""
    path = _run_config(cache_dir)
    path.write_text("model:\n  _target_: " + MOE_TARGET + "\n  pad: '" + "a" * 13_800_000 + "'\n")
    started = time.perf_counter()
    doc = _check(capsys)
    assert time.perf_counter() - started < 5
    size = path.stat().st_size
    assert doc["error"] == _refusal(cache_dir, f"{path} holds {size} bytes; a saved config holds at most 1048576 "
                                               "(real ones hold kilobytes): check that this is the saved config")


def test_reconverting_ignores_an_unreadable_cache(capsys, cache_dir):
    _run_config(cache_dir).write_text("model: [\n")
    doc = _check(capsys, "policy.megatron_cfg.force_reconvert_from_hf=true")
    assert doc["valid"], doc["error"]


def test_a_named_checkpoint_without_its_run_config_is_refused_by_name(capsys, tmp_path):
    folder = tmp_path / "ckpt" / "iter_0000100"
    folder.mkdir(parents=True)
    doc = _check(capsys, "++policy.pretrained_checkpoint.format=megatron_bridge",
                 f"++policy.pretrained_checkpoint.path={folder}")
    assert doc["error"] == (f"policy.pretrained_checkpoint.path names {folder}, and the saved provider NeMo-RL builds "
                            f"from cannot be read there: there is no {folder / 'run_config.yaml'}. Give a "
                            "Megatron-Bridge checkpoint: its iteration folder (the one holding its run_config.yaml) "
                            "or its root (its latest iteration is read)")


@pytest.mark.parametrize("latest_file", [True, False])
def test_a_checkpoint_root_is_read_at_its_latest_iteration(capsys, tmp_path, latest_file):
    """NeMo-RL resolves a Megatron-Bridge checkpoint root to its latest iter_* folder: so does check-config (a root
    was refused as if it held no provider). The latest holds freeze_vision_model: true, an older one does not."""
    root = tmp_path / "ckpt"
    for iteration, flag in ((100, False), (2000, True)):
        folder = root / f"iter_{iteration:07d}"
        folder.mkdir(parents=True)
        (folder / "run_config.yaml").write_text(yaml.safe_dump(
            {"model": {"_target_": MOE_TARGET, "freeze_vision_model": flag}}))
    if latest_file:
        (root / "latest_checkpointed_iteration.txt").write_text("2000\n")
    doc = _check(capsys, "++policy.pretrained_checkpoint.format=megatron_bridge",
                 f"++policy.pretrained_checkpoint.path={root}", "--family", "qwen3_vl_moe")
    assert doc["valid"], doc["error"]
    setting = doc["settings"]["policy.megatron_cfg.freeze_vision_model"]
    assert setting["value"] is True and str(root / "iter_0002000" / "run_config.yaml") in setting["source"]


# ---- who saved a cached true: what the file tells, or that it does not ------------------------------------------

def _moe_cache(cache_dir: Path, **model: object) -> Path:
    path = _run_config(cache_dir, QWEN3_MOE)
    path.write_text(yaml.safe_dump({"model": {"_target_": MOE_TARGET, **model}}))
    return path


def _vision_source(capsys) -> str:
    doc = _check(capsys, f"policy.model_name={QWEN3_MOE}", "--family", "qwen3_vl_moe",
                 f"+{MO}.freeze_language_model=false")
    assert doc["valid"], doc["error"]
    return doc["settings"]["policy.megatron_cfg.freeze_vision_model"]["source"]


def test_a_flag_removed_after_a_conversion_with_the_plugin_is_said_to_be_that_configs_own(capsys, cache_dir):
    """The conversion was made with the plugin and freeze_vision_model: true; the flag is then removed. The file
    holds a field only the plugin writes: the value is the earlier config's own flag (before: "Bridge's own
    default, saved by a conversion without the plugin")."""
    path = _moe_cache(cache_dir, freeze_language_model=False, freeze_vision_model=True, freeze_vision_projection=False,
                      full_recompute_policy="refuse")
    assert _vision_source(capsys) == (
        f"not written: NeMo-RL reuses its conversion cache {path}, which holds freeze_vision_model: true (WARNING: "
        "saved by a conversion with the plugin (it holds the plugin's full_recompute_policy), so set by the config "
        "it was made with: a flag since removed stays in force: write the flag false, or delete the cache)")


def test_a_conversion_cache_with_the_plugin_and_nothing_of_its_own_set_is_told_by_a_flag_nemo_rl_never_sets(
        capsys, cache_dir):
    """A conversion with the plugin writes none of its fields unset (item 5); freeze_language_model, which NeMo-RL's
    conversion never sets, holds the plugin's false where Bridge's class defaults to true: the plugin wrote it."""
    path = _moe_cache(cache_dir, freeze_language_model=False, freeze_vision_model=True, freeze_vision_projection=False)
    assert _vision_source(capsys) == (
        f"not written: NeMo-RL reuses its conversion cache {path}, which holds freeze_vision_model: true (WARNING: "
        "saved by a conversion with the plugin (it holds freeze_language_model: false, which NeMo-RL's conversion "
        "does not set and Bridge's class defaults to true), so set by the config it was made with: a flag since "
        "removed stays in force: write the flag false, or delete the cache)")


def test_bridges_default_saved_without_the_plugin_is_said_so_and_an_unknown_cause_is_said_unknown(capsys, cache_dir):
    path = _moe_cache(cache_dir, freeze_language_model=True, freeze_vision_model=True, freeze_vision_projection=False)
    assert _vision_source(capsys) == (
        f"not written: NeMo-RL reuses its conversion cache {path}, which holds freeze_vision_model: true (WARNING: "
        "Bridge's own default, saved by a conversion without the plugin (it holds freeze_language_model: true, "
        "Bridge's default, which NeMo-RL's conversion leaves as it is); a fresh conversion with it saves false: "
        "write the flag, or delete the cache)")
    path.write_text(yaml.safe_dump({"model": {"_target_": MOE_TARGET, "freeze_vision_model": True}}))
    assert _vision_source(capsys) == (
        f"not written: NeMo-RL reuses its conversion cache {path}, which holds freeze_vision_model: true (WARNING: "
        "Bridge's own default saved by a conversion without the plugin, or set by the config the cache was made "
        "with: the file does not tell which; it stays in force either way: write the flag, or delete the cache)")
