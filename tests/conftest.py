"""Shared test helpers: where the shared fixtures are, the CI rule "fail, don't skip", and the tiers."""

from __future__ import annotations

import os
import re
import shutil
import tarfile
import tempfile
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


def require_torch() -> None:
    try:
        import torch  # noqa: F401
    except ImportError:
        need(False, "torch is not installed (pip install torch==2.13.0)")


@pytest.hookimpl(tryfirst=True)  # before the mark plugin's own hook selects by -m
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each test gets its tier's marker: ``fast``, ``system`` or ``slow`` (tests/tiers.py)."""
    from tests.tiers import tier

    for item in items:
        item.add_marker(tier(item))


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """``-m fast`` does not import tests/system, where no test is fast (2.4 s of the fast tier's CPU time)."""
    if config.option.markexpr == "fast" and collection_path == ROOT / "tests" / "system":
        return True
    return None


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test marked ``torch`` skips without torch (fails under ``CI=true``)."""
    if item.get_closest_marker("torch"):
        require_torch()


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    need(FIXTURES.is_dir(), f"shared fixtures not found at {FIXTURES} (set AFFRUN_FIXTURES)")
    return FIXTURES


def _scratch_root() -> Path | None:
    """A tmpfs for the suite's scratch files, or None. The tests write and read sysfs trees of thousands of small
    files; on this project's 2-core VM, creating a file on its ext4 disk costs about a millisecond and the fast
    tier took 60-70 s warm (18 s of it in the kernel), against 43 s with the same files on /dev/shm. Used only
    where /dev/shm is a writable tmpfs that allows exec (tests run scripts from tmp_path) with 2 GiB free."""
    shm = Path("/dev/shm")
    try:
        st = os.statvfs(shm)
    except OSError:
        return None
    if st.f_flag & (os.ST_NOEXEC | os.ST_RDONLY) or st.f_bavail * st.f_frsize < 2 << 30 or not os.access(shm, os.W_OK):
        return None
    return shm / f"affrun-tests-{os.getuid()}"


SCRATCH = _scratch_root()

_extracted: dict[str, Path] = {}
# Extracted trees are kept between runs (the fast tier's time is mostly bz2 and thousands of small files): one
# directory per tarball, named by its size and mtime, made complete before it is used. It sits on the scratch tmpfs
# when there is one (until reboot), else in ~/.cache. AFFRUN_FIXTURE_CACHE moves it; tests never write into it (they
# copy a tree first, with link_tree).
FIXTURE_CACHE = Path(os.environ.get("AFFRUN_FIXTURE_CACHE")
                     or (SCRATCH / "fixtures" if SCRATCH else Path.home() / ".cache" / "affrun-test-fixtures"))


def link_tree(source: Path, dest: Path) -> None:
    """Copy a tree as hard links (a test then unlinks an entry before it writes it, so the original stays); plain
    copies where the two sit on different file systems."""

    def link(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    shutil.copytree(source, dest, symlinks=True, copy_function=link)


# AFFRUN_TEST_LIVE=VARIANT: the "live" machine of this run is a live-like fake tree (tests/fakesys.py,
# write_live_like: uniform-capacity, one-kind, no-cpufreq, no-cache, hybrid, arm64) with this process's CPUs, written
# once and exported as AFFRUN_FSROOT, which load_topology reads in place of /. So a test that assumes something of
# the host it runs on fails on a host of another kind. AFFRUN_FSROOT=DIR alone points it at any tree.
LIVE_VARIANT = os.environ.get("AFFRUN_TEST_LIVE") or None


def live_root() -> Path:
    """The tree the "live" machine is read from: ``$AFFRUN_FSROOT`` (a fake live tree), else ``/``."""
    return Path(os.environ.get("AFFRUN_FSROOT") or "/")


def _write_live_tree(config: pytest.Config, variant: str) -> None:
    from tests.fakesys import write_live_like

    root = Path(tempfile.mkdtemp(dir=SCRATCH if SCRATCH and SCRATCH.is_dir() else None, prefix="live-"))
    config.add_cleanup(lambda: shutil.rmtree(root, ignore_errors=True))
    try:
        os.environ["AFFRUN_FSROOT"] = str(write_live_like(root / "fsroot", variant))
    except ValueError as exc:
        raise pytest.UsageError(f"AFFRUN_TEST_LIVE: {exc}") from None


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """tmp_path on the scratch tmpfs (see :func:`_scratch_root`), one fresh directory per run, removed at the end;
    ``--basetemp`` still wins. Then the fake live tree of ``AFFRUN_TEST_LIVE``, if asked for."""
    if SCRATCH is not None and not config.option.basetemp:
        SCRATCH.mkdir(parents=True, exist_ok=True)
        config.option.basetemp = tempfile.mkdtemp(dir=SCRATCH, prefix="run-")
        config.add_cleanup(lambda: shutil.rmtree(config.option.basetemp, ignore_errors=True))
    if LIVE_VARIANT is not None:
        _write_live_tree(config, LIVE_VARIANT)


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


# Files of hwloc's trees that affrun's reader never opens, left out of the extraction: about half of the 64,000
# files, and most of a cold run's time, since creating a file costs about a millisecond here. Cache attributes other
# than the level and the sharing masks, hugepage counters, and the device tree of the ARM machines.
# tests/system/test_fixture_extraction.py reads every tree both ways and asserts the same topology.
UNREAD = re.compile(r"/cache/index\d+/(?!level$|shared_cpu_list$|shared_cpu_map$)[^/]+$|/hugepages/|/proc/device-tree/")


class LeanFilter:
    """The extraction filter of the fast tier: :data:`UNREAD` files dropped, the rest as ``tarfile.data_filter``
    would give them. One per archive, extracted into a fresh directory.

    ``data_filter`` resolves every member's path with ``realpath`` (an lstat per component: a third of the
    extraction's time). A file or directory whose relative name has no ``..`` and goes through no symlink of this
    archive cannot leave the fresh directory, so only those get the same modes and ownership without the walk;
    symlinks, hard links and anything else go through ``data_filter`` itself."""

    def __init__(self) -> None:
        self.links: set[str] = set()

    def __call__(self, member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo | None:
        name = member.name.rstrip("/")
        if member.isfile() and UNREAD.search("/" + name):
            return None
        parts = name.split("/")
        if not (member.isfile() or member.isdir()) or name.startswith("/") or ".." in parts or any(
                "/".join(parts[:i]) in self.links for i in range(1, len(parts))):
            if member.issym() or member.islnk():
                self.links.add(name)
            return tarfile.data_filter(member, dest)
        mode: int | None = None
        if member.isfile():
            mode = member.mode & 0o755
            mode = (mode if mode & 0o100 else mode & ~0o111) | 0o600
        return member.replace(mode=mode, uid=None, gid=None, uname=None, gname=None, deep=False)  # type: ignore[arg-type]


def _extract(tarball: Path, parent: Path, name: str) -> Path:
    parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=parent, prefix=f".{name}-"))
    with tarfile.open(tarball) as tf:
        tf.extractall(work, filter=LeanFilter())
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
