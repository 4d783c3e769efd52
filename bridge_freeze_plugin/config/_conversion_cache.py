"""NeMo-RL's conversion cache: the saved provider a NeMo-RL Megatron run builds from, found as NeMo-RL finds it.

Read from NVIDIA-NeMo/RL (``nemo_rl/models/megatron/setup.py``: ``validate_model_paths``, ``setup_model_config``,
``handle_model_import``; ``nemo_rl/models/policy/utils.py``: ``get_megatron_checkpoint_dir``;
``nemo_rl/models/megatron/community_import.py``: ``import_model_from_hf_name``). A NeMo-RL Megatron policy from a
Hugging Face model converts it once, with ``provide_distributed_model(wrap_with_ddp=False)`` and Bridge's save, into
``<checkpoint dir>/<model>/iter_0000000/`` (its ``run_config.yaml`` holds every provider field, the ``freeze_*`` ones
included), and reuses it while ``iter_0000000`` exists (unless ``force_reconvert_from_hf``). Every later run builds
from that saved provider: a flag the config does not write keeps the value the cache holds, whatever the config said
when the cache was written. With the plugin active, a fresh conversion saves ``false`` for every flag the config does
not write (the plugin's default on every provider class) and the value written for the keys NeMo-RL copies at
conversion (``policy.megatron_cfg.freeze_vision_model`` and the other four of ``iter_vlm_config_overrides``).

The cache is read as config files are (:func:`~._yaml_files.read_saved_config`: bounded, one line per failure). A
reused folder whose ``run_config.yaml`` cannot be read (missing, a directory, not UTF-8, not YAML, a Python tag,
no provider in it) is refused: NeMo-RL would not convert again and its set-up fails loading it
(``setup_model_config``: ``FileNotFoundError``, or the load's error with its note to delete the folder).
Who wrote a saved ``true`` is said where the file tells: the plugin's own fields in it, or a flag that NeMo-RL's
conversion does not set (it copies only the keys above) holding the value only a run with / without the plugin
saves; otherwise the WARNING says that the file does not tell.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from bridge_freeze_plugin.config._yaml_files import read_saved_config
from bridge_freeze_plugin.errors import ConfigLoadError
from bridge_freeze_plugin.request import ALIASES, FLAGS

#: The iteration NeMo-RL's conversion writes, and the file Bridge saves the provider in.
_ITERATION = "iter_0000000"
_RUN_CONFIG = "run_config.yaml"
#: The config key naming a Megatron-Bridge checkpoint's iteration folder (``pretrained_checkpoint.format:
#: megatron_bridge``): NeMo-RL builds from it, no conversion.
_CHECKPOINT_KEY = "policy.pretrained_checkpoint.path"


@dataclass(frozen=True)
class ConversionCache:
    """Where a NeMo-RL config's saved provider is, and the flags it holds when it exists."""

    #: the folder NeMo-RL converts into (or the ``megatron_bridge`` checkpoint the config names)
    folder: Path
    #: the ``run_config.yaml`` NeMo-RL builds from
    run_config: Path
    #: how the folder was chosen, in words (the environment variable or the config key)
    chosen_by: str
    #: ``None``: the config reconverts (``force_reconvert_from_hf``) or names a checkpoint without a saved provider
    reused: bool = True
    #: flag -> the value the saved provider holds (an alias merged as the build reads it); empty: no file
    flags: Mapping[str, bool] = field(default_factory=dict)
    #: why the saved provider cannot be loaded (the folder is reused all the same); ``None``: read, or not there
    problem: str | None = None
    #: the flags the file writes (a flag it leaves out has the class default), and the plugin's own keys it holds
    written: frozenset[str] = frozenset()
    plugin_keys: tuple[str, ...] = ()

    @property
    def exists(self) -> bool:
        return bool(self.flags)


def _checkpoint_dir(env: Mapping[str, str]) -> tuple[Path, str]:
    """NeMo-RL's ``get_megatron_checkpoint_dir``: the folder and which setting chose it."""
    chosen = env.get("NRL_MEGATRON_CHECKPOINT_DIR")
    if chosen is not None and chosen.strip():
        return Path(chosen), "$NRL_MEGATRON_CHECKPOINT_DIR"
    hf_home = env.get("HF_HOME")
    if hf_home is not None and hf_home.strip():
        return Path(hf_home) / "nemo_rl", "$HF_HOME/nemo_rl"
    return Path(os.path.expanduser("~")) / ".cache" / "huggingface" / "nemo_rl", "~/.cache/huggingface/nemo_rl"


def _overrides_hash(overrides: Mapping[str, Any]) -> str:
    """NeMo-RL's ``_get_hf_config_overrides_hash``: sha256 of the sorted compact JSON, 12 hex digits."""
    canonical = json.dumps(overrides, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:12]


