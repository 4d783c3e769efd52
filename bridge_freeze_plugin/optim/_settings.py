"""Per-part learning rates as asked: read and checked from a mapping, no torch, no Megatron.

Keys (under ``megatron_config`` in the SFT and RL layouts; every one optional)::

    lr_language_model      min_lr_language_model
    lr_vision_model        min_lr_vision_model
    lr_vision_projection   min_lr_vision_projection
    lr_audio_model         min_lr_audio_model
    lr_audio_projection    min_lr_audio_projection
    lr_adapters            min_lr_adapters          (LoRA's adapters, every part's)

Unset means the global schedule. A set ``lr_<part>`` without ``min_lr_<part>`` keeps the global
schedule's shape: its minimum is ``lr_<part> * min_lr / lr`` (so ``0.0`` stays ``0.0`` all along).
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from bridge_freeze_plugin.errors import PartLearningRateError
from bridge_freeze_plugin.request import INFO, SELECTABLE_PARTS, VOCABULARY, Part, type_name

#: The LR "part" of LoRA's adapters (parameters a PEFT hook added; they carry no part of their own).
ADAPTERS = "adapters"
#: Every part a learning rate can be set for, in the order reports list them.
LR_PARTS: tuple[str, ...] = (*(p.value for p in SELECTABLE_PARTS), ADAPTERS)
#: The config keys, ``lr_<part>`` and ``min_lr_<part>``.
LR_KEYS: tuple[str, ...] = tuple(f"{kind}_{part}" for part in LR_PARTS for kind in ("lr", "min_lr"))


@dataclass(frozen=True)
class PartLR:
    """One part's asked learning rate: peak ``lr`` and, when given, ``min_lr``."""

    part: str
    lr: float
    min_lr: float | None = None

    def resolve(self, global_lr: float | None, global_min_lr: float | None) -> tuple[float, float]:
        """``(max_lr, min_lr)`` this part trains with, next to the global schedule's peak and minimum."""
        if self.min_lr is not None:
            return self.lr, self.min_lr
        if global_lr is None or global_lr == 0.0 or global_min_lr is None:
            return self.lr, 0.0 if global_min_lr is None else min(global_min_lr, self.lr)
        return self.lr, self.lr * (global_min_lr / global_lr)

    def describe(self) -> str:
        low = "" if self.min_lr is None else f", min {self.min_lr:g}"
        return f"{self.part}: lr {self.lr:g}{low}"


@dataclass(frozen=True)
class PartLearningRates:
    """The per-part learning rates of a run (empty: every part follows the global schedule)."""

    parts: tuple[PartLR, ...] = field(default=())

    def __bool__(self) -> bool:
        return bool(self.parts)

    def get(self, part: str) -> PartLR | None:
        return next((p for p in self.parts if p.part == part), None)

    def names(self) -> tuple[str, ...]:
        return tuple(p.part for p in self.parts)

    def resolved(self, global_lr: float | None, global_min_lr: float | None) -> dict[str, tuple[float, float]]:
        """part -> ``(max_lr, min_lr)`` for every part with a learning rate of its own."""
        return {p.part: p.resolve(global_lr, global_min_lr) for p in self.parts}

    def as_dict(self) -> dict[str, float]:
        """The config keys that are set, with their values (what :func:`read_part_learning_rates` reads)."""
        out: dict[str, float] = {}
        for p in self.parts:
            out[f"lr_{p.part}"] = p.lr
            if p.min_lr is not None:
                out[f"min_lr_{p.part}"] = p.min_lr
        return out

    def describe(self) -> str:
        return "; ".join(p.describe() for p in self.parts) or "every part on the global schedule"

    @classmethod
    def of(cls, **values: float | None) -> PartLearningRates:
        """From keyword arguments named as the config keys (``lr_vision_projection=1e-3``...), checked."""
        return read_part_learning_rates({k: v for k, v in values.items() if v is not None}, where="")


