"""Run Bridge's REAL training loop (``pretrain()`` / ``finetune()``) on a CPU: one context, one config helper.

Typical use (a script needs ``if __name__ == "__main__":``: the first checkpoint save starts a spawn-context
process, ``megatron/core/dist_checkpointing/strategies/filesystem_async.py:65``)::

    from bridge_freeze_harness.cpu_training import run_training, training_config
    from bridge_freeze_harness.train import make_provider

    provider = make_provider("qwen3_vl")                      # a tiny provider (plugin flags may be set on it)
    cfg = training_config(provider, workdir, train_iters=4)    # a Bridge ConfigContainer (gloo, CPU-sized)
    run_training(cfg)                                          # pretrain(); finetune() when cfg.peft is set

or, around any other Bridge call (``setup()``, ``setup_optimizer()``, ``finetune()`` with another step function):
``with cpu_training("qwen3_vl"): ...``.

:func:`cpu_training` applies, only while it is active, what stands between Bridge's training stack and a machine
without CUDA; each patch (:mod:`._cpu_patches`) names the Bridge / megatron-core line it answers (paths relative to
site-packages). In one paragraph: ``setup()`` calls ``initialize_megatron`` with ``allow_no_cuda``; the dataset
helpers' ``make`` and the fused-kernel JIT warm-up are skipped; ``device="cuda"`` tensor factories make CPU tensors,
``.cuda()`` stays on the CPU, CUDA streams are in-order stand-ins, ``torch.cuda.synchronize`` does nothing, the
CUDA RNG state saved with a checkpoint is the CPU generator's, ``Tensor.type()`` names a CPU float tensor
``torch.cuda.FloatTensor`` (megatron-core's optimizers branch on it); and the distributed optimizer without
TransformerEngine / Apex gets two fixes a resume needs (not CPU-specific). Everything is restored on exit, as are
the logger levels Bridge sets, and the model-parallel state that ``pretrain()`` destroys when it returns is
brought back up (other tests in the session build models on it). The context includes the tiny build context
(:func:`bridge_freeze_harness.tiny.build_context`: TE specs swapped for local ones) and the CPU forward patches
(:func:`bridge_freeze_harness.forward.forward_patches`), because ``setup()`` builds the model and ``train()`` runs
forwards. The data comes from :class:`SyntheticVLMDataset` (the harness's synthetic batches in the layout of
the family's Bridge forward step, :data:`FORWARD_STEPS` (each tiny module declares its own):
``megatron/bridge/training/vlm_step.py`` for most, the
Qwen-Omni ones ``models/qwen_omni/qwen3_omni_step.py``, Nemotron-VL ``training/llava_step.py``, Nemotron Omni
``training/nemotron_omni_step.py`` (with ``bf16_mixed``: it hands the model bf16 media), Step-3.7 the harness's own,
``tiny/_step37_step.py``), since
Bridge's mock VLM dataset loads a processor from the model hub.

Who imports this package, and why it is never on the plugin's runtime path: :mod:`bridge_freeze_harness`.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bridge_freeze_harness._bridge_steps import (
    FORWARD_STEPS,
    QWEN_OMNI_MEDIA_KEYS,
    QWEN_OMNI_STEP,
    VLM_STEP,
    BridgeStep,
    SyntheticVLMDataset,
    forward_step_of,
    vlm_step_with,
)
from bridge_freeze_harness._cpu_patches import (
    CpuStream,
    _bridge_patches,
    _logging_levels_kept,
    _optimizer_patches,
    _restore_model_parallel_state,
    _torch_patches,
)
from bridge_freeze_harness.cpu_runtime import fresh_training_state
from bridge_freeze_harness.patching import patched

#: The public names, some defined in the private helpers :mod:`._bridge_steps` and :mod:`._cpu_patches`.
__all__ = [
    "FORWARD_STEPS",
    "QWEN_OMNI_MEDIA_KEYS",
    "QWEN_OMNI_STEP",
    "VLM_STEP",
    "BridgeStep",
    "CpuStream",
    "SyntheticVLMDataset",
    "checkpoint_config",
    "cpu_training",
    "forward_step_of",
    "run_training",
    "synthetic_dataset_config",
    "training_config",
    "vlm_forward_step",
    "vlm_step_with",
]

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def cpu_training(name: str = "qwen3_vl") -> Iterator[None]:
    """Bridge's real ``pretrain`` / ``finetune`` / ``setup`` / ``setup_optimizer`` / checkpointing on the CPU.

    ``name`` is the tiny configuration whose build / forward patches apply (:mod:`bridge_freeze_harness.tiny`).
    Imports Bridge (TE stub), brings up the CPU runtime, installs the ``nvidia_resiliency_ext`` stub for
    ``training/pretrain.py`` (:mod:`._resiliency_stub`), and applies the patches of :mod:`._cpu_patches`; all
    undone on exit.
    Build the config with :func:`training_config` (gloo, CPU-sized, synthetic data).
    """
    from bridge_freeze_harness import _resiliency_stub
    from bridge_freeze_harness.forward import forward_patches
    from bridge_freeze_harness.tiny import build_context

    _resiliency_stub.install()
    with build_context(name), forward_patches(name):
        import megatron.bridge.training.pretrain  # noqa: F401 - through the stub, before any patch reads it

        fresh_training_state()
        try:
            with _logging_levels_kept(), patched([*_bridge_patches(), *_torch_patches(), *_optimizer_patches()]):
                yield
        finally:
            _restore_model_parallel_state()



def synthetic_dataset_config(family: str, provider: Any, seed: int = 0, media: bool = True) -> Any:
    """A Bridge ``DatasetProvider`` (``cfg.dataset``) over :class:`SyntheticVLMDataset` of ``provider``'s geometry.

    ``provider`` is the run's model provider (vocabulary, special ids, vision patches, dtype); it is held in a
    private field, which Bridge leaves out of the ``run_config.yaml`` it writes with each checkpoint. ``media=False``:
    text-only samples (no image, no audio).
    """
    # training/config.py defines both in Bridge 0.6.0 and re-exports them from data/base.py (new in 0.6.2) since
    from megatron.bridge.training.config import DatasetBuildContext, DatasetProvider

    @dataclass(kw_only=True)
    class SyntheticVLMDatasetConfig(DatasetProvider):
        family: str
        seed: int = 0
        media: bool = True
        _provider: Any = None
        # vlm_step (training/vlm_step.py:122 / 179) and qwen3_omni_step read attention_mask only when this is False
        skip_getting_attention_mask_from_dataset: bool = False

        def build_datasets(self, context: DatasetBuildContext) -> tuple[Any, Any, Any]:
            dataset = SyntheticVLMDataset(self.family, self._provider, context.train_samples, self.seed, self.media)
            return dataset, None, None

    SyntheticVLMDatasetConfig.__module__ = __name__
    return SyntheticVLMDatasetConfig(
        family=family, seed=seed, media=media, _provider=provider, dataloader_type="single", num_workers=0,
        pin_memory=False,
        persistent_workers=False, data_sharding=True,
    )


# ---------------------------------------------------------------- the config


def training_config(
    provider: Any,
    workdir: str | Path,
    train_iters: int,
    *,
    family: str = "qwen3_vl",
    save_interval: int | None = None,
    load: str | Path | None = None,
    load_step: int | None = None,
    pretrained_checkpoint: str | Path | None = None,
    distributed_optimizer: bool = False,
    bf16_mixed: bool = False,
    peft: Any = None,
    lr: float = 1e-3,
    micro_batch_size: int = 1,
    global_batch_size: int | None = None,
    optimizer_config_override_provider: Any = None,
    seed: int = 1234,
) -> Any:
    """A Bridge ``ConfigContainer`` for a CPU run of ``provider`` (a tiny provider of ``family``, flags set).

    Checkpoints: :func:`checkpoint_config`. Adam at a constant ``lr`` (minimum ``lr / 10``), weight decay 0.1,
    gradient clipping at 1.0; a global batch of ``global_batch_size`` samples (default: one micro-batch of
    ``micro_batch_size`` per data-parallel rank); gloo; the synthetic data of :func:`synthetic_dataset_config`.
    ``distributed_optimizer`` sets both the optimizer's and DDP's switch; ``bf16_mixed`` is Bridge's
    ``"bf16_mixed"`` recipe; ``peft`` a Bridge PEFT (e.g. ``LoRA``; ``finetune()`` then needs
    ``pretrained_checkpoint``); ``optimizer_config_override_provider`` e.g. the plugin's ``PartLROverrideProvider``.
    """
    from megatron.bridge.training import config as bc
    from megatron.bridge.training.tokenizers.config import TokenizerConfig

    _require_cpu_fusions_off(provider)
    cfg = bc.ConfigContainer(
        model=provider,
        train=bc.TrainingConfig(train_iters=train_iters, micro_batch_size=micro_batch_size,
                                global_batch_size=global_batch_size or micro_batch_size * _world_size()),
        optimizer=bc.OptimizerConfig(optimizer="adam", lr=lr, min_lr=lr / 10, weight_decay=0.1, clip_grad=1.0,
                                     use_distributed_optimizer=distributed_optimizer, bf16=False, fp16=False),
        scheduler=bc.SchedulerConfig(lr_decay_style="constant", start_weight_decay=0.1, end_weight_decay=0.1),
        ddp=bc.DistributedDataParallelConfig(use_distributed_optimizer=distributed_optimizer,
                                             grad_reduce_in_fp32=True, overlap_grad_reduce=False),
        dataset=synthetic_dataset_config(family, provider),
        # filter_warnings=False: Bridge's filter would drop every WARNING record of every logger of the process
        logger=bc.LoggerConfig(log_interval=1, logging_level=logging.WARNING, filter_warnings=False),
        tokenizer=TokenizerConfig(tokenizer_type="NullTokenizer", vocab_size=int(provider.vocab_size) - 1),
        checkpoint=checkpoint_config(Path(workdir) / "checkpoints", save_interval or train_iters, load=load,
                                     load_step=load_step, pretrained_checkpoint=pretrained_checkpoint),
        dist=bc.DistributedInitConfig(distributed_backend="gloo"),  # nccl refuses without CUDA
        rng=bc.RNGConfig(seed=seed),
        peft=peft,
        mixed_precision="bf16_mixed" if bf16_mixed else None,
    )
    cfg.validation.eval_iters = 0
    if optimizer_config_override_provider is not None:
        cfg.optimizer_config_override_provider = optimizer_config_override_provider
    return cfg


def checkpoint_config(
    save: Path,
    save_interval: int,
    *,
    load: str | Path | None = None,
    load_step: int | None = None,
    pretrained_checkpoint: str | Path | None = None,
) -> Any:
    """torch_dist checkpoints, written synchronously to ``save`` every ``save_interval`` iterations.

    ``load`` resumes from a checkpoint directory (its latest iteration, or ``load_step``);
    ``pretrained_checkpoint`` is what ``finetune()`` / PEFT start from. ``load_rng=False``:
    ``training/checkpointing.py:3156`` exits when a checkpoint's RNG tracker has no states, and the CPU tracker
    has none. (Restoring the CPU generator would not make a run with dropout resume bitwise anyway: on a CPU,
    dropout shares torch's generator with the DataLoader, which draws its base seed when the resumed run creates
    its iterator; on a GPU dropout has the CUDA generator to itself. A bitwise resume needs ``hidden_dropout=0``.)
    """
    from megatron.bridge.training.config import CheckpointConfig

    def path(value: str | Path | None) -> str | None:
        return None if value is None else str(value)

    return CheckpointConfig(
        save=str(save), save_interval=save_interval, load=path(load), ckpt_step=load_step,
        pretrained_checkpoint=path(pretrained_checkpoint), ckpt_format="torch_dist", async_save=False,
        load_rng=False, fully_parallel_save=False,
    )


def _require_cpu_fusions_off(provider: Any) -> None:
    """The fused kernels have no CPU implementation, and their warm-up is skipped here (:func:`_bridge_patches`)."""
    from bridge_freeze_harness.cpu_runtime import CPU_FUSIONS_OFF

    on = sorted(name for name in CPU_FUSIONS_OFF if getattr(provider, name, False))
    if on:
        raise ValueError(f"{type(provider).__name__} has {', '.join(on)} on, which a CPU run cannot execute: set "
                         "them to False (bridge_freeze_harness.cpu_runtime.CPU_FUSIONS_OFF) before training_config()")


def _world_size() -> int:
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_initialized() else 1


def vlm_forward_step() -> Callable[..., Any]:
    """Bridge's own VLM forward step (``megatron.bridge.training.vlm_step.forward_step``)."""
    from megatron.bridge.training.vlm_step import forward_step

    return forward_step


def run_training(cfg: Any, *, family: str = "qwen3_vl", callbacks: list[Any] | None = None) -> None:
    """Bridge's real ``finetune()`` (``cfg.peft`` or ``cfg.checkpoint.pretrained_checkpoint`` set) or ``pretrain()``
    of ``cfg`` with Bridge's forward step for ``family`` (:func:`forward_step_of`: vlm_step's for most), inside
    :func:`cpu_training`. Call from ``if __name__ == "__main__":``.
    """
    with cpu_training(family):
        from megatron.bridge.training.finetune import finetune
        from megatron.bridge.training.pretrain import pretrain

        tune = cfg.peft is not None or cfg.checkpoint.pretrained_checkpoint is not None
        (finetune if tune else pretrain)(cfg, forward_step_of(family).load(), callbacks=callbacks)
