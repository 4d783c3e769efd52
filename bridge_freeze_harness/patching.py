"""One helper for every attribute patch the harness applies: set, and restore in reverse order on exit."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any


@contextlib.contextmanager
def patched(patches: Iterable[tuple[Any, str, Any]]) -> Iterator[None]:
    """Set each ``(target, attribute, value)``; on exit restore every attribute set, last first."""
    undo: list[tuple[Any, str, Any]] = []
    try:
        for target, name, value in patches:
            undo.append((target, name, getattr(target, name)))
            setattr(target, name, value)
        yield
    finally:
        for target, name, original in reversed(undo):
            setattr(target, name, original)
