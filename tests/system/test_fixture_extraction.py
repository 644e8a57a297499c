"""The fast tier extracts hwloc's trees without the files affrun never reads (tests/conftest.py: ``UNREAD``).

This is the check that the shortcut changes nothing: every tree, extracted whole, reads as the same topology as its
lean extraction. A reader that starts opening one of the left-out files fails here, not silently in the fast tier.
It is a system test because extracting every tree whole takes most of a minute on a 2-core machine.
"""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from launcher.topology.snapshot import to_snapshot
from launcher.topology.sysfs import read_sysfs
from tests.conftest import FIXTURES, extract_tarball

TARBALLS = sorted([*(FIXTURES / "hwloc-linux").glob("*.tar.bz2"), *(FIXTURES / "hwloc-hybrid").glob("*.tar.bz2")])


def _read(top: Path) -> dict[str, object]:
    root = top / "fsroot" if (top / "fsroot").is_dir() else top  # x86+linux tarballs: <name>/fsroot
    snap = to_snapshot(read_sysfs(str(root)))
    snap.pop("source", None)  # the directory it was read from
    return snap


def test_trees_are_there() -> None:
    from tests.conftest import need

    need(len(TARBALLS) >= 15, f"hwloc trees not found under {FIXTURES}")


@pytest.mark.parametrize("tarball", TARBALLS, ids=lambda p: p.name.removesuffix(".tar.bz2"))
def test_whole_and_lean_trees_read_the_same(tarball: Path, tmp_path: Path) -> None:
    whole = tmp_path / "whole"
    with tarfile.open(tarball) as tf:
        tf.extractall(whole, filter="data")
    (whole_root,) = [p for p in whole.iterdir() if p.is_dir()]
    lean_root = extract_tarball(tarball, tmp_path / "lean")
    assert _read(whole_root) == _read(lean_root)
