"""Every trainable tiny family, every selection that leaves something to train: one real forward + backward on
the CPU, and the gradients are exactly the selection's.

For each configuration the model is built ONCE (plain Bridge build, plugin not involved) and each of the 7
selections is applied with ``bridge_freeze_plugin.apply_selection`` (gradients cleared in between). Then:

- the trainable set is the one computed from the tests' own prefix table (``_family_parts.py``, never from the
  plugin's registry);
- every trainable parameter has a gradient that is not None and not all zeros;
- every frozen parameter has no gradient (None).

Parameters that legitimately get no gradient from one synthetic batch are handled explicitly:

- MoE experts to which no loss-carrying token was routed in this batch (the routers decide, per batch; see
  :class:`ExpertSignal`): a hook on every ``local_experts.N`` output records whether a non-zero gradient came
  back; such an expert must have a zero (or no) gradient, every other trained expert a non-zero one, and in each
  MoE layer at least one expert must learn (so this cannot pass vacuously). Seen here: GLM-4.5V's expert 2 (one
  token, at a position without loss) and ERNIE's vision-pool experts 0 and 1 (16 image tokens, top-2 routing);
- MiniMax-M3-VL's ``lightning_indexers``: checkpoint-only state Bridge builds frozen and never runs (no flag's
  part): it never trains and gets no gradient;
- EXAONE 4.5's MTP block: its training spec builds without it (Bridge 0.6.2's ``Exaone45Model.forward`` passes
  ``input_ids=None`` to its language model, which the MTP layer embeds: any forward with MTP fails), so the
  trained model has no ``other`` part; checked below;
- Qwen2.5-Omni's ``audio_bos_eos_token``: built trainable, never read by the forward (:data:`NEVER_READ`): it
  must have no non-zero gradient. Likewise Gemma3-VL's SigLIP pooling head (``vision_tower.head.*``) where the
  installed Bridge builds one (SkyRL's pin 91a15142 does; 0.6.2 builds the tower without it, so nothing matches):
  the tower computes its pooled output and the forward discards it.

A configuration the installed Bridge cannot build (an older Bridge in the compatibility lane: a provider module or
field absent, :func:`bridge_freeze_harness.tiny.bridge_lacks`, declared in the family's tiny module) is skipped
with the reason.

Families with an audio side get audio in their synthetic batch (Gemma 4, the Qwen Omni and audio families), so
their audio parts must have non-zero gradients whenever they train. A family with more than three parts runs each
part frozen alone and each part trained alone here; its own test file runs every combination.
"""

from __future__ import annotations

import re

import pytest
import torch
from _family_parts import FROZEN_AS_BUILT, NEVER_READ, PARTS, part_of, parts_of, selections_of

from bridge_freeze_harness import train
from bridge_freeze_harness.tiny import bridge_lacks, build_tiny_model
from bridge_freeze_plugin import FreezeSelection, Part, apply_selection, get_family

#: Every tiny configuration that must train on the CPU (Nemotron-VL and Nemotron Omni: their Mamba layers on the
#: harness's CPU scan).
TRAINABLE = sorted(PARTS)

#: The plugin registry's family of a configuration, where the names differ.
REGISTRY_FAMILY = {"qwen35_vl_moe": "qwen35_vl"}



def _selections(config: str) -> list[FreezeSelection]:
    """The selections that train something: every one of a VLM's parts; with more parts, each alone frozen and
    each alone trained (the families' own test files run every combination)."""
    parts = [Part(p) for p in parts_of(config)]
    return [s for s in selections_of(config, every=False) if s.trained_parts(parts)]

EXPERT = re.compile(r"^(.*\.local_experts\.\d+)\.")


