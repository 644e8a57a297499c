"""benchmarks/device_check.py's groundwork: what the machine is, an interpreter with this checkout's affrun, fake trees.

* ``python device_check_setup.py environment [--fsroot DIR]`` prints one JSON object: the kernel (``uname -r``:
  gVisor or Firecracker show there), the NUMA nodes, each NVIDIA GPU's PCI ``numa_node`` and ``local_cpulist``,
  ``/sys/class/infiniband``, ``/sys/class/net``, and whether ``sched_setaffinity`` takes effect (set, read back,
  where a spinning thread then ran). ``torch-info``: torch, CUDA, NCCL, NVML and the optional tools.
* :func:`install`: a virtual environment that sees this interpreter's packages and holds this checkout's affrun,
  by ``pip install --no-deps --no-build-isolation`` (``pip``), else with the startup hook placed by hand
  (``hook-by-hand``: the layout a wheel installs), else ``PYTHONPATH`` alone (``pythonpath``: no startup hook, so
  ``--feed-report`` and ``affrun tune`` cannot run). Carried ``.deb`` and ``.whl`` files are unpacked too.
* :func:`write_fake_trees`: the rehearsal's machines, written by tests/fakesys.py.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SOURCE_PARTS = ("pyproject.toml", "README.md", "MANIFEST.in", "LICENSE", "launcher", "build_backend", "templates")


# ------------------------------------------------------------------------------------------------ the environment
def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace").strip()
    except OSError:
        return None


def _listing(path: Path) -> list[str] | None:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return None


def sysfs_facts(fsroot: Path) -> dict[str, Any]:
    """NUMA nodes, NVIDIA GPUs (vendor 0x10de, display class), RDMA devices and interfaces under ``fsroot``."""
    nodes_dir = fsroot / "sys/devices/system/node"
    nodes = {name: {"cpulist": _read(nodes_dir / name / "cpulist")}
             for name in _listing(nodes_dir) or [] if name.startswith("node") and name[4:].isdigit()}
    gpus = []
    pci = fsroot / "sys/bus/pci/devices"
    for bdf in _listing(pci) or []:
        vendor, klass = _read(pci / bdf / "vendor"), _read(pci / bdf / "class") or ""
        if vendor == "0x10de" and klass.startswith("0x03"):
            gpus.append({"pci": bdf, "class": klass, "numa_node": _read(pci / bdf / "numa_node"),
                         "local_cpulist": _read(pci / bdf / "local_cpulist")})
    net = {}
    for name in _listing(fsroot / "sys/class/net") or []:
        link = fsroot / "sys/class/net" / name
        net[name] = os.readlink(link) if link.is_symlink() else "(not a link)"
    return {
        "fsroot": str(fsroot),
        "node_dir": _listing(nodes_dir),
        "nodes": nodes,
        "gpus": gpus,
        "infiniband": _listing(fsroot / "sys/class/infiniband"),
        "net": net,
    }


def affinity_takes_effect(cpu: int, seconds: float = 0.3) -> dict[str, Any]:
    """Bind a new thread to ``cpu``, spin, and see where the kernel ran it (``/proc/thread-self/stat`` field 39)."""
    result: dict[str, Any] = {"cpu": cpu}

    def spin() -> None:
        try:
            os.sched_setaffinity(0, {cpu})
        except OSError as exc:
            result["error"] = f"sched_setaffinity: {exc}"
            return
        result["read_back"] = sorted(os.sched_getaffinity(0))
        seen: set[int] = set()
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            try:
                with open("/proc/thread-self/stat") as fh:
                    seen.add(int(fh.read().rsplit(")", 1)[1].split()[36]))
            except (OSError, ValueError, IndexError):
                break
        result["ran_on"] = sorted(seen)

    t = threading.Thread(target=spin)
    t.start()
    t.join()
    result["takes_effect"] = ("error" not in result and result.get("read_back") == [cpu]
                              and bool(result.get("ran_on")) and set(result["ran_on"]) <= {cpu})
    return result


def environment(fsroot: Path) -> dict[str, Any]:
    allowed = sorted(os.sched_getaffinity(0))
    cgroup = _read(Path("/proc/self/cgroup"))
    return {
        "uname_r": platform.release(),
        "proc_version": _read(Path("/proc/version")),
        "machine": platform.machine(),
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "cpu_count": os.cpu_count(),
        "allowed_cpus": allowed,
        "cgroup": cgroup,
        "cpuset_effective": _read(Path("/sys/fs/cgroup/cpuset.cpus.effective")),
        "hypervisor": _read(Path("/sys/hypervisor/type")),
        "sysfs": sysfs_facts(fsroot),
        "live_sysfs": sysfs_facts(Path("/")) if fsroot != Path("/") else None,
        "setaffinity": [affinity_takes_effect(c) for c in sorted({allowed[0], allowed[-1]})],
    }


def torch_info() -> dict[str, Any]:
    """torch, CUDA, NCCL and NVML as the steps' interpreter sees them, and the optional tools the steps use."""
    out: dict[str, Any] = {"python": sys.version.split()[0], "executable": sys.executable, "cuda": False}
    try:
        import torch

        out.update(torch=torch.__version__, torch_cuda=torch.version.cuda, cuda=torch.cuda.is_available())
        if out["cuda"]:
            out["devices"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
            version = torch.cuda.nccl.version()  # type: ignore[no-untyped-call]
            out["nccl"] = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
    except Exception as exc:
        out["torch_error"] = f"{type(exc).__name__}: {exc}"
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            def text(v: Any) -> str:
                return v.decode() if isinstance(v, bytes) else str(v)

            out["nvml_driver"] = text(pynvml.nvmlSystemGetDriverVersion())
            handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
            out["nvml_gpus"] = [{"name": text(pynvml.nvmlDeviceGetName(h)),
                                 "pci": text(pynvml.nvmlDeviceGetPciInfo(h).busId),
                                 "uuid": text(pynvml.nvmlDeviceGetUUID(h))} for h in handles]
        finally:
            pynvml.nvmlShutdown()
    except Exception as exc:  # no nvidia-ml-py, no driver: NVML is absent
        out["nvml_error"] = f"{type(exc).__name__}: {exc}"
    out["numactl"] = shutil.which("numactl")
    out["libiomp5"] = str(Path(sys.prefix) / "lib" / "libiomp5.so") if (Path(sys.prefix) / "lib" / "libiomp5.so").exists() else None
    out["modules"] = {m: importlib.util.find_spec(m) is not None
                      for m in ("matplotlib", "psutil", "click", "yaml", "cpuinfo", "pynvml", "threadpoolctl",
                                "submitit", "accelerate", "lightning")}
    return out


# ------------------------------------------------------------------------------------------------ the interpreter
@dataclass
class Interpreter:
    """How the steps run affrun: ``python`` (``python -m launcher``), extra environment, whether the hook works."""

    python: str
    env: dict[str, str] = field(default_factory=dict)
    tier: str = "pythonpath"
    ok: bool = False  # it imports this checkout's affrun and torch
    hook: bool = False
    log: list[str] = field(default_factory=list)
    carried: list[str] = field(default_factory=list)


def parent_site_dirs() -> list[str]:
    """This interpreter's package directories (a venv's, the ones its .pth files add), in order."""
    found = [p for p in sys.path if p and ("site-packages" in p or "dist-packages" in p) and os.path.isdir(p)]
    return list(dict.fromkeys(found))


_deadline = float("inf")  # time.monotonic() by which install() has ended: no command of it runs past it


def _run(argv: list[str], timeout: float, env: dict[str, str] | None = None) -> tuple[int, str]:
    timeout = min(timeout, _deadline - time.monotonic())
    if timeout < 1.0:
        return 124, "not run: the step's time is up"
    try:
        # From / : a `python -c` there imports the installed affrun, not the checkout in the working directory.
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env,
                              stdin=subprocess.DEVNULL, cwd="/")
    except subprocess.TimeoutExpired:
        return 124, f"timed out after {timeout:.0f} s"
    except OSError as exc:
        return 127, str(exc)
    return proc.returncode, (proc.stdout + proc.stderr)[-3000:]


