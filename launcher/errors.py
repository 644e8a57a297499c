"""Typed errors. Every front end turns an :class:`AffrunError` into one line and a non-zero exit."""

from __future__ import annotations


class AffrunError(Exception):
    """Base class of every error affrun reports to the user as one line."""

    exit_code = 2


class TopologyError(AffrunError):
    """The topology source (sysfs tree, snapshot, XML) is missing or unusable."""


class PlanError(AffrunError):
    """The request cannot be satisfied on this topology (too many ranks, bad GPU index...)."""


class LaunchError(AffrunError):
    """Applying a plan or starting a process failed."""


class ConfigError(AffrunError):
    """A configuration file or option value is invalid."""
