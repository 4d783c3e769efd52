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

Which families take this flow here, and why not the others: :mod:`bridge_freeze_harness.demo_scope`. Who imports
this package, and why: :mod:`bridge_freeze_harness`.
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

from bridge_freeze_harness._hf_compare import HFTensor, compare, hf_sources, read_safetensors
from bridge_freeze_harness.run_records import Recorder, iteration_dir

logger = logging.getLogger(__name__)

#: The demo's global learning rate (Adam, constant schedule).
GLOBAL_LR = 1e-2

#: Seeds are folded to 31 bits: Megatron seeds numpy (below 2**32) with the seed plus per-rank offsets.
SEED_BITS = 31


def fold_seed(seed: int) -> int:
    return seed % 2**SEED_BITS


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
    #: the plugin's run-time audit of the first steps (``AuditReport``; ``None`` when it did not run)
    audit: Any = None
    #: the Megatron names of the parameters in Bridge's optimizer groups (read off its real optimizer)
    optimizer_names: list[str] = field(default_factory=list)


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
    laps = _Laps()
    auto_bridge = _bridge_up()
    from bridge_freeze_harness.hf_checkpoint import hf_build_patches, write_tiny_hf_checkpoint
    from bridge_freeze_plugin import last_audit, last_report

    laps("import")
    workdir = Path(workdir)
    seed = fold_seed(seed)
    hf_dir = write_tiny_hf_checkpoint(family, workdir / "hf", seed=seed)
    laps("checkpoint")

    bridge, provider = _load_freezable(auto_bridge, family, hf_dir, selection, provider_fields)
    cfg = _demo_config(provider, workdir, family, steps, hf_dir, seed, make_peft=make_peft, part_lrs=part_lrs,
                       lr=lr, distributed_optimizer=distributed_optimizer)
    callback = _finetune(cfg, family, on_step)
    laps("train")

    export_dir = workdir / "export"
    with hf_build_patches(family):
        bridge.save_hf_pretrained(callback.model, str(export_dir), show_progress=False)
    laps("export")

    lr_of, learning_rates = _learning_rates(callback.groups)
    tensors = compare(read_safetensors(hf_dir), read_safetensors(export_dir), hf_sources(bridge, callback.model),
                      lr_of, provider.freeze_family())
    laps("compare")
    return DemoResult(
        workdir=workdir, hf_dir=hf_dir, checkpoint_dir=iteration_dir(cfg.checkpoint.save, steps),
        export_dir=export_dir, losses=list(callback.losses), tensors=tensors, report=last_report(provider),
        learning_rates=learning_rates, seconds=laps.seconds, audit=last_audit(provider),
        optimizer_names=sorted(set().union(*(g.names for g in callback.groups))),
    )


def _load_freezable(auto_bridge: Any, family: str, hf_dir: Path, selection: Any,
                    provider_fields: Mapping[str, Any] | None) -> tuple[Any, Any]:
    """``(bridge, provider)``: ``hf_dir`` through ``AutoBridge``, and its CPU provider with ``selection``."""
    from bridge_freeze_harness.hf_checkpoint import bridge_load_context, cpu_provider
    from bridge_freeze_plugin import make_freezable

    with bridge_load_context(family):
        bridge = auto_bridge.from_hf_pretrained(str(hf_dir))
    provider = cpu_provider(bridge, family, load_weights=True, **dict(provider_fields or {}))
    return bridge, make_freezable(provider, selection)


class _Laps:
    """Seconds from the previous call (or the start) to each call, by the name given: the run's phases."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._clock = time.perf_counter()

    def __call__(self, name: str) -> None:
        now = time.perf_counter()
        self.seconds[name] = now - self._clock
        self._clock = now


def _bridge_up() -> Any:
    """Bridge imported (through the harness's TE stub) on the CPU runtime: its ``AutoBridge``."""
    from bridge_freeze_harness.cpu_runtime import import_bridge, init_cpu_distributed

    import_bridge()
    init_cpu_distributed()
    from megatron.bridge import AutoBridge

    return AutoBridge


def _demo_config(
    provider: Any,
    workdir: Path,
    family: str,
    steps: int,
    hf_dir: Path,
    seed: int,
    *,
    make_peft: Callable[[], Any] | None,
    part_lrs: Mapping[str, float] | None,
    lr: float,
    distributed_optimizer: bool,
) -> Any:
    """The ``ConfigContainer`` of :func:`run_demo_flow`'s ``finetune()`` from ``hf_dir`` (its arguments)."""
    from bridge_freeze_harness.cpu_training import training_config
    from bridge_freeze_plugin.optim import PartLROverrideProvider

    overrides = PartLROverrideProvider(**{f"lr_{part}": value for part, value in part_lrs.items()}) if part_lrs \
        else None
    peft = make_peft() if make_peft is not None else None
    cfg = training_config(provider, workdir, steps, family=family, pretrained_checkpoint=hf_dir, peft=peft, lr=lr,
                          optimizer_config_override_provider=overrides, seed=seed + 1,
                          distributed_optimizer=distributed_optimizer)  # Megatron wants > 0
    cfg.dataset.seed = seed
    return cfg


def _finetune(cfg: Any, family: str, on_step: Callable[[int, float], None] | None) -> _DemoCallback:
    """Bridge's ``finetune()`` of ``cfg`` (its ``pretrained_checkpoint`` is set); the callback that recorded it."""
    from bridge_freeze_harness.cpu_training import run_training
    from bridge_freeze_harness.hf_checkpoint import bridge_load_context, hf_build_patches

    callback = _DemoCallback(on_step=on_step)
    # Bridge's deterministic mode (the Qwen3.5 CPU configs: the GDN's PyTorch conv path) asserts that NCCL_ALGO
    # names an all-reduce algorithm (training/config.py:1058); gloo does not read it.
    with hf_build_patches(family), bridge_load_context(family), _env_default("NCCL_ALGO", "Ring"):
        run_training(cfg, family=family, callbacks=[callback])  # finetune(): pretrained_checkpoint is set
    if callback.model is None:
        raise RuntimeError(f"Bridge's finetune() of {family!r} ended without on_train_end: no trained model")
    return callback


def _learning_rates(groups: Any) -> tuple[dict[str, float], dict[float, int]]:
    """Megatron name -> the peak learning rate of its optimizer group; peak learning rate -> how many names."""
    lr_of = {name: group.max_lr for group in groups for name in group.names}
    learning_rates: dict[float, int] = {}
    for group in groups:
        learning_rates[group.max_lr] = learning_rates.get(group.max_lr, 0) + len(group.names)
    return lr_of, learning_rates
