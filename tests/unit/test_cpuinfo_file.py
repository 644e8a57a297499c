"""The one bounded reader of ``/proc/cpuinfo`` (issue 34, class 7): what it reads of a hostile file, how many
bytes at most (``/proc/self/io``'s ``rchar``, the kernel's count of this process's reads), and what the kinds
reader, which asks it whether the CPU is an AMD before Zen 5, makes of a file it cannot read."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from launcher.topology.cpuinfo_file import READ_LIMIT, Cpuinfo, field_text, read_cpuinfo, read_head
from launcher.topology.kinds_sysfs import kinds_from_sysfs
from tests.unit.test_core_kinds import MAX, tree


def bytes_read() -> int:
    """This process's bytes read so far, by the kernel's count."""
    text = Path("/proc/self/io").read_text()
    return int(next(line.split()[1] for line in text.splitlines() if line.startswith("rchar:")))


def write_cpuinfo(root: Path, data: bytes | None = None) -> Path:
    (root / "proc").mkdir(parents=True, exist_ok=True)
    if data is not None:
        (root / "proc/cpuinfo").write_bytes(data)
    return root / "proc/cpuinfo"


@pytest.mark.parametrize("case", ["sparse 1 GiB", "a 10 MB line", "100,000 flags"])
def test_a_huge_file_is_read_only_to_the_limit(tmp_path: Path, case: str) -> None:
    path = write_cpuinfo(tmp_path)
    if case == "sparse 1 GiB":
        subprocess.run(["truncate", "-s", "1G", str(path)], check=True)
    elif case == "a 10 MB line":
        path.write_bytes(b"vendor_id\t: GenuineIntel\nmodel name\t: " + b"x" * 10_000_000 + b"\n\n")
    else:
        path.write_bytes(b"vendor_id\t: GenuineIntel\ncpu family\t: 6\nflags\t\t: "
                         + b" ".join(b"f%d" % i for i in range(100_000)) + b" hybrid_cpu\n\n")
    before = bytes_read()
    info = read_cpuinfo(str(tmp_path))
    read = bytes_read() - before
    assert read <= READ_LIMIT + 4096, read  # the limit, and /proc/self/io itself
    assert info.present and info.problem is not None and f"{READ_LIMIT >> 10} KiB" in info.problem
    if case != "sparse 1 GiB":  # the lines before the cut are read; the cut line is not
        assert info.fields == {"vendor_id": "GenuineIntel", **({"cpu family": "6"} if case == "100,000 flags" else {})}


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom", "/dev/null"])
def test_a_device_is_refused_before_any_read(device: str) -> None:
    before = bytes_read()
    data, problem = read_head(device)
    assert data is None and problem == "not a regular file (a FIFO, device or socket)"
    assert bytes_read() - before < 4096  # /proc/self/io's own text


def test_a_fifo_a_directory_and_links_are_refused_without_blocking(tmp_path: Path) -> None:
    path = write_cpuinfo(tmp_path)
    os.mkfifo(path)
    assert read_cpuinfo(str(tmp_path)).problem == "not a regular file (a FIFO, device or socket)"
    path.unlink()
    path.mkdir()
    assert read_cpuinfo(str(tmp_path)).problem == "a directory, not a file"
    path.rmdir()
    for target in ("cpuinfo", "/dev/zero", "/proc/cpuinfo", "../../../../../../../proc/cpuinfo"):
        path.unlink(missing_ok=True)
        path.symlink_to(target)  # resolved inside the tree: a loop, or nothing there; never the live machine
        info = read_cpuinfo(str(tmp_path))
        assert not info.present and info.fields == {} and info.problem is not None and "link" in info.problem
    path.unlink()
    assert read_cpuinfo(str(tmp_path)) == Cpuinfo(str(path), {}, False, None)  # no file: nothing to say


def test_only_a_newline_ends_a_line_and_values_are_kept_exactly(tmp_path: Path) -> None:
    write_cpuinfo(tmp_path, b"model name\t: A\rvendor_id : AuthenticAMD\xc2\x85cpu family : 25\nstepping\t: \xff\n\n"
                            b"vendor_id : second\n")
    fields = read_cpuinfo(str(tmp_path)).fields
    assert fields == {"model name": "A\rvendor_id : AuthenticAMD\x85cpu family : 25", "stepping": "\udcff"}


@pytest.mark.parametrize(("value", "kept", "why"), [
    ("  Intel(R)\tXeon(R)   Gold  ", "Intel(R) Xeon(R) Gold", None),
    ("\x1b[2J\x1b[31mevil", None, "a character that is not printable ('\\x1b')"),
    ("A\rB", None, "a character that is not printable ('\\r')"),
    ("bad \udcff\udcfe", None, "bytes that are not UTF-8"),
    ("rtl \u202e", None, "a character that is not printable ('\\u202e')"),
    ("x" * 101, None, "longer than 100 characters"),
    ("", None, None),
])
def test_a_value_is_shown_only_as_the_kernel_writes_one(value: str, kept: str | None, why: str | None) -> None:
    assert field_text(value) == (kept, why)


@pytest.mark.parametrize("broken", ["fifo", "directory"])
def test_kinds_with_an_unreadable_cpuinfo(tmp_path: Path, broken: str) -> None:
    """The vendor is unknown: two kinds of max frequency may be an AMD before Zen 5's (no kinds there), so they are
    refused with the reason; one kind needs no vendor, and no warning is given."""
    for name, maxes in (("two", ["5000000"] * 2 + ["3300000"] * 2), ("one", ["5000000"] * 4)):
        root = tree(tmp_path / name, {MAX: maxes}, cpuinfo="")
        path = root / "proc/cpuinfo"
        path.unlink()
        os.mkfifo(path) if broken == "fifo" else path.mkdir()
        found = kinds_from_sysfs(str(root))
        if name == "two":
            assert found.kinds == () and len(found.warnings) == 1
            assert "the CPU's vendor is unknown" in found.warnings[0] and "proc/cpuinfo" in found.warnings[0]
        else:
            assert found.warnings == ()


def test_hwloc_xml_and_snapshot_values_follow_the_same_rule() -> None:
    from launcher.topology.cpu_identity import identity_from_hwloc_info, identity_from_json

    problems: list[str] = []
    found = identity_from_hwloc_info({"CPUVendor": "GenuineIntel", "CPUModel": "Xeon\u202e evil",
                                      "CPUFamilyNumber": "6"}, problems)
    assert found is not None and (found.vendor, found.model_name, found.family) == ("GenuineIntel", None, 6)
    assert problems == ["CPUModel 'Xeon\\u202e evil' ignored: a character that is not printable ('\\u202e')"]
    for bad in ("a\x1b[31mb", "\udcff", "x" * 101):
        assert identity_from_json({"vendor": "GenuineIntel", "model_name": bad})[0] is None
