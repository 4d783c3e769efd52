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
without CUDA; each patch below names the Bridge / megatron-core line it answers (paths relative to
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
the family's Bridge forward step, :data:`FORWARD_STEPS`: ``megatron/bridge/training/vlm_step.py`` for most, the
Qwen-Omni ones ``models/qwen_omni/qwen3_omni_step.py``), since Bridge's mock VLM dataset loads a processor from
the model hub.

Who imports this package, and why it is never on the plugin's runtime path: :mod:`bridge_freeze_harness`.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from bridge_freeze_harness._visual_inputs import visual_inputs_with
from bridge_freeze_harness.patching import patched

logger = logging.getLogger(__name__)

_FACTORIES = ("tensor", "zeros", "ones", "empty", "full", "rand", "randn")


# ---------------------------------------------------------------- the patches' replacements


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


@contextlib.contextmanager
def cpu_training(name: str = "qwen3_vl") -> Iterator[None]:
    """Bridge's real ``pretrain`` / ``finetune`` / ``setup`` / ``setup_optimizer`` / checkpointing on the CPU.

    ``name`` is the tiny configuration whose build / forward patches apply (:mod:`bridge_freeze_harness.tiny`).
    Imports Bridge (TE stub), brings up the CPU runtime, installs the ``nvidia_resiliency_ext`` stub for
    ``training/pretrain.py`` (:mod:`._resiliency_stub`), and applies the patches above; all undone on exit.
    Build the config with :func:`training_config` (gloo, CPU-sized, synthetic data).
    """
    from bridge_freeze_harness import _resiliency_stub
    from bridge_freeze_harness.forward import forward_patches
    from bridge_freeze_harness.tiny import build_context

    _resiliency_stub.install()
    with build_context(name), forward_patches(name):
        import megatron.bridge.training.pretrain  # noqa: F401 - through the stub, before any patch reads it

        try:
            with _logging_levels_kept(), patched([*_bridge_patches(), *_torch_patches(), *_optimizer_patches()]):
                yield
        finally:
            _restore_model_parallel_state()


# ---------------------------------------------------------------- Bridge's forward steps and their batch layouts


def _cat(samples: list[dict[str, Any]], key: str, dim: int = 0) -> torch.Tensor:
    return torch.cat([s[key] for s in samples], dim=dim)


#: image keys (Bridge's ``GenericVisualInputs``) and audio keys (its ``Qwen2AudioInputs``) of vlm_step's layout.
_VLM_IMAGE_KEYS = ("pixel_values", "image_grid_thw", "image_sizes", "image_position_ids", "mm_token_type_ids")
_VLM_AUDIO_KEYS = ("input_features", "feature_attention_mask")


def _vlm_step_batch(samples: list[dict[str, Any]], extra_image_keys: tuple[str, ...] = ()) -> dict[str, Any]:
    """What ``megatron/bridge/training/vlm_step.py`` reads: ``tokens``, ``labels``, ``loss_mask``,
    ``attention_mask``, ``position_ids`` (the sample's, else ``None``: the model computes M-RoPE ids) and one
    ``visual_inputs`` object: ``GenericVisualInputs`` for images, ``Qwen2AudioInputs`` for audio. vlm_step passes
    that one object only, so samples with images AND audio are refused (no field of either class holds both).
    ``extra_image_keys``: model inputs ``GenericVisualInputs`` has no field for; the object is then a subclass
    with those fields (:func:`visual_inputs_with`), which vlm_step hands on like the others."""
    from megatron.bridge.training.utils.visual_inputs import GenericVisualInputs, Qwen2AudioInputs

    first = samples[0]
    audio_keys = tuple(k for k in _VLM_AUDIO_KEYS if k not in extra_image_keys)
    if any(k in first for k in _VLM_IMAGE_KEYS) and any(k in first for k in audio_keys):
        raise NotImplementedError(
            "the synthetic batch has images and audio; Bridge's vlm_step passes one inputs object "
            "(GenericVisualInputs, which has no audio field, or Qwen2AudioInputs, which has no image one)")
    if any(k in first for k in audio_keys):
        inputs: Any = Qwen2AudioInputs(**{k: _cat(samples, k) for k in audio_keys if k in first})
    else:
        image_class = visual_inputs_with(extra_image_keys) if extra_image_keys else GenericVisualInputs
        image_keys = (*_VLM_IMAGE_KEYS, *extra_image_keys)
        inputs = image_class(**{k: _cat(samples, k) for k in image_keys if k in first})
    return {
        "tokens": _cat(samples, "input_ids"),
        "labels": _cat(samples, "labels"),
        "loss_mask": _cat(samples, "loss_mask"),
        "attention_mask": first["attention_mask"],  # [1, 1, s, s], shared by the batch
        # [b, s] or M-RoPE's [3, b, s]: the batch is the next-to-last dimension in both
        "position_ids": _cat(samples, "position_ids", dim=-2) if "position_ids" in first else None,
        "visual_inputs": inputs,
    }


