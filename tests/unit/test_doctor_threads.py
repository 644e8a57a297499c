"""Every thread's home, on stated records (the analysis of ``affrun doctor --pid`` is pure): roles told by facts,
homes from a rank's own variables, verdicts from where a thread ran, the four thread findings, the binder the
evidence names, the bounded text report, and ``affrun show --pid``'s picture on a fake machine."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from launcher.base import procfs
from launcher.base.cpulist import format_cpulist
from launcher.context.runtimes import runtimes_from_paths
from launcher.doctor.binder_evidence import likely_binders, pinning_ancestor, tensorrt_llm
from launcher.doctor.gpu import GpuReport
from launcher.doctor.live import JobAudit, ProcessRecord, ThreadRecord, assign_roles
from launcher.doctor.rank_fields import binding_problem, environ_fields
from launcher.doctor.report import THREAD_LINES, job_json, job_text
from launcher.doctor.thread_checks import (
    busy_pool_findings,
    main_findings,
    mask_findings,
    strayed_findings,
    thread_findings,
)
from launcher.doctor.thread_homes import assign_homes, cpu_use, is_worker
from launcher.show.live import LiveJob, LiveModel, LiveRank, live_picture
from launcher.show.svg import block_svg
from launcher.topology import load_topology
from tests.drawing import SVG_NS
from tests.fakesys import uniform, write_tree

SECONDS = 1.0


def rank_env(**extra: str) -> dict[str, str]:
    """Local rank 0 of a plan on CPUs 0-3: compute 0-1, loader 2-3."""
    return {"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "AFFRUN_LOCAL_RANK": "0", "AFFRUN_CPUS": "0-3",
            "AFFRUN_COMPUTE_CPUS": "0-1", "AFFRUN_LOADER_CPUS": "2-3", "AFFRUN_THREADS": "2", **extra}


def thread(tid: int, comm: str, allowed: set[int], ran: set[int], busy: float = 0.0) -> ThreadRecord:
    t = ThreadRecord(tid, comm, frozenset(allowed), min(ran or allowed), first_allowed=frozenset(allowed))
    t.ran = {c: 1 for c in ran}
    t.seen = dict(t.ran)
    t.samples = 1
    t.last_ticks = round(busy / 100 * procfs.CLOCK_TICKS * SECONDS)
    return t


def process(pid: int, ppid: int, threads: list[ThreadRecord], environ: dict[str, str],
            comm: str = "python", cmdline: list[str] | None = None) -> ProcessRecord:
    p = ProcessRecord(pid, ppid, comm, cmdline or ["python", "train.py"], environ)
    p.threads = {t.tid: t for t in threads}
    return p


def audited(*processes: ProcessRecord) -> JobAudit:
    job = JobAudit(processes[0].pid, SECONDS, 0.05, 20, list(processes), GpuReport(False, "n/a"), frozenset(range(8)))
    assign_roles(job)
    assign_homes(job)
    return job


def test_a_stale_cpu_outside_the_mask_is_not_where_it_ran() -> None:
    """A sleeping thread keeps the CPU it last ran on after its mask moved; it ran there only if its time grew."""
    t = ThreadRecord(5, "x", frozenset({0, 1}), 0)
    t.update(procfs.ThreadStat(5, "x", "S", 1, 3, 10), frozenset({2}))  # stale: CPU 3, mask 2
    t.update(procfs.ThreadStat(5, "x", "S", 1, 3, 10), frozenset({2}))  # still asleep
    assert t.ran == {} and t.seen == {3: 2} and t.first_allowed == {2}
    t.update(procfs.ThreadStat(5, "x", "R", 1, 2, 12), frozenset({2}))  # it ran, on its CPU
    t.update(procfs.ThreadStat(5, "x", "R", 1, 3, 15), frozenset({2}))  # its time grew: it ran there
    assert t.ran == {2: 1, 3: 1}


def test_roles_are_told_by_facts_and_homes_come_from_the_variables() -> None:
    env = rank_env(OMP_PLACES="{0,1,2,3},{1}")
    rank = process(10, 1, [thread(10, "python", {0, 1, 2, 3}, {0}), thread(11, "pt_data_pin", {2, 3}, {3}),
                           thread(12, "NCCL Progress 0", {0, 1, 2, 3}, {1}), thread(13, "PTThreadPool", {0, 1, 2, 3}, {0}),
                           thread(14, "python", {1}, {1}), thread(15, "pt_autograd_0", {0, 1, 2, 3}, {2}),
                           thread(16, "python", {0, 1, 2, 3}, {1}), thread(17, "pt_nccl_watchdg", {0, 1, 2, 3}, {2}),
                           thread(18, "pt_gloo_runloop", {0, 1, 2, 3}, {0})], env)
    job = audited(rank)
    told = {t.tid: (t.role, t.identified_by, format_cpulist(t.home or ()), t.verdict) for t in rank.threads.values()}
    assert told == {10: ("main", "tid", "0-3", "home"), 11: ("pin_memory", "name", "2-3", "home"),
                    12: ("nccl_proxy", "name", "0-3", "home"), 13: ("interop", "name", "0-3", "home"),
                    14: ("omp", "place", "0-1", "home"), 15: ("torch", "name", "0-3", "home"),
                    16: ("unknown", "none", "0-3", "home"), 17: ("nccl_proxy", "name", "0-3", "home"),
                    18: ("nccl_proxy", "name", "0-3", "home")}
    assert rank.plan_source == "its AFFRUN_* variables" and rank.thread_plan is not None
    assert thread_findings(job) == []


def test_workers_are_matched_by_mask_then_pid_order_and_their_threads_judged() -> None:
    env = rank_env()
    rank = process(10, 1, [thread(10, "python", {0, 1, 2, 3}, {0})], env)
    # worker 1's mask is loader CPU 3, worker 0 runs unpinned: matched to the free home by pid order
    w0 = process(20, 10, [thread(20, "pt_data_worker", {0, 1, 2, 3}, {0, 2}), thread(21, "pt_data_worker", {0, 1, 2, 3}, {2})], env)
    w1 = process(21, 10, [thread(22, "pt_data_worker", {3}, {3})], env, comm="pt_data_worker")
    tracker = process(22, 10, [thread(23, "python", {0, 1, 2, 3}, {1})], env,
                      cmdline=["python", "-c", "from multiprocessing.resource_tracker import main;main(5)"])
    job = audited(rank, w0, w1, tracker)
    assert (w1.worker and w1.worker.index, w1.worker_matched_by) == (1, "mask")
    assert (w0.worker and w0.worker.index, w0.worker_matched_by) == (0, "pid order")  # forked: the rank's command
    assert tracker.worker is None and {t.verdict for t in tracker.threads.values()} == {"unplanned"}
    assert "not a DataLoader or multiprocessing worker: its rank's thread plan has no home for it" in job_text(job)
    assert {t.tid: t.verdict for t in w0.threads.values()} == {20: "strayed", 21: "home"}  # home: CPU 2
    (stray,) = thread_findings(job)
    assert stray.id == "thread-strayed" and stray.severity == "warning" and stray.subject == "rank 0 (pid 10)"
    assert ("DataLoader worker 0 of 2 (pid 20): 1 of its 2 thread(s) (pt_data_worker) ran on CPUs 0, outside its "
            "home 2") in stray.message
    assert "worker_init_fn=launcher.torch.worker_init_fn" in stray.fix


def test_spawned_children_are_workers_and_other_children_are_not() -> None:
    rank = process(10, 1, [], {})
    spawned = process(11, 10, [], {}, cmdline=["python", "-c", "from multiprocessing.spawn import spawn_main; "
                                                             "spawn_main(tracker_fd=5, pipe_handle=7)",
                                                "--multiprocessing-fork"])
    shell = process(12, 10, [], {}, cmdline=["sh", "-c", "ls"])
    by_pid = {p.pid: p for p in (rank, spawned, shell)}
    assert is_worker(spawned, rank, by_pid) and not is_worker(shell, rank, by_pid)


def test_a_process_without_a_plan_gets_roles_and_no_homes() -> None:
    rank = process(10, 1, [thread(10, "python", {0, 1}, {0}), thread(11, "NCCL Service 0", {1}, {1})],
                   {"OMP_NUM_THREADS": "2"})
    job = audited(rank)
    assert [(t.role, t.home, t.verdict) for t in rank.threads.values()] == [
        ("main", None, "unplanned"), ("nccl_proxy", None, "unplanned")]
    assert rank.thread_plan is None and thread_findings(job) == []
    assert "no thread plan" in job_text(job) and job_json(job)["processes"][0]["thread_plan"] is None


@pytest.mark.parametrize(("value", "named"), [
    ({"AFFRUN_CPUS": "0-3", "AFFRUN_COMPUTE_CPUS": "junk"}, "AFFRUN_COMPUTE_CPUS='junk' is not a cpu list"),
    ({"AFFRUN_CPUS": "0-3", "AFFRUN_COMPUTE_CPUS": "8-9"}, "AFFRUN_COMPUTE_CPUS=8-9 is not a non-empty part"),
    ({"AFFRUN_CPUS": "0-3", "AFFRUN_THREADS": "x"}, "AFFRUN_THREADS='x' is not an integer"),
    ({"AFFRUN_CPUS": "0-3", "AFFRUN_THREADS": "5"}, "AFFRUN_THREADS=5 is more than the 4 CPU(s)"),
    ({"AFFRUN_CPUS": "0-"}, "AFFRUN_CPUS='0-' is not a cpu list"),
])
def test_variables_that_cannot_be_a_binding_are_no_plan(value: dict[str, str], named: str) -> None:
    """One strict reader (launcher.bind.readback.read_binding), as the rank's hooks read them: what it refuses the
    audit reports as the reason the rank has no plan, and judges nothing against."""
    assert environ_fields(value, None) is None
    problem = binding_problem(value, frozenset())
    assert problem is not None and problem.startswith(named), problem
    good = {"AFFRUN_CPUS": "0-3", "AFFRUN_COMPUTE_CPUS": "0-1", "AFFRUN_THREADS": "2"}
    read = environ_fields(good, None)
    assert read is not None and (read.compute_cpus, read.threads) == ((0, 1), 2)
    assert binding_problem(good, frozenset(range(4))) is None
    assert "names CPUs this machine lacks (2-3)" in (binding_problem(good, frozenset({0, 1})) or "")


def test_a_thread_off_the_ranks_cpus_is_an_error_and_its_mask_is_named() -> None:
    rank = process(10, 1, [thread(10, "python", {0, 1, 2, 3}, {0}), thread(11, "mine", {0, 1, 2, 3, 4, 5}, {5}, 90)],
                   rank_env())
    job = audited(rank)
    plan = rank.thread_plan
    assert plan is not None
    (stray,) = strayed_findings(rank, plan, [rank])
    assert stray.severity == "error" and "CPUs 5 are not the rank's" in stray.message
    (changed,) = mask_findings(rank, plan, [rank], [(9, "sh -c numactl --physcpubind=0-5 python train.py")])
    assert changed.severity == "error" and "tid 11 (mine, unknown) may run on CPUs 0-5" in changed.message
    assert "numactl in the parent process 9" in changed.message and "drop numactl" in changed.fix
    assert {f.id for f in thread_findings(job)} == {"thread-strayed", "mask-changed-after-start"}


@pytest.mark.parametrize(("allowed", "severity"), [({1}, "info"), ({2}, "warning"), ({7}, "error")])
def test_how_severe_a_changed_mask_is(allowed: set[int], severity: str) -> None:
    """Inside the thread's home (an omp thread on one compute CPU no place names), inside the rank, beyond it."""
    rank = process(10, 1, [thread(10, "python", {0, 1, 2, 3}, {0}), thread(11, "python", allowed, allowed)],
                   rank_env(OMP_PLACES="{0,1,2,3},{0}"))
    audited(rank)
    assert rank.thread_plan is not None
    rank.threads[11].role, rank.threads[11].home = "omp", frozenset({0, 1})
    (changed,) = mask_findings(rank, rank.thread_plan, [rank], [])
    assert changed.severity == severity and "no binder was identified" in changed.message


