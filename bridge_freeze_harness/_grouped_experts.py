"""TE's grouped-GEMM experts on the CPU: the stand-in linears with TE's parameter names, and the context in which
megatron-core's local backend builds them (:func:`grouped_experts_on_cpu`, used by
:func:`bridge_freeze_harness.hf_checkpoint.hf_build_patches`). Who imports this package, and why:
:mod:`bridge_freeze_harness`.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch


class _GroupedLinear(torch.nn.Module):
    """TE ``GroupedLinear``'s place: one weight per expert (``weight0`` ...), each applied to its expert's rows.

    TE's parameter names, on plain ``F.linear``; what ``TEGroupedMLP`` calls it with: the permuted tokens and
    the number of tokens of each expert. Returns ``(output, bias)`` as TE's wrappers do.
    """

    def __init__(self, num_gemms: int, input_size: int, output_size: int, *, config: Any, init_method: Callable,
                 bias: bool, skip_bias_add: bool, is_expert: bool = True, **_unused: Any) -> None:
        super().__init__()
        self.num_gemms = num_gemms
        self.skip_bias_add = skip_bias_add
        for i in range(num_gemms):
            weight = torch.nn.Parameter(torch.empty(output_size, input_size, dtype=config.params_dtype))
            init_method(weight)
            weight.allreduce = not is_expert
            self.register_parameter(f"weight{i}", weight)
            if bias:
                param = torch.nn.Parameter(torch.zeros(output_size, dtype=config.params_dtype))
                param.allreduce = not is_expert
                self.register_parameter(f"bias{i}", param)
        self.use_bias = bias

    def forward(self, x: torch.Tensor, m_splits: list[int]) -> tuple[torch.Tensor, Any]:
        weights = [getattr(self, f"weight{i}") for i in range(self.num_gemms)]
        biases = [getattr(self, f"bias{i}") for i in range(self.num_gemms)] if self.use_bias else None
        add_bias = biases is not None and not self.skip_bias_add
        outputs = [
            torch.nn.functional.linear(rows, weight, biases[i] if add_bias else None)
            for i, (rows, weight) in enumerate(zip(torch.split(x, m_splits), weights, strict=True))
        ]
        return torch.cat(outputs), (biases if biases is not None and self.skip_bias_add else None)


    #: ``"column"`` or ``"row"``: how TE splits this linear's weights over tensor parallelism.
    parallel_mode = ""

    def sharded_state_dict(self, prefix: str = "", sharded_offsets: tuple = (), metadata: dict | None = None) -> Any:
        """The torch_dist keys TE's grouped linear writes (:mod:`._grouped_sharding`)."""
        from bridge_freeze_harness._grouped_sharding import grouped_sharded_state_dict

        return grouped_sharded_state_dict(self, self.parallel_mode, prefix, sharded_offsets, metadata)


class ColumnParallelGroupedLinear(_GroupedLinear):
    """Experts' ``linear_fc1`` (TE's ``TEColumnParallelGroupedLinear``'s place)."""

    parallel_mode = "column"


class RowParallelGroupedLinear(_GroupedLinear):
    """Experts' ``linear_fc2`` (TE's ``TERowParallelGroupedLinear``'s place)."""

    parallel_mode = "row"


def _register_grouped_linears() -> None:
    """Tell Bridge's ``AutoMapping`` how the stand-ins are split under tensor parallelism, as it knows TE's.

    Bridge recognises a module's parallelism by its class name; the registration (process-wide, idempotent)
    names only these two classes, and stays: a model built with them is exported after its build.
    """
    from megatron.bridge.models.conversion.param_mapping import AutoMapping

    AutoMapping.register_module_type(ColumnParallelGroupedLinear.__name__, "column")
    AutoMapping.register_module_type(RowParallelGroupedLinear.__name__, "row")


@contextlib.contextmanager
def grouped_experts_on_cpu() -> Iterator[None]:
    """megatron-core's local backend builds grouped-GEMM experts as ``TEGroupedMLP`` on :class:`_GroupedLinear`.

    Without it the local backend builds a ``SequentialMLP`` (``experts.local_experts.N.linear_fc1.weight``),
    names that Bridge's GLM-4.5V, Gemma4-VL and MiniMax-M3 mappings do not have (loading stops with
    ``No mapping found for megatron_param: ...local_experts.0.linear_fc1.weight``).
    """
    from megatron.core.models.backends import LocalSpecProvider
    from megatron.core.transformer.moe.experts import GroupedMLPSubmodules, TEGroupedMLP

    from bridge_freeze_harness.patching import patched

    _register_grouped_linears()
    original = LocalSpecProvider.grouped_mlp_modules

    def grouped_mlp_modules(self: Any, moe_use_grouped_gemm: bool) -> Any:
        if not moe_use_grouped_gemm:
            return original(self, moe_use_grouped_gemm)
        from functools import partial

        return partial(TEGroupedMLP, submodules=GroupedMLPSubmodules(
            linear_fc1=ColumnParallelGroupedLinear, linear_fc2=RowParallelGroupedLinear, activation_func=None))

    with patched([(LocalSpecProvider, "grouped_mlp_modules", grouped_mlp_modules)]):
        yield


@functools.cache
def bridge_maps_experts_only_grouped(model_class: str) -> bool:
    """Whether the installed Bridge's conversion of transformers' ``model_class`` maps routed experts only under
    their grouped-GEMM names (``experts.linear_fc1.weight*``), never as ``local_experts.<n>``: found in its mapping
    registry, never by version. Bridge 0.6.0 (SkyRL's pin) maps Qwen3-VL-MoE and Qwen3.5-VL-MoE so, 0.6.2 both ways.
    ``False`` where the registry cannot be read without a checkpoint (the family then declares what it needs)."""
    import transformers
    from megatron.bridge.models.conversion.model_bridge import get_model_bridge

    cls = getattr(transformers, model_class, None)
    if cls is None:
        return False
    try:
        patterns = [str(m.megatron_param) for m in get_model_bridge(cls).mapping_registry().mappings]
    except (AttributeError, NotImplementedError):  # a registry that reads the checkpoint; no bridge for the class
        return False
    grouped = any(".experts.linear_fc" in p for p in patterns)
    return grouped and not any(".local_experts." in p for p in patterns)
