"""The CPU harness of bridge-freeze-plugin: build and train REAL Megatron-Bridge VLMs on a machine without a GPU.

Why it exists. Megatron-Bridge builds its models for CUDA and TransformerEngine (TE). TE cannot load without
CUDA, yet ``import megatron.bridge`` needs it (two Bridge modules import it unconditionally), and several
providers name TE layer specs or classes directly. To build the real model classes through their real
providers on a CPU or the meta device (same module tree, same parameter names: what the plugin classifies),
this package gives those two Bridge modules a TE stub only while they execute (megatron-core keeps
``HAVE_TE=False``; :mod:`._te_stub`), brings up a gloo CPU runtime (:mod:`.cpu_runtime`), swaps TE specs for
megatron-core's local ones while a model is built (:mod:`.local_specs`, :mod:`.local_layers`, :mod:`.context`,
and each family's module under :mod:`.tiny`), and runs forward / backward / AdamW steps on synthetic batches
(:mod:`.batches`, :mod:`.forward`: CPU forward patches, activation recompute included; :mod:`.train`).
Layer implementations are megatron-core's local ones; numerics are not a GPU run's.

Who imports it. It is never on the plugin's runtime path: activation, the provider mixin, the freeze, the
guarantee, the report and config validation never import it, so a training job using the plugin loads none
of this. Two commands do, lazily inside their functions, because they build models on the CPU / meta device:
``bridge-freeze demo`` (:mod:`bridge_freeze_plugin.cli._demo`) and ``bridge-freeze plan``
(:mod:`bridge_freeze_plugin.planning`); ``tests/unit/test_layout.py`` checks this. The test suite and the
benchmarks use it too. Where the real TE loads, the stub does nothing. And the other way round: this package
never imports ``bridge_freeze_plugin`` at module level, so a test can build a plain Bridge model (plugin not
loaded) to compare.

Other modules of the package refer to this paragraph instead of repeating it.

Public entry points: :func:`cpu_build_context` (generic + a family's any-size CPU build patches, for a
full-size build), :mod:`bridge_freeze_harness.tiny` (tiny configurations: ``make_provider``,
``build_tiny_model``, ``build_tiny_chunks``, ``build_context``), :mod:`bridge_freeze_harness.train`
(``trainable_families``, ``train_spec``, ``synthetic_batch``, ``loss_fn``, ``train_steps``).

Every module (``tests/unit/integration/test_harness_stubs.py`` checks that this list names them all):

- import-time stubs: :mod:`._stub_window` (a module that exists only while chosen modules execute: the mechanism),
  :mod:`._te_stub` (TransformerEngine for Bridge's TE-importing modules; megatron-core's TE placeholders as
  classes), :mod:`._resiliency_stub` (``nvidia_resiliency_ext`` for Bridge's ``training/pretrain.py``);
- building: :mod:`.cpu_runtime` (gloo process group, model-parallel state, CPU RNG tracker), :mod:`.context`
  (the build contexts), :mod:`.local_specs` and :mod:`.local_layers` (TE specs and classes -> local ones),
  :mod:`.patching` (set attributes, restore in reverse order), :mod:`.tiny` (one module per family: tiny
  configurations, CPU patches, train specs);
- training steps: :mod:`.batches` (synthetic batches, ``TrainSpec``), :mod:`.forward` (CPU forward / backward
  patches), :mod:`._mamba_cpu` (a pure-PyTorch Mamba-2 scan for mamba-ssm's CUDA-only training kernel),
  :mod:`.train` (a few AdamW steps);
- Bridge's real training loop: :mod:`.cpu_training` (``pretrain()`` / ``finetune()`` on a CPU), :mod:`._cpu_patches`
  (its CUDA-to-CPU patches), :mod:`._bridge_steps` (Bridge's forward steps, those the family modules declare
  collected, their batch layouts, the synthetic dataset), :mod:`._visual_inputs` (Bridge's ``GenericVisualInputs``
  with a model input it lacks, for vlm_step), :mod:`.run_records` (a recording callback, checkpoints read back);
- the user's flow: :mod:`.hf_checkpoint` (tiny random HF checkpoints, the CPU provider Bridge converts them to),
  :mod:`._hf_configs` (``HFFamily``, the HF checkpoint recipe each family module declares, and the
  tiny HF text fields the recipes share), :mod:`._grouped_experts` (the CPU
  stand-in for TE's grouped-GEMM experts), :mod:`._grouped_sharding` (its torch_dist keys),
  :mod:`.demo_flow` (HF in, Bridge's loop, HF out: ``bridge-freeze demo``), :mod:`.demo_scope` (which families
  it runs, read without importing model code), :mod:`._hf_compare` (its exported tensors against the input
  checkpoint's);
- no Megatron at all: :mod:`.stand_ins` (plain PyTorch modules with a real model's parameter names);
- on a GPU (``device="cuda"`` of :func:`~bridge_freeze_harness.context.device_build_context`,
  :func:`~bridge_freeze_harness.tiny.build_context`, :func:`~bridge_freeze_harness.tiny.make_provider`,
  :func:`~bridge_freeze_harness.forward.forward_patches`: the spec swap where TE is absent, never the CPU device
  patch): :mod:`.gpu_runtime` (NCCL world 1, which specs), :mod:`.ddp_steps` (Megatron DDP + its optimizer, a
  few steps, the buffers and state read back), :mod:`.gpu_training` (Bridge's ``finetune()``, the HF round trip
  and the trainable-only export on CUDA).
"""

from bridge_freeze_harness.context import cpu_build_context, device_build_context

__all__ = ["cpu_build_context", "device_build_context"]
