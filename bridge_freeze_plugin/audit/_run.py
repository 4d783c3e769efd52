"""One model's run-time audit, from its build to the optimizer step after its last audited one.

- armed when the plugin built the model for training (:func:`arm`, a build listener): a forward pre-hook on each
  chunk (nothing else until the model trains: a model dropped untrained costs nothing);
- at the model's first training forward (grad enabled, after any checkpoint load): what to watch (:mod:`._watch`), a
  forward hook on each module that holds parameters (noting that it ran), and the fingerprint of what must hold
  (:mod:`._fingerprint`);
- after each of the first K steps' ``finalize_model_grads`` (:mod:`._seam`): the gradients counted
  (:mod:`._gradients`), and the held tensors compared with their fingerprint (a change, or a frozen parameter
  with a gradient, raises :class:`FrozenPartTrainedError` on every rank);
- after step K: the model-wide verdict (:mod:`._summary`) logged by rank 0, raised on every rank when strict;
- after step K + 1 (its optimizer step K checked): gone; the seam's wrapper then costs one empty-dict test.
"""

from __future__ import annotations

import functools
import logging
import time
import weakref
from collections.abc import Sequence
from typing import Any

from bridge_freeze_plugin.audit._fingerprint import Fingerprints
from bridge_freeze_plugin.audit._gradients import GradientTally, grad_of
from bridge_freeze_plugin.audit._report import AuditReport, compress
from bridge_freeze_plugin.audit._summary import summarize
from bridge_freeze_plugin.audit._watch import Tracked, Watch, read_learning_rates, watch_of
from bridge_freeze_plugin.errors import FrozenPartTrainedError, TrainingAuditError, some_of
from bridge_freeze_plugin.prewrap import STATE, IdentityTable, TrainingBuild, agree_on_error, as_chunks
from bridge_freeze_plugin.ranks import is_rank0

logger = logging.getLogger("bridge_freeze_plugin")

#: id(first parameter of a chunk) -> the audit of the model it belongs to (the chunks keep their parameters'
#: identity through Float16Module and DDP), by weak reference: the model's own hooks hold its audit, so a model
#: dropped untrained is collected with it; empty once every audit is done.
PENDING: dict[int, weakref.ref[RunAudit]] = {}
#: provider -> its model's :class:`AuditReport`
REPORTS = IdentityTable()

_SHOWN = 8
_STATS = ("running_mean", "running_var", "num_batches_tracked")


def arm(build: TrainingBuild) -> None:
    """The build listener: audit this model unless its settings turn the audit off."""
    if STATE.active and build.context.audit.on and build.context.family is not None:
        RunAudit(build)


def audit_of(model: Any) -> RunAudit | None:
    """The pending audit of ``model`` (chunks as a list or one module, wrapped or bare), or ``None``."""
    if not PENDING:
        return None
    for chunk in as_chunks(model):
        parameters = getattr(chunk, "parameters", None)
        first = next(iter(parameters()), None) if callable(parameters) else None
        ref = PENDING.get(id(first)) if first is not None else None
        audit = ref() if ref is not None else None
        if audit is not None and any(p is first for p in audit.first_parameters()):
            return audit
    return None


