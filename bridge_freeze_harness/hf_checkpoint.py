"""Tiny random Hugging Face checkpoints on disk, per family, and the CPU provider Bridge converts them to.

The user's flow is ``AutoBridge.from_hf_pretrained(dir)`` -> ``to_megatron_provider(load_weights=True)`` ->
flags -> build -> train -> ``export_hf_weights`` / ``save_hf_pretrained``. This module gives that flow a
checkpoint to start from without the model hub:

- :func:`write_tiny_hf_checkpoint` builds the family's transformers model class from a tiny config made in
  code (sizes of the harness's tiny Bridge configuration: 2 text layers, hidden 64, vocabulary 128), moves
  EVERY floating-point tensor of its state dict away from its initial value by seeded Gaussian noise (norm
  weights included, so a weight that Bridge does not load cannot pass a comparison with the file) and saves
  it with ``save_pretrained`` (safetensors, float32, ``config.json`` and ``generation_config.json``) with a
  tiny word-level tokenizer (Bridge's ``save_hf_pretrained`` saves the source's tokenizer; nothing else is read);
- :func:`cpu_provider` turns the ``AutoBridge`` of such a folder into a provider that builds and trains on the
  CPU: Bridge's own conversion, then only CPU settings (float32, no fused kernels, the ``allgather`` MoE
  dispatcher, no grouped GEMM), the tiny special token ids of the family's train spec, and the few
  per-family fields listed in :data:`HF_FAMILIES`. Build it with :func:`bridge_freeze_harness.tiny.build_tiny_chunks`
  (the family's CPU build patches apply).

A family whose HF class transformers 5.12.1 lacks but Bridge vendors (Qwen3-ASR) names that class's module
(``model_module``) and the patches that close its transformers-5 gaps (``model_patches``, entered by
:func:`hf_model_context` around every build, load and forward of it); one whose HF config class is remote code (Kimi
K2.5) names what Bridge's loads of it need (``load_patches``, entered by :func:`bridge_load_context`) and how its
tensors are stored (``stored_as``). Families whose Hugging Face checkpoint
cannot be written offline are in :data:`NO_HF_CHECKPOINT`, with the reason. Each family module of
:mod:`bridge_freeze_harness.tiny` declares its recipes (``HF_CHECKPOINTS``: configuration -> :class:`HFFamily`, from
:mod:`._hf_configs`) or its reason (``NO_HF_CHECKPOINT``); this module collects them. The CPU stand-in for TE's
grouped-GEMM experts is in :mod:`._grouped_experts`. Who imports this package, and why: :mod:`bridge_freeze_harness`.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from bridge_freeze_harness._grouped_experts import bridge_maps_experts_only_grouped, grouped_experts_on_cpu
from bridge_freeze_harness._hf_configs import HFFamily
from bridge_freeze_harness.cpu_runtime import CPU_FUSIONS_OFF
from bridge_freeze_harness.tiny._common import TINY_LM
from bridge_freeze_harness.tiny._index import Declared

logger = logging.getLogger(__name__)

#: Standard deviation of the noise added to every floating-point tensor of a written checkpoint.
NOISE_STD = 0.02

_VOCAB = TINY_LM["vocab_size"]

#: Provider fields with no CPU implementation in a MoE model (names and shapes unchanged).
_CPU_MOE: dict[str, Any] = {
    "moe_grouped_gemm": False,
    "moe_permute_fusion": False,
    "moe_shared_expert_overlap": False,
    "moe_token_dispatcher_type": "allgather",
}

#: Provider fields every CPU build from a converted checkpoint gets.
_CPU_FIELDS: dict[str, Any] = {
    **CPU_FUSIONS_OFF,
    "params_dtype": torch.float32,
    "pipeline_dtype": torch.float32,
    "bf16": False,
    "fp16": False,
    "use_cpu_initialization": True,
}


#: tiny configuration name -> how to write its HF checkpoint (transformers has its model class): each family module's
#: ``HF_CHECKPOINTS`` (:mod:`bridge_freeze_harness.tiny`), collected on first use.
HF_FAMILIES: Mapping[str, HFFamily] = Declared("HF_CHECKPOINTS")

#: tiny configuration name -> why no HF checkpoint of it can be written here (measured, one line each): each family
#: module's ``NO_HF_CHECKPOINT``, collected on first use.
NO_HF_CHECKPOINT: Mapping[str, str] = Declared("NO_HF_CHECKPOINT")


def grouped_experts(name: str) -> bool:
    """Whether tiny configuration ``name``'s converted provider builds its routed experts as grouped GEMM
    (:func:`grouped_experts_on_cpu`): where the family declares it, or where the installed Bridge maps its experts
    only under grouped-GEMM names (a ``SequentialMLP`` would load nothing: ``No mapping found``)."""
    family = hf_family(name)
    return family.grouped_experts or bridge_maps_experts_only_grouped(family.model_class)


def hf_family(name: str) -> HFFamily:
    """The :class:`HFFamily` of tiny configuration ``name`` (``KeyError`` with the reason or the known names)."""
    if name in HF_FAMILIES:
        return HF_FAMILIES[name]
    if name in NO_HF_CHECKPOINT:
        raise KeyError(f"no tiny HF checkpoint for {name!r}: {NO_HF_CHECKPOINT[name]}")
    raise KeyError(f"no tiny HF checkpoint for {name!r}; families with one: {sorted(HF_FAMILIES)}")


def model_class(name: str) -> type:
    """The HF model class of tiny configuration ``name``'s checkpoint (transformers', or a vendored copy: build,
    load and run it inside :func:`hf_model_context`)."""
    import importlib

    family = hf_family(name)
    return getattr(importlib.import_module(family.model_module), family.model_class)


def hf_model_context(name: str) -> contextlib.AbstractContextManager[Any]:
    """What building, loading or running :func:`model_class` of ``name`` needs (its ``model_patches``), or a
    no-op."""
    patches = hf_family(name).model_patches
    return patches() if patches is not None else contextlib.nullcontext()


def bridge_load_context(name: str) -> contextlib.AbstractContextManager[Any]:
    """What ``AutoBridge.from_hf_pretrained`` of ``name``'s checkpoint, or a ``finetune()`` from it, needs (its
    ``load_patches``), or a no-op."""
    patches = hf_family(name).load_patches
    return patches() if patches is not None else contextlib.nullcontext()


def hf_config(name: str) -> Any:
    """The tiny transformers config of ``name``'s checkpoint (float32, its model class as architecture)."""
    family = hf_family(name)
    config = family.config()
    config.architectures = [family.model_class]
    config.dtype = torch.float32
    return config


