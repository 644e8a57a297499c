"""Shared test helpers: where the shared fixtures are, and the CI rule "fail, don't skip"."""

from __future__ import annotations

import os
import tarfile
from pathlib import Path

import pytest
from hypothesis import settings

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(os.environ.get("AFFRUN_FIXTURES") or ROOT.parent / "shared" / "fixtures")
IN_CI = os.environ.get("CI", "").lower() == "true"

# Under CI=true every hypothesis property draws the same examples on every run, so a landing is judged on the
# code, not on the seed. Runs elsewhere stay random and keep what they find in .hypothesis/ (one such run found
# the CPU-less GPU node that test_ranks_sit_next_to_their_gpu had not allowed for, after many clean runs);
# AFFRUN_HYPOTHESIS_EXAMPLES searches deeper.
settings.register_profile("ci", derandomize=True, database=None)
if IN_CI:
    settings.load_profile("ci")


def need(condition: object, reason: str) -> None:
    """Skip with ``reason`` where ``condition`` is false, but fail under ``CI=true``: CI must run everything."""
    if condition:
        return
    if IN_CI:
        pytest.fail(f"required under CI=true: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    need(FIXTURES.is_dir(), f"shared fixtures not found at {FIXTURES} (set AFFRUN_FIXTURES)")
    return FIXTURES


_extracted: dict[str, Path] = {}
# Extracted trees are kept between runs (the fast tier's time is mostly bz2 and thousands of small files: about 20 s
# of a quiet 2-core machine for all of hwloc's trees): one directory per tarball, named by its size and mtime, made
# complete before it is used. AFFRUN_FIXTURE_CACHE moves it; tests never write into it (they copy a tree first).
FIXTURE_CACHE = Path(os.environ.get("AFFRUN_FIXTURE_CACHE") or Path.home() / ".cache" / "affrun-test-fixtures")


def extract_tarball(tarball: Path, dest: Path) -> Path:
    """Extract an hwloc test tarball (once: kept in :data:`FIXTURE_CACHE`); return its single top directory (the
    fsroot). ``dest`` is used when the cache cannot be written."""
    key = str(tarball)
    if key not in _extracted:
        stat = tarball.stat()
        cached = FIXTURE_CACHE / f"{tarball.name.removesuffix('.tar.bz2')}-{stat.st_size}-{int(stat.st_mtime)}"
        if not (cached / ".complete").exists():
            try:
                cached = _extract(tarball, FIXTURE_CACHE, cached.name)
            except OSError:
                cached = _extract(tarball, dest, tarball.name.removesuffix(".tar.bz2"))
        (top,) = [p for p in cached.iterdir() if p.is_dir()]
        _extracted[key] = top
    return _extracted[key]


def _extract(tarball: Path, parent: Path, name: str) -> Path:
    import shutil
    import tempfile

    parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=parent, prefix=f".{name}-"))
    with tarfile.open(tarball) as tf:
        tf.extractall(work, filter="data")
    (work / ".complete").touch()
    out = parent / name
    try:
        work.rename(out)
    except OSError:  # another run made it meanwhile
        shutil.rmtree(work, ignore_errors=True)
    return out


@pytest.fixture(scope="session")
def hwloc_root(tmp_path_factory: pytest.TempPathFactory, fixtures_dir: Path):  # type: ignore[no-untyped-def]
    """``hwloc_root("name")`` -> the extracted fsroot of ``fixtures/hwloc-linux/name.tar.bz2``."""
    dest = tmp_path_factory.mktemp("hwloc")

    def get(name: str) -> Path:
        return extract_tarball(fixtures_dir / "hwloc-linux" / f"{name}.tar.bz2", dest)

    return get
