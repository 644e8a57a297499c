"""affrun's startup hook, as ``affrun-startup.pth`` runs it at interpreter start when ``AFFRUN_RUN`` (binding),
``AFFRUN_FEED`` (the data-wait meter) or ``AFFRUN_LOCAL_RANK`` (a bound rank's thread hooks) is set. It loads
affrun's package by location under the name ``launcher`` only while the hook works, and waits for the script's
``import torch`` through one import hook (:func:`when_imported`). Why it lives at the top of site-packages under
this name, and how the build backend ships it (:data:`PACKAGE_DIR`): docs/design.md §11.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import ModuleType
    from typing import Any

# affrun's package directory; None: ``launcher`` beside this file. Editable wheels name the source tree's here.
PACKAGE_DIR: str | None = None
NAME = "launcher"

_done = False
# Under AFFRUN_RUN=probe (launcher.launch.run_target), what the hook answered and the file it ran from: this
# module stays in sys.modules, affrun's package does not.
answered_probe = False
hook_file = ""
# A bound rank's CPU mask at interpreter start, before any import could narrow it (launcher.bind.rank_hooks.install).
start_mask: frozenset[int] | None = None


def package_dir() -> str:
    """The directory of affrun's package."""
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


def _take_ours() -> dict[str, ModuleType]:
    """Take every ``launcher`` entry out of ``sys.modules``; return them, for :func:`_put_back`."""
    before: dict[str, ModuleType] = {name: module for name, module in sys.modules.items() if _ours(name)}
    for name in before:
        del sys.modules[name]
    return before


def _put_back(before: dict[str, ModuleType]) -> None:
    for name in [n for n in sys.modules if _ours(n)]:
        del sys.modules[name]
    sys.modules.update(before)


def _load_package(why: str) -> None:
    """Load affrun's package by location under ``launcher`` (raises when it is missing or broken)."""
    import importlib.util

    where = package_dir()
    spec = importlib.util.spec_from_file_location(NAME, os.path.join(where, "__init__.py"),
                                                  submodule_search_locations=[where])
    if spec is None or spec.loader is None or not os.path.isfile(os.path.join(where, "startup.py")):
        raise FileNotFoundError(f"{why} is set but affrun's package is not at {where!r} (reinstall affrun)")
    package = importlib.util.module_from_spec(spec)
    sys.modules[NAME] = package
    spec.loader.exec_module(package)


def run() -> None:
    """Run by the .pth line, once: the binding hook (:func:`bind`), then what waits for ``import torch``: the feed
    meter (:func:`meter`) and the rank's thread hooks (:func:`rank_hooks`)."""
    global _done, start_mask
    if _done:  # site may read the site-packages directory twice, through a lib64 link
        return
    _done = True
    if os.environ.get("AFFRUN_RUN"):
        bind()
    if os.environ.get(FEED_VARIABLE):
        when_imported(FEED_MODULE, meter)
    if os.environ.get(BOUND_VARIABLE):  # bound by affrun: read after bind(), which sets it under affrun run
        hooks = os.environ.get(HOOKS_VARIABLE) or "auto"
        if hooks == "auto":
            try:
                start_mask = frozenset(os.sched_getaffinity(0))
            except OSError:
                start_mask = None
            when_imported(TORCH_MODULE, rank_hooks)
        elif hooks != "none":
            _warn(f"{HOOKS_VARIABLE}={hooks[:40]!r} is not auto or none: the rank's thread hooks are off")


def bind() -> None:
    """Load affrun's package by location, run its hook (``launcher.startup.main``), then leave ``sys.modules``
    as it was: no ``launcher`` entry unless one was there before."""
    before = _take_ours()
    try:
        import importlib

        _load_package("AFFRUN_RUN")
        startup = importlib.import_module(NAME + ".startup")
    except FileNotFoundError as exc:
        _fail(str(exc))
        return
    except Exception as exc:  # the package is broken or half installed
        _fail(f"the startup hook cannot load affrun's package: {type(exc).__name__}: {exc}"[:400])
        return
    try:
        startup.main()
    finally:
        global answered_probe, hook_file
        answered_probe = bool(getattr(startup, "answered_probe", False))
        hook_file = str(getattr(startup, "__file__", ""))
        _put_back(before)