def test_masks_affrun_or_the_places_explain_are_not_findings() -> None:
    rank = process(10, 1, [thread(10, "python", {0, 1, 2, 3}, {0}), thread(11, "python", {0}, {0}),
                           thread(12, "pt_data_pin", {2, 3}, {2}), thread(13, "NCCL Progress 0", {3}, {3})],
                   rank_env(OMP_PLACES="{0,1,2,3},{0},{1}"))
    worker = process(20, 10, [thread(20, "pt_data_worker", {2}, {2})], rank_env(), comm="pt_data_worker")
    job = audited(rank, worker)
    assert rank.thread_plan is not None
    assert mask_findings(rank, rank.thread_plan, [rank, worker], []) == []
    assert thread_findings(job) == []


def test_tensorrt_llm_is_named_by_its_library_and_its_variable() -> None:
    libraries = ["/usr/lib/libc.so.6", "/venv/lib/python3.12/site-packages/tensorrt_llm/libs/libtensorrt_llm.so"]
    unset = tensorrt_llm(libraries, {})
    assert unset is not None and "unset" in unset.what and unset.env_fix == {"TLLM_NUMA_AWARE_WORKER_AFFINITY": "0"}
    one = tensorrt_llm(libraries, {"TLLM_NUMA_AWARE_WORKER_AFFINITY": "1"})
    assert one is not None and "its GPU's CPUs from NVML" in one.what
    assert tensorrt_llm(libraries, {"TLLM_NUMA_AWARE_WORKER_AFFINITY": "0"}) is None
    assert tensorrt_llm(libraries[:1], {}) is None
    assert pinning_ancestor([(5, "bash run.sh"), (4, "taskset -c 0-3 bash run.sh")]) is not None
    assert pinning_ancestor([(5, "python -m torch.distributed.run train.py")]) is None
    p = process(10, 1, [], {"KMP_AFFINITY": "compact", "ACCELERATE_CPU_AFFINITY": "1"})
    p.runtimes = runtimes_from_paths(["/opt/intel/lib/libiomp5.so"], p.environ, 8)
    assert [b.what.split()[0] for b in likely_binders(p, [])] == ["accelerate", "KMP_AFFINITY=compact"]


