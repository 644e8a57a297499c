"""``--tuned FILE``: the options ``affrun tune --save`` wrote, as defaults under the command line's flags.
The format, and what is refused: docs/tune.md, "``--save`` and ``--tuned``".
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, TypeVar

from launcher.base.cpulist import MAX_COUNT
from launcher.base.errors import AffrunError, ConfigError, Opt
from launcher.base.untrusted import clip, short, shown
from launcher.options.table import FEED_OPTIONS, TUNED_OPTION, OptionSpec, options_in

if TYPE_CHECKING:
    from collections.abc import Callable, Container, Mapping, MutableMapping, Sequence

    from launcher.options.record import Options
    from launcher.topology.model import Topology

FORMAT = 1  # the file's ``affrun-tuned`` key
TOP_KEYS = ("affrun-tuned", "options", "machine", "date")
# A saved file is a few hundred bytes; PyYAML reads about a MB a second (libyaml's parser) or less.
TUNED_LIMIT = 64 << 10
T = TypeVar("T")


def tunable() -> tuple[OptionSpec, ...]:
    """The options a tuned file may hold: the planning options and ``--loader-workers``."""
    return (*options_in("plan"), *(spec for spec in FEED_OPTIONS if spec.dest == "loader_workers"))


IDENTITY_KEYS = ("cpu-model", "packages", "cores", "cpus", "gpus")


@dataclass(frozen=True)
class Tuned:
    """A tuned file: its options by ``dest``, and the identity of the machine it was tuned on."""

    path: str
    values: dict[str, Any]
    machine: dict[str, Any]
    date: str
    applied: frozenset[str] = frozenset()  # the dests whose value is the file's: no flag given (apply_tuned)

    def argv(self) -> list[str]:
        """The options as flags (``--loader-cores 2 --loader-workers 4``)."""
        by_dest = {spec.dest: spec for spec in tunable()}
        out: list[str] = []
        for dest, value in self.values.items():
            spec = by_dest[dest]
            if spec.is_flag:
                out += [spec.flag] if value else []
            else:
                out += [spec.flag, str(value)]
        return out


def _fail(path: str, why: str) -> ConfigError:
    return ConfigError(f"{TUNED_OPTION.flag} {clip(path, 120)}: {why}")


def _key_text(key: object) -> str:
    return clip(key, 40) if isinstance(key, str) else short(key, 40)  # str() of a huge integer raises


def _unknown(path: str, where: str, key: object, known: Sequence[str]) -> ConfigError:
    """``unknown option loader-core: did you mean loader-cores? (a tuned file sets ...)``: the wording of
    :mod:`launcher.options.usage`, in the file's vocabulary."""
    from launcher.options.usage import nearest

    close = nearest(key, list(known)) if isinstance(key, str) and len(key) <= 100 else None
    guess = f": did you mean {close}?" if close else ""
    return _fail(path, f"unknown {where} {_key_text(key)}{guess} ({where}s: {', '.join(known)})")


def _option_value(path: str, key: str, value: object) -> object:
    """A tuned option's value, read by its kind as every vocabulary's is (:mod:`launcher.options.values`)."""
    from launcher.options.values import BadValue

    spec = {spec.name("profile"): spec for spec in tunable()}[key]
    try:
        return spec.read(value, "tuned")
    except BadValue as exc:
        raise _fail(path, f"{key}: {exc.is_not(value)}") from None


def _machine(path: str, data: object) -> dict[str, Any]:
    """The ``machine`` mapping, each key one of :data:`IDENTITY_KEYS` with a value of its type."""
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise _fail(path, f"machine: {short(data)} is not a mapping")
    out: dict[str, Any] = {}
    for key, value in data.items():
        if key not in IDENTITY_KEYS:
            raise _unknown(path, "machine key", key, IDENTITY_KEYS)
        if key == "cpu-model":
            ok = isinstance(value, str)
        elif key == "gpus":
            ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
        else:
            ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT
        if not ok:
            kind = {"cpu-model": "a string", "gpus": "a list of GPU vendors"}.get(key, "a whole number")
            raise _fail(path, f"machine: {key}: {short(value)} is not {kind}")
        out[key] = value
    return out


