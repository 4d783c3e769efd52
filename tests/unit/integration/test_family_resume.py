"""Checkpoint and resume per family, in Bridge's real ``finetune()`` from a tiny HF checkpoint (issue 38).

For each family the demo newly runs (Ministral 3 and ERNIE-4.5-VL: the batch keys their step takes; GLM-4.5V,
MiniMax-M3-VL and Gemma 4: the grouped-GEMM experts' torch_dist layout), the user's flow with the language model
(its routed experts included) and the projections training: ``AutoBridge.from_hf_pretrained`` ->
``to_megatron_provider(load_weights=True)`` -> the selection -> ``finetune()`` for 4 iterations with the
distributed optimizer, a checkpoint every 2; then a second run resumes from the first one's iteration 2. Its
iteration-4 checkpoint (model, optimizer state and step, scheduler, iteration; not the RNG state, which
``load_rng=False`` leaves) is bitwise the uninterrupted run's, and its losses are the uninterrupted run's last two.
No dropout: a bitwise resume needs the same random stream. The selection is checked on Bridge's optimizer: the
vision encoder's parameters (by name, below) are in no group, the language model's (its experts too) are.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch

import bridge_freeze_plugin  # noqa: F401  (the plugin active, as in a user's job)
from bridge_freeze_harness.run_records import Recorder, iteration_dir, read_checkpoint
from bridge_freeze_plugin import FreezeSelection, last_audit, make_freezable

pytestmark = [pytest.mark.usefixtures("cpu_bridge"), pytest.mark.slow]

ITERS = 4
RNG = "rng_state"
#: the optimizer's entries (megatron-core's ChainedOptimizer, dense and expert parameters apart: ``chained_<i>.``)
OPTIMIZER = re.compile(r"^(chained_\d+\.)?optimizer\.")

#: The distributed optimizer's flat buckets (its default checkpoint layout) also hold each bucket's alignment padding,
#: uninitialised memory (measured: a few hundred of 100,000-150,000 elements differ between two runs, as NaN or 1e38,
#: for Gemma 4, MiniMax-M3-VL and Kimi K2.5-VL, whose parameter sizes leave gaps): only the elements a parameter
#: occupies (its DDP buffer's param_index_map) are compared. (Bridge's per-parameter layout,
#: ``dist_ckpt_optim_fully_reshardable``, stops with ``KeyError: 'step'`` without TE / Apex.)
OPTIMIZER_BUCKET = re.compile(r"^(?:chained_(?P<chain>\d+)\.)?optimizer\.distributed\.dp_group_idx_0\.gbuf_idx_0\."
                              r"dtype_.*\.bucket_idx_0\.(param|exp_avg|exp_avg_sq)$")


class _LayoutRecorder(Recorder):
    """The :class:`Recorder`, plus which elements of each DDP buffer hold a parameter (dense, then expert)."""

    occupied: list[torch.Tensor]
    audit: Any = None  #: the plugin's run-time audit of the run (``last_audit`` of its provider)

    def on_train_start(self, context: Any) -> None:
        super().on_train_start(context)
        (chunk,) = context.model
        self.occupied = []
        for buffers in (chunk.buffers, chunk.expert_parallel_buffers):
            if not buffers:
                continue
            (buffer,) = buffers  # one dtype
            assert len(buffer.buckets) == 1  # one bucket: its offsets are the buffer's
            mask = torch.zeros(int(buffer.numel), dtype=torch.bool)
            for start, end, _ in buffer.param_index_map.values():
                mask[start:end] = True
            self.occupied.append(mask)


def _differences(a: dict[str, Any], b: dict[str, Any], occupied: list[torch.Tensor]) -> list[str]:
    """Entries that differ (bitwise), the RNG state aside and the optimizer buckets' padding ignored."""
    different = []
    for key in a:
        bucket = OPTIMIZER_BUCKET.match(key)
        if key.startswith(RNG):
            continue
        if bucket is not None:
            mask = occupied[int(bucket["chain"] or 0)][: a[key].numel()]
            if not torch.equal(a[key][mask], b[key][mask]):
                different.append(key)
        elif not _same(a[key], b[key]):
            different.append(key)
    return different


#: family -> its vision encoder's Megatron parameter names (frozen here; from the family table, docs/families.md)
#: and whether its language model has routed experts.
CASES = {
    "ministral3": (r"^vision_tower\.", False),
    "ernie45_vl": (r"^vision_tower\.", True),
    "glm45v": (r"^visual\.(?!merger\.)", True),
    "minimax_m3_vl": (r"^vision_tower\.", True),
    "gemma4_vl": (r"^vision_tower\.", True),
}


