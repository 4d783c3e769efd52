"""Megatron-Bridge's recipe functions, found by walking the installed ``megatron.bridge.recipes`` package.

A recipe function is what Bridge's ``scripts/training/run_recipe.py --recipe NAME`` calls: a public function of a
module under ``megatron.bridge.recipes`` that returns a ``ConfigContainer`` (its return annotation says so) and
needs no argument. Every exported name counts (Bridge keeps legacy names as aliases of the H100-style ones), so a
name is looked up as its users write it. Nothing here keeps a list of recipes.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import inspect
import pkgutil
from collections.abc import Callable, Mapping
from typing import Any

from bridge_freeze_plugin.errors import RecipeError

#: The recipes' package, walked at first use.
PACKAGE = "megatron.bridge.recipes"
#: How many near names an unknown name's error offers.
_NEAREST = 5


def _returns_config_container(function: Callable[..., Any]) -> bool:
    annotation = inspect.signature(function).return_annotation
    # a string under ``from __future__ import annotations``, quoted too when written ``-> "ConfigContainer"``
    name = annotation.strip("\"'") if isinstance(annotation, str) else getattr(annotation, "__name__", None)
    return name == "ConfigContainer"


def _needs_no_argument(function: Callable[..., Any]) -> bool:
    return all(p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
               for p in inspect.signature(function).parameters.values())


def _is_recipe(name: str, value: Any) -> bool:
    return (not name.startswith("_") and inspect.isfunction(value) and value.__module__.startswith(PACKAGE + ".")
            and _returns_config_container(value) and _needs_no_argument(value))


@functools.lru_cache(maxsize=1)
def recipe_functions() -> Mapping[str, Callable[..., Any]]:
    """Every recipe name of the installed Bridge -> its function (an alias and its target: the same function).

    Imports ``megatron.bridge.recipes`` and every module under it (Bridge's own ``__init__`` imports them all
    anyway); on the CPU, Bridge must already be importable (the command imports it through the CPU harness).
    """
    package = importlib.import_module(PACKAGE)
    found: dict[str, Callable[..., Any]] = {}
    for info in pkgutil.walk_packages(package.__path__, PACKAGE + "."):
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if _is_recipe(name, value):
                found.setdefault(name, value)
    return dict(sorted(found.items()))


def nearest_names(name: str, names: list[str] | tuple[str, ...]) -> list[str]:
    """The names closest to ``name`` (difflib's ratio), best first."""
    return difflib.get_close_matches(name, names, n=_NEAREST, cutoff=0.5)


def find_recipe(name: str) -> Callable[..., Any]:
    """The recipe function called ``name``; :class:`RecipeError` with the nearest names when there is none."""
    recipes = recipe_functions()
    if name in recipes:
        return recipes[name]
    near = nearest_names(name, list(recipes))
    hint = f"the nearest: {', '.join(near)}" if near else "no name is near it"
    raise RecipeError(
        f"no recipe {name!r} in the installed Megatron-Bridge ({len(recipes)} recipe names under {PACKAGE}): {hint}. "
        f"Give one of its recipe function names, as run_recipe.py --recipe takes them", recipe=name, nearest=near)