def hook_answers(python: str, env: dict[str, str]) -> bool:
    """Whether affrun's startup hook runs in ``python`` (the question ``affrun run`` asks it)."""
    from launcher.launch.run_target import PROBE_CODE

    rc, out = _run([python, "-c", PROBE_CODE], 30, {**env, "AFFRUN_RUN": "probe"})
    return rc == 0 and "affrun-probe 1" in out


def imports_ok(python: str, env: dict[str, str]) -> tuple[bool, str]:
    rc, out = _run([python, "-c", "import launcher, torch; print(launcher.__file__)"], 120, env)
    return rc == 0, out.strip().splitlines()[-1] if out.strip() else f"exit {rc}"


def _copy_source(dest: Path) -> None:
    dest.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for part in SOURCE_PARTS:
        src = ROOT / part
        if src.is_dir():
            shutil.copytree(src, dest / part, symlinks=True, ignore=ignore)
        elif src.exists():
            shutil.copy2(src, dest / part)


def _link_libiomp5(venv: Path, parents: list[str]) -> str | None:
    """Intel's libiomp5 from the parent's prefix (intel-openmp installs it in ``<prefix>/lib``), linked into the
    venv's ``lib``, where benchmarks/gpu_feed.py looks for it."""
    target = venv / "lib" / "libiomp5.so"
    if target.exists():
        return str(target)
    for site in [*parents, sysconfig.get_paths()["purelib"]]:
        prefix = Path(site).parents[2] if len(Path(site).parents) > 2 else Path(site)
        candidate = prefix / "lib" / "libiomp5.so"
        if candidate.exists():
            target.symlink_to(candidate)
            return str(candidate)
    return None


