"""The doctor's fallback for the CPU's identity on this machine, py-cpuinfo's ``get_cpu_info()`` (CPUID on x86,
a child process that times the clock), against the kernel's ``/proc/cpuinfo`` read independently."""

from __future__ import annotations

from pathlib import Path

from launcher.topology.cpu_identity import live_identity_from_py_cpuinfo


def test_py_cpuinfo_names_the_cpu_the_kernel_names() -> None:
    found = live_identity_from_py_cpuinfo()
    assert found is not None and found.source == "py-cpuinfo"
    first = Path("/proc/cpuinfo").read_text().split("\n\n", 1)[0]
    fields = {k.strip().lower(): " ".join(v.split()) for k, _, v in (line.partition(":") for line in first.splitlines())}
    if "vendor_id" in fields and found.vendor is not None:  # x86: both read CPUID leaf 0
        assert found.vendor == fields["vendor_id"]
    if "cpu family" in fields and found.family is not None:
        assert (found.family, found.model, found.stepping) == (
            int(fields["cpu family"]), int(fields["model"]), int(fields["stepping"]))