def _same(a: Any, b: Any) -> bool:
    if torch.is_tensor(a):
        return torch.is_tensor(b) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _finetune(family: str, hf_dir: Path, workdir: Path, load: Path | None = None) -> _LayoutRecorder:
    from megatron.bridge import AutoBridge

    from bridge_freeze_harness.cpu_training import run_training, training_config
    from bridge_freeze_harness.hf_checkpoint import cpu_provider, hf_build_patches

    bridge = AutoBridge.from_hf_pretrained(str(hf_dir))
    provider = make_freezable(cpu_provider(bridge, family, hidden_dropout=0.0, attention_dropout=0.0),
                              FreezeSelection(freeze_vision_model=True))
    cfg = training_config(provider, workdir, ITERS, family=family, save_interval=2, pretrained_checkpoint=hf_dir,
                          load=load, load_step=None if load is None else 2, distributed_optimizer=True, lr=1e-2)
    recorder = _LayoutRecorder()
    with hf_build_patches(family):
        run_training(cfg, family=family, callbacks=[recorder])
    recorder.audit = last_audit(provider)
    return recorder


def _assert_audited(recorder: _LayoutRecorder, frozen: set[str]) -> None:
    """The run-time audit of the run's first 3 steps: every tensor in Bridge's optimizer (read off its real
    optimizer) learned, or is an MoE expert no token reached; the frozen ones held."""
    audit = recorder.audit
    trained = set().union(*(g.names for g in recorder.groups))
    routed = {n for f in audit.findings if f.cause == "routing" for n in f.names}
    assert audit.ok and audit.steps == 3 and audit.learned
    assert set(audit.learned) | routed == trained
    assert audit.held_tensors == len(frozen)


@pytest.mark.parametrize("family", sorted(CASES))
def test_finetune_from_hf_resumes_bitwise_with_the_selection_kept(family, tmp_path):
    from bridge_freeze_harness.hf_checkpoint import write_tiny_hf_checkpoint

    vision, has_experts = CASES[family]
    hf_dir = write_tiny_hf_checkpoint(family, tmp_path / "hf", seed=0)
    full = _finetune(family, hf_dir, tmp_path / "full")
    resumed = _finetune(family, hf_dir, tmp_path / "resumed", load=tmp_path / "full" / "checkpoints")
    assert not iteration_dir(tmp_path / "resumed" / "checkpoints", 2).exists()  # it started from full's iteration 2
    a = read_checkpoint(iteration_dir(tmp_path / "full" / "checkpoints", ITERS))
    b = read_checkpoint(iteration_dir(tmp_path / "resumed" / "checkpoints", ITERS))
    assert a.keys() == b.keys() and any(OPTIMIZER.match(k) for k in a)
    assert _differences(a, b, full.occupied) == []
    assert resumed.losses == full.losses[2:]
    # the selection: the vision encoder is in no optimizer group, the language model is (its experts too)
    frozen = {n for n in full.initial if re.search(vision, n)}
    trained = set().union(*(g.names for g in full.groups))
    assert frozen and not trained & frozen
    assert any(n.startswith("language_model.") for n in trained)
    _assert_audited(full, frozen)
    experts = {n for n in trained if ".experts." in n}
    assert bool(experts) == has_experts
    if has_experts:  # saved under megatron-core's expert keys (TE's grouped GEMM and SequentialMLP write the same)
        assert any(k.endswith("experts.experts.linear_fc1.weight") for k in a), sorted(a)


#: Families with no offline HF checkpoint (remote code; the refusal is the demo's) whose tiny provider trains on the
#: CPU: their selection and resume are proven on the Megatron side, from the tiny provider (Kimi's vision classes
#: are the harness's local stand-ins for the hub's remote code). family -> (the selection, the frozen parameters'
#: names, has experts); every other parameter trains.
VISION_FROZEN = FreezeSelection(freeze_vision_model=True)
MEGATRON_SIDE = {
    "kimi_k25_vl": (VISION_FROZEN, r"^vision_tower\.", True),
    # its Mamba layers on the harness's CPU scan (bridge_freeze_harness._mamba_cpu), through Bridge's llava_step
    "nemotron_vl": (VISION_FROZEN, r"^llava_model\.vision_model\.", False),
    # the same, through Bridge's nemotron_omni_step, the sound encoder (conformer BatchNorm statistics) frozen too;
    # under llava_model. in the LLaVA model (0.6.x), at the top level of 0.7.0's NemotronOmniModel
    "nemotron_omni": (FreezeSelection(freeze_vision_model=True, freeze_audio_model=True),
                      r"^(llava_model\.)?(vision_model|sound_model)\.", True),
    # through the harness's Step-3.7 step (tiny/_step37_step.py: Bridge's step37_flickr8k_step calls the model the
    # same way, but on THD-packed sequences, which the CPU's local attention refuses: BSHD rows here)
    "step37": (VISION_FROZEN, r"^vision_model\.", True),
}
#: Bridge's nemotron_omni_step hands the model its images and sound clips in bfloat16, as a GPU run's model takes
#: them: the run is Bridge's bf16_mixed recipe (the model bfloat16, the optimizer's main weights float32).
BF16_MIXED = {"nemotron_omni"}


