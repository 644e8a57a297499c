"""Other launchers' own CPU binders (accelerate's, DeepSpeed's), found in an environment or on command lines. Pure.

``affrun doctor`` reports them as ``double-binding`` and ``affrun run`` warns before it starts them (docs/launchers.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

Tool = Literal["accelerate", "deepspeed"]
# accelerate's parse_flag_from_env reads the value with str_to_bool
TRUE_VALUES = ("1", "y", "yes", "t", "true", "on")
ACCELERATE_FLAGS = ("--enable_cpu_affinity", "--enable-cpu-affinity")
DEEPSPEED_FLAGS = ("--bind_cores_to_rank", "--bind-cores-to-rank")
TOOL_FLAGS: tuple[tuple[Tool, tuple[str, ...]], ...] = (("accelerate", ACCELERATE_FLAGS), ("deepspeed", DEEPSPEED_FLAGS))


@dataclass(frozen=True)
class OtherBinder:
    tool: Tool
    source: str  # where it was seen, for messages
    variable: str | None = None  # the environment variable that switches it on, when that is where it was seen

    @property
    def fix(self) -> str:
        if self.tool == "accelerate":
            return ("drop accelerate launch's --enable_cpu_affinity (unset ACCELERATE_CPU_AFFINITY) and let affrun "
                    "bind, or run accelerate without affrun")
        return "drop deepspeed's --bind_cores_to_rank and let affrun bind, or run deepspeed without affrun"


def _is_launcher(word: str, tool: Tool) -> bool:
    name = word.rsplit("/", 1)[-1]
    if tool == "accelerate":
        return name in ("accelerate", "accelerate-launch") or word.startswith("accelerate.commands")
    return name in ("deepspeed", "ds") or word.startswith("deepspeed.launcher")


def binders_in_command(argv: Sequence[str], where: str = "the command") -> list[OtherBinder]:
    """The binders an accelerate or DeepSpeed command line switches on (its flags before the script)."""
    out: list[OtherBinder] = []
    for tool, flags in TOOL_FLAGS:
        starts = [i for i, word in enumerate(argv) if _is_launcher(word, tool)]
        if not starts:
            continue
        for word in argv[starts[0] + 1 :]:
            if word.endswith(".py"):
                break  # the training script: what follows is its own arguments
            if word.split("=", 1)[0] in flags:
                out.append(OtherBinder(tool, f"{word} in {where}"))
                break
    return out


def binders_in_environment(environ: Mapping[str, str]) -> list[OtherBinder]:
    value = environ.get("ACCELERATE_CPU_AFFINITY", "")
    if value.strip().lower() in TRUE_VALUES:
        return [OtherBinder("accelerate", f"ACCELERATE_CPU_AFFINITY={value}", "ACCELERATE_CPU_AFFINITY")]
    return []


def other_binders(environ: Mapping[str, str], ancestors: Iterable[tuple[int, str]] = ()) -> tuple[OtherBinder, ...]:
    """accelerate's and DeepSpeed's binders in ``environ`` or in ``ancestors`` ((pid, command line) of the parent
    chain), one per tool."""
    found = binders_in_environment(environ)
    for pid, cmdline in ancestors:
        found += binders_in_command(cmdline.split(), f"the parent process {pid} ({cmdline[:120]})")
    seen: dict[str, OtherBinder] = {}
    for binder in found:
        seen.setdefault(binder.tool, binder)
    return tuple(seen.values())
