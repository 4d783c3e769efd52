"""The harness's CUDA mode, checked on the CPU (these run in CI; tests/gpu runs the same mode on a GPU).

On CUDA the CPU device patch (``torch.cuda.current_device`` -> ``"cpu"``) must never run; the TE-to-local spec
swap runs only where TransformerEngine does not import; with TE, nothing is patched (Bridge's own specs).
This machine has no CUDA, so the NCCL runtime (``gpu_runtime.init_gpu_distributed``) is replaced by a no-op
in these tests: it is the one piece that needs a GPU, and tests/gpu runs it.
"""

from __future__ import annotations

import re

import pytest
import torch

#: Qwen3-VL's projection (the merger and the DeepStack mergers), under any wrapper prefix.
PROJECTION = re.compile(r"^(module\.)*vision_model\.(merger|decoder\.deepstack_merger_list)\.")
HF_PROJECTION = re.compile(r"^model\.visual\.(merger|deepstack_merger_list\.\d+)\.")
QWEN3_VL_PROVIDER = "megatron.bridge.models.qwen_vl.qwen3_vl_provider"
TE_SPEC = "get_gpt_layer_with_transformer_engine_spec"


@pytest.fixture
def cuda_mode(cpu_bridge, monkeypatch):
    """``device="cuda"`` builds on this CPU machine: the NCCL runtime (needs a GPU) replaced by a no-op."""
    from bridge_freeze_harness import gpu_runtime

    monkeypatch.setattr(gpu_runtime, "init_gpu_distributed", lambda seed=1234: None)
    return gpu_runtime


def _spec_getter():
    import importlib

    return getattr(importlib.import_module(QWEN3_VL_PROVIDER), TE_SPEC)


def test_cuda_mode_without_te_swaps_specs_but_never_patches_the_device(cuda_mode, monkeypatch):
    from bridge_freeze_harness.context import device_build_context

    monkeypatch.setattr(cuda_mode, "spec_choice", lambda: "local")
    real_device, bridge_spec = torch.cuda.current_device, _spec_getter()
    with device_build_context("qwen3_vl", "cuda"):
        assert torch.cuda.current_device is real_device
        assert _spec_getter().__name__ == "local_get_gpt_layer_local_spec"
    assert _spec_getter() is bridge_spec


def test_cuda_mode_with_te_keeps_bridge_specs_and_the_device(cuda_mode, monkeypatch):
    from bridge_freeze_harness.context import device_build_context

    monkeypatch.setattr(cuda_mode, "spec_choice", lambda: "transformer_engine")
    real_device, bridge_spec = torch.cuda.current_device, _spec_getter()
    with device_build_context("qwen3_vl", "cuda"):
        assert torch.cuda.current_device is real_device
        assert _spec_getter() is bridge_spec


def test_cpu_mode_still_patches_the_device_and_the_specs(cpu_bridge):
    from bridge_freeze_harness.context import device_build_context

    real_device = torch.cuda.current_device
    with device_build_context("qwen3_vl", "cpu"):
        assert torch.cuda.current_device() == "cpu"
        assert _spec_getter().__name__ == "local_get_gpt_layer_local_spec"
    assert torch.cuda.current_device is real_device


def test_tiny_build_context_in_cuda_mode_never_patches_the_device(cuda_mode, monkeypatch):
    from bridge_freeze_harness.tiny import build_context

    monkeypatch.setattr(cuda_mode, "spec_choice", lambda: "local")
    real_device = torch.cuda.current_device
    with build_context("qwen3_vl", "cuda"):
        assert torch.cuda.current_device is real_device


def test_forward_patches_in_cuda_mode_leave_the_cuda_calls_alone(cpu_bridge):
    from megatron.core.fusions import fused_softmax
    from megatron.core.tensor_parallel import random as mpu_random

    from bridge_freeze_harness.forward import forward_patches

    real = (torch.cuda.current_device, mpu_random._get_cuda_rng_state, mpu_random._set_cuda_rng_state)
    with forward_patches("qwen3_vl", device="cuda"):
        assert (torch.cuda.current_device, mpu_random._get_cuda_rng_state, mpu_random._set_cuda_rng_state) == real
        assert fused_softmax.get_default_causal_mask.keywords == {"device": "cuda"}
    with forward_patches("qwen3_vl", device="cpu"):
        assert torch.cuda.current_device() == "cpu"
        assert fused_softmax.get_default_causal_mask(3).device.type == "cpu"
    assert torch.cuda.current_device is real[0]


