"""Option bundles shared by the click commands (plain decorators, as in sqlite-utils)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from launcher.env import BIND_MODES, POLICIES
from launcher.options import MEM_POLICIES, PlanOptions
from launcher.plan import GPU_ORDERS, MODES

F = TypeVar("F", bound=Callable[..., Any])


def topology_options(func: F) -> F:
    for option in reversed(
        [
            click.option("--fsroot", metavar="DIR", envvar="AFFRUN_FSROOT",
                         help="Read sys/ and proc/ under DIR instead of / (hwloc's test-tarball layout)."),
            click.option("--topology", "topology_file", metavar="FILE",
                         help="Load a saved topology: affrun JSON snapshot or hwloc XML (lstopo --of xml)."),
            click.option("--cpus", metavar="LIST", help="Restrict the allowed CPUs further (cpulist, e.g. 0-7,64-71)."),
        ]
    ):
        func = option(func)
    return func


def plan_options(func: F) -> F:
    for option in reversed(
        [
            click.option("--mode", type=click.Choice(MODES), default="exclusive", show_default=True,
                         help="exclusive: disjoint cores per rank; numa/socket: share the GPU's node/package; "
                              "l3: whole L3 groups; map: explicit --map."),
            click.option("--smt", is_flag=True, help="Count every hardware thread in OMP_NUM_THREADS."),
            click.option("--reserve", metavar="LIST", help="Keep the cores of these CPUs for the OS (e.g. 0)."),
            click.option("--loader-cores", type=click.IntRange(min=0), default=0, show_default=True,
                         help="Cores of each rank set aside for DataLoader workers."),
            click.option("--gpu-order", type=click.Choice(GPU_ORDERS), default="rank", show_default=True,
                         help="rank: rank i uses visible GPU i; closest: rank i takes the i-th CPU region and its GPU."),
            click.option("--map", "cpu_map", metavar="LISTS", help="Explicit CPUs per rank, separated by ';' (':' inside a list is the kernel's group syntax, "
                              "0-15:2/4): '0-7;8-15'."),
            click.option("--gpus", metavar="LIST", help="Explicit visible GPU per rank: '0,1,2,3'."),
            click.option("--no-gpu", is_flag=True, help="Plan a CPU-only job even where GPUs exist."),
        ]
    ):
        func = option(func)
    return func


def env_options(func: F) -> F:
    for option in reversed(
        [
            click.option("--omp-bind", type=click.Choice(BIND_MODES), default="rank", show_default=True,
                         help="rank: one OpenMP place per rank (safe for DataLoader workers); core: one per core."),
            click.option("--env-policy", type=click.Choice(POLICIES), default="safe", show_default=True,
                         help="What to do with OMP/KMP/MKL variables the user already set."),
            click.option("--mem-policy", type=click.Choice(MEM_POLICIES), default="auto", show_default=True,
                         help="Memory policy of each rank (auto: preferred on multi-NUMA machines, else none)."),
        ]
    ):
        func = option(func)
    return func


def plan_options_from(kwargs: dict[str, Any]) -> PlanOptions:
    """Pop the plan options out of a click kwargs dict."""
    return PlanOptions(
        mode=kwargs.pop("mode"),
        smt=kwargs.pop("smt"),
        reserve=kwargs.pop("reserve"),
        loader_cores=kwargs.pop("loader_cores"),
        gpu_order=kwargs.pop("gpu_order"),
        cpu_map=kwargs.pop("cpu_map"),
        gpus=kwargs.pop("gpus"),
        no_gpu=kwargs.pop("no_gpu"),
    )
