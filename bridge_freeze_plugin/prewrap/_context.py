"""The build context: everything a build needs to know about what was asked, computed once."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bridge_freeze_plugin.families import FamilySpec
from bridge_freeze_plugin.prewrap._counting import PartTally
from bridge_freeze_plugin.prewrap._origins import FlagOrigin, Source, flag_origins
from bridge_freeze_plugin.prewrap._provider import (
    model_name_of,
    overridden_defaults,
    provider_label,
    resolve_family,
    write_aliases_back,
)
from bridge_freeze_plugin.prewrap._report import DefaultOverride, FreezeReport
from bridge_freeze_plugin.prewrap._subclass_build import ADDED_ATTR
from bridge_freeze_plugin.request import INFO, AuditSettings, FreezeSelection, Part, asked_text, audit_settings

if TYPE_CHECKING:
    from bridge_freeze_plugin.request import PatternSummary


@dataclass(frozen=True)
class BuildContext:
    """What one build applies: the family, the selection, and how to name the provider and model."""

    family: FamilySpec | None
    selection: FreezeSelection
    provider_label: str = ""
    model_name: str | None = None
    overridden_defaults: tuple[DefaultOverride, ...] = ()
    #: One-line notes for the report: what the build adjusted, and why (e.g. vision-side recompute off).
    notes: tuple[str, ...] = ()
    #: Turn full activation recompute off in the family's ``no_full_recompute`` modules after the build.
    vision_recompute_off: bool = False
    #: What the build is when no optimizer can train it (``wrap_with_ddp=False``, the meta device); ``None``: a
    #: build wrapped for training. The report's first line says it.
    untrained: str | None = None
    #: What a further build wrapped for training of an already built provider is (NeMo-RL's reference policy);
    #: ``None``: its first. The report's first line says it.
    repeat: str | None = None
    #: flag -> the saved config (``run_config.yaml``) a flag set true came from (:mod:`._origins`)
    saved_flags: tuple[tuple[str, str], ...] = ()
    #: where each flag of the family's parts got its value (:mod:`._origins`), in vocabulary order
    flag_origins: tuple[FlagOrigin, ...] = ()
    #: the run-time audit of a training build (``audit_steps``, ``audit_strict`` and their variables)
    audit: AuditSettings = field(default_factory=AuditSettings)

    @classmethod
    def of(cls, provider: Any, selection: FreezeSelection | None = None) -> BuildContext:
        """Read the provider once. Raises ``UnsupportedFreezeFlagError`` for a flag no family can honour."""
        from_provider = selection is None
        selection = FreezeSelection.from_object(provider) if selection is None else selection
        family = resolve_family(provider, selection)
        flags = [INFO[part].flag for part in family.part_names()] if family is not None else []
        origins = flag_origins(provider, {flag: getattr(selection, flag) for flag in flags})
        audit = audit_settings(provider, provider_label(provider))  # a malformed value fails before the build
        if from_provider:
            write_aliases_back(provider, selection)  # what Bridge saves of the provider says what was built
        return cls(
            family=family,
            selection=selection,
            provider_label=provider_label(provider),
            model_name=model_name_of(provider),
            overridden_defaults=overridden_defaults(provider),
            saved_flags=tuple((o.flag, o.path) for o in origins if o.source is Source.SAVED and o.value and o.path),
            flag_origins=origins,
            audit=audit,
        )

    def wants_trainable(self, name: str, part: Part | None, param: Any = None) -> bool | None:
        """Whether the parameter ``name`` of ``part`` must train (``None``: not governed by the selection).

        The one rule the freeze applies and the guarantee checks: a part whose flag is set is frozen, the
        other parts train; then the patterns, on the model-wide ``name``: a train pattern trains, else a
        freeze pattern freezes (:mod:`bridge_freeze_plugin.request._patterns`). ``other`` and unclassified parameters
        are left alone. A parameter a provider subclass's ``provide()`` added (``param`` carries
        :data:`~._subclass_build.ADDED_ATTR`) keeps what the subclass gave it in place of the flag's word.
        """
        if part is None or part is Part.OTHER:
            return None
        given = getattr(param, ADDED_ATTR, None) if param is not None else None
        flag_trains = part not in self.selection.frozen_parts() if given is None else bool(given)
        patterns = self.selection.patterns
        return patterns.decide(name, flag_trains) if patterns else flag_trains

    @property
    def asked(self) -> str:
        """``"freeze_vision_model=True on Qwen3VLModelProvider (Qwen/...)"``, for messages."""
        model = f" ({self.model_name})" if self.model_name else ""
        return f"{asked_text(self.selection) or 'no freeze flag'} on {self.provider_label or 'the model'}{model}"

    @property
    def parts(self) -> tuple[Part, ...] | None:
        """The family's parts (``None``: no family)."""
        return None if self.family is None else self.family.part_names()

    def describe(self) -> str:
        """What trains at full rank, of the family's parts (``"train vision_projection"``)."""
        return self.selection.describe(self.parts)

    def report(self, tally: PartTally, patterns: PatternSummary | None = None) -> FreezeReport:
        assert self.family is not None
        return FreezeReport(
            family=self.family.name,
            provider=self.provider_label,
            model_name=self.model_name,
            selection=self.selection,
            parts=tally.parts(self.family.part_names()),
            overridden_defaults=self.overridden_defaults,
            notes=self.notes,
            patterns=patterns,
            untrained=self.untrained,
            repeat=self.repeat,
            saved_flags=self.saved_flags,
            flag_origins=self.flag_origins,
        )
