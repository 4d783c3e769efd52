"""Nemotron-VL's Mamba layers on the CPU: the harness's pure-PyTorch SSD scan in place of mamba-ssm's kernel.

- the chunked scan equals the step-by-step Mamba-2 recurrence (written here, in the test) on random inputs, for
  chunk sizes that divide the length, do not, and exceed it; and the full kernel stand-in (conv, softplus, D skip,
  z gate) equals a per-step evaluation written here too;
- a real tiny Nemotron-VL and Nemotron Omni (Bridge's providers, real ``HybridModel`` with a ``MambaMixer`` layer
  first, real vision tower and projector, Omni's sound encoder and projector) run forward and backward on the CPU
  with the plugin's selection: exactly the parameters under the unfrozen parts' prefixes (the test's own table,
  read off the Bridge model trees) get a gradient, the Mamba mixer's own parameters included when the language
  model trains.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from bridge_freeze_harness._mamba_cpu import split_conv1d_scan, ssd_chunked
from bridge_freeze_harness.forward import forward_patches
from bridge_freeze_harness.tiny import build_tiny_model, make_provider
from bridge_freeze_plugin import FreezeSelection, apply_selection, get_family

NAME, OMNI = "nemotron_vl", "nemotron_omni"
#: plugin flag -> the module prefix it covers (read off the Bridge model trees; the test's own table).
PARTS = {
    "freeze_language_model": "llava_model.language_model.",
    "freeze_vision_model": "llava_model.vision_model.",
    "freeze_vision_projection": "llava_model.vision_projection.",
}
OMNI_PARTS = {**PARTS, "freeze_audio_model": "llava_model.sound_model.",
              "freeze_audio_projection": "llava_model.sound_projection."}
#: The tiny pattern's one Mamba layer (layer 0) and the parameters megatron-core's MambaMixer owns.
MIXER = "llava_model.language_model.decoder.layers.0.mixer."
#: Bridge 0.7.0's NemotronOmniModel holds the same modules at the top level (no ``llava_model.``): :func:`_names`.
_LLAVA = "llava_model."
MIXER_PARAMS = {"A_log", "D", "conv1d_bias", "conv1d_weight", "dt_bias", "in_proj.layer_norm_weight",
                "in_proj.weight", "norm.weight", "out_proj.weight"}
IMAGE_TOKEN = 131072  # the image token id the provider's provide() hard-codes


def _recurrence(x, dt, A, B, C):
    """h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T, y_t = h_t C_t, per head; heads share their group's B / C."""
    b, length, heads, p = x.shape
    per_group = heads // B.shape[2]
    y = torch.zeros_like(x)
    for i in range(b):
        for h in range(heads):
            g = h // per_group
            state = torch.zeros(p, B.shape[-1], dtype=x.dtype)
            for t in range(length):
                state = torch.exp(dt[i, t, h] * A[h]) * state + dt[i, t, h] * torch.outer(x[i, t, h], B[i, t, g])
                y[i, t, h] = state @ C[i, t, g]
    return y


def _random(*shape, gen):
    return torch.randn(*shape, generator=gen, dtype=torch.float64)


@pytest.mark.parametrize("chunk", [1, 4, 5, 16])
def test_the_chunked_scan_is_the_step_by_step_recurrence(chunk):
    gen = torch.Generator().manual_seed(chunk)
    b, length, heads, p, groups, n = 2, 10, 4, 3, 2, 5
    x, B, C = _random(b, length, heads, p, gen=gen), _random(b, length, groups, n, gen=gen), _random(
        b, length, groups, n, gen=gen)
    dt = F.softplus(_random(b, length, heads, gen=gen))
    A = -torch.rand(heads, generator=gen, dtype=torch.float64) * 2
    torch.testing.assert_close(ssd_chunked(x, dt, A, B, C, chunk), _recurrence(x, dt, A, B, C))


