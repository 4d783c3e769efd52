"""Shared fixtures. Real Megatron-Bridge models are built tiny on the CPU through the project's
own test support (``bridge_freeze_harness``); see README, "Which families are real"."""

from __future__ import annotations

import os

import pytest

# No model hub is reachable: make any accidental hub access fail fast instead of hanging.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def cpu_bridge():
    """``import megatron.bridge`` (TE stub) + gloo + model-parallel state, once per test session."""
    import torch

    from bridge_freeze_harness.cpu_runtime import import_bridge, init_cpu_distributed

    # One thread: on a 2-core machine this is faster and steadier for tiny models.
    torch.set_num_threads(1)
    bridge = import_bridge()
    init_cpu_distributed()
    return bridge
