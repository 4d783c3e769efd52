"""Typed errors. Every message names what was asked, on which model, and what to do instead."""

from __future__ import annotations


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


class InvalidFreezeConfigError(BridgeFreezeError, ValueError):
    """A training configuration asks for a freeze selection that cannot be honoured."""


class FreezeFlagTypeError(InvalidFreezeConfigError, TypeError):
    """A freeze flag holds something other than a real bool (``1``, ``"yes"``, ``None``...)."""
