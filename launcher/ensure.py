"""``ensure_affinity()``: run ``affrun doctor``'s per-process checks on this process's environment and CPU mask from
inside a training script, and fix (``safe``), only report (``keep``) or refuse (``strict``) what is dangerous.
The rules: docs/python-api.md.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, get_args

from launcher.base.untrusted import shown
from launcher.context.runtimes import BY_NAME, LoadedRuntime
from launcher.doctor.findings import Finding, worst_first

EnsurePolicy = Literal["safe", "keep", "strict"]
ENSURE_POLICIES: tuple[EnsurePolicy, ...] = get_args(EnsurePolicy)
# Findings whose env_fix ``safe`` applies: values that make a job slow or crash.
FIXED_IDS = (
    "kmp-affinity-disabled", "kmp-affinity-empty", "kmp-affinity-malformed", "kmp-proclist-outside",
    "places-outside-mask", "omp-binding-malformed", "omp-threads-invalid", "omp-oversubscribed", "omp-threads-unset",
    "collapse-risk",
)


class AffinityWarning(RuntimeWarning):
    """Emitted when a fix cannot take effect in this process (its OpenMP/BLAS runtime has already started)."""


class UnsafeEnvironment(RuntimeError):
    """Raised by ``ensure_affinity(policy="strict")``; ``report`` holds the findings."""

    def __init__(self, report: AffinityReport) -> None:
        super().__init__(str(report))
        self.report = report


@dataclass(frozen=True)
class Change:
    variable: str
    old: str | None
    new: str | None  # None: unset
    finding: str  # the finding id it fixes

    def __str__(self) -> str:
        old = "unset" if self.old is None else f"{self.old!r}"
        new = "unset" if self.new is None else f"{self.new!r}"
        return f"{self.variable}: {old} -> {new} ({self.finding})"


@dataclass
class AffinityReport:
    policy: EnsurePolicy
    findings: list[Finding]
    changes: list[Change] = field(default_factory=list)
    runtimes: list[LoadedRuntime] = field(default_factory=list)  # loaded in this process when it was called
    too_late: list[str] = field(default_factory=list)  # "libgomp (OMP_PLACES...)": loaded runtimes that already read
    advice: list[str] = field(default_factory=list)

    @property
    def remaining(self) -> list[Finding]:
        """Findings of warning or error that the changes did not fix (or that cannot take effect yet)."""
        fixed = {c.finding for c in self.changes} if not self.too_late else set()
        return [f for f in self.findings if f.at_least("warning") and f.id not in fixed]

    @property
    def ok(self) -> bool:
        return not self.remaining

    @property
    def takes_effect(self) -> bool:
        """The changes reach this process's runtimes (none was loaded yet that reads them)."""
        return not self.too_late

    def __str__(self) -> str:
        lines = [f"ensure_affinity(policy={self.policy!r}): "
                 + ("environment is safe" if not self.findings else f"{len(self.findings)} finding(s)")]
        for f in worst_first(self.findings):
            lines.append(f"  {f.severity} {f.id}: {f.message} -- fix: {f.fix}")
        for c in self.changes:
            lines.append(f"  changed {c}")
        lines.extend(f"  {a}" for a in self.advice)
        return "\n".join(shown(line) for line in lines)  # the findings and changes echo environment values


def ensure_affinity(
    policy: EnsurePolicy = "safe",
    *,
    nproc_per_node: int | None = None,
    environ: MutableMapping[str, str] | None = None,
    warn: bool = True,
) -> AffinityReport:
    """Check this process's launch environment, fix it according to ``policy``, and return a report; a wrong
    argument is one :class:`ConfigError`. ``environ`` defaults to ``os.environ``; ``nproc_per_node``: local ranks,
    when no launcher variable says it."""
    from launcher.base.errors import ConfigError
    from launcher.base.untrusted import short
    from launcher.options.keywords import check_argument, check_rank_keywords

    check_argument("ensure_affinity", "policy", policy, "choice", ENSURE_POLICIES)
    if nproc_per_node is not None:
        check_rank_keywords("ensure_affinity", nproc_per_node)
    check_argument("ensure_affinity", "warn", warn, "flag")
    if environ is not None and not (isinstance(environ, MutableMapping) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in environ.items())):
        raise ConfigError(f"ensure_affinity: environ={short(environ)}: expected a mutable mapping of str to str "
                          "(os.environ, or a dict like it)")
    from launcher.context.runtimes import in_process, openmp_names
    from launcher.doctor.diagnose import audited_machine, diagnose
    from launcher.doctor.facts import launch_cpus

    env = os.environ if environ is None else environ
    started_with = launch_cpus(env)  # what this process was given, even if libgomp already pinned the main thread
    machine = audited_machine(environ=env, allowed=started_with)
    try:
        runtimes = [runtime for runtime, _ in in_process()]
    except OSError:  # no /proc/self/maps
        runtimes = []
    loaded_openmp = openmp_names(runtimes)
    _, findings = diagnose(env, machine, nproc=nproc_per_node, probe_host=False, openmp=loaded_openmp or None,
                           openmp_source="loaded in this process" if loaded_openmp else "",
                           process_cpus=started_with, host=False)
    report = AffinityReport(policy, findings, runtimes=runtimes)
    dangerous = [f for f in findings if f.id in FIXED_IDS and f.env_fix and f.at_least("warning")]
    if policy == "strict":
        if any(f.at_least("warning") for f in findings):
            raise UnsafeEnvironment(report)
        return report
    if policy == "safe":
        for f in dangerous:
            for name, value in f.env_fix.items():
                old = env.get(name)
                if old == value:
                    continue
                if value is None:
                    env.pop(name, None)
                else:
                    env[name] = value
                report.changes.append(Change(name, old, value, f.id))
    elif dangerous:
        report.advice.append("policy 'keep': nothing was changed; policy 'safe' would apply: "
                             + "; ".join(f"{k}={v}" for f in dangerous for k, v in f.env_fix.items()))
    changed = [c.variable for c in report.changes] or ([k for f in dangerous for k in f.env_fix] if policy == "keep"
                                                        else [])
    report.too_late = _already_read(runtimes, changed)
    if report.too_late:
        first = len(report.advice)
        report.advice.append(
            "too late for this process: " + "; ".join(report.too_late) + ". Only processes started from now on "
            "get the new values (and they still inherit this process's CPU mask). For this process, launch it "
            "through `affrun torchrun` / `affrun exec` (which sets the variables before Python starts), or call "
            "ensure_affinity() before importing numpy or torch.")
        pinned = frozenset(os.sched_getaffinity(0))
        if pinned < started_with:
            from launcher.base.cpulist import format_cpulist

            report.advice.append(
                f"this process's main thread is already pinned to CPU {format_cpulist(pinned)} of "
                f"{format_cpulist(started_with)}: pass worker_init_fn=launcher.torch.worker_init_fn to the "
                "DataLoader so that its workers do not inherit that one place")
        if warn:
            warnings.warn(" ".join(report.advice[first:]), AffinityWarning, stacklevel=2)
    return report


def _already_read(runtimes: Sequence[LoadedRuntime], variables: Sequence[str]) -> list[str]:
    out: list[str] = []
    for runtime in runtimes:
        row = BY_NAME[runtime.name]
        read = [v for v in dict.fromkeys(variables) if v in row.variables]
        if not read:
            continue
        when = ("read them when it was loaded" if row.reads_at == "load"
                else "reads them at its first parallel region, which may already have run")
        out.append(f"{runtime.name} ({runtime.path}) is loaded and {when}: {', '.join(read)}")
    return out
