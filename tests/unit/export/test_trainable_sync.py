"""RL weight sync of only what trains (``bridge_freeze_plugin.export_trainable_hf_weights``), on tiny REAL models.

The user's flow end to end: a tiny random HF checkpoint on disk (``write_tiny_hf_checkpoint``) ->
``AutoBridge.from_hf_pretrained(dir)`` -> ``to_megatron_provider(load_weights=True)`` with the freeze flags (and
LoRA, and train patterns) -> build -> N AdamW steps -> Bridge's full ``export_hf_weights`` and the trainable stream.
Each case checks that

- the checkpoint's ORIGINAL tensors, updated with the trainable stream, are bit-identical (values and dtypes) to
  the full export: nothing that changed is missing;
- the names sent are exactly the HF tensors that can change, written here per family as HF name prefixes /
  patterns (independent of the plugin and of Bridge's mapping tables), and every tensor that did change is
  among them;
- the stream is the full export's stream with the rest left out (same order).

Expert parallel 2 (Qwen3-VL-MoE, two gloo processes forked from the tests' Bridge server: ``rank_main`` of this
file) is started in a module fixture, with a hard timeout.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from _shared import join_or_kill, start_forked

STEPS = 2
EP_TIMEOUT_S = 240

# --- what can change, per family, in HF names (written from the HF checkpoints' layout) -------------------------
QWEN3_PROJECTION = re.compile(r"^model\.visual\.(merger|deepstack_merger_list\.\d+)\.")
QWEN3_VISION = re.compile(r"^model\.visual\.")
QWEN3_LM_ATTENTION = re.compile(r"^model\.language_model\.layers\.\d+\.self_attn\.[qkvo]_proj\.weight$")
QWEN3_LAYER1_QKV = re.compile(r"^model\.language_model\.layers\.1\.self_attn\.[qkv]_proj\.weight$")
QWEN25_VISION_TOWER = re.compile(r"^visual\.(?!merger\.)")  # Qwen2.5-VL: HF tower under visual., merger inside
ERNIE_PROJECTION = re.compile(r"^model\.resampler_model\.")
ERNIE_EXPERT_BIAS = re.compile(r"^model\.layers\.\d+\.mlp\.moe_statics\.e_score_correction_bias$")
MOE_LAYER0_GATE_UP = re.compile(r"^model\.language_model\.layers\.0\.mlp\.experts\.gate_up_proj$")
MOE_LAYER1_DOWN = re.compile(r"^model\.language_model\.layers\.1\.mlp\.experts\.down_proj$")

PROJECTION_ONLY = {"freeze_language_model": True, "freeze_vision_model": True}
VISION_FROZEN = {"freeze_vision_model": True}


def lora_hook(target_modules: list[str]) -> Callable[[Any], Any]:
    """Bridge's real LoRA applied as Bridge's training setup applies it (a pre-wrap hook after the weight load)."""
    from megatron.bridge.peft.lora import LoRA

    peft = LoRA(target_modules=target_modules, dim=4, alpha=8)

    def peft_pre_wrap_hook(model: Any) -> Any:
        model = peft(model, training=True)
        peft.set_params_to_save(model)
        return model

    return peft_pre_wrap_hook


def train_and_export(checkpoint: Path, family: str, *, lora: list[str] | None = None,
                     after_build: Callable[[list[Any]], None] | None = None, **fields: Any) -> dict[str, Any]:
    """Load ``checkpoint`` through AutoBridge, build with ``fields``, train STEPS, export full and trainable."""
    import torch
    from megatron.bridge import AutoBridge
    from safetensors.torch import load_file

    from bridge_freeze_harness.hf_checkpoint import build_hf_chunks, cpu_provider
    from bridge_freeze_harness.train import train_steps
    from bridge_freeze_plugin import export_trainable_hf_weights

    bridge = AutoBridge.from_hf_pretrained(str(checkpoint))
    provider = cpu_provider(bridge, family, **fields)
    if lora:
        provider.register_pre_wrap_hook(lora_hook(lora))
    chunks = build_hf_chunks(family, provider)
    if after_build is not None:
        after_build(chunks)
    torch.manual_seed(0)
    train_steps(chunks[0], family, provider, steps=STEPS)
    return {
        "bridge": bridge,
        "chunks": chunks,
        "trainable": {n for c in chunks for n, p in c.named_parameters() if p.requires_grad},
        "original": load_file(str(checkpoint / "model.safetensors")),
        "full": list(bridge.export_hf_weights(chunks, cpu=True, show_progress=False)),
        "sent": list(export_trainable_hf_weights(bridge, chunks, cpu=True, show_progress=False)),
        "export": export_trainable_hf_weights,
    }


def sync_facts(original: dict[str, Any], full: list[tuple[str, Any]], sent: list[tuple[str, Any]]) -> dict[str, Any]:
    """What the checks need, as plain data (the EP2 workers send it back as JSON)."""
    import torch

    full_map, sent_map = dict(full), dict(sent)
    updated = dict(original)
    updated.update(sent_map)
    return {
        "full_names": [n for n, _ in full],
        "sent_names": [n for n, _ in sent],
        "original_names": sorted(original),
        "changed": sorted(n for n, t in full_map.items() if n not in original or not torch.equal(t, original[n])),
        "not_identical": sorted(
            n for n, t in full_map.items()
            if n not in updated or updated[n].dtype != t.dtype or not torch.equal(updated[n], t)
        ),
        "sent_differs_from_full": sorted(
            n for n, t in sent_map.items() if t.dtype != full_map[n].dtype or not torch.equal(t, full_map[n])
        ),
    }


def check(facts: dict[str, Any], can_change: Callable[[str], bool], *, whole_checkpoint: bool = True) -> None:
    full_names, sent_names = facts["full_names"], facts["sent_names"]
    assert set(full_names) <= set(facts["original_names"])
    if whole_checkpoint:  # the export covers the checkpoint
        assert set(full_names) == set(facts["original_names"])
    assert len(sent_names) == len(set(sent_names)) and len(full_names) == len(set(full_names))
    expected = {n for n in full_names if can_change(n)}
    assert expected and expected != set(full_names)  # a real selection: some tensors can change, some cannot
    assert set(sent_names) == expected
    assert set(facts["changed"]) <= expected and facts["changed"]
    assert facts["not_identical"] == []
    assert facts["sent_differs_from_full"] == []
    assert sent_names == [n for n in full_names if n in expected]  # the full stream with the rest left out


def any_of(*patterns: re.Pattern[str]) -> Callable[[str], bool]:
    return lambda name: any(p.search(name) for p in patterns)


# --- fixtures: one checkpoint per family, written once ----------------------------------------------------------
@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, cpu_bridge) -> Callable[[str], Path]:
    from bridge_freeze_harness.hf_checkpoint import write_tiny_hf_checkpoint

    root = tmp_path_factory.mktemp("hf")
    written: dict[str, Path] = {}

    def get(family: str) -> Path:
        if family not in written:
            written[family] = write_tiny_hf_checkpoint(family, root / family, seed=0)
        return written[family]

    return get


EP_TEST = "test_qwen3_vl_moe_expert_parallel_2"


@pytest.fixture(scope="module", autouse=True)
def ep2_started(request, tmp_path_factory):
    """Start the EP2 workers before the first test of this module when the EP2 test is selected: they run while
    the single-process cases do. Killed at teardown if still running."""
    if not any(getattr(item, "originalname", item.name) == EP_TEST for item in request.session.items):
        yield None
        return
    from bridge_freeze_harness.hf_checkpoint import write_tiny_hf_checkpoint

    out = tmp_path_factory.mktemp("ep2")
    checkpoint = write_tiny_hf_checkpoint("qwen3_vl_moe", out / "checkpoint", seed=0)
    procs = start_ep2(request.getfixturevalue("bridge_forkserver"), checkpoint, out)
    yield procs, out
    join_or_kill(procs, 0)  # only the processes started here, if still running


@pytest.fixture(scope="module")
def ep2(ep2_started, bridge_forkserver) -> dict[Any, Any]:
    procs, out = ep2_started
    return collect_ep2(procs, out)


# --- single process ---------------------------------------------------------------------------------------------
def test_qwen3_vl_projection_only_sends_the_mergers(checkpoints):
    run = train_and_export(checkpoints("qwen3_vl"), "qwen3_vl", **PROJECTION_ONLY)
    check(sync_facts(run["original"], run["full"], run["sent"]), any_of(QWEN3_PROJECTION))
    # The first sync: everything, exactly Bridge's export.
    first = list(run["export"](run["bridge"], run["chunks"], cpu=True, everything=True, show_progress=False))
    assert [n for n, _ in first] == [n for n, _ in run["full"]]
    assert all(a.equal(b) for (_, a), (_, b) in zip(first, run["full"], strict=True))
    # Tasks decided once and handed to Bridge's export (a fixed selection): the same stream.
    from bridge_freeze_plugin.export._sync import trainable_conversion_tasks

    tasks = trainable_conversion_tasks(run["bridge"], run["chunks"])
    again = list(run["bridge"].export_hf_weights(run["chunks"], cpu=True, show_progress=False, conversion_tasks=tasks))
    assert [n for n, _ in again] == [n for n, _ in run["sent"]]
    assert all(a.equal(b) for (_, a), (_, b) in zip(again, run["sent"], strict=True))


def test_qwen3_vl_frozen_vision_tower_sends_the_language_model_and_mergers(checkpoints):
    run = train_and_export(checkpoints("qwen3_vl"), "qwen3_vl", **VISION_FROZEN)
    check(sync_facts(run["original"], run["full"], run["sent"]),
          lambda n: not QWEN3_VISION.search(n) or bool(QWEN3_PROJECTION.search(n)))


def takes_weight_dtype(bridge: Any) -> bool:
    """Whether the installed Bridge's conversion tasks take ``weight_dtype`` (0.6.2 and newer; not 0.6.0)."""
    import inspect

    return "weight_dtype" in inspect.signature(bridge._model_bridge.build_conversion_tasks).parameters


