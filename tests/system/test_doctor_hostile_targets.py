"""``affrun doctor --pid`` and ``affrun show --pid`` against hostile live targets: processes that change while
sampled (an ``execve``, threads and children that come and go), a process of another user, environments whose
values would expand to billions of CPU ids, ``AFFRUN_*`` variables that cannot be a binding made here, and names
that are not text. Every target is a real process started here; the doctor is the real CLI.
"""

from __future__ import annotations

import json
import os
import resource
import shlex
import shutil
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from launcher.base.cpulist import format_cpulist
from tests.conftest import need
from tests.launch import affrun_argv, clean_env, communicate, run
from tests.system.test_doctor_live import _refused, audit, running
from tests.system.test_untrusted_text import assert_clean, escaped

pytestmark = pytest.mark.slow
SLEEPER = "import os, time\nos.write(1, f'READY {os.getpid()}\\n'.encode())\ntime.sleep(600)\n"
RANK = {"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "AFFRUN_LOCAL_RANK": "0", "AFFRUN_PLAN_ID": "test"}
HUGE_ID = 65000  # a CPU id (affrun reads ids up to 65535) that no machine running these tests has online


def process(data: dict[str, Any], pid: int) -> dict[str, Any]:
    return next(p for p in data["processes"] if p["pid"] == pid)


def doctor_limited(pid: int, memory: int = 2 << 30, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``affrun doctor --pid PID --duration 0.2 --json`` with at most ``memory`` bytes of address space: a reader
    that expands a value without bound fails here instead of taking the machine's memory."""
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))

    argv = affrun_argv("doctor", "--pid", str(pid), "--duration", "0.2", "--json")
    with subprocess.Popen(argv, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          preexec_fn=limit) as child:
        try:
            out, err = communicate(child, timeout)
        except subprocess.TimeoutExpired:
            child.kill()
            child.communicate()
            pytest.fail(f"affrun doctor --pid {pid} ran over {timeout:.0f} s")
    return subprocess.CompletedProcess(argv, child.returncode, out, err)


# ----------------------------------------------------------------------------- targets that change
CHANGING = {
    "threads": ("import os, threading\nos.write(1, f'READY {os.getpid()}\\n'.encode())\nwhile True:\n"
                "    ts = [threading.Thread(target=lambda: None) for _ in range(20)]\n"
                "    [t.start() for t in ts]\n    [t.join() for t in ts]\n"),
    "children": ("import os\nos.write(1, f'READY {os.getpid()}\\n'.encode())\nwhile True:\n    pid = os.fork()\n"
                 "    if pid == 0:\n        os._exit(0)\n    os.waitpid(pid, 0)\n"),
    "zombies": ("import os, time\nos.write(1, f'READY {os.getpid()}\\n'.encode())\nfor _ in range(2000):\n"
                "    if os.fork() == 0:\n        os._exit(0)\n    time.sleep(0.0005)\ntime.sleep(600)\n"),
    "exits": "import os, time\nos.write(1, f'READY {os.getpid()}\\n'.encode())\ntime.sleep(0.3)\n",
}


@pytest.mark.parametrize("kind", sorted(CHANGING))
def test_a_target_that_changes_while_sampled_gives_a_report(kind: str) -> None:
    """Threads and children that start and end at a high rate, children left unreaped, a job that exits while
    sampled: a report (JSON that parses, text without a traceback), never an error."""
    with running([sys.executable, "-c", CHANGING[kind]], clean_env()) as (_proc, lines):
        pid = int(lines[-1].split()[1])
        _, data = audit(pid, 0.5)
        text = run(affrun_argv("doctor", "--pid", str(pid), "--duration", "0.3"), timeout=120)
    assert process(data, pid)["threads"], data
    assert text.returncode in (0, 1) and "Traceback" not in text.stderr, text.stderr[-3000:]


