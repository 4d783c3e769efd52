"""Figure 2: memory actually allocated, per accepted selection, against full fine-tuning.

A tiny real Bridge Qwen3-VL on the CPU, built through its real provider with the flags set (the plugin
freezes before any optimizer exists). After one backward and one AdamW step we count the bytes that
really exist: ``p.grad`` of every parameter, and every tensor in ``optimizer.state`` (``exp_avg``,
``exp_avg_sq``, ``step``). A frozen parameter must cost neither, so the ratio to full fine-tuning must
equal the trainable fraction exactly.

Besides the 7 selections validation accepts without LoRA, two with Bridge's real LoRA
(``megatron.bridge.peft.lora.LoRA``) as a pre-wrap hook: all three flags set (only the adapters train), and
LoRA on the attention of the language model and vision encoder next to a full-rank projection (language
model and vision encoder frozen: adapters + projection train). Their trainable fraction is trainable
parameters over the base model's parameters (full fine-tuning's count, which has no adapters).

The naive alternative, freezing after the optimizer was built over every parameter, is measured in two
variants: (a) gradients released each step (``zero_grad(set_to_none=True)``): torch's AdamW skips
parameters without a gradient, so nothing extra is allocated; (b) gradients that already exist when the
model is frozen (a contiguous gradient buffer such as Megatron DDP's, allocated at wrap time for every
parameter that then required grad, or ``zero_grad(set_to_none=False)`` after an earlier step): the
"frozen" parameters keep their gradient, AdamW allocates their state, and weight decay moves them.
"""

from __future__ import annotations

from typing import Any

import torch

from benchmarks._models import FAMILY, LORA_ALPHA, LORA_DIM, accepted_selections, build, build_lora, label, quiet

LR = 1e-3
WEIGHT_DECAY = 0.1


def _grad_bytes(model: torch.nn.Module) -> int:
    return sum(p.grad.nbytes for p in model.parameters() if p.grad is not None)


def _state_bytes(optimizer: torch.optim.Optimizer) -> dict[str, int]:
    out = {"moments": 0, "step": 0, "params_with_state": 0}
    for state in optimizer.state.values():
        if state:
            out["params_with_state"] += 1
        for key, value in state.items():
            if torch.is_tensor(value):
                out["step" if key == "step" else "moments"] += value.nbytes
    return out


def _one_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: Any, *, release: bool) -> None:
    from bridge_freeze_harness.train import loss_fn

    optimizer.zero_grad(set_to_none=release)
    with quiet():
        loss = loss_fn(model, batch)
    loss.backward()
    optimizer.step()


def _frozen(model: torch.nn.Module, selection: Any) -> list[torch.nn.Parameter]:
    from bridge_freeze_plugin.registry import get_family

    family = get_family(FAMILY)
    parts = selection.frozen_parts()
    return [p for n, p in model.named_parameters() if family.classify(n) in parts]


#: The LoRA rows: label -> (flags, LoRA target modules; None = Bridge's defaults).
LORA_ROWS = {
    "LoRA + freeze LM+VM+VP": ((True, True, True), None),
    "LoRA (attention) + full-rank projection": ((True, True, False), ["linear_qkv", "linear_proj"]),
}
_PROJECTION = ("vision_model.merger.", "vision_model.decoder.deepstack_merger_list.")


