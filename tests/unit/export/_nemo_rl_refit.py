"""NeMo-RL's refit code (read from ``$BRIDGE_FREEZE_NEMO_RL``, unchanged) as modules under NeMo-RL's own names, on the
CPU.

NeMo-RL's modules import Ray, vLLM, ZMQ and its training stack at their top, none of which is installed for the
tests (vLLM and a CUDA IPC need a GPU). So the functions and methods a refit runs through are read out unchanged
from a NeMo-RL source (``extract_nemo_rl_refit.py``; nothing of NeMo-RL is kept in this repository) and executed
here in modules named as NeMo-RL names them, with the names each piece uses bound as NeMo-RL's module binds them.
What is not NeMo-RL's code, and why:

- the Ray actor machinery: ``ray.put`` / ``ray.get`` hand values through, and an actor handle's ``method.remote``
  calls the method in-process (:class:`Actor`);
- the ZMQ REQ/REP socket pair between a policy worker and its vLLM worker: two in-process queues
  (:func:`socket_pair`), with ZMQ's timeout error on a receive that waits too long;
- the CUDA IPC handle of a staging buffer: the CPU buffer itself (:func:`get_handle_from_tensor`,
  :func:`rebuild_cuda_tensor_from_ipc`), so the receiver reads the bytes the producer packed;
- vLLM's side of the receiver (``_load_weights`` into the engine's model, ``_weight_update_lifecycle``'s
  ``process_weights_after_loading``, the CUDA fence before an ACK): :class:`CpuVllmExtension` records what it is
  given; the vLLM engine's ``collective_rpc`` calls a method on each of its workers (:class:`CpuLLM`);
- ``VllmConfig`` (a ``TypedDict`` NeMo-RL only ``cast``s to): ``dict``.
"""

from __future__ import annotations

import contextlib
import enum
import gc
import logging
import os
import queue
import re
import textwrap
import traceback
import types
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Optional, cast

import torch

HEADER = re.compile(r"^#### (\S+) (\S+) \d+-\d+$", re.M)
RECV_TIMEOUT_S = 60.0


def source_spec() -> str | None:
    """Where NeMo-RL's source is (``$BRIDGE_FREEZE_NEMO_RL``: a checkout, or ``GITDIR@COMMIT``), or ``None``."""
    from extract_nemo_rl_refit import ENV

    return os.environ.get(ENV) or None


def pieces() -> dict[tuple[str, str], str]:
    """(NeMo-RL path, qualified name) -> its source, read unchanged from :func:`source_spec`."""
    from extract_nemo_rl_refit import extract_from

    spec = source_spec()
    assert spec is not None, "no NeMo-RL source"
    text = extract_from(spec)
    marks = list(HEADER.finditer(text))
    ends = [m.start() for m in marks[1:]] + [len(text)]
    return {(m[1], m[2]): text[m.end() + 1:end] for m, end in zip(marks, ends, strict=True)}


class _Zmq(types.SimpleNamespace):
    """The two ZMQ names NeMo-RL's refit code reads: its errors and the receive-timeout option."""


class ZmqAgain(Exception):
    """``zmq.Again``: a receive timed out."""


class ZmqError(Exception):
    """``zmq.ZMQError``."""

    errno = 0
    strerror = ""


ZMQ = _Zmq(Again=ZmqAgain, ZMQError=ZmqError, RCVTIMEO=27)


class _Socket:
    """One end of a REQ/REP pair: ``send_pyobj`` / ``send`` put on the peer's queue, ``recv_pyobj`` / ``recv`` take."""

    def __init__(self, inbox: queue.Queue, outbox: queue.Queue) -> None:
        self.inbox, self.outbox = inbox, outbox

    def send_pyobj(self, obj: Any) -> None:
        self.outbox.put(obj)

    send = send_pyobj

    def recv_pyobj(self) -> Any:
        try:
            return self.inbox.get(timeout=RECV_TIMEOUT_S)
        except queue.Empty:
            raise ZmqAgain from None

    recv = recv_pyobj

    def getsockopt(self, option: int) -> int:
        return int(RECV_TIMEOUT_S * 1000)