def randomize_(state: Mapping[str, torch.Tensor], seed: int) -> None:
    """Add seeded Gaussian noise (``NOISE_STD``) to every floating-point tensor of ``state``, in place.

    Each tensor is drawn from its own generator (seed and name), so a tensor's values do not depend on
    which other tensors the model has. Values keep their scale (a norm weight stays near 1) but no element
    keeps a constant initial value; an infinite one (an unset clipping bound) becomes a random finite one
    beyond +-1000.
    """
    import zlib

    with torch.no_grad():
        for name, tensor in state.items():
            if not tensor.is_floating_point():
                continue
            gen = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
            noise = torch.randn(tensor.shape, generator=gen, dtype=torch.float32).to(tensor.dtype)
            infinite = ~torch.isfinite(tensor)
            tensor.add_(noise * NOISE_STD)
            if infinite.any():  # e.g. Gemma4's audio clipping bounds (+-inf): far, finite, random bounds
                tensor[infinite] = torch.sign(tensor[infinite]) * (1_000.0 + noise[infinite].abs())


def tiny_tokenizer() -> Any:
    """A word-level tokenizer over the tiny vocabulary: token ``<i>`` is id ``i`` (pad/unk ``<0>``, bos ``<1>``,
    eos ``<2>``). Bridge's ``save_hf_pretrained`` saves the source checkpoint's tokenizer (``AutoTokenizer``),
    so a checkpoint without one cannot be exported as a folder."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel(vocab={f"<{i}>": i for i in range(_VOCAB)}, unk_token="<0>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<0>", unk_token="<0>", bos_token="<1>",
                                   eos_token="<2>")


def rename_saved_tensors(directory: Path, prefixes: Mapping[str, str]) -> None:
    """Rewrite every ``*.safetensors`` file of ``directory`` with each tensor name's prefix in ``prefixes`` replaced
    (the file's index, if any, is rewritten to match); nothing to do without ``prefixes``."""
    import json

    from safetensors.torch import load_file, save_file

    if not prefixes:
        return

    def renamed(name: str) -> str:
        for old, new in prefixes.items():
            if name.startswith(old):
                return new + name[len(old):]
        return name

    for file in sorted(Path(directory).glob("*.safetensors")):
        tensors = load_file(str(file))
        save_file({renamed(k): v for k, v in tensors.items()}, str(file), metadata={"format": "pt"})
    for index in Path(directory).glob("*.safetensors.index.json"):
        data = json.loads(index.read_text(encoding="utf-8"))
        data["weight_map"] = {renamed(k): v for k, v in data.get("weight_map", {}).items()}
        index.write_text(json.dumps(data, indent=2), encoding="utf-8")


def write_tiny_hf_checkpoint(family: str, directory: Path, seed: int = 0) -> Path:
    """Write a tiny random HF checkpoint of tiny configuration ``family`` into ``directory``; returns it.

    The model class is built from :func:`hf_config` (initialised from ``torch.manual_seed(seed)``), every
    floating-point tensor gets seeded noise (:func:`randomize_`), and ``save_pretrained`` writes
    ``config.json``, ``generation_config.json`` and ``model.safetensors`` (float32), plus :func:`tiny_tokenizer`'s
    ``tokenizer.json`` / ``tokenizer_config.json``. No hub access.
    """
    directory = Path(directory)
    config = hf_config(family)
    cls = model_class(family)
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        with hf_model_context(family):
            model = cls(config)
    finally:
        torch.random.set_rng_state(state)
    model.eval()
    randomize_(dict(model.named_parameters()) | dict(model.named_buffers()), seed)
    directory.mkdir(parents=True, exist_ok=True)
    with hf_model_context(family):
        model.save_pretrained(directory, safe_serialization=True)
    rename_saved_tensors(directory, hf_family(family).published_prefixes)
    if hf_family(family).stored_as is not None:
        hf_family(family).stored_as(directory)
    if hf_family(family).extra_files is not None:
        hf_family(family).extra_files(directory)
    tiny_tokenizer().save_pretrained(directory)
    logger.info("wrote a tiny random %s checkpoint (%s) to %s", family, cls.__name__, directory)
    return directory


def cpu_provider(bridge: Any, family: str, *, load_weights: bool = True, **fields: Any) -> Any:
    """``bridge.to_megatron_provider(load_weights=...)`` set up for a CPU build and training, finalized.

    After Bridge's conversion only these change: the generic CPU fields (float32, no fused kernels), the MoE
    CPU fields when the model has experts, the family's :class:`HFFamily` ``cpu_fields``, the special token
    ids and CPU overrides of its train spec (tiny vocabulary), then ``fields`` (e.g. the freeze flags).
    """
    from bridge_freeze_harness.train import cannot_train_reason, train_spec

    provider = bridge.to_megatron_provider(load_weights=load_weights)
    settings: dict[str, Any] = dict(_CPU_FIELDS)
    if getattr(provider, "num_moe_experts", None):
        settings.update(_CPU_MOE)
        settings["moe_grouped_gemm"] = grouped_experts(family)
    settings.update(hf_family(family).cpu_fields(provider))
    if cannot_train_reason(family) is None:
        spec = train_spec(family)
        settings.update({**spec.token_ids, **spec.cpu_overrides})
    settings.update(fields)
    for name, value in settings.items():
        if not hasattr(provider, name):
            raise AttributeError(f"{type(provider).__name__} (converted from {family!r}) has no field {name!r}")
        setattr(provider, name, value)
    provider.finalize()
    return provider


# --- building a converted provider on the CPU -----------------------------------------------------------


@contextlib.contextmanager
def hf_build_patches(family: str) -> Iterator[None]:
    """What a build of a provider converted from ``family``'s checkpoint needs besides the tiny build context."""
    with contextlib.ExitStack() as stack:
        if grouped_experts(family):
            stack.enter_context(grouped_experts_on_cpu())
        yield


def build_hf_chunks(family: str, provider: Any) -> list[Any]:
    """Bare chunks of a converted provider through ``provide_distributed_model`` (Bridge's pre-wrap hooks run:
    the HF weights load) inside the family's tiny build context and :func:`hf_build_patches`."""
    from bridge_freeze_harness.tiny import build_tiny_chunks

    with hf_build_patches(family):
        return build_tiny_chunks(family, provider=provider)