def run(quick: bool = False) -> dict[str, Any]:
    from bridge_freeze_harness.train import make_provider, synthetic_batch
    from bridge_freeze_plugin.config import LoraSettings, validate_selection
    from bridge_freeze_plugin.request import FreezeSelection

    with quiet():
        provider = make_provider(FAMILY)
    selections = accepted_selections(provider)
    if quick:  # full fine-tuning, projection only (+ the LoRA row below): the smoke test needs keys, not rows
        selections = [s for s in selections if not s.any_set or s.set_flags() == (
            "freeze_language_model", "freeze_vision_model")]
    adapters_only = FreezeSelection(True, True, True)
    # Raises if validation does not accept it (it must, or the row would show an unusable setup).
    validate_selection(adapters_only, provider=provider, lora=LoraSettings(rank=LORA_DIM, alpha=LORA_ALPHA))
    batch = synthetic_batch(FAMILY, provider)
    rows: dict[str, Any] = {}
    full: dict[str, Any] | None = None
    # The LoRA rows last (kept in --quick too: two more tiny builds). Full fine-tuning comes first.
    runs = [*((label(s), s, None) for s in selections),
            *((name, FreezeSelection(*flags), targets) for name, (flags, targets) in LORA_ROWS.items())]
    for name, selection, targets in runs:
        with_lora = name in LORA_ROWS
        torch.manual_seed(0)
        if with_lora:
            model, lora = build_lora(selection, targets)
        else:
            model, lora = build(provider, selection), None
        total = sum(p.numel() for p in model.parameters())
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=LR, weight_decay=WEIGHT_DECAY)
        _one_step(model, optimizer, batch, release=True)
        state = _state_bytes(optimizer)
        base = total if full is None else full["total_params"]  # the model without adapters
        if lora is not None:
            trained = {n for n, p in model.named_parameters() if p.requires_grad}
            adapters = {n for n in trained if ".adapter." in n}
            full_rank = trained - adapters
            lora = {**lora, "adapter_params": total - base,
                    "adapters_and_full_rank_parts_train": bool(adapters) and (
                        full_rank == {n for n, _ in model.named_parameters() if n.startswith(_PROJECTION)}
                        if not selection.all_set else not full_rank)}
        row = {
            "selection": selection.as_dict(),
            "lora": lora,
            "trainable_params": trainable,
            "total_params": total,
            "trainable_fraction": trainable / base,
            "grad_bytes": _grad_bytes(model),
            "optimizer_moment_bytes": state["moments"],
            "optimizer_step_bytes": state["step"],
            "params_with_optimizer_state": state["params_with_state"],
            "trainable_tensors": len(params),
        }
        if full is None:
            full = row  # the first accepted selection is "train everything"
        row["grad_ratio"] = row["grad_bytes"] / full["grad_bytes"]
        row["optimizer_moment_ratio"] = row["optimizer_moment_bytes"] / full["optimizer_moment_bytes"]
        row["optimizer_total_ratio"] = (row["optimizer_moment_bytes"] + row["optimizer_step_bytes"]) / (
            full["optimizer_moment_bytes"] + full["optimizer_step_bytes"]
        )
        # Exact: integer byte counts, fp32 everywhere -> bytes = 4 * elements.
        row["exact"] = (
            row["grad_bytes"] * base == full["grad_bytes"] * trainable
            and row["optimizer_moment_bytes"] * base == full["optimizer_moment_bytes"] * trainable
        )
        rows[name] = row
        del model, optimizer

    naive = _naive(provider, selections[1:], batch, rows)
    return {
        "family": FAMILY,
        "optimizer": f"AdamW(lr={LR}, weight_decay={WEIGHT_DECAY})",
        "dtype": "float32",
        "selections": rows,
        "all_exact": all(r["exact"] for r in rows.values()),
        "naive_freeze_after_optimizer": naive,
    }


def _naive(provider: Any, selections: list[Any], batch: Any, correct: dict[str, Any]) -> dict[str, Any]:
    from bridge_freeze_plugin.request import FreezeSelection

    out: dict[str, Any] = {}
    for selection in selections:
        entry: dict[str, Any] = {}
        for variant, preallocated in (("grads_released", False), ("grads_preallocated", True)):
            torch.manual_seed(0)
            model = build(provider, FreezeSelection())  # everything trainable when the optimizer is built
            optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
            if preallocated:
                for p in model.parameters():
                    p.grad = torch.zeros_like(p)
            frozen = _frozen(model, selection)
            for p in frozen:
                p.requires_grad_(False)
            before = [p.detach().clone() for p in frozen]
            _one_step(model, optimizer, batch, release=not preallocated)
            state = _state_bytes(optimizer)
            ref = correct[label(selection)]
            full = correct["full fine-tuning"]
            full_bytes = full["grad_bytes"] + full["optimizer_moment_bytes"] + full["optimizer_step_bytes"]
            moved = max(((p.detach() - b).abs().max().item() for p, b in zip(frozen, before, strict=True)),
                        default=0.0)
            entry[variant] = {
                "grad_bytes": _grad_bytes(model),
                "optimizer_bytes": state["moments"] + state["step"],
                "wasted_grad_bytes": _grad_bytes(model) - ref["grad_bytes"],
                "wasted_optimizer_bytes": state["moments"] + state["step"]
                - ref["optimizer_moment_bytes"] - ref["optimizer_step_bytes"],
                "grad_plus_state_vs_full": (_grad_bytes(model) + state["moments"] + state["step"]) / full_bytes,
                "with_plugin_vs_full": (ref["grad_bytes"] + ref["optimizer_moment_bytes"] + ref["optimizer_step_bytes"])
                / full_bytes,
                "frozen_params_with_state": sum(1 for p in frozen if optimizer.state.get(p)),
                "frozen_weights_max_change": moved,
            }
            del model, optimizer
        out[label(selection)] = entry
    return out


def table(result: dict[str, Any]) -> list[tuple[str, str, str]]:
    rows = []
    for name, r in result["selections"].items():
        rows.append((
            f"memory {name}",
            f"grad {r['grad_ratio']:.4f}, Adam moments {r['optimizer_moment_ratio']:.4f} "
            f"(trainable {r['trainable_fraction']:.4f})",
            "= trainable fraction" + (" OK" if r["exact"] else " MISMATCH")
            + ("" if r["lora"] is None else "; adapters + full-rank parts train" + (
                " OK" if r["lora"]["adapters_and_full_rank_parts_train"] else " NO")),
        ))
    for name, entry in result["naive_freeze_after_optimizer"].items():
        pre = entry["grads_preallocated"]
        rel = entry["grads_released"]
        rows.append((
            f"naive {name}",
            f"grad+state {pre['grad_plus_state_vs_full']:.2f}x full if grads existed at freeze "
            f"(plugin {pre['with_plugin_vs_full']:.2f}x), frozen weights moved "
            f"{pre['frozen_weights_max_change']:.0e}; {rel['grad_plus_state_vs_full']:.2f}x if released",
            "shows waste",
        ))
    return rows
