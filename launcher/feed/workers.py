"""How many DataLoader workers a rank is given: ``--loader-workers N`` (``AFFRUN_LOADER_WORKERS``), else the plan's
suggestion, one per loader core of the rank (``AFFRUN_LOADER_CPUS``, grouped into cores by the rank's sysfs)."""

from __future__ import annotations

from collections.abc import Mapping

from launcher.base.cpulist import MAX_COUNT, parse_cpulist
from launcher.base.errors import LaunchError
from launcher.base.siblings import live_cores
from launcher.base.untrusted import ascii_uint, short

WORKERS_VARIABLE = "AFFRUN_LOADER_WORKERS"
LOADER_VARIABLE = "AFFRUN_LOADER_CPUS"


def loader_cores(environ: Mapping[str, str], sysfs: str = "/sys") -> int:
    """The number of cores among the rank's loader CPUs (0 when it has none)."""
    text = environ.get(LOADER_VARIABLE, "")
    try:
        cpus = parse_cpulist(text) if text else frozenset()
    except ValueError:
        raise LaunchError(f"{LOADER_VARIABLE}={short(text)} is not a cpu list") from None
    return len(live_cores(cpus, sysfs))


def suggested_workers(environ: Mapping[str, str], sysfs: str = "/sys") -> int:
    """``AFFRUN_LOADER_WORKERS`` when set (``--loader-workers``), else :func:`loader_cores`."""
    text = environ.get(WORKERS_VARIABLE)
    if text is None or text == "":
        return loader_cores(environ, sysfs)
    value = ascii_uint(text)
    if value is None or value > MAX_COUNT:  # --loader-workers' own bound: a rank never starts 10**20 workers
        raise LaunchError(f"{WORKERS_VARIABLE}={short(text)} is not a whole number from 0 to {MAX_COUNT}")
    return value