def test_a_train_pattern_on_a_fused_qkv_sends_q_k_and_v(checkpoints):
    import torch

    run = train_and_export(checkpoints("qwen3_vl"), "qwen3_vl", **PROJECTION_ONLY,
                           train_patterns=[r"language_model\.decoder\.layers\.1\.self_attention\.linear_qkv"])
    assert {n for n in run["trainable"] if n.startswith("language_model.")} == {
        "language_model.decoder.layers.1.self_attention.linear_qkv.weight"}
    check(sync_facts(run["original"], run["full"], run["sent"]), any_of(QWEN3_PROJECTION, QWEN3_LAYER1_QKV))
    if not takes_weight_dtype(run["bridge"]):  # Bridge 0.6.0 (SkyRL's pin, in the lane): test_bridge_signatures
        return
    # weight_dtype: Bridge records it on the tasks; the trainable stream casts as the full export does.
    bf16_full = dict(run["bridge"].export_hf_weights(run["chunks"], cpu=True, show_progress=False,
                                                     weight_dtype=torch.bfloat16))
    bf16_sent = list(run["export"](run["bridge"], run["chunks"], show_progress=False, weight_dtype=torch.bfloat16))
    assert [n for n, _ in bf16_sent] == [n for n, _ in run["sent"]]
    assert all(t.dtype == torch.bfloat16 and t.equal(bf16_full[n]) for n, t in bf16_sent)