def _named_keys_batch(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Every sample key under its own name, concatenated along the batch (``input_ids``, not ``tokens``), as
    Bridge's Qwen3-Omni collator (``models/qwen_omni/data/collate_fn.py``) hands a batch to its step: the media
    tensors are top-level keys, no inputs object. A shared ``attention_mask`` ``[1, 1, s, s]`` is kept as is;
    ``position_ids`` (``[b, s]`` or M-RoPE's ``[3, b, s]``) joins along its next-to-last dimension."""
    first = samples[0]
    batch: dict[str, Any] = {}
    for key in first:
        if key == "attention_mask":
            batch[key] = first[key]
        else:
            batch[key] = _cat(samples, key, dim=-2 if key == "position_ids" else 0)
    return batch


@dataclass(frozen=True)
class BridgeStep:
    """One of Bridge's own forward steps, and the batch layout its ``get_batch`` reads.

    :class:`SyntheticVLMDataset` lays its samples out with ``collate`` and refuses a sample key outside ``keys``
    (a key the step would not carry to the model); :func:`run_training` hands ``function`` to Bridge's loop.
    """

    #: ``module:attribute`` of Bridge's forward step (imported when the run starts, through the harness's TE stub).
    function: str
    #: the synthetic-sample keys (:func:`bridge_freeze_harness.train.synthetic_batch`) the step carries to the model.
    keys: frozenset[str]
    #: samples of one micro-batch -> the batch the step's ``get_batch`` reads.
    collate: Callable[[list[dict[str, Any]]], dict[str, Any]]
    #: the most samples one micro-batch may hold (``None``: any), where more break the model (the reason beside
    #: the table entry).
    max_micro_batch: int | None = None

    def load(self) -> Callable[..., Any]:
        """The step function itself."""
        module, _, name = self.function.partition(":")
        return getattr(importlib.import_module(module), name)


#: ``megatron/bridge/training/vlm_step.py``: the media in one ``visual_inputs`` object (:func:`_vlm_step_batch`).
VLM_STEP = BridgeStep(
    "megatron.bridge.training.vlm_step:forward_step",
    keys=frozenset({"input_ids", "labels", "loss_mask", "attention_mask", "position_ids",
                    *_VLM_IMAGE_KEYS, *_VLM_AUDIO_KEYS}),
    collate=_vlm_step_batch,
)


def vlm_step_with(*extra_image_keys: str) -> BridgeStep:
    """:data:`VLM_STEP` whose ``visual_inputs`` also carries ``extra_image_keys`` (:func:`visual_inputs_with`)."""
    return replace(VLM_STEP, keys=VLM_STEP.keys | set(extra_image_keys),
                   collate=functools.partial(_vlm_step_batch, extra_image_keys=tuple(extra_image_keys)))


#: The media keys ``megatron/bridge/models/qwen_omni/qwen3_omni_step.py`` moves to the device and passes to the
#: model under their own names (its ``_MULTIMODAL_KEYS``, less its ``visual_inputs`` object).
QWEN_OMNI_MEDIA_KEYS = ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw",
                        "video_second_per_grid", "input_features", "feature_attention_mask", "audio_feature_lengths")

#: Bridge's Qwen3-Omni thinker step: ``input_ids``, ``labels``, ``loss_mask`` and the media as top-level keys
#: (:func:`_named_keys_batch`). It sets ``position_ids`` to ``None`` itself (the thinker computes its M-RoPE ids
#: from the whole ``input_ids``) and passes ``attention_mask`` on when the dataset has one; the Omni samples have
#: none (the thinker reads one as HF's ``[b, s]`` padding mask), so the language model takes its causal default.
QWEN_OMNI_STEP = BridgeStep(
    "megatron.bridge.models.qwen_omni.qwen3_omni_step:forward_step",
    keys=frozenset({"input_ids", "labels", "loss_mask", "attention_mask", "position_ids", *QWEN_OMNI_MEDIA_KEYS}),
    collate=_named_keys_batch,
)

#: tiny configuration -> Bridge's forward step that trains it, where that is not :data:`VLM_STEP`.
FORWARD_STEPS: dict[str, BridgeStep] = {
    # Bridge 0.6.2 has no step (nor recipe) of its own for Qwen2.5-Omni; its Qwen3-Omni step fits the model:
    # Qwen25OmniModel.forward takes the same keywords (input_ids, labels, loss_mask, the media keys above).
    "qwen25_omni": QWEN_OMNI_STEP,
    # One audio clip per micro-batch: with two or more, Bridge 0.6.2's Qwen3OmniThinkerModel.get_audio_features
    # splits the encoder's output with the wrong per-clip lengths and raises "Audio features and audio tokens do
    # not match" (tiny/qwen3_omni.py, train_batch). A micro-batch of one sample is what works.
    "qwen3_omni": replace(QWEN_OMNI_STEP, max_micro_batch=1),
    # Ernie45VLModel.forward routes each token to the text or the vision expert pool by moe_mm_token_type_ids;
    # without it every token goes to the text pool (ernie_moe_layer.py:204-211) and the vision pool never trains.
    "ernie45_vl": vlm_step_with("moe_mm_token_type_ids"),
    # Gemma4VLModel.forward takes the audio as input_features next to the image; Bridge 0.6.2's own Gemma4 collate
    # (gemma4_vl_collate_fn -> GenericVisualInputs) drops it, so audio_tower / embed_audio would get no gradient.
    "gemma4_vl": vlm_step_with("input_features"),
}


def forward_step_of(family: str) -> BridgeStep:
    """The :class:`BridgeStep` that trains tiny configuration ``family`` (:data:`FORWARD_STEPS`, else vlm_step's)."""
    return FORWARD_STEPS.get(family, VLM_STEP)


class SyntheticVLMDataset(torch.utils.data.Dataset):
    """Sample ``i`` is the tiny configuration's synthetic batch of one with seed ``seed + i`` (deterministic).

    :meth:`collate_fn` lays samples out as the family's Bridge step reads them (:func:`forward_step_of`):
    vlm_step's ``tokens`` / ``visual_inputs`` layout, or the Omni step's top-level keys.
    """

    def __init__(self, family: str, provider: Any, samples: int, seed: int = 0) -> None:
        from bridge_freeze_harness.train import train_spec

        if train_spec(family).forward_keys is not None:
            raise ValueError(f"tiny configuration {family!r} renames its batch keys for the model's forward; Bridge's "
                             "steps pass them under their own names: train it with bridge_freeze_harness.train")
        self.family, self.provider, self.samples, self.seed = family, provider, samples, seed
        self.step = forward_step_of(family)

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, index: int) -> dict[str, Any]:
        from bridge_freeze_harness.train import synthetic_batch

        sample = synthetic_batch(self.family, self.provider, batch_size=1, seed=self.seed + int(index))
        unknown = set(sample) - self.step.keys
        if unknown:
            raise NotImplementedError(
                f"the synthetic batch of {self.family!r} has {sorted(unknown)}, which {self.step.function} does not "
                "carry to the model; give the family another BridgeStep (cpu_training.FORWARD_STEPS)")
        return sample

    def collate_fn(self, samples: list[dict[str, Any]]) -> dict[str, Any]:
        limit = self.step.max_micro_batch
        if limit is not None and len(samples) > limit:
            raise ValueError(f"{self.family!r} trains with at most {limit} sample(s) per micro-batch here, got "
                             f"{len(samples)} (cpu_training.FORWARD_STEPS says why)")
        return self.step.collate(samples)


