"""What ``plan`` takes from a recipe's ``ConfigContainer``: the parallel layout, the sequence and micro-batch, the
activation recompute, the distributed optimizer, each with its source (the recipe, or your override).

``plan`` builds the model from the ``config.json`` the recipe read, through Bridge's own conversion; a setting of
the recipe's provider that changes the model's shapes and that the conversion would not give is refused
(:func:`shape_differences`), never planned as something else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bridge_freeze_plugin.config import parse_override
from bridge_freeze_plugin.errors import RecipeError
from bridge_freeze_plugin.recipes._run import RecipeRun

#: plan's name -> where the recipe's ConfigContainer holds it.
FIELDS = {
    "tp": "model.tensor_model_parallel_size",
    "pp": "model.pipeline_model_parallel_size",
    "vp": "model.virtual_pipeline_model_parallel_size",
    "ep": "model.expert_model_parallel_size",
    "etp": "model.expert_tensor_parallel_size",
    "cp": "model.context_parallel_size",
    "first_stage_layers": "model.num_layers_in_first_pipeline_stage",
    "last_stage_layers": "model.num_layers_in_last_pipeline_stage",
    "seq_length": "model.seq_length",
    "micro_batch_size": "train.micro_batch_size",
    "recompute_granularity": "model.recompute_granularity",
    "use_distributed_optimizer": "ddp.use_distributed_optimizer",
}
#: Provider fields that set a parameter's shape or count: the recipe's must be what the conversion gives.
SHAPE_FIELDS = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
                "kv_channels", "vocab_size", "num_moe_experts", "moe_ffn_hidden_size",
                "moe_shared_expert_intermediate_size", "mtp_num_layers", "add_qkv_bias", "add_bias_linear",
                "gated_linear_unit", "share_embeddings_and_output_weights", "qk_layernorm", "normalization")


@dataclass(frozen=True)
class PlanSettings:
    """The recipe's values for ``plan`` (``values``: plan's name -> value) and their sources."""

    values: dict[str, Any]
    sources: dict[str, str]

    def describe(self) -> str:
        """``tp 2 (the recipe), seq_length 8192 (your override: ...)``, for the settings with a value."""
        return ", ".join(f"{name} {value} ({self.sources[name]})" for name, value in self.values.items()
                         if value is not None)


def _get(container: Any, dotted: str) -> Any:
    value = container
    for name in dotted.split("."):
        value = getattr(value, name, None)
        if value is None:
            return None
    return value


def plan_settings(run: RecipeRun) -> PlanSettings:
    """The layout and activation settings of ``run``'s container (after the overrides), with their sources."""
    overrides = {parse_override(text).key: text for text in run.overrides}
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for name, dotted in FIELDS.items():
        value = _get(run.container, dotted)
        values[name] = value.value if hasattr(value, "value") and not isinstance(value, bool | int) else value
        text = overrides.get(dotted)
        if name == "seq_length" and text is None:
            text = overrides.get("dataset.seq_length")  # run_recipe.py: the model's follows the dataset's
        sources[name] = f"your override: {text}" if text is not None else "the recipe"
    return PlanSettings(values, sources)


def shape_differences(run: RecipeRun, converted: Any) -> None:
    """:class:`RecipeError` when the recipe's provider differs from ``converted`` (Bridge's conversion of the same
    ``config.json``, what ``plan`` builds) in a field that sets parameter shapes."""
    provider = run.container.model
    if type(provider) is not type(converted):
        raise RecipeError(f"recipe {run.name}'s provider is {type(provider).__name__}, and its config.json converts to "
                          f"{type(converted).__name__}: plan would build another model", recipe=run.name)
    differing = [f"model.{name} = {getattr(provider, name)!r} (config.json: {getattr(converted, name)!r})"
                 for name in SHAPE_FIELDS
                 if getattr(provider, name, None) is not None  # None: derived when the provider is finalized
                 and getattr(provider, name) != getattr(converted, name, None)]
    if differing:
        raise RecipeError(f"recipe {run.name} (or an override) sets {', '.join(differing)}; plan builds the model from "
                          f"its config.json and would not honour that. Plan without it, or give --hf-config a "
                          f"config.json with those sizes", recipe=run.name)
