"""benchmarks/device_check.py's setup steps: the machine, the install, torch and NVML, the topology and the plan.

Each step takes the run's :class:`~device_check_run.Context` and returns a :class:`~device_check_run.Result`;
what later steps need (CUDA, NVML, the allowed CPUs, the whole cores, the hook) goes into ``ctx.facts``. The feed
steps are device_check_feed.py's, the binding steps device_check_bind.py's.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from device_check_run import HERE, Call, Context, Result, json_document
from device_check_setup import install

from launcher.base.cpulist import format_cpulist

SETUP = str(HERE / "device_check_setup.py")


def _document(call: Call, res: Result) -> Any:
    res.commands.append(" ".join(call.argv))
    res.output_tail = call.tail()
    try:
        return json_document(call.out)
    except ValueError:
        return None


def environment_step(ctx: Context) -> Result:
    res = Result()
    fsroot = str(ctx.tree or "/")
    doc = _document(ctx.call([sys.executable, SETUP, "environment", "--fsroot", fsroot], timeout=60), res)
    if not isinstance(doc, dict):
        return Result("failed", "the environment probe printed no JSON", output_tail=res.output_tail)
    res.output_tail = ""
    res.figures = doc
    ctx.facts["sysfs"] = doc["sysfs"]
    sysfs = doc["sysfs"]
    effect = [a.get("takes_effect") for a in doc["setaffinity"]]
    read_back = all(a.get("read_back") == [a["cpu"]] for a in doc["setaffinity"])
    gpus = ", ".join(f"{g['pci']} node {g['numa_node']} cpus {g['local_cpulist']}" for g in sysfs["gpus"]) or "none"
    res.headline = (f"kernel {doc['uname_r']}; {len(sysfs['nodes'])} NUMA node(s); GPU {gpus}; "
                    f"ib {sysfs['infiniband'] or '-'}; sched_setaffinity read back {'yes' if read_back else 'NO'}, "
                    "a bound thread ran inside its mask: " + ("yes" if all(effect) else "NO" if not any(effect) else "partly"))
    return res


def install_step(ctx: Context, carry: Path) -> Result:
    interp = install(ctx.work, carry, deadline=min(ctx.step_end, ctx.deadline) - 1)
    ctx.python = interp.python
    ctx.env.update(interp.env)
    ctx.facts["hook"] = interp.hook
    res = Result(figures={"tier": interp.tier, "python": interp.python, "imports": interp.ok, "hook": interp.hook,
                          "log": interp.log, "carried": interp.carried, "env": interp.env})
    needs_hook = "doctor-feed (its meter), tune"
    res.headline = (f"{interp.tier}: imports {'ok' if interp.ok else 'FAILED'}, startup hook "
                    + ("answers" if interp.hook else f"absent ({needs_hook} need it)"))
    if not interp.ok:
        res.status, res.reason = "failed", "no interpreter imports this checkout's affrun and torch"
    return res


def torch_info_step(ctx: Context) -> Result:
    res = Result()
    doc = _document(ctx.call([ctx.python, SETUP, "torch-info"], timeout=120), res)
    if not isinstance(doc, dict):
        return res.judge(1)
    res.output_tail = ""
    res.figures = doc
    ctx.facts.update(cuda=bool(doc.get("cuda")) and not ctx.rehearse, nvml=bool(doc.get("nvml_gpus")) and not ctx.rehearse,
                     matplotlib=doc["modules"].get("matplotlib", False))
    gpus = doc.get("devices") or []
    res.headline = (f"torch {doc.get('torch', '?')}, CUDA {'yes: ' + ', '.join(gpus) if doc.get('cuda') else 'no'}"
                    + (f", NCCL {doc['nccl']}" if doc.get("nccl") else "")
                    + (f", NVML driver {doc['nvml_driver']}" if doc.get("nvml_driver") else ", no NVML")
                    + f"; numactl {'yes' if doc.get('numactl') else 'no'}; libiomp5 {'yes' if doc.get('libiomp5') else 'no'}")
    return res.judge(0 if "torch" in doc else 1)


def _gpu_rows(topo: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"pci": g["pci"], "numa_node": g["numa_node"], "cpus": format_cpulist(g["cpus"]), "uuid": g.get("uuid")}
            for g in topo.get("gpus", [])]


def topology_step(ctx: Context) -> Result:
    res = Result()
    call = ctx.call(ctx.affrun("topology", "--json"), timeout=60)
    topo = _document(call, res)
    if not isinstance(topo, dict):
        return res.judge(call.rc or 1)
    allowed = frozenset(topo["cpus"])
    ctx.facts["allowed_cpus"] = sorted(allowed)
    ctx.facts["cores"] = sum(1 for core in topo["cores"] if set(core) <= allowed)
    sysfs = {g["pci"]: g for g in ctx.facts.get("sysfs", {}).get("gpus", [])}
    gpus = _gpu_rows(topo)
    res.figures = {"allowed_cpus": format_cpulist(allowed), "whole_cores": ctx.facts["cores"], "gpus": gpus,
                   "numa_nodes": [n["id"] for n in topo["numa_nodes"]], "nics": topo.get("nics"),
                   "warnings": topo.get("warnings"), "source": topo.get("source")}
    # A numa_node of -1 in sysfs leaves affrun to place the GPU by its local_cpulist: any node is then its answer.
    res.checks["gpus_as_sysfs_says"] = (
        sorted(sysfs) == sorted(g["pci"] for g in gpus)
        and all(sysfs[g["pci"]]["numa_node"] in ("-1", str(g["numa_node"])) for g in gpus))
    res.headline = (f"{ctx.facts['cores']} whole cores, CPUs {format_cpulist(allowed)}; GPUs "
                    + (", ".join(f"{g['pci']} node {g['numa_node']} cpus {g['cpus']}" for g in gpus) or "none"))
    return res.judge(call.rc)


def topology_nvml_step(ctx: Context) -> Result:
    res = Result()
    call = ctx.call(ctx.affrun("topology", "--json", "--nvml"), timeout=60)
    topo = _document(call, res)
    if not isinstance(topo, dict):
        return res.judge(call.rc or 1)
    gpus = _gpu_rows(topo)
    nvml_warnings = [w for w in topo.get("warnings", []) if "NVML" in w]
    res.figures = {"gpus": gpus, "nvml_warnings": nvml_warnings}
    res.checks = {"every_gpu_has_an_nvml_uuid": bool(gpus) and all(g["uuid"] for g in gpus),
                  "nvml_agrees_with_sysfs": not nvml_warnings}
    res.headline = ", ".join(f"{g['pci']} {g['uuid']}" for g in gpus) + (f"; {nvml_warnings}" if nvml_warnings else "")
    return res.judge(call.rc)


def plan_step(ctx: Context, ranks: int = 8) -> Result:
    res = Result()
    where = ["--fsroot", str(ctx.plan_tree)] if ctx.plan_tree else []
    call = ctx.call(ctx.affrun("plan", *where, "--json", "--nproc-per-node", str(ranks)), timeout=60)
    plan = _document(call, res)
    if not isinstance(plan, dict):
        return res.judge(call.rc or 1)
    if ctx.plan_tree:
        res.figures["machine"] = "rehearsal: a fake 16-core, one-GPU tree shaped like the lent machine"
    res.figures["plan"] = plan
    cpus = [r["cpus"] for r in plan["ranks"]]
    res.checks["cpus_disjoint"] = sum(map(len, cpus)) == len({c for r in cpus for c in r})
    res.headline = " ".join(f"{r['local_rank']}:{format_cpulist(r['cpus'])}/gpu {r['gpu'] if r['gpu'] is not None else '-'}"
                            for r in plan["ranks"])
    return res.judge(call.rc)