def test_spec_choice_follows_whether_transformer_engine_imports(monkeypatch):
    from bridge_freeze_harness import gpu_runtime

    monkeypatch.setattr(gpu_runtime, "real_transformer_engine_available", lambda: True)
    assert gpu_runtime.spec_choice() == "transformer_engine"
    monkeypatch.setattr(gpu_runtime, "real_transformer_engine_available", lambda: False)
    assert gpu_runtime.spec_choice() == "local"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_a_cuda_provider_on_a_machine_without_cuda_is_refused(cpu_bridge):
    from bridge_freeze_harness.tiny import make_provider

    with pytest.raises(RuntimeError, match="without CUDA"):
        make_provider("qwen3_vl", "cuda")


def test_an_unknown_device_is_refused(cpu_bridge):
    from bridge_freeze_harness.context import device_build_context

    with pytest.raises(ValueError, match="'tpu'"), device_build_context("qwen3_vl", "tpu"):
        pass


def test_ddp_steps_rehearsed_on_the_cpu_buffers_hold_exactly_the_projection(cpu_bridge):
    """The GPU tests' and benchmark's DDP code (bridge_freeze_harness.ddp_steps), run with device="cpu"."""
    import bridge_freeze_plugin  # noqa: F401  (activation)
    from bridge_freeze_harness.cpu_training import cpu_training
    from bridge_freeze_harness.ddp_steps import build_ddp_chunks, megatron_optimizer, train_ddp
    from bridge_freeze_harness.train import make_provider, synthetic_batch, train_spec

    with cpu_training("qwen3_vl"):
        provider = make_provider("qwen3_vl", freeze_language_model=True, freeze_vision_model=True)
        chunks = build_ddp_chunks(provider, "qwen3_vl", device="cpu")
        run = train_ddp(chunks, megatron_optimizer(chunks), synthetic_batch("qwen3_vl", provider), "qwen3_vl",
                        train_spec("qwen3_vl"), steps=2, device="cpu")
    projection = {n for n in run.names if PROJECTION.match(n)}
    assert projection and set(run.trainable) == projection == set(run.in_buffers)
    elements = sum(p.numel() for c in chunks for n, p in c.named_parameters() if n in projection)
    assert run.trainable_elements == elements
    assert run.grad_bytes_unpadded == 4 * elements <= run.grad_buffer_bytes  # fp32 grads; buckets are padded
    assert run.optimizer_state_bytes == 8 * elements  # fp32 exp_avg + exp_avg_sq, trainable only
    assert run.main_param_bytes == 4 * elements  # the fp32 main copy of the bf16 trainable weights
    assert len(run.losses) == 2


def test_the_gpu_hf_round_trip_rehearsed_on_the_cpu(cpu_bridge, tmp_path):
    """tests/gpu's round trip (bridge_freeze_harness.gpu_training.cuda_hf_roundtrip) with device="cpu", the
    plugin's collectives forced on as there: after training, the saved HF tensors differ from the checkpoint
    exactly on the projection, and the trainable-only export is those tensors."""
    from safetensors.torch import load_file

    import bridge_freeze_plugin  # noqa: F401  (activation)
    from bridge_freeze_harness.gpu_runtime import plugin_collectives_forced
    from bridge_freeze_harness.gpu_training import cuda_hf_roundtrip

    with plugin_collectives_forced() as calls:  # as tests/gpu runs it on NCCL; here gloo, CPU tensors
        run = cuda_hf_roundtrip(tmp_path, "qwen3_vl", device="cpu")
    assert len(calls) >= 4 and set(calls) == {("cpu", "gloo")}, calls  # build: agreement, report; export: 2
    original = load_file(str(run["checkpoint"] / "model.safetensors"))
    saved = {}
    for path in sorted(run["saved"].glob("*.safetensors")):
        saved.update(load_file(str(path)))
    projection = {n for n in original if HF_PROJECTION.match(n)}
    assert run["trainable_on_device"] and projection
    assert {n for n in saved if not torch.equal(saved[n], original[n])} == projection
    assert set(run["exported"]) == projection
    assert all(torch.equal(run["exported"][n], saved[n]) for n in projection)
