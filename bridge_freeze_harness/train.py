"""A few real training steps of a tiny Bridge VLM on the CPU: synthetic batch, loss, AdamW.

What a configuration needs to train here is its family module's :class:`~bridge_freeze_harness.batches.TrainSpec`
(``TRAIN_SPECS``; or ``CANNOT_TRAIN``, a reason, when the family cannot run a forward on the CPU). Typical use::

    provider = make_provider("qwen3_vl")           # tiny provider + small special token ids
    model = build_tiny_model("qwen3_vl", provider)
    batch = synthetic_batch("qwen3_vl", provider)
    loss = forward_backward(model, batch, "qwen3_vl")   # forward + backward inside the CPU forward patches
    losses = train_steps(model, "qwen3_vl", provider, steps=3)

CPU forward patches: :mod:`bridge_freeze_harness.forward`. The language model's causal mask is not patched
in: the synthetic batches provide it as ``attention_mask`` (megatron-core's default one is created on
"cuda"). Who imports this package, and why: :mod:`bridge_freeze_harness`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from bridge_freeze_harness.batches import QWEN_TOKEN_IDS, TrainSpec, causal_mask
from bridge_freeze_harness.forward import block_diagonal_mask, forward_patches
from bridge_freeze_harness.tiny._index import cannot_train_reason

__all__ = [
    "QWEN_TOKEN_IDS",
    "TRAIN_SPECS",
    "TrainSpec",
    "block_diagonal_mask",
    "cannot_train_reason",
    "causal_mask",
    "forward_backward",
    "forward_patches",
    "loss_fn",
    "make_provider",
    "projection_parameter_names",
    "synthetic_batch",
    "train_spec",
    "train_steps",
    "trainable_families",
]

logger = logging.getLogger(__name__)


def trainable_families() -> list[str]:
    """Every tiny configuration name that can train on the CPU, sorted (imports each family module)."""
    from bridge_freeze_harness.tiny import TINY_FAMILIES

    return sorted(name for name in TINY_FAMILIES if cannot_train_reason(name) is None)


def train_spec(name: str) -> TrainSpec:
    """The :class:`TrainSpec` of tiny configuration ``name`` (``KeyError`` with the reason when it has none)."""
    from bridge_freeze_harness.tiny import family_module

    reason = cannot_train_reason(name)
    if reason is not None:
        raise KeyError(f"tiny configuration {name!r} cannot train on the CPU: {reason}")
    return family_module(name).TRAIN_SPECS[name]


class _TrainSpecs(Mapping[str, TrainSpec]):
    """Read-only view name -> :class:`TrainSpec` over :func:`trainable_families` (the former dict)."""

    def __getitem__(self, name: str) -> TrainSpec:
        return train_spec(name)

    def __iter__(self) -> Iterator[str]:
        return iter(trainable_families())

    def __len__(self) -> int:
        return len(trainable_families())

    def __contains__(self, name: object) -> bool:
        from bridge_freeze_harness.tiny import TINY_FAMILIES

        return isinstance(name, str) and name in TINY_FAMILIES and cannot_train_reason(name) is None


#: Deprecated: use :func:`trainable_families` / :func:`train_spec`. Kept as a derived, read-only mapping.
TRAIN_SPECS: Mapping[str, TrainSpec] = _TrainSpecs()


def make_provider(name: str, device: str = "cpu", **overrides: Any) -> Any:
    """The tiny provider of ``name``, with its spec's special token ids and CPU-friendly fields.

    ``device``: the runtime to bring up (:func:`bridge_freeze_harness.tiny.make_provider`).
    """
    from bridge_freeze_harness import tiny

    spec = train_spec(name)
    return tiny.make_provider(name, device, **{**spec.token_ids, **spec.cpu_overrides, **overrides})


def projection_parameter_names(name: str, model: torch.nn.Module) -> list[str]:
    prefixes = train_spec(name).projection_prefixes
    return [n for n, _ in model.named_parameters() if n.startswith(prefixes)]


def synthetic_batch(
    name: str, provider: Any, *, batch_size: int = 1, seed: int = 0, spec: TrainSpec | None = None
) -> dict[str, Any]:
    """The configuration's synthetic batch (its spec's ``make_batch``), deterministic for a ``seed``.

    ``spec`` replaces the configuration's own (e.g. a benchmark's larger image).
    """
    spec = spec if spec is not None else train_spec(name)
    spec.check_token_ids(provider)
    return spec.make_batch(provider, spec, batch_size, torch.Generator().manual_seed(seed))


def loss_fn(model: torch.nn.Module, batch: Mapping[str, torch.Tensor], family: str | None = None) -> torch.Tensor:
    """One forward of ``model`` on ``batch`` inside the CPU forward patches; the scalar loss.

    Without ``family`` every batch key goes to ``model.forward`` under its own name (true of the Qwen
    families) and the loss is the per-token loss's mean over ``loss_mask``. The backward of a model built
    with activation recompute re-runs forwards: use :func:`forward_backward` there.
    """
    spec = train_spec(family) if family is not None else TrainSpec()
    with forward_patches(family):
        return spec.loss(model(**spec.forward_kwargs(batch)), batch)


def forward_backward(
    model: torch.nn.Module, batch: Mapping[str, torch.Tensor], family: str | None = None
) -> torch.Tensor:
    """:func:`loss_fn` and ``loss.backward()``, both inside the CPU forward patches; returns the loss."""
    with forward_patches(family):
        loss = loss_fn(model, batch, family)
        loss.backward()
    return loss


def train_steps(
    model: torch.nn.Module,
    family: str,
    provider: Any,
    steps: int,
    lr: float = 1e-2,
    *,
    weight_decay: float = 0.1,
    batch_size: int = 1,
    seed: int = 0,
    on_step: Callable[[int, float], None] | None = None,
    lr_of: Callable[[torch.nn.Parameter], float] | None = None,
) -> list[float]:
    """``steps`` AdamW steps over the parameters with ``requires_grad`` (only); returns the losses.

    ``lr_of(param)``: a parameter's own learning rate (one AdamW group per distinct value); ``lr`` otherwise.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the model has no trainable parameter")
    groups: dict[float, list[torch.nn.Parameter]] = {}
    for param in params:
        groups.setdefault(lr if lr_of is None else float(lr_of(param)), []).append(param)
    optimizer = torch.optim.AdamW([{"params": ps, "lr": group_lr} for group_lr, ps in groups.items()], lr=lr,
                                  weight_decay=weight_decay)
    batch = synthetic_batch(family, provider, batch_size=batch_size, seed=seed)
    model.train()
    losses: list[float] = []
    for step in range(steps):
        optimizer.zero_grad(set_to_none=True)
        loss = forward_backward(model, batch, family)
        optimizer.step()
        losses.append(float(loss.detach()))
        logger.debug("%s step %d loss %.4f", family, step, losses[-1])
        if on_step is not None:
            on_step(step, losses[-1])
    return losses