@pytest.mark.parametrize(("environ", "library"), [
    ({"KMP_AFFINITY": "granularity=fine"}, "/opt/intel/lib/libiomp5.so"),  # affrun's own value: no type, no binding
    ({"KMP_AFFINITY": "compact"}, "/venv/torch/lib/libgomp.so.1"),  # libgomp reads no KMP_* at all
    ({"GOMP_CPU_AFFINITY": "0-3"}, "/usr/lib/llvm-16/lib/libomp.so.5"),  # nor libomp GOMP_CPU_AFFINITY
    ({"KMP_AFFINITY": "compact"}, "/usr/lib/libc.so.6"),  # no OpenMP runtime loaded
    ({"GOMP_CPU_AFFINITY": "0-3", "OMP_PROC_BIND": "close"}, "/venv/torch/lib/libgomp.so.1")])  # OMP_PROC_BIND wins
def test_an_openmp_variable_is_a_binder_only_in_a_runtime_it_binds(environ: dict[str, str], library: str) -> None:
    """Every affrun rank carries KMP_AFFINITY=granularity=fine; a thread that moved itself in a torch (libgomp)
    rank was blamed on it, with 'unset KMP_AFFINITY' as the fix."""
    p = process(10, 1, [], environ)
    p.runtimes = runtimes_from_paths([library], environ, 8)
    assert likely_binders(p, []) == []