def test_the_kernel_stand_in_is_conv_then_scan_then_gate():
    gen = torch.Generator().manual_seed(0)
    b, length, heads, p, groups, n, width = 1, 7, 2, 3, 1, 4, 4
    d_inner, xbc = heads * p, heads * p + 2 * groups * n
    zxbcdt = _random(b, length, d_inner + xbc + heads, gen=gen)
    weight, bias, dt_bias, D = (_random(xbc, width, gen=gen), _random(xbc, gen=gen), _random(heads, gen=gen),
                                _random(heads, gen=gen))
    A = -torch.rand(heads, generator=gen, dtype=torch.float64)
    got = split_conv1d_scan(zxbcdt, weight, bias, dt_bias, A, D, chunk_size=3, headdim=p, ngroups=groups)
    z, u, dt = zxbcdt[..., :d_inner], zxbcdt[..., d_inner:d_inner + xbc], zxbcdt[..., d_inner + xbc:]
    conv = torch.stack([bias + sum(weight[:, k] * u[:, t - (width - 1) + k] for k in range(width)
                                   if t - (width - 1) + k >= 0) for t in range(length)], dim=1)
    conv = F.silu(conv)
    x = conv[..., :d_inner].reshape(b, length, heads, p)
    B, C = (conv[..., d_inner + i * groups * n:d_inner + (i + 1) * groups * n].reshape(b, length, groups, n)
            for i in (0, 1))
    y = _recurrence(x, F.softplus(dt + dt_bias), A, B, C) + x * D[:, None]
    torch.testing.assert_close(got, y.reshape(b, length, d_inner) * F.silu(z))


def test_the_stand_in_refuses_packed_sequences():
    with pytest.raises(NotImplementedError, match="packed sequences"):
        split_conv1d_scan(torch.zeros(1, 2, 9), torch.zeros(5, 2), None, torch.zeros(1), torch.zeros(1),
                          torch.zeros(1), 4, headdim=2, seq_idx=torch.zeros(1, 2, dtype=torch.int32))


@pytest.fixture(scope="module", params=[NAME, OMNI])
def built(request, cpu_bridge):
    provider = make_provider(request.param)
    return request.param, provider, build_tiny_model(request.param, provider)


def _names(model, table: dict[str, str], mixer: str) -> tuple[dict[str, str], str]:
    """The table and the mixer's prefix as the model names them (the LLaVA model's, or top-level ones)."""
    if any(n.startswith(_LLAVA) for n, _ in model.named_parameters()):
        return table, mixer
    return {flag: prefix.removeprefix(_LLAVA) for flag, prefix in table.items()}, mixer.removeprefix(_LLAVA)


def _batch(family: str, provider) -> dict:
    if family == OMNI:
        from bridge_freeze_harness.tiny.nemotron_omni import forward_inputs

        return forward_inputs(provider)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 100, (1, 12), generator=gen)
    ids[0, 3] = IMAGE_TOKEN
    labels = torch.roll(ids, -1, dims=1)
    labels[0, 2:4] = 0
    loss_mask = torch.ones(1, 12)
    loss_mask[0, 2:4] = 0
    return {"images": torch.randn(1, 3, 512, 512, generator=gen), "input_ids": ids, "position_ids": None,
            "attention_mask": None, "labels": labels, "loss_mask": loss_mask,
            "num_image_tiles": torch.tensor([1], dtype=torch.int)}


@pytest.mark.parametrize("flag", ["freeze_vision_model", "freeze_language_model"])
def test_a_forward_and_backward_through_mamba_gives_gradients_to_exactly_the_selection(built, flag):
    family, provider, model = built
    apply_selection(model, get_family(family), FreezeSelection(**{flag: True}))
    model.zero_grad(set_to_none=True)
    with forward_patches(family):
        output = model(**_batch(family, provider))  # 0.7.0's NemotronOmniModel: the per-token loss alone
        per_token = output[0] if isinstance(output, tuple) else output
        loss = per_token.float().mean()
        loss.backward()
    assert torch.isfinite(loss)
    names = [n for n, _ in model.named_parameters()]
    parts, mixer = _names(model, OMNI_PARTS if family == OMNI else PARTS, MIXER)
    assert {mixer + p for p in MIXER_PARAMS} <= set(names)
    trained = tuple(prefix for f, prefix in parts.items() if f != flag)
    expected = {n for n in names if n.startswith(trained)}
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert set(grads) == expected
    if flag != "freeze_language_model":  # the Mamba mixer trains, and its scan's backward reaches every parameter
        assert all(grads[mixer + p].abs().sum() > 0 for p in MIXER_PARAMS)
