"""On a GPU: Bridge's real ``finetune()`` with a checkpoint and a resume; the HF round trip after CUDA training
(``save_hf_pretrained``: frozen tensors bit-identical); ``export_trainable_hf_weights(cpu=True)`` from a CUDA
model; the plugin's collectives (``all_reduce`` of small tensors) on NCCL. Skipped without CUDA.

One GPU gives an NCCL world of one rank, where the plugin skips its collectives (nothing to agree on). To run
them on NCCL anyway, :func:`nccl_collectives` tells the plugin's modules (only them) that the world has 2 ranks
(``bridge_freeze_harness.gpu_runtime.plugin_collectives_forced``): every ``all_reduce`` it issues then really goes
through the NCCL communicator, with the tensors on the device it chose (a sum over one rank leaves them as they are).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
FAMILY = "qwen3_vl"
# Independent of the plugin: the HF names of Qwen3-VL's projection, and its Megatron names.
HF_PROJECTION = re.compile(r"^model\.visual\.(merger|deepstack_merger_list\.\d+)\.")
PROJECTION = re.compile(r"^(module\.)*vision_model\.(merger|decoder\.deepstack_merger_list)\.")


def _safetensors(directory: Path) -> dict:
    from safetensors.torch import load_file

    tensors: dict = {}
    for path in sorted(Path(directory).glob("*.safetensors")):
        tensors.update(load_file(str(path)))
    return tensors


@pytest.fixture(scope="module")
def nccl_collectives(cuda_world):
    """The plugin's collectives run on the world-1 NCCL group (``plugin_collectives_forced``), recorded."""
    from bridge_freeze_harness.gpu_runtime import plugin_collectives_forced

    with plugin_collectives_forced() as calls:
        yield calls


@pytest.fixture(scope="module")
def roundtrip(nccl_collectives, tmp_path_factory):
    from bridge_freeze_harness.gpu_training import cuda_hf_roundtrip

    run = cuda_hf_roundtrip(tmp_path_factory.mktemp("hf_roundtrip"), FAMILY)
    run["original"] = _safetensors(run["checkpoint"])
    run["saved_tensors"] = _safetensors(run["saved"])
    return run


def test_save_hf_pretrained_after_cuda_training_keeps_every_frozen_tensor_bit_identical(roundtrip):
    import torch

    original, saved = roundtrip["original"], roundtrip["saved_tensors"]
    assert roundtrip["trainable_on_device"]
    assert set(saved) == set(original)
    changed = {n for n in saved if not torch.equal(saved[n], original[n])}
    assert changed == {n for n in original if HF_PROJECTION.match(n)}


def test_trainable_export_from_a_cuda_model_is_the_projection_on_the_cpu(roundtrip):
    import torch

    exported, saved = roundtrip["exported"], roundtrip["saved_tensors"]
    assert set(exported) == {n for n in saved if HF_PROJECTION.match(n)}
    assert all(t.device.type == "cpu" for t in exported.values())
    assert all(torch.equal(exported[n].to(saved[n].dtype), saved[n]) for n in exported)


def test_the_plugins_collectives_ran_on_nccl_with_cuda_tensors(roundtrip, nccl_collectives):
    # the build: the pre-wrap hook's error agreement and the model-wide report; the export: the task count and
    # the marks of tensors that changed
    assert len(nccl_collectives) >= 4, nccl_collectives
    assert set(nccl_collectives) == {("cuda", "nccl")}


def test_bridge_finetune_with_a_checkpoint_and_a_resume_on_cuda(cuda_world, tmp_path):
    """Bridge's own loop in a process of its own (it brings up NCCL itself): pretrain 1 -> finetune 4 -> resume."""
    from bridge_freeze_harness.gpu_training import training_importable

    reason = training_importable()
    if reason is not None:
        pytest.skip(f"{reason} (carry its wheels, or run where Bridge's training stack is installed)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "bridge_freeze_harness.gpu_training", "finetune", str(tmp_path)],
                          env=env, capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((tmp_path / "result.json").read_text())
    names = result["changed"] + result["unchanged"]
    assert set(result["changed"]) == {n for n in names if PROJECTION.match(n)}
    assert result["resume_max_abs_diff"] <= 1e-2, result["resume_max_abs_diff"]
