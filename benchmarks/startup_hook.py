"""What the startup hook ``affrun-startup.pth`` costs every Python start, as ratios measured in the same run.

Two throwaway virtual environments from the same interpreter, identical but for the hook: both can import affrun
(a path ``.pth`` to this checkout), one also has ``affrun-startup.pth`` and the ``_affrun_startup`` module it
imports. Timed, interleaved:

1. ``python -c pass`` with the hook, ``AFFRUN_RUN`` unset, vs without the hook   (goal: < 1 ms more, ratio ~1.0)
2. the same with the hook switched on (``AFFRUN_RUN`` + a one-rank plan): what binding at start costs (information)
3. the same in a rank bound by affrun (``AFFRUN_LOCAL_RANK``): the thread hooks armed, waiting for ``import torch``
4. in-process, without the variable: what ``site`` does with the file (``site.addpackage``: open, read, exec
   the line), and the line alone (``timeit``). These are steady where whole-interpreter starts are noisy.

Usage: python benchmarks/startup_hook.py [--repeats N]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import timeit

from _common import ROOT, byte_compile_affrun, clean_env, median_walls

PTH = os.path.join(ROOT, "build_backend", "affrun-startup.pth")


def make_venv(where: str, hook: bool) -> str:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", where], check=True)
    python = os.path.join(where, "bin", "python")
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    with open(os.path.join(purelib, "affrun-path.pth"), "w") as fh:
        fh.write(ROOT + "\n")
    if hook:
        with open(PTH) as src, open(os.path.join(purelib, "affrun-startup.pth"), "w") as dst:
            dst.write(src.read())
        # the module the line imports, as an editable wheel carries it: naming this checkout's package
        sys.path.insert(0, os.path.join(ROOT, "build_backend"))
        from affrun_build import startup_module

        with open(os.path.join(purelib, "_affrun_startup.py"), "wb") as out:
            out.write(startup_module(os.path.join(ROOT, "launcher")))
        # byte-compiled, as pip install does (PYTHONDONTWRITEBYTECODE would leave every start compiling it)
        subprocess.run([python, "-m", "py_compile", os.path.join(purelib, "_affrun_startup.py")], check=True)
    return python


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=40)
    args = parser.parse_args()
    byte_compile_affrun()
    with tempfile.TemporaryDirectory() as tmp:
        with_hook = make_venv(os.path.join(tmp, "hook"), hook=True)
        without = make_venv(os.path.join(tmp, "plain"), hook=False)
        off = median_walls({"without the hook": [without, "-c", "pass"], "with the hook": [with_hook, "-c", "pass"]},
                           args.repeats, env=clean_env())
        plan = subprocess.run([sys.executable, "-m", "launcher", "run", "--nproc-per-node", "1", "--dry-run"],
                              capture_output=True, text=True, check=True, env=clean_env()).stdout
        on_env = clean_env(**dict(ln.split("=", 1) for ln in plan.splitlines() if ln.startswith("AFFRUN_")))
        on = median_walls({"with the hook, on": [with_hook, "-c", "pass"]}, args.repeats, env=on_env)
        armed = median_walls({"without the hook": [without, "-c", "pass"], "armed": [with_hook, "-c", "pass"]},
                             args.repeats, env=clean_env(AFFRUN_LOCAL_RANK="0", AFFRUN_CPUS="0"))
    with open(PTH) as fh:
        line = fh.read().strip()
    env_backup = os.environ.pop("AFFRUN_RUN", None)
    n = 100_000
    per_line = timeit.timeit(line, number=n) / n
    import site

    folder, name = os.path.split(PTH)
    per_file = timeit.timeit(lambda: site.addpackage(folder, name, set()), number=n // 10) / (n // 10)
    if env_backup is not None:
        os.environ["AFFRUN_RUN"] = env_backup
    base = off["without the hook"]
    print(f"python -c pass, no hook:        {base * 1e3:7.2f} ms")
    print(f"python -c pass, hook off:       {off['with the hook'] * 1e3:7.2f} ms  ({off['with the hook'] / base:.3f}x, "
          f"{(off['with the hook'] - base) * 1e3:+.2f} ms; goal < 1 ms)")
    print(f"python -c pass, hook on (bind): {on['with the hook, on'] * 1e3:7.2f} ms  "
          f"({on['with the hook, on'] / base:.3f}x)")
    print(f"python -c pass, rank hooks armed: {armed['armed'] * 1e3:5.2f} ms  "
          f"({armed['armed'] / armed['without the hook']:.3f}x, "
          f"{(armed['armed'] - armed['without the hook']) * 1e3:+.2f} ms)")
    print(f"site.addpackage(the .pth), off: {per_file * 1e6:7.3f} us")
    print(f"the .pth line alone, off:       {per_line * 1e6:7.3f} us")


if __name__ == "__main__":
    main()
