"""Corrupted inputs for the fuzz tests: the sysfs trees, their mutations, and a bound on each example."""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from launcher.base.choices import MODES
from launcher.base.cpulist import MAX_CPU_ID, MAX_NODE_ID
from launcher.bind.handoff import ParentPlan
from launcher.env.policy import rank_environment
from launcher.errors import AffrunError
from launcher.plan.planner import Plan, Request, make_plan
from launcher.topology import Topology
from launcher.topology.snapshot import from_snapshot, to_snapshot
from tests.conftest import FIXTURES, extract_tarball, link_tree, need
from tests.plan_check import check_handoff

LONG = int(os.environ.get("AFFRUN_FUZZ_EXAMPLES", "0"))


FUZZ = settings(max_examples=LONG or 25, derandomize=not LONG, deadline=None, database=None,
                suppress_health_check=list(HealthCheck))


EXAMPLE_SECONDS = 20  # one example (read + a few plans) takes milliseconds; longer is a hang


TREES = ["16em64t-4s2c2t-offlines", "16amd64-8n2c-cpusets", "64amd64-4s2n4ca2co", "nvidiagpunumanodes",
         "offline-cpu0-node0", "20em64t-hybrid-1p6c2t+2ca4co1t"]


PLAN_MODES = [m for m in MODES if m != "map"]


# ---------------------------------------------------------------------------------------------- the property
def check_plan(topo: Topology, plan: Plan) -> None:
    owner: dict[int, int] = {}
    for rank in plan.ranks:
        assert rank.cpus, f"rank {rank.local_rank} has no CPU"
        assert len(rank.cpus) == len(set(rank.cpus)), f"rank {rank.local_rank} lists a CPU twice: {rank.cpus}"
        assert set(rank.cpus) <= topo.allowed, f"rank {rank.local_rank} has CPUs outside the allowed set"
        assert all(0 <= c <= MAX_CPU_ID for c in rank.cpus)
        assert all(0 <= n <= MAX_NODE_ID for n in (*rank.numa_nodes, *rank.mem_nodes))
        compute = [p for core in rank.compute_cores for p in core]
        assert len(compute) == len(set(compute)), f"rank {rank.local_rank}: a PU in two cores"
        rank_environment(rank, local_world_size=len(plan.ranks), user_env={})
        if rank.shared:
            continue
        for cpu in rank.cpus:
            assert owner.setdefault(cpu, rank.local_rank) == rank.local_rank, (
                f"CPU {cpu} in ranks {owner[cpu]} and {rank.local_rank} ({plan.mode})")
    # What affrun torchrun writes, every worker's affrun exec accepts, unchanged.
    check_handoff(ParentPlan(plan, "rank", "safe", "none", "auto", {}, False))


def check_topology(topo: Topology) -> None:
    seen: set[int] = set()
    for core in topo.cores:
        assert core.pus and seen.isdisjoint(core.pus), f"a PU in two cores: {core.pus}"
        seen.update(core.pus)
    again = from_snapshot(json.loads(json.dumps(to_snapshot(topo))))
    assert again.to_json() == topo.to_json(), "a snapshot of this topology does not load back the same"


def one_line(exc: AffrunError) -> None:
    message = str(exc)
    assert "\n" not in message and 0 < len(message) < 600, message[:1000]


def plan_all(load: Callable[[], Topology], nprocs: list[int], modes: list[str]) -> None:
    """Load and plan; an AffrunError must be one line, anything else must satisfy the property."""
    try:
        topo = load()
    except AffrunError as exc:
        one_line(exc)
        return
    check_topology(topo)
    for nproc, mode in zip(nprocs, modes):
        try:
            plan = make_plan(topo, Request(nproc=nproc, mode=mode, use_gpus=bool(nproc % 2)))
        except AffrunError as exc:
            one_line(exc)
            continue
        check_plan(topo, plan)


def bounded(fn: Callable[[], None]) -> None:
    signal.alarm(EXAMPLE_SECONDS)
    try:
        fn()
    finally:
        signal.alarm(0)