def test_qwen25_vl_hf_vision_tower_only(checkpoints):
    run = train_and_export(checkpoints("qwen25_vl"), "qwen25_vl",
                           freeze_language_model=True, freeze_vision_projection=True)
    check(sync_facts(run["original"], run["full"], run["sent"]), any_of(QWEN25_VISION_TOWER))


def test_lora_on_the_language_model_plus_full_rank_projection_sends_merged_bases(checkpoints):
    run = train_and_export(checkpoints("qwen3_vl"), "qwen3_vl", **PROJECTION_ONLY,
                           lora=["language_model.*linear_qkv", "language_model.*linear_proj"])
    adapters = {n for n in run["trainable"] if ".adapter." in n}
    assert adapters and {n for n in run["trainable"] - adapters if not n.startswith("vision_model.")} == set()
    facts = sync_facts(run["original"], run["full"], run["sent"])
    check(facts, any_of(QWEN3_PROJECTION, QWEN3_LM_ATTENTION))
    assert {n for n in facts["changed"] if QWEN3_LM_ATTENTION.search(n)}  # the merged adapters did move them
    # Without merging, Bridge exports the LoRA bases as they were loaded: only the projection can have changed.
    unmerged = [n for n, _ in run["export"](run["bridge"], run["chunks"], show_progress=False,
                                            merge_adapter_weights=False)]
    assert set(unmerged) == {n for n in facts["full_names"] if QWEN3_PROJECTION.search(n)}


