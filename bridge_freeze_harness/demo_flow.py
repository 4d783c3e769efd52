"""The user's flow end to end on the CPU, for ``bridge-freeze demo``: HF checkpoint in, Bridge's loop, HF out.

:func:`run_demo_flow` does, in a work directory:

1. a tiny random HF checkpoint (:func:`~bridge_freeze_harness.hf_checkpoint.write_tiny_hf_checkpoint`) in ``hf/``;
2. ``AutoBridge.from_hf_pretrained(hf/)`` -> ``to_megatron_provider(load_weights=True)`` with CPU settings
   (:func:`~bridge_freeze_harness.hf_checkpoint.cpu_provider`) -> ``make_freezable(provider, selection)``;
3. Bridge's real ``finetune()`` (:func:`~bridge_freeze_harness.cpu_training.run_training`) with
   ``checkpoint.pretrained_checkpoint = hf/`` (Bridge 0.6.2 loads an HF directory there:
   ``training/checkpointing.py:2670``), Bridge's LoRA as ``cfg.peft`` and the plugin's ``PartLROverrideProvider``
   when asked; it saves a ``torch_dist`` checkpoint in ``checkpoints/iter_<steps>``;
4. ``bridge.save_hf_pretrained(model, export/)`` of the trained model (adapters merged);
5. one :class:`HFTensor` per tensor of the exported safetensors: changed or not against ``hf/``'s file, and
   whether it is expected to change: at least one of its Megatron sources (Bridge's conversion task for it, plus
   the LoRA adapters merged into a wrapped base weight) is in an optimizer group of Bridge's real optimizer
   (:class:`~bridge_freeze_harness.run_records.Recorder`) at a learning rate above 0.

Families that cannot take this flow here are in :data:`DEMO_CANNOT_RUN` with the measured reason (plus those
without an HF checkpoint or a CPU training recipe). Who imports this package, and why:
:mod:`bridge_freeze_harness`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from bridge_freeze_harness.run_records import Recorder, bare_name, iteration_dir

logger = logging.getLogger(__name__)

#: The demo's global learning rate (Adam, constant schedule).
GLOBAL_LR = 1e-2

#: Seeds are folded to 31 bits: Megatron seeds numpy (below 2**32) with the seed plus per-rank offsets.
SEED_BITS = 31

#: family -> why the real-loop demo cannot run it here (measured on this machine; one line each).
DEMO_CANNOT_RUN: dict[str, str] = {}


def demo_refusal(family: str) -> str | None:
    """Why ``family`` cannot run :func:`run_demo_flow` here, or ``None`` (no Bridge import)."""
    from bridge_freeze_harness.hf_checkpoint import NO_HF_CHECKPOINT
    from bridge_freeze_harness.tiny import TINY_FAMILIES
    from bridge_freeze_harness.train import cannot_train_reason

    if family not in TINY_FAMILIES:
        return "no tiny configuration of that name"
    if family in NO_HF_CHECKPOINT:
        return NO_HF_CHECKPOINT[family]
    return cannot_train_reason(family) or DEMO_CANNOT_RUN.get(family)


def demo_families() -> list[str]:
    """The families :func:`run_demo_flow` runs, sorted."""
    from bridge_freeze_harness.tiny import TINY_FAMILIES

    return sorted(name for name in TINY_FAMILIES if demo_refusal(name) is None)


def fold_seed(seed: int) -> int:
    return seed % 2**SEED_BITS


@dataclass(frozen=True)
class HFTensor:
    """One tensor of the exported HF checkpoint."""

    name: str
    #: the plugin's part of its Megatron source (``None``: under no part prefix; ``"none"``: no Megatron source)
    part: str | None
    #: the Megatron parameters (or buffers) it is made of: its conversion task's, and merged LoRA adapters
    sources: tuple[str, ...]
    #: at least one source is in an optimizer group
    trainable: bool
    #: at least one source is in an optimizer group at a learning rate above 0
    expected: bool
    #: the exported tensor differs from the input checkpoint's (bit for bit)
    changed: bool


@dataclass
class DemoResult:
    workdir: Path
    hf_dir: Path
    checkpoint_dir: Path
    export_dir: Path
    losses: list[float]
    tensors: list[HFTensor]
    report: Any
    #: learning rate -> number of Megatron parameters in optimizer groups at that peak learning rate
    learning_rates: dict[float, int]
    seconds: dict[str, float] = field(default_factory=dict)


@dataclass
class _DemoCallback(Recorder):
    """The :class:`Recorder`, plus the trained (wrapped) model at the end and a per-step report."""

    on_step: Callable[[int, float], None] | None = None
    model: Any = None

    def on_train_step_end(self, context: Any) -> None:
        super().on_train_step_end(context)
        if self.on_step is not None and self.losses:
            self.on_step(len(self.losses) - 1, self.losses[-1])

    def on_train_end(self, context: Any) -> None:
        self.model = context.model


@contextlib.contextmanager
def _env_default(name: str, value: str) -> Iterator[None]:
    """``os.environ[name]`` set to ``value`` only when it is unset, for the block."""
    if name in os.environ:
        yield
        return
    os.environ[name] = value
    try:
        yield
    finally:
        os.environ.pop(name, None)


def read_safetensors(directory: Path) -> dict[str, torch.Tensor]:
    """Every tensor of every ``*.safetensors`` file in ``directory``."""
    from safetensors.torch import load_file

    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(Path(directory).glob("*.safetensors")):
        tensors.update(load_file(str(file)))
    return tensors


def _task_hf_names(task: Any) -> set[str]:
    """The HF tensor names one conversion task's (resolved) mapping writes."""
    mapping = task.mapping
    hf_param = getattr(mapping, "hf_param", None)
    if isinstance(hf_param, str):
        names = {hf_param}
    elif isinstance(hf_param, Mapping):  # several HF tensors (e.g. q / k / v, gate / up)
        names = set(hf_param.values())
    else:
        names = set()
    if getattr(mapping, "is_grouped_export", False) and getattr(mapping, "group_key", None):
        names.add(str(mapping.group_key))  # a fused tensor assembled from several tasks (e.g. all experts)
    return {str(n) for n in names}