class RunAudit:
    """The audit of one model built for training (see the module docstring)."""

    def __init__(self, build: TrainingBuild) -> None:
        self.settings = build.context.audit
        self.context = build.context
        self.build_report = build.report
        self.report_parts = build.report.part_names
        self.provider = build.provider
        self.chunks = list(build.chunks)
        self._build: TrainingBuild | None = build
        self.watch = Watch([], {})  # filled at the first training forward (:meth:`start`)
        self.held: Fingerprints | None = None
        self.frozen: list[Tracked] = []
        self._held_params: list[Tracked] = []
        self._held_buffers = 0
        self.tally: GradientTally | None = None
        self.step = 0
        self.seconds = 0.0
        self.report: AuditReport | None = None
        # The chunks' pre-hooks hold the audit (PENDING only refers to it): a model dropped untrained takes its
        # audit with it. They do nothing once the audit has started.
        self._pre = [chunk.register_forward_pre_hook(self._first_forward) for chunk in self.chunks]
        for key in [k for k, ref in PENDING.items() if ref() is None]:  # audits of models collected untrained
            del PENDING[key]
        for chunk in self.chunks:
            first = next(iter(chunk.parameters()), None)
            if first is not None:
                PENDING[id(first)] = weakref.ref(self)

    def _first_forward(self, module: Any, _inputs: Any) -> None:
        import torch

        if self.held is None and module.training and torch.is_grad_enabled():
            self.start()

    def start(self) -> None:
        """At the first training forward (a checkpoint loaded, the optimizer built): what to watch, the modules'
        hooks, and the fingerprint of what must hold."""
        started = time.perf_counter()
        assert self._build is not None
        self.watch = watch_of(self._build)
        self._build = None
        ran = functools.partial(_note_run, self.watch.ran)
        self.watch.handles.extend(module.register_forward_hook(ran) for module in self.watch.modules)
        read_learning_rates(self.watch, self.chunks)
        self.frozen = [t for t in self.watch.tracked if not t.param.requires_grad]
        self._held_params = self.watch.held_parameters()
        buffers = self.watch.held_buffers()
        self._held_buffers = len(buffers)
        self.held = Fingerprints([*((t.name, t.param) for t in self._held_params), *buffers])
        self.seconds += time.perf_counter() - started

    def first_parameters(self) -> list[Any]:
        return [p for p in (next(iter(c.parameters()), None) for c in self.chunks) if p is not None]

    def held_counts(self) -> tuple[int, int]:
        """(held parameters this rank counts model-wide, held buffers it counts), for the report."""
        from bridge_freeze_plugin.audit._watch import parallel_state

        tensors = sum(1 for t in self._held_params if t.counts_here and t.first_shard)
        ps = parallel_state()
        owner = ps is None or (ps.get_data_parallel_rank(with_context_parallel=True) == 0
                               and ps.get_tensor_model_parallel_rank() == 0)
        return tensors, self._held_buffers if owner else 0

    # ---------------------------------------------------------------- each step

    def after_finalize(self, model: Sequence[Any]) -> None:
        """Called by the seam once this step's gradients are final, on every rank."""
        started = time.perf_counter()
        self.step += 1
        error: BaseException | None = None
        try:
            if self.held is None:
                self.start()  # no forward went through the chunks' own hooks
            if self.step <= self.settings.steps:
                if self.tally is None:
                    self.tally = GradientTally.start(self.watch.trainable(), as_chunks(model))
                self.tally.add_step()
            self._check_held()
        except Exception as exc:  # noqa: BLE001  (every rank must learn of it: agreed below)
            error = exc
        self.seconds += time.perf_counter() - started
        if not self._agreed(error):
            return
        if self.step == self.settings.steps:
            self._finish(as_chunks(model))
        elif self.step > self.settings.steps:
            self.close()

    def _agreed(self, error: BaseException | None) -> bool:
        """Every rank raises a finding any rank made; an audit that broke (a bug, an unknown layout) stops everywhere
        with a warning, and training goes on."""
        try:
            agree_on_error(error, when=f"in the run-time audit of step {self.step}")
        except (FrozenPartTrainedError, TrainingAuditError):
            self.close()
            raise
        except Exception as exc:  # noqa: BLE001  (the audit's own failure must not stop the training)
            self.close()
            if is_rank0():
                logger.warning("bridge-freeze audit: the run-time audit of %s stopped at step %d and is off for this "
                               "run (%s: %s); training goes on unchecked. Please report this as a bridge-freeze-plugin "
                               "bug.", self.context.provider_label, self.step, type(exc).__name__, exc)
            return False
        return True

    def _check_held(self) -> None:
        assert self.held is not None
        changed = self.held.changed()
        graded = [t.name for t in self.frozen if grad_of(t.param) is not None]
        if not changed and not graded:
            return
        when = (f"step {self.step}, before any optimizer step (its forward, backward or gradient reduction)"
                if self.step == 1 else f"step {self.step}, after optimizer step {self.step - 1}")
        what = []
        if changed:
            what.append(f"{len(changed)} tensor(s) that must hold changed: {some_of(compress(changed), _SHOWN)}"
                        f"{_why(changed, self.watch)}")
        if graded:
            what.append(f"{len(graded)} frozen parameter(s) have a gradient: {some_of(compress(graded), _SHOWN)}")
        raise FrozenPartTrainedError(
            f"{self.context.asked} (family {self.build_report.family}): in {when}, {'; '.join(what)}. The selection "
            f"promised they stay as loaded. What to do: find what writes them (a module of a frozen part in training "
            f"mode, a hook, an optimizer group that holds them) and stop it, or train them on purpose (a flag or a "
            f"train pattern). The run-time audit (audit_steps, BRIDGE_FREEZE_AUDIT_STEPS=0 turns it off) checks this."
        )

    def _finish(self, model: Sequence[Any]) -> None:
        started = time.perf_counter()
        self.watch.remove_hooks()
        report = summarize(self, model)
        self.seconds += time.perf_counter() - started
        report = AuditReport(**{**report.__dict__, "seconds": self.seconds})
        self.report = report
        REPORTS.set(self.provider, report)
        if is_rank0():
            logger.info("%s", report.format())
            for line in report.warnings():
                logger.warning("%s", line)
        if self.settings.strict and not report.ok:
            self.close()
            raise TrainingAuditError(
                " ".join(report.warnings()) + " (strict audit: audit_strict=True or BRIDGE_FREEZE_AUDIT_STRICT; "
                "raised on every rank)")

    def close(self) -> None:
        """Remove every hook and forget the model."""
        for handle in self._pre:
            handle.remove()
        self._pre = []
        self.watch.remove_hooks()
        self.held = None
        for key in [k for k, ref in PENDING.items() if ref() is self or ref() is None]:
            del PENDING[key]


def _note_run(ran: set[int], module: Any, _inputs: Any, _output: Any) -> None:
    """A module's forward hook while audited: a training forward with gradients enabled ran it."""
    import torch

    if module.training and torch.is_grad_enabled():
        ran.add(id(module))


def _why(names: list[str], watch: Any) -> str:
    """What the names of changed tensors suggest, as a clause."""
    hints = []
    if any(n.rpartition(".")[2] in _STATS for n in names):
        hints.append("running statistics move when a BatchNorm-like module of a frozen part runs in training mode")
    if any(n.endswith("expert_bias") for n in names):
        hints.append("megatron-core's finalize_model_grads moves a router's expert bias unless the router is "
                     "frozen_expert_bias")
    zero = {t.name for t in watch.tracked if id(t.param) in watch.zero_lr}
    if any(n in zero for n in names):
        hints.append("some are at learning rate 0, yet the optimizer (weight decay, another group) or a hook "
                     "moved them")
    return f" ({'; '.join(hints)})" if hints else ""


def last_audit(provider: Any) -> AuditReport | None:
    """The run-time audit's verdict on the model last built for training from ``provider`` (``None`` before its
    last audited step)."""
    report = REPORTS.get(provider)
    return report if isinstance(report, AuditReport) else None
