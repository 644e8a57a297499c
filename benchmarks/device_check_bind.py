"""benchmarks/device_check.py's binding steps: real ranks report what they run with (device_check_rank.py).

* ``bind-N``: ``affrun torchrun --nproc-per-node N``; each rank's mask against the plan and the others, its
  ``AFFRUN_GPU_PCI`` against NVML's address of the device torch uses, its OpenMP team's places
  (``OMP_DISPLAY_AFFINITY``), its DataLoader workers' masks (``pin_memory=True``). Where the machine has fewer
  whole cores than N (a rehearsal on 2 cores), N is capped to the cores, and the plan's answer for N is recorded.
* ``nccl-comm-cores``: one rank all-reducing over NCCL under ``--comm-cores 1`` (a rehearsal: gloo on the CPU):
  each thread born with the process group or after it, its CPU time over the loop and where it ran. The threads
  that used CPU time (:data:`BUSY_MS` or more) must have run on the comm cores only; the others are reported, not
  judged. One rank, because a machine of one GPU cannot hold two NCCL ranks (NCCL refuses two on one device).
* ``torchrun-numa-binding``: plain ``torchrun --numa-binding MODE``, each mode this torchrun has, one rank.
"""

from __future__ import annotations

import re
import time
from typing import Any

from device_check_run import HERE, Context, Result, json_lines, starting_lines

from launcher.base.cpulist import format_cpulist, parse_cpulist
from launcher.base.pci import pci_address

RANK = str(HERE / "device_check_rank.py")
OMP_FORMAT = "device-check pid %P thread %n affinity %A"
OMP_LINE = re.compile(r"device-check pid (\d+) thread (\d+) affinity ([0-9,\-]+)")
OMP_ENV = {"OMP_DISPLAY_AFFINITY": "true", "OMP_AFFINITY_FORMAT": OMP_FORMAT, "NCCL_SET_THREAD_NAME": "1"}
WORKERS = 2  # DataLoader workers per rank in the binding steps
BUSY_MS = 1.0  # CPU time over the all-reduce loop from which a communication thread counts as working (judged)
ONE_RANK_WHY = ("one rank: this machine has one GPU, and NCCL refuses two ranks on one device "
                "('Duplicate GPU detected'), so the NCCL check cannot run more")


def omp_teams(text: str) -> dict[int, dict[int, frozenset[int]]]:
    """pid -> OpenMP thread number -> its place, from the ``OMP_DISPLAY_AFFINITY`` lines."""
    teams: dict[int, dict[int, frozenset[int]]] = {}
    for m in OMP_LINE.finditer(text):
        teams.setdefault(int(m[1]), {})[int(m[2])] = parse_cpulist(m[3])
    return teams


def rank_row(r: dict[str, Any], team: dict[int, frozenset[int]]) -> dict[str, Any]:
    """One rank as the report shows it."""
    env = r.get("env", {})
    return {
        "rank": r.get("local_rank"), "pid": r.get("pid"), "mask": format_cpulist(r.get("mask", [])),
        "affrun_cpus": env.get("AFFRUN_CPUS"), "gpu": env.get("AFFRUN_GPU"), "gpu_pci": env.get("AFFRUN_GPU_PCI"),
        "omp_num_threads": env.get("OMP_NUM_THREADS"), "omp_places": env.get("OMP_PLACES"),
        "torch_threads": r.get("torch_threads"), "omp_main": r.get("omp_main"),
        "omp_team": {str(k): format_cpulist(v) for k, v in sorted(team.items())},
        "cuda": r.get("cuda"), "cuda_device": r.get("device"), "nvml_pci": r.get("nvml_pci"),
        "torch_pci": r.get("torch_pci"), "nvml_error": r.get("nvml_error"),
        "workers": [format_cpulist(w["mask"]) for w in r.get("workers", [])],
        "threads": [f"{t['name']} allowed {t['allowed']} ran {format_cpulist(t['cpus_seen'])}"
                    for t in r.get("threads", [])],
    }


def gpu_matches(records: list[dict[str, Any]]) -> bool | None:
    """Each rank with a GPU of its own uses it: NVML's PCI address of torch's current device is AFFRUN_GPU_PCI
    (None where no rank has both a GPU and CUDA)."""
    judged = [pci_address(r.get("nvml_pci") or "") == r["env"]["AFFRUN_GPU_PCI"]
              for r in records if r.get("env", {}).get("AFFRUN_GPU_PCI") and r.get("cuda")]
    return all(judged) if judged else None


