"""Priority cores (issue 33, part 3): found from sysfs without root on the four fake machines of
:data:`tests.fakesys.PRIORITY_MACHINES`, best first; none, with the reason, on a homogeneous server, on hostile
evidence (never an exception), and from hwloc XML where its cpukinds are not priority classes; kept by snapshots;
priority classes planned as one kind; every hwloc fixture machine still loads and plans by the same kinds."""

from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from launcher.cli import cli
from launcher.plan.kinds import plan_kinds
from launcher.plan.planner import make_plan
from launcher.plan.request import Request
from launcher.topology import load_topology
from launcher.topology.hwloc_xml import hwloc_xml_topology
from launcher.topology.model import Topology
from launcher.topology.priority import (
    XML_WHY,
    Evidence,
    PriorityCores,
    find_priority,
    priority_classes,
    priority_from_json,
)
from launcher.topology.snapshot import from_snapshot, to_snapshot
from tests.conftest import FIXTURES, extract_tarball, need
from tests.fakesys import (
    PRIORITY_MACHINES,
    CoreClock,
    FakeMachine,
    priority_machines,
    uniform,
    with_clocks,
    write_tree,
)
from tests.fuzz import FUZZ, MUTATIONS, bounded, mutate

CPU = "sys/devices/system/cpu"
PCT = (*range(0, 4), *range(24, 28), *range(48, 52), *range(72, 76))
SST = (1, 2, 5, 8, 13, 16, 19, 22)
SST = (*SST, *(c + 24 for c in SST))
# name -> (order, evidence, one_kind)
EXPECTED = {
    "xeon6-pct": ((*PCT, *(c + 96 for c in PCT)), "acpi_cppc/highest_perf 46 against 42; ITMT on", False),
    "xeon-sst-bf": ((*SST, *(c + 48 for c in SST)), "cpufreq/base_frequency 2800 MHz against 2100 MHz", True),
    "itmt-desktop": ((3, 6, 13, 16), "acpi_cppc/highest_perf 53/52 against 51; ITMT on", False),
    "homogeneous-server": ((), "", False),
}


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("priority")
    return {name: write_tree(base / name, m) for name, m in priority_machines().items()}


def load(root: Path, **kwargs: str) -> Topology:
    topo: Topology = bounded_load(lambda: load_topology(fsroot=str(root), environ={}, **kwargs))
    return topo


def bounded_load(fn):  # type: ignore[no-untyped-def]
    out = []
    bounded(lambda: out.append(fn()))
    return out[0]


