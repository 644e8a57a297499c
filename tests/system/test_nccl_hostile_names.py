"""Issue 34, class 7: ``affrun doctor --pid`` and ``affrun show --pid`` on hostile names, with real processes: a
``libnccl`` compiled here and loaded with ``dlopen`` from a directory whose name holds spaces, a newline (the
kernel writes ``\\012`` in ``/proc/PID/maps``), `` (deleted)``, an escape sequence or bytes that are not UTF-8; a
library deleted and replaced by another version after it was loaded; threads named with ``prctl(PR_SET_NAME)``
(15 bytes) with escape sequences, ``\\r``, BEL, bytes that are not UTF-8, and names that imitate NCCL's and
torch's with a suffix of control characters; a process whose ``/proc/PID/comm`` holds the same.

Text reports show every such name escaped; ``--json`` keeps it exactly (bytes that are not UTF-8 as Python keeps
them, ``\\udcff``); a thread is NCCL's or torch's only by a name those write (printable ASCII).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import need
from tests.launch import affrun_argv, run
from tests.system.test_doctor_live import audit, findings, job_env, running
from tests.system.test_untrusted_text import assert_clean, escaped

pytestmark = pytest.mark.slow

JOB = r"""
import ctypes, json, os, sys, threading, time
spec = json.loads(sys.argv[1])
ctypes.CDLL(os.fsdecode(bytes.fromhex(spec["library"])))  # dlopen, as torch loads libnccl
libc = ctypes.CDLL(None)
for path, data in spec.get("replace", []):  # the file at the path changes after it was loaded
    path = os.fsdecode(bytes.fromhex(path))
    os.unlink(path)
    with open(path, "wb") as fh:
        fh.write(bytes.fromhex(data))
up = []

def named(name):
    libc.prctl(15, bytes.fromhex(name), 0, 0, 0)  # PR_SET_NAME: the kernel keeps 15 bytes
    up.append(threading.get_native_id())
    time.sleep(3600)

for name in spec.get("threads", []):
    threading.Thread(target=named, args=(name,), daemon=True).start()
while len(up) < len(spec.get("threads", [])):
    time.sleep(0.01)
if spec.get("comm"):
    with open("/proc/self/comm", "wb") as fh:
        fh.write(bytes.fromhex(spec["comm"]))
os.write(1, f"READY {os.getpid()}\n".encode())
time.sleep(120)
"""

# Directory names: spaces, a newline, what the kernel appends to a deleted file's path, an escape sequence that
# would forge a line, bytes that are not UTF-8.
DIRECTORIES = [b"with spaces", b"new\nline", b"lib (deleted)", b"esc\x1b[2J\x1b[31merror forged: line", b"bad\xff\xfe"]


def compile_nccl(directory: Path, name: bytes, version: str) -> bytes:
    """A real shared object named ``name`` carrying NCCL's version string; the path of the copy in ``directory``."""
    need(shutil.which("gcc"), "gcc is not installed")
    src = directory / "nccl.c"
    src.write_text(f'__attribute__((used)) const char nccl_version[] = "NCCL version {version}+cuda12.8";\n'
                   "int ncclGetVersion(int *v) { *v = 0; return 0; }\n")
    out = directory / f"nccl-{version}.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(out), str(src)], check=True)
    return bytes(out)


def start(tmp_path: Path, spec: dict[str, Any]) -> Any:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    return running([sys.executable, str(script), json.dumps(spec)], job_env())


def doctor(pid: int) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    text = run(affrun_argv("doctor", "--pid", str(pid), "--duration", "0.3"), timeout=120)
    assert "Traceback" not in text.stderr, text.stderr[-3000:]
    assert text.returncode in (0, 1), text.stderr[-3000:]
    assert_clean(text.stdout)
    _, data = audit(pid, 0.3)
    return text, data


@pytest.mark.parametrize("directory", DIRECTORIES, ids=repr)
@pytest.mark.parametrize("name", [b"libnccl.so.2.29.3", b"libnccl.so.2"])
def test_a_libnccl_path_with_odd_characters(tmp_path: Path, directory: bytes, name: bytes) -> None:
    """The path is shown escaped and kept exactly in JSON; the version comes from the name, else from the string
    in the file that was loaded (2.29.5 here, in the range that leaks the mask)."""
    built = compile_nccl(tmp_path, name, "2.29.5")
    where = bytes(tmp_path) + b"/" + directory
    os.mkdir(where)
    library = where + b"/" + name
    shutil.copy(built, library)
    with start(tmp_path, {"library": library.hex()}) as (_proc, lines):
        pid = int(next(x for x in lines if x.startswith("READY")).split()[1])
        text, data = doctor(pid)
    path = os.fsdecode(library)
    version = "2.29.3" if name.endswith(b".3") else "2.29.5"
    found = findings(data)
    assert found["nccl-loaded"]["message"] == f"NCCL {version} is loaded ({path})"
    assert f"NCCL {version} leaks" in found["nccl-mask-leak"]["message"]
    line = next(x for x in text.stdout.splitlines() if "nccl-loaded" in x)
    assert f"NCCL {version} is loaded ({escaped(path)})" in line