class ExpertSignal:
    """Per MoE expert module: did any loss-carrying gradient reach its output in the backward?

    An expert gets a non-zero weight gradient only if a token was routed to it AND that token's output
    influences the loss: a token routed in the last layer at a position without loss (the last one, an image
    placeholder) sends back a zero gradient. Both are a property of the batch, not of the freeze.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.signal: dict[str, bool] = {}
        self.handles = [
            module.register_forward_hook(self._hook(name))
            for name, module in model.named_modules()
            if re.fullmatch(r".*\.local_experts\.\d+", name)
        ]

    def _hook(self, name: str):
        self.signal.setdefault(name, False)

        def on_grad(grad: torch.Tensor) -> None:
            self.signal[name] = self.signal[name] or bool(torch.any(grad != 0))

        def hook(_module, _inputs, output) -> None:
            out = output[0] if isinstance(output, tuple) else output
            if torch.is_tensor(out) and out.requires_grad:
                out.register_hook(on_grad)

        return hook

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def test_the_trainable_configurations_are_exactly_the_expected_ones():
    assert train.trainable_families() == TRAINABLE
    assert train.cannot_train_reason("nemotron_vl") is None and train.cannot_train_reason("nemotron_omni") is None


def _check_selection(config: str, model: torch.nn.Module, batch: dict, selection: FreezeSelection,
                     provider_class: type) -> list[str]:
    """Problems found for one selection (empty = fine)."""
    # the table the provider's class builds (Bridge 0.7.0's Nemotron Omni: its parts at the top level), as a
    # provider build picks it; the expected set below comes from the tests' own table
    family = get_family(REGISTRY_FAMILY.get(config, config)).for_class(provider_class)
    apply_selection(model, family, selection)
    params = dict(model.named_parameters())
    frozen_parts = {p.value for p in selection.frozen_parts()}
    never = FROZEN_AS_BUILT.get(config)
    unread = NEVER_READ.get(config)
    want = {n for n in params if part_of(config, n) not in frozen_parts and not (never and re.match(never, n))}
    problems = []
    got = {n for n, p in params.items() if p.requires_grad}
    if got != want:
        problems.append(f"trainable set: extra {sorted(got - want)[:3]}, missing {sorted(want - got)[:3]}")
    model.zero_grad(set_to_none=True)
    experts = ExpertSignal(model)
    try:
        train.forward_backward(model, batch, config)
    finally:
        experts.remove()
    for name, param in params.items():
        expert = EXPERT.match(name)
        if name not in want:
            if param.grad is not None:
                problems.append(f"frozen {name} has a gradient")
        elif expert and not experts.signal[expert.group(1)]:
            if param.grad is not None and torch.any(param.grad != 0):
                problems.append(f"{name}: no loss-carrying token reached this expert, yet its gradient is non-zero")
        elif unread and re.match(unread, name):
            if param.grad is not None and torch.any(param.grad != 0):
                problems.append(f"{name}: the forward never reads it, yet its gradient is non-zero")
        elif param.grad is None or not torch.any(param.grad != 0):
            problems.append(f"trainable {name}: gradient {'None' if param.grad is None else 'all zeros'}")
    if want & {n for n in params if EXPERT.match(n)}:  # the experts train: some expert per layer must learn
        layer = re.compile(r"\.local_experts\.\d+$")
        learning = {layer.sub("", e) for e, on in experts.signal.items() if on}
        if learning != {layer.sub("", e) for e in experts.signal}:
            problems.append(f"MoE layers where no expert got a loss gradient: {sorted(experts.signal)}")
    return problems


@pytest.mark.parametrize("config", TRAINABLE)
def test_every_selection_gives_gradients_to_exactly_the_trained_parts(cpu_bridge, config):
    if (lacks := bridge_lacks(config)) is not None:  # an older Bridge (the compatibility lane), by feature
        pytest.skip(lacks)
    provider = train.make_provider(config)
    torch.manual_seed(0)
    model = build_tiny_model(config, provider)
    model.train()
    batch = train.synthetic_batch(config, provider)
    names = {n for n, _ in model.named_parameters()}
    # Every part is really present, so no selection can pass vacuously.
    assert {part_of(config, n) for n in names} >= set(parts_of(config))
    if config == "exaone45_vl":
        assert not any(n.startswith("language_model.mtp.") for n in names)  # see module docstring
    elif "other" in PARTS[config]:
        assert "other" in {part_of(config, n) for n in names}
    problems = {str(s.as_dict()): found for s in _selections(config)
                if (found := _check_selection(config, model, batch, s, type(provider)))}
    assert problems == {}
