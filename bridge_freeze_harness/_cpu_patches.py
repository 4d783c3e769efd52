"""The patches :func:`bridge_freeze_harness.cpu_training.cpu_training` applies, and what they put in place.

Each patch names the Bridge / megatron-core line it answers (paths relative to site-packages): Bridge's own CUDA
assumptions in ``setup()`` (:func:`_bridge_patches`), CUDA tensors, streams, synchronisation and RNG state as the
CPU has them (:func:`_torch_patches`), the distributed optimizer without TransformerEngine / Apex
(:func:`_optimizer_patches`), and the logger levels and model-parallel state Bridge changes. Who imports this
package, and why: :mod:`bridge_freeze_harness`.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterator
from typing import Any

import torch

_FACTORIES = ("tensor", "zeros", "ones", "empty", "full", "rand", "randn")


def _is_cuda(device: Any) -> bool:
    if isinstance(device, torch.device):
        return device.type == "cuda"
    return isinstance(device, int) or (isinstance(device, str) and device.startswith("cuda"))


def _factory_on_cpu(factory: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """``factory(..., device="cuda")`` -> the same tensor on the CPU; any other call unchanged."""

    @functools.wraps(factory)
    def make(*args: Any, **kwargs: Any) -> torch.Tensor:
        if _is_cuda(kwargs.get("device")):
            kwargs["device"] = "cpu"
        return factory(*args, **kwargs)

    return make


def _stay(self: Any, *_args: Any, **_kwargs: Any) -> Any:
    """``tensor.cuda()`` / ``module.cuda()``: stay on the CPU."""
    return self


def _nothing(*_args: Any, **_kwargs: Any) -> None:
    return None


class CpuStream:
    """Stands for a ``torch.cuda.Stream`` / ``torch.cuda.current_stream()``: a CPU runs everything in order."""

    def __init__(self, *_args: Any, **_kwargs: Any) -> None:
        pass

    wait_stream = wait_event = synchronize = _nothing

    def record_event(self, *_args: Any, **_kwargs: Any) -> None:
        return None

    def query(self) -> bool:
        return True


def _stream_context(*_args: Any, **_kwargs: Any) -> contextlib.AbstractContextManager[None]:
    return contextlib.nullcontext()


def _cpu_rng_state(*_args: Any, **_kwargs: Any) -> torch.Tensor:
    return torch.get_rng_state()


def _type_as_if_cuda(real: Callable[..., Any]) -> Callable[..., Any]:
    """``tensor.type()`` answers ``torch.cuda.FloatTensor`` for a CPU float tensor; a conversion is unchanged."""

    @functools.wraps(real)
    def type_name(self: torch.Tensor, dtype: Any = None, non_blocking: bool = False, **kwargs: Any) -> Any:
        if dtype is not None or kwargs:
            return real(self, dtype, non_blocking, **kwargs)
        name = real(self)
        return name.replace("torch.", "torch.cuda.", 1) if self.device.type == "cpu" else name

    return type_name


def _state_dict_with_placeholder_step(real: Callable[..., Any]) -> Callable[..., Any]:
    """``DistributedOptimizer.state_dict`` on an inner torch Adam that has not stepped yet (a load's template).

    Without TransformerEngine / Apex, ``distrib_optimizer.py:837-839`` reads Adam's ``step`` from the per-parameter
    state and asserts there is exactly one value; before the first step (``sharded_state_dict(is_loading=True)``,
    ``distrib_optimizer.py:1532``, on every resume) there is none. A placeholder ``step`` is seeded in one
    parameter's state for the call and removed again, so ``load_state_dict`` still allocates the state itself
    (``distrib_optimizer.py:974``); the loaded checkpoint's own step replaces the placeholder.
    """

    @functools.wraps(real)
    def state_dict(self: Any) -> Any:
        from megatron.core.optimizer import distrib_optimizer

        inner = self.optimizer
        if distrib_optimizer.HAVE_APEX_OR_TE or inner is None or len(inner.state) > 0:
            return real(self)
        params = [p for group in inner.param_groups for p in group["params"]]
        if not params:
            return real(self)
        inner.state[params[0]] = {"step": torch.tensor(0.0)}
        try:
            return real(self)
        finally:
            inner.state.pop(params[0], None)

    return state_dict


def _load_state_dict_with_group_steps(real: Callable[..., Any]) -> Callable[..., Any]:
    """``DistributedOptimizer.load_state_dict``, then every parameter's Adam ``step`` from its loaded group's.

    Without TransformerEngine / Apex the checkpoint keeps Adam's step in the param groups only
    (``distrib_optimizer.py:868-871``). On load, ``distrib_optimizer.py:1026-1032`` puts ONE tensor holding it into
    every parameter's state, and then the parameter-state load (``distrib_optimizer.py:1217-1225``) copies the
    load template's placeholder step over it: a resumed run restarts Adam's bias correction from the
    placeholder and drifts from an uninterrupted one from its second step on (and a shared tensor would be
    incremented once per parameter). Not CPU-specific (any run without TE / Apex); fixed here for the resume tests.
    """

    @functools.wraps(real)
    def load_state_dict(self: Any, state_dict: Any) -> Any:
        from megatron.core.optimizer import distrib_optimizer

        result = real(self, state_dict)
        if distrib_optimizer.HAVE_APEX_OR_TE or self.optimizer is None:
            return result
        for group in self.optimizer.param_groups:
            for param in group["params"]:
                state = self.optimizer.state.get(param)
                if state is not None and "step" in group and "step" in state:
                    state["step"] = torch.tensor(float(group["step"]))
        return result

    return load_state_dict


def _initialize_allowing_no_cuda(real: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(real)
    def initialize_megatron(*args: Any, **kwargs: Any) -> Any:
        kwargs["allow_no_cuda"] = True
        return real(*args, **kwargs)

    return initialize_megatron


# ---------------------------------------------------------------- the patch list


def _bridge_patches() -> list[tuple[Any, str, Any]]:
    """Bridge's own CUDA assumptions in ``setup()`` / ``initialize_megatron``."""
    from megatron.bridge.training import initialize, setup

    return [
        # training/initialize.py:89-91 asserts CUDA unless allow_no_cuda; setup.py:253 does not pass it.
        (setup, "initialize_megatron", _initialize_allowing_no_cuda(setup.initialize_megatron)),
        # initialize.py:147 -> megatron/core/datasets/utils.py:25: runs `make` in the wheel's datasets folder
        # (no Makefile in a wheel: the helper library ships prebuilt) and exits the process when it fails.
        (initialize, "compile_helpers", _nothing),
        # initialize.py:311 -> 886-944: warms fused bias-GeLU / SwiGLU / dropout-add kernels on "cuda"; the CPU
        # configs switch those fusions off (cpu_runtime.CPU_FUSIONS_OFF), so there is nothing to warm.
        (initialize, "_warmup_jit_function", _nothing),
    ]


def _torch_patches() -> list[tuple[Any, str, Any]]:
    """CUDA tensors, streams, synchronisation and RNG state, as the CPU has them."""
    patches: list[tuple[Any, str, Any]] = [
        # device="cuda" factories: training/setup.py:281, data/loaders.py:406, training/utils/train_utils.py:769 /
        # 1210, training/checkpointing.py:326, training/train.py:1461; megatron/core/optimizer/optimizer.py:315 /
        # 698 / 702 / 1249, core/utils.py:1332, core/optimizer/clip_grads.py:108 / 112 / 180,
        # core/pipeline_parallel/schedules.py:749.
        *((torch, name, _factory_on_cpu(getattr(torch, name))) for name in _FACTORIES),
        # tensor.cuda(): the batch, training/vlm_step.py:150 / 152; module.cuda(): models/model_provider.py:689.
        (torch.Tensor, "cuda", _stay),
        (torch.nn.Module, "cuda", _stay),
        # the DDP wrap's init stream, megatron/training/models/dist_utils.py:303 / 304 / 306 / 366, and the grad
        # sync's current stream, core/distributed/param_and_grad_buffer.py:632.
        (torch.cuda, "Stream", CpuStream),
        (torch.cuda, "current_stream", CpuStream),
        (torch.cuda, "stream", _stream_context),
        # core/timers.py:152 / 165, training/train.py:1030, dist_checkpointing/strategies/filesystem_async.py:248.
        (torch.cuda, "synchronize", _nothing),
        # training/checkpointing.py:491 saves the CUDA generator's state: the CPU generator is the only one here.
        (torch.cuda, "get_rng_state", _cpu_rng_state),
        # core/optimizer/clip_grads.py:174 asserts grad.type() == 'torch.cuda.FloatTensor'; the distributed
        # optimizer picks its shard kind by type name (distrib_optimizer.py:401 / 466 / 758, raises at 477),
        # the mixed-precision optimizer too (core/optimizer/optimizer.py:1009 / 1028).
        (torch.Tensor, "type", _type_as_if_cuda(torch.Tensor.type)),
        # torch.cuda.current_device() as a device: "cpu" (also in forward.py's patches when CUDA is absent).
        (torch.cuda, "current_device", lambda: "cpu"),
    ]
    return patches


def _optimizer_patches() -> list[tuple[Any, str, Any]]:
    """The distributed optimizer without TransformerEngine / Apex (not CPU-specific): resume needs these two."""
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    return [
        (DistributedOptimizer, "state_dict", _state_dict_with_placeholder_step(DistributedOptimizer.state_dict)),
        (DistributedOptimizer, "load_state_dict",
         _load_state_dict_with_group_steps(DistributedOptimizer.load_state_dict)),
    ]


@contextlib.contextmanager
def _logging_levels_kept() -> Iterator[None]:
    """Bridge's ``setup()`` sets the root logger's level and every ``megatron.bridge`` logger's
    (``megatron/training/utils/log_utils.py:101-106``): give them back afterwards."""
    manager = logging.root.manager
    levels = {name: lg.level for name, lg in manager.loggerDict.items() if isinstance(lg, logging.Logger)}
    root = logging.root.level
    try:
        yield
    finally:
        logging.root.setLevel(root)
        for name, lg in list(manager.loggerDict.items()):
            if isinstance(lg, logging.Logger):
                lg.setLevel(levels.get(name, logging.NOTSET))


def _restore_model_parallel_state() -> None:
    """``pretrain()`` destroys the model-parallel state and the RNG tracker when it returns: bring them back."""
    import torch.distributed as dist

    from bridge_freeze_harness.cpu_runtime import init_cpu_distributed

    if dist.is_initialized():
        init_cpu_distributed(world_size=dist.get_world_size(), rank=dist.get_rank())

