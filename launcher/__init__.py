"""affrun: put every training rank on the right CPU cores. The public API is loaded lazily, on first use."""

from __future__ import annotations

from typing import Any

from launcher.base.version import __version__

_LAZY = {
    "Topology": "launcher.topology.model",
    "load_topology": "launcher.topology",
    "Request": "launcher.plan.planner",
    "Plan": "launcher.plan.planner",
    "RankPlan": "launcher.plan.planner",
    "make_plan": "launcher.plan.planner",
    "rank_environment": "launcher.env.policy",
    "ensure_affinity": "launcher.ensure",
    "worker_init_fn": "launcher.torch",
    "AffrunError": "launcher.base.errors",
    "AffinityExecutor": "launcher.submitit",
    "current_binding": "launcher.bind.readback",
    "bind_rank": "launcher.bind.inprocess",
    "BindReport": "launcher.bind.inprocess",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'launcher' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
