"""``/proc`` read exactly and within bounds (issue 34, class 7), on files written as the kernel writes them: a
``maps`` line's path with spaces, the kernel's ``\\012`` for a newline, `` (deleted)``, bytes that are not UTF-8;
a ``stat`` line whose name holds ``)``, ``\\r`` and such bytes; the process table's descendants. The live processes:
tests/system/test_nccl_hostile_names.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.base import procfs
from launcher.doctor.nccl_live import is_nccl_library, is_nccl_thread, version_in_name

MAPS = (b"7f0000001000-7f0000002000 r--p 00000000 fe:00 11   /usr/lib/libc.so.6\n"
        b"00400000-00401000 r-xp 00000000 fe:00 12                  /opt/a b \\012c\xff/libnccl.so.2 (deleted)\n"
        b"7f0000003000-7f0000004000 r--p 00000000 fe:00 13   /opt/later/libnccl.so.2.30.1\n")


def fake_proc(tmp_path: Path, pid: int, **files: bytes) -> str:
    (tmp_path / str(pid)).mkdir(parents=True)
    for name, data in files.items():
        (tmp_path / str(pid) / name).write_bytes(data)
    return str(tmp_path)


def test_the_first_matching_mapping_exactly(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, 7, maps=MAPS)
    found = procfs.mapped_file(7, is_nccl_library, proc)
    assert found == procfs.MappedFile("/opt/a b \nc\udcff/libnccl.so.2", True, "400000-401000")
    assert procfs.mapped_file(7, lambda name: name == "nothing", proc) is None
    assert procfs.mapped_file(8, is_nccl_library, proc) is None  # gone


def test_libraries_are_their_exact_paths_within_the_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each library once, in first-mapped order, its path as the kernel has it: before, the libraries a runtime is
    named from were read with U+FFFD for a byte that is not UTF-8, the kernel's ``\\012`` left as it is, and no
    bound on the read."""
    proc = fake_proc(tmp_path, 7, maps=MAPS + MAPS)
    assert procfs.libraries(7, proc) == ["/usr/lib/libc.so.6", "/opt/a b \nc\udcff/libnccl.so.2",
                                         "/opt/later/libnccl.so.2.30.1"]
    monkeypatch.setattr(procfs, "MAPS_LIMIT", len(MAPS.splitlines(True)[0]))
    assert procfs.libraries(7, proc) == ["/usr/lib/libc.so.6"]


def test_descendants_are_below_the_root_and_never_older() -> None:
    """A pid reused by a process older than the root (its start time earlier) is no descendant."""
    def stat(pid: int, ppid: int, start: int) -> procfs.ThreadStat:
        return procfs.ThreadStat(pid, "x", "S", ppid, 0, 0, start=start)

    table = {10: stat(10, 1, 100), 11: stat(11, 10, 101), 12: stat(12, 11, 102), 13: stat(13, 10, 50),
             14: stat(14, 13, 103), 20: stat(20, 1, 100)}
    assert procfs.descendants(10, table) == [11, 12]
    assert procfs.descendants(99, table) == []


def test_a_stat_line_keeps_the_name_exactly(tmp_path: Path) -> None:
    fields = b" S 1 " + b" ".join(b"0" for _ in range(34)) + b" 3 0\n"
    proc = fake_proc(tmp_path, 9, cmdline=b"python\0\xff\r\0")
    (tmp_path / "9/task/9").mkdir(parents=True)
    (tmp_path / "9/task/9/stat").write_bytes(b"9 (a) (b\r\xff\x1b) " + fields[1:])
    stat = procfs.thread_stat(9, 9, proc)
    assert stat is not None and stat.comm == "a) (b\r\udcff\x1b" and stat.state == "S" and stat.processor == 3
    assert procfs.cmdline(9, proc) == ["python", "\udcff\r"]


def test_names_nccl_and_torch_write() -> None:
    assert is_nccl_thread("NCCL Progress 0") and is_nccl_thread("NCCL IbAsync  0")
    for name in ("NCCL Proxy\x1b[2J", "NCCL\r", "NCCL \udcff", "NCCL Servic\u0435", "nccl proxy", "NCCLx"):
        assert not is_nccl_thread(name), name
    assert version_in_name("/x/libnccl.so.2.29.3") == (2, 29, 3)
    for name in ("libnccl.so.2.\u0662\u0669.3", "libnccl.so.2.29.3\n", "libnccl.so.2.29.3.bak"):
        assert version_in_name(f"/x/{name}") is None, name
