"""The CPU's identity in the topology (vendor, model name, family, model, stepping, binding flags), read from the
described machine: ``proc/cpuinfo`` under ``--fsroot``, an hwloc XML's ``CPU*`` info attributes, a snapshot.

Expected values are copied by hand from the fixtures' own files (the tarballs' ``proc/cpuinfo``, the XML's
``<info name="CPUModel" ...>``), not from affrun's output (issue 27 item 5)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from launcher.cli import cli
from launcher.topology import load_topology
from launcher.topology.cpu_identity import parse_cpuinfo
from tests.conftest import FIXTURES
from tests.fakesys import uniform, write_tree


def topology_json(*args: str) -> dict[str, object]:
    result = CliRunner().invoke(cli, ["topology", *args, "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    data: dict[str, object] = json.loads(result.stdout)
    return data


@pytest.mark.parametrize(("tarball", "expected"), [
    ("20em64t-hybrid-1p6c2t+2ca4co1t",
     {"vendor": "GenuineIntel", "model_name": "13th Gen Intel(R) Core(TM) i7-1370P", "family": 6, "model": 186,
      "stepping": 2, "flags": [], "source": "proc/cpuinfo"}),
    # model name is padded with spaces in the file ("model name\t:                   Intel(R) Xeon(TM) CPU 2.60GHz")
    ("16em64t-4s2c2t-offlines",
     {"vendor": "GenuineIntel", "model_name": "Intel(R) Xeon(TM) CPU 2.60GHz", "family": 15, "model": 6,
      "stepping": 8, "flags": [], "source": "proc/cpuinfo"}),
    # Arm: CPU implementer 0x48 (HiSilicon), CPU part 0xd01 (3329), CPU revision 0; no model name, no family
    ("128arm-2pa2n8cluster4co",
     {"vendor": "0x48", "model_name": None, "family": None, "model": 0xD01, "stepping": 0, "flags": [],
      "source": "proc/cpuinfo"}),
    # POWER: only "cpu : POWER7 (architected), altivec supported"; no flags line at all
    ("256ppc-8n8s4t",
     {"vendor": None, "model_name": "POWER7 (architected), altivec supported", "family": None, "model": None,
      "stepping": None, "flags": None, "source": "proc/cpuinfo"}),
])
def test_fsroot_identity_is_the_fixture_machines(hwloc_root, tarball: str, expected: dict[str, object]) -> None:  # type: ignore[no-untyped-def]
    assert topology_json("--fsroot", str(hwloc_root(tarball)))["cpu"] == expected


@pytest.mark.parametrize(("xml", "expected"), [
    ("hwloc-xml-gpu/nvidiaDGX2.xml",
     {"vendor": "GenuineIntel", "model_name": "Intel(R) Xeon(R) Platinum 8174 CPU @ 3.10GHz", "family": 6,
      "model": 85, "stepping": 4, "flags": None, "source": "hwloc-xml"}),
    ("hwloc-xml-gpu/power8gpudistances.xml",
     {"vendor": None, "model_name": "POWER8NVL, altivec supported", "family": None, "model": None,
      "stepping": None, "flags": None, "source": "hwloc-xml"}),
])
def test_hwloc_xml_identity_from_its_info_attributes(xml: str, expected: dict[str, object]) -> None:
    path = FIXTURES / xml
    if not path.is_file():
        pytest.skip(f"{path} not found")
    assert topology_json("--topology", str(path))["cpu"] == expected


def flags_tree(tmp_path: Path, cpuinfo: str) -> Path:
    root = write_tree(tmp_path / "root", uniform(1, 2))
    (root / "proc").mkdir(exist_ok=True)
    (root / "proc/cpuinfo").write_text(cpuinfo)
    return root


def test_binding_flags_are_picked_from_the_flags_line(tmp_path: Path) -> None:
    root = flags_tree(tmp_path, "processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 143\n"
                                "model name\t: Intel(R) Xeon(R) Platinum 8480+\nstepping\t: 8\n"
                                "flags\t\t: fpu sse2 avx2 avx512f avx512bw amx_bf16 amx_tile amx_int8 hybrid_cpu\n\n"
                                "processor\t: 1\nvendor_id\t: Other\n")
    data = topology_json("--fsroot", str(root))
    assert data["cpu"] == {"vendor": "GenuineIntel", "model_name": "Intel(R) Xeon(R) Platinum 8480+", "family": 6,
                           "model": 143, "stepping": 8, "source": "proc/cpuinfo",
                           "flags": ["hybrid_cpu", "avx512f", "amx_tile", "amx_bf16", "amx_int8"]}
    text = CliRunner().invoke(cli, ["topology", "--fsroot", str(root)]).stdout
    cpu_lines = [line for line in text.splitlines() if line.startswith("cpu ")]
    assert cpu_lines == ["cpu      GenuineIntel Intel(R) Xeon(R) Platinum 8480+ (family 6 model 143 stepping 8, "
                         "flags hybrid_cpu avx512f amx_tile amx_bf16 amx_int8); from proc/cpuinfo"]


@pytest.mark.parametrize("garbage", ["\x00\xff" * 50, "processor : 0\nvendor_id : \x1b[31mred\n", "no colons here\n",
                                     "model name: " + "x" * 100_000, "cpu family : ²\nmodel : 0x\n"])
def test_garbage_cpuinfo_is_a_warning_never_a_traceback(tmp_path: Path, garbage: str) -> None:
    root = flags_tree(tmp_path, garbage)
    topo = load_topology(fsroot=str(root), cpu_identity=True)
    if topo.cpu is None:
        assert any("proc/cpuinfo: no CPU identity" in w for w in topo.warnings), topo.warnings
    else:  # what was readable is kept, each value one printable line, clipped to 100 characters and "..."
        for value in (topo.cpu.vendor, topo.cpu.model_name):
            assert value is None or (value.isprintable() and len(value) <= 103)
    assert all("\n" not in w for w in topo.warnings)


def test_an_fsroot_without_cpuinfo_has_no_identity_and_no_warning(tmp_path: Path) -> None:
    root = flags_tree(tmp_path, "")
    os.unlink(root / "proc/cpuinfo")
    topo = load_topology(fsroot=str(root), cpu_identity=True)
    assert topo.cpu is None and not any("identity" in w for w in topo.warnings)


def test_identity_is_read_only_when_asked(hwloc_root) -> None:  # type: ignore[no-untyped-def]
    assert load_topology(fsroot=str(hwloc_root("16em64t-4s2c2t-offlines"))).cpu is None


def test_snapshot_round_trip_keeps_the_identity(hwloc_root, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    snap = tmp_path / "hybrid.json"
    saved = topology_json("--fsroot", str(hwloc_root("20em64t-hybrid-1p6c2t+2ca4co1t")), "--save", str(snap))
    assert topology_json("--topology", str(snap))["cpu"] == saved["cpu"]
    data = json.loads(snap.read_text())
    for bad in ("GenuineIntel", {"vendor": 5}, {"family": -1}, {"flags": ["sse2"]}, {"model_name": "a\nb"}):
        data["cpu"] = bad
        snap.write_text(json.dumps(data))
        result = CliRunner().invoke(cli, ["topology", "--topology", str(snap), "--json"], catch_exceptions=False)
        assert result.exit_code == 0, result.output
        out = json.loads(result.stdout)
        assert out["cpu"] is None and any(w.startswith("snapshot: cpu is not an object") for w in out["warnings"])


def test_doctor_reports_the_audited_machines_cpu(hwloc_root) -> None:  # type: ignore[no-untyped-def]
    root = str(hwloc_root("20em64t-hybrid-1p6c2t+2ca4co1t"))
    result = CliRunner().invoke(cli, ["doctor", "--fsroot", root, "--json"])
    cpu = json.loads(result.stdout)["cpu"]
    assert cpu["model_name"] == "13th Gen Intel(R) Core(TM) i7-1370P" and cpu["core_kinds"] == ["big core", "little core"]
    text = CliRunner().invoke(cli, ["doctor", "--fsroot", root]).stdout
    assert ("cpu: GenuineIntel 13th Gen Intel(R) Core(TM) i7-1370P (family 6 model 186 stepping 2, flags (none of "
            "hybrid_cpu, avx512f, amx_tile, amx_bf16, amx_int8)); core kinds big core, little core") in text.splitlines()


def test_parse_takes_the_first_processor_only() -> None:
    found = parse_cpuinfo("processor : 0\nvendor_id : A\nflags : avx512f\n\nprocessor : 1\nvendor_id : B\n")
    assert found is not None and found.vendor == "A" and found.flags == ("avx512f",)


def test_this_machine_has_an_identity_from_proc_cpuinfo() -> None:
    """Every Linux host has /proc/cpuinfo with at least a model name, a vendor or a part number."""
    cpu = topology_json()["cpu"]
    assert isinstance(cpu, dict) and cpu["source"] == "proc/cpuinfo"
    root = Path(os.environ.get("AFFRUN_FSROOT") or "/")  # the "live" machine: tests/conftest.py may fake it
    first = (root / "proc/cpuinfo").read_text().split("\n\n", 1)[0]
    fields = {k.strip().lower(): " ".join(v.split()) for k, _, v in (line.partition(":") for line in first.splitlines())}
    assert cpu["vendor"] == (fields.get("vendor_id") or fields.get("cpu implementer") or None)
    assert cpu["model_name"] == (fields.get("model name") or fields.get("cpu") or None)


def test_a_fifo_for_cpuinfo_is_a_warning_not_a_hang(tmp_path: Path) -> None:
    root = flags_tree(tmp_path, "")
    os.unlink(root / "proc/cpuinfo")
    os.mkfifo(root / "proc/cpuinfo")
    topo = load_topology(fsroot=str(root), cpu_identity=True)
    assert topo.cpu is None
    assert any(w.startswith("CPU identity not read: ") and "not a regular file" in w for w in topo.warnings)


def test_a_topology_file_wins_over_affrun_fsroot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """$AFFRUN_FSROOT is the default tree, not a second source: --topology given on the command line wins, on the
    click commands as on exec (click used to read the variable as --fsroot: 'two sources')."""
    snap = tmp_path / "snap.json"
    assert CliRunner().invoke(cli, ["topology", "--save", str(snap)]).exit_code == 0
    monkeypatch.setenv("AFFRUN_FSROOT", str(tmp_path / "elsewhere"))
    for command in (["topology"], ["plan", "--nproc-per-node", "1"], ["show", "--nproc-per-node", "1"]):
        result = CliRunner().invoke(cli, [*command, "--topology", str(snap)])
        assert result.exit_code == 0, result.output
