"""NeMo-RL's own refit code with the trainable-only switch of docs/rl-weight-sync.md (issue 46, the NeMo-RL point).

NeMo-RL (commit 7ea279ab) is not importable here: its modules import Ray, vLLM and ZMQ at their top, and PyPI's
``nemo-rl`` is a 0.0.0 placeholder. The functions and methods its refit runs through are read unchanged from a NeMo-
RL source given as ``$BRIDGE_FREEZE_NEMO_RL`` (a checkout of 7ea279ab, or ``GITDIR@7ea279ab``; nothing of NeMo-RL is
kept in this repository, so without it the test is skipped) and executed under NeMo-RL's module names
(``_nemo_rl_refit``, which lists the stand-ins: Ray's futures and handles, the ZMQ pair, the CUDA IPC handle, vLLM's
load into its model). The docs' two code blocks (the worker subclass, the driver's switch) run as written on top of
them, on a tiny Qwen3-VL that trains only its projection:

- ``setup()``'s handshake: ``Policy.prepare_refit_info`` over every policy worker gives Bridge's full layout, and
  ``VllmGeneration.prepare_refit_info`` reaches the engine's workers (not the ones ``run_rank_0_only_axes`` skips);
- three refits through the switch (``before_refit`` of the driver patch): full, then only what trains, again;
  after a training step the engine's tensors are exactly the trainer's full export;
- NeMo-RL's receiver refuses a stream that its ``state_dict_info`` does not describe, both ways, so re-preparing
  it is what makes the trainable refit go through.
"""

from __future__ import annotations

import re
import sys
import threading
import types
from pathlib import Path
from typing import Any

import pytest
import torch
from _nemo_rl_refit import source_spec

if source_spec() is None:
    pytest.skip("needs NeMo-RL's source (not installable from PyPI, not kept here): set BRIDGE_FREEZE_NEMO_RL to a "
                "checkout of NVIDIA-NeMo/RL at 7ea279ab, or GITDIR@7ea279ab", allow_module_level=True)

from _nemo_rl_refit import (
    RAY,
    Actor,
    CpuLLM,
    Sharding,
    cpu_vllm_extension,
    nemo_rl_modules,
    socket_pair,
)
from _refit_worker import PROJECTION_ONLY, build

DOC = Path(__file__).resolve().parents[3] / "docs" / "rl-weight-sync.md"
QWEN3_PROJECTION = re.compile(r"^model\.visual\.(merger|deepstack_merger_list)\.")
#: Small staging buffers (NeMo-RL sizes them from free GPU memory): several groups per refit, and the tensors
#: larger than one buffer take NeMo-RL's oversized path.
BUFFER_BYTES = 2 * 64 * 1024


def doc_block(marker: str) -> str:
    blocks = [b for b in re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S) if marker in b]
    assert len(blocks) == 1, f"{len(blocks)} python blocks of docs/rl-weight-sync.md hold {marker!r}"
    return blocks[0]


def doc_module(name: str, marker: str) -> types.ModuleType:
    module = types.ModuleType(name)
    sys.modules[name] = module
    exec(compile(doc_block(marker), f"docs/rl-weight-sync.md ({name})", "exec"), module.__dict__)
    return module


@pytest.fixture(scope="module")
def nemo_rl(cpu_bridge) -> Any:
    """NeMo-RL's modules and the docs' two modules, in ``sys.modules`` for this file only."""
    with pytest.MonkeyPatch.context() as patch:
        modules = nemo_rl_modules()
        for name, module in modules.items():
            patch.setitem(sys.modules, name, module)
        ray = types.ModuleType("ray")
        ray.__dict__.update(vars(RAY), remote=lambda **options: lambda cls: cls)  # an actor class: the class
        patch.setitem(sys.modules, "ray", ray)
        patch.setattr(modules["nemo_rl.models.policy.utils"], "get_runtime_env_for_policy_worker",
                      lambda name: {}, raising=False)
        for name in ("my_project", "my_project.trainable_refit", "my_project.refit_switch"):
            patch.setitem(sys.modules, name, types.ModuleType(name))
        patch.setattr(torch.cuda, "current_stream", lambda: types.SimpleNamespace(synchronize=lambda: None))
        worker = doc_module("my_project.trainable_refit", "class TrainableRefitWorkerImpl")
        switch = doc_module("my_project.refit_switch", "class TrainableRefitSwitch")
        yield types.SimpleNamespace(modules=modules, worker=worker, switch=switch)