def _number(value: Any, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PartLearningRateError(
            f"{key} must be a number (a learning rate such as 1e-4, or 0.0), got {value!r} of type "
            f"{type_name(value)}; write it as a number"
        )
    number = float(value)
    if not math.isfinite(number) or number < 0.0:
        raise PartLearningRateError(f"{key}={value!r}: a learning rate must be finite and >= 0; set it to e.g. 1e-4")
    return number


#: A key shaped like a learning rate: ``lr_...`` / ``min_lr_...`` / ``learning_rate_...``, or ``..._lr`` /
#: ``..._learning_rate`` (any case, ``-`` or ``_``). Such a key in a section that holds per-part learning rates is
#: one of :data:`LR_KEYS`, or an error: it would otherwise be ignored.
_LR_SHAPE = re.compile(r"^(min[_-]?)?(lr|learning[_-]?rate)[_-]|[_-](lr|learning[_-]?rate)$", re.IGNORECASE)
#: The same in camelCase (``lrVision``, ``minLrVision``, ``visionLr``, ``learningRateLlm``).
_LR_CAMEL = re.compile(r"^(min_?)?(lr|Lr|LR|learningRate|LearningRate)[A-Z0-9]|[a-z0-9](Lr|LR|LearningRate)$")
#: The parts of each role, from the vocabulary: the projections, and the encoders (a part other than the language
#: model that holds linear layers).
_PROJECTIONS = tuple(info.name for info in VOCABULARY if info.projection)
_ENCODERS = tuple(info.name for info in VOCABULARY if info.linear and info.optional)


def _vocabulary_words() -> dict[str, tuple[str, ...]]:
    """Each part's own words: its name, its label (``vision_encoder``), its first word for an encoder
    (``audio``), and Bridge's names of its flag (``sound_encoder``)."""
    words: dict[str, tuple[str, ...]] = {}
    for info in VOCABULARY:
        own = [info.name, info.label.replace(" ", "_"), *(a.removeprefix("freeze_") for a in info.aliases)]
        if info.name in _ENCODERS:
            own.append(info.name.split("_")[0])
        words.update(dict.fromkeys(own, (info.name,)))
    return words


#: Words users write for a part (after ``lr_``), and the parts they may mean, most likely first: the guess is the
#: first of them the model has (``projection`` is the vision projection of a VLM, the audio one of Qwen2-Audio).
_PART_WORDS: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(("visual", "vit", "vision_tower", "image_encoder", "vision_models", "visual_encoder"),
                    ("vision_model",)),
    **dict.fromkeys(("merger", "vision_proj", "vision_projector"), ("vision_projection",)),
    **dict.fromkeys(("sound", "speech", "audio_tower", "speech_encoder", "whisper"), ("audio_model",)),
    **dict.fromkeys(("audio_proj", "audio_projector", "sound_proj", "sound_projector"), ("audio_projection",)),
    **dict.fromkeys(("encoder", "tower"), _ENCODERS),
    **dict.fromkeys(("projector", "projection", "proj", "mm_projector", "connector", "multi_modal_projector",
                     "mlp_projector"), _PROJECTIONS),
    **dict.fromkeys(("llm", "lm", "language", "text", "decoder", "backbone", "text_model"), ("language_model",)),
    **dict.fromkeys(("lora", "adapter", "adapters", "peft", "lora_adapters"), (ADAPTERS,)),
    **_vocabulary_words(),
}
_FILLER = frozenset({"lr", "min", "learning", "rate", "max", "peak"})


#: The global schedule's own names: not per-part keys, never refused as unknown ones. Every field of Bridge 0.6.2's
#: ``OptimizerConfig`` / ``SchedulerConfig`` shaped like a learning rate (a trainer's ``megatron_config`` passes them
#: on: ``lr_decay_style``...); ``tests/unit/optim/test_learning_rates.py`` checks the list against Bridge's dataclasses.
MEGATRON_LR_SETTINGS = frozenset({
    "lr", "min_lr", "decoupled_lr", "decoupled_min_lr", "lr_decay_iters", "lr_decay_samples", "lr_decay_steps",
    "lr_decay_style", "lr_warmup_fraction", "lr_warmup_init", "lr_warmup_iters", "lr_warmup_samples",
    "lr_warmup_steps", "lr_wsd_decay_iters", "lr_wsd_decay_samples", "lr_wsd_decay_style",
})
_GLOBAL_LR_KEYS = MEGATRON_LR_SETTINGS


