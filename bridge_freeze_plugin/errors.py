"""Every error type the plugin raises on purpose, in one place.

Each message names what was asked, on which model, and what to do instead. The hierarchy::

    BridgeFreezeError
    ├── FamilyRegistrationError (ValueError)    a malformed or duplicate family
    ├── UnknownFamilyError (KeyError)           a family name nobody registered
    ├── UnsupportedFreezeFlagError (ValueError) a flag on a provider no family covers
    ├── UnclassifiedParameterError (RuntimeError) a parameter under no prefix while a flag is set
    ├── FreezeGuaranteeError (RuntimeError)     after the pre-wrap hooks, what trains is not what was asked
    ├── LoraOverlapError (RuntimeError)         LoRA adapters on a parameter meant to train at full rank
    ├── UnadaptableLoraTargetError (ValueError) a LoRA target matches a module LoRA cannot adapt (a Conv3d)
    ├── AdapterExportError (RuntimeError)       an adapter-only export would lose full-rank parts
    ├── EmptyPartError (RuntimeError)           a part with no parameter in the whole model (a wrong table)
    ├── UnmatchedPatternError (ValueError)      a train/freeze pattern that matches no parameter of the whole model
    ├── PeerRankFreezeError (RuntimeError)      another rank failed while the model was built
    ├── InvalidFreezeConfigError (ValueError)   a training config asks for what cannot be honoured
    │   ├── FreezeFlagTypeError (TypeError)     a flag that is not a real bool
    │   ├── InvalidPatternError                 a train/freeze pattern that is not a valid regular expression
    │   ├── PartLearningRateError               a per-part learning rate that is invalid or would not apply
    │   ├── ConfigLoadError                     a config file, override or defaults list that cannot be read
    │   └── SelectionChangedError               a resume with optimizer state from a checkpoint of another selection
    ├── TrainableSyncError (RuntimeError)       a trainable-only weight sync cannot limit this export safely
    ├── TrainingAuditError (RuntimeError)       strict audit: a trainable tensor got no gradient in the audited steps
    ├── FrozenPartTrainedError (RuntimeError)   at run time, a frozen tensor got a gradient or changed
    ├── PlanError (ValueError)                  ``bridge-freeze plan`` cannot make a plan
    └── CommandError (ValueError)               a ``bridge-freeze`` sub-command cannot do what its arguments ask
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


class BridgeFreezeError(Exception):
    """Base class of every error the plugin raises on purpose."""


class FamilyRegistrationError(BridgeFreezeError, ValueError):
    """A family spec is malformed, or its name / provider class is already registered."""


class UnknownFamilyError(BridgeFreezeError, KeyError):
    """A family name that is not registered was asked for."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0]) if self.args else ""


class UnsupportedFreezeFlagError(BridgeFreezeError, ValueError):
    """A freeze flag was set on a provider whose model family the registry does not know."""


class UnclassifiedParameterError(BridgeFreezeError, RuntimeError):
    """While a flag is set, some parameters fall in no part of the model family (we never guess)."""


@dataclass(frozen=True)
class Violation:
    """One parameter whose trainability departs from the selection after the pre-wrap hooks."""

    name: str
    requires_grad: bool
    why: str


class FreezeGuaranteeError(BridgeFreezeError, RuntimeError):
    """After the pre-wrap hooks ran, the trainable parameters are not what the selection promised.

    ``violations`` lists every disagreeing parameter (the message shows the first few).
    """

    def __init__(self, message: str, violations: Sequence[Violation] = ()) -> None:
        super().__init__(message)
        self.violations: tuple[Violation, ...] = tuple(violations)