def test_busy_pools_are_counted_against_their_home() -> None:
    """A worker's pool threads against its CPUs, beyond multiprocessing's two helper threads (feeder, resource
    sharer), which every worker that sends batches runs and nothing in /proc tells apart."""
    pool = [thread(21 + i, "cv-pool", {2, 3}, {2}, busy=30) for i in range(5)]
    idle = [thread(30 + i, "pt_data_worker", {2, 3}, {3}) for i in range(5)]
    env = rank_env(OPENCV_FOR_THREADS_NUM="8", AFFRUN_USER_POOLS="OPENCV_FOR_THREADS_NUM,OMP_NUM_THREADS",
                   AFFRUN_ENV_POLICY="keep")
    rank = process(10, 1, [thread(10, "python", {0, 1, 2, 3}, {0}, busy=99)], env)
    worker = process(20, 10, [thread(20, "pt_data_worker", {2, 3}, {2}, busy=90), *pool, *idle], env,
                     comm="pt_data_worker")
    job = audited(rank, worker)
    plan = rank.thread_plan
    assert plan is not None and worker.worker is not None and worker.worker.cpus == (2, 3)  # the loader CPUs
    (busy,) = busy_pool_findings(job, rank, plan, [rank, worker])
    assert busy.message.startswith("a pool ran more busy threads than its CPUs (up to 5): DataLoader worker 0 of 1 "
                                   "(pid 20): 5 busy threads besides its main one")
    assert "on 2 CPU(s) (2-3): tids 21 cv-pool 30%, 22 cv-pool 30%, 23 cv-pool 30%" in busy.message
    assert "your OPENCV_FOR_THREADS_NUM=8 (AFFRUN_USER_POOLS)" in busy.message and "cv2.setNumThreads" in busy.fix
    worker.threads = {t.tid: t for t in [worker.threads[20], *pool[:4], *idle]}
    assert busy_pool_findings(job, rank, plan, [rank, worker]) == []  # 2 pool threads and the 2 helpers


@pytest.mark.parametrize(("allowed", "ran", "said"), [
    ({1}, {1}, "ran on CPUs 1"), ({0, 1, 2, 3}, {0}, "may run on CPUs 1-3 (its mask is 0-3)"), ({0}, {0}, None)])
