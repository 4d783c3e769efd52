"""Megatron-Bridge's recipes as its users run them (``run_recipe.py --recipe NAME [overrides]``), offline.

- :mod:`._find`: the recipe functions of the installed Bridge, found by walking ``megatron.bridge.recipes``
  (:func:`recipe_functions`, :func:`find_recipe`: an unknown name gets the nearest names);
- :mod:`._serve`: the model's ``config.json`` served offline to the recipe's ``AutoBridge.from_hf_pretrained``
  (the HF cache, or ``--hf-config PATH`` under the recipe's hub id);
- :mod:`._run`: the recipe called and its overrides applied with Bridge's own override code (:func:`run_recipe`);
- :mod:`._check`: the result read as ``check-config`` reads a Bridge config, each flag with its source
  (:func:`check_recipe`), and the parallel layout and activation settings ``plan`` takes from it
  (:func:`plan_settings`; :func:`shape_differences`: what plan would not honour).

Bridge is imported only when a function here is called; on the CPU the caller imports it first through the CPU
harness (``bridge-freeze`` does).
"""

from bridge_freeze_plugin.recipes._check import FlagSource, RecipeCheck, check_recipe
from bridge_freeze_plugin.recipes._find import PACKAGE, find_recipe, nearest_names, recipe_functions
from bridge_freeze_plugin.recipes._plan_settings import PlanSettings, plan_settings, shape_differences
from bridge_freeze_plugin.recipes._run import RecipeRun, run_recipe
from bridge_freeze_plugin.recipes._serve import HubRequests, config_json, offline_hub

__all__ = [
    "PACKAGE",
    "FlagSource",
    "HubRequests",
    "PlanSettings",
    "RecipeCheck",
    "RecipeRun",
    "check_recipe",
    "config_json",
    "find_recipe",
    "nearest_names",
    "offline_hub",
    "plan_settings",
    "recipe_functions",
    "run_recipe",
    "shape_differences",
]
