"""The run-time audit where the trainers reduce their gradients, each its own way, with megatron-core's real
schedules, Megatron DDP and Megatron's optimizer on the CPU (the tiny Qwen3-VL, projection only).

- **SkyRL 0.4.0** (installed): its ``MegatronModelWrapper`` sets ``config.finalize_model_grads_func`` to a method that
  only records the request (its schedules' end-of-call sync), and its ``run_pending_grad_sync`` reduces once per
  optimizer step, however many ``forward_backward`` calls the step took. Its own class runs here; the two Bridge
  names it imports from ``megatron.bridge.peft.utils``, which Bridge 0.6.2 lacks (SkyRL pins a newer Bridge), are
  given what that Bridge does for a model without expert LoRA: megatron-core's ``finalize_model_grads``.
- **NeMo-RL**: not installable here (PyPI's ``nemo-rl`` is a 0.0.0 placeholder), so its Megatron policy worker's
  step is followed as its source writes it (``nemo_rl/models/policy/workers/megatron_policy_worker.py``,
  ``begin_train_step`` / ``_finish_train_step_body`` at commit 7ea279abf): Bridge's ``_update_model_config_funcs``
  binds ``partial(finalize_model_grads, pg_collection=...)``; the step saves it and sets the config's to ``None``, runs
  the schedules, then calls the saved function once and steps the optimizer.
- **a loop of one's own** with ``get_forward_backward_func()`` and ``config.finalize_model_grads_func`` set, and one
  that reduces with its own code and calls ``bridge_freeze_plugin.audit_step`` instead.

Each audits 3 optimizer steps, once each, whatever the number of schedule calls per step.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from _shared import QWEN3_PROJECTION

import bridge_freeze_plugin  # the plugin active, as in a user's job
from bridge_freeze_plugin import FreezeSelection, audit_step, last_audit, make_freezable

pytestmark = pytest.mark.usefixtures("cpu_bridge")

FAMILY = "qwen3_vl"
STEPS = 4


@contextlib.contextmanager
def _model() -> Iterator[tuple[Any, list[Any], Any]]:
    """(provider, DDP chunks, Megatron's optimizer) of the tiny Qwen3-VL with the projection training."""
    from bridge_freeze_harness.cpu_training import cpu_training
    from bridge_freeze_harness.ddp_steps import build_ddp_chunks, megatron_optimizer
    from bridge_freeze_harness.forward import forward_patches
    from bridge_freeze_harness.train import make_provider

    provider = make_freezable(make_provider(FAMILY, hidden_dropout=0.0),
                              FreezeSelection(freeze_language_model=True, freeze_vision_model=True))
    with cpu_training(FAMILY), forward_patches(FAMILY):
        chunks = build_ddp_chunks(provider, FAMILY, distributed_optimizer=False, bf16=False, device="cpu")
        yield provider, chunks, megatron_optimizer(chunks, distributed_optimizer=False, bf16=False)


def _schedule_call(provider: Any, chunks: list[Any], seed: int) -> None:
    """One call of megatron-core's schedule (``get_forward_backward_func()``) on one synthetic micro-batch."""
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from bridge_freeze_harness.train import synthetic_batch, train_spec

    spec = train_spec(FAMILY)
    batch = synthetic_batch(FAMILY, provider, batch_size=1, seed=seed)

    def forward_step(data: Any, model: Any) -> tuple[Any, Callable[[Any], Any]]:
        sample = next(data)
        output = model(**spec.forward_kwargs(sample))
        return output, lambda out: (spec.loss(out, sample), {"loss": spec.loss(out, sample).detach()})

    get_forward_backward_func()(forward_step_func=forward_step, data_iterator=iter([batch]), model=chunks,
                                num_microbatches=1, seq_length=int(batch["input_ids"].shape[1]), micro_batch_size=1)


def _zero(chunks: list[Any], optimizer: Any) -> None:
    for chunk in chunks:
        chunk.zero_grad_buffer()
    optimizer.zero_grad()


def _projection_learned(provider: Any, chunks: list[Any]) -> None:
    report = last_audit(provider)
    names = {n for c in chunks for n, _ in c.module.named_parameters()}
    assert report is not None and report.ok and report.steps == 3
    assert set(report.learned) == {n for n in names if QWEN3_PROJECTION.match(n)}
    assert report.held_tensors == len(names) - len(report.learned)


def _skyrl_wrapper_module(monkeypatch: Any) -> Any:
    from _skyrl_weight_sync import skyrl_megatron_worker

    skyrl_megatron_worker()  # SkyRL's worker modules, their outer layers (Ray, vLLM) stubbed while they import
    module = importlib.import_module("skyrl.backends.skyrl_train.workers.megatron.megatron_model_wrapper")

    def finalize_model_grads_with_expert_adapter_sync(model: Any, num_tokens: Any = None) -> None:
        """What SkyRL's Bridge does with no expert LoRA: megatron-core's reduce (looked up as SkyRL's Bridge does)."""
        from megatron.core.distributed import finalize_model_grads

        finalize_model_grads(model, num_tokens)

    monkeypatch.setattr(module, "finalize_model_grads_with_expert_adapter_sync",
                        finalize_model_grads_with_expert_adapter_sync)
    monkeypatch.setattr(module, "enable_expert_parallel_grad_sync_in_finalize", lambda model: None)
    return module


def test_skyrl_040s_deferred_sync_is_audited_once_per_optimizer_step(monkeypatch):
    from megatron.core.utils import get_model_config

    from bridge_freeze_plugin.audit import audit_of

    wrapper_module = _skyrl_wrapper_module(monkeypatch)
    config_module = importlib.import_module("skyrl.train.config.config")
    with _model() as (provider, chunks, optimizer):
        trainer = config_module.SkyRLTrainConfig().trainer
        trainer.remove_microbatch_padding = False  # SkyRL's own rule for a model that packs in its forward (a VLM)
        wrapper = wrapper_module.MegatronModelWrapper(trainer, chunks, optimizer)
        assert get_model_config(chunks[0]).finalize_model_grads_func == wrapper._defer_finalize_model_grads
        audit = audit_of(chunks)
        for step in range(STEPS):
            _zero(chunks, optimizer)
            for call in range(2):  # an accumulation window of two forward_backward calls
                _schedule_call(provider, chunks, seed=10 * step + call)
            assert audit.step == min(step, 3)  # the schedules' deferred calls are not the step's sync
            wrapper.run_pending_grad_sync()
            optimizer.step()
    _projection_learned(provider, chunks)


def test_nemo_rls_relocated_finalize_is_audited_once_per_optimizer_step():
    from megatron.bridge.training.setup import _update_model_config_funcs
    from megatron.core.utils import get_model_config

    from bridge_freeze_harness.ddp_steps import ddp_config

    with _model() as (provider, chunks, optimizer):
        config = get_model_config(chunks[0])
        _update_model_config_funcs(chunks, config, ddp_config(False), optimizer)  # Bridge binds the partial
        for step in range(STEPS):
            _zero(chunks, optimizer)
            saved, config.finalize_model_grads_func = config.finalize_model_grads_func, None  # begin_train_step
            for call in range(2):  # streamed chunks of the step
                _schedule_call(provider, chunks, seed=10 * step + call)
            config.finalize_model_grads_func = saved
            saved(chunks, None)  # _finish_train_step_body: the saved callable, once
            optimizer.step()
    _projection_learned(provider, chunks)


def test_a_users_loop_through_the_config_attribute():
    from megatron.core.distributed import finalize_model_grads
    from megatron.core.utils import get_model_config

    with _model() as (provider, chunks, optimizer):
        get_model_config(chunks[0]).finalize_model_grads_func = finalize_model_grads
        for step in range(STEPS):
            _zero(chunks, optimizer)
            _schedule_call(provider, chunks, seed=step)
            optimizer.step()
    _projection_learned(provider, chunks)


def test_a_loop_that_reduces_with_its_own_code_calls_audit_step():
    with _model() as (provider, chunks, optimizer):
        for step in range(STEPS):
            _zero(chunks, optimizer)
            _schedule_call(provider, chunks, seed=step)  # no finalize_model_grads_func: nothing reduced here
            for chunk in chunks:
                chunk.finish_grad_sync()
            audit_step(chunks)
            optimizer.step()
    _projection_learned(provider, chunks)
    assert bridge_freeze_plugin.audit_step is audit_step