def unpack_carried(carry: Path, work: Path, interp: Interpreter, timeout: float) -> None:
    """``carry/*.deb`` (``dpkg -x``: numactl and libnuma1, say) onto PATH and LD_LIBRARY_PATH; ``carry/*.whl`` into
    the venv (``pip install --no-index --no-deps``: intel-openmp puts libiomp5.so in the venv's lib)."""
    if not carry.is_dir():
        return
    debs, wheels = sorted(carry.glob("*.deb")), sorted(carry.glob("*.whl"))
    root = work / "carried"
    for deb in debs:
        rc, out = _run(["dpkg", "-x", str(deb), str(root)], timeout)
        interp.carried.append(f"{deb.name}: {'unpacked' if rc == 0 else 'dpkg -x failed: ' + out[-200:]}")
    if debs:
        bins = [str(p) for p in (root / "usr/bin", root / "bin", root / "usr/sbin") if p.is_dir()]
        libs = sorted({str(p.parent) for p in root.rglob("*.so*")})
        interp.env["PATH"] = ":".join([*bins, os.environ.get("PATH", "/usr/bin:/bin")])
        interp.env["LD_LIBRARY_PATH"] = ":".join([*libs, *filter(None, [os.environ.get("LD_LIBRARY_PATH")])])
    if wheels:
        rc, out = _run([interp.python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", *map(str, wheels)],
                       timeout, {**os.environ, **interp.env})
        interp.carried += [f"{w.name}: {'installed' if rc == 0 else 'pip failed: ' + out[-200:]}" for w in wheels]


def install(work: Path, carry: Path, deadline: float) -> Interpreter:
    """The first of the three tiers that imports this checkout's affrun and torch (module docstring), every
    command of it ended by ``deadline`` (``time.monotonic()``)."""
    global _deadline
    _deadline = deadline
    timeout = max(1.0, deadline - time.monotonic())
    venv = work / "venv"
    python = str(venv / "bin" / "python")
    parents = parent_site_dirs()
    fallback = Interpreter(sys.executable, {"PYTHONPATH": str(ROOT)})
    rc, out = _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], 60)
    if rc != 0:
        fallback.log.append(f"python -m venv failed ({out[-300:]}): PYTHONPATH={ROOT}, no startup hook")
        return _verified(fallback)
    site = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], 30)[1].strip())
    # The parent's packages (torch, nvidia-ml-py...) after the venv's own, each directory added as a site
    # directory (its own .pth files run too), as --system-site-packages does for a system interpreter.
    (site / "zz-device-check-parent.pth").write_text("".join(f"import site; site.addsitedir({p!r})\n" for p in parents))
    libiomp5 = _link_libiomp5(venv, parents)
    interp = Interpreter(python, tier="pip")
    interp.log.append(f"venv {venv} seeing {len(parents)} package dir(s) of {sys.executable}; "
                      f"libiomp5: {libiomp5 or 'not found'}")
    source = work / "src"
    _copy_source(source)
    rc, out = _run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                    str(source)], timeout, {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    interp.log.append("pip install --no-deps --no-build-isolation: " + ("ok" if rc == 0 else f"exit {rc}: {out[-600:]}"))
    if rc != 0:
        # A regular wheel's layout, by hand: the package, and the hook's .pth and module beside it.
        interp.tier = "hook-by-hand"
        (site / "launcher").symlink_to(ROOT / "launcher")
        for name in ("affrun-startup.pth", "_affrun_startup.py"):
            shutil.copy2(ROOT / "build_backend" / name, site / name)
        interp.log.append(f"placed launcher -> {ROOT / 'launcher'}, affrun-startup.pth and _affrun_startup.py in {site}")
    unpack_carried(carry, work, interp, timeout)
    checked = _verified(interp)
    if checked.tier == "failed":
        fallback.log = [*interp.log, *checked.log, f"fell back to PYTHONPATH={ROOT} with {sys.executable}"]
        fallback.carried = interp.carried
        fallback.env.update({k: v for k, v in interp.env.items() if k in ("PATH", "LD_LIBRARY_PATH")})
        return _verified(fallback)
    return checked


def _verified(interp: Interpreter) -> Interpreter:
    env = {**os.environ, **interp.env}
    interp.ok, where = imports_ok(interp.python, env)
    interp.log.append(f"{interp.python}: import launcher, torch: " + (f"ok ({where})" if interp.ok else f"failed: {where}"))
    if not interp.ok and interp.tier != "pythonpath":
        interp.tier = "failed"
        return interp
    interp.hook = interp.ok and hook_answers(interp.python, env)
    interp.log.append(f"startup hook: {'answers' if interp.hook else 'absent'}")
    return interp


# ------------------------------------------------------------------------------------------------ fake trees
def _fakesys() -> Any:
    """tests/fakesys.py, loaded by its path (a package named ``tests`` elsewhere on the path cannot shadow it)."""
    spec = importlib.util.spec_from_file_location("device_check_fakesys", ROOT / "tests" / "fakesys.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def write_fake_trees(work: Path) -> tuple[Path, Path]:
    """(this machine's CPUs with one fake GPU on their node: the ranks really bind there; a 16-core one-GPU tree
    shaped like the lent machine, for what is only planned)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))  # fakesys imports launcher.base.cpulist
    fakesys = _fakesys()
    here = fakesys.write_tree(work / "tree-here", fakesys.this_machine_with_gpus(1))
    lent = fakesys.uniform(1, 16)
    lent.gpus = [fakesys.FakeGPU(pci="0000:17:00.0", numa_node=0, uuid="GPU-fake-h200")]
    return here, fakesys.write_tree(work / "tree-lent-shape", lent)


def main() -> None:
    parser = argparse.ArgumentParser(description="print the environment facts as JSON")
    parser.add_argument("what", choices=["environment", "torch-info"])
    parser.add_argument("--fsroot", default="/")
    args = parser.parse_args()
    print(json.dumps(environment(Path(args.fsroot)) if args.what == "environment" else torch_info()))


if __name__ == "__main__":
    main()