requests = st.tuples(st.lists(st.integers(1, 40), min_size=1, max_size=4), st.lists(st.sampled_from(PLAN_MODES), min_size=4, max_size=4))


# ---------------------------------------------------------------------------------------------- content strategies
DIGITS = "0123456789"


NOT_ASCII_DIGITS = "²①١٢߀०"  # str.isdigit() or int() take some of these


number_text = st.one_of(
    st.integers(-5, 70000).map(str),
    st.integers(0, 12).map(lambda n: "9" * (n * 4 + 1)),
    st.text(alphabet=DIGITS + NOT_ASCII_DIGITS + "-_+ x", min_size=1, max_size=8),
)


cpulist_text = st.lists(st.one_of(number_text, st.tuples(number_text, number_text).map("-".join)), max_size=4).map(",".join)


hexmask_text = st.lists(st.text(alphabet="0123456789abcdefABCDEFx,", max_size=10), max_size=3).map(",".join)


# A node's meminfo line with any spacing and value (issue 18: "MemTotal:16318356 kB" was a traceback).
meminfo_text = st.tuples(st.sampled_from(["", " ", "\t", "   "]), number_text, st.sampled_from(["", " kB", "kB", " MB"]),
                         st.booleans()).map(lambda t: ("Node 0 MemFree: 1 kB\n" if t[3] else "") +
                                            f"Node 0 MemTotal:{t[0]}{t[1]}{t[2]}\n")


file_content = st.one_of(
    meminfo_text,
    cpulist_text.map(lambda t: t + "\n"),
    hexmask_text.map(lambda t: t + "\n"),
    number_text,
    st.binary(max_size=40).map(lambda b: b.decode("latin-1")),
    st.just(""),
    st.just("0-65536\n"),
    st.just("0-99999999\n"),
)


# ---------------------------------------------------------------------------------------------- sysfs trees
@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    need(FIXTURES.is_dir(), f"shared fixtures not found at {FIXTURES} (set AFFRUN_FIXTURES)")
    dest = tmp_path_factory.mktemp("fuzz-trees")
    return {name: extract_tarball(FIXTURES / "hwloc-linux" / f"{name}.tar.bz2", dest) for name in TREES}


@functools.cache
def tree_entries(root: Path) -> list[str]:
    """Relative paths of the files and links under sys/devices/system and proc/ (what the reader opens)."""
    out: list[str] = []
    for top in ("sys/devices/system/cpu", "sys/devices/system/node", "proc"):
        for dirpath, dirnames, filenames in os.walk(root / top):
            dirnames.sort()
            out.extend(os.path.relpath(os.path.join(dirpath, f), root) for f in sorted(filenames))
    return out


MUTATIONS = st.one_of(
    st.tuples(st.just("write"), file_content),
    st.tuples(st.just("delete"), st.just("")),
    st.tuples(st.just("dangling"), st.just("")),
    st.tuples(st.just("loop"), st.just("")),
    st.tuples(st.just("fifo"), st.just("")),
    st.tuples(st.just("devzero"), st.just("")),
    st.tuples(st.just("sibling-dir"), st.text(alphabet=DIGITS + NOT_ASCII_DIGITS, min_size=1, max_size=12)),
)


def mutate(path: Path, kind: str, value: str) -> None:
    """Change one entry of a hard-linked copy: unlink first, so the extracted original is never written."""
    if kind == "sibling-dir":  # a new cpuN / nodeN directory next to the entry's own
        parent = next((p for p in path.parents if p.name.startswith(("cpu", "node")) and p.name[-1:].isdigit()), None)
        if parent is not None:
            prefix = "cpu" if parent.name.startswith("cpu") else "node"
            sibling = parent.with_name(prefix + value)
            if not sibling.exists():
                link_tree(parent, sibling)
        return
    if path.is_symlink() or path.exists():
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    if kind == "write":
        path.write_bytes(value.encode("utf-8", "surrogateescape"))
    elif kind == "dangling":
        path.symlink_to("no-such-target")
    elif kind == "loop":
        path.symlink_to(path.name)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "devzero":
        path.symlink_to("/dev/zero")