def socket_pair() -> tuple[_Socket, _Socket]:
    """(the policy worker's end, the vLLM worker's end)."""
    to_policy, to_vllm = queue.Queue(), queue.Queue()
    return _Socket(to_policy, to_vllm), _Socket(to_vllm, to_policy)


def get_handle_from_tensor(tensor: torch.Tensor) -> tuple[Any]:
    """The CUDA IPC handle of a staging buffer: here, the buffer."""
    return (tensor,)


def rebuild_cuda_tensor_from_ipc(cuda_ipc_handle: tuple, device_id: int) -> torch.Tensor:
    return cuda_ipc_handle[0]


class _RemoteMethod:
    def __init__(self, method: Any) -> None:
        self.method = method

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        return self.method(*args, **kwargs)


class Actor:
    """A Ray actor handle over an in-process object: ``handle.method.remote(...)`` calls it (the result stands for
    the future, and ``ray.get`` hands it through)."""

    _method_shells: dict[str, Any] = {}

    def __init__(self, obj: Any) -> None:
        self._obj = obj

    def __getattr__(self, name: str) -> _RemoteMethod:
        return _RemoteMethod(getattr(self._obj, name))


RAY = types.SimpleNamespace(put=lambda value: value, get=lambda refs: refs, ObjectRef=object)


def _package(name: str) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__path__ = []  # type: ignore[attr-defined]
    return module


def _exec_module(name: str, path: str, code: dict[tuple[str, str], str], names: dict[str, Any]) -> types.ModuleType:
    """Module ``name`` with the module-level pieces of ``path`` and its classes assembled from their method pieces
    (each class holds only the methods copied)."""
    module = types.ModuleType(name)
    module.__dict__.update(names)
    classes: dict[str, list[str]] = {}
    for (where, qualname), source in code.items():
        if where != path:
            continue
        if "." in qualname:
            owner, _ = qualname.split(".", 1)
            classes.setdefault(owner, []).append(source)
        else:
            exec(compile(source, f"{path}:{qualname}", "exec"), module.__dict__)
    for owner, methods in classes.items():
        body = "".join(textwrap.indent(method, "    ") for method in methods)
        exec(compile(f"class {owner}:\n{body}", f"{path}:{owner}", "exec"), module.__dict__)
        getattr(module, owner).__module__ = name
    return module