def find_cache(policy: Mapping[str, Any], env: Mapping[str, str] | None = None) -> ConversionCache | None:
    """The saved provider a NeMo-RL Megatron policy (``policy``: the ``policy`` section) builds from.

    ``None`` when the run builds its provider from the HF config itself (``pretrained_checkpoint.format:
    megatron_lm``) or names no model.
    """
    env = os.environ if env is None else env
    pretrained = policy.get("pretrained_checkpoint") or {}
    fmt = pretrained.get("format") if isinstance(pretrained, Mapping) else None
    if fmt == "megatron_lm":
        return None
    if fmt == "megatron_bridge":  # an iteration folder holding run_config.yaml, or a checkpoint root (its latest)
        folder = _iteration_folder(Path(str(pretrained.get("path"))))
        return _read(ConversionCache(folder, folder / _RUN_CONFIG, _CHECKPOINT_KEY))
    name = policy.get("model_name")
    if not isinstance(name, str) or not name:
        return None
    sub = f"model_{name.replace('/', '_')}" if os.path.exists(name) else name
    overrides = policy.get("hf_config_overrides") or {}
    if overrides:
        sub = f"{sub}__hfovr_{_overrides_hash(overrides)}"
    base, chosen_by = _checkpoint_dir(env)
    folder = base / sub
    megatron_cfg = policy.get("megatron_cfg") or {}
    reused = not bool(megatron_cfg.get("force_reconvert_from_hf", False))
    cache = ConversionCache(folder, folder / _ITERATION / _RUN_CONFIG, chosen_by, reused=reused)
    return _read(cache) if reused and (folder / _ITERATION).exists() else cache


#: What Bridge writes at a checkpoint's root: the latest saved iteration.
_LATEST = "latest_checkpointed_iteration.txt"


def _iteration_folder(path: Path) -> Path:
    """The iteration folder a Megatron-Bridge checkpoint path stands for, as NeMo-RL resolves it: the path itself
    when it holds a run_config.yaml, else a root's latest iteration (its ``latest_checkpointed_iteration.txt``, or
    the highest ``iter_*`` folder); the path unchanged when it is neither (the reading then says what is there)."""
    if (path / _RUN_CONFIG).exists() or not path.is_dir():
        return path
    try:
        latest = (path / _LATEST).read_text(encoding="utf-8").strip()[:32]
    except (OSError, UnicodeDecodeError):
        latest = ""
    if latest.isdigit() and (path / f"iter_{int(latest):07d}").is_dir():
        return path / f"iter_{int(latest):07d}"
    iterations = sorted(p for p in path.glob("iter_*") if p.is_dir() and p.name[5:].isdigit())
    return max(iterations, key=lambda p: int(p.name[5:])) if iterations else path


#: Keys only the plugin writes into a provider's saved config (its fields; a flag is Bridge's on most classes).
_PLUGIN_KEYS = ("train_patterns", "freeze_patterns", "full_recompute_policy", "vision_recompute_policy",
                "audit_steps", "audit_strict")


def _read(cache: ConversionCache) -> ConversionCache:
    """``cache`` with the flags its ``run_config.yaml`` holds (read as the build reads a provider), or the reason
    NeMo-RL's load of it fails."""
    if not cache.run_config.exists() and not cache.run_config.is_symlink():
        return replace(cache, problem=f"there is no {cache.run_config}")
    if cache.run_config.is_dir():
        return replace(cache, problem=f"{cache.run_config} is a directory, not the file Bridge saves")
    try:
        doc = read_saved_config(cache.run_config)
    except ConfigLoadError as exc:
        return replace(cache, problem=str(exc))
    model = doc.get("model")
    if not isinstance(model, Mapping) or not isinstance(model.get("_target_"), str):
        return replace(cache, problem=f"{cache.run_config} holds no saved provider (a model section with its "
                                      "_target_)")
    flags = {flag: model.get(flag) is True for flag in FLAGS}
    written = {flag for flag in FLAGS if isinstance(model.get(flag), bool)}
    for alias, flag in ALIASES.items():
        flags[flag] = flags[flag] or model.get(alias) is True
        if isinstance(model.get(alias), bool):
            written.add(flag)
    return replace(cache, flags=flags, written=frozenset(written),
                   plugin_keys=tuple(key for key in _PLUGIN_KEYS if key in model))


#: The keys of ``policy.megatron_cfg`` NeMo-RL copies to the provider at conversion too (so the cache saves them).
CONVERTED_KEYS = ("freeze_vision_model", "freeze_vision_projection", "freeze_sound_encoder", "freeze_sound_projection")


def _saved_by_conversion(megatron_cfg: Mapping[str, Any]) -> dict[str, bool]:
    """flag -> what a fresh conversion with the plugin saves: the keys NeMo-RL copies then, else ``false``."""
    saved = dict.fromkeys(FLAGS, False)
    for key in CONVERTED_KEYS:
        if megatron_cfg.get(key) is True:
            saved[ALIASES.get(key, key)] = True
    return saved