def test_a_main_thread_with_a_core_of_its_own(allowed: set[int], ran: set[int], said: str | None) -> None:
    rank = process(10, 1, [thread(10, "python", allowed, ran)], rank_env(AFFRUN_MAIN_CPUS="0"))
    audited(rank)
    assert rank.thread_plan is not None and rank.thread_plan.main.pinned
    found = main_findings(rank, rank.thread_plan)
    if said is None:
        assert found == []
        return
    (off,) = found
    assert off.id == "main-off-priority" and said in off.message and "AFFRUN_MAIN_CPUS" in off.message
    assert strayed_findings(rank, rank.thread_plan, [rank]) == []  # the main thread is this finding's
    rank.environ["AFFRUN_RANK_HOOKS"] = "none"
    assert "drop --rank-hooks none" in main_findings(rank, rank.thread_plan)[0].fix


def test_thousands_of_threads_are_a_screenful() -> None:
    threads = [thread(10, "python", {0, 1, 2, 3}, {0}),
               *(thread(100 + i, "python", {0, 1, 2, 3}, {i % 4}) for i in range(5000)),
               thread(9000, "\x1b[2Jevil\n", {0, 1, 2, 3, 6}, {6}, busy=50)]
    job = audited(process(10, 1, threads, rank_env()))
    text = job_text(job)
    rows = [line for line in text.splitlines() if line.startswith("     10 ")]
    assert len(rows) == THREAD_LINES + 1
    assert "9000 unknown    \\x1b[2Jevil\\n" in text and rows[0].split()[1] == "10"  # the stray, the main thread
    assert rows[-1].endswith("4,978 more thread(s): 4,978 unknown home")
    data = job_json(job)["processes"][0]
    assert len(data["threads"]) == 5002 and data["thread_summary"]["verdicts"] == {"home": 5001, "strayed": 1}
    stray = next(t for t in data["threads"] if t["tid"] == 9000)
    assert (stray["comm"], stray["verdict"], stray["strayed_to"], stray["home"]) == ("\x1b[2Jevil\n", "strayed",
                                                                                       "6", "0-3")


def test_the_live_picture_marks_roles_and_strays(tmp_path: Path) -> None:
    topo = load_topology(fsroot=str(write_tree(tmp_path, uniform(1, 4))), environ={})
    rank = process(10, 1, [thread(10, "python", {0, 1, 2, 3}, {0}), thread(11, "pt_data_pin", {0}, {0, 1}, 50)],
                   rank_env())
    worker = process(20, 10, [thread(20, "pt_data_worker", {2, 3}, {2})], rank_env(), comm="pt_data_worker")
    job = audited(rank, worker)
    use = cpu_use(job)
    assert use[0] == {(10, "main", False): 1, (10, "pin_memory", True): 1} and use[2] == {(10, "worker", False): 1}
    live = LiveJob(10, 2, 20, 1.0, (LiveRank(0, "rank 0 (pid 10)", "0-3", 3, 1, True),),
                   {cpu: {(0, role, s): n for (_, role, s), n in cell.items()} for cpu, cell in use.items()})
    text = live_picture(topo, live, color=False, width=100)
    assert "[0 0m!]" in text and "[1 0p!]" in text and "[2 0w ]" in text and "[3 .  ]" in text
    assert "! a thread strayed here from its home" in text and "rank 0 (pid 10): CPUs 0-3, 3 thread(s), 1 strayed" in text
    marks = LiveModel(topo, live.use).core_marks
    assert [marks[c][2].role for c in range(4)] == ["stray", "stray", "worker", "free"]
    from launcher.show.live import draw_live

    root = ET.fromstring(block_svg(draw_live(topo, live, 120, True), "live"))
    strays = [r for r in root.iter(f"{SVG_NS}rect") if "stray" in (r.get("class") or "").split()]
    assert sorted(r.get("data-cpu") for r in strays) == ["0", "1"]
    assert all(r.get("stroke-width") == "2.4" for r in strays)


def test_torch_distributed_threads_are_judged_by_the_comm_cores() -> None:
    """The watchdog and gloo's loops are born on the comm cores (launcher/bind/comm_threads.py): there they are
    home, and on the compute CPUs they strayed (docs/nics.md, "Which threads go where")."""
    env = rank_env(AFFRUN_COMPUTE_CPUS="0", AFFRUN_LOADER_CPUS="1-2", AFFRUN_COMM_CPUS="3", AFFRUN_THREADS="1")
    rank = process(10, 1, [thread(10, "python", {0, 1, 2, 3}, {0}), thread(11, "pt_nccl_watchdg", {3}, {3}),
                           thread(12, "pt_gloo_runloop", {0, 1, 2, 3}, {0})], env)
    audited(rank)
    told = {t.tid: (t.role, format_cpulist(t.home or ()), t.verdict) for t in rank.threads.values()}
    assert told[11] == ("nccl_proxy", "3", "home") and told[12] == ("nccl_proxy", "3", "strayed")