def hf_sources(bridge: Any, model: Any) -> dict[str, set[str]]:
    """HF tensor name -> the Megatron parameter / buffer names it is made of (Bridge's conversion tasks).

    A LoRA-wrapped base weight (``...<module>.to_wrap.weight``, not its bias) also has the module's adapters
    (``...<module>.adapter.*``) as sources: Bridge's export merges them into it.
    """
    from megatron.bridge.models.conversion.utils import unwrap_model

    chunks = unwrap_model(model if isinstance(model, list) else [model])
    names = [bare_name(n) for chunk in chunks for n, _ in chunk.named_parameters()]
    sources: dict[str, set[str]] = {}
    for task in bridge.get_conversion_tasks(chunks):
        if task is None:
            continue
        param = bare_name(task.global_param_name)
        feeds = {param}
        if _bias_moves_with_router(task):  # its router's weight trains: the bias is updated with it
            feeds.add(param.rpartition(".")[0] + ".weight")
        if param.endswith(".to_wrap.weight"):  # LoRA's B @ A is added to the weight, never to the bias
            module = param.removesuffix(".to_wrap.weight")
            feeds |= {n for n in names if n.startswith(f"{module}.adapter.")}
        for hf_name in _task_hf_names(task):
            sources.setdefault(hf_name, set()).update(feeds)
    return sources


def _bias_moves_with_router(task: Any) -> bool:
    """A MoE router's ``expert_bias`` buffer that megatron-core's ``finalize_model_grads`` updates without a
    gradient (``moe_router_enable_expert_bias`` with a ``moe_router_bias_update_rate`` above 0, not
    ``frozen_expert_bias``): it changes when its router trains (GLM-4.5V's rate is 0: its bias never moves)."""
    module = getattr(task, "megatron_module", None)
    if module is None or getattr(module, "expert_bias", None) is not task.param_weight:
        return False
    config = module.config
    return (bool(getattr(config, "moe_router_enable_expert_bias", False))
            and float(getattr(config, "moe_router_bias_update_rate", 0.0) or 0.0) > 0.0
            and not getattr(module, "frozen_expert_bias", False))


def _part_of(family: Any, sources: set[str]) -> str | None:
    if not sources:
        return "none"
    bases = sorted(s for s in sources if ".adapter." not in s) or sorted(sources)
    part = family.classify(bases[0]) if family is not None else None
    return None if part is None else part.value


def compare(
    original: Mapping[str, torch.Tensor],
    exported: Mapping[str, torch.Tensor],
    sources: Mapping[str, set[str]],
    lr_of: Mapping[str, float],
    family: Any,
) -> list[HFTensor]:
    """One :class:`HFTensor` per exported tensor (``lr_of``: Megatron name -> peak LR, for trainable ones)."""
    missing = sorted(set(original) ^ set(exported))
    if missing:
        raise AssertionError(f"the export and the input checkpoint differ in names: {missing[:5]}")
    rows = []
    for name in sorted(exported):
        feeds = sources.get(name, set())
        before, after = original[name], exported[name]
        changed = before.dtype != after.dtype or before.shape != after.shape or not torch.equal(before, after)
        rows.append(HFTensor(
            name=name, part=_part_of(family, feeds), sources=tuple(sorted(feeds)),
            trainable=any(s in lr_of for s in feeds), expected=any(lr_of.get(s, 0.0) > 0.0 for s in feeds),
            changed=changed))
    return rows


