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
from bridge_freeze_plugin.cli.training_options import (
    add_lora_options,
    add_pattern_options,
    make_lora,
    refuse_nothing_to_train,
    with_patterns,
)
from bridge_freeze_plugin.errors import CommandError
from bridge_freeze_plugin.planning.config_checks import DEFAULT_MAX_LAYER_BLOCKS

_EPILOG = (
    "examples:\n"
    "  bridge-freeze plan qwen3_vl --tiny --freeze-vision-model\n"
    "  bridge-freeze plan qwen3_vl_moe --hf-config /ckpt/Qwen3-VL-30B-A3B-Instruct --freeze-language-model\n"
    "  bridge-freeze plan Qwen3VLMoEModelProvider --hf-config config.json --dp-size 8 --json | jq '.total'\n"
    "  bridge-freeze plan glm45v --tiny --param-dtype fp32 --optimizer sgd\n"
    "  bridge-freeze plan qwen3_vl --tiny --freeze-language-model --freeze-vision-model --lora-rank 8 "
    "--lora-target-modules linear_qkv linear_proj\n"
    "  bridge-freeze plan qwen3_vl --tiny --freeze-language-model --train 'language_model\\.decoder\\.layers\\.1'\n\n"
    "MODEL is a family name (bridge-freeze families) or a provider class name. Figures are for the\n"
    "whole model (tensor/pipeline/expert parallel size 1). The --json document is described in\n"
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
    source = plan.add_mutually_exclusive_group()
    source.add_argument("--tiny", action="store_true", help="use the project's tiny test configuration")
    source.add_argument("--hf-config", metavar="PATH",
                        help="a local HF config.json, or a model folder holding one (no hub access)")
    add_selection_flags(plan, demo=False)
    add_pattern_options(plan)
    add_lora_options(plan)
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
    est.add_argument("--dp-size", type=bounded_int(1), default=1,
                     help="data-parallel ranks the distributed optimizer shards optimizer state over, "
                          "at least 1 (default 1)")
    plan.add_argument("--max-layer-blocks", metavar="N", type=bounded_int(0), default=DEFAULT_MAX_LAYER_BLOCKS,
                      help="refuse an --hf-config whose build is larger than N layer blocks: layers x (1 + "
                           f"experts), summed over its stacks (default {DEFAULT_MAX_LAYER_BLOCKS:,}, about twice the "
                           "largest family config, about 2 minutes; 0: no limit), checked before anything is built")
    plan.add_argument("--json", action="store_true",
                      help="machine-readable output, including every parameter (schema: docs/cli.md)")
    finish_subcommand(plan, run)
    return plan


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
    out(f"selection: {flags_line(result.selection)} ({result.selection.describe()})")
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
    out("figures are for the whole model (tensor/pipeline/expert parallel size 1): each model-parallel "
        "rank holds its share; --json lists every parameter")


def run(args: argparse.Namespace) -> int:
    from bridge_freeze_plugin import planning

    assumptions = planning.MemoryAssumptions(
        param_dtype=args.param_dtype,
        grad_dtype=args.grad_dtype,
        optimizer=args.optimizer,
        state_dtype=args.state_dtype,
        dp_size=args.dp_size,
    )
    _check_request(args)
    selection = with_patterns(selection_from(args), args)
    refuse_nothing_to_train(selection, args.lora_rank)
    if args.lora_target_modules and not args.lora_rank:
        raise CommandError("--lora-target-modules needs --lora-rank N (N > 0)")
    import torch  # noqa: F401  (first: torch and transformers set their loggers' levels on import,
    import transformers  # noqa: F401  so quiet_third_party must come after them)

    with quiet_third_party(logging.getLogger().getEffectiveLevel()):
        result = planning.plan_model(args.model, selection, assumptions, tiny=args.tiny,
                                     hf_config=args.hf_config, max_layer_blocks=args.max_layer_blocks,
                                     lora=(lambda _provider: make_lora(args)) if args.lora_rank else None)
    if args.json:
        out(result.to_json())
    else:
        _print_table(result)
    return EXIT_OK
