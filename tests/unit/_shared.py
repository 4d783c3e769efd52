"""Helpers the unit tests share (imported as ``from _shared import ...``; pytest puts this folder on the path).

Expected sets in tests are computed from parameter names with these, never with the plugin's own tables.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import multiprocessing
import re
import sys
import time
from pathlib import Path
from typing import Any

from bridge_freeze_plugin import FreezeSelection

#: Qwen3-VL's vision projection: the merger and the DeepStack mergers (read from Bridge's module tree).
QWEN3_PROJECTION = re.compile(r"^vision_model\.(merger|decoder\.deepstack_merger_list)\.")
#: The projection-only selection: as flags (a config section, a worker's JSON) and as a selection.
PROJECTION_ONLY_FLAGS = {"freeze_language_model": True, "freeze_vision_model": True}
PROJECTION_ONLY = FreezeSelection(**PROJECTION_ONLY_FLAGS)
#: The flags of a vision-language model (written here, not read from the vocabulary).
VLM_FLAGS = ("freeze_language_model", "freeze_vision_model", "freeze_vision_projection")


def _chunks(model):
    return model if isinstance(model, (list, tuple)) else [model]


def trainable(model) -> set[str]:
    """Names of the parameters that train, of one module or a list of chunks."""
    return {n for c in _chunks(model) for n, p in c.named_parameters() if p.requires_grad}


def names(model) -> set[str]:
    """Names of all parameters, of one module or a list of chunks."""
    return {n for c in _chunks(model) for n, _ in c.named_parameters()}


def projection_names(model) -> set[str]:
    """Qwen3-VL's projection parameters."""
    return {n for n in names(model) if QWEN3_PROJECTION.match(n)}


def preloaded_forkserver(*modules: str) -> multiprocessing.context.ForkServerContext:
    """The ``multiprocessing`` forkserver context with its server started now, preloading ``modules`` (of this
    folder): the server imports them once, and every process started from the context is forked with them loaded.
    Stop the server with :func:`stop_forkserver` when done."""
    import os
    from multiprocessing import forkserver

    stop_forkserver()  # a running server would keep its own preload
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(list(modules))
    # The server imports the modules with its own sys.path (Python 3.12.1 does not pass this process's on), and a
    # module it cannot import is silently skipped: it gets this folder through PYTHONPATH, while it starts.
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).parent), saved]))
    try:
        forkserver.ensure_running()
    finally:
        if saved is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = saved
    return ctx


def stop_forkserver() -> None:
    """Stop the forkserver (a preloaded one holds an imported Bridge, about 1 GB); a later one preloads nothing."""
    from multiprocessing import forkserver

    stop = getattr(forkserver._forkserver, "_stop", None)  # CPython's own (used by its test suite)
    if stop is not None:
        with contextlib.suppress(OSError):  # its socket file may be gone already
            stop()
    multiprocessing.get_context("forkserver").set_forkserver_preload([])


def call_in_files(stdout: str, stderr: str, module: str, function: str, *args: Any) -> None:
    """In a started process: ``module.function(*args)`` (``module``: a name, or a ``.py`` file) with file
    descriptors 1 and 2 (every print, a child process's too) in the files ``stdout`` and ``stderr`` (one file when
    they are the same path); the process exits with the function's status as a console script would (its return
    value, ``SystemExit``, or 1 and the traceback on stderr). Never returns."""
    import os
    import traceback

    paths = {stdout: None, stderr: None}
    for path in paths:
        paths[path] = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(paths[stdout], 1)
    os.dup2(paths[stderr], 2)
    for fd in paths.values():
        os.close(fd)
    sys.stdout = open(1, "w", encoding="utf-8", closefd=False)  # the process's own streams, on the files
    sys.stderr = open(2, "w", encoding="utf-8", closefd=False)
    code = 1
    try:
        result = getattr(_module(module), function)(*args)
        code = result if isinstance(result, int) else 0
    except SystemExit as exc:  # e.g. argparse's usage errors
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001  (as a console script: the traceback on stderr, status 1)
        traceback.print_exc()
    finally:
        # What an interpreter's exit runs (a forked process skips it): without it, what the command left for
        # exit outlives it, e.g. the Manager process megatron-core's torch_dist checkpoint save starts (spawned,
        # shut down at exit), which then holds the test's output pipe open after pytest ends.
        import atexit

        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _module(name: str) -> Any:
    """The module ``name``, or the file ``name`` (a path ending in ``.py``: a test module, loaded under its stem)."""
    import importlib
    import importlib.util

    if not name.endswith(".py"):
        return importlib.import_module(name)
    spec = importlib.util.spec_from_file_location(Path(name).stem, name)
    assert spec is not None and spec.loader is not None, name
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


#: What a training launcher sets; a command the tests start runs without them, as from a user's shell.
LAUNCHER_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")


def cli_main(argv: list[str]) -> int:
    """In a started process: ``bridge-freeze ARGV`` (the console script's ``main``), without launcher variables."""
    import os

    for name in LAUNCHER_VARIABLES:
        os.environ.pop(name, None)
    from bridge_freeze_plugin.cli import main

    return main(argv)


def start_forked(ctx: multiprocessing.context.ForkServerContext, stdout: str | Path, stderr: str | Path,
                 module: str, function: str, *args: Any) -> multiprocessing.Process:
    """Start ``module.function(*args)`` (see :func:`call_in_files`) in a process forked from ``ctx``'s server."""
    proc = ctx.Process(target=call_in_files, args=(str(stdout), str(stderr), module, function, *args))
    proc.start()
    return proc


def join_or_kill(procs: list[multiprocessing.Process], timeout_s: float) -> list[int]:
    """Wait for ``procs`` together for at most ``timeout_s``; kill those still running (only these) and return
    their indices."""
    deadline = time.monotonic() + timeout_s
    for proc in procs:
        proc.join(max(0.1, deadline - time.monotonic()))
    hung = [i for i, proc in enumerate(procs) if proc.is_alive()]
    for i in hung:
        procs[i].kill()
        procs[i].join()
    return hung


# --- SkyRL's Bridge pin (91a15142): its build_conversion_tasks has no weight_dtype --------------------------
@functools.cache
def _older(model_bridge_class: type) -> type:
    """``model_bridge_class`` with SkyRL's pin's ``build_conversion_tasks`` signature (no ``weight_dtype``)."""

    def build_conversion_tasks(self: Any, hf_pretrained: Any, megatron_model: list[Any]) -> list[Any]:
        return model_bridge_class.build_conversion_tasks(self, hf_pretrained, megatron_model)

    return type(f"Older{model_bridge_class.__name__}", (model_bridge_class,),
                {"build_conversion_tasks": build_conversion_tasks})


def as_skyrl_pin(bridge: Any) -> Any:
    """A copy of the real ``bridge`` whose ``_model_bridge`` (a fresh one per access, as Bridge's) has the older
    signature."""
    real = type(bridge)

    class OlderAutoBridge(real):  # type: ignore[misc, valid-type]
        @property
        def _model_bridge(self) -> Any:
            model_bridge = real._model_bridge.fget(self)
            model_bridge.__class__ = _older(type(model_bridge))
            return model_bridge

    older = copy.copy(bridge)
    older.__class__ = OlderAutoBridge
    return older
