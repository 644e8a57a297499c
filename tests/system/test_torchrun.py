"""``affrun torchrun`` with real torchrun, real ranks and real OpenMP runtimes on this machine."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
from pathlib import Path

import pytest

from launcher.base.cpulist import parse_cpulist
from launcher.bind.handoff import exec_prefix
from tests.fakesys import this_machine_with_gpus, write_tree
from tests.launch import (
    GOMP_LINE,
    RANK_PROBE,
    affrun_argv,
    alive,
    clean_env,
    default_sigint,
    json_lines,
    rank_lines,
    run,
    torchrun_argv,
)

pytestmark = pytest.mark.torch
NCPU = len(os.sched_getaffinity(0))


def test_two_ranks_get_disjoint_single_cpus_and_bound_threads() -> None:
    nproc = min(2, NCPU)
    proc = run(affrun_argv("torchrun", "--nproc-per-node", str(nproc), str(RANK_PROBE)),
               env=clean_env(OMP_DISPLAY_AFFINITY="true"), check=True)
    reports = sorted(json_lines(proc.stdout), key=lambda r: r["local_rank"])
    assert [r["local_rank"] for r in reports] == list(range(nproc))
    masks = [set(parse_cpulist(r["cpus_allowed_list"])) for r in reports]
    for i, a in enumerate(masks):
        assert len(a) == NCPU // nproc
        for b in masks[i + 1 :]:
            assert a.isdisjoint(b), f"rank masks overlap: {masks}"
    for r, mask in zip(reports, masks):
        assert set(r["mask"]) == mask
        assert r["env"]["OMP_NUM_THREADS"] == str(len(mask))
        assert r["torch_threads"] == len(mask)
        assert r["env"]["AFFRUN_CPUS"] == r["cpus_allowed_list"]
        assert r["env"]["KMP_AFFINITY"] != "disabled"
        # libgomp's own report of the main thread's place is inside the rank's mask
        assert r["gomp_main_affinity"] and set(parse_cpulist(r["gomp_main_affinity"])) <= mask
    # every libgomp binding line printed under OMP_DISPLAY_AFFINITY is inside one rank's mask
    bound = [set(parse_cpulist(m["cpus"])) for m in GOMP_LINE.finditer(proc.stderr)]
    assert all(any(b <= mask for mask in masks) for b in bound)
    # the user sees which value each rank got
    lines = rank_lines(proc.stderr)
    assert sorted(int(line["rank"]) for line in lines) == list(range(nproc))
    assert all(line["omp"] == "1" for line in lines) if nproc == NCPU else True


def test_one_rank_two_threads_bound_inside_its_mask() -> None:
    proc = run(affrun_argv("torchrun", "--nproc-per-node", "1", str(RANK_PROBE)),
               env=clean_env(OMP_DISPLAY_AFFINITY="true"), check=True)
    (report,) = json_lines(proc.stdout)
    mask = set(parse_cpulist(report["cpus_allowed_list"]))
    assert mask == os.sched_getaffinity(0)
    assert report["torch_threads"] == NCPU
    lines = [set(parse_cpulist(m["cpus"])) for m in GOMP_LINE.finditer(proc.stderr)]
    assert len(lines) >= NCPU, proc.stderr  # one line per team thread
    assert all(b <= mask for b in lines)


def test_argv_reaches_the_script_byte_for_byte(tmp_path: Path) -> None:
    hostile = ["a b", "q\"uote", "it's", "$(touch pwned)", "`id`", "; echo no", "*", "ünï©ødé", "", "--nproc-per-node", "-m"]
    proc = run(affrun_argv("torchrun", "--nproc-per-node", "1", str(RANK_PROBE), *hostile), cwd=tmp_path, check=True)
    (report,) = json_lines(proc.stdout)
    assert report["argv"] == hostile
    assert not (tmp_path / "pwned").exists()


def test_module_mode_and_equals_spelling(tmp_path: Path) -> None:
    pkg = tmp_path / "probe_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "__main__.py").write_text(RANK_PROBE.read_text())
    env = clean_env(PYTHONPATH=str(tmp_path))
    proc = run(affrun_argv("torchrun", "--nproc_per_node=1", "--standalone", "-m", "probe_pkg", "x"), env=env,
               cwd=tmp_path, check=True)
    (report,) = json_lines(proc.stdout)
    assert report["argv"] == ["x"]
    assert report["env"]["AFFRUN_LOCAL_RANK"] == "0"


def test_user_set_omp_num_threads_is_judged_not_torchruns() -> None:
    # torchrun would force OMP_NUM_THREADS=1; affrun's per-rank value wins and is printed per rank.
    proc = run(affrun_argv("torchrun", "--nproc-per-node", "1", str(RANK_PROBE)), check=True)
    (report,) = json_lines(proc.stdout)
    assert report["env"]["OMP_NUM_THREADS"] == str(NCPU)
    # a dangerous user value (more threads than the rank's CPUs) is replaced, and a note says so
    proc = run(affrun_argv("torchrun", "--affrun-verbose", "--nproc-per-node", "1", str(RANK_PROBE)),
               env=clean_env(OMP_NUM_THREADS="64", KMP_AFFINITY="disabled"), check=True)
    (report,) = json_lines(proc.stdout)
    assert report["env"]["OMP_NUM_THREADS"] == str(NCPU)
    assert report["env"]["KMP_AFFINITY"] != "disabled"
    assert "OMP_NUM_THREADS=64 replaced" in proc.stderr
    assert "KMP_AFFINITY=disabled replaced" in proc.stderr


def test_fake_gpu_tree_binds_ranks_near_their_gpus(tmp_path: Path) -> None:
    machine = this_machine_with_gpus(2)
    root = write_tree(tmp_path / "root", machine)
    nproc = min(2, NCPU)
    env = clean_env(CUDA_VISIBLE_DEVICES="1,0")
    proc = run(affrun_argv("torchrun", "--fsroot", str(root), "--nproc-per-node", str(nproc), str(RANK_PROBE)),
               env=env, check=True)
    reports = sorted(json_lines(proc.stdout), key=lambda r: r["local_rank"])
    pcis = [g.pci for g in machine.gpus]
    for r in reports:
        # visible GPU i is physical GPU (1, 0)[i]; its PCI address reaches the rank
        assert r["env"]["AFFRUN_GPU"] == str(r["local_rank"])
        assert r["env"]["AFFRUN_GPU_PCI"] == pcis[(1, 0)[r["local_rank"]]]
    masks = [set(r["mask"]) for r in reports]
    assert len(set().union(*masks)) == sum(len(m) for m in masks)
    lines = rank_lines(proc.stderr)
    assert {line["gpu"] for line in lines} == {f"{i} ({pcis[(1, 0)[i]]})" for i in range(nproc)}


def test_numa_binding_is_refused() -> None:
    proc = run(affrun_argv("torchrun", "--numa-binding", "node", "--nproc-per-node", "1", str(RANK_PROBE)))
    assert proc.returncode == 2
    assert "--numa-binding" in proc.stderr and "Traceback" not in proc.stderr


def test_more_ranks_than_cores_is_one_line_exit_2() -> None:
    proc = run(affrun_argv("torchrun", "--nproc-per-node", str(NCPU + 1), str(RANK_PROBE)))
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert [line for line in proc.stderr.splitlines() if line.startswith("affrun: error:")]


def test_failing_rank_exit_status_matches_torchrun() -> None:
    env = clean_env(PROBE_EXIT_RANK="0", PROBE_EXIT_RANK_CODE="3")
    ours = run(affrun_argv("torchrun", "--nproc-per-node", "1", str(RANK_PROBE)), env=env)
    theirs = run(torchrun_argv("--nproc-per-node", "1", str(RANK_PROBE)), env=env)
    assert theirs.returncode != 0
    assert ours.returncode == theirs.returncode
    assert "exitcode  : 3" in ours.stderr and "exitcode  : 3" in theirs.stderr


def test_failure_report_names_the_script_as_torchrun_does(tmp_path: Path) -> None:
    # a script that fails (a missing one is refused before any rank starts: tests/system/test_torchrun_noise.py)
    failing = tmp_path / "fails.py"
    failing.write_text("raise SystemExit(1)\n")
    ours = run(affrun_argv("torchrun", "--nproc-per-node", "1", str(failing)), env=clean_env())
    theirs = run(torchrun_argv("--nproc-per-node", "1", str(failing)), env=clean_env())
    failed = [line for line in theirs.stderr.splitlines() if line.endswith(" FAILED")]
    assert failed == [f"{failing} FAILED"], theirs.stderr
    assert [line for line in ours.stderr.splitlines() if line.endswith(" FAILED")] == failed, ours.stderr
    assert ours.returncode == theirs.returncode != 0


SLEEPER = """
import os, signal, sys, time
out = sys.argv[1]
def handler(signum, frame):
    open(os.path.join(out, f"signal-{os.environ['LOCAL_RANK']}-{signum}"), "w").close()
    sys.exit(0 if signum == signal.SIGUSR2 else 1)