def mask_checks(records: list[dict[str, Any]], teams: dict[int, dict[int, frozenset[int]]],
                allowed: frozenset[int], ranks: int) -> dict[str, bool | None]:
    masks = {r.get("local_rank"): frozenset(r.get("mask", [])) for r in records}
    everything: set[int] = set().union(*masks.values()) if masks else set()
    multi = [r for r in records if len(r.get("mask", [])) > 1 and r.get("workers")]
    team_cpus = [(frozenset(r["mask"]), frozenset().union(*teams[r["pid"]].values())) for r in records
                 if teams.get(r.get("pid", -1))]
    return {
        "every_rank_reported": sorted(k for k in masks if k is not None) == list(range(ranks)),
        "masks_disjoint": sum(len(m) for m in masks.values()) == len(everything),
        "masks_inside_allowed": all(m and m <= allowed for m in masks.values()),
        "mask_is_the_plan": all(frozenset(r.get("mask", [])) == parse_cpulist(r.get("env", {}).get("AFFRUN_CPUS", ""))
                                for r in records),
        "omp_team_inside_mask": all(t <= m for m, t in team_cpus) if team_cpus else None,
        "workers_inside_mask": all(frozenset(w["mask"]) <= frozenset(r["mask"]) for r in records
                                   for w in r.get("workers", [])),
        "workers_not_collapsed": all(len(set().union(*(w["mask"] for w in r["workers"]))) > 1 for r in multi)
        if multi else None,
        "gpu_is_the_planned_one": gpu_matches(records),
    }


def bind_step(ctx: Context, n: int) -> Result:
    allowed = frozenset(ctx.facts.get("allowed_cpus") or [])
    cores = int(ctx.facts.get("cores") or len(allowed) or 1)
    ranks = min(n, cores)
    res = Result(figures={"ranks_requested": n, "ranks": ranks, "workers_per_rank": WORKERS})
    if ranks < n:
        plan = ctx.call(ctx.affrun("plan", "--nproc-per-node", str(n)), timeout=60)
        res.figures["capped"] = f"{cores} whole core(s) here: ran {ranks} rank(s) instead of {n}"
        res.figures["plan_for_requested"] = (plan.err.strip().splitlines() or [f"exit {plan.rc}"])[-1]
    call = ctx.call(ctx.affrun("torchrun", "--nproc-per-node", str(ranks), RANK, "--workers", str(WORKERS)),
                    OMP_ENV, timeout=180)
    res.commands.append(" ".join(call.argv))
    res.output_tail = call.tail()
    records = sorted(json_lines(call.out), key=lambda r: int(r.get("local_rank", -1)))
    teams = omp_teams(call.out + call.err)
    res.figures["rank_lines"] = starting_lines(call.err)
    res.figures["ranks_seen"] = [rank_row(r, teams.get(r.get("pid", -1), {})) for r in records]
    res.checks = mask_checks(records, teams, allowed, ranks)
    if res.checks["gpu_is_the_planned_one"] is None:
        res.figures["gpu_check"] = ("not judged: no CUDA (rehearsal)" if ctx.rehearse
                                    else "not judged: no rank had both a planned GPU and CUDA")
    if n == 1 and records:
        ctx.facts["bind1_mask"] = format_cpulist(records[0]["mask"])
    gpus = [row["gpu"] or "-" for row in res.figures["ranks_seen"]]
    res.headline = (f"{len(records)}/{ranks} ranks, masks "
                    + " ".join(row["mask"] for row in res.figures["ranks_seen"])
                    + f"; GPU per rank {','.join(gpus)}" + (" (capped)" if ranks < n else ""))
    if call.timed_out:
        res.status, res.reason = "timeout", "affrun torchrun did not end in time"
    return res.judge(call.rc)


def judge_comm_threads(rows: list[dict[str, Any]], pid: int, comm: frozenset[int]) -> dict[str, Any]:
    """The rule: every thread born with the process group or after it (the main thread aside) that used
    :data:`BUSY_MS` of CPU or more over the loop ran only on the comm cores, and may run only there."""
    born = [t for t in rows if t.get("born") in ("init", "loop") and t.get("tid") != pid]
    busy = [t for t in born if (t.get("cpu_ms") or 0.0) >= BUSY_MS]
    off = [t for t in busy if not comm or not (frozenset(t["cpus_seen"]) <= comm
                                                and parse_cpulist(t["allowed"]) <= comm)]

    def line(t: dict[str, Any]) -> str:
        return (f"{t['name']} (born {t['born']}): {t.get('cpu_ms') or 0:.1f} ms CPU, allowed {t['allowed']}, "
                f"ran {format_cpulist(t['cpus_seen'])}")

    return {"busy": [line(t) for t in busy], "idle_not_judged": [line(t) for t in born if t not in busy],
            "off_comm_cores": [line(t) for t in off], "ok": not off if busy else None}


