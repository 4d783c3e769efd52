"""One home per family (issue 33 part 2): a family is declared in its plugin family module and its harness tiny
module, and the machinery reads the declarations; nothing else of the package changes to add one.

The test copies both packages into a temporary folder, adds a toy family there as two new files (a family module
under ``bridge_freeze_plugin/families/`` and a tiny module under ``bridge_freeze_harness/tiny/``, written here),
and checks in a fresh interpreter that every place that reads family data finds the toy's: the registry and the
freeze, the provider flag defaults ``check-config`` reports for a NeMo-RL conversion cache, the offline reading of
its remote-code config by ``plan``, the harness's index, its HF checkpoint recipe and its forward step. The other
two homes of a family are the tests' independent expectations (its entries in ``tests/unit/_family_parts.py``,
which never reads the registry: checked below) and its row in ``docs/families.md``. Modelled on the parts vocabulary
test's sixth part (``tests/unit/request/test_parts_vocabulary.py``).
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import bridge_freeze_harness
import bridge_freeze_plugin

ROOT = Path(__file__).resolve().parents[3]
NEMO_RL_GRPO = ROOT / "tests" / "fixtures" / "configs" / "nemo_rl" / "examples" / "configs" / \
    "vlm_grpo_3B_megatron.yaml"

#: The plugin's family module of the toy family: data only, as every family module.
TOY_FAMILY = textwrap.dedent('''
    """A toy VLM family (written by tests/unit/families/test_adding_a_family.py)."""

    from bridge_freeze_plugin.families import FamilySpec, OfflineConfig

    FAMILIES = [
        FamilySpec(
            name="toy_vl",
            description="a toy VLM (`vision_tower`, projection `projector`)",
            providers=("toy_models.toy_provider:ToyVLModelProvider",),
            language_model=("language_model",),
            vision_model=("vision_tower",),
            vision_projection=("projector",),
            hf_model_types=("toy_vl", "ToyVL_Remote"),
            provider_flag_defaults=("freeze_vision_model",),
            offline_configs=(OfflineConfig("ToyVL_Remote", sub_configs=("text_config",)),),
        ),
    ]
''')

#: The harness's tiny module of the toy family.
TOY_TINY = textwrap.dedent('''
    """The toy family's tiny configuration (written by tests/unit/families/test_adding_a_family.py)."""

    from bridge_freeze_harness._bridge_steps import vlm_step_with
    from bridge_freeze_harness._hf_configs import TEXT, HFFamily

    FAMILY = "toy_vl"
    REAL = False
    CANNOT_TRAIN = "a toy: no Bridge model class"


    def make_provider(**overrides):
        raise NotImplementedError("a toy")


    def hf_checkpoint_config():
        from transformers import LlamaConfig

        return LlamaConfig(**TEXT)


    HF_CHECKPOINTS = {"toy_vl": HFFamily("ToyVLForConditionalGeneration", hf_checkpoint_config)}
    FORWARD_STEPS = {"toy_vl": vlm_step_with("toy_inputs")}
