"""The former module of config validation (docs before the subsystems named it): forwards to its face."""

from bridge_freeze_plugin.config import *  # noqa: F403
from bridge_freeze_plugin.config import __all__  # noqa: F401