def nccl_step(ctx: Context) -> Result:
    backend = "nccl" if ctx.facts.get("cuda") else "gloo"
    seconds = "3" if backend == "nccl" else "1.5"
    res = Result(figures={"why_one_rank": ONE_RANK_WHY, "backend": backend})
    if backend == "gloo":
        res.figures["note"] = "rehearsal: gloo on the CPU stands in for NCCL" if ctx.rehearse else "no CUDA: gloo"
    call = ctx.call(ctx.affrun("torchrun", "--comm-cores", "1", "--nproc-per-node", "1", RANK, "--workers", "0",
                               "--nccl", seconds, "--backend", backend), OMP_ENV, timeout=ctx.left())
    res.commands.append(" ".join(call.argv))
    res.output_tail = call.tail()
    records = json_lines(call.out)
    res.figures["rank_lines"] = starting_lines(call.err)
    if not records or "nccl" not in records[0]:
        res.status, res.reason = ("timeout" if call.timed_out else "failed"), "the rank reported no all-reduce"
        return res
    r = records[0]
    rank_cpus = parse_cpulist(r["env"].get("AFFRUN_CPUS", ""))
    comm = parse_cpulist(r["env"].get("AFFRUN_COMM_CPUS", ""))
    rows = r["nccl"]["threads"]
    verdict = judge_comm_threads(rows, int(r["pid"]), comm)
    res.figures.update({
        "nccl_version": r["nccl"]["nccl_version"] or None, "rounds": r["nccl"]["rounds"],
        "rank_cpus": format_cpulist(rank_cpus), "main_thread_mask": format_cpulist(r["mask"]),
        "main_mask_after_the_loop": format_cpulist(r["nccl"]["main_mask_after"]), "comm_cpus": format_cpulist(comm),
        "NCCL_PROXY_CPUSET": r["env"].get("NCCL_PROXY_CPUSET"),
        "threads": [f"{t['name']} born {t['born']} allowed {t['allowed']} ran {format_cpulist(t['cpus_seen'])} "
                    f"cpu {t.get('cpu_ms')} ms" for t in rows],
        "busy_threads": verdict["busy"], "idle_threads_not_judged": verdict["idle_not_judged"],
        "busy_threads_off_the_comm_cores": verdict["off_comm_cores"],
        "rule": f"a thread born with the group or after it that used {BUSY_MS:g} ms of CPU or more over the loop "
                "runs only on the comm cores",
        "note_nccl": "NCCL reads NCCL_PROXY_CPUSET from 2.28.3 on (src/proxy.cc); an older NCCL ignores it",
    })
    res.checks = {"all_reduce_ran": r["nccl"]["rounds"] > 0, "comm_core_planned": bool(comm),
                  "comm_core_in_the_rank": bool(comm) and comm <= rank_cpus,
                  "main_thread_mask_kept": frozenset(r["nccl"]["main_mask_after"]) == frozenset(r["mask"]),
                  "busy_comm_threads_on_the_comm_cores": verdict["ok"]}
    res.headline = (f"{' '.join(filter(None, [backend, res.figures['nccl_version']]))}: comm core "
                    f"{format_cpulist(comm) or '-'}; "
                    f"{len(verdict['busy'])} busy thread(s), {len(verdict['off_comm_cores'])} off the comm cores; "
                    f"{len(verdict['idle_not_judged'])} idle (not judged)")
    return res.judge(call.rc)


def numa_modes(ctx: Context) -> list[str]:
    """The modes of this torchrun's ``--numa-binding`` (its --help lists them), none when it has no such option."""
    call = ctx.call([ctx.python, "-m", "torch.distributed.run", "--help"], timeout=60)
    m = re.search(r"--numa-binding \{([^}]*)\}", call.out)
    return m[1].split(",") if m else []


def numa_binding_step(ctx: Context) -> Result:
    res = Result()
    modes = numa_modes(ctx)
    res.figures["modes"] = modes
    if not modes:
        res.status, res.reason = "skipped", "this torchrun has no --numa-binding"
        return res
    res.figures["affrun_1_rank_mask"] = ctx.facts.get("bind1_mask")
    seen: dict[str, Any] = {}
    first_error = ""
    estimate = float(ctx.facts.get("launch_s") or 0.0)  # the ceiling's launch; then the slowest mode's own
    for mode in modes:
        if first_error:
            seen[mode] = {"error": f"not run: {first_error}"}
            continue
        if seen and ctx.left() < estimate:
            seen[mode] = {"error": f"not run: {ctx.left():.0f} s left of the step, a launch takes {estimate:.0f} s"}
            continue
        t0 = time.monotonic()
        call = ctx.call([ctx.python, "-m", "torch.distributed.run", "--numa-binding", mode, "--nproc-per-node", "1",
                         RANK, "--workers", str(WORKERS)], OMP_ENV, timeout=90)
        res.commands.append(" ".join(call.argv))
        estimate = max(estimate, time.monotonic() - t0)
        records = json_lines(call.out)
        if call.rc != 0 or not records:
            first_error = ([ln for ln in call.err.splitlines() if "Error" in ln] or [f"exit {call.rc}"])[-1].strip()
            seen[mode] = {"error": first_error}
            res.output_tail = call.tail()
            continue
        row = rank_row(records[0], omp_teams(call.out + call.err).get(records[0]["pid"], {}))
        seen[mode] = {k: row[k] for k in ("mask", "omp_num_threads", "omp_main", "omp_team", "workers")}
    res.figures["by_mode"] = seen
    res.headline = "; ".join(f"{m}: {v.get('mask') or v.get('error', '')[:60]}" for m, v in seen.items())
    if first_error:
        res.status, res.reason = "failed", f"torchrun --numa-binding: {first_error}"
    return res