def looks_like_lr_key(key: object) -> bool:
    """Whether ``key`` is shaped like a per-part learning-rate key (:data:`LR_KEYS` are the ones that are read)."""
    return isinstance(key, str) and key not in _GLOBAL_LR_KEYS and (
        key in LR_KEYS or _LR_SHAPE.search(key) is not None or _LR_CAMEL.search(key) is not None)


def _lr_parts(parts: Iterable[str | Part] | None) -> tuple[str, ...]:
    """The LR parts of a model with ``parts`` (``None``: every part), adapters included, in vocabulary order."""
    if parts is None:
        return LR_PARTS
    names = {str(p) for p in parts}  # a Part is its name
    return (*(p for p in LR_PARTS if p in names), ADAPTERS)


def _keys(parts: Iterable[str]) -> list[str]:
    return [f"{kind}_{part}" for part in parts for kind in ("lr", "min_lr")]


def _meaning(key: str, available: tuple[str, ...]) -> tuple[str, tuple[str, ...]] | None:
    """``(kind, parts it may mean)`` for a key written with a part's word (``lr_llm``, ``visionLr``), if any."""
    low = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", key).lower().replace("-", "_")
    tokens = [t for t in low.split("_") if t]
    kind = "min_lr" if "min" in tokens else "lr"
    words = "_".join(t for t in tokens if t not in _FILLER)
    if not words:
        return None
    if words in _PART_WORDS:
        return kind, _PART_WORDS[words]
    known = [*available, *(w for w, meant in _PART_WORDS.items() if set(meant) & set(available))]
    close = difflib.get_close_matches(words, known, n=1, cutoff=0.75)
    return (kind, _PART_WORDS.get(close[0], (close[0],))) if close else None


def suggest_lr_key(key: str, parts: Iterable[str | Part] | None = None) -> str | None:
    """The per-part learning-rate key ``key`` most likely means (``lr_llm`` -> ``lr_language_model``), if any, of
    a model with ``parts`` (``None``: any part): never a key of a part the model does not have."""
    available = _lr_parts(parts)
    low = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", key).lower().replace("-", "_")
    if low in _keys(available):
        return low
    meant = _meaning(key, available)
    if meant is not None:
        part = next((p for p in meant[1] if p in available), None)
        return None if part is None else f"{meant[0]}_{part}"
    close = difflib.get_close_matches(low, _keys(available), n=1, cutoff=0.6)
    return close[0] if close else None


def _absent_part(key: str, available: tuple[str, ...]) -> str | None:
    """The part ``key`` names when it is one the model does not have (``lr_audio`` on a VLM), else ``None``."""
    meant = _meaning(key, available)
    if meant is None or any(p in available for p in meant[1]):
        return None
    return " or ".join(INFO[Part(p)].label for p in meant[1] if p != ADAPTERS) or None


def _unknown_keys(section: Mapping[str, Any], prefix: str, parts: Iterable[str | Part] | None = None,
                  model: str = "the model") -> None:
    """Every key shaped like a learning rate that names no part is refused (it would be ignored), with a guess
    among the keys of the model's own ``parts`` (``None``: every part)."""
    available = _lr_parts(parts)
    problems = []
    for key in section:
        if not looks_like_lr_key(key) or key in LR_KEYS:
            continue
        guess = suggest_lr_key(str(key), available)
        absent = None if guess else _absent_part(str(key), available)
        hint = (f"did you mean {prefix}{guess}? " if guess else
                f"it would be the {absent}, which {model} does not have. " if absent else "")
        problems.append(f"{prefix}{key} is not a per-part learning rate key (it names no part, so it would be "
                        f"ignored): {hint}The keys{'' if parts is None else f' of {model}'} are "
                        f"{', '.join(_keys(available))}")
    if len(problems) == 1:
        raise PartLearningRateError(problems[0])
    if problems:
        raise PartLearningRateError(f"{len(problems)} unknown per-part learning rate keys:\n"
                                    + "\n".join(f"  - {p}" for p in problems))


