"""Core kinds (issue 20, part 1): read from sysfs and hwloc XML as hwloc reads them, checked against hwloc's own
expected output for its hybrid test machines, read in place from the shared fixtures; favoured cores, trees whose
only evidence is cpufreq or cpu_capacity, and hostile kind data (a warning and no kinds, never an exception)."""

from __future__ import annotations

import json
import os
import random
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from launcher.base.cpulist import format_cpulist, parse_hexmask
from launcher.topology.kinds import (
    CoreKind,
    CoreKinds,
    KindRegistry,
    kinds_from_hwloc_xml,
    kinds_from_json,
    kinds_to_json,
)
from launcher.topology.kinds_sysfs import kinds_from_sysfs
from tests.conftest import FIXTURES, extract_tarball, link_tree, need

HYBRID = FIXTURES / "hwloc-hybrid"
LINUX = FIXTURES / "hwloc-linux"
CPU = "sys/devices/system/cpu"
RAPTOR = "20em64t-hybrid-1p6c2t+2ca4co1t"


# ---------------------------------------------------------------------------------------------- hwloc's expectations
def console_kinds(path: Path) -> list[tuple[frozenset[int], int, dict[str, str]]]:
    """``CPU kind #i efficiency E cpuset 0x...`` blocks of an ``lstopo -v`` console file, with their infos."""
    out: list[tuple[frozenset[int], int, dict[str, str]]] = []
    for line in path.read_text().splitlines():
        head = re.match(r"CPU kind #\d+ efficiency (-?\d+) cpuset (\S+)", line)
        if head:
            out.append((parse_hexmask(head.group(2)), int(head.group(1)), {}))
        elif out and line.startswith("  ") and " = " in line:
            name, value = line.strip().split(" = ", 1)
            out[-1][2][name] = value
        elif out and not line.startswith(" "):
            break
    return out


def xml_kinds(path: Path) -> list[tuple[frozenset[int], int, dict[str, str]]]:
    """hwloc exports its kinds ranked: the N-th ``<cpukind>`` has efficiency N."""
    root = ET.parse(path).getroot()
    return [(parse_hexmask(e.get("cpuset", "")), i, {c.get("name", ""): c.get("value", "") for c in e})
            for i, e in enumerate(root.findall("cpukind"))]


def as_expected(found: CoreKinds) -> list[tuple[frozenset[int], int, dict[str, str]]]:
    return sorted(((k.cpus, k.efficiency, dict(k.infos)) for k in found.kinds), key=lambda t: t[1])


def test_found_lists_fastest_first() -> None:
    found = kinds_from_hwloc_xml(ET.parse(HYBRID / "fakecpukinds.xml").getroot())
    assert [k.efficiency for k in found.kinds] == list(range(len(found.kinds) - 1, -1, -1))


