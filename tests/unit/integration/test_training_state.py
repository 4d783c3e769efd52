"""The harness's :func:`fresh_training_state` gives each training the per-process state a fresh process has."""
from __future__ import annotations

from bridge_freeze_harness.cpu_runtime import fresh_training_state


def test_a_rerun_state_machine_made_by_a_forward_is_gone_before_the_next_training():
    import megatron.core.rerun_state_machine as rerun  # here: collecting the file imports no megatron-core

    # A loss function run outside pretrain() (vlm_step's, in a forward-step test) creates the machine implicitly;
    # Bridge's initialize_megatron asserts none is set ("Rerun state machine is already initialized": a CI failure).
    rerun.destroy_rerun_state_machine()
    rerun.get_rerun_state_machine()
    assert rerun._GLOBAL_RERUN_STATE_MACHINE is not None
    fresh_training_state()
    assert rerun._GLOBAL_RERUN_STATE_MACHINE is None
    rerun.initialize_rerun_state_machine()  # what initialize_megatron does: it must not raise
    rerun.destroy_rerun_state_machine()