# ------------------------------------------------------------------ what waits for the script's imports
FEED_VARIABLE = "AFFRUN_FEED"
FEED_MODULE = "torch.utils.data.dataloader"  # what launcher.feed.meter patches, once the script imports it
# The rank's thread hooks: AFFRUN_LOCAL_RANK marks a bound process, AFFRUN_RANK_HOOKS=none turns them off (the
# names are launcher.env.variables').
BOUND_VARIABLE = "AFFRUN_LOCAL_RANK"
HOOKS_VARIABLE = "AFFRUN_RANK_HOOKS"
TORCH_MODULE = "torch"  # `import torch` imports torch.utils.data and its worker and pin-memory modules
_waiting: dict[str, list[Callable[[Any], None]]] = {}


def when_imported(name: str, callback: Callable[[Any], None]) -> None:
    """Call ``callback(module)`` once the module ``name`` has been imported and executed (:class:`ImportHook`)."""
    _waiting.setdefault(name, []).append(callback)
    if ImportHook not in sys.meta_path:  # type: ignore[comparison-overlap]
        sys.meta_path.insert(0, ImportHook)  # type: ignore[arg-type]


class ImportHook:
    """A one-shot import hook for the names :func:`when_imported` waits for: the other finders find the module, and
    its loader calls the callbacks once it has run; it leaves ``sys.meta_path`` once nothing waits."""

    @staticmethod
    def find_spec(name: str, path: object = None, target: object = None) -> object:
        if name not in _waiting:
            return None
        callbacks = _waiting.pop(name)
        if not _waiting and ImportHook in sys.meta_path:  # type: ignore[comparison-overlap]
            sys.meta_path.remove(ImportHook)  # type: ignore[arg-type]
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None) if finder is not ImportHook else None  # type: ignore[comparison-overlap]
            spec = find(name, path, target) if find is not None else None
            if spec is not None:
                break
        else:
            return None
        loader: Any = getattr(spec, "loader", None)
        real = getattr(loader, "exec_module", None)
        if real is None:
            return spec

        def exec_module(module: object) -> None:
            del loader.exec_module  # the loader's own again
            real(module)
            for callback in callbacks:
                try:
                    callback(module)
                except Exception as exc:  # never the script's failure
                    _warn(f"{name}: {type(exc).__name__}: {exc}")

        loader.exec_module = exec_module
        return spec


def _warn(text: str) -> None:
    """One ``affrun: warning:`` line on file descriptor 2 (if it is open)."""
    try:
        os.write(2, f"affrun: warning: {text}"[:400].encode("utf-8", "replace") + b"\n")
    except OSError:
        pass


def meter(module: object) -> None:
    """Install affrun's meter on the DataLoader module (``launcher.feed.meter.install``); a failure is one
    warning line, never the script's failure."""
    _with_package(FEED_VARIABLE, "feed.meter", module,
                  "--feed-report: the data-wait meter is not installed")


def rank_hooks(module: object) -> None:
    """Fit the rank's threads to its thread plan once ``import torch`` has completed
    (``launcher.bind.rank_hooks.install``); a failure is one warning line, never the script's failure."""
    _with_package(BOUND_VARIABLE, "bind.rank_hooks", module, "the rank's thread hooks are not installed")


def _with_package(why: str, name: str, module: object, failed: str) -> None:
    """Load affrun's package by location, call ``install(module)`` of its module ``name``, and leave
    ``sys.modules`` as it was."""
    before = _take_ours()
    try:
        import importlib

        _load_package(why)
        importlib.import_module(f"{NAME}.{name}").install(module)
    except Exception as exc:
        _warn(f"{failed}: {type(exc).__name__}: {exc}")
    finally:
        _put_back(before)