def test_a_program_run_by_exec_mid_sample_is_reported_as_that_program(tmp_path: Path) -> None:
    """The target runs another program (``execve``) with a binding in its environment while it is sampled: the
    report shows that program, its command line and the plan its environment carries."""
    need(hasattr(os, "pidfd_open"), "needs pidfd_open (Linux 5.3) to see when the doctor has begun sampling")
    sleep = shutil.which("sleep")
    need(sleep is not None, "no sleep program")
    mask = format_cpulist(os.sched_getaffinity(0))
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **RANK, "AFFRUN_CPUS": mask, "AFFRUN_THREADS": "1"}
    code = ("import json, os, signal, sys\nsignal.signal(signal.SIGUSR1, lambda *_: os.execve(sys.argv[1], "
            "['sleep', '600'], json.loads(sys.argv[2])))\nos.write(1, f'READY {os.getpid()}\\n'.encode())\n"
            "while True:\n    signal.pause()\n")
    with running([sys.executable, "-c", code, str(sleep), json.dumps(env)], clean_env()) as (proc, _lines):
        doctor = subprocess.Popen(affrun_argv("doctor", "--pid", str(proc.pid), "--duration", "3", "--json"),
                                  env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 120
        while not _watches(doctor.pid, proc.pid):  # the doctor opens a pidfd of its target, then samples it
            assert doctor.poll() is None and time.monotonic() < deadline, "the doctor never began sampling"
            time.sleep(0.02)
        time.sleep(0.5)  # its first samples: the python program
        os.kill(proc.pid, signal.SIGUSR1)
        out, err = communicate(doctor, 120)
    assert doctor.returncode in (0, 1), err[-3000:]
    record = process(json.loads(out), proc.pid)
    assert (record["comm"], record["cmdline"]) == ("sleep", ["sleep", "600"]), record
    assert record["plan_source"] == "its AFFRUN_* variables" and record["thread_plan"]["main"]["cpus"] == mask


def _watches(doctor: int, target: int) -> bool:
    """Whether ``doctor`` holds a pidfd of ``target`` (``Pid:`` in its ``fdinfo``)."""
    try:
        for fd in os.listdir(f"/proc/{doctor}/fdinfo"):
            if f"Pid:\t{target}\n" in Path(f"/proc/{doctor}/fdinfo/{fd}").read_text():
                return True
    except OSError:
        pass
    return False


# ----------------------------------------------------------------------------- odd targets
def _as_nobody() -> list[str]:
    """The words that run a command as user nobody (the tests run as root), where that user can run this checkout."""
    setpriv = shutil.which("setpriv")
    need(setpriv is not None, "no setpriv (util-linux) to run the doctor as another user")
    words = [str(setpriv), "--reuid=65534", "--regid=65534", "--clear-groups"]
    probe = subprocess.run([*words, sys.executable, "-c", "import launcher.cli"], capture_output=True, cwd="/",
                           env=clean_env(), timeout=120)
    need(probe.returncode == 0, "user nobody cannot run this checkout")
    return words


@pytest.mark.parametrize("command", ["doctor", "show"])
def test_a_process_of_another_user_is_refused(command: str) -> None:
    """The kernel lets anyone read another user's ``stat`` and ``status``, not its environment or maps: no report
    without them (it would say no AFFRUN_* variables and no runtimes, unread). Run as root, the doctor runs as
    nobody against a process of root; otherwise against pid 1 where another user owns it."""
    nobody = _as_nobody() if os.geteuid() == 0 else []
    with running([sys.executable, "-c", SLEEPER], clean_env(**RANK, AFFRUN_CPUS="0")) as (proc, _lines):
        pid = proc.pid if nobody else 1
        if not nobody and os.stat("/proc/1").st_uid == os.geteuid():
            pytest.skip("pid 1 is this user's, who is not root: no process of another user can be started")
        argv = [*nobody, *affrun_argv(command, "--pid", str(pid), "--duration", "0.2")]
        result = subprocess.run(argv, capture_output=True, text=True, cwd="/", env=clean_env(), timeout=120)
    _refused(result, f"--pid {pid}: cannot read /proc/{pid}/environ", "run as the job's user or root")


@pytest.mark.parametrize("pid", ["-1", "-0", "4194305", str(2**31), str(2**64), "1" * 100])
def test_pids_no_process_can_have_are_one_error(pid: str) -> None:
    _refused(run(affrun_argv("doctor", "--pid", pid, "--duration", "0.2"), timeout=120), "--pid")


def test_the_doctor_audits_itself() -> None:
    """``exec affrun doctor --pid $$``: the doctor is its own target, and reports itself."""
    argv = " ".join(a if a == "$$" else shlex.quote(a)
                    for a in affrun_argv("doctor", "--pid", "$$", "--duration", "0.2", "--json"))
    proc = run(["sh", "-c", f"exec {argv}"], timeout=120)
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    data = json.loads(proc.stdout)
    assert [p["pid"] for p in data["processes"]] == [data["pid"]] and data["processes"][0]["alive"]


# ----------------------------------------------------------------------------- the environment
BOMB = 127 * 1024  # a value just under the kernel's 128 KiB limit on one string of an environment


@pytest.mark.parametrize("name", ["AFFRUN_CPUS", "GOMP_CPU_AFFINITY", "OMP_PLACES"])
def test_a_value_of_billions_of_cpu_ids_is_not_expanded(name: str) -> None:
    """``0-65535`` 16,000 times in one variable: a reader that expands each range asks for a billion ids (an hour
    of CPU for a CPU list, 30 GiB for GOMP_CPU_AFFINITY's list). The doctor does not read such a value."""
    unit = {"OMP_PLACES": "{0:65535},"}.get(name, "0-65535,")
    value = (unit * (BOMB // len(unit))).rstrip(",")
    env = clean_env(**{**RANK, "AFFRUN_CPUS": format_cpulist(os.sched_getaffinity(0)), name: value})
    with running([sys.executable, "-c", SLEEPER], env) as (proc, _lines):
        result = doctor_limited(proc.pid)
    assert result.returncode in (0, 1) and "Traceback" not in result.stderr, result.stderr[-3000:]
    rank = process(json.loads(result.stdout), proc.pid)
    if name == "AFFRUN_CPUS":
        assert rank["thread_plan"] is None and "ranges span over" in rank["plan_problem"], rank
    else:
        assert rank["thread_plan"] is not None, rank


def test_the_span_of_a_value_counts_its_ranges() -> None:
    """What the screen counts (launcher.doctor.target_environ): each range up to 65,536 ids, a run of digits alone
    nothing, whatever its length."""
    from launcher.doctor.target_environ import SPAN_LIMIT, screened, span

    assert span("0-7,56-63") == 14 and span("{0:4}:8:2") == 4 + 2 and span("0-15:2") == 15
    assert span("{60000:4},{60004:4}") == 8  # an interval's length, wherever it starts
    assert span("9" * 100_000) == 0 and span("0-" + "9" * 5000) == 65_536
    bomb = "0-65535," * 3
    assert span(bomb) > SPAN_LIMIT and screened({"A": bomb, "B": "0-65535"}) == {
        "A": f"(a value of {len(bomb)} characters whose ranges span over 131,072 CPU ids: not read)", "B": "0-65535"}


def _judged(tmp_path: Path, **variables: str) -> tuple[dict[str, Any], str, int]:
    """The JSON and text reports of a sleeping rank with ``variables``, and its pid."""
    with running([sys.executable, "-c", SLEEPER], clean_env(**RANK, **variables)) as (proc, _lines):
        _, data = audit(proc.pid, 0.2)
        text = run(affrun_argv("doctor", "--pid", str(proc.pid), "--duration", "0.2"), timeout=120)
        svg = tmp_path / "live.svg"
        show = run(affrun_argv("show", "--pid", str(proc.pid), "--duration", "0.2", "--svg", str(svg)), timeout=120)
    assert text.returncode in (0, 1) and show.returncode == 0, text.stderr[-3000:] + show.stderr[-3000:]
    assert_clean(text.stdout)
    assert_clean(show.stdout)
    ET.parse(svg)
    return data, text.stdout + show.stdout, proc.pid


@pytest.mark.parametrize("cpus", ["lacking", "partly"])
def test_a_binding_to_cpus_the_machine_lacks_is_not_claimed(tmp_path: Path, cpus: str) -> None:
    """AFFRUN_CPUS names CPUs that are not online: no mask can hold them, so they are neither the rank's CPUs nor
    homes its threads stray from."""
    first = min(os.sched_getaffinity(0))
    value = f"{HUGE_ID}-{HUGE_ID + 3}" if cpus == "lacking" else f"{first},{HUGE_ID}"
    data, text, pid = _judged(tmp_path, AFFRUN_CPUS=value, AFFRUN_THREADS="4")
    rank = process(data, pid)
    assert rank["thread_plan"] is None and "names CPUs this machine lacks" in rank["plan_problem"], rank
    assert rank["owned_cpus"] == format_cpulist(os.sched_getaffinity(0)), rank  # its mask, inherited from here
    assert not any(str(HUGE_ID) in f["message"] for f in data["findings"]), data["findings"]
    claims = [line for line in text.splitlines() if str(HUGE_ID) in line and "threads: no thread plan" not in line]
    assert not claims, text  # said once, as the reason it has no plan: no line shows it as the rank's CPUs


def test_affrun_variables_that_are_garbage(tmp_path: Path) -> None:
    """A CPU list with an escape sequence and a newline is no plan, and the report says so (escaped); nor is a
    thread count past any machine's CPU ids, nor one above the rank's CPUs: the one strict reader of a rank's
    values (launcher.bind.readback.read_binding), as the rank's hooks read them, refuses them and the report
    says why."""
    garbage = "\x1b[31m0\nerror forged: line"
    data, text, pid = _judged(tmp_path, AFFRUN_CPUS=garbage)
    assert process(data, pid)["plan_problem"] == f"AFFRUN_CPUS={garbage!r} is not a cpu list"
    assert f"no thread plan (AFFRUN_CPUS={garbage!r} is not a cpu list)" in text
    mask = os.sched_getaffinity(0)
    for threads in ("9" * 39, str(len(mask) + 1)):
        data, _, pid = _judged(tmp_path, AFFRUN_CPUS=format_cpulist(mask), AFFRUN_THREADS=threads)
        rank = process(data, pid)
        assert rank["thread_plan"] is None and rank["plan_problem"].startswith("AFFRUN_THREADS="), rank


def test_names_that_are_not_text_stay_escaped_in_every_output(tmp_path: Path) -> None:
    """A process and a thread named with bytes that are not UTF-8, an escape sequence and markup, a command line
    with a newline and a 100,000-character word: the text reports are clean, JSON is exact, the SVG parses."""
    comm, name = b"\xff\x1b[31m\n<&\xfe", b"\xc3(<svg\x07\r"
    code = ("import ctypes, os, sys, threading, time\nlibc = ctypes.CDLL(None)\n"
            f"open('/proc/self/comm', 'wb').write({comm!r})\n"
            f"def named():\n    libc.prctl(15, {name!r}, 0, 0, 0)\n    time.sleep(600)\n"
            "threading.Thread(target=named, daemon=True).start()\ntime.sleep(0.1)\n"
            "os.write(1, f'READY {os.getpid()}\\n'.encode())\ntime.sleep(600)\n")
    word = "x" * 100_000
    with running([sys.executable, "-c", code, "a\nerror forged: line", word], clean_env(BAD="\udcff")) as (proc, _):
        _, data = audit(proc.pid, 0.2)
        text = run(affrun_argv("doctor", "--pid", str(proc.pid), "--duration", "0.2"), timeout=120)
        svg = tmp_path / "live.svg"
        show = run(affrun_argv("show", "--pid", str(proc.pid), "--duration", "0.2", "--svg", str(svg)), timeout=120)
    record = process(data, proc.pid)
    assert record["comm"] == os.fsdecode(comm) and os.fsdecode(name) in [t["comm"] for t in record["threads"]]
    assert record["cmdline"][-2:] == ["a\nerror forged: line", word]
    for out in (text.stdout, show.stdout):
        assert_clean(out)
        assert escaped(os.fsdecode(comm)) in out
    labels = "".join(ET.parse(svg).getroot().itertext())
    assert escaped(os.fsdecode(comm)) in labels


# ----------------------------------------------------------------------------- size
def test_many_children_of_a_many_threaded_rank_cost_one_read_per_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """A rank with 200 threads and 30 children: one sample reads each thread's mask once, and its parent's once
    more, not once for each child (figures in docs/doctor.md)."""
    from launcher.base import procfs
    from launcher.doctor.sampling import sample_job

    code = ("import os, threading, time\nfor _ in range(30):\n    if os.fork() == 0:\n        time.sleep(600)\n"
            "e = threading.Event()\nfor _ in range(200):\n    threading.Thread(target=e.wait, daemon=True).start()\n"
            "os.write(1, f'READY {os.getpid()}\\n'.encode())\ntime.sleep(600)\n")
    reads: list[int] = []
    real = procfs.allowed_cpus

    def counted(pid: int, tid: int | None = None, proc: str = procfs.PROC) -> frozenset[int] | None:
        reads.append(pid)
        return real(pid, tid, proc)

    monkeypatch.setattr(procfs, "allowed_cpus", counted)
    with running([sys.executable, "-c", code], clean_env()) as (proc, _lines):
        job = sample_job(proc.pid, duration=0.0)
    threads = sum(len(p.threads) for p in job.processes)
    assert job.samples == 1 and threads == 231, (job.samples, threads)
    parent = len(os.listdir(f"/proc/{os.getpid()}/task"))  # the rank's parent: this test's process
    ours = {p.pid for p in job.processes} | {os.getpid()}  # busy processes outside the job: once an audit (neighbours)
    reads = [pid for pid in reads if pid in ours]
    assert len(reads) <= threads + parent + 201, len(reads)  # the rank's threads once more, for all its children


DUPLICATE_ENV = r"""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
argv = (ctypes.c_char_p * 3)(b"/bin/sleep", b"60", None)
envp = (ctypes.c_char_p * 4)(b"AFFRUN_PROBE=first", b"AFFRUN_PROBE=second", b"ODD=\xff", None)
libc.execve(b"/bin/sleep", argv, envp)
raise SystemExit(f"execve failed: {os.strerror(ctypes.get_errno())}")
"""


def test_a_name_given_twice_reads_as_getenv_finds_it() -> None:
    """``execve`` with an environment that names a variable twice: ``getenv`` (and Python) find the first value;
    the doctor read the last. A byte that is not UTF-8 reads as U+FFFD."""
    from launcher.doctor.target_environ import read_target_environ

    proc = subprocess.Popen([sys.executable, "-c", DUPLICATE_ENV])
    try:
        deadline = time.monotonic() + 30
        while not Path(f"/proc/{proc.pid}/cmdline").read_bytes().startswith(b"/bin/sleep"):
            assert proc.poll() is None and time.monotonic() < deadline, "the probe did not exec sleep"
            time.sleep(0.02)
        assert read_target_environ(proc.pid) == {"AFFRUN_PROBE": "first", "ODD": "\ufffd"}
    finally:
        proc.kill()
        proc.wait()