def parse_tuned(text: str | bytes, path: str) -> Tuned:
    """The tuned file ``path`` whose text is ``text``, checked: plain YAML, its keys known, every option a tunable
    one with a value it takes. Anything else is one :class:`ConfigError` naming the file."""
    from launcher.base.safe_yaml import BadYAML, load_yaml

    try:
        data = load_yaml(text)
    except BadYAML as exc:
        raise _fail(path, str(exc)) from None
    for key in data if isinstance(data, dict) else ():
        if key not in TOP_KEYS:
            raise _unknown(path, "key", key, TOP_KEYS)
    options = data.get("options") if isinstance(data, dict) else None
    if not isinstance(data, dict) or "options" not in data or not isinstance(options, (dict, type(None))):
        raise _fail(path, "not a file of affrun tune --save (no 'options' mapping)")
    if data.get("affrun-tuned") != FORMAT:
        raise _fail(path, f"'affrun-tuned: {FORMAT}' is missing: not a file of this affrun's tune --save")
    by_key = {spec.name("profile"): spec.dest for spec in tunable()}
    values: dict[str, Any] = {}
    for key, value in (options or {}).items():
        if key not in by_key:
            raise _unknown(path, "option", key, sorted(by_key))
        values[by_key[key]] = _option_value(path, key, value)
    date = data.get("date", "")
    if not isinstance(date, (str, int, float)) or isinstance(date, bool):
        raise _fail(path, f"date: {short(date)} is not a string")
    return Tuned(path, values, _machine(path, data.get("machine")), clip(str(date), 60))


def load_tuned(path: str) -> Tuned:
    """The tuned file at ``path``: a regular file of at most :data:`TUNED_LIMIT` bytes, else one error."""
    from launcher.topology._files import read_document

    try:
        data = read_document(path, "a file of affrun tune --save", ConfigError, limit=TUNED_LIMIT)
    except ConfigError as exc:
        raise ConfigError(f"{TUNED_OPTION.flag} {exc}") from None
    return parse_tuned(data, path)


def apply_tuned(values: MutableMapping[str, Any], given: Container[str], prefix: str = "") -> Tuned | None:
    """The options of ``--tuned`` (when given) written into ``values`` (by ``prefix + dest``) under the flags the
    command line gave (``given``, by ``dest``): a flag given wins. The file's :attr:`Tuned.applied` are those no
    flag gave; its ``--map`` belongs to its ``--mode map``, and another ``--mode`` given wins over both."""
    path = values.get(prefix + TUNED_OPTION.dest)
    if path is None:  # "" is a path that cannot be read, not no --tuned
        return None
    tuned = load_tuned(path)
    applied = frozenset(dest for dest in tuned.values if dest not in given)
    if "cpu_map" in applied and "mode" in given and "mode" in tuned.values and values[prefix + "mode"] != "map":
        applied -= {"cpu_map"}
    values.update({prefix + dest: tuned.values[dest] for dest in applied})
    return replace(tuned, applied=applied)


def plan_tuned(tuned: Tuned | None, args: Any, plan: Callable[[Any], T], prefix: str = "") -> T:
    """``plan(args)``; an :class:`AffrunError` it raises that an option of the file caused (it names one first, or
    ``plan`` succeeds without them) ends with ``(from --tuned FILE, tuned on MACHINE)``."""
    try:
        return plan(args)
    except AffrunError as exc:
        if tuned is not None and tuned.applied and _caused(tuned, exc, args, plan, prefix):
            exc.parts = (*exc.parts, f" (from {TUNED_OPTION.flag} {clip(tuned.path, 120)}, "
                                     f"{machine_text(tuned.machine)})")
        raise


def _caused(tuned: Tuned, exc: AffrunError, args: Any, plan: Callable[[Any], T], prefix: str) -> bool:
    named = [part.key for part in exc.parts if isinstance(part, Opt)]
    if named and named[0] in tuned.applied:
        return True
    import copy

    defaults = {spec.dest: spec.default for spec in tunable()}
    without = copy.copy(args)
    for dest in tuned.applied:
        setattr(without, prefix + dest, defaults[dest])
    try:
        plan(without)
    except AffrunError:
        return False
    return True