def run_demo_flow(
    family: str,
    workdir: Path,
    *,
    selection: Any,
    steps: int,
    seed: int = 0,
    make_peft: Callable[[], Any] | None = None,
    part_lrs: Mapping[str, float] | None = None,
    provider_fields: Mapping[str, Any] | None = None,
    on_step: Callable[[int, float], None] | None = None,
    lr: float = GLOBAL_LR,
    distributed_optimizer: bool = True,
) -> DemoResult:
    """The whole flow (module docstring) in ``workdir`` (created; its contents are the run's).

    ``selection``: the plugin's ``FreezeSelection``; ``make_peft``: returns Bridge's PEFT (e.g. ``LoRA``) or
    ``None``, called once Bridge is imported (through the harness's TE stub); ``part_lrs``:
    part name -> learning rate (the plugin's ``PartLROverrideProvider``); ``provider_fields``: more provider
    fields (e.g. activation recompute); ``distributed_optimizer``: megatron-core's distributed optimizer, as
    Bridge's recipes use (with the plain one, megatron-core cannot save the optimizer state of a layer stack
    that trains only some of its layers, e.g. ``--train 'language_model\\.decoder\\.layers\\.1'``:
    ``validate_sharding_integrity`` refuses the stacked ``optimizer.state.exp_avg...layers...`` shards).
    Call from a script's ``if __name__ == "__main__":`` block (the first checkpoint save starts a spawn-context
    process).
    """
    seconds: dict[str, float] = {}
    clock = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        seconds[name] = now - clock
        clock = now

    from bridge_freeze_harness.cpu_runtime import import_bridge, init_cpu_distributed

    import_bridge()
    init_cpu_distributed()
    from megatron.bridge import AutoBridge

    from bridge_freeze_harness.cpu_training import run_training, training_config
    from bridge_freeze_harness.hf_checkpoint import cpu_provider, hf_build_patches, write_tiny_hf_checkpoint
    from bridge_freeze_plugin import last_report, make_freezable
    from bridge_freeze_plugin.optim import PartLROverrideProvider

    lap("import")
    workdir = Path(workdir)
    seed = fold_seed(seed)
    hf_dir = write_tiny_hf_checkpoint(family, workdir / "hf", seed=seed)
    lap("checkpoint")

    bridge = AutoBridge.from_hf_pretrained(str(hf_dir))
    provider = make_freezable(cpu_provider(bridge, family, load_weights=True, **dict(provider_fields or {})),
                              selection)
    overrides = PartLROverrideProvider(**{f"lr_{part}": value for part, value in part_lrs.items()}) if part_lrs \
        else None
    peft = make_peft() if make_peft is not None else None
    cfg = training_config(provider, workdir, steps, family=family, pretrained_checkpoint=hf_dir, peft=peft, lr=lr,
                          optimizer_config_override_provider=overrides, seed=seed + 1,
                          distributed_optimizer=distributed_optimizer)  # Megatron wants > 0
    cfg.dataset.seed = seed
    callback = _DemoCallback(on_step=on_step)
    # Bridge's deterministic mode (the Qwen3.5 CPU configs: the GDN's PyTorch conv path) asserts that NCCL_ALGO
    # names an all-reduce algorithm (training/config.py:1058); gloo does not read it.
    with hf_build_patches(family), _env_default("NCCL_ALGO", "Ring"):
        run_training(cfg, family=family, callbacks=[callback])  # finetune(): pretrained_checkpoint is set
    lap("train")
    if callback.model is None:
        raise RuntimeError(f"Bridge's finetune() of {family!r} ended without on_train_end: no trained model")

    export_dir = workdir / "export"
    with hf_build_patches(family):
        bridge.save_hf_pretrained(callback.model, str(export_dir), show_progress=False)
    lap("export")

    lr_of = {name: group.max_lr for group in callback.groups for name in group.names}
    learning_rates: dict[float, int] = {}
    for group in callback.groups:
        learning_rates[group.max_lr] = learning_rates.get(group.max_lr, 0) + len(group.names)
    tensors = compare(read_safetensors(hf_dir), read_safetensors(export_dir), hf_sources(bridge, callback.model),
                      lr_of, provider.freeze_family())
    lap("compare")
    return DemoResult(
        workdir=workdir, hf_dir=hf_dir, checkpoint_dir=iteration_dir(cfg.checkpoint.save, steps),
        export_dir=export_dir, losses=list(callback.losses), tensors=tensors, report=last_report(provider),
        learning_rates=learning_rates, seconds=seconds,
    )