@pytest.fixture(scope="module")
def model(tmp_path_factory, cpu_bridge) -> tuple[Any, list[Any]]:
    from bridge_freeze_harness.hf_checkpoint import write_tiny_hf_checkpoint

    checkpoint = write_tiny_hf_checkpoint("qwen3_vl", tmp_path_factory.mktemp("hf") / "qwen3_vl", seed=0)
    bridge, chunks = build(checkpoint, "qwen3_vl", **PROJECTION_ONLY)
    assert len(chunks) == 1  # NeMo-RL's worker holds one model (self.model) and exports [self.model]
    return bridge, chunks


class Run:
    """One NeMo-RL run, colocated: two policy ranks, each beside one of the two workers of one vLLM engine."""

    def __init__(self, nemo_rl: Any, bridge: Any, chunks: list[Any]) -> None:
        modules = nemo_rl.modules

        class PolicyRank(nemo_rl.worker.TrainableRefitPolicyWorker):
            def maybe_init_zmq(self) -> None:  # NeMo-RL's binds its REQ socket; this one is given per refit
                pass

        self.ranks = []
        for rank in (0, 1):
            worker = PolicyRank()  # NeMo-RL's __init__ loads the model; here the harness built it
            worker.megatron_bridge, worker.model, worker.rank = bridge, chunks[0], rank
            worker.cfg = {"generation": {"backend": "vllm", "vllm_cfg": {"kv_cache_dtype": "auto"}}}
            worker.draft_model, worker.fp8_cfg, worker.dtype = None, None, torch.float32
            worker.refit_conversion_tasks = None
            self.ranks.append(worker)
        self.extensions = [cpu_vllm_extension(modules)(None) for _ in (0, 1)]
        generation_worker = modules["nemo_rl.models.generation.vllm.vllm_worker"].VllmGenerationWorkerImpl
        owner, other = generation_worker(), generation_worker()
        owner.llm, owner.cfg = CpuLLM(self.extensions), {"vllm_cfg": {"async_engine": False}}
        other.llm = None  # the engine's second worker: NeMo-RL calls prepare_refit_info on tensor-parallel rank 0
        self.engine = owner
        self.policy = modules["nemo_rl.models.policy.lm_policy"].Policy()
        self.policy.worker_group = self._group(modules, self.ranks, [{"data_parallel": r} for r in (0, 1)])
        self.generation = modules["nemo_rl.models.generation.vllm.vllm_generation"].VllmGeneration()
        self.generation.cfg = owner.cfg
        self.generation.worker_group = self._group(modules, [owner, other], [
            {"data_parallel": 0, "tensor_parallel": tp, "pipeline_parallel": 0} for tp in (0, 1)])

    @staticmethod
    def _group(modules: dict[str, Any], workers: list[Any], coords: list[dict[str, int]]) -> Any:
        group = modules["nemo_rl.distributed.worker_groups"].RayWorkerGroup()
        group.workers, group.sharding_annotations = [Actor(w) for w in workers], Sharding(coords)
        return group

    def setup(self) -> dict[str, Any]:
        """``setup()``'s handshake (grpo.py)."""
        state_dict_info = self.policy.prepare_refit_info()
        self.generation.prepare_refit_info(state_dict_info)
        return state_dict_info

    def refit(self) -> tuple[bool, list[dict[str, torch.Tensor]]]:
        """``refit_policy_generation``'s colocated vLLM path: every policy rank streams to its vLLM worker while the
        engine receives. Returns the engine's result and what each of its workers loaded."""
        errors: list[BaseException] = []
        threads = []
        for worker, extension in zip(self.ranks, self.extensions, strict=True):
            worker.zmq_socket, extension.zmq_socket = socket_pair()
            extension.loaded = {}

            def stream(worker: Any = worker) -> None:
                try:
                    worker.stream_weights_via_ipc_zmq(buffer_size_bytes=BUFFER_BYTES)
                except BaseException as error:  # noqa: BLE001 - reported by the test
                    errors.append(error)

            threads.append(threading.Thread(target=stream, daemon=True))
        for thread in threads:
            thread.start()
        ok = self.engine.update_weights_via_ipc_zmq()
        for thread in threads:
            thread.join(timeout=120)
        assert not errors and not any(t.is_alive() for t in threads), errors
        return ok, [extension.loaded for extension in self.extensions]


