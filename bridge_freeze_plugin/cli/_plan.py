"""``bridge-freeze plan``: build the real Bridge model on the meta device and show parameters and memory per part.

The planning itself is :mod:`bridge_freeze_plugin.planning`; this module reads the arguments, checks the cheap
things first (no torch import for a typo), and prints the plan as a table or as the ``--json`` document
(docs/cli.md).
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import re
import sys
from typing import Any

from bridge_freeze_plugin.cli._common import (
    EXIT_OK,
    add_selection_flags,
    add_subcommand,
    bounded_int,
    finish_subcommand,
    flags_line,
    out,
    quiet_third_party,
    selection_from,
)
from bridge_freeze_plugin.cli._recipe import add_recipe_option
from bridge_freeze_plugin.cli._training_options import (
    add_lora_options,
    add_pattern_options,
    make_lora,
    refuse_nothing_to_train,
    with_patterns,
)
from bridge_freeze_plugin.errors import CommandError
from bridge_freeze_plugin.planning import DEFAULT_MAX_LAYER_BLOCKS
from bridge_freeze_plugin.planning import describe_sync as sync_line

_EPILOG = (
    "examples:\n"
    "  bridge-freeze plan qwen3_vl --tiny --freeze-vision-model\n"
    "  bridge-freeze plan qwen3_vl_moe --hf-config /ckpt/Qwen3-VL-30B-A3B-Instruct --freeze-language-model\n"
    "  bridge-freeze plan Qwen3VLMoEModelProvider --hf-config config.json --dp-size 8 --json | jq '.total'\n"
    "  bridge-freeze plan glm45v --tiny --param-dtype fp32 --optimizer sgd\n"
    "  bridge-freeze plan qwen3_vl --tiny --freeze-language-model --freeze-vision-model --lora-rank 8 "
    "--lora-target-modules linear_qkv linear_proj\n"
    "  bridge-freeze plan qwen3_vl --tiny --freeze-language-model --train 'language_model\\.decoder\\.layers\\.1'\n\n"
    "  bridge-freeze plan --recipe qwen3_vl_8b_sft_config model.freeze_vision_model=True --gpu-memory 80GiB\n"
    "  bridge-freeze plan --hf-config Qwen3-VL-235B-A22B-Instruct --tp 4 --pp 8 --ep 8 --dp 8 \\\n"
    "      --use-distributed-optimizer --recompute-granularity full --gpu-memory 141GB\n\n"
    "MODEL is a family name (bridge-freeze families) or a provider class name. The part figures are\n"
    "for the whole model; the per-rank figures (layout options) for each GPU. The --json document is described in\n"
    "docs/cli.md. A config.json is checked before the build (JSON object, model_type, positive sizes,\n"
    "build size: --max-layer-blocks); each refusal names the file, the key and the fix."
)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    plan = add_subcommand(
        subparsers, "plan", help="build the real Bridge model on the meta device: parameters and memory per part",
        description="Build the real Megatron-Bridge model on the meta device (no weights, no memory, no GPU), "
                    "apply a selection, and show per part the trainable and total parameters, the weights, the "
                    "gradient buffer and the optimizer state a training run holds, and what freezing saves.",
        epilog=_EPILOG,
    )
    plan.add_argument("model", metavar="MODEL", nargs="?",
                      help="family name or provider class name (optional with --hf-config: the config tells)")
    plan.add_argument("overrides", metavar="KEY=VALUE", nargs="*", default=[],
                      help="with --recipe: the recipe's overrides, applied with Bridge's own override code")
    add_recipe_option(plan)
    source = plan.add_mutually_exclusive_group()
    source.add_argument("--tiny", action="store_true", help="use the project's tiny test configuration")
    source.add_argument("--hf-config", metavar="PATH",
                        help="a local HF config.json, or a model folder holding one (no hub access); with --recipe: "
                             "the recipe's model config (default: the HF cache)")
    add_selection_flags(plan, demo=False)
    add_pattern_options(plan)
    add_lora_options(plan)
    _add_estimate_options(plan)
    _add_layout_options(plan)
    _add_activation_options(plan)
    plan.add_argument("--max-layer-blocks", metavar="N", type=bounded_int(0, sys.maxsize, maximum_text="2**63 - 1"),
                      default=DEFAULT_MAX_LAYER_BLOCKS,
                      help="refuse an --hf-config whose build is larger than N layer blocks: layers x (1 + "
                           f"experts), summed over its stacks (default {DEFAULT_MAX_LAYER_BLOCKS:,}, about twice the "
                           "largest family config, about 2 minutes; 0: no limit), checked before anything is built")
    plan.add_argument("--json", action="store_true",
                      help="machine-readable output, including every parameter (schema: docs/cli.md)")
    finish_subcommand(plan, run)
    return plan


def _add_estimate_options(plan: argparse.ArgumentParser) -> None:
    est = plan.add_argument_group("memory estimate assumptions")
    dtypes = ["fp32", "bf16", "fp16"]
    est.add_argument("--param-dtype", choices=dtypes, default="bf16", help="weights (default bf16)")
    est.add_argument("--grad-dtype", choices=dtypes, default="fp32",
                     help="DDP gradient buffer (default fp32, as with grad_reduce_in_fp32)")
    est.add_argument("--optimizer", choices=["adam", "sgd"], default="adam",
                     help="adam: exp_avg + exp_avg_sq; sgd: a momentum buffer (default adam)")
    est.add_argument("--state-dtype", choices=dtypes, default="fp32",
                     help="optimizer state tensors (default fp32); an fp32 master copy is added "
                          "unless --param-dtype fp32")
    est.add_argument("--dp-size", type=bounded_int(1), default=None,
                     help="the part table only: data-parallel ranks the distributed optimizer shards optimizer "
                          "state over, at least 1 (default 1; with --use-distributed-optimizer: --dp)")


def _add_layout_options(plan: argparse.ArgumentParser) -> None:
    layout = plan.add_argument_group(
        "parallel layout (per-rank figures; Megatron's own option names)",
        "Each distinct rank position (tp, pp, ep) is built for real on the meta device; data-parallel "
        "replicas are identical. Without these options: one GPU holds the whole model.")
    size = bounded_int(1)
    layout.add_argument("--tensor-model-parallel-size", "--tp", dest="tp", metavar="N", type=size, default=1,
                        help="tensor-parallel size (default 1)")
    layout.add_argument("--pipeline-model-parallel-size", "--pp", dest="pp", metavar="N", type=size, default=1,
                        help="pipeline-parallel size (default 1)")
    layout.add_argument("--virtual-pipeline-model-parallel-size", "--vp", dest="vp", metavar="N", type=size,
                        default=None, help="virtual pipeline stages per pipeline rank (interleaved schedule)")
    layout.add_argument("--expert-model-parallel-size", "--ep", dest="ep", metavar="N", type=size, default=1,
                        help="expert-parallel size (default 1)")
    layout.add_argument("--expert-tensor-parallel-size", "--etp", dest="etp", metavar="N", type=size,
                        default=None, help="expert-tensor-parallel size (default: the tensor-parallel size)")
    layout.add_argument("--data-parallel-size", "--dp", dest="dp", metavar="N", type=size, default=None,
                        help="data-parallel size (default: the smallest the expert layout allows)")
    layout.add_argument("--decoder-first-pipeline-num-layers", dest="first_stage_layers", metavar="N", type=size,
                        default=None, help="language-model layers on the first pipeline stage (uneven pipelines)")
    layout.add_argument("--decoder-last-pipeline-num-layers", dest="last_stage_layers", metavar="N", type=size,
                        default=None, help="language-model layers on the last pipeline stage (uneven pipelines)")
    layout.add_argument("--use-distributed-optimizer", action="store_true",
                        help="shard the optimizer state (fp32 master weights included) over data-parallel ranks "
                             "as megatron-core's distributed optimizer does")


def _add_activation_options(plan: argparse.ArgumentParser) -> None:
    size = bounded_int(1)
    act = plan.add_argument_group("activation estimate (per micro-batch, per rank)")
    act.add_argument("--seq-length", metavar="N", type=size, default=4096, help="sequence length (default 4096)")
    act.add_argument("--micro-batch-size", metavar="N", type=size, default=1, help="micro-batch size (default 1)")
    act.add_argument("--vision-tokens", metavar="N", type=bounded_int(0), default=None,
                     help="patches the vision encoder sees per sample, before any merge (default: --seq-length; "
                          "0: text only)")
    act.add_argument("--recompute-granularity", choices=["none", "selective", "full"], default=None,
                     help="activation recompute (default: the model's own setting); full recompute on an "
                          "affected family keeps the vision encoder's activations, as the plugin's fix does")
    act.add_argument("--gpu-memory", metavar="SIZE", type=_memory_size, default=None,
                     help="one GPU's memory, e.g. 80GiB, 141GB or 80 (GiB): says whether the largest rank fits")


#: ``--gpu-memory`` at most: far above any GPU, and below a float's range.
_MAX_MEMORY = 2**60
_UNITS = {"": 2**30, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def _memory_size(text: str) -> int:
    """``80GiB`` / ``141GB`` / ``80`` (GiB) -> bytes; an argparse usage error otherwise."""
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", text)
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _UNITS or float(match.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"must be a memory size such as 80GiB, 141GB or 80 (GiB), got {text!r}")
    size = float(match.group(1)) * _UNITS[unit]
    if size > _MAX_MEMORY:  # also a number too long for a float (inf)
        raise argparse.ArgumentTypeError(f"must be a memory size up to 1 EiB (2**60 bytes), got {text!r}")
    return int(size)


def _human_bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _check_request(args: argparse.Namespace) -> None:
    """The cheap checks, before torch or Bridge is imported: which configuration, which model, what is installed."""
    from bridge_freeze_plugin import planning

    if not args.tiny and args.hf_config is None:
        if args.model is not None and os.path.exists(args.model):
            raise CommandError(
                f"MODEL is a family or provider class name; to plan from {args.model}, "
                f"write: bridge-freeze plan FAMILY --hf-config {args.model}"
            )
        raise CommandError("say which configuration to build: --tiny (the project's tiny test config) "
                           "or --hf-config PATH (a local config.json or model folder)")
    if args.model is None and not args.hf_config:
        raise CommandError("give MODEL (a family or provider class name); only --hf-config can go without it")
    if args.model is not None:
        planning.resolve_model(args.model)
    if args.hf_config is not None:
        planning.config_file(args.hf_config)
    missing = [name for name in ("torch", "megatron.bridge", "transformers") if not _installed(name)]
    if missing:
        raise CommandError(f"plan needs {', '.join(missing)} installed (it builds the real Bridge model)")


def _print_table(result: Any) -> None:
    where = "tiny test config" if result.source == "tiny" else result.config_path
    total = result.total
    out(f"{result.provider}, family {result.family} ({where}): built on the meta device in "
        f"{result.build_seconds:.1f} s, {total.count.total_tensors:,} tensors")
    out(f"selection: {flags_line(result.selection, result.part_names)} "
        f"({result.selection.describe(result.part_names)})")
    out(f"assumes: {result.assumptions.describe()}")
    out()
    lora = total.count.adapter_tensors > 0
    extra = f" {'full-rank':>15} {'adapters':>11}" if lora else ""
    out(f"  {'part':<18} {'trainable':>15}{extra} {'total':>15} {'weights':>11} {'grad buffer':>11} "
        f"{'optimizer':>11} {'saved':>11}")
    for row in (*result.parts, total):
        name = row.count.part.value if row.count.part is not None else "total"
        split = f" {row.count.full_rank:>15,} {row.count.adapters:>11,}" if lora else ""
        out(f"  {name:<18} {row.count.trainable:>15,}{split} {row.count.total:>15,} "
            f"{_human_bytes(row.weight_bytes):>11} {_human_bytes(row.grad_bytes):>11} "
            f"{_human_bytes(row.optimizer_bytes):>11} {_human_bytes(row.saved_bytes):>11}")
    full = total.saved_bytes + total.grad_bytes + total.optimizer_bytes
    pct = 100.0 * total.saved_bytes / full if full else 0.0
    out()
    out(f"saved by freezing: {_human_bytes(total.saved_bytes)} of the {_human_bytes(full)} of gradient buffer + "
        f"optimizer state a full fine-tune would hold ({pct:.1f}%)")
    out("the part figures are for the whole model (tensor/pipeline/expert parallel size 1); --json lists every "
        "parameter")


def run(args: argparse.Namespace) -> int:
    if args.recipe is not None:  # Bridge's recipe: its layout, sequence and selection (cli/_recipe_plan.py)
        from bridge_freeze_plugin.cli._recipe_plan import plan_recipe

        return plan_recipe(args, _run)
    if args.overrides or (args.model is not None and "=" in args.model):
        raise CommandError("KEY=VALUE overrides are a recipe's: give them with --recipe NAME")
    return _run(args)


def _run(args: argparse.Namespace, recipe: Any = None) -> int:
    """The plan; ``recipe`` (``--recipe``): its selection, its PEFT, and what its output says of it."""
    from bridge_freeze_plugin import planning

    layout = planning.Layout(tp=args.tp, pp=args.pp, vp=args.vp, ep=args.ep, etp=args.etp, dp=args.dp,
                             use_distributed_optimizer=args.use_distributed_optimizer,
                             first_stage_layers=args.first_stage_layers, last_stage_layers=args.last_stage_layers)
    sharded = layout.data_parallel if layout.use_distributed_optimizer else 1
    if args.dp_size is not None and args.use_distributed_optimizer and args.dp_size != sharded:
        raise CommandError(f"--dp-size {args.dp_size} and the layout's distributed optimizer over "
                           f"{sharded} data-parallel ranks disagree: give one of them")
    assumptions = planning.MemoryAssumptions(
        param_dtype=args.param_dtype,
        grad_dtype=args.grad_dtype,
        optimizer=args.optimizer,
        state_dtype=args.state_dtype,
        dp_size=args.dp_size if args.dp_size is not None else sharded,
    )
    activation = planning.ActivationSettings(seq_length=args.seq_length, micro_batch_size=args.micro_batch_size,
                                             vision_tokens=args.vision_tokens, recompute=args.recompute_granularity)
    _check_request(args)
    selection = with_patterns(selection_from(args), args) if recipe is None else recipe.selection
    lora = (lambda _provider: make_lora(args)) if args.lora_rank else None
    lora = lora if recipe is None else recipe.lora
    refuse_nothing_to_train(selection, args.lora_rank or int(lora is not None))
    if args.lora_target_modules and not args.lora_rank:
        raise CommandError("--lora-target-modules needs --lora-rank N (N > 0)")
    import torch  # noqa: F401  (first: torch and transformers set their loggers' levels on import,
    import transformers  # noqa: F401  so quiet_third_party must come after them)

    with quiet_third_party(logging.getLogger().getEffectiveLevel()):
        result = planning.plan_model(args.model, selection, assumptions, tiny=args.tiny,
                                     hf_config=args.hf_config, max_layer_blocks=args.max_layer_blocks,
                                     lora=lora,
                                     layout=layout, activation=activation)
    if args.json:
        document = result.as_dict()
        if recipe is not None:
            document["recipe"] = recipe.document
        if args.gpu_memory is not None:
            largest = result.largest_rank()
            document["gpu_memory"] = {"bytes": args.gpu_memory,
                                      "largest_rank_fits": largest.total_bytes <= args.gpu_memory}
        import json

        out(json.dumps(document, indent=2, sort_keys=True))
    else:
        for line in () if recipe is None else recipe.lines:
            out(line)
        _print_table(result)
        for line in planning.save_lines(planning.save_size(result), _human_bytes):
            out(line)
        out(sync_line(result.sync, result.sync_unavailable))
        _print_ranks(result, args.gpu_memory)
    return EXIT_OK


def _print_ranks(result: Any, gpu_memory: int | None) -> None:
    """The per-rank summary: the largest rank, whether it fits, one row per pipeline stage."""
    layout, act = result.layout, result.activation
    largest = result.largest_rank()
    vision = f", {act['vision_tokens']:,} vision patches per sample" if act["vision_tokens"] else ", no vision input"
    if act.get("not_estimated"):
        vision += f" ({' and '.join(act['not_estimated'])} activations not estimated)"
    out()
    out(f"per GPU under {layout.describe()}; activations for sequence {act['seq_length']:,} x micro-batch "
        f"{act['micro_batch_size']}, recompute {act['recompute']}{vision} (built per rank in "
        f"{result.per_rank_seconds:.1f} s):")
    fits = ""
    if gpu_memory is not None:
        verdict = "fits in" if largest.total_bytes <= gpu_memory else "does NOT fit in"
        fits = f": {verdict} --gpu-memory {_human_bytes(gpu_memory)}"
    out(f"largest rank (tp {largest.tp}, pp {largest.pp}, ep {largest.ep}): {largest.parameters:,} parameters "
        f"({largest.trainable:,} trainable), weights {_human_bytes(largest.weight_bytes)} + gradients "
        f"{_human_bytes(largest.grad_bytes)} + optimizer {_human_bytes(largest.optimizer_bytes)} + activations "
        f"{_human_bytes(largest.activation_bytes)} x {largest.in_flight_micro_batches:g} micro-batches in flight "
        f"= {_human_bytes(largest.total_bytes)}{fits}")
    stages: dict[int, Any] = {}
    for rank in result.per_rank:
        if rank.pp not in stages or rank.total_bytes > stages[rank.pp].total_bytes:
            stages[rank.pp] = rank
    if len(stages) > 1 or layout.ep > 1 or layout.tp > 1:
        out(f"  {'pp':>3} {'parameters':>15} {'trainable':>15} {'weights':>10} {'gradients':>10} {'optimizer':>10} "
            f"{'act/mbatch':>10} {'in flight':>9} {'total':>10}")
        for pp, rank in sorted(stages.items()):
            out(f"  {pp:>3} {rank.parameters:>15,} {rank.trainable:>15,} {_human_bytes(rank.weight_bytes):>10} "
                f"{_human_bytes(rank.grad_bytes):>10} {_human_bytes(rank.optimizer_bytes):>10} "
                f"{_human_bytes(rank.activation_bytes):>10} {rank.in_flight_micro_batches:>9g} "
                f"{_human_bytes(rank.total_bytes):>10}")
        out("  (the largest rank of each pipeline stage; --json lists every (tp, pp, ep) rank position)")