def machine_text(machine: Mapping[str, Any]) -> str:
    """The machine a file was tuned on, in words: ``tuned on 'EPYC 9654', 2 packages, 192 cores, 384 CPUs, 8 GPUs``."""
    parts = [short(machine["cpu-model"])] if "cpu-model" in machine else []
    for key, unit in (("packages", "package"), ("cores", "core"), ("cpus", "CPU")):
        if key in machine:
            parts.append(f"{machine[key]} {unit}{'' if machine[key] == 1 else 's'}")
    if "gpus" in machine:
        count = len(machine["gpus"])
        parts.append("no GPU" if count == 0 else f"{count} GPU{'' if count == 1 else 's'}")
    return f"tuned on {', '.join(parts)}" if parts else "tuned on a machine the file does not describe"


def foreign_check(tuned: Tuned, source: Options, environ: Mapping[str, str] | None,
                  warn: Callable[[str], None]) -> Callable[[Topology], None]:
    """:func:`launcher.bind.handoff.plan_job`'s ``loaded``: ``warn`` (once) :func:`tuned_warning`'s text."""
    done: list[bool] = []

    def check(topo: Topology) -> None:
        if not done:
            done.append(True)
            text = tuned_warning(tuned, topo, source, environ)
            if text:
                warn(text)

    return check


def cpu_model(root: str | None) -> str:
    """The CPU's model name, from ``/proc/cpuinfo`` under ``root``, or ``unknown``."""
    from launcher.topology.cpu_identity import read_cpu_identity

    identity, _ = read_cpu_identity(root or "/")
    return " ".join(identity.model_name.split()) if identity is not None and identity.model_name else "unknown"


def machine_identity(topo: Topology, root: str | None) -> dict[str, Any]:
    """What makes a tuned file this machine's: the CPU model, its packages, cores and CPUs, the GPUs' vendors."""
    return {"cpu-model": cpu_model(root), "packages": len(topo.packages), "cores": len(topo.cores),
            "cpus": len(topo.online), "gpus": [g.vendor for g in topo.gpus]}


def machine_differences(there: Mapping[str, Any], here: Mapping[str, Any]) -> list[str]:
    """Each identity key whose value differs, as ``cores 64 there, 2 here`` (a key the file lacks is left out)."""
    def text(key: str, value: Any) -> str:
        return short(value) if key == "cpu-model" else clip(str(value), 60)

    return [f"{key} {text(key, there[key])} there, {text(key, here[key])} here"
            for key in IDENTITY_KEYS if key in there and key in here and there[key] != here[key]]


def tuned_warning(tuned: Tuned | None, topo: Topology, source: Options,
                  environ: Mapping[str, str] | None = None) -> str | None:
    """The warning for a file tuned on another machine than ``topo`` (read from ``source``); ``None``: none. As
    the file wrote it: printed through :func:`launcher.base.untrusted.warning_line`."""
    if tuned is None:
        return None
    from launcher.topology import tree_root

    root = tree_root(source.fsroot, source.topology, os.environ if environ is None else environ)
    diff = machine_differences(tuned.machine, machine_identity(topo, root))
    if not diff:
        return None
    when = f" on {tuned.date}" if tuned.date else ""
    return (f"{TUNED_OPTION.flag} {clip(tuned.path, 120)} was tuned on another machine{when}: "
            f"{'; '.join(diff)}; run affrun tune here")


def render_tuned(values: Mapping[str, Any], machine: Mapping[str, Any], date: str, about: str) -> str:
    """The YAML text of a tuned file (``values`` by ``dest``); ``about``: a comment line on what was tuned."""
    import yaml

    by_dest = {spec.dest: spec.name("profile") for spec in tunable()}
    data = {"affrun-tuned": FORMAT, "options": {by_dest[d]: v for d, v in values.items()},
            "machine": dict(machine), "date": date}
    head = (f"# {shown(about)}\n# Apply: affrun torchrun --tuned FILE ... (also exec, run, sbatch); a flag given on the "
            "command line wins.\n")
    return head + yaml.safe_dump(data, sort_keys=False, default_flow_style=False)
