"""Bridge's real training loop and the Hugging Face round trip, on one CUDA device (tests/gpu runs these).

- :func:`cuda_finetune`: Bridge's ``pretrain()`` for one iteration (the pretrained checkpoint), then ``finetune()``
  from it with the selection's flags for a few iterations (torch_dist checkpoints every 2), then ``finetune()``
  resumed from the middle checkpoint to the same end. NCCL world 1, bf16_mixed, the distributed optimizer, no
  dropout (so the resume can equal the uninterrupted run). Run it in a process of its own
  (``python -m bridge_freeze_harness.gpu_training finetune WORKDIR``): it writes ``WORKDIR/result.json``.
- :func:`cuda_hf_roundtrip`: a tiny random HF checkpoint -> ``AutoBridge`` -> a provider with the flags, built
  on CUDA -> AdamW steps on CUDA -> ``save_hf_pretrained`` and the plugin's ``export_trainable_hf_weights(cpu=True)``.

Both build in the harness's CUDA mode (specs: :mod:`.gpu_runtime`; never the CPU device patch). Bridge's training
package imports ``datasets`` and TensorBoard, which a bare GPU machine may lack: :func:`training_importable` says.
Who imports it: :mod:`bridge_freeze_harness`.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

PROJECTION_ONLY = {"freeze_language_model": True, "freeze_vision_model": True}


def training_importable() -> str | None:
    """``None`` when Bridge's ``finetune()`` imports here, else the reason (the missing module)."""
    from bridge_freeze_harness import _resiliency_stub
    from bridge_freeze_harness.cpu_runtime import import_bridge

    import_bridge()
    _resiliency_stub.install()
    try:
        import megatron.bridge.training.finetune  # noqa: F401
    except ImportError as error:  # ModuleNotFoundError, or torch's TensorBoard check
        return f"Bridge's training package does not import here: {error}"
    return None


@contextlib.contextmanager
def cuda_training(family: str) -> Iterator[None]:
    """Spec patches of a CUDA build and the CUDA forward patches around Bridge's loop (no CPU patch at all)."""
    from bridge_freeze_harness import _resiliency_stub
    from bridge_freeze_harness.context import cuda_spec_patches
    from bridge_freeze_harness.cpu_runtime import import_bridge
    from bridge_freeze_harness.forward import forward_patches
    from bridge_freeze_harness.gpu_runtime import init_gpu_distributed

    import_bridge()
    import bridge_freeze_plugin  # noqa: F401 - activation (no .pth autoload where the project travels as source)

    _resiliency_stub.install()
    # NCCL world 1 up before Bridge's setup(), which then keeps it (as cpu_training's gloo group on the CPU);
    # each pretrain() / finetune() sets up and tears down the model-parallel state itself.
    init_gpu_distributed()
    with cuda_spec_patches(family), forward_patches(family, device="cuda"):
        yield


def _config(workdir: Path, iters: int, flags: dict[str, bool], family: str, device: str, **kwargs: Any) -> Any:
    from bridge_freeze_harness.cpu_training import training_config
    from bridge_freeze_harness.tiny import family_module
    from bridge_freeze_harness.tiny._index import entry
    from bridge_freeze_harness.train import train_spec

    # The tiny provider made directly (tiny.make_provider would bring up a runtime; Bridge's setup() does that).
    spec = train_spec(family)
    # No dropout: a resume is then the uninterrupted run (load_rng=False leaves dropout's generator unrestored).
    fields = {**spec.token_ids, **spec.cpu_overrides, "use_cpu_initialization": device == "cpu",
              "hidden_dropout": 0.0, "attention_dropout": 0.0, **flags}
    provider = getattr(family_module(family), entry(family).factory)(**fields)
    cfg = training_config(provider, workdir, iters, family=family, distributed_optimizer=True, bf16_mixed=True,
                          **kwargs)
    cfg.dist.distributed_backend = "nccl" if device == "cuda" else "gloo"
    return cfg


def _model_tensors(save_dir: Path, iteration: int) -> dict[str, torch.Tensor]:
    from bridge_freeze_harness.run_records import iteration_dir, model_tensors, read_checkpoint

    return {n: t.float().cpu() for n, t in model_tensors(read_checkpoint(iteration_dir(save_dir, iteration))).items()}


