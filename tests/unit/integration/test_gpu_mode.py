"""The harness's CUDA mode, checked on the CPU (these run in CI; tests/gpu runs the same mode on a GPU).

On CUDA the CPU device patch (``torch.cuda.current_device`` -> ``"cpu"``) must never run; the TE-to-local spec
swap runs only where TransformerEngine does not import; with TE, nothing is patched (Bridge's own specs).
This machine has no CUDA, so the NCCL runtime (``gpu_runtime.init_gpu_distributed``) is replaced by a no-op
in these tests: it is the one piece that needs a GPU, and tests/gpu runs it.
"""

from __future__ import annotations

import pytest
import torch

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