def test_a_libnccl_deleted_and_replaced_since_it_was_loaded(tmp_path: Path) -> None:
    """The file now at the path (2.30.1) is not the one loaded (2.29.3): its version is never claimed. The one
    loaded is read through /proc/PID/map_files where this user may open it (root), else it is unknown."""
    loaded = Path(os.fsdecode(compile_nccl(tmp_path, b"libnccl.so.2", "2.29.3")))
    newer = Path(os.fsdecode(compile_nccl(tmp_path, b"libnccl.so.2", "2.30.1")))
    library = tmp_path / "lib" / "libnccl.so.2"
    library.parent.mkdir()
    shutil.copy(loaded, library)
    spec = {"library": bytes(library).hex(), "replace": [[bytes(library).hex(), newer.read_bytes().hex()]]}
    with start(tmp_path, spec) as (_proc, lines):
        pid = int(next(x for x in lines if x.startswith("READY")).split()[1])
        root = os.access(f"/proc/{pid}/map_files", os.R_OK) and bool(os.listdir(f"/proc/{pid}/map_files"))
        _, data = doctor(pid)
    found = findings(data)
    message = found["nccl-loaded"]["message"]
    assert "2.30.1" not in json.dumps(data["findings"])
    assert message.endswith(f"({library}, deleted or replaced since it was loaded)"), message
    assert message.startswith("NCCL 2.29.3 is loaded" if root else "NCCL of unknown version is loaded"), message


# Thread names as the kernel keeps them (15 bytes at most): two of NCCL's and torch's own, then imitations.
GENUINE = {b"NCCL Progress 0": "nccl_proxy", b"pt_autograd_0": "torch"}
HOSTILE = [b"NCCL Proxy\x1b[2J", b"NCCL Service\r\x07", b"NCCL \xff\xfe", b"pt_data_pin\x1b[K", b"PTThreadPool\r",
           b"pt_autograd\x1b]0", b"\x1b]0;title\x07", b"bell\x07cr\rnl\n", b"bad\xff\xfeutf8"]


def test_thread_and_process_names_with_control_characters(tmp_path: Path) -> None:
    built = compile_nccl(tmp_path, b"libnccl.so.2", "2.30.1")
    comm = b"x\x1b[31m\r\xffNCCL"
    spec = {"library": built.hex(), "threads": [n.hex() for n in [*GENUINE, *HOSTILE]], "comm": comm.hex()}
    with start(tmp_path, spec) as (_proc, lines):
        pid = int(next(x for x in lines if x.startswith("READY")).split()[1])
        kernel = {int(t): os.fsdecode(Path(f"/proc/{pid}/task/{t}/comm").read_bytes()[:-1])
                  for t in os.listdir(f"/proc/{pid}/task")}
        text, data = doctor(pid)
        show = run(affrun_argv("show", "--pid", str(pid), "--duration", "0.3", "--svg", str(tmp_path / "live.svg")))
    record = next(p for p in data["processes"] if p["pid"] == pid)
    assert record["comm"] == os.fsdecode(comm)  # exact: \r kept, 0xff as \udcff
    threads = {t["tid"]: t for t in record["threads"]}
    assert {tid: threads[tid]["comm"] for tid in kernel} == kernel  # every name exactly as the kernel has it
    roles = {t["comm"]: (t["role"], t["identified_by"]) for t in record["threads"] if t["tid"] != pid}
    for name, role in GENUINE.items():
        assert roles[os.fsdecode(name)] == (role, "name")
    for name in HOSTILE:  # judged by what they are: nothing names them but themselves
        assert roles[os.fsdecode(name)] == ("unknown", "none"), name
    (nccl,) = [f for f in data["findings"] if f["id"] in ("nccl-threads", "nccl-threads-shared")]
    assert nccl["message"].startswith("1 NCCL thread(s) (NCCL Progress 0) ran on"), nccl["message"]
    for name in [comm, *HOSTILE]:
        assert escaped(os.fsdecode(name)) in text.stdout
    assert show.returncode == 0 and "Traceback" not in show.stderr, show.stderr[-3000:]
    assert_clean(show.stdout)
    assert f"process {escaped(os.fsdecode(comm))} (pid {pid})" in show.stdout
    svg = (tmp_path / "live.svg").read_text(encoding="utf-8")
    ET.fromstring(svg)  # well-formed XML: no control character in it
    assert f"process {escaped(os.fsdecode(comm))} (pid {pid})" in svg