def synthetic_dataset_config(family: str, provider: Any, seed: int = 0) -> Any:
    """A Bridge ``DatasetProvider`` (``cfg.dataset``) over :class:`SyntheticVLMDataset` of ``provider``'s geometry.

    ``provider`` is the run's model provider (vocabulary, special ids, vision patches, dtype); it is held in a
    private field, which Bridge leaves out of the ``run_config.yaml`` it writes with each checkpoint.
    """
    from megatron.bridge.data.base import DatasetBuildContext, DatasetProvider

    @dataclass(kw_only=True)
    class SyntheticVLMDatasetConfig(DatasetProvider):
        family: str
        seed: int = 0
        _provider: Any = None
        # vlm_step (training/vlm_step.py:122 / 179) and qwen3_omni_step read attention_mask only when this is False
        skip_getting_attention_mask_from_dataset: bool = False

        def build_datasets(self, context: DatasetBuildContext) -> tuple[Any, Any, Any]:
            return SyntheticVLMDataset(self.family, self._provider, context.train_samples, self.seed), None, None

    SyntheticVLMDatasetConfig.__module__ = __name__
    return SyntheticVLMDatasetConfig(
        family=family, seed=seed, _provider=provider, dataloader_type="single", num_workers=0, pin_memory=False,
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