def unwritten_flag_notes(cache: ConversionCache | None, unwritten: list[str], megatron_cfg: Mapping[str, Any],
                         bridge_default: Mapping[str, bool],
                         shown: list[str]) -> tuple[dict[str, bool], dict[str, str], str]:
    """For a NeMo-RL run with the plugin: (flag -> value, flag -> where it comes from, one line on the saved
    provider) for the flags the config does not write. ``bridge_default``: flags Bridge's provider class defaults
    to true (the plugin replaces that default with false); ``shown``: the model's flags (said in the line)."""
    fresh = _saved_by_conversion(megatron_cfg)
    if cache is not None and cache.problem is not None:
        raise ConfigLoadError(_unloadable(cache))
    if cache is None:
        notes = {f: "not written: NeMo-RL builds the provider from the HF config (pretrained_checkpoint.format: "
                    "megatron_lm), with the plugin's default: false" for f in unwritten}
        return dict.fromkeys(unwritten, False), notes, "none (the provider is built from the HF config)"
    if cache.exists:
        values = {f: cache.flags[f] for f in unwritten}
        who = _who_saved(cache, bridge_default)
        notes = {f: f"not written: NeMo-RL reuses its conversion cache {cache.run_config}, which holds {f}: "
                    f"{str(values[f]).lower()}" + _differs(f, values[f], bridge_default, who) for f in unwritten}
        return values, notes, (f"{cache.run_config} (found via {cache.chosen_by}): NeMo-RL builds from it; the flags "
                               "this config does not write keep its values")
    notes = {f: f"not written: a fresh conversion ({_why_fresh(cache)}) saves {str(fresh[f]).lower()} (the plugin's "
                "default, or the key NeMo-RL copies at conversion), and a later run reuses it" for f in unwritten}
    saved = ", ".join(f"{f}: {str(fresh[f]).lower()}" for f in shown)
    return {f: fresh[f] for f in unwritten}, notes, (
        f"none yet at {cache.folder} ({cache.chosen_by}): this run converts first and saves {saved} in "
        f"{cache.run_config}; a later run reuses those values for every flag it does not write, until the folder is "
        "deleted or policy.megatron_cfg.force_reconvert_from_hf=true")


def _why_fresh(cache: ConversionCache) -> str:
    return f"no cache at {cache.folder}" if cache.reused else "policy.megatron_cfg.force_reconvert_from_hf=true"


def _unloadable(cache: ConversionCache) -> str:
    """The refusal of a saved provider NeMo-RL would use but cannot load (one line, naming the file)."""
    problem = (cache.problem or "").rstrip(".")
    if cache.chosen_by == _CHECKPOINT_KEY:
        return (f"{_CHECKPOINT_KEY} names {cache.folder}, and the saved provider NeMo-RL builds from cannot be read "
                f"there: {problem}. Give a Megatron-Bridge checkpoint: its iteration folder (the one holding its "
                f"{_RUN_CONFIG}) or its root (its latest iteration is read)")
    return (f"NeMo-RL reuses its conversion cache {cache.folder} (found via {cache.chosen_by}: {_ITERATION} exists "
            f"there, so it does not convert again), and the saved provider it builds from cannot be read: "
            f"{problem}. Delete {cache.folder} (the next run converts again) or set "
            "policy.megatron_cfg.force_reconvert_from_hf=true")


def _who_saved(cache: ConversionCache, bridge_default: Mapping[str, bool]) -> tuple[bool | None, str]:
    """Whether a run with the plugin wrote the cache (``None``: the file does not tell), and how the file tells."""
    if cache.plugin_keys:
        return True, f"it holds the plugin's {', '.join(cache.plugin_keys)}"
    if cache.chosen_by == _CHECKPOINT_KEY:  # any Bridge run's checkpoint: its config may have set any flag
        return None, ""
    copied = {ALIASES.get(key, key) for key in CONVERTED_KEYS}
    for flag in sorted(f for f, on in bridge_default.items() if on and f in cache.written and f not in copied):
        if cache.flags[flag]:  # NeMo-RL's conversion leaves it as the class has it: Bridge's true, the plugin's false
            return False, f"it holds {flag}: true, Bridge's default, which NeMo-RL's conversion leaves as it is"
        return True, (f"it holds {flag}: false, which NeMo-RL's conversion does not set and Bridge's class defaults "
                      "to true")
    return None, ""


def _differs(flag: str, value: bool, bridge_default: Mapping[str, bool], who: tuple[bool | None, str]) -> str:
    """What a saved value that a fresh conversion would not give means (a WARNING the check says)."""
    if value is False:
        return ""
    with_plugin, why = who
    if with_plugin:
        return (f" (WARNING: saved by a conversion with the plugin ({why}), so set by the config it was made with: a "
                "flag since removed stays in force: write the flag false, or delete the cache)")
    if bridge_default.get(flag) and with_plugin is False:
        return (f" (WARNING: Bridge's own default, saved by a conversion without the plugin ({why}); a fresh "
                "conversion with it saves false: write the flag, or delete the cache)")
    if bridge_default.get(flag):
        return (" (WARNING: Bridge's own default saved by a conversion without the plugin, or set by the config the "
                "cache was made with: the file does not tell which; it stays in force either way: write the flag, "
                "or delete the cache)")
    return (" (WARNING: saved by a conversion whose config set it, a flag since removed stays in force: write the "
            "flag false, or delete the cache)")
