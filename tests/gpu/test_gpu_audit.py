"""On a GPU: the run-time audit's accelerator fingerprint (a checksum computed on the device) sees a one-element change
and what it costs, and the audit of a CUDA model (Float16Module bf16, Megatron DDP, the distributed optimizer) counts
what learned and holds what is frozen. Skipped without CUDA (tests/gpu/conftest.py); the CPU path of the same loop
is tests/unit/audit/test_audit_in_trainers_steps.py."""

from __future__ import annotations

import re
import time

import pytest

pytestmark = pytest.mark.gpu

FAMILY = "qwen3_vl"
PROJECTION = re.compile(r"^vision_model\.(merger|decoder\.deepstack_merger_list)\.")


def test_the_device_checksum_sees_one_element_and_says_its_rate(cuda_world):
    import torch

    from bridge_freeze_plugin.audit import Fingerprints, checksum

    tensor = torch.randn(1 << 27, dtype=torch.bfloat16, device="cuda")  # 256 MiB
    prints = Fingerprints([("t", tensor)])
    assert prints.bytes == 16 and prints.changed() == []  # two int64 sums, not a copy
    checksum(tensor)
    torch.cuda.synchronize()
    started = time.perf_counter()
    checksum(tensor)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    print(f"\ncuda checksum: {tensor.numel() * 2 / seconds / 2**30:.1f} GiB/s on {torch.cuda.get_device_name()}")
    tensor.view(torch.int16)[12345] ^= 1
    assert prints.changed() == ["t"]


def test_the_audit_of_a_cuda_model_counts_what_learned_and_holds_the_rest(cuda_world):
    import torch
    from megatron.core.distributed import finalize_model_grads

    from bridge_freeze_harness.ddp_steps import build_ddp_chunks, megatron_optimizer, to_cuda
    from bridge_freeze_harness.forward import forward_patches
    from bridge_freeze_harness.train import make_provider, synthetic_batch, train_spec
    from bridge_freeze_plugin import FreezeSelection, last_audit, make_freezable

    provider = make_freezable(make_provider(FAMILY, "cuda"),
                              FreezeSelection(freeze_language_model=True, freeze_vision_model=True))
    chunks = build_ddp_chunks(provider, FAMILY, distributed_optimizer=True)
    optimizer = megatron_optimizer(chunks, lr=1e-3, distributed_optimizer=True)
    batch, spec = to_cuda(synthetic_batch(FAMILY, provider, batch_size=2)), train_spec(FAMILY)
    seconds = []
    for _ in range(5):
        for chunk in chunks:
            chunk.zero_grad_buffer()
        optimizer.zero_grad()
        started = time.perf_counter()
        with forward_patches(FAMILY, device="cuda"):
            spec.loss(chunks[0](**spec.forward_kwargs(batch)), batch).backward()
        finalize_model_grads(chunks)  # the seam every trainer's step meets
        optimizer.step()
        torch.cuda.synchronize()
        seconds.append(time.perf_counter() - started)
    report = last_audit(provider)
    names = {n for c in chunks for n, _ in c.module.module.named_parameters()}
    assert report is not None and report.ok and set(report.learned) == {n for n in names if PROJECTION.match(n)}
    assert report.held_tensors == len(names) - len(report.learned)
    print(f"\naudit on cuda: {report.seconds * 1e3:.1f} ms over its steps; step times (s) {seconds}")
