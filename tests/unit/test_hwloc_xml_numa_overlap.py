"""A broken NUMA table (two nodes' cpusets overlap without one holding the other) is found in one pass over the
distinct cpusets (:func:`launcher.topology.hwloc_xml_numa._partial_overlap`), as the pairwise comparison finds it,
and a NUMANode id above the largest node id is refused before any work on it."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.topology.hwloc_xml_numa import BadXML, XmlNode, _partial_overlap, numa_node

ONLINE = frozenset(range(12))


def _node(index: int, cpus: frozenset[int] | None) -> XmlNode:
    return XmlNode(index, cpus, True, None, None, None)


def _pairwise(sets: list[frozenset[int]]) -> bool:
    return any(a & b and not (a <= b or b <= a) for i, a in enumerate(sets) for b in sets[i + 1:])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.none(), st.frozensets(st.integers(0, 11), min_size=1)), min_size=1, max_size=8))
def test_the_one_pass_finds_what_the_pairwise_comparison_finds(localities: list[frozenset[int] | None]) -> None:
    nodes = [_node(i, cpus) for i, cpus in enumerate(localities)]
    sets = [ONLINE if cpus is None else cpus & ONLINE for cpus in localities]
    said = _partial_overlap(nodes, ONLINE)
    assert (said is not None) == _pairwise(sets)
    if said is not None:  # the two nodes it names do overlap partially
        found = re.search(r"nodes (\d+) and (\d+) both claim", said)
        assert found is not None
        a, b = sets[int(found[1])], sets[int(found[2])]
        assert a & b and not (a <= b or b <= a)


def test_identical_nodes_are_one_set_and_nested_ones_are_fine() -> None:
    nodes = [_node(i, frozenset(range(8))) for i in range(1024)] + [_node(2000, frozenset({1}))]
    assert _partial_overlap(nodes, ONLINE) is None
    assert _partial_overlap([_node(0, frozenset({0, 1})), _node(1, frozenset({1, 2}))], ONLINE) == (
        "the NUMA table is broken: nodes 0 and 1 both claim CPUs 1; each CPU goes to the node with the smaller "
        "cpuset, then the lower number")


@pytest.mark.parametrize("index", ["1024", "99999999999999999999", "-1"])
def test_a_node_id_outside_the_range_is_refused_first(index: str) -> None:
    element = ET.fromstring(f'<object type="NUMANode" os_index="{index}" cpuset="0x1"/>')
    with pytest.raises(BadXML, match=rf"NUMANode P#{index}: NUMA node {index} is outside 0..1023"):
        numa_node(element, None, 2, [])
