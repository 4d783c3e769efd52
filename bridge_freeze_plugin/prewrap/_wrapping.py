"""One way for the plugin to wrap a function of Bridge or megatron-core, keeping everything the function had.

``functools.wraps`` carries the name, docstring, ``__wrapped__`` (so ``inspect.signature`` shows the original's)
and the function's ``__dict__``; it does not carry what a C-level wrapper exposes as methods, such as an
``functools.lru_cache`` function's ``cache_clear`` / ``cache_info`` / ``cache_parameters``. Bridge caches
``read_run_config`` and ``read_train_state`` that way, and its own test suite (and user code) clears the cache
before each use: a wrapper without ``cache_clear`` breaks them, so these are carried too, bound to the original,
whose cache keeps working (the wrapper calls it). The original is kept as ``__bridge_freeze_wrapped__`` (what
``deactivate`` and the idempotence checks read).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

#: what a caching function exposes beyond what ``functools.wraps`` copies
CACHE_METHODS = ("cache_clear", "cache_info", "cache_parameters")

F = TypeVar("F", bound=Callable[..., Any])


def keeps(original: Callable[..., Any], *, mark: bool = True) -> Callable[[F], F]:
    """Decorator: the wrapper gets all that ``original`` had (``functools.wraps``, its cache's methods) and, with
    ``mark``, ``__bridge_freeze_wrapped__ = original``."""

    def decorate(wrapper: F) -> F:
        functools.update_wrapper(wrapper, original)
        for name in CACHE_METHODS:
            method = getattr(original, name, None)
            if callable(method):
                setattr(wrapper, name, method)
        if mark:
            wrapper.__bridge_freeze_wrapped__ = original  # type: ignore[attr-defined]
        return wrapper

    return decorate