def topology_text(*args: str) -> str:
    result = CliRunner().invoke(cli, ["topology", *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.stdout


def priority_line(text: str) -> str:
    (line,) = [ln for ln in text.splitlines() if ln.startswith("priority ")]
    return line


# ---------------------------------------------------------------------------------------------- the four machines
def test_the_four_machines_are_named() -> None:
    assert tuple(priority_machines()) == PRIORITY_MACHINES == tuple(EXPECTED)


@pytest.mark.parametrize("name", PRIORITY_MACHINES)
def test_each_machine_gives_its_priority_cpus_best_first(trees: dict[str, Path], name: str) -> None:
    order, source, one_kind = EXPECTED[name]
    topo = load(trees[name])
    prio = topo.priority_cores()
    assert prio.order == order and prio.cpus == frozenset(order)
    assert prio.source == source and prio.one_kind is one_kind
    assert bool(prio.why_none) is not bool(order)
    assert plan_kinds(topo) is None  # every one of them is planned as one kind
    assert not topo.warnings
    line = priority_line(topology_text("--fsroot", str(trees[name])))
    if order:
        assert line.startswith(f"priority cpus {','.join(map(str, order))} (best first); from {source}"), line


def test_the_homogeneous_server_says_why(trees: dict[str, Path]) -> None:
    line = priority_line(topology_text("--fsroot", str(trees["homogeneous-server"])))
    assert line == ("priority none: every core has acpi_cppc/highest_perf 255, cpufreq/cpuinfo_max_freq 3800 MHz and "
                    "cpufreq/base_frequency 2000 MHz")


def test_each_rank_of_the_pct_machine_finds_priority_cores_near_its_gpu(trees: dict[str, Path]) -> None:
    """What the planner builds on: every GPU's local CPUs hold priority cores of their own package."""
    topo = load(trees["xeon6-pct"])
    prio = topo.priority_cores()
    for gpu in topo.gpus:
        local = [c for c in prio.order if c in gpu.cpus]
        assert len({c % 96 for c in local}) == 8, (gpu.pci, local)


def test_sst_bf_keeps_hwlocs_two_kinds_in_view_and_plans_one(trees: dict[str, Path]) -> None:
    root = str(trees["xeon-sst-bf"])
    topo = load(trees["xeon-sst-bf"])
    assert [k.cpus for k in topo.kinds().kinds] == [frozenset(EXPECTED["xeon-sst-bf"][0]),
                                                    topo.online - frozenset(EXPECTED["xeon-sst-bf"][0])]
    text = topology_text("--fsroot", root)
    assert "kind b" in text and "kind l" in text
    assert priority_line(text).endswith("planned as one kind")
    data = json.loads(topology_text("--fsroot", root, "--json"))
    assert len(data["core_kinds"]) == 2 and data["priority_cores"]["one_kind"] is True
    # one rank per GPU, each with 12 of its node's 24 cores: all 12 compute (hwloc's kinds alone would give the
    # team the 4 high-priority cores and make the other 8 loader cores)
    plan = make_plan(topo, Request(nproc=4))
    assert [r.threads for r in plan.ranks] == [12, 12, 12, 12] and not any(r.loader_cpus for r in plan.ranks)


def test_narrowed_by_cpus(trees: dict[str, Path]) -> None:
    topo = load(trees["itmt-desktop"], cpus="0-5,10-15")
    assert topo.priority_cores().order == (3, 13)
    gone = load(trees["itmt-desktop"], cpus="0-2,10-12").priority_cores()
    assert not gone.cpus and gone.why_none.startswith("none of the priority CPUs is allowed here (acpi_cppc")


def test_json_key_and_snapshot_round_trip(trees: dict[str, Path]) -> None:
    for name, root in trees.items():
        topo = load(root)
        data = topo.to_json()["priority_cores"]
        assert set(data) == {"cpus", "order", "source", "why_none", "one_kind"}
        again = from_snapshot(json.loads(json.dumps(to_snapshot(topo))))
        assert again.priority == topo.priority and again.to_json() == topo.to_json(), name


@pytest.mark.parametrize("value", [
    "banana", [1, 2], {"cpus": [3], "order": [3, 3], "source": "x", "why_none": "", "one_kind": False},
    {"cpus": [3], "order": [3], "source": "x\nforged line", "why_none": "", "one_kind": False},
    {"cpus": [3], "order": [3], "source": "", "why_none": "", "one_kind": False},
    {"cpus": [99], "order": [99], "source": "x", "why_none": "", "one_kind": False},
    {"cpus": [10 ** 30], "order": [10 ** 30], "source": "x", "why_none": "", "one_kind": False},
    {"cpus": [-1], "order": [-1], "source": "x", "why_none": "", "one_kind": False},
    {"cpus": [3], "order": [3], "source": "x", "why_none": "", "one_kind": "yes"},
])
def test_a_snapshots_bad_priority_cores_are_none_with_a_reason(trees: dict[str, Path], value: object) -> None:
    data = to_snapshot(load(trees["itmt-desktop"]))
    data["priority_cores"] = value
    topo = from_snapshot(data)
    assert not topo.priority.cpus and "priority_cores:" in topo.priority.why_none
    assert "\n" not in topo.priority.why_none


def test_a_snapshot_without_the_key_says_so(trees: dict[str, Path]) -> None:
    data = to_snapshot(load(trees["itmt-desktop"]))
    del data["priority_cores"]
    assert "not in this snapshot" in from_snapshot(data).priority.why_none
    assert priority_from_json(None, frozenset({0})) == PriorityCores(why_none=from_snapshot(data).priority.why_none)


# ---------------------------------------------------------------------------------------------- hostile evidence
HOSTILE = {"missing": None, "garbage": "banana", "huge": str(10 ** 30), "negative": "-46", "zero": "0",
           "binary": "\x00\x01\xff", "fifo": "fifo", "loop": "loop"}


@pytest.mark.parametrize("case", HOSTILE)
@pytest.mark.parametrize("name", ["acpi_cppc/highest_perf", "cpufreq/cpuinfo_max_freq", "cpufreq/base_frequency"])
def test_hostile_evidence_gives_none_with_a_reason(tmp_path: Path, case: str, name: str) -> None:
    root = write_tree(tmp_path / "t", priority_machines()["itmt-desktop"])
    target = root / CPU / "cpu7" / name
    target.unlink()
    if case == "fifo":
        os.mkfifo(target)
    elif case == "loop":
        target.symlink_to(target.name)
    elif HOSTILE[case] is not None:
        target.write_bytes(str(HOSTILE[case]).encode("utf-8", "surrogateescape"))
    topo = load(root)
    prio = topo.priority_cores()
    assert not prio.cpus and prio.why_none and "\n" not in prio.why_none
    line = priority_line(topology_text("--fsroot", str(root)))
    assert line.startswith("priority none: ") and ("cpu7" in line or "7" in line), line


@FUZZ
@given(data=st.data())
def test_corrupted_clock_files(tmp_path_factory: pytest.TempPathFactory, data: st.DataObject) -> None:
    """Any mutation of any clock file (content, deletion, dangling link, loop, FIFO, /dev/zero) gives priority
    cores that are CPUs of the machine, or none with a one-line reason; never an exception, within the bound."""
    copy = write_tree(tmp_path_factory.mktemp("clocks") / "t", priority_machines()["itmt-desktop"])
    entries = sorted(p for p in priority_machines()["itmt-desktop"].files if "/cpu" in p or "itmt" in p)
    for _ in range(data.draw(st.integers(1, 3), label="mutations")):
        kind, value = data.draw(MUTATIONS, label="mutation")
        mutate(copy / data.draw(st.sampled_from(entries), label="entry"), kind, value)
    prio = load(copy).priority_cores()
    assert prio.cpus <= frozenset(range(20)) and (prio.cpus or (prio.why_none and "\n" not in prio.why_none))


def test_a_hostile_itmt_switch_is_ignored(tmp_path: Path) -> None:
    root = write_tree(tmp_path / "t", priority_machines()["itmt-desktop"])
    switch = root / "proc/sys/kernel/sched_itmt_enabled"
    switch.unlink()
    os.mkfifo(switch)
    assert load(root).priority_cores().source == "acpi_cppc/highest_perf 53/52 against 51"
    switch.unlink()
    switch.write_text("Y\n")  # what debugfs writes, in the sysctl's place: not a value the sysctl has
    assert load(root).priority_cores().source == "acpi_cppc/highest_perf 53/52 against 51"


def test_highest_perf_255_on_some_cpus_is_not_used(tmp_path: Path) -> None:
    root = write_tree(tmp_path / "t", priority_machines()["itmt-desktop"])
    for cpu in (3, 13):
        (root / CPU / f"cpu{cpu}/acpi_cppc/highest_perf").write_text("255\n")
    prio = load(root).priority_cores()
    assert prio.order == (3, 6, 13, 16)
    assert prio.source.startswith("cpufreq/cpuinfo_max_freq 5300 MHz/5200 MHz against 5100 MHz; acpi_cppc/highest_perf "
                                  "is 255 (no value) on CPUs 3,13: not used")


def test_amd_preferred_core_ranking_comes_first(tmp_path: Path) -> None:
    m = uniform(1, 8, threads=2)
    for ci, core in enumerate(m.cores):
        for pu in core:
            m.files[f"{CPU}/cpu{pu}/cpufreq/amd_pstate_prefcore_ranking"] = "236" if ci in (2, 5) else "206"
            m.files[f"{CPU}/cpu{pu}/acpi_cppc/highest_perf"] = "166"
            m.files[f"{CPU}/cpu{pu}/cpufreq/cpuinfo_max_freq"] = "5276318"
    m.files["proc/cpuinfo"] = "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 26\nmodel\t\t: 68\n"
    prio = load(write_tree(tmp_path / "t", m)).priority_cores()
    assert prio.order == (2, 5, 10, 13) and prio.source == "cpufreq/amd_pstate_prefcore_ranking 236 against 206"


def test_rankings_of_every_core_have_no_common_level(tmp_path: Path) -> None:
    m = uniform(1, 8)
    for ci, core in enumerate(m.cores):
        m.files[f"{CPU}/cpu{core[0]}/cpufreq/amd_pstate_prefcore_ranking"] = str(236 - 5 * ci)
    prio = load(write_tree(tmp_path / "t", m)).priority_cores()
    assert not prio.cpus and prio.why_none.startswith("cpufreq/amd_pstate_prefcore_ranking has no common level")


def test_pct_cores_10_percent_faster_with_one_base_frequency(tmp_path: Path) -> None:
    """hwloc cannot rank kinds that share a base frequency: affrun's kinds reader refuses them with a warning (one
    kind), and the priority cores are found as on the xeon6-pct machine."""
    m = uniform(2, 8, threads=2)

    def clock(ci: int) -> CoreClock:
        return CoreClock(46, 4_600_000, 2_300_000) if ci % 8 < 2 else CoreClock(38, 3_800_000, 2_300_000)

    topo = load(write_tree(tmp_path / "t", with_clocks(m, clock, ("Intel(R) Xeon(R) 6776P", 173, 1), "ht hwp")))
    assert not topo.kinds().kinds and any("cannot be ranked" in w for w in topo.warnings)
    assert topo.priority_cores().order == (0, 1, 8, 9, 16, 17, 24, 25) and plan_kinds(topo) is None


# ---------------------------------------------------------------------------------------------- the rules, pure
def test_find_priority_levels_groups_and_reasons() -> None:
    cores = [(0, 4), (1, 5), (2, 6), (3, 7)]
    one = [("", frozenset(range(8)))]

    def ev(*per_core: int) -> Evidence:
        return Evidence("perf", {p: v for core, v in zip(cores, per_core) for p in core})

    assert find_priority(cores, one, [ev(50, 52, 50, 50)], absent="-").order == (1, 5)
    below = find_priority(cores, one, [ev(50, 48, 50, 50)], absent="-")
    assert not below.cpus and "below the common level" in below.why_none
    half = find_priority(cores, one, [ev(52, 52, 50, 50)], absent="-")
    assert not half.cpus and "no common level" in half.why_none  # two of four is not a few
    # a core's value is its weakest PU's
    weak = Evidence("perf", {0: 50, 4: 50, 1: 52, 5: 50, 2: 50, 6: 50, 3: 50, 7: 50})
    assert not find_priority(cores, one, [weak], absent="-").cpus
    # within each kind: core 3 alone is above its kind's level
    kinds = [("P-core", frozenset({0, 4, 1, 5})), ("E-core", frozenset({2, 6, 3, 7}))]
    split = find_priority(cores, kinds, [ev(60, 60, 40, 42), ev(9, 9, 9, 9)], absent="-")
    assert split.cpus == frozenset()  # two E-cores: one above is half of them
    three = [(0,), (1,), (2,), (3,), (4,), (5,)]
    kinds3 = [("P-core", frozenset({0, 1})), ("E-core", frozenset({2, 3, 4, 5}))]
    found = find_priority(three, kinds3, [Evidence("perf", {0: 60, 1: 60, 2: 40, 3: 40, 4: 40, 5: 42})], absent="-")
    assert found.order == (5,) and found.source == "perf 42 against 40 (E-cores)"
    assert find_priority(cores, one, [Evidence("perf", {})], absent="nothing here").why_none == "nothing here"
    partial = find_priority(cores, one, [Evidence("perf", {0: 1, 4: 1})], absent="-")
    assert not partial.cpus and partial.why_none == "perf: no value for some of the CPUs"


def test_priority_classes_rule() -> None:
    fast, slow = frozenset(range(8)), frozenset(range(8, 32))
    sst = [(fast, {"FrequencyMaxMHz": "3600", "FrequencyBaseMHz": "2800"}),
           (slow, {"FrequencyMaxMHz": "3600", "FrequencyBaseMHz": "2100"})]
    assert priority_classes(sst, "GenuineIntel", ("avx512f",)) == "FrequencyBaseMHz alone differs (2800, 2100)"
    assert priority_classes(sst, "GenuineIntel", None)
    assert priority_classes(sst, "AuthenticAMD", None) is None  # Zen 5 + Zen 5c stay two kinds
    assert priority_classes(sst, None, None) is None  # no /proc/cpuinfo: not known to be Intel
    assert priority_classes(sst, "GenuineIntel", ("hybrid_cpu",)) is None
    assert priority_classes(sst[::-1], "GenuineIntel", None)  # the order of the kinds does not matter
    both = [(fast, {"FrequencyMaxMHz": "5000", "FrequencyBaseMHz": "1900"}),
            (slow, {"FrequencyMaxMHz": "3900", "FrequencyBaseMHz": "1400"})]
    assert priority_classes(both, "GenuineIntel", None) is None  # P- and E-cores (i7-1370P, Lakefield)
    typed = [(c, {**infos, "CoreType": t}) for (c, infos), t in zip(sst, ("IntelCore", "IntelAtom"))]
    assert priority_classes(typed, "GenuineIntel", None) is None
    same_type = [(c, {**infos, "CoreType": "IntelCore"}) for c, infos in sst]
    assert priority_classes(same_type, "GenuineIntel", None)
    halves = [(frozenset(range(16)), sst[0][1]), (frozenset(range(16, 32)), sst[1][1])]
    assert priority_classes(halves, "GenuineIntel", None) is None  # half the machine is not a few cores


# ---------------------------------------------------------------------------------------------- hwloc XML
def with_cpukinds(kinds: list[tuple[int, dict[str, str]]], vendor: str) -> bytes:
    """hwloc's 16em64t-4s2c2t-offlines export (PUs 0,1,3,4,6-12,15; core 0 is PUs 0 and 8) with ``kinds``
    (cpuset mask, infos) and the packages' CPUVendor."""
    path = FIXTURES / "hwloc-linux" / "16em64t-4s2c2t-offlines-xml.xml"
    need(path.is_file(), f"{path} not found (set AFFRUN_FIXTURES)")
    top = ET.fromstring(path.read_bytes())
    for package in top.iter("object"):
        if package.get("type") == "Package":
            ET.SubElement(package, "info", name="CPUVendor", value=vendor)
    for mask, infos in kinds:
        kind = ET.SubElement(top, "cpukind", cpuset=f"0x{mask:08x}")
        for k, v in infos.items():
            ET.SubElement(kind, "info", name=k, value=v)
    return ET.tostring(top)


def test_xml_priority_classes_give_priority_cores() -> None:
    high, low = {"FrequencyMaxMHz": "3600", "FrequencyBaseMHz": "2800"}, {"FrequencyMaxMHz": "3600", "FrequencyBaseMHz": "2100"}
    topo = hwloc_xml_topology(with_cpukinds([(0x101, high), (0xFEFE, low)], "GenuineIntel"), "sst.xml")
    prio = topo.priority_cores()
    assert prio.order == (0, 8) and prio.one_kind and prio.source == "cpukind FrequencyBaseMHz 2800 MHz against 2100 MHz"
    assert len(topo.kinds().kinds) == 2 and plan_kinds(topo) is None
    amd = hwloc_xml_topology(with_cpukinds([(0x101, high), (0xFEFE, low)], "AuthenticAMD"), "amd.xml")
    assert not amd.priority.cpus and amd.priority.why_none == XML_WHY and plan_kinds(amd) is not None
    typed = [(0x101, {**high, "CoreType": "IntelCore"}), (0xFEFE, {**low, "CoreType": "IntelAtom"})]
    assert hwloc_xml_topology(with_cpukinds(typed, "GenuineIntel"), "hybrid.xml").priority.why_none == XML_WHY
    bad = [(0x101, {**high, "FrequencyBaseMHz": "lots"}), (0xFEFE, low)]
    assert not hwloc_xml_topology(with_cpukinds(bad, "GenuineIntel"), "bad.xml").priority.cpus


def test_xml_without_cpukinds_says_why() -> None:
    path = FIXTURES / "hwloc-hybrid" / "Intel-RaptorLake-Corei7-1370P.xml"
    need(path.is_file(), f"{path} not found (set AFFRUN_FIXTURES)")
    topo = hwloc_xml_topology(path.read_bytes(), str(path))
    assert not topo.priority.cpus and topo.priority.why_none == XML_WHY
    assert priority_line(topology_text("--topology", str(path))) == f"priority none: {XML_WHY}"


# ---------------------------------------------------------------------------------------------- every fixture machine
def fixture_machines() -> list[Path]:
    return sorted([*FIXTURES.rglob("*.tar.bz2"), *FIXTURES.rglob("*.xml")]) if FIXTURES.is_dir() else []


@pytest.mark.parametrize("path", fixture_machines(), ids=lambda p: p.name)
def test_every_fixture_machine_loads_and_keeps_its_planning_kinds(path: Path, tmp_path: Path) -> None:
    """No hwloc machine's kinds are priority classes, so none plans differently; only the i7-1370P (Turbo Boost
    Max 3.0 favoured P-cores 4 and 8: CPPC highest_perf 67 against 64) has priority cores."""
    if path.suffix == ".xml":
        try:
            topo = bounded_load(lambda: load_topology(topology_file=str(path), environ={}))
        except Exception as exc:  # a fixture our readers refuse (the cpuset-disallowed export) is refused as before
            pytest.skip(f"refused: {exc}")
    else:
        top = extract_tarball(path, tmp_path)
        topo = load(top / "fsroot" if (top / "fsroot").is_dir() else top)
    prio = topo.priority_cores()
    assert isinstance(prio, PriorityCores) and prio.cpus <= topo.allowed and not prio.one_kind
    assert plan_kinds(topo) == (topo.kinds() if topo.kinds().hybrid else None)
    if path.name.startswith("20em64t-hybrid"):
        assert prio.order == (4, 8, 5, 9) and prio.source == "acpi_cppc/highest_perf 67 against 64 (big cores)"
    else:
        assert not prio.cpus and prio.why_none, path.name


def test_a_machine_without_evidence_says_so(tmp_path: Path) -> None:
    prio = load(write_tree(tmp_path / "t", FakeMachine(cores=[(0,), (1,)], node_of_core=[0, 0],
                                                       package_of_core=[0, 0]))).priority_cores()
    assert prio.why_none.startswith("no per-CPU performance evidence")


def test_doctor_judges_by_the_planners_kinds(trees: dict[str, Path]) -> None:
    """On the SST-BF machine a team over both classes is what the planner made: no core-kinds-mixed finding."""
    from launcher.doctor.gpu import GpuReport
    from launcher.doctor.job_checks import kind_findings
    from launcher.doctor.live import JobAudit, ProcessRecord, ThreadRecord, assign_roles

    topo = load(trees["xeon-sst-bf"])
    rank = ProcessRecord(10, 1, "python3", ["python3"], {"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"})
    for i, cpu in enumerate([0, 1, 2, 3]):  # 1 and 2 are high-priority cores, 0 and 3 not
        rank.threads[10 + i] = ThreadRecord(10 + i, "python3", topo.online, cpu, seen={cpu: 20}, samples=20,
                                            first_ticks=0, last_ticks=100)
    job = JobAudit(10, 1.0, 0.05, 20, [rank], GpuReport(False, "n/a"), topo.online)
    assign_roles(job)
    assert kind_findings(job, job.processes[0], topo) == []
    result = CliRunner().invoke(cli, ["doctor", "--fsroot", str(trees["xeon-sst-bf"])], env={"OMP_NUM_THREADS": "12"},
                                catch_exceptions=False)
    assert "core-kinds-mixed" not in result.output
