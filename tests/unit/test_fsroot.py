"""Reads under an fsroot (docs/design.md §6): the kernel follows the tree's links, and a path whose real path is
not under the tree's reads as absent, absolute links into the live machine included; the same answers where no
procfs is mounted (the real path then comes from ``os.path.realpath``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from launcher.topology._files import read_text
from launcher.topology.fsroot import isdir, lexists, listdir, realpath, within


@pytest.fixture(params=["procfs", "no procfs"])
def tree(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    if request.param == "no procfs":  # a container without /proc: readlink of /proc/self/fd/N fails
        real_readlink = os.readlink

        def readlink(path: str) -> str:
            if str(path).startswith("/proc/self/fd/"):
                raise FileNotFoundError(2, "no procfs", path)
            return real_readlink(path)

        monkeypatch.setattr(os, "readlink", readlink)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "value").write_text("live machine\n")
    root = tmp_path / "t"
    (root / "sys/a").mkdir(parents=True)
    (root / "sys/a/value").write_text("tree\n")
    links = {"in-relative": "a", "in-absolute": str(root.resolve() / "sys/a"), "out-absolute": str(outside),
             "out-relative": os.path.relpath(outside, root / "sys"), "re-rooted": "/sys/a", "dangling": "nothing",
             "loop": "loop", "file-link": "a/value"}
    for name, target in links.items():
        (root / "sys" / name).symlink_to(target)
    return root


def test_links_are_followed_only_where_they_stay_in_the_tree(tree: Path) -> None:
    sys_dir = f"{tree}/sys"
    with within(str(tree)):
        for name in ("a", "in-relative", "in-absolute"):
            assert read_text(f"{sys_dir}/{name}/value") == "tree" and isdir(f"{sys_dir}/{name}")
            assert listdir(f"{sys_dir}/{name}") == ["value"]
            assert realpath(f"{sys_dir}/{name}") == str(tree.resolve() / "sys/a")
        assert read_text(f"{sys_dir}/file-link") == "tree"
        for name in ("out-absolute", "out-relative", "re-rooted", "dangling", "loop"):
            assert read_text(f"{sys_dir}/{name}/value") is None and not isdir(f"{sys_dir}/{name}")
            assert realpath(f"{sys_dir}/{name}") is None
            with pytest.raises(OSError):
                listdir(f"{sys_dir}/{name}")
            assert lexists(f"{sys_dir}/{name}")  # the link itself is in the tree
        assert read_text(f"{tree}/../outside/value") is None  # '..' out of the tree in the path itself
        assert not lexists(f"{sys_dir}/out-absolute/value") and not lexists(f"{sys_dir}/nothing")
    assert read_text(f"{sys_dir}/out-absolute/value") == "live machine"  # no root set: paths as they are