for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2):
    signal.signal(s, handler)
open(os.path.join(out, f"pid-{os.environ['LOCAL_RANK']}"), "w").write(str(os.getpid()))
time.sleep(120)
"""


def _start_sleepers(tmp_path: Path, launcher: list[str], nproc: int) -> tuple[subprocess.Popen[str], list[int]]:
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    proc = subprocess.Popen([*launcher, "--nproc-per-node", str(nproc), str(script), str(tmp_path)], env=clean_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=default_sigint)
    deadline = time.time() + 60
    while time.time() < deadline:
        pids = [p for p in tmp_path.glob("pid-*")]
        if len(pids) == nproc and all(p.read_text() for p in pids):
            return proc, [int(p.read_text()) for p in pids]
        if proc.poll() is not None:
            pytest.fail(f"launcher exited early: {proc.communicate()}")
        time.sleep(0.1)
    proc.kill()
    pytest.fail("ranks did not start within 60 s")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGUSR2])
def test_signals_reach_every_rank_and_none_is_left_behind(tmp_path: Path, sig: signal.Signals) -> None:
    nproc = min(2, NCPU)
    proc, pids = _start_sleepers(tmp_path, affrun_argv("torchrun"), nproc)
    t0 = time.time()
    proc.send_signal(sig)
    try:
        proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"affrun torchrun did not exit within 30 s of {sig.name}")
    deadline = t0 + 10
    while any(alive(p) for p in pids) and time.time() < deadline:
        time.sleep(0.1)
    assert not [p for p in pids if alive(p)], "ranks left behind"
    for rank in range(nproc):
        assert (tmp_path / f"signal-{rank}-{int(sig)}").exists(), f"rank {rank} never received {sig.name}"
    assert proc.returncode != 0 or sig == signal.SIGUSR2


def test_sigterm_exit_status_matches_torchrun(tmp_path: Path) -> None:
    codes = []
    for name, launcher in (("affrun", affrun_argv("torchrun")), ("torchrun", torchrun_argv())):
        d = tmp_path / name
        d.mkdir()
        proc, _ = _start_sleepers(d, launcher, 1)
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
        codes.append(proc.returncode)
    assert codes[0] == codes[1]


def test_dry_run_prints_rewritten_worker_command() -> None:
    proc = run(affrun_argv("torchrun", "--affrun-dry-run", "--nproc-per-node", "1", str(RANK_PROBE), "x y"), check=True)
    assert proc.stdout.startswith("worker: ")
    assert shlex.join([*exec_prefix(), "--"]) in proc.stdout
    assert str(RANK_PROBE) in proc.stdout


def test_explicit_signals_to_handle_are_respected() -> None:
    from launcher.launch.torchrun import DEFAULT_SIGNALS, parse

    assert parse(["--nproc-per-node", "1", "x.py"]).signals_to_handle is None  # affrun adds SIGUSR1/2 later
    args = parse(["--signals-to-handle", DEFAULT_SIGNALS, "x.py"])
    assert args.signals_to_handle == DEFAULT_SIGNALS
