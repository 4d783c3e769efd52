"""``--recipe NAME [overrides]`` for ``check-config`` and ``plan``: Megatron-Bridge's recipe as its users run it.

The recipe function is called with its model's ``config.json`` served offline (the HF cache, or ``--hf-config``),
the overrides applied with Bridge's own override code as ``run_recipe.py`` applies them
(:mod:`bridge_freeze_plugin.recipes`); ``check-config`` then reads that config as it reads a Bridge
``run_config.yaml``, and ``plan`` takes the recipe's layout and the selection that config makes.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import tempfile
from collections.abc import Iterator
from typing import Any

from bridge_freeze_plugin.cli._common import out, quiet_third_party
from bridge_freeze_plugin.errors import CommandError

#: ``check-config --recipe`` and ``plan --recipe``: what the recipe options say in --help.
RECIPE_HELP = ("a Megatron-Bridge recipe function (run_recipe.py --recipe NAME), e.g. qwen3_vl_8b_sft_config: "
               "called offline, KEY=VALUE overrides applied with Bridge's own override code")


def add_recipe_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--recipe", metavar="NAME", default=None, help=RECIPE_HELP)


def recipe_overrides(first: str | None, overrides: list[str], *, what: str) -> list[str]:
    """The overrides of a ``--recipe`` command: a first positional (FILE / MODEL) is one when written as one."""
    if first is None:
        return list(overrides)
    if "=" in first or first.startswith(("+", "~")):
        return [first, *overrides]
    raise CommandError(f"--recipe builds the config itself: give no {what} with it ({first!r}); the overrides "
                       f"(key=value) follow the recipe's name")


def _bridge() -> None:
    """Megatron-Bridge imported (through the CPU harness's TE stub where TE cannot load), its chatter kept off."""
    import torch  # noqa: F401  (torch and transformers set their loggers' levels on import: before quieting)
    import transformers  # noqa: F401

    from bridge_freeze_harness.cpu_runtime import import_bridge

    with quiet_third_party(logging.getLogger().getEffectiveLevel()):
        import_bridge()


class _NoGpuStandIn:
    """GPU 0's properties on a machine with none: what a recipe's H100 module is written for."""

    name = "NVIDIA H100 (bridge-freeze stand-in: this machine has no GPU)"
    major, minor, total_memory, multi_processor_count = 9, 0, 80 * 2**30, 132


@contextlib.contextmanager
def _gpu_properties_without_gpu() -> Iterator[None]:
    """Bridge's ``apply_flex_dispatcher_backend`` (every MoE recipe calls it) reads GPU 0's properties even with no
    dispatcher backend asked, where it then configures nothing; without a GPU that read raises. Answered by a
    stand-in while the recipe runs, on a machine without CUDA only (with a backend asked and no CUDA, Bridge
    returns before reading them)."""
    import torch

    if torch.cuda.is_available():
        yield
        return
    original = torch.cuda.get_device_properties
    torch.cuda.get_device_properties = lambda device=None: _NoGpuStandIn()
    try:
        yield
    finally:
        torch.cuda.get_device_properties = original


@contextlib.contextmanager
def recipe_run(name: str, overrides: list[str], hf_config: str | None) -> Iterator[Any]:
    """The recipe run (:class:`bridge_freeze_plugin.recipes.RecipeRun`), its config files kept while in use."""
    from bridge_freeze_plugin import recipes

    _bridge()
    with tempfile.TemporaryDirectory(prefix="bridge-freeze-recipe-") as workdir:
        with quiet_third_party(logging.getLogger().getEffectiveLevel()), _gpu_properties_without_gpu():
            run = recipes.run_recipe(name, overrides, hf_config=hf_config, workdir=workdir)
        yield run


def print_recipe_header(check: Any) -> None:
    """What was run, where the model's config came from, the overrides, and each flag with its source."""
    run = check.run
    out(f"recipe: {run.name} ({run.function}), provider {type(run.container.model).__name__}")
    if run.hub_ids:
        out(f"model config: {', '.join(run.hub_ids)} from {run.served_from}")
    if run.overrides:
        out(f"overrides, applied by Bridge's own code as run_recipe.py applies them: {' '.join(run.overrides)}")
    for flag in check.flags:
        out(f"  {flag.describe()}")


class RecipeLoader:
    """``check-config --recipe``'s config loading: the recipe run, then the plugin's reading of its config."""

    def __init__(self, args: argparse.Namespace, overrides: list[str]) -> None:
        self.args, self.overrides = args, overrides
        self.shown = f"recipe {args.recipe}"
        self.check: Any = None
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> RecipeLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def __call__(self) -> Any:
        from bridge_freeze_plugin import recipes

        run = self._stack.enter_context(recipe_run(self.args.recipe, self.overrides, self.args.hf_config))
        self.check = recipes.check_recipe(run, family=self.args.family)
        if not self.args.json:
            print_recipe_header(self.check)
        return self.check.checked

    def document(self) -> dict[str, Any]:
        return {"recipe": None if self.check is None else self.check.as_dict()}
