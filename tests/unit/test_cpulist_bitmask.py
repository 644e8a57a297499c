"""``parse_cpulist`` reads a list as a bit mask, so that a value naming every CPU thousands of times (an
environment value of a hostile process that ``affrun doctor --pid`` reads) costs one operation per part; the sets
it gives are those of the kernel's rules, as a plain expansion computes them. A mask's ids are taken run by run of
set bits, not bit by bit up to the highest."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.base.cpulist import mask_ids, parse_cpulist, parse_hexmask


def _expanded(text: str) -> frozenset[int]:
    """The kernel's rules, one CPU at a time (bitmap_parselist: ``lo-hi:used/group``)."""
    out: set[int] = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        span, _, groups = part.partition(":")
        lo_text, _, hi_text = span.partition("-")
        lo, hi = int(lo_text), int(hi_text or lo_text)
        used, group = (map(int, groups.split("/")) if groups else (1, 1))
        out.update(c for c in range(lo, hi + 1) if (c - lo) % group < used)
    return frozenset(out)


@st.composite
def parts(draw: st.DrawFn) -> str:
    lo = draw(st.integers(0, 300))
    kind = draw(st.sampled_from(["one", "range", "group"]))
    if kind == "one":
        return str(lo)
    hi = draw(st.integers(lo, 330))
    if kind == "range":
        return f"{lo}-{hi}"
    group = draw(st.integers(1, 40))
    return f"{lo}-{hi}:{draw(st.integers(1, group))}/{group}"


@settings(max_examples=400, deadline=None)
@given(st.lists(parts(), max_size=8))
def test_the_mask_is_the_kernel_s_set(chosen: list[str]) -> None:
    text = ",".join(chosen)
    assert parse_cpulist(text) == _expanded(text)


def test_a_list_that_names_every_cpu_thousands_of_times_is_every_cpu_once() -> None:
    assert parse_cpulist("0-65535," * 8000) == frozenset(range(65536))
    assert parse_cpulist(",".join(f"{i}-65535:1/2" for i in range(2000))) == frozenset(range(65536))


@settings(max_examples=300, deadline=None)
@given(st.integers(0, (1 << 2048) - 1)
       | st.sets(st.integers(0, 65535), max_size=40).map(lambda ids: sum(1 << c for c in ids)))
def test_a_mask_s_ids_are_its_set_bits_runs_and_single_bits_alike(mask: int) -> None:
    """The set bits are taken run by run (``mask_ids``): every bit of a run, none between runs, the top one too."""
    expected = frozenset(i for i, bit in enumerate(reversed(f"{mask:b}")) if bit == "1")  # bit by bit, as text
    assert mask_ids(mask) == expected
    count = max(1, -(-mask.bit_length() // 32))
    words = ",".join(f"{mask >> (32 * i) & 0xFFFFFFFF:08x}" for i in reversed(range(count)))  # sysfs's spelling
    assert parse_hexmask(words) == expected
