"""affrun's startup hook, as ``affrun-startup.pth`` runs it at interpreter start when ``AFFRUN_RUN`` is set.

It lives at the top of site-packages under a name no one else uses, so that the hook neither needs nor takes
the generic top-level name ``launcher`` (affrun's package) at interpreter start: a ``launcher`` package on
``PYTHONPATH`` or a user's ``launcher.py`` beside the script is never imported by the hook, and never shadowed by
affrun's for the user's own ``import launcher``. It loads affrun's package from its directory, by file location,
under the name ``launcher`` (its modules import each other by that name) only while the hook works, and then
takes every ``launcher`` entry out of ``sys.modules`` again, putting back any that was there before.

The build backend (``build_backend/affrun_build.py``) adds this file to every wheel, next to the .pth. A regular
wheel has the package beside it; an editable one names the source tree's package in :data:`PACKAGE_DIR`.
"""

from __future__ import annotations

import os
import sys

# The directory of affrun's package ``launcher``; ``None``: the ``launcher`` directory beside this file. The
# build backend writes the source tree's directory here in editable wheels.
PACKAGE_DIR: str | None = None
NAME = "launcher"

_done = False
# Under AFFRUN_RUN=probe (affrun run asking whether this interpreter loads the hook: launcher.launch.run_target), what
# the hook answered and the file it ran from: this module stays in sys.modules, affrun's package does not.
answered_probe = False
hook_file = ""


def package_dir() -> str:
    return PACKAGE_DIR or os.path.join(os.path.dirname(os.path.abspath(__file__)), NAME)


def _ours(name: str) -> bool:
    return name == NAME or name.startswith(NAME + ".")


def _fail(text: str) -> None:
    """One error line on file descriptor 2 (if it is open) and exit 2: user code never runs unbound."""
    try:
        os.write(2, f"affrun: error: {text}\n".encode("utf-8", "replace"))
    except OSError:
        pass
    os._exit(2)


def run() -> None:
    """Load affrun's package by location, run its hook (``launcher.startup.main``), then leave ``sys.modules``
    as it was: no ``launcher`` entry unless one was there before."""
    global _done
    if _done:  # site may read the site-packages directory twice, through a lib64 link
        return
    _done = True
    before = {name: module for name, module in sys.modules.items() if _ours(name)}
    for name in before:
        del sys.modules[name]
    try:
        import importlib.util

        where = package_dir()
        spec = importlib.util.spec_from_file_location(NAME, os.path.join(where, "__init__.py"),
                                                      submodule_search_locations=[where])
        if spec is None or spec.loader is None or not os.path.isfile(os.path.join(where, "startup.py")):
            _fail(f"AFFRUN_RUN is set but affrun's package is not at {where!r} (reinstall affrun)")
            return
        package = importlib.util.module_from_spec(spec)
        sys.modules[NAME] = package
        spec.loader.exec_module(package)
        startup = importlib.import_module(NAME + ".startup")
    except Exception as exc:  # the package is broken or half installed
        _fail(f"the startup hook cannot load affrun's package: {type(exc).__name__}: {exc}"[:400])
        return
    try:
        startup.main()
    finally:
        global answered_probe, hook_file
        answered_probe = bool(getattr(startup, "answered_probe", False))
        hook_file = str(getattr(startup, "__file__", ""))
        for name in [n for n in sys.modules if _ours(n)]:
            del sys.modules[name]
        sys.modules.update(before)