@pytest.fixture(scope="module")
def tarball(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    need(FIXTURES.is_dir(), f"shared fixtures not found at {FIXTURES} (set AFFRUN_FIXTURES)")
    dest = tmp_path_factory.mktemp("kinds")

    def get(path: Path) -> Path:
        top = extract_tarball(path, dest)
        return top / "fsroot" if (top / "fsroot").is_dir() else top  # x86+linux tarballs: <name>/fsroot

    return get


@pytest.mark.parametrize("tar", [LINUX / f"{RAPTOR}.tar.bz2", HYBRID / "5intel64-hybrid-lakefield.tar.bz2"],
                         ids=lambda p: p.name.split(".")[0])
def test_sysfs_kinds_are_hwlocs(tarball, tar: Path) -> None:  # type: ignore[no-untyped-def]
    """Same CPUs and efficiencies as hwloc's console; every info we give is hwloc's, and what we lack is only the
    CoreType that the Lakefield test takes from its x86 (CPUID) backend, which no sysfs file holds."""
    expected = console_kinds(tar.with_name(tar.name.replace(".tar.bz2", ".console")))
    found = kinds_from_sysfs(str(tarball(tar)))
    assert found.warnings == ()
    assert len(expected) == 2 and found.hybrid
    assert [(c, e) for c, e, _ in as_expected(found)] == [(c, e) for c, e, _ in expected]
    for (_, _, ours), (_, _, theirs) in zip(as_expected(found), expected):
        assert ours.items() <= theirs.items()
        assert set(theirs) - set(ours) <= ({"CoreType"} if "x86" in tar.with_suffix("").with_suffix(".test").read_text()
                                           else set())


def test_turbo_boost_max_favoured_cores_stay_in_their_kind(tarball) -> None:  # type: ignore[no-untyped-def]
    """The i7-1370P's P-cores have two max frequencies (favoured cores, under 10% apart): one kind, at the lower."""
    root = tarball(LINUX / f"{RAPTOR}.tar.bz2")
    found = kinds_from_sysfs(str(root))
    fast = found.kinds[0]
    maxes = {int((root / CPU / f"cpu{c}/cpufreq/cpuinfo_max_freq").read_text()) for c in fast.cpus}
    assert len(maxes) == 2 and (max(maxes) - min(maxes)) * 10 < min(maxes)
    assert dict(fast.infos)["FrequencyMaxMHz"] == str(min(maxes) // 1000)


@pytest.mark.parametrize("target", ["nvidia-dgx-gb10.xml", "nvidia-dgx-gb10-nomidr.xml"])
def test_gb10_kinds_are_hwlocs(tarball, target: str) -> None:  # type: ignore[no-untyped-def]
    """DGX Spark: MIDR gives hwloc's two kinds (X925, A725); without MIDR, capacity and frequency give its five."""
    test = (LINUX / target).with_suffix(".test").read_text()
    found = kinds_from_sysfs(str(tarball(LINUX / "nvidia-dgx-gb10.tar.bz2")), use_midr="midr=0" not in test)
    assert found.warnings == ()
    assert as_expected(found) == xml_kinds(LINUX / target)
    if "midr=0" not in test:
        assert [k.name for k in found.kinds] == ["Cortex-X925", "Cortex-A725"]  # parts 0xd85, 0xd87
        from_xml = kinds_from_hwloc_xml(ET.parse(LINUX / target).getroot())  # names: CPUPart + Package CPUImplementer
        assert from_xml.kinds == tuple(CoreKind(k.cpus, k.efficiency, k.name, "hwloc-xml", k.infos) for k in found.kinds)


@pytest.mark.parametrize("path", [HYBRID / "fakecpukinds.xml", HYBRID / "Intel-RaptorLake-Corei7-1370P.xml",
                                  LINUX / "nvidia-dgx-gb10-nomidr.xml"], ids=lambda p: p.stem)
def test_xml_kinds_are_ranked_as_hwloc_exported_them(path: Path) -> None:
    found = kinds_from_hwloc_xml(ET.parse(path).getroot())
    assert found.warnings == ()
    assert as_expected(found) == xml_kinds(path)


def test_xml_with_three_kinds_names_each() -> None:
    found = kinds_from_hwloc_xml(ET.parse(HYBRID / "fakecpukinds.xml").getroot())
    types = {parse_hexmask(e.get("cpuset", "")): {c.get("name"): c.get("value") for c in e}["CoreType"]
             for e in ET.parse(HYBRID / "fakecpukinds.xml").getroot().findall("cpukind")}
    assert len(found.kinds) == 3
    assert [k.name for k in found.kinds] == [{"IntelCore": "P-core"}.get(types[k.cpus], types[k.cpus])
                                             for k in found.kinds]


@pytest.mark.parametrize("path", [HYBRID / "fakecpukinds.xml", HYBRID / "Intel-RaptorLake-Corei7-1370P.xml"],
                         ids=lambda p: p.stem)
def test_without_forced_efficiency_core_type_then_frequency_ranks_the_same(path: Path) -> None:
    """hwloc's second heuristic (Intel core type, then frequency) orders these kinds as their forced values do,
    whatever the order of the elements."""
    text = re.sub(r' forced_efficiency="[^"]*"', "", path.read_text())
    root = ET.fromstring(text)
    elements = root.findall("cpukind")
    for e in elements:
        root.remove(e)
    random.Random(1).shuffle(elements)
    root.extend(reversed(elements))
    assert as_expected(kinds_from_hwloc_xml(root)) == xml_kinds(path)


# ---------------------------------------------------------------------------------------------- trees written here
def tree(root: Path, files: dict[str, list[str | None]], pmu: dict[str, str] | None = None,
         cpuinfo: str | None = None) -> Path:
    """CPUs 0..N-1 with per-CPU ``files`` (``cpufreq/cpuinfo_max_freq``: one value per CPU, None: absent)."""
    n = len(next(iter(files.values())))
    (root / CPU).mkdir(parents=True)
    (root / CPU / "online").write_text(f"0-{n - 1}\n")
    for cpu in range(n):
        (root / CPU / f"cpu{cpu}").mkdir()
        for name, values in files.items():
            if values[cpu] is not None:
                (root / CPU / f"cpu{cpu}" / name).parent.mkdir(parents=True, exist_ok=True)
                (root / CPU / f"cpu{cpu}" / name).write_text(f"{values[cpu]}\n")
    for name, cpus in (pmu or {}).items():
        (root / "sys/devices" / name).mkdir(parents=True)
        (root / "sys/devices" / name / "cpus").write_text(cpus + "\n")
    if cpuinfo is not None:
        (root / "proc").mkdir()
        (root / "proc/cpuinfo").write_text(cpuinfo)
    return root


MAX = "cpufreq/cpuinfo_max_freq"
BASE = "cpufreq/base_frequency"


@pytest.mark.parametrize("base", [["2000000"] * 8, [None] * 8], ids=["with-base", "max-only"])
def test_homogeneous_cpu_with_favoured_cores_is_one_kind(tmp_path: Path, base: list[str | None]) -> None:
    maxes = ["4500000", "4200000", "4200000", "4500000", "4200000", "4200000", "4200000", "4200000"]  # 7% apart
    found = kinds_from_sysfs(str(tree(tmp_path, {MAX: list(maxes), BASE: base})))
    assert found.warnings == () and len(found.kinds) == 1
    assert found.kinds[0].cpus == frozenset(range(8))
    assert dict(found.kinds[0].infos)["FrequencyMaxMHz"] == str(min(map(int, maxes)) // 1000)


def test_max_frequencies_ten_percent_apart_are_two_kinds(tmp_path: Path) -> None:
    maxes = ["4700000"] * 2 + ["4200000"] * 6  # 11.9% apart: not favoured cores
    found = kinds_from_sysfs(str(tree(tmp_path, {MAX: list(maxes)})))
    assert [(sorted(k.cpus), dict(k.infos)["FrequencyMaxMHz"]) for k in found.kinds] == [
        ([0, 1], "4700"), ([2, 3, 4, 5, 6, 7], "4200")]


def test_one_base_frequency_and_two_max_frequencies_cannot_be_ranked(tmp_path: Path) -> None:
    """hwloc ranks by base frequency when every kind has one: equal bases leave the kinds unranked, and affrun
    keeps one kind rather than guess (favoured cores more than 10% faster are still not a kind to plan on)."""
    maxes = ["4700000"] * 2 + ["4200000"] * 6
    found = kinds_from_sysfs(str(tree(tmp_path, {MAX: list(maxes), BASE: ["2000000"] * 8})))
    assert found.kinds == () and len(found.warnings) == 1 and "cannot be ranked" in found.warnings[0]


def test_a_tree_whose_only_evidence_is_cpufreq_gives_kinds(tmp_path: Path) -> None:
    maxes = ["2000000", "3000000"] * 4  # big and LITTLE interleaved, no base frequency, capacity, PMU or MIDR
    found = kinds_from_sysfs(str(tree(tmp_path, {MAX: list(maxes)})))
    assert found.warnings == ()
    assert [(sorted(k.cpus), k.efficiency, k.name, k.source) for k in found.kinds] == [
        ([c for c in range(8) if maxes[c] == "3000000"], 1, "big core", "cpufreq"),
        ([c for c in range(8) if maxes[c] == "2000000"], 0, "little core", "cpufreq")]


def test_cpu_capacity_alone_ranks_arm_cores(tmp_path: Path) -> None:
    caps = ["1024"] * 2 + ["512"] * 4 + ["300"] * 2
    found = kinds_from_sysfs(str(tree(tmp_path, {"cpu_capacity": list(caps)})))
    assert [(sorted(k.cpus), dict(k.infos)["LinuxCapacity"]) for k in found.kinds] == [
        ([0, 1], "1024"), ([2, 3, 4, 5], "512"), ([6, 7], "300")]
    assert [k.name for k in found.kinds] == ["big core", "mid core", "little core"]


def test_pmu_core_types_and_frequencies_give_three_kinds(tmp_path: Path) -> None:
    """A Meteor Lake shape: cpu_core 0-3; cpu_atom 4-11 holds E-cores and slower LP E-cores (by frequency)."""
    maxes = ["4800000"] * 4 + ["3800000"] * 4 + ["2500000"] * 4
    bases = ["1400000"] * 4 + ["1000000"] * 4 + ["700000"] * 4
    found = kinds_from_sysfs(str(tree(tmp_path, {MAX: maxes, BASE: bases}, {"cpu_core": "0-3", "cpu_atom": "4-11"})))
    assert found.warnings == ()
    assert [(format_cpulist(k.cpus), k.efficiency, k.source) for k in found.kinds] == [
        ("0-3", 2, "cpufreq+pmu"), ("4-7", 1, "cpufreq+pmu"), ("8-11", 0, "cpufreq+pmu")]
    assert [dict(k.infos)["CoreType"] for k in found.kinds] == ["IntelCore", "IntelAtom", "IntelAtom"]
    assert [k.name for k in found.kinds] == ["P-core", "E-core (3800 MHz)", "E-core (2500 MHz)"]


def test_pmu_sets_alone_rank_by_core_type(tmp_path: Path) -> None:
    found = kinds_from_sysfs(str(tree(tmp_path, {"online": ["1"] * 6}, {"cpu_atom": "0-3", "cpu_core": "4-5"})))
    assert [(format_cpulist(k.cpus), k.name) for k in found.kinds] == [("4-5", "P-core"), ("0-3", "E-core")]


@pytest.mark.parametrize("family, kinds", [("25", 0), ("26", 2)])
def test_no_kinds_on_amd_before_zen5(tmp_path: Path, family: str, kinds: int) -> None:
    """hwloc ignores cpufreq on AMD families before 0x1a (26): prefcore max frequencies there are not kinds."""
    cpuinfo = f"processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: {family}\n\nprocessor\t: 1\n"
    found = kinds_from_sysfs(str(tree(tmp_path, {MAX: ["5000000"] * 2 + ["3300000"] * 2}, cpuinfo=cpuinfo)))
    assert len(found.kinds) == kinds and found.warnings == ()


def test_kinds_narrowed_to_allowed_cpus(tarball) -> None:  # type: ignore[no-untyped-def]
    found = kinds_from_sysfs(str(tarball(LINUX / "nvidia-dgx-gb10.tar.bz2")))
    little = min(found.kinds, key=lambda k: k.efficiency)
    only = found.restricted(little.cpus)
    assert [(k.cpus, k.efficiency, k.name) for k in only.kinds] == [(little.cpus, 0, little.name)]
    assert found.restricted(frozenset(range(20))) == found


# ---------------------------------------------------------------------------------------------- snapshot round trip
def test_json_round_trip_keeps_kinds(tarball) -> None:  # type: ignore[no-untyped-def]
    for found in (kinds_from_sysfs(str(tarball(LINUX / f"{RAPTOR}.tar.bz2"))),
                  kinds_from_sysfs(str(tarball(LINUX / "nvidia-dgx-gb10.tar.bz2")), use_midr=False),
                  kinds_from_hwloc_xml(ET.parse(HYBRID / "fakecpukinds.xml").getroot())):
        cpus = frozenset().union(*(k.cpus for k in found.kinds))
        assert kinds_from_json(json.loads(json.dumps(kinds_to_json(found))), cpus) == found


# ---------------------------------------------------------------------------------------------- hostile data
def hostile_tree(tarball, tmp_path: Path) -> Path:  # type: ignore[no-untyped-def]
    """A copy of the i7-1370P tree with hybrid PMU lists added (P-cores 0-11, E-cores 12-19): valid as it is."""
    root = tmp_path / "t"
    link_tree(tarball(LINUX / f"{RAPTOR}.tar.bz2"), root)  # put() unlinks
    tree_pmu = {"cpu_core": "0-11", "cpu_atom": "12-19"}
    for name, cpus in tree_pmu.items():
        (root / "sys/devices" / name).mkdir(parents=True)
        (root / "sys/devices" / name / "cpus").write_text(cpus + "\n")
    return root


def put(root: Path, rel: str, text: str | None) -> None:
    path = root / rel
    real = Path(os.path.realpath(path))
    real.unlink(missing_ok=True)  # through cpuN/cpufreq -> ../cpufreq/policyN: change the copy, not the fixture
    if text is not None:
        real.parent.mkdir(parents=True, exist_ok=True)
        real.write_text(text)


HOSTILE = {
    "pmu-names-missing-cpus": ([("sys/devices/cpu_core/cpus", "0-11,40\n")], "do not exist"),
    "pmu-names-huge-cpu": ([("sys/devices/cpu_atom/cpus", "12-19,99999999999\n")], "cpu_atom/cpus"),
    "overlapping-pmu-sets": ([("sys/devices/cpu_core/cpus", "0-12\n")], "overlapping"),
    "lowpower-overlaps": ([("sys/devices/cpu_lowpower/cpus", "18-19\n")], "overlapping"),
    "pmu-sets-miss-cpus": ([("sys/devices/cpu_atom/cpus", "12-17\n")], "in no kind"),
    "pmu-not-a-list": ([("sys/devices/cpu_core/cpus", "zz\n")], "not a cpu list"),
    "capacity-0": ([(f"{CPU}/cpu{c}/cpu_capacity", "1024\n") for c in range(20) if c != 3]
                   + [(f"{CPU}/cpu3/cpu_capacity", "0\n")], "cpu3/cpu_capacity"),
    "capacity-huge": ([(f"{CPU}/cpu{c}/cpu_capacity", f"{10**30}\n") for c in range(20)], "cpu_capacity"),
    "max-freq-0": ([(f"{CPU}/cpu5/{MAX}", "0\n")], "cpu5/cpufreq/cpuinfo_max_freq"),
    "max-freq-beyond-10-THz": ([(f"{CPU}/cpu13/{MAX}", "20000000000\n")], "cpu13/cpufreq/cpuinfo_max_freq"),
    "base-freq-negative": ([(f"{CPU}/cpu0/{BASE}", "-1900000\n")], "base_frequency"),
    "base-freq-not-a-number": ([(f"{CPU}/cpu7/{BASE}", "fast\n")], "expected an integer"),
    "max-freq-on-some-cpus": ([(f"{CPU}/cpu9/{MAX}", None)], "exists for 19 of the 20"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_sysfs_kinds_are_a_warning_and_no_kinds(tarball, tmp_path: Path, case: str) -> None:  # type: ignore[no-untyped-def]
    root = hostile_tree(tarball, tmp_path)
    assert len(kinds_from_sysfs(str(root)).kinds) == 2  # the uncorrupted copy is hybrid
    edits, needle = HOSTILE[case]
    for rel, text in edits:
        put(root, rel, text)
    found = kinds_from_sysfs(str(root))
    assert found.kinds == ()
    assert len(found.warnings) == 1 and needle in found.warnings[0] and len(found.warnings[0]) < 400
    assert found.warnings[0].isprintable()


def test_a_fifo_for_a_pmu_list_is_refused_without_blocking(tarball, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    root = hostile_tree(tarball, tmp_path)
    put(root, "sys/devices/cpu_core/cpus", None)
    os.mkfifo(root / "sys/devices/cpu_core/cpus")
    found = kinds_from_sysfs(str(root))
    assert found.kinds == () and "not a regular file" in found.warnings[0]


XML_HOSTILE = {
    "overlapping": (('<cpukind cpuset="0x00000003"', '<cpukind cpuset="0x00000007"'), "overlapping"),
    "names-missing-cpus": (('<cpukind cpuset="0x00000008"', '<cpukind cpuset="0x00000108"'), "does not have"),
    "freq-0": (('value="1000"', 'value="0"'), "not a frequency"),
    "freq-beyond-10-THz": (('value="2000"', 'value="10000001"'), "not a frequency"),
    "forced-not-int": (('forced_efficiency="7"', 'forced_efficiency="seven"'), "not an integer"),
    "unknown-child": (('<info name="Features"', '<bogus name="Features"'), "unexpected <bogus>"),
    "not-a-bitmap": (('<cpukind cpuset="0x00000004"', '<cpukind cpuset="0xzz"'), "not a bitmap"),
    "misses-cpus": (('<cpukind cpuset="0x00000003"', '<cpukind cpuset="0x00000001"'), "in no kind"),
    "same-forced-no-info": (('forced_efficiency="0"', 'forced_efficiency="7"'), None),
}


@pytest.mark.parametrize("case", sorted(XML_HOSTILE))
def test_hostile_xml_kinds_are_a_warning_and_no_kinds(case: str) -> None:
    (old, new), needle = XML_HOSTILE[case]
    text = (HYBRID / "fakecpukinds.xml").read_text()
    assert old in text
    found = kinds_from_hwloc_xml(ET.fromstring(text.replace(old, new, 1)))
    if needle is None:  # two forced 7s: hwloc falls back on core type + frequency, which still ranks them
        assert len(found.kinds) == 3 and found.warnings == ()
        return
    assert found.kinds == () and len(found.warnings) == 1 and needle in found.warnings[0]


def test_xml_kinds_that_cannot_be_ranked_are_a_warning() -> None:
    """Same forced efficiency, no core type, same frequency: hwloc leaves them unranked; affrun will not guess."""
    text = (HYBRID / "fakecpukinds.xml").read_text().replace('forced_efficiency="7"', 'forced_efficiency="0"')
    text = text.replace('"MySmallCore"', '"A"').replace('"YouBigcore"', '"B"').replace('value="1000"', 'value="2000"')
    found = kinds_from_hwloc_xml(ET.fromstring(text))
    assert found.kinds == () and "cannot be ranked" in found.warnings[0]


@pytest.mark.parametrize("edit, needle", [
    (lambda d: d[0].update(efficiency=0), "efficiency must be"),
    (lambda d: d[1]["cpus"].append(d[0]["cpus"][0]), "overlapping"),
    (lambda d: d[0]["cpus"].append(64), "not online"),
    (lambda d: d[0].update(cpus="0-11"), "cpus must be"),
    (lambda d: d[0]["infos"].update(FrequencyMaxMHz="0"), "not a frequency"),
    (lambda d: d[0].update(name="P\x1b[31m"), "printable"),
    (lambda d: d.pop(0), "in no kind"),
])
def test_hostile_snapshot_kinds_are_a_warning_and_no_kinds(tarball, edit, needle: str) -> None:  # type: ignore[no-untyped-def]
    found = kinds_from_sysfs(str(tarball(LINUX / f"{RAPTOR}.tar.bz2")))
    data = kinds_to_json(found)
    edit(data)
    back = kinds_from_json(data, frozenset(range(20)))
    assert back.kinds == () and len(back.warnings) == 1 and needle in back.warnings[0]


# ---------------------------------------------------------------------------------------------- the splitting rule
@given(st.lists(st.tuples(st.frozensets(st.integers(0, 15), min_size=1), st.integers(0, 3)), min_size=1, max_size=6))
def test_registrations_split_into_a_partition_carrying_every_info(regs: list[tuple[frozenset[int], int]]) -> None:
    """hwloc's register: the kinds partition the CPUs registered, and each CPU's kind holds the info of every
    registration naming it, in registration order."""
    registry = KindRegistry()
    for i, (cpus, _) in enumerate(regs):
        registry.register(cpus, None, [("Step", str(i))], "test")
    kinds = registry._kinds
    union = frozenset().union(*(c for c, _ in regs))
    assert sorted(c for k in kinds for c in k.cpus) == sorted(union)
    for kind in kinds:
        for cpu in kind.cpus:
            assert kind.infos == [("Step", str(i)) for i, (cpus, _) in enumerate(regs) if cpu in cpus]


@pytest.mark.parametrize("cpu, midr, needle", [(7, "0x0\n", "outside"), (7, None, "exists for 19 of the 20"),
                                               (3, "0xnope\n", "expected an integer")])
def test_hostile_midr_is_a_warning_and_no_kinds(tarball, tmp_path: Path, cpu: int, midr: str | None,  # type: ignore[no-untyped-def]
                                                needle: str) -> None:
    root = tmp_path / "gb10"
    link_tree(tarball(LINUX / "nvidia-dgx-gb10.tar.bz2") / "sys", root / "sys")
    assert len(kinds_from_sysfs(str(root)).kinds) == 2
    put(root, f"{CPU}/cpu{cpu}/regs/identification/midr_el1", midr)
    found = kinds_from_sysfs(str(root))
    assert found.kinds == () and len(found.warnings) == 1 and needle in found.warnings[0]