ERNIE_ROUTERS = re.compile(r"^model\.layers\.\d+\.mlp\.gate\.weight(_1)?$")


def _ernie_run_with_expert_bias_updates(checkpoints: Callable[[str], Path], **selection: Any) -> dict[str, Any]:
    """ERNIE-4.5-VL routes with an expert bias (HF ``moe_statics.e_score_correction_bias``, text and vision rows in
    one tensor) that megatron-core's ``finalize_model_grads`` moves after every step from the token counts, with
    no gradient; here its ``_update_router_expert_bias`` (what ``finalize_model_grads`` calls; the public function
    also needs a DDP-wrapped model) runs after each step, as in a Bridge training step."""
    import torch
    from megatron.core.distributed.finalize_model_grads import _update_router_expert_bias

    with pytest.MonkeyPatch.context() as patcher:

        def update_expert_bias_after_each_step(chunks: list[Any]) -> None:
            original_step = torch.optim.AdamW.step

            def step_then_update(self: Any, *args: Any, **kwargs: Any) -> Any:
                out = original_step(self, *args, **kwargs)
                _update_router_expert_bias(chunks, chunks[0].config)
                return out

            patcher.setattr(torch.optim.AdamW, "step", step_then_update)

        return train_and_export(checkpoints("ernie45_vl"), "ernie45_vl", **selection,
                                after_build=update_expert_bias_after_each_step)


