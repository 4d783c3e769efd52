"""A build that is not wrapped for training says so in its report's first line (issue 35 item 3).

NeMo-RL's HF import (``import_model_from_hf_name``) builds the model with ``provide_distributed_model(
wrap_with_ddp=False)`` only to save it; Bridge's export and ``bridge-freeze plan`` build without DDP or on the
meta device. Their report used to read as the run's own (``train language_model + vision_projection`` on a run
asked to be projection-only): now its first line names what the build is, and the one report of the build that
trains is the only one that reads as a selection being trained.
"""

from __future__ import annotations

import logging


def _blocks(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "bridge_freeze_plugin" and r.levelno == logging.INFO]


def test_a_conversion_build_says_what_it_is_in_its_first_line(cpu_bridge, caplog):
    from bridge_freeze_harness.tiny import build_tiny_chunks, make_provider
    from bridge_freeze_plugin import last_report

    provider = make_provider("qwen25_vl", freeze_vision_model=True)
    with caplog.at_level(logging.INFO, logger="bridge_freeze_plugin"):
        build_tiny_chunks("qwen25_vl", provider)  # provide_distributed_model(wrap_with_ddp=False), as NeMo-RL's import
    (block,) = _blocks(caplog)
    first = block.splitlines()[0]
    assert first.startswith("bridge-freeze: not a training build (wrap_with_ddp=False: a checkpoint conversion")
    assert "nothing trains here" in first and first.endswith("train language_model + vision_projection")
    assert last_report(provider).untrained is not None


def test_a_meta_device_build_says_what_it_is_in_its_first_line(cpu_bridge, caplog):
    from bridge_freeze_harness.tiny import build_tiny_chunks, make_provider

    provider = make_provider("qwen25_vl")
    provider.init_model_with_meta_device = True
    with caplog.at_level(logging.INFO, logger="bridge_freeze_plugin"):
        build_tiny_chunks("qwen25_vl", provider)  # completes on the CPU (Bridge 0.6.2); a failure here is a failure
    first = _blocks(caplog)[0].splitlines()[0]
    assert first.startswith("bridge-freeze: not a training build (built on the meta device for a plan")


def test_a_training_build_reads_as_before():
    """The report of a build wrapped for training starts with the provider (no kind): the format, no build."""
    from bridge_freeze_plugin import FreezeReport, FreezeSelection

    report = FreezeReport("qwen25_vl", "Qwen25VLModelProvider", None, FreezeSelection(), ())
    assert report.format().splitlines()[0].startswith("bridge-freeze: Qwen25VLModelProvider, family qwen25_vl:")


def _nemo_rl_get_model(provider: object, hooks: list) -> list:
    """Bridge's get_model as NeMo-RL's megatron set-up calls it for the policy (setup_model_and_optimizer) and the
    reference policy (setup_reference_model_state): the same provider, wrapped with DDP, its own hook list
    (use_cpu_initialization: the CPU rehearsal's only addition)."""
    from megatron.bridge.models import model_provider as mp
    from megatron.core.process_groups_config import ProcessGroupCollection

    from bridge_freeze_harness.ddp_steps import ddp_config

    pg_collection = ProcessGroupCollection.use_mpu_process_groups()
    provider._pg_collection = pg_collection
    return mp.get_model(provider, ddp_config(False), use_torch_fsdp2=False, data_parallel_random_init=False,
                        overlap_param_gather_with_optimizer_step=False, pre_wrap_hook=hooks,
                        pg_collection=pg_collection, use_cpu_initialization=True)


def test_nemo_rls_reference_model_says_what_it_is_in_its_first_line(cpu_bridge, caplog):
    """NeMo-RL builds its reference policy (GRPO with a KL penalty, DPO) from the policy's own provider after the
    policy, with DDP, and never steps it: its report used to read as a second training report. Now its first line
    says it is another model from a provider already built for training; it freezes the same parts."""
    from _family_parts import part_of

    from bridge_freeze_harness.cpu_training import cpu_training
    from bridge_freeze_harness.train import make_provider

    with cpu_training("qwen3_vl"), caplog.at_level(logging.INFO, logger="bridge_freeze_plugin"):
        provider = make_provider("qwen3_vl", freeze_language_model=True, freeze_vision_model=True)
        policy = _nemo_rl_get_model(provider, [])  # setup_model_and_optimizer (wrap_with_ddp=load_optimizer: True)
        reference = _nemo_rl_get_model(provider, [])  # setup_reference_model_state
    training, second = _blocks(caplog)
    assert training.splitlines()[0].startswith("bridge-freeze: Qwen3VLModelProvider, family qwen3_vl:")
    assert second.splitlines()[0].startswith(
        "bridge-freeze: another model from a provider already built for training in this process (NeMo-RL's "
        "reference policy is one")
    for chunks in (policy, reference):
        named = {n.removeprefix("module.").removeprefix("module."): p
                 for c in chunks for n, p in c.named_parameters()}
        assert {n for n, p in named.items() if p.requires_grad} == {
            n for n in named if part_of("qwen3_vl", n) == "vision_projection"}