def nemo_rl_modules() -> dict[str, types.ModuleType]:
    """NeMo-RL's refit modules, by their import names, parents included (for ``sys.modules``)."""
    from megatron.core.parallel_state import (
        get_pipeline_model_parallel_group,
        get_pipeline_model_parallel_last_rank,
        get_pipeline_model_parallel_world_size,
        is_pipeline_last_stage,
    )

    code = pieces()
    modules: dict[str, types.ModuleType] = {}

    def add(name: str, path: str, **names: Any) -> types.ModuleType:
        modules[name] = _exec_module(name, path, code, {"torch": torch, "Any": Any, "Optional": Optional, **names})
        return modules[name]

    nsys = add("nemo_rl.utils.nsys", "nemo_rl/utils/nsys.py")
    pp = add("nemo_rl.models.megatron.pipeline_parallel", "nemo_rl/models/megatron/pipeline_parallel.py",
             get_pipeline_model_parallel_group=get_pipeline_model_parallel_group,
             get_pipeline_model_parallel_last_rank=get_pipeline_model_parallel_last_rank,
             get_pipeline_model_parallel_world_size=get_pipeline_model_parallel_world_size,
             is_pipeline_last_stage=is_pipeline_last_stage)
    add("nemo_rl.models.generation.vllm.quantization.fp8_train_utils",
        "nemo_rl/models/generation/vllm/quantization/fp8_train_utils.py")
    utils = add("nemo_rl.models.policy.utils", "nemo_rl/models/policy/utils.py", gc=gc, os=os, traceback=traceback,
                Enum=enum.Enum, Iterable=Iterable, zmq=ZMQ, get_handle_from_tensor=get_handle_from_tensor,
                rebuild_cuda_tensor_from_ipc=rebuild_cuda_tensor_from_ipc)
    add("nemo_rl.models.policy.workers.megatron_policy_worker",
        "nemo_rl/models/policy/workers/megatron_policy_worker.py", Iterator=Iterator, cast=cast, VllmConfig=dict,
        wrap_with_nvtx_name=nsys.wrap_with_nvtx_name, broadcast_obj_from_pp_rank=pp.broadcast_obj_from_pp_rank)
    add("nemo_rl.distributed.worker_groups", "nemo_rl/distributed/worker_groups.py", ray=RAY)
    add("nemo_rl.models.policy.lm_policy", "nemo_rl/models/policy/lm_policy.py", ray=RAY)
    add("nemo_rl.models.generation.vllm.vllm_generation", "nemo_rl/models/generation/vllm/vllm_generation.py",
        ray=RAY)
    add("nemo_rl.models.generation.vllm.vllm_worker", "nemo_rl/models/generation/vllm/vllm_worker.py", cast=cast,
        wrap_with_nvtx_name=nsys.wrap_with_nvtx_name)
    add("nemo_rl.models.generation.vllm.vllm_backend", "nemo_rl/models/generation/vllm/vllm_backend.py", gc=gc,
        logger=logging.getLogger("nemo_rl.models.generation.vllm.vllm_backend"), Iterable=Iterable,
        Sequence=Sequence, IPCProtocol=utils.IPCProtocol, calculate_aligned_size=utils.calculate_aligned_size,
        rebuild_cuda_tensor_from_ipc=rebuild_cuda_tensor_from_ipc, wrap_with_nvtx_name=nsys.wrap_with_nvtx_name)
    for name in list(modules):
        parts = name.split(".")
        for depth in range(1, len(parts)):
            modules.setdefault(".".join(parts[:depth]), _package(".".join(parts[:depth])))
    return modules


def cpu_vllm_extension(modules: dict[str, types.ModuleType]) -> type:
    """NeMo-RL's ``VllmInternalWorkerExtension`` (its refit methods) on a vLLM worker that records what it loads."""
    extension = modules["nemo_rl.models.generation.vllm.vllm_backend"].VllmInternalWorkerExtension

    class CpuVllmExtension(extension):
        device = torch.device("cpu")

        def __init__(self, socket: Any) -> None:
            self.zmq_socket = socket
            self.loaded: dict[str, torch.Tensor] = {}

        def maybe_init_zmq(self) -> None:  # NeMo-RL's connects its socket; this one is connected
            pass

        @contextlib.contextmanager
        def _weight_update_lifecycle(self, transport: str) -> Iterator[Any]:  # vLLM's process_weights_after_loading
            yield lambda: None

        def _synchronize_before_ipc_data_ack(self) -> None:  # a CUDA fence
            pass

        def _load_weights(self, weights: list[tuple[str, torch.Tensor]]) -> None:  # into vLLM's model: recorded
            for name, tensor in weights:
                self.loaded[name] = tensor.clone()

    return CpuVllmExtension


class CpuLLM:
    """vLLM's ``LLM`` as NeMo-RL's generation worker uses it here: ``collective_rpc`` runs a method of the worker
    extension on each of the engine's workers and returns their results."""

    def __init__(self, workers: list[Any]) -> None:
        self.workers = workers

    def collective_rpc(self, method: str, args: tuple = ()) -> list[Any]:
        return [getattr(worker, method)(*args) for worker in self.workers]


class Sharding:
    """NeMo-RL's ``NamedSharding`` as ``run_all_workers_single_data`` reads it: axis names and each worker's coords."""

    def __init__(self, coords: list[dict[str, int]]) -> None:
        self.coords = coords
        self.names = list(coords[0]) if coords else []

    def get_worker_coords(self, worker_idx: int) -> dict[str, int]:
        return self.coords[worker_idx]
