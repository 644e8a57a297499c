"""CPU list and CPU mask parsing: the kernel's formats, hwloc's, and the quirks of captured sysfs trees."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.base.cpulist import (
    MAX_CPU_ID,
    CpuIdTooLarge,
    format_cpulist,
    format_hexmask,
    parse_cpulist,
    parse_hexmask,
)
from tests.conftest import FIXTURES, need


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0-7", set(range(8))),
        ("0-3,8,10-11", {0, 1, 2, 3, 8, 10, 11}),
        ("0-15,88-103", set(range(16)) | set(range(88, 104))),
        ("5", {5}),
        (" 1 , 3 ", {1, 3}),
        ("0-3\n\0", {0, 1, 2, 3}),  # 128arm: every *_list file ends in "\n\0"
        ("\n", set()),  # an empty "offline" file
        ("", set()),
    ],
)
def test_parse_cpulist(text: str, expected: set[int]) -> None:
    assert parse_cpulist(text) == expected


@pytest.mark.parametrize("text", ["3-1", "-1", "a", "0-", "1-x", "0x3", "0-3:0", "0-3:2", "0-7:3/2", "5:1/2"])
def test_parse_cpulist_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_cpulist(text)


def test_cpu_ids_up_to_the_cap_are_accepted() -> None:
    assert MAX_CPU_ID >= 8191  # Linux's NR_CPUS is at most 8192
    assert parse_cpulist(f"0-{MAX_CPU_ID}") == frozenset(range(MAX_CPU_ID + 1))
    assert parse_hexmask(format_hexmask({0, MAX_CPU_ID})) == {0, MAX_CPU_ID}
    assert parse_hexmask(",".join(["00000000"] * 4096 + ["00000003"])) == {0, 1}  # wide zero words are fine


@pytest.mark.parametrize(
    "text", ["0-99999999", f"{MAX_CPU_ID + 1}", "0,99999999999999999999", "0-99999999:1/2", f"0-{1 << 40}:2/4"]
)
def test_cpu_ids_above_the_cap_are_refused_before_expanding(text: str) -> None:
    """A typo like 0-99999999 once built a set of 100 million ids (a hang, or out of memory)."""
    with pytest.raises(CpuIdTooLarge, match=rf"^cpu id \d+ is above {MAX_CPU_ID}, the largest affrun accepts$"):
        parse_cpulist(text)


@pytest.mark.parametrize("text", [format_hexmask({MAX_CPU_ID + 1}), "1" + ",00000000" * 100000, "0x" + "f" * 100000])
def test_hexmask_bits_above_the_cap_are_refused(text: str) -> None:
    with pytest.raises(CpuIdTooLarge, match=r"^cpu id \d+ is above"):
        parse_hexmask(text)


@pytest.mark.parametrize(
    ("cpus", "text"),
    [(set(), ""), ({0}, "0"), ({0, 1, 2, 3, 8}, "0-3,8"), ({1, 3, 5}, "1,3,5"), (set(range(64)) - {32}, "0-31,33-63")],
)
def test_format_cpulist(cpus: set[int], text: str) -> None:
    assert format_cpulist(cpus) == text


@settings(max_examples=60, deadline=None)
@given(st.frozensets(st.integers(min_value=0, max_value=4095), max_size=300))
def test_cpulist_round_trip(cpus: frozenset[int]) -> None:
    text = format_cpulist(cpus)
    assert parse_cpulist(text) == cpus
    assert format_cpulist(parse_cpulist(text)) == text  # the shortest form is a fixed point


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("00000033", {0, 1, 4, 5}),
        ("0000,00000033", {0, 1, 4, 5}),  # sysfs: 32-bit words, most significant first
        ("00000fff,ffffffff", set(range(44))),  # 48-bit kernel mask (48amd64: NR_CPUS=48)
        ("0xffffffff,0x00000fff", set(range(12)) | set(range(32, 64))),  # hwloc XML: same word order, 0x prefixes
        ("0x0000ffff,,,0x0", set(range(96, 112))),  # hwloc 1.x leaves zero words empty
        ("0x0", set()),
        ("00000001\n\0", {0}),
        ("", set()),
    ],
)
def test_parse_hexmask(text: str, expected: set[int]) -> None:
    assert parse_hexmask(text) == expected


@pytest.mark.parametrize("text", ["zz", "0x1g", "12,xyz"])
def test_parse_hexmask_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_hexmask(text)


@settings(max_examples=60, deadline=None)
@given(st.frozensets(st.integers(min_value=0, max_value=1023), max_size=200))
def test_hexmask_round_trip(cpus: frozenset[int]) -> None:
    assert parse_hexmask(format_hexmask(cpus)) == cpus


@settings(max_examples=60, deadline=None)
@given(st.frozensets(st.integers(min_value=0, max_value=511), max_size=100))
def test_hexmask_words_match_kernel_layout(cpus: frozenset[int]) -> None:
    """Write the mask the way the kernel does (comma-separated 32-bit words, most significant first)."""
    value = sum(1 << c for c in cpus)
    words = [(value >> (32 * i)) & 0xFFFFFFFF for i in range(16)]
    text = ",".join(f"{w:08x}" for w in reversed(words))
    assert parse_hexmask(text) == cpus


def test_mask_and_list_files_agree_in_real_trees(hwloc_root) -> None:  # type: ignore[no-untyped-def]
    """Every ``X`` / ``X_list`` pair the kernel wrote in the captured machines names the same CPUs."""
    need((FIXTURES / "hwloc-linux").is_dir(), "hwloc fixtures missing")
    pairs = 0
    for name in ("128arm-2pa2n8cluster4co", "48amd64-4pa2n6c-sparse", "memorysidecaches"):
        root: Path = hwloc_root(name)
        for list_file in sorted((root / "sys/devices/system/cpu").glob("cpu*/topology/*_list")):
            mask_file = list_file.with_name(list_file.name.removesuffix("_list"))
            if mask_file.is_file():
                assert parse_hexmask(mask_file.read_text()) == parse_cpulist(list_file.read_text()), list_file
                pairs += 1
        for cpulist in sorted((root / "sys/devices/system/node").glob("node*/cpulist")):
            assert parse_hexmask((cpulist.parent / "cpumap").read_text()) == parse_cpulist(cpulist.read_text())
            pairs += 1
    assert pairs > 1000


@pytest.mark.parametrize(
    ("text", "expected"),
    [("0-7:2/4", {0, 1, 4, 5}), ("0-1023:1/256", {0, 256, 512, 768}), ("8-15:3/8,20", {8, 9, 10, 20})],
)
def test_kernel_group_syntax(text: str, expected: set[int]) -> None:
    """The kernel's ``a-b:used/group`` form (isolcpus=, nohz_full= and friends) selects the first ``used`` of each group."""
    assert parse_cpulist(text) == expected
