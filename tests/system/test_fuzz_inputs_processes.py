"""test_fuzz_inputs: the tests that start processes or load real runtimes (tests/system). The in-process ones are tests/unit/test_fuzz_inputs.py."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from launcher.topology import load_topology
from tests import fuzz
from tests.conftest import link_tree
from tests.fuzz import FUZZ, MUTATIONS, TREES, bounded, mutate, plan_all, requests, tree_entries

trees = fuzz.trees  # the module-scoped fixture shared with the unit half


@FUZZ
@given(data=st.data(), tree=st.sampled_from(TREES), request=requests)
def test_corrupted_sysfs_trees(trees: dict[str, Path], tmp_path_factory: pytest.TempPathFactory, data: st.DataObject,
                               tree: str, request: tuple[list[int], list[str]]) -> None:
    source = trees[tree]
    entries = tree_entries(source)
    copy = tmp_path_factory.mktemp("fuzzed") / "t"
    link_tree(source, copy)
    for _ in range(data.draw(st.integers(1, 3), label="mutations")):
        entry = data.draw(st.sampled_from(entries), label="entry")
        kind, value = data.draw(MUTATIONS, label="mutation")
        mutate(copy / entry, kind, value)
    bounded(lambda: plan_all(lambda: load_topology(fsroot=str(copy), environ={}), *request))
    shutil.rmtree(copy.parent)
