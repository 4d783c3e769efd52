"""The model's ``config.json``, served offline to the recipe's ``AutoBridge.from_hf_pretrained(<hub id>)``.

A recipe names its hub id inside its body (``hf_path = "Qwen/Qwen3-VL-8B-Instruct"``) and reads only the
``config.json`` from it (``to_megatron_provider(load_weights=False)``). While the recipe runs:

- the Hugging Face hub client is offline (``huggingface_hub.constants.HF_HUB_OFFLINE``): nothing is downloaded,
  whatever the environment says;
- ``AutoBridge.from_hf_pretrained`` is wrapped (its signature kept) to record each hub id asked for, and, with
  ``--hf-config PATH``, to put that file into a throwaway HF cache under that id, the one the hub client reads
  for the call (``huggingface_hub.constants.HF_HUB_CACHE``). The wrapper is the narrowest layer: the hub id is
  known only there, and Bridge then reads the config through its own code, under the recipe's own hub id.

Without ``--hf-config`` the user's HF cache (``HF_HOME`` / ``HF_HUB_CACHE``) is read as the run would read it.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bridge_freeze_plugin.errors import RecipeError


@dataclass
class HubRequests:
    """What a recipe asked of the hub while it ran, and where its config came from."""

    cache: str
    hf_config: Path | None = None
    hub_ids: list[str] = field(default_factory=list)

    @property
    def served_from(self) -> str:
        if self.hf_config is not None:
            return f"--hf-config {self.hf_config}, served under the recipe's hub id (nothing downloaded)"
        return f"the HF cache {self.cache} (offline: nothing downloaded)"


def config_json(path: str | os.PathLike[str]) -> Path:
    """``path`` (a ``config.json`` or a folder holding one) as the file; :class:`RecipeError` if unreadable."""
    file = Path(path)
    file = file / "config.json" if file.is_dir() else file
    try:
        loaded = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise RecipeError(f"--hf-config {path}: cannot read a config.json there ({exc}); give the model's "
                          f"config.json, or a folder holding one") from None
    if not isinstance(loaded, dict) or "model_type" not in loaded:
        raise RecipeError(f"--hf-config {path}: not a Hugging Face config.json (a JSON object with model_type)")
    return file


def _cache_entry(cache: Path, hub_id: str, config: Path) -> None:
    """The HF cache's layout for one file: ``models--org--name/{refs/main, snapshots/<revision>/config.json}``."""
    revision = hashlib.sha1(config.read_bytes()).hexdigest()  # a stand-in revision, not the hub's
    repo = cache / ("models--" + hub_id.replace("/", "--"))
    (repo / "snapshots" / revision).mkdir(parents=True, exist_ok=True)
    shutil.copyfile(config, repo / "snapshots" / revision / "config.json")
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(revision, encoding="utf-8")


def _refuse_uncached(cache: Path, hub_id: str) -> None:
    """:class:`RecipeError` at once when the cache lacks the config (Bridge's loader would retry for seconds)."""
    from huggingface_hub import try_to_load_from_cache

    if not isinstance(try_to_load_from_cache(hub_id, "config.json", cache_dir=str(cache)), str):
        raise RecipeError(f"its model is {hub_id} (AutoBridge.from_hf_pretrained), whose config.json the HF cache "
                          f"{cache} does not hold, and nothing is downloaded: give --hf-config PATH (that model's "
                          f"config.json, or a folder holding one), or put the model in the HF cache (HF_HOME)")


def _is_hub_id(path: Any) -> bool:
    return isinstance(path, str) and not Path(path).exists()


@contextlib.contextmanager
def offline_hub(hf_config: Path | None = None) -> Iterator[HubRequests]:
    """While the recipe runs: the hub offline, its hub ids recorded, ``hf_config`` served under them."""
    from huggingface_hub import constants
    from megatron.bridge import AutoBridge

    original = AutoBridge.__dict__["from_hf_pretrained"]
    saved = constants.HF_HUB_OFFLINE, constants.HF_HUB_CACHE
    with contextlib.ExitStack() as stack:
        cache = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bridge-freeze-hub-"))) \
            if hf_config is not None else Path(constants.HF_HUB_CACHE)
        requests = HubRequests(cache=str(cache), hf_config=hf_config)

        @functools.wraps(original.__func__)
        def from_hf_pretrained(cls: Any, path: Any, *args: Any, **kwargs: Any) -> Any:
            if _is_hub_id(path):
                if hf_config is not None and requests.hub_ids and path not in requests.hub_ids:
                    raise RecipeError(f"--hf-config serves one model's config.json, and the recipe asks for two hub "
                                      f"ids ({requests.hub_ids[0]}, {path}): put both in the HF cache (HF_HOME) "
                                      f"instead of --hf-config")
                requests.hub_ids.append(path)
                if hf_config is not None:
                    _cache_entry(cache, path, hf_config)
                _refuse_uncached(cache, path)
            return original.__func__(cls, path, *args, **kwargs)

        constants.HF_HUB_OFFLINE = True
        constants.HF_HUB_CACHE = str(cache)
        AutoBridge.from_hf_pretrained = classmethod(from_hf_pretrained)
        try:
            yield requests
        finally:
            AutoBridge.from_hf_pretrained = original
            constants.HF_HUB_OFFLINE, constants.HF_HUB_CACHE = saved
