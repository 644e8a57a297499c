"""Fuzzing: hypothesis corrupts real hwloc sysfs trees, hwloc XML exports, topology snapshots and plans.

Whatever the input, affrun either refuses it with one :class:`AffrunError` line, or plans with no CPU twice (in a
rank, or in two ranks that do not share by design), only allowed CPUs, ids that ``sched_setaffinity`` takes, and a
plan that its own ``AFFRUN_PLAN`` check accepts and a snapshot that loads back. Anything else (another exception,
a hang) fails.

By default each test runs a few dozen derandomized examples (CI stays fast and stable). A longer, random run:

    AFFRUN_FUZZ_EXAMPLES=5000 .venv/bin/python -m pytest -q tests/unit/test_fuzz_inputs.py
"""

from __future__ import annotations

import json
import signal
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.base.cpulist import MAX_CPU_ID, MAX_NODE_ID
from launcher.bind.handoff import ParentPlan
from launcher.bind.wire import read_job
from launcher.env.policy import rank_environment
from launcher.errors import AffrunError
from launcher.plan.planner import Plan, Request, make_plan
from launcher.topology import document_topology, load_topology
from launcher.topology.snapshot import to_snapshot
from tests import fuzz
from tests.conftest import FIXTURES, need
from tests.fuzz import (
    EXAMPLE_SECONDS,
    FUZZ,
    PLAN_MODES,
    TREES,
    bounded,
    cpulist_text,
    hexmask_text,
    number_text,
    one_line,
    plan_all,
    requests,
)

trees = fuzz.trees  # the module-scoped fixture shared with the system half

XMLS = ["hwloc-linux/16em64t-4s2c2t-offlines-xml.xml", "hwloc-linux/32amd64-4s2n4c-cgroup2.xml",
        "hwloc-xml-gpu/24em64t-2n6c2t-pci.xml", "hwloc-linux/nvidia-dgx-gb10.xml"]


class Hang(Exception):
    pass


@pytest.fixture(autouse=True)
def _bounded() -> Iterator[None]:
    """Every example gets EXAMPLE_SECONDS: a read that blocks (a FIFO) fails the test instead of hanging it."""
    def alarm(signum: int, frame: FrameType | None) -> None:
        raise Hang(f"an example ran past {EXAMPLE_SECONDS}s")

    previous = signal.signal(signal.SIGALRM, alarm)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


# ---------------------------------------------------------------------------------------------- hwloc XML
@pytest.fixture(scope="module")
def xml_documents() -> dict[str, bytes]:
    need(FIXTURES.is_dir(), f"shared fixtures not found at {FIXTURES} (set AFFRUN_FIXTURES)")
    return {name: (FIXTURES / name).read_bytes() for name in XMLS}


ATTRIBUTES = ["os_index", "cpuset", "complete_cpuset", "allowed_cpuset", "online_cpuset", "nodeset", "type",
              "local_memory", "subtype", "gp_index", "pci_type", "pci_busid"]
attribute_value = st.one_of(number_text, hexmask_text.map(lambda t: "0x" + t), cpulist_text,
                            st.sampled_from(["PU", "Core", "NUMANode", "Package", "L3Cache", "PCIDev", "Group", "",
                                             "inf", "1e400", "nan", "0x" + "f" * 20000]))


@FUZZ
@given(data=st.data(), name=st.sampled_from(XMLS), request=requests)
def test_corrupted_hwloc_xml(xml_documents: dict[str, bytes], data: st.DataObject, name: str,
                             request: tuple[list[int], list[str]]) -> None:
    root = ET.fromstring(xml_documents[name])
    elements = list(root.iter())
    for _ in range(data.draw(st.integers(1, 4), label="mutations")):
        target = elements[data.draw(st.integers(0, len(elements) - 1), label="element")]
        action = data.draw(st.sampled_from(["set", "set", "drop", "copy-into"]), label="action")
        if action == "set":
            target.set(data.draw(st.sampled_from(ATTRIBUTES), label="attribute"), data.draw(attribute_value, label="value"))
        elif action == "drop":
            for parent in root.iter():
                if target in list(parent):
                    parent.remove(target)
                    break
        else:  # the same object twice: one PU under two Cores, one Core in two Packages...
            other = elements[data.draw(st.integers(0, len(elements) - 1), label="other")]
            if not any(e is other for e in target.iter()):  # not into itself or its own subtree (a cycle)
                other.append(target)
    encoding = data.draw(st.sampled_from(["UTF-8", "UTF-8", "bogus", "UTF-7", "UTF-16", "latin-1"]), label="encoding")
    text = f'<?xml version="1.0" encoding="{encoding}"?>\n'.encode() + ET.tostring(root)
    bounded(lambda: plan_all(lambda: document_topology(text, "fuzzed.xml")[0], *request))


# ---------------------------------------------------------------------------------------------- snapshots
@pytest.fixture(scope="module")
def snapshots(trees: dict[str, Path]) -> dict[str, dict[str, Any]]:
    return {name: to_snapshot(load_topology(fsroot=str(path), environ={})) for name, path in trees.items()}


json_value = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(10 ** 30), 10 ** 30), st.integers(-3, 70000),
              st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12), cpulist_text),
    lambda children: st.one_of(st.lists(children, max_size=4), st.dictionaries(st.text(max_size=8), children, max_size=3)),
    max_leaves=8,
)


