"""The errors affrun raises, under the name its users import them by (``launcher.errors.ConfigError``); they live
in :mod:`launcher.base.errors`, below every layer that raises them."""

from launcher.base.errors import (
    LINE_LIMIT,
    AffrunError,
    ConfigError,
    LaunchError,
    Opt,
    PlanError,
    RankCountMismatch,
    TopologyError,
    error_line,
    one_line,
)

__all__ = [
    "LINE_LIMIT",
    "AffrunError",
    "ConfigError",
    "LaunchError",
    "Opt",
    "PlanError",
    "RankCountMismatch",
    "TopologyError",
    "error_line",
    "one_line",
]