def layout(stream: Any) -> dict[str, tuple[torch.Size, torch.dtype]]:
    return {name: (tensor.shape, tensor.dtype) for name, tensor in stream}


def same(loaded: dict[str, torch.Tensor], expected: list[tuple[str, torch.Tensor]]) -> bool:
    return list(loaded) == [name for name, _ in expected] and all(
        torch.equal(loaded[name], tensor) for name, tensor in expected)


def test_a_run_refits_everything_then_only_what_trains(nemo_rl, model):
    from bridge_freeze_plugin.export import export_trainable_hf_weights, trainable_hf_weights_info

    bridge, chunks = model
    run = Run(nemo_rl, bridge, chunks)
    # copies: on the CPU Bridge's export may hand out the parameters' own storage, which the step below changes
    full = [(name, tensor.clone()) for name, tensor in bridge.export_hf_weights(chunks, cpu=True, show_progress=False)]
    assert run.setup() == layout(full)
    assert all(e.state_dict_info == layout(full) for e in run.extensions)
    switch = nemo_rl.switch.TrainableRefitSwitch(run.policy, run.generation)

    switch()  # the first refit: full
    assert all(worker._trainable_tasks is None for worker in run.ranks)
    ok, loaded = run.refit()
    assert ok and all(same(each, full) for each in loaded)
    engine = [dict(each) for each in loaded]

    with torch.no_grad():  # a training step: only the projection trains
        for param in chunks[0].parameters():
            if param.requires_grad:
                param.add_(0.5)
    switch()  # the second: every policy rank and every vLLM worker switched together
    info = trainable_hf_weights_info(bridge, chunks)
    assert info and set(info) == {n for n in info if QWEN3_PROJECTION.match(n)} and len(info) < len(full)
    assert all(worker._trainable_tasks is not None for worker in run.ranks)
    assert all(e.state_dict_info == info for e in run.extensions)
    trainable = list(export_trainable_hf_weights(bridge, chunks, cpu=True, show_progress=False))
    for _ in range(2):  # the second refit, then a third: the switch does nothing more
        ok, loaded = run.refit()
        assert ok and all(same(each, trainable) for each in loaded)
        switch()
    assert all(worker._trainable_tasks is not None for worker in run.ranks)
    for held, each in zip(engine, loaded, strict=True):
        held.update(each)
        after = list(bridge.export_hf_weights(chunks, cpu=True, show_progress=False))
        assert set(held) == {name for name, _ in after}
        assert all(torch.equal(held[name], tensor) for name, tensor in after)  # the engine holds the trainer's
    changed = [name for name, tensor in trainable if not torch.equal(tensor, dict(full)[name])]
    assert changed == [name for name, _ in trainable]  # and the step reached it
    assert (len(trainable), len(full)) == (18, 70)


def test_nemo_rls_receiver_refuses_a_stream_its_state_dict_info_does_not_describe(nemo_rl, model, caplog):
    bridge, chunks = model
    run = Run(nemo_rl, bridge, chunks)
    full = run.setup()
    infos = run.policy.run_all_workers_single_data("use_trainable_refit")  # the ranks, not vLLM's receivers
    assert len(infos) == 2 and infos[0] == infos[1] and set(infos[0]) < set(full)
    ok, _ = run.refit()
    assert not ok and "missing keys" in caplog.text  # NeMo-RL's refit_policy_generation raises on this
    caplog.clear()
    run.generation.prepare_refit_info(infos[0])
    assert run.policy.run_all_workers_single_data("use_trainable_refit", trainable=False) == [full, full]
    ok, _ = run.refit()  # the ranks send everything again, the receivers still expect the subset
    assert not ok and "unexpected keys" in caplog.text


def test_what_the_switch_refuses(nemo_rl, model):
    bridge, chunks = model
    run = Run(nemo_rl, bridge, chunks)
    run.ranks[0].fp8_cfg = {"fp8_param": True, "fp8_recipe": "blockwise"}
    with pytest.raises(RuntimeError, match=r"FP8 refit .*keep it full"):
        run.ranks[0].use_trainable_refit()
    run.generation.weight_synchronizer = object()
    with pytest.raises(RuntimeError, match="weight synchronizer"):
        nemo_rl.switch.TrainableRefitSwitch(run.policy, run.generation)
