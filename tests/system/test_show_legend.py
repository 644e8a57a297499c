"""``affrun show``'s legend explains its boxes (issue 21 item 5): it reads the picture's first box aloud, with the
box exactly as drawn, its first CPU and its owner."""

from __future__ import annotations

import re

import pytest

from tests.system.test_hostile_input import affrun

BOX = re.compile(r"\[\s*(\d+) ([0-9A-Za-z.+\-]+)\s*\]")


@pytest.mark.parametrize(("args", "owner"), [
    (["--nproc-per-node", "2"], "a compute core of rank 0"),
    (["--nproc-per-node", "2", "--mode", "numa"], "shared by ranks 0, 1"),
    (["--nproc-per-node", "1", "--reserve", "0"], "reserved (--reserve)"),
])
def test_the_legend_reads_the_first_box_aloud(args: list[str], owner: str) -> None:
    proc = affrun("show", *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    picture, _, legend = proc.stdout.partition("\nLegend ")
    cpu, mark = BOX.findall(picture)[0]  # the first box drawn
    said = " ".join(legend.split())
    assert f"[{cpu} {mark}] is the core whose first CPU is {cpu}, {owner}" in said, proc.stdout