def _part_lr(section: Mapping[str, Any], part: str, prefix: str) -> PartLR | None:
    lr_key, min_key = f"lr_{part}", f"min_lr_{part}"
    lr = section.get(lr_key)
    low = section.get(min_key)
    if lr is None:
        if low is not None:
            raise PartLearningRateError(
                f"{prefix}{min_key}={low!r} is set without {prefix}{lr_key}: a part's minimum needs its own "
                f"peak; set {prefix}{lr_key} too, or remove {prefix}{min_key}"
            )
        return None
    peak = _number(lr, prefix + lr_key)
    minimum = None if low is None else _number(low, prefix + min_key)
    if minimum is not None and minimum > peak:
        raise PartLearningRateError(
            f"{prefix}{min_key}={low!r} is above {prefix}{lr_key}={lr!r}: the schedule decays from the peak to "
            f"the minimum; lower {prefix}{min_key} to at most {peak:g}"
        )
    return PartLR(part, peak, minimum)


def read_part_learning_rates(
    section: Mapping[str, Any] | None,
    *,
    where: str = "megatron_config",
    frozen: Iterable[str | Part] = (),
    lora: bool | None = None,
    flags_where: str | None = None,
    parts: Iterable[str | Part] | None = None,
    model: str = "the model",
) -> PartLearningRates:
    """Read and check the per-part learning rates of one config section (e.g. ``megatron_config``).

    ``where`` is the section's dotted path, for messages (``trainer.policy.megatron_config`` in RL).
    ``frozen``: the parts that will not train: frozen by their flag and reached by no train pattern (pass
    ``FreezeSelection.untrained_parts()``, not ``frozen_parts()``: a train pattern inside a frozen part makes it
    train); an LR for one of them is an error naming it.
    ``lora``: whether LoRA is on (``None``: unknown, not checked); ``lr_adapters`` without LoRA is an error.
    ``flags_where``: the section holding the freeze flags, when it is not ``where`` (Bridge: ``model``).
    ``parts``: the parts of the model (its family's; ``None``: unknown), ``model`` how to name it: a key that names
    no part is answered from the model's own parts (never "did you mean" a part it does not have).
    Raises :class:`~bridge_freeze_plugin.errors.PartLearningRateError` (an ``InvalidFreezeConfigError``)
    naming the key: a value that is not a number (``True``, ``"1e-4"``, ``None`` for a minimum alone), a
    negative or non-finite one, a minimum above its peak or without a peak, a key shaped like a learning rate
    that names no part (``lr_vision``, ``lr_llm``, ``vision_lr``: "did you mean").
    """
    section = section or {}
    prefix = f"{where}." if where else ""
    _unknown_keys(section, prefix, parts, model)
    parts = tuple(p for p in (_part_lr(section, part, prefix) for part in LR_PARTS) if p is not None)
    frozen_names = {Part(p).value for p in frozen}
    flag_prefix = prefix if flags_where is None else (f"{flags_where}." if flags_where else "")
    for p in parts:
        if p.part in frozen_names:
            raise PartLearningRateError(
                f"{prefix}lr_{p.part} is set, but the {p.part} is frozen ({flag_prefix}freeze_{p.part}=true): a frozen "
                f"part does not train, so its learning rate would never apply"
                + ("; with LoRA its adapters train: set lr_adapters instead" if lora else "")
                + f"; remove {prefix}lr_{p.part} or unset the flag"
            )
        if p.part == ADAPTERS and lora is False:
            raise PartLearningRateError(
                f"{prefix}lr_adapters is set, but LoRA is off: there are no adapters to train; turn LoRA on or "
                f"remove {prefix}lr_adapters"
            )
    return PartLearningRates(parts)