def cuda_finetune(workdir: Path, family: str = "qwen3_vl", flags: dict[str, bool] | None = None,
                  iters: int = 4, device: str = "cuda") -> dict[str, Any]:
    """Pretrain 1 -> finetune ``iters`` (checkpoints every 2) -> resume from ``iters - 2``; what changed where.

    ``device="cpu"``: the same phases inside :func:`~bridge_freeze_harness.cpu_training.cpu_training` (rehearsal).
    """
    from bridge_freeze_harness.cpu_training import cpu_training, forward_step_of

    flags = PROJECTION_ONLY if flags is None else flags
    with cuda_training(family) if device == "cuda" else cpu_training(family):
        from megatron.bridge.training.finetune import finetune
        from megatron.bridge.training.pretrain import pretrain

        step = forward_step_of(family).load()
        base, tuned, resumed = workdir / "base", workdir / "tuned", workdir / "resumed"
        pretrained = base / "checkpoints"
        pretrain(_config(base, 1, {}, family, device), step)
        finetune(_config(tuned, iters, flags, family, device, save_interval=2, pretrained_checkpoint=pretrained),
                 step)
        finetune(_config(resumed, iters, flags, family, device, save_interval=2, pretrained_checkpoint=pretrained,
                         load=tuned / "checkpoints", load_step=iters - 2), step)
    start = _model_tensors(pretrained, 1)
    end = _model_tensors(tuned / "checkpoints", iters)
    again = _model_tensors(resumed / "checkpoints", iters)
    return {
        "changed": sorted(n for n in end if not torch.equal(end[n], start[n])),
        "unchanged": sorted(n for n in end if torch.equal(end[n], start[n])),
        "resume_max_abs_diff": max(float((again[n] - end[n]).abs().max()) for n in end),
        "specs": _specs(),
    }


def _specs() -> str:
    from bridge_freeze_harness.gpu_runtime import spec_choice

    return spec_choice()


def cuda_hf_roundtrip(workdir: Path, family: str = "qwen3_vl", flags: dict[str, bool] | None = None,
                      steps: int = 2, device: str = "cuda") -> dict[str, Any]:
    """HF checkpoint -> build with ``flags`` on ``device`` -> ``steps`` AdamW steps -> saved HF folder + export.

    ``device="cpu"`` is the rehearsal of the same code on a CPU (tests/unit/integration/test_gpu_mode.py).
    """
    from megatron.bridge import AutoBridge

    from bridge_freeze_harness.hf_checkpoint import cpu_provider, hf_build_patches, write_tiny_hf_checkpoint
    from bridge_freeze_harness.tiny import build_context
    from bridge_freeze_plugin.export import export_trainable_hf_weights

    flags = PROJECTION_ONLY if flags is None else flags
    checkpoint = write_tiny_hf_checkpoint(family, workdir / "hf", seed=0)
    bridge = AutoBridge.from_hf_pretrained(str(checkpoint))
    provider = cpu_provider(bridge, family, use_cpu_initialization=device == "cpu", **flags)
    with build_context(family, device), hf_build_patches(family):
        chunks = provider.provide_distributed_model(
            wrap_with_ddp=False, use_cpu_initialization=device == "cpu", mixed_precision_wrapper=None
        )
    losses = _adamw_steps(chunks[0], family, provider, steps, device)
    bridge.save_hf_pretrained(chunks, workdir / "saved", show_progress=False)
    exported = {name: tensor for name, tensor in export_trainable_hf_weights(bridge, chunks, cpu=True)}
    trainable = [p for p in chunks[0].parameters() if p.requires_grad]
    return {"checkpoint": checkpoint, "saved": workdir / "saved", "exported": exported, "losses": losses,
            "trainable_on_device": all(p.device.type == device for p in trainable)}


def _adamw_steps(model: Any, family: str, provider: Any, steps: int, device: str) -> list[float]:
    from bridge_freeze_harness.ddp_steps import to_cuda
    from bridge_freeze_harness.forward import forward_patches
    from bridge_freeze_harness.train import synthetic_batch, train_spec

    spec = train_spec(family)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    batch = synthetic_batch(family, provider)
    batch = to_cuda(batch) if device == "cuda" else batch
    losses = []
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        with forward_patches(family, device=device):
            loss = spec.loss(model(**spec.forward_kwargs(batch)), batch)
            loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    return losses


def main(argv: list[str]) -> int:
    """``python -m bridge_freeze_harness.gpu_training finetune WORKDIR``: :func:`cuda_finetune`, JSON out."""
    if len(argv) != 2 or argv[0] != "finetune":
        sys.stderr.write("usage: python -m bridge_freeze_harness.gpu_training finetune WORKDIR\n")
        return 2
    workdir = Path(argv[1])
    result = cuda_finetune(workdir)
    (workdir / "result.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
