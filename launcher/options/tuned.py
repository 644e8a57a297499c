"""``--tuned FILE``: the options ``affrun tune --save`` wrote, as defaults under the command line's flags.

The file is YAML: ``options`` (the option table's planning options by their profile keys, ``loader-cores: 2``),
``machine`` (:func:`machine_identity` where it was tuned) and ``date``. :func:`load_tuned` reads and checks it;
the front ends make its options their parser's defaults, so a flag given on the command line wins, and print
:func:`machine_differences` as a warning. Only read when ``--tuned`` is given (PyYAML is imported then).
docs/tune.md describes the format.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from launcher.base.untrusted import ascii_uint, short
from launcher.errors import ConfigError
from launcher.options.table import FEED_OPTIONS, TUNED_OPTION, OptionSpec, options_in

if TYPE_CHECKING:
    import argparse
    from collections.abc import Mapping

    from launcher.options.groups import SourceOptions
    from launcher.topology.model import Topology

FORMAT = 1  # the file's ``affrun-tuned`` key


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
    return ConfigError(f"{TUNED_OPTION.flag} {short(path)}: {why}")


def _option_value(path: str, key: str, value: object) -> object:
    by_key = {spec.name("profile"): spec for spec in tunable()}
    spec = by_key.get(key)
    if spec is None:
        raise _fail(path, f"{short(key)} is not an option a tuned file sets (known: {', '.join(sorted(by_key))})")
    if spec.is_flag:
        if not isinstance(value, bool):
            raise _fail(path, f"{key}: {short(value)} is not true or false")
        return value
    if spec.count:
        number = value if isinstance(value, int) and not isinstance(value, bool) else (
            ascii_uint(value) if isinstance(value, str) else None)
        if number is None or number < 0:
            raise _fail(path, f"{key}: {short(value)} is not a whole number >= 0")
        return number
    if not isinstance(value, (str, int)) or isinstance(value, bool):
        raise _fail(path, f"{key}: {short(value)} is not a string")
    if spec.choices and str(value) not in spec.choices:
        raise _fail(path, f"{key}: {short(value)} is not one of {', '.join(spec.choices)}")
    return str(value)


def parse_tuned(text: str, path: str) -> Tuned:
    """The tuned file ``path`` whose text is ``text``, checked: every option one of the table's planning options
    with a value it takes. Anything else is one :class:`ConfigError` naming the file."""
    import yaml

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise _fail(path, f"not YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict) or not isinstance(data.get("options"), dict):
        raise _fail(path, "not a file of affrun tune --save (no 'options' mapping)")
    if data.get("affrun-tuned") != FORMAT:
        raise _fail(path, f"'affrun-tuned: {FORMAT}' is missing: not a file of this affrun's tune --save")
    by_key = {spec.name("profile"): spec.dest for spec in tunable()}
    values = {by_key.get(str(k), str(k)): _option_value(path, str(k), v) for k, v in data["options"].items()}
    machine = data.get("machine")
    return Tuned(path, values, dict(machine) if isinstance(machine, dict) else {}, str(data.get("date", "")))


def load_tuned(path: str) -> Tuned:
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read(1 << 20)
    except (OSError, UnicodeDecodeError) as exc:
        raise _fail(path, getattr(exc, "strerror", None) or str(exc)) from None
    return parse_tuned(text, path)


def apply_tuned(parser: argparse.ArgumentParser, words: list[str], args: argparse.Namespace,
                prefix: str = "") -> tuple[argparse.Namespace, Tuned | None]:
    """``args`` parsed again from ``words`` with the options of ``--tuned`` (when given) as the parser's defaults:
    a flag given on the command line wins."""
    path = getattr(args, prefix + TUNED_OPTION.dest, None)
    if path is None:  # "" is a path that cannot be read, not no --tuned
        return args, None
    tuned = load_tuned(path)
    parser.set_defaults(**{prefix + dest: value for dest, value in tuned.values.items()})
    return parser.parse_args(words), tuned


def cpu_model(root: str | None) -> str:
    """The CPU's model name from ``/proc/cpuinfo``'s first entry (under ``root``, a captured tree), or ``unknown``
    (read as :func:`launcher.topology.cpuinfo_file.read_cpuinfo` reads it: bounded, never blocking)."""
    from launcher.topology.cpuinfo_file import field_text, read_cpuinfo

    fields = read_cpuinfo(root or "/").fields
    key = next((k for k in ("model name", "Model", "cpu model") if k in fields), None)
    return (field_text(fields[key])[0] if key else None) or "unknown"


def machine_identity(topo: Topology, root: str | None) -> dict[str, Any]:
    """What makes a tuned file this machine's: the CPU model, its packages, cores and CPUs, the GPUs' vendors."""
    return {"cpu-model": cpu_model(root), "packages": len(topo.packages), "cores": len(topo.cores),
            "cpus": len(topo.online), "gpus": [g.vendor for g in topo.gpus]}


def machine_differences(there: Mapping[str, Any], here: Mapping[str, Any]) -> list[str]:
    """Each identity key whose value differs, as ``cores 64 there, 2 here`` (a key the file lacks is left out)."""
    return [f"{key} {there[key]!r} there, {here[key]!r} here" if key == "cpu-model"
            else f"{key} {there[key]} there, {here[key]} here"
            for key in IDENTITY_KEYS if key in there and key in here and there[key] != here[key]]


def tuned_warning(tuned: Tuned | None, topo: Topology, source: SourceOptions,
                  environ: Mapping[str, str] | None = None) -> str | None:
    """The warning for a file tuned on another machine than ``topo`` (read from ``source``); ``None``: none."""
    if tuned is None:
        return None
    from launcher.topology import tree_root

    root = tree_root(source.fsroot, source.topology_file, os.environ if environ is None else environ)
    diff = machine_differences(tuned.machine, machine_identity(topo, root))
    if not diff:
        return None
    when = f" on {tuned.date}" if tuned.date else ""
    return (f"{TUNED_OPTION.flag} {tuned.path} was tuned on another machine{when}: {'; '.join(diff)}; "
            "run affrun tune here")


def render_tuned(values: Mapping[str, Any], machine: Mapping[str, Any], date: str, about: str) -> str:
    """The YAML text of a tuned file (``values`` by ``dest``); ``about``: a comment line on what was tuned."""
    import yaml

    by_dest = {spec.dest: spec.name("profile") for spec in tunable()}
    data = {"affrun-tuned": FORMAT, "options": {by_dest[d]: v for d, v in values.items()},
            "machine": dict(machine), "date": date}
    head = (f"# {about}\n# Apply: affrun torchrun --tuned FILE ... (also exec, run, sbatch); a flag given on the "
            "command line wins.\n")
    return head + yaml.safe_dump(data, sort_keys=False, default_flow_style=False)