class LoraOverlapError(BridgeFreezeError, RuntimeError):
    """LoRA put adapters on (wrapped or replaced) parameters that the selection trains at full rank.

    ``parameters`` lists every one of them (the message shows the first few).
    """

    def __init__(self, message: str, parameters: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.parameters: tuple[str, ...] = tuple(parameters)


class UnexportableAdapterError(BridgeFreezeError, RuntimeError):
    """LoRA put adapters on plain ``torch.nn.Linear`` modules (HF-implemented towers) as bare ``LinearAdapter``
    copies (Bridge up to 0.6.2), whose training none of Bridge's exports carries (the merged HF export merges
    ``to_wrap`` bases only). A Bridge whose LoRA keeps the layer as ``to_wrap`` (0.7.0) is not refused.

    ``modules`` lists every one of them (the message shows the first few).
    """

    def __init__(self, message: str, modules: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.modules: tuple[str, ...] = tuple(modules)


class UnadaptableLoraTargetError(BridgeFreezeError, ValueError):
    """A LoRA ``target_modules`` entry matches modules Bridge's LoRA cannot adapt (a patch embedding's Conv3d, a
    norm, a container module): Bridge raises ``NotImplementedError`` naming neither. ``modules`` lists every one
    of them as ``name (type)``; ``targets`` the entries that match them."""

    def __init__(self, message: str, modules: Sequence[str] = (), targets: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.modules: tuple[str, ...] = tuple(modules)
        self.targets: tuple[str, ...] = tuple(targets)


class AdapterExportError(BridgeFreezeError, RuntimeError):
    """An adapter-only export of a LoRA run that also trains full-rank parts (they would be lost)."""


class EmptyPartError(BridgeFreezeError, RuntimeError):
    """While a flag is set, one of the family's parts has no parameter in the whole model: a wrong family table."""


class NothingTrainsError(BridgeFreezeError, ValueError):
    """A build wrapped for training would train no parameter at all (every part frozen by flags or patterns, no
    adapters): Bridge's optimizer would then have no parameter group. Refused at the build, on every rank."""


class UnmatchedPatternError(BridgeFreezeError, ValueError):
    """A train / freeze pattern matches no parameter of any part in the whole model (a typo, most often).

    ``patterns`` lists the unmatched patterns; ``suggestions`` maps each to the nearest real names.
    """

    def __init__(self, message: str, patterns: Sequence[str] = (), suggestions: dict[str, list[str]] | None = None):
        super().__init__(message)
        self.patterns: tuple[str, ...] = tuple(patterns)
        self.suggestions: dict[str, list[str]] = dict(suggestions or {})


class PeerRankFreezeError(BridgeFreezeError, RuntimeError):
    """Another rank failed while the model was built (with an error that is not one of the plugin's)."""


class InvalidFreezeConfigError(BridgeFreezeError, ValueError):
    """A training configuration asks for a freeze selection that cannot be honoured."""


class FreezeFlagTypeError(InvalidFreezeConfigError, TypeError):
    """A freeze flag holds something other than a real bool (``1``, ``"yes"``, ``None``...)."""


class PartNotInFamilyError(InvalidFreezeConfigError):
    """A flag set for a part the model's family does not have (``freeze_audio_model`` on a model with no audio
    encoder, ``freeze_vision_model`` on an audio-language model)."""


class InvalidPatternError(InvalidFreezeConfigError):
    """A ``train_patterns`` / ``freeze_patterns`` entry that is not a non-empty string holding a valid regex."""


class PartLearningRateError(InvalidFreezeConfigError):
    """A per-part learning rate that is malformed, set for a frozen part, or that the optimizer would not apply.

    Raised when the config is read, when the optimizer's parameter groups are made, and when they are checked
    after the optimizer is built: a configured learning rate is never silently ignored.
    """


class TrainableSyncError(BridgeFreezeError, RuntimeError):
    """A trainable-only weight sync (``export_trainable_hf_weights``) was asked for an export it cannot limit safely."""


class TrainingAuditError(BridgeFreezeError, RuntimeError):
    """Strict run-time audit: a trainable tensor got no gradient in any audited step (raised on every rank)."""


class FrozenPartTrainedError(BridgeFreezeError, RuntimeError):
    """At run time, a frozen tensor (or one at learning rate 0) got a gradient or changed (raised on every rank)."""


class PlanError(BridgeFreezeError, ValueError):
    """A plan cannot be made (unknown model, unreadable config, a build that fails...)."""


class ConfigLoadError(InvalidFreezeConfigError):
    """A config file, an override or a defaults list that cannot be read as written (never dropped silently)."""


@dataclass(frozen=True)
class SelectionChange:
    """One setting of the selection that differs between a checkpoint's ``run_config.yaml`` and this run."""

    key: str
    saved: bool | tuple[str, ...]
    run: bool | tuple[str, ...]


class SelectionChangedError(InvalidFreezeConfigError):
    """A run resumes, optimizer state included, from a checkpoint saved with another selection (other flags or
    patterns): the optimizer state was built for the parameters that selection trained. Refused before the load, on
    every rank. ``path`` is the checkpoint's ``run_config.yaml``; ``changes`` every setting that differs."""

    def __init__(self, message: str, path: str = "", changes: Sequence[SelectionChange] = ()) -> None:
        super().__init__(message)
        self.path = path
        self.changes: tuple[SelectionChange, ...] = tuple(changes)


class TrainableOnlyCheckpointError(InvalidFreezeConfigError):
    """A trainable-only checkpoint (``save_trainable_only``) cannot be saved or loaded as asked: the field is set
    without a frozen base (``checkpoint.pretrained_checkpoint``), or such a checkpoint is loaded without its base or
    on another one. Refused before anything trains (never a model with random frozen weights). ``checkpoint`` is the
    checkpoint directory concerned, ``base`` the base it was saved on (``''``: none recorded), ``given`` this run's
    ``checkpoint.pretrained_checkpoint`` (``''``: none)."""

    def __init__(self, message: str, checkpoint: str = "", base: str = "", given: str = "") -> None:
        super().__init__(message)
        self.checkpoint = checkpoint
        self.base = base
        self.given = given


class RecipeError(BridgeFreezeError, ValueError):
    """A Megatron-Bridge recipe (``--recipe NAME``) cannot be run or read as asked: no recipe of that name
    (``nearest``: the closest names), a ``config.json`` nothing offline holds, an override Bridge refuses, or the
    plugin's reading of the result disagreeing with Bridge's. ``recipe`` is the name asked for."""

    def __init__(self, message: str, recipe: str = "", nearest: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.recipe = recipe
        self.nearest: tuple[str, ...] = tuple(nearest)


class CommandError(BridgeFreezeError, ValueError):
    """A ``bridge-freeze`` sub-command cannot do what its arguments ask (printed as one line, exit code 2)."""


def some_of(names: Sequence[str], limit: int) -> str:
    """``names`` for a message: the first ``limit``, comma-separated, then ``(and N more)`` when there are more."""
    more = f" (and {len(names) - limit} more)" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more
