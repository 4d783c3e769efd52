"""The plugin's identity-keyed tables (``prewrap._state.IdentityTable``: provider states, chunk states, flag
origins) forget an object when it is collected, from a weakref callback. That callback can run in the middle of the
table's own ``set``, on the same thread: a collection started by an allocation there, or the old value, dropped by
the store, being the last holder of another key. A full CI run hung for good on this (a garbage collection inside
``set`` while ``TransformerConfig.__deepcopy__`` wrote a flag on an ERNIE expert's config copy)."""

from __future__ import annotations

import gc
import threading

from bridge_freeze_plugin.prewrap._state import IdentityTable


class _Key:
    """Weak-referenceable, hashable by identity only, like a provider or a model chunk."""


def _in_a_thread(work, timeout: float = 10.0) -> bool:
    """Run ``work`` in a daemon thread; True when it finished in time (a deadlock leaves it waiting for good)."""
    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    worker.join(timeout)
    return not worker.is_alive()


def test_a_value_dropped_by_set_that_held_another_key_does_not_deadlock():
    table = IdentityTable()
    owner, held = _Key(), _Key()
    table.set(held, "held's value")
    table.set(owner, [held])  # the only strong reference to `held` is this value
    del held
    # replacing owner's value drops the list, then `held`, whose callback forgets it while set() runs
    assert _in_a_thread(lambda: table.set(owner, "new value")), "IdentityTable.set deadlocked in its own callback"
    assert table.get(owner) == "new value"
    assert len(table) == 1


def test_a_collection_inside_set_that_frees_a_key_does_not_deadlock():
    """Python 3.12 collects at the eval breaker, checked after a builtin call: the ``weakref.ref(...)`` inside
    ``set`` can run a collection that frees a key of the same table (a provider or config copy in a cycle)."""
    table = IdentityTable()
    keys = [_Key() for _ in range(300)]

    def churn() -> None:
        for i, key in enumerate(keys):
            garbage = _Key()
            garbage.me = garbage  # only the cycle collector frees it, at whichever check comes next
            table.set(garbage, -1)
            del garbage
            table.set(key, i)

    thresholds = gc.get_threshold()
    gc.collect()
    gc.set_threshold(1)  # a collection asked for at (nearly) every allocation
    try:
        done = _in_a_thread(churn)
    finally:
        gc.set_threshold(*thresholds)
    assert done, "IdentityTable.set deadlocked when a collection inside it freed another key"
    gc.collect()
    assert len(table) == len(keys)
    assert [table.get(k) for k in keys] == list(range(len(keys)))
