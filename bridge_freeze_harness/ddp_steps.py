"""Megatron DDP and Megatron's optimizer on one CUDA device: build, a few steps, buffers and state read back.

What a training job does, without Bridge's training loop: ``provide_distributed_model`` (Float16Module, DDP with
its contiguous gradient buffers, the distributed optimizer's layout), ``get_megatron_optimizer``, and per step
``zero_grad_buffer`` / forward / backward / ``finish_grad_sync`` / ``step``. Built in the harness's CUDA mode
(:func:`~bridge_freeze_harness.context.device_build_context` with ``"cuda"``); the forward runs inside
:func:`~bridge_freeze_harness.forward.forward_patches` with ``device="cuda"`` (no CPU device patch).

:class:`DDPRun` holds what the GPU tests assert and the GPU benchmark reports: the parameter names, those that
train, those in DDP's gradient buffers, the bytes of weights / gradient buffers / optimizer state, CUDA memory
after the first step and at its peak, step times and losses. Who imports it: :mod:`bridge_freeze_harness`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from bridge_freeze_harness.batches import TrainSpec


@dataclass
class DDPRun:
    """One DDP-wrapped model trained a few steps on CUDA (bytes are exact; memory from the CUDA allocator)."""

    names: list[str] = field(default_factory=list)
    trainable: list[str] = field(default_factory=list)
    in_buffers: list[str] = field(default_factory=list)
    trainable_on_cuda: bool = False
    trainable_elements: int = 0
    weight_bytes: int = 0
    grad_buffer_bytes: int = 0  #: DDP's grad_data tensors, padding included
    grad_bytes_unpadded: int = 0  #: trainable elements x the buffer's element size
    optimizer_state_bytes: int = 0  #: Adam's exp_avg + exp_avg_sq
    optimizer_step_bytes: int = 0  #: Adam's per-parameter ``step`` counters
    main_param_bytes: int = 0  #: the optimizer's fp32 main copy of bf16 weights
    memory_after_step1: int = 0
    peak_memory: int = 0
    losses: list[float] = field(default_factory=list)
    step_seconds: list[float] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        out = dict(vars(self))
        for key in ("names", "trainable", "in_buffers"):
            out[key] = len(out[key])
        return out


def ddp_config(distributed_optimizer: bool = True) -> Any:
    from megatron.core.distributed import DistributedDataParallelConfig

    return DistributedDataParallelConfig(
        use_distributed_optimizer=distributed_optimizer, grad_reduce_in_fp32=True, overlap_grad_reduce=False
    )


def build_ddp_chunks(provider: Any, family: str, *, distributed_optimizer: bool = True, bf16: bool = True,
                     device: str = "cuda") -> list[Any]:
    """``provider.provide_distributed_model``: Float16Module (bf16) + Megatron DDP.

    ``device="cpu"`` is the rehearsal of the same code on a CPU (inside
    :func:`~bridge_freeze_harness.cpu_training.cpu_training`, whose patches Megatron's optimizer needs there).
    """
    from bridge_freeze_harness.context import device_build_context

    with device_build_context(family, device):
        return provider.provide_distributed_model(
            ddp_config=ddp_config(distributed_optimizer), bf16=bf16, fp16=False,
            use_cpu_initialization=device == "cpu",
        )


def megatron_optimizer(chunks: list[Any], *, lr: float = 1e-4, distributed_optimizer: bool = True,
                       bf16: bool = True) -> Any:
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    config = OptimizerConfig(
        optimizer="adam", lr=lr, weight_decay=0.1, bf16=bf16, clip_grad=1.0,
        params_dtype=torch.bfloat16 if bf16 else torch.float32, use_distributed_optimizer=distributed_optimizer,
    )
    return get_megatron_optimizer(config, chunks)


def _buffers(chunk: Any) -> list[Any]:
    return [*getattr(chunk, "buffers", []), *getattr(chunk, "expert_parallel_buffers", [])]


def _inner_optimizers(optimizer: Any) -> list[torch.optim.Optimizer]:
    return [part.optimizer for part in getattr(optimizer, "chained_optimizers", [optimizer])]


def read_layout(chunks: list[Any], optimizer: Any | None, run: DDPRun) -> DDPRun:
    """Names, trainable names, names in DDP's buffers and the exact bytes, into ``run``."""
    named = [(n, p) for chunk in chunks for n, p in chunk.named_parameters()]
    buffered = {id(p) for chunk in chunks for buf in _buffers(chunk) for p in buf.params}
    run.names = [n for n, _ in named]
    run.trainable = [n for n, p in named if p.requires_grad]
    run.in_buffers = [n for n, p in named if id(p) in buffered]
    run.trainable_on_cuda = all(p.is_cuda for _, p in named if p.requires_grad)
    run.trainable_elements = sum(p.numel() for _, p in named if p.requires_grad)
    run.weight_bytes = sum(p.numel() * p.element_size() for _, p in named)
    grads = [buf.grad_data for chunk in chunks for buf in _buffers(chunk)]
    run.grad_buffer_bytes = sum(g.numel() * g.element_size() for g in grads)
    run.grad_bytes_unpadded = run.trainable_elements * (grads[0].element_size() if grads else 0)
    if optimizer is not None:
        inner = _inner_optimizers(optimizer)
        states = [(key, v) for opt in inner for state in opt.state.values() for key, v in state.items()
                  if torch.is_tensor(v)]
        run.optimizer_state_bytes = sum(v.numel() * v.element_size() for key, v in states if key != "step")
        run.optimizer_step_bytes = sum(v.numel() * v.element_size() for key, v in states if key == "step")
        main = [p for opt in inner for group in opt.param_groups for p in group["params"]]
        run.main_param_bytes = sum(p.numel() * p.element_size() for p in main if p.dtype == torch.float32)
    return run


def to_cuda(batch: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v.cuda(non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()}


def one_step(chunks: list[Any], optimizer: Any, batch: Mapping[str, Any], family: str, spec: TrainSpec,
             device: str = "cuda") -> float:
    """zero_grad_buffer, forward + backward (the device's forward patches), finish_grad_sync, optimizer step."""
    from bridge_freeze_harness.forward import forward_patches

    for chunk in chunks:
        chunk.zero_grad_buffer()
    optimizer.zero_grad()
    with forward_patches(family, device=device):
        loss = spec.loss(chunks[0](**spec.forward_kwargs(batch)), batch)
        loss.backward()
    for chunk in chunks:
        chunk.finish_grad_sync()
    optimizer.step()
    return float(loss.detach())


def _synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def train_ddp(chunks: list[Any], optimizer: Any, batch: Mapping[str, Any], family: str, spec: TrainSpec,
              steps: int, device: str = "cuda") -> DDPRun:
    """``steps`` steps; the layout, the bytes, memory after step 1 and at the peak (CUDA), times and losses."""
    run = DDPRun()
    _synchronize(device)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    for chunk in chunks:
        chunk.train()
    for step in range(steps):
        started = time.perf_counter()
        run.losses.append(one_step(chunks, optimizer, batch, family, spec, device))
        _synchronize(device)
        run.step_seconds.append(time.perf_counter() - started)
        if step == 0 and device == "cuda":
            run.memory_after_step1 = torch.cuda.memory_allocated()
    if device == "cuda":
        run.peak_memory = torch.cuda.max_memory_allocated()
    return read_layout(chunks, optimizer, run)