def replace_somewhere(value: Any, data: st.DataObject, depth: int = 0) -> Any:
    """``value`` with one part replaced (or, in a list, duplicated) somewhere below it."""
    stop = depth > 0 and data.draw(st.booleans(), label="here")
    if isinstance(value, dict) and value and not stop:
        key = data.draw(st.sampled_from(sorted(value)), label="key")
        return {**value, key: replace_somewhere(value[key], data, depth + 1)}
    if isinstance(value, list) and value and not stop:
        i = data.draw(st.integers(0, len(value) - 1), label="index")
        if data.draw(st.booleans(), label="duplicate"):
            return [*value, value[i]]  # one core, node or GPU listed twice
        return [*value[:i], replace_somewhere(value[i], data, depth + 1), *value[i + 1:]]
    return data.draw(json_value, label="new value")


@FUZZ
@given(data=st.data(), tree=st.sampled_from(TREES), request=requests)
def test_corrupted_snapshots(snapshots: dict[str, dict[str, Any]], data: st.DataObject, tree: str,
                             request: tuple[list[int], list[str]]) -> None:
    snap: Any = snapshots[tree]
    for _ in range(data.draw(st.integers(1, 3), label="mutations")):
        snap = replace_somewhere(snap, data)
    text = json.dumps(snap).encode()
    bounded(lambda: plan_all(lambda: document_topology(text, "fuzzed.json")[0], *request))


# ---------------------------------------------------------------------------------------------- AFFRUN_PLAN
@FUZZ
@given(data=st.data(), tree=st.sampled_from(TREES), nproc=st.integers(1, 6), mode=st.sampled_from(PLAN_MODES))
def test_corrupted_affrun_plan(trees: dict[str, Path], data: st.DataObject, tree: str, nproc: int, mode: str) -> None:
    topo = load_topology(fsroot=str(trees[tree]), environ={})
    try:
        plan = make_plan(topo, Request(nproc=nproc, mode=mode))
    except AffrunError:
        return
    value: Any = json.loads(ParentPlan(plan, "rank", "safe", "none", "auto", {}, False).to_json())
    for _ in range(data.draw(st.integers(1, 3), label="mutations")):
        value = replace_somewhere(value, data)

    def read_back() -> None:
        try:
            job = read_job(json.dumps(value))
        except AffrunError as exc:
            one_line(exc)
            return
        check_plan_alone(job.plan)

    bounded(read_back)


def check_plan_alone(plan: Plan) -> None:
    """What ``affrun exec`` can rely on in a plan that passed its check: ids in range, no CPU in two unshared ranks."""
    owner: dict[int, int] = {}
    for rank in plan.ranks:
        assert rank.cpus and all(0 <= c <= MAX_CPU_ID for c in rank.cpus)
        assert all(0 <= n <= MAX_NODE_ID for n in (*rank.numa_nodes, *rank.mem_nodes))
        rank_environment(rank, local_world_size=len(plan.ranks), user_env={})
        if rank.shared or plan.mode == "map":
            continue
        for cpu in rank.cpus:
            assert owner.setdefault(cpu, rank.local_rank) == rank.local_rank


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children) | st.dictionaries(st.text(), children), max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(value=JSON_VALUES, before=st.sampled_from(["", " ", "\n\t"]), after=st.sampled_from(["", " \r\n", " x", "]", ","]))
def test_load_json_reads_what_json_loads_reads(value: Any, before: str, after: str) -> None:
    """load_json (AFFRUN_PLAN, snapshots) takes and refuses what json.loads does, and refuses only with BadJSON."""
    from launcher.base.untrusted import BadJSON, load_json

    text = before + json.dumps(value) + after
    try:
        expected: Any = json.loads(text)
    except ValueError:
        with pytest.raises(BadJSON):
            load_json(text)
        return
    assert load_json(text) == expected


@settings(max_examples=300, deadline=None)
@given(text=st.text(alphabet='{}[]",:0123456789.eE+-truefalsnNaIiy \t\n\\u\x01'))
def test_load_json_refuses_what_json_loads_refuses(text: str) -> None:
    from launcher.base.untrusted import BadJSON, load_json

    try:
        expected: Any = json.loads(text, parse_constant=lambda name: (_ for _ in ()).throw(ValueError(name)))
    except (ValueError, RecursionError):
        with pytest.raises(BadJSON):
            load_json(text)
        return
    assert load_json(text) == expected


SLURM_COUNT = r"^\s*([0-9]{1,20})(?:\(x([0-9]{1,20})\))?\s*$"  # Slurm's per-node count syntax, ASCII digits only


@settings(max_examples=500, deadline=None)
@given(value=st.text(alphabet="0123456789(x), \t\u0661\u00b2", max_size=30))
def test_slurm_per_node_counts_read_as_their_syntax_says(value: str) -> None:
    """expand_counts parses by hand (re would cost the exec path ~5 ms): it takes exactly the regular syntax."""
    import re

    from launcher.base.slurm_step import MAX_NODES, expand_counts

    matches = [re.match(SLURM_COUNT, part) for part in value.split(",")]
    if not all(matches) or sum(int(m.group(2) or 1) for m in matches if m) > MAX_NODES:
        with pytest.raises(ValueError):
            expand_counts(value)
        return
    assert expand_counts(value) == [int(m.group(1)) for m in matches if m for _ in range(int(m.group(2) or 1))]
