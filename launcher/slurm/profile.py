"""Site defaults and named profiles for ``affrun sbatch``, from a YAML file (docs/slurm.md): ``defaults`` and
``profiles``, keyed by ``affrun sbatch``'s long option names, each value read by its option's reader. Unknown keys
and wrong values are one error naming the file and the key."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher.base.errors import ConfigError
from launcher.base.untrusted import clip, short
from launcher.options.table import OptionSpec, options_in
from launcher.slurm.options import SBATCH_OPTIONS

# key -> option: sbatch's own, and affrun's planning and environment options, passed to affrun in the job.
KEYS: dict[str, OptionSpec] = {spec.name("profile"): spec for spec in (*SBATCH_OPTIONS, *options_in("plan", "env"))}
TOP_LEVEL = ("defaults", "profiles")
CONFIG_LIMIT = 1 << 20  # a site configuration is a few KB (docs/slurm.md)


@dataclass(frozen=True)
class SiteConfig:
    path: str | None  # None: no file was found (and none was asked for)
    defaults: dict[str, Any]
    profiles: dict[str, dict[str, Any]]

    def settings(self, profile: str | None) -> dict[str, Any]:
        """The defaults with ``profile`` applied over them (keys in canonical dashed form)."""
        merged = dict(self.defaults)
        if profile is not None:
            if profile not in self.profiles:
                where = self.path or "no configuration file"
                names = sorted(self.profiles)
                known = ", ".join(clip(n, 40) for n in names[:10]) + (f" and {len(names) - 10} more" if names[10:] else "")
                raise ConfigError(f"--profile {clip(profile, 40)}: no such profile in {where} (profiles: {known or 'none'})")
            for key, value in self.profiles[profile].items():
                if KEYS[key].kind == "lines":
                    merged[key] = [*merged.get(key, []), *value]
                else:
                    merged[key] = value
        return merged


def find_config(explicit: str | None, environ: Mapping[str, str] | None = None) -> tuple[str | None, bool]:
    """The file to read and whether it must exist (given by ``--config`` or ``$AFFRUN_CONFIG``)."""
    env = os.environ if environ is None else environ
    if explicit:
        return explicit, True
    if env.get("AFFRUN_CONFIG"):
        return env["AFFRUN_CONFIG"], True
    path = Path(env.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config"), "affrun", "config.yaml")
    return (str(path), False) if path.is_file() else (None, False)


def load_config(explicit: str | None = None, environ: Mapping[str, str] | None = None) -> SiteConfig:
    path, required = find_config(explicit, environ)
    if path is None or not os.path.lexists(path):
        if required:
            raise ConfigError(f"{path}: configuration file not found")
        return SiteConfig(None, {}, {})
    from launcher.topology._files import read_document

    return parse_config(read_document(path, "a YAML configuration file", ConfigError, limit=CONFIG_LIMIT), path)


def parse_config(text: str | bytes, path: str) -> SiteConfig:
    from launcher.base.safe_yaml import BadYAML, load_yaml

    try:
        data = load_yaml(text)
    except BadYAML as exc:
        raise ConfigError(f"{path}: {exc}") from None
    if data is None:
        return SiteConfig(path, {}, {})
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping with 'defaults' and/or 'profiles' at the top")
    for key in data:
        if key not in TOP_LEVEL:
            raise ConfigError(f"{path}: {clip(key, 40) if isinstance(key, str) else short(key, 40)}: unknown key"
                              f"{_guess(key, TOP_LEVEL)} (valid at the top: {', '.join(TOP_LEVEL)})")
    defaults = _section(data.get("defaults"), path, "defaults")
    profiles_raw = data.get("profiles")
    profiles: dict[str, dict[str, Any]] = {}
    if profiles_raw is not None:
        if not isinstance(profiles_raw, dict):
            raise ConfigError(f"{path}: profiles: expected a mapping of profile names to settings")
        for name, body in profiles_raw.items():
            if not isinstance(name, str):
                raise ConfigError(f"{path}: profiles: profile name {short(name, 40)} is not a string")
            profiles[name] = _section(body, path, f"profiles.{clip(name, 40)}")
    return SiteConfig(path, defaults, profiles)


def _guess(key: object, known: Iterable[str]) -> str:
    """``: did you mean gpus-per-node?`` for a key near one of ``known`` (launcher.options.usage's wording)."""
    from launcher.options.usage import nearest

    close = nearest(key, sorted(known)) if isinstance(key, str) and len(key) <= 100 else None
    return f": did you mean {close}?" if close else ""


def _section(body: object, path: str, where: str) -> dict[str, Any]:
    from launcher.options.values import BadValue

    if body is None:
        return {}
    if not isinstance(body, dict):
        raise ConfigError(f"{path}: {where}: expected a mapping of option names to values")
    out: dict[str, Any] = {}
    for raw_key, value in body.items():
        name = clip(raw_key, 40) if isinstance(raw_key, str) else short(raw_key, 40)  # str() of a huge int raises
        key = raw_key.replace("_", "-") if isinstance(raw_key, str) else name
        if key not in KEYS:
            raise ConfigError(f"{path}: {where}.{name}: unknown key{_guess(key, KEYS)} (valid: {', '.join(sorted(KEYS))})")
        try:
            out[key] = KEYS[key].read(value, "profile")  # the one reader the command line's values go through
        except BadValue as exc:
            raise ConfigError(f"{path}: {where}.{name}: {exc}, got {short(value)}") from None
        if key == "template" and not os.path.isabs(out[key]):
            out[key] = os.path.join(os.path.dirname(os.path.abspath(path)), out[key])  # relative to the file
    return out