@pytest.fixture(params=["as installed", "0.18 router"])
def router_switch(request: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    """The routers as installed, and as megatron-core 0.18's (SkyRL's pin): its TopKRouter has no
    ``frozen_expert_bias`` (removed here where it exists; the lane runs the real 0.18)."""
    if request.param == "0.18 router":
        from megatron.core.transformer.moe.router import TopKRouter

        init = TopKRouter.__init__

        def init_without_the_switch(self: Any, *args: Any, **kwargs: Any) -> None:
            init(self, *args, **kwargs)
            self.__dict__.pop("frozen_expert_bias", None)

        monkeypatch.setattr(TopKRouter, "__init__", init_without_the_switch)
    return request.param


def test_a_frozen_routers_expert_bias_stays_and_is_not_sent(checkpoints, router_switch):
    """The plugin freezes a router's expert bias with its router: projection only, the bias cannot move, so the
    sync leaves it out. With ``frozen_expert_bias`` (megatron-core 0.19+) the router's own switch; without it
    (0.18) every router is frozen here, so the freeze sets ``moe_router_bias_update_rate`` to 0."""
    run = _ernie_run_with_expert_bias_updates(checkpoints, **PROJECTION_ONLY)
    assert not {n for n in run["trainable"] if n.startswith("language_model.")}
    routers = [m for c in run["chunks"] for m in c.modules() if getattr(m, "expert_bias", None) is not None]
    if not all(hasattr(m, "frozen_expert_bias") for m in routers):
        assert run["chunks"][0].config.moe_router_bias_update_rate == 0.0
    facts = sync_facts(run["original"], run["full"], run["sent"])
    # The CPU build's ERNIE layers have no LayerNorm fused into their linears (no TransformerEngine): Bridge's
    # mappings for input/post-attention norms name those fused weights, so neither load nor export has them.
    check(facts, any_of(ERNIE_PROJECTION), whole_checkpoint=False)
    assert not {n for n in facts["changed"] if ERNIE_EXPERT_BIAS.search(n)}


def test_a_trained_routers_expert_bias_moves_without_gradients_and_is_sent(checkpoints):
    """Routers trained by a train pattern inside the frozen language model: their expert bias is megatron-core's
    to move (no gradient of its own), so the sync sends it with the router weights."""
    run = _ernie_run_with_expert_bias_updates(checkpoints, **PROJECTION_ONLY,
                                              train_patterns=[r"language_model\..*\.router\.weight"])
    assert {n for n in run["trainable"] if n.startswith("language_model.")}
    facts = sync_facts(run["original"], run["full"], run["sent"])
    check(facts, any_of(ERNIE_PROJECTION, ERNIE_EXPERT_BIAS, ERNIE_ROUTERS), whole_checkpoint=False)
    assert {n for n in facts["changed"] if ERNIE_EXPERT_BIAS.search(n)}


def test_an_fp8_export_and_conflicting_arguments_are_refused(checkpoints):
    import torch
    from megatron.bridge import AutoBridge

    from bridge_freeze_plugin import export_trainable_hf_weights
    from bridge_freeze_plugin.export._sync import TrainableSyncError

    bridge = AutoBridge.from_hf_pretrained(str(checkpoints("qwen3_vl")))
    bridge.export_weight_dtype = "fp8"
    with pytest.raises(TrainableSyncError, match=r"fp8.*everything=True"):
        export_trainable_hf_weights(bridge, [torch.nn.Linear(1, 1)])
    with pytest.raises(TrainableSyncError, match=r"weight_dtype.*conversion_tasks"):
        export_trainable_hf_weights(bridge, [], weight_dtype=torch.bfloat16, conversion_tasks=[])


# --- expert parallel 2 -----------------------------------------------------------------------------------------
#: Train patterns name experts by their number in the whole model (``bridge-freeze plan --json``): with 4 experts
#: under EP2 rank 0 holds experts 0-1 (local 0-1), rank 1 experts 2-3 (local 0-1). Each pattern below trains an
#: expert that only ONE rank holds, so the other rank must still take part in exporting that layer's experts
#: (Bridge gathers them over the EP group: a rank that skipped the task would leave its peer waiting).
#: The experts' names: ``local_experts.<n>.linear_fc1.weight`` (SequentialMLP, the CPU build), or
#: ``linear_fc1.weight<n>`` (grouped GEMM) where the installed Bridge maps Qwen3-VL-MoE's experts only so
#: (Bridge 0.6.0, SkyRL's pin: ``hf_checkpoint.grouped_experts``).
_SEQUENTIAL = "language_model.decoder.layers.{layer}.mlp.experts.local_experts.{n}.{linear}.weight"
_GROUPED = "language_model.decoder.layers.{layer}.mlp.experts.{linear}.weight{n}"
_EP_EXPERTS = [(0, "linear_fc1", 1, 1), (1, "linear_fc2", 2, 0)]  # layer, linear, global number, local on its rank


def ep_names(grouped: bool) -> tuple[list[str], dict[int, list[str]]]:
    """The EP2 case's train patterns (global expert numbers) and each rank's expected trainable LM names."""
    name = _GROUPED if grouped else _SEQUENTIAL
    # a SequentialMLP expert by its module (``...local_experts.1.linear_fc1``), a grouped one by its weight
    patterns = [re.escape(name.format(layer=layer, linear=linear, n=n).removesuffix("" if grouped else ".weight"))
                for layer, linear, n, _ in _EP_EXPERTS]
    local = {rank: [name.format(layer=layer, linear=linear, n=n_local)]
             for rank, (layer, linear, _, n_local) in enumerate(_EP_EXPERTS)}
    return patterns, local


def test_qwen3_vl_moe_expert_parallel_2(ep2):
    assert not ep2["hung"], f"ranks {ep2['hung']} hung past {EP_TIMEOUT_S}s:\n" + "\n".join(ep2["logs"])
    for rank in (0, 1):
        result = ep2["ranks"].get(rank)
        assert result is not None, f"rank {rank} wrote nothing:\n{ep2['logs'][rank][-4000:]}"
        assert "traceback" not in result, f"rank {rank}: {result['traceback']}"
        assert result["trainable_lm"] == ep_names(result["grouped"])[1][rank]
        # HF keeps each layer's experts in one fused tensor: one expert trains -> the whole tensor is sent.
        check(result, any_of(QWEN3_PROJECTION, MOE_LAYER0_GATE_UP, MOE_LAYER1_DOWN))
        assert {"model.language_model.layers.0.mlp.experts.gate_up_proj",
                "model.language_model.layers.1.mlp.experts.down_proj"} <= set(result["changed"])
    assert ep2["ranks"][0]["sent_names"] == ep2["ranks"][1]["sent_names"]
    import importlib.util

    # the ranks ran the Bridge this process finds (in the compatibility lane: the lane's, not the venv's)
    assert {ep2["ranks"][rank]["bridge"] for rank in (0, 1)} == {importlib.util.find_spec("megatron.bridge").origin}


def start_ep2(forkserver: Any, checkpoint: Path, out: Path, world: int = 2) -> list[Any]:
    """The EP ``world`` ranks (:func:`rank_main`), forked from the Bridge server, each logging to ``rank<N>.log``."""
    from bridge_freeze_harness.cpu_runtime import free_port

    port = free_port()
    return [start_forked(forkserver, out / f"rank{rank}.log", out / f"rank{rank}.log", __file__, "rank_main", rank,
                         world, str(out), str(checkpoint), port) for rank in range(world)]


def collect_ep2(procs: list[Any], out: Path) -> dict[str, Any]:
    """Wait for the workers (EP_TIMEOUT_S at most; then those still running are killed); their results and logs."""
    hung = join_or_kill(procs, EP_TIMEOUT_S)
    logs = [(out / f"rank{rank}.log").read_text() if (out / f"rank{rank}.log").exists() else ""
            for rank in range(len(procs))]
    ranks = {rank: json.loads((out / f"rank{rank}.json").read_text())
             for rank in range(len(procs)) if (out / f"rank{rank}.json").exists()}
    return {"ranks": ranks, "hung": hung, "logs": logs}


def rank_main(rank: int, world: int, out: str, checkpoint: str, port: int) -> None:
    """One EP rank, in a process forked from the Bridge server (which has none of a launcher's variables)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        os.environ.pop(name, None)
    _worker(rank, world, Path(out), Path(checkpoint))


def _worker(rank: int, world: int, out: Path, checkpoint: Path) -> None:
    import traceback

    import torch

    torch.set_num_threads(1)
    result: dict[str, Any]
    try:
        from bridge_freeze_harness.cpu_runtime import import_bridge, init_cpu_distributed

        import_bridge()
        init_cpu_distributed(expert_model_parallel_size=world, rank=rank, world_size=world)

        from bridge_freeze_harness.hf_checkpoint import grouped_experts

        grouped = grouped_experts("qwen3_vl_moe")
        run = train_and_export(checkpoint, "qwen3_vl_moe", **PROJECTION_ONLY, expert_model_parallel_size=world,
                               train_patterns=ep_names(grouped)[0])
        result = sync_facts(run["original"], run["full"], run["sent"])
        result["trainable_lm"] = sorted(n for n in run["trainable"] if n.startswith("language_model."))
        result["grouped"] = grouped
        result["bridge"] = __import__("megatron.bridge").bridge.__file__
    except BaseException:  # noqa: BLE001 - reported to the parent test
        result = {"traceback": traceback.format_exc()}
    (out / f"rank{rank}.json").write_text(json.dumps(result))

