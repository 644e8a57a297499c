"""``affrun show``'s legend explains its boxes (issue 21 item 5): it reads the picture's first box aloud, with the
box exactly as drawn (its kind letter too, on a hybrid machine), its first CPU and its owner. On fake trees, so
that no host's shape decides the result (issue 26)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.fakesys import uniform, write_live_like, write_tree
from tests.system.test_hostile_input import affrun

BOX = re.compile(r"\[\s*(\d+)([A-Za-z]?) ([0-9A-Za-z.+\-]+)\s*\]")


@pytest.mark.parametrize("machine", ["4 cores", "hybrid"])
@pytest.mark.parametrize(("args", "owner"), [
    (["--nproc-per-node", "2"], "a compute core of rank 0"),
    (["--nproc-per-node", "2", "--mode", "numa"], "shared by ranks 0, 1"),
    (["--nproc-per-node", "1", "--reserve", "0"], "reserved (--reserve)"),
])
def test_the_legend_reads_the_first_box_aloud(tmp_path: Path, machine: str, args: list[str], owner: str) -> None:
    root = (write_tree(tmp_path / "t", uniform(1, 4)) if machine == "4 cores"
            else write_live_like(tmp_path / "t", "hybrid", cpus=range(4)))
    proc = affrun("show", "--fsroot", str(root), *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    picture, _, legend = proc.stdout.partition("\nLegend ")
    cpu, letter, mark = BOX.findall(picture)[0]  # the first box drawn
    assert bool(letter) == (machine == "hybrid"), picture
    said = " ".join(legend.split())
    assert f"[{cpu}{letter} {mark}] is the core whose first CPU is {cpu}, {owner}" in said, proc.stdout