''')

CHECKS = textwrap.dedent('''
    import contextlib, io, json, sys
    from pathlib import Path

    import torch
    import bridge_freeze_plugin as bfp
    import bridge_freeze_harness
    from bridge_freeze_plugin.cli import main
    from bridge_freeze_plugin.planning import load_hf_config
    from bridge_freeze_harness.tiny import TINY_FAMILIES
    from bridge_freeze_harness.hf_checkpoint import HF_FAMILIES, hf_config
    from bridge_freeze_harness.cpu_training import forward_step_of

    copy, work, grpo = map(Path, sys.argv[1:4])
    family = bfp.get_family("toy_vl")

    class Toy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.language_model = torch.nn.Linear(2, 2)
            self.vision_tower = torch.nn.Linear(2, 2)
            self.projector = torch.nn.Linear(2, 2)

    model = Toy()
    bfp.apply_selection(model, family, bfp.FreezeSelection(freeze_vision_model=True))

    # NeMo-RL reuses a conversion cache written without the plugin: the toy provider's default (vision true) is named
    cache = work / "cache" / "toy" / "iter_0000000" / "run_config.yaml"
    cache.parent.mkdir(parents=True)
    cache.write_text("model:\\n  _target_: toy_models.toy_provider.ToyVLModelProvider\\n  freeze_vision_model: true\\n")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["check-config", "--json", str(grpo), "policy.model_name=toy", "--family", "toy_vl"])
    doc = json.loads(out.getvalue())

    remote = work / "remote" / "config.json"
    remote.parent.mkdir()
    remote.write_text(json.dumps({"model_type": "ToyVL_Remote", "auto_map": {"AutoConfig": "configuration_toy.Toy"},
                                  "text_config": {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
                                                  "num_attention_heads": 4, "vocab_size": 128}}))
    config, _ = load_hf_config(remote)
    print(json.dumps({
        "files": [bfp.__file__, bridge_freeze_harness.__file__],
        "flag_defaults": list(family.provider_flag_defaults),
        "trainable": sorted(n for n, p in model.named_parameters() if p.requires_grad),
        "check_config": [code, doc["family"], doc["trained_parts"],
                         {k: v["source"] for k, v in doc["settings"].items() if k.endswith("freeze_vision_model")}],
        "offline": [type(config.text_config).__name__, config.text_config.hidden_size],
        "tiny": TINY_FAMILIES["toy_vl"],
        "hf": [HF_FAMILIES["toy_vl"].model_class, hf_config("toy_vl").architectures],
        "step": [forward_step_of("toy_vl").function, "toy_inputs" in forward_step_of("toy_vl").keys],
    }))
''')


def _copy_with_toy_family(tmp_path: Path) -> Path:
    copy = tmp_path / "packages"
    ignore = shutil.ignore_patterns("__pycache__")
    for package in (bridge_freeze_plugin, bridge_freeze_harness):
        folder = Path(package.__file__).resolve().parent
        shutil.copytree(folder, copy / folder.name, ignore=ignore)
    (copy / "bridge_freeze_plugin" / "families" / "toy.py").write_text(TOY_FAMILY, encoding="utf-8")
    (copy / "bridge_freeze_harness" / "tiny" / "toy_vl.py").write_text(TOY_TINY, encoding="utf-8")
    return copy


def test_a_toy_family_is_two_new_modules_and_the_machinery_reads_their_declarations(tmp_path):
    copy = _copy_with_toy_family(tmp_path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(copy), os.environ.get("PYTHONPATH", "")]),
           "NRL_MEGATRON_CHECKPOINT_DIR": str(tmp_path / "work" / "cache"), "HF_HUB_OFFLINE": "1"}
    (tmp_path / "work").mkdir()
    result = subprocess.run([sys.executable, "-c", CHECKS, str(copy), str(tmp_path / "work"), str(NEMO_RL_GRPO)],
                            capture_output=True, text=True, timeout=600, check=False, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert all(Path(f).is_relative_to(copy) for f in out["files"]), out["files"]  # the copy, not the checkout
    assert out["flag_defaults"] == ["freeze_vision_model"]
    assert out["trainable"] == ["language_model.bias", "language_model.weight", "projector.bias", "projector.weight"]
    code, family, trained, sources = out["check_config"]
    assert code == 0 and family == "toy_vl" and trained == ["language_model", "vision_projection"], out["check_config"]
    assert any("WARNING: Bridge's own default" in s for s in sources.values()), sources
    assert out["offline"] == ["LlamaConfig", 64]
    assert out["tiny"] == "toy_vl"
    assert out["hf"] == ["ToyVLForConditionalGeneration", ["ToyVLForConditionalGeneration"]]
    assert out["step"] == ["megatron.bridge.training.vlm_step:forward_step", True]


def test_the_independent_expectations_never_read_the_registry():
    """``tests/unit/_family_parts.py`` (one entry per family) imports nothing of the plugin at module level."""
    tree = ast.parse((ROOT / "tests" / "unit" / "_family_parts.py").read_text(encoding="utf-8"))
    imported = {n.module or "" for n in tree.body if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in tree.body if isinstance(n, ast.Import) for a in n.names}
    assert not {m for m in imported if m.startswith(("bridge_freeze_plugin", "bridge_freeze_harness"))}
