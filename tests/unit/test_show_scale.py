"""``affrun show`` on a large machine: each core's cell is made once per picture however many layouts are tried,
and the cheap grid that makes that possible lays cells out exactly as rows of ``hjoin`` stacked by ``vstack`` do.

Speed itself is a ratio in benchmarks/show_scale.py, not a test.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.show.drawing import body
from launcher.show.layout import DIM, PLAIN, Block, Frame, Grid, Style, Text, framed, hjoin, text_line, vstack
from launcher.show.model import Model
from launcher.show.terminal import picture
from launcher.topology import load_topology
from launcher.topology.model import Core, Topology
from tests.drawing import assert_every_core_under_its_owner, plan_for
from tests.fakesys import FakeGPU, uniform, write_tree


class CountingModel(Model):
    """The picture's model, counting the core cells it is asked for."""

    made = 0

    def cell(self, core: Core, color: bool) -> Text:
        self.made += 1
        return super().cell(core, color)


@pytest.fixture(scope="module")
def one_wide_node(tmp_path_factory: pytest.TempPathFactory) -> Topology:
    """The shape of the largest picture for its size: one package, one NUMA node of 512 cores, one GPU."""
    m = uniform(1, 512)
    m.gpus = [FakeGPU(pci="0000:10:00.0", numa_node=0)]
    return load_topology(fsroot=str(write_tree(tmp_path_factory.mktemp("wide"), m)), environ={})


@pytest.mark.parametrize("color", [False, True])
@pytest.mark.parametrize("width", [80, 120])
def test_each_core_cell_is_made_once_per_picture(one_wide_node: Topology, color: bool, width: int) -> None:
    # body() tries about 2 log2(512) row lengths here; each used to make every cell again (24 times at 4,096 CPUs)
    model = CountingModel(one_wide_node, plan_for(one_wide_node, 2, loader_cores=1))
    drawn = body(model, width, color)
    assert model.made == len(one_wide_node.cores)
    assert drawn.w <= width


def test_a_wide_node_still_shows_every_core_under_its_owner(one_wide_node: Topology) -> None:
    plan = plan_for(one_wide_node, 3, loader_cores=2)
    text = picture(one_wide_node, plan, width=80)
    assert_every_core_under_its_owner(one_wide_node, plan, text)
    assert max(len(line) for line in text.splitlines()) <= 80


def rows_of(cells: list[Block], per: int, gap: int) -> Block:
    """What a grid replaces: the cells in rows of ``per``, each row an ``hjoin``, the rows stacked."""
    return vstack([hjoin(cells[i : i + per], gap) for i in range(0, len(cells), per)])


def cell_block(w: int, h: int, i: int) -> Block:
    lines = [text_line((f"{i}".ljust(w, "#")[:w], Style("rank", (i,)) if y == 0 else DIM)) for y in range(h)]
    return framed(f"c{i}", vstack(lines), "gpu") if i % 3 == 0 else vstack(lines)


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.tuples(st.integers(1, 9), st.integers(1, 3)), max_size=30), per=st.integers(1, 12),
       gap=st.integers(0, 3))
def test_a_grid_is_the_rows_it_replaces(sizes: list[tuple[int, int]], per: int, gap: int) -> None:
    cells = [cell_block(w, h, i) for i, (w, h) in enumerate(sizes)]
    grid, rows = Grid(cells, per, gap), rows_of(cells, per, gap)
    assert (grid.w, grid.h) == (rows.w, rows.h)
    assert grid.placed(3, 5) == rows.placed(3, 5)
    framed_grid, framed_rows = framed("t", grid, "numa"), framed("t", rows, "numa")
    assert framed_grid.placed() == framed_rows.placed()


def test_deep_nesting_places_every_op_once_where_it_belongs() -> None:
    inner = text_line(("core", PLAIN))
    block = inner
    for level in range(300):
        block = framed(f"level {level}", block, "group") if level % 2 else hjoin([Block(1, 1), block], gap=0)
    ops = block.placed()
    # outermost first: each frame 2 right and 1 down inside its own, plus the 1 cell the hjoin puts before it
    assert [(op.x, op.y) for op in ops if isinstance(op, Frame)] == [(3 * j, j) for j in range(150)]
    assert [(op.x, op.y, op.text) for op in ops if isinstance(op, Text)] == [(3 * 150, 150, "core")]
    assert len(ops) == 151
