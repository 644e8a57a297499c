"""Issue 34, class 7: a hostile ``proc/cpuinfo`` under ``--fsroot``, through ``affrun topology`` (text and
``--json``), ``affrun plan``, ``affrun doctor`` and a ``--tuned`` file's machine check: huge (a sparse 1 GiB file,
a 10 MB line, 100,000 flags), binary, with NUL bytes, a FIFO without a writer, a directory, links that loop or
point out of the tree (at ``/dev/zero``, ``/dev/urandom``, the live ``/proc/cpuinfo``), a model name with escape
sequences and bytes that are not UTF-8.

Machine data that cannot be trusted gets the documented fallback with a warning: no identity, or the values the
kernel could have written, each command in seconds, and never a traceback, a hang or an unescaped character.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.fakesys import uniform, write_tree
from tests.launch import affrun_argv, run
from tests.system.test_untrusted_text import assert_clean

pytestmark = pytest.mark.slow
INTEL = b"processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\n"
# What each case leaves of the identity (None: none), and what its warning says.
CASES: dict[str, tuple[Callable[[Path], object], dict[str, object] | None, str]] = {
    "sparse 1 GiB": (lambda p: subprocess.run(["truncate", "-s", "1G", str(p)], check=True), None,
                     "does not end within 256 KiB"),
    "binary": (lambda p: p.write_bytes(random.Random(7).randbytes(1 << 20)), None, "no CPU identity in it"),
    "NUL bytes": (lambda p: p.write_bytes(b"vendor_id\t: Genuine\0Intel\nmodel name\t: Xeon\0\ncpu family\t: 6\n"),
                  {"vendor": None, "model_name": None, "family": 6}, "vendor_id 'Genuine\\x00Intel' ignored"),
    "a 10 MB line": (lambda p: p.write_bytes(b"model name\t: " + b"x" * 10_000_000 + b"\n"), None,
                     "does not end within 256 KiB"),
    "100,000 flags": (lambda p: p.write_bytes(INTEL + b"flags\t\t: " + b" ".join(b"f%d" % i for i in range(100_000))
                                              + b" hybrid_cpu\n\n"),
                      {"vendor": "GenuineIntel", "family": 6, "flags": None}, "does not end within 256 KiB"),
    "a FIFO": (os.mkfifo, None, "not a regular file"),
    "a directory": (lambda p: p.mkdir(), None, "a directory"),
    "a link loop": (lambda p: p.symlink_to("cpuinfo"), None, "loop of links"),
    "a link to /dev/zero": (lambda p: p.symlink_to("/dev/zero"), None, "a link to nothing"),
    "a link to /dev/urandom": (lambda p: p.symlink_to("../../../../../../../../dev/urandom"), None,
                               "a link to nothing"),
    "a link to the live cpuinfo": (lambda p: p.symlink_to("/proc/cpuinfo"), None, "loop of links"),
    "escapes in the model name": (
        lambda p: p.write_bytes(INTEL + b"model name\t: \x1b[2J\x1b[31mevil\xff\xfe\rerror forged: line\n\n"),
        {"vendor": "GenuineIntel", "model_name": None, "family": 6},
        "model name '\\x1b[2J\\x1b[31mevil\\udcff\\udcfe\\rerror ... ignored: a character that is not printable"),
}


def hostile_tree(tmp_path: Path, case: str) -> Path:
    root = write_tree(tmp_path / "root", uniform(1, 2))
    (root / "proc").mkdir(exist_ok=True)
    CASES[case][0](root / "proc/cpuinfo")
    return root


def affrun(*args: str) -> subprocess.CompletedProcess[str]:
    proc = run(affrun_argv(*args), timeout=120)
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert_clean(proc.stdout)
    assert_clean(proc.stderr)
    return proc


@pytest.mark.parametrize("case", CASES)
def test_topology_plan_and_doctor_on_a_hostile_cpuinfo(tmp_path: Path, case: str) -> None:
    root = str(hostile_tree(tmp_path, case))
    _, expected, warning = CASES[case]
    data = json.loads(affrun("topology", "--fsroot", root, "--json").stdout)
    warnings = [w for w in data["warnings"] if "proc/cpuinfo" in w]
    assert len(warnings) == 1 and warning in warnings[0], data["warnings"]
    assert all(w.isprintable() and len(w) < 500 for w in data["warnings"])
    if expected is None:
        assert data["cpu"] is None
    else:
        assert {k: data["cpu"][k] for k in expected} == expected
    text = affrun("topology", "--fsroot", root)
    assert text.returncode == 0 and any(line.startswith("warning: ") and "proc/cpuinfo" in line
                                        for line in text.stdout.splitlines())
    assert affrun("plan", "--fsroot", root, "--nproc-per-node", "2").returncode == 0
    doctor = affrun("doctor", "--fsroot", root, "--json")
    assert doctor.returncode in (0, 1) and json.loads(doctor.stdout)["cpu"] == (
        None if expected is None else {**data["cpu"], "core_kinds": []})
    assert affrun("doctor", "--fsroot", root).returncode in (0, 1)


@pytest.mark.parametrize("case", ["a FIFO", "a 10 MB line", "escapes in the model name"])
def test_a_tuned_files_machine_check_reads_the_same_way(tmp_path: Path, case: str) -> None:
    """``--tuned``'s check of the machine (its CPU model) used to open ``proc/cpuinfo`` itself: a FIFO hung
    ``affrun exec`` for good, and a 10 MB model name made a 10 MB warning line."""
    root = str(hostile_tree(tmp_path, case))
    tuned = tmp_path / "tuned.yaml"
    tuned.write_text("affrun-tuned: 1\noptions:\n  loader-cores: 1\nmachine:\n  cpu-model: Tuned CPU\ndate: today\n")
    proc = affrun("exec", "--tuned", str(tuned), "--fsroot", root, "--dry-run", "--nproc-per-node", "1",
                  "--local-rank", "0", "--", sys.executable, "-c", "pass")
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stderr.splitlines() if "was tuned on another machine" in x)
    assert "cpu-model 'Tuned CPU' there, 'unknown' here" in line and len(line) < 500