def _radio_cpe_eval(model: Any) -> Any:
    """RADIO's cropped position embedding draws a random crop at every training forward (torch.rand on the
    model's device); on a GPU that is the CUDA generator, which Bridge's resume restores (load_rng), on the CPU the
    harness cannot restore it (cpu_training.checkpoint_config): the crop is kept to its eval-mode choice here."""
    for chunk in model if isinstance(model, list) else [model]:
        _parts_holder(chunk).vision_model.force_cpe_eval_mode = True
    return model


def _parts_holder(chunk: Any) -> Any:
    """The module holding the parts: the LLaVA model (``llava_model``), or the chunk itself (0.7.0's
    NemotronOmniModel holds them at the top level)."""
    return getattr(chunk, "llava_model", chunk)


def _sound_dropout_off(model: Any) -> Any:
    """The sound encoder (transformers' Parakeet inside Bridge's BridgeSoundEncoder, which passes no dropout field
    on: the config's 0.1 defaults) draws its dropout from torch's generator, the CPU one here, which a CPU resume
    cannot restore (on a GPU the CUDA generator, restored by load_rng): set to 0, as hidden_dropout is."""
    for chunk in model if isinstance(model, list) else [model]:
        for module in _parts_holder(chunk).sound_model.modules():
            for field in ("dropout", "attention_dropout", "activation_dropout"):
                if isinstance(getattr(module, field, None), float):
                    setattr(module, field, 0.0)
    return model


#: family -> pre-wrap hooks that keep its forward free of random draws (a bitwise resume on the CPU needs it)
STEADY = {"nemotron_vl": (_radio_cpe_eval,), "nemotron_omni": (_radio_cpe_eval, _sound_dropout_off)}


def _finetune_tiny(family: str, workdir: Path, iters: int, *, pretrained: Path | None, load: Path | None = None,
                   ) -> _LayoutRecorder:
    """Bridge's ``finetune()`` (``pretrain()`` without ``pretrained``) of the family's tiny provider, selection on."""
    from bridge_freeze_harness.cpu_training import run_training, training_config
    from bridge_freeze_harness.train import make_provider

    provider = make_freezable(make_provider(family, hidden_dropout=0.0, attention_dropout=0.0),
                              MEGATRON_SIDE[family][0])
    for hook in STEADY.get(family, ()):
        provider.register_pre_wrap_hook(hook)
    cfg = training_config(provider, workdir, iters, family=family, save_interval=min(2, iters),
                          pretrained_checkpoint=pretrained, load=load, load_step=None if load is None else 2,
                          distributed_optimizer=True, lr=1e-2, bf16_mixed=family in BF16_MIXED)
    recorder = _LayoutRecorder()
    run_training(cfg, family=family, callbacks=[recorder])
    recorder.audit = last_audit(provider)
    return recorder


@pytest.mark.parametrize("family", sorted(MEGATRON_SIDE))
def test_finetune_of_a_remote_code_family_resumes_bitwise_with_the_selection_kept(family, tmp_path):
    _, frozen_names, has_experts = MEGATRON_SIDE[family]
    _finetune_tiny(family, tmp_path / "base", 1, pretrained=None)  # the checkpoint finetune() starts from
    base = iteration_dir(tmp_path / "base" / "checkpoints", 1)
    full = _finetune_tiny(family, tmp_path / "full", ITERS, pretrained=base.parent)
    resumed = _finetune_tiny(family, tmp_path / "resumed", ITERS, pretrained=base.parent,
                             load=tmp_path / "full" / "checkpoints")
    assert not iteration_dir(tmp_path / "resumed" / "checkpoints", 2).exists()
    a = read_checkpoint(iteration_dir(tmp_path / "full" / "checkpoints", ITERS))
    b = read_checkpoint(iteration_dir(tmp_path / "resumed" / "checkpoints", ITERS))
    assert a.keys() == b.keys() and any(OPTIMIZER.match(k) for k in a)
    assert _differences(a, b, full.occupied) == []
    assert len(full.losses) == ITERS and resumed.losses == full.losses[2:]
    # the selection, exactly: the frozen parts are in no optimizer group, every other parameter is in one
    frozen = {n for n in full.initial if re.search(frozen_names, n)}
    trained = set().union(*(g.names for g in full.groups))
    assert frozen and trained == set(full.initial) - frozen  # exactly the rest: language model, projection(s)
    _assert_audited(full, frozen)
    assert any(re.match(r"(llava_model\.)?language_model\.", n) for n in trained)
    assert bool({n for n in trained if ".experts." in n}) == has_experts
    # the frozen parts (their buffers too: Omni's conformer BatchNorm statistics) are bitwise the pretrained ones
    start, final = read_checkpoint(base), a
    frozen_keys = [k for k in start if re.search(frozen_names, k) and torch.is_tensor(start[k])]
    assert frozen_keys and [k for k in frozen_keys if not _same(start[k], final[k])] == []
