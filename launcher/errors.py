"""Typed errors. Every front end turns an :class:`AffrunError` into one line and a non-zero exit.

A message that names an option holds it as data, an :class:`Opt` (the option's key in
:mod:`launcher.options.table`), not as a flag written into the text: each front end spells it in its user's
vocabulary (:meth:`AffrunError.use_vocabulary`). The command line reads ``--loader-cores 9``, the submitit executor
``loader_cores=9``, a YAML site profile ``loader-cores: 9``. The front end that reports the error spells it
(:func:`launcher.options.table.spell_error` gives it the table's speller); an error no front end spelled names an
option by its key. A leaf: no imports at load time (``affrun exec`` imports it), and no affrun import at all.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: a rank imports this module (docs/design.md §11)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Literal

    # Who reads the message: the command line (flags), Python callers (keyword arguments: the submitit
    # executor), or a YAML site profile of affrun sbatch (its keys).
    Vocabulary = Literal["cli", "python", "profile"]
    # How a front end writes an option named in a message: launcher.options.table.spell.
    Speller = Callable[["Opt", Vocabulary], str]


class Opt:
    """An option named in a message, by its key (``dest``) in :mod:`launcher.options.table`, with the value it
    was given when the message quotes it (``quoted``: the command line and a profile show it as Python's
    ``repr``, as Python callers always see it)."""

    __slots__ = ("key", "quoted", "value")

    def __init__(self, key: str, value: object = None, quoted: bool = False) -> None:
        self.key = key
        self.value = value
        self.quoted = quoted

    def __repr__(self) -> str:
        return f"Opt({self.key!r}, {self.value!r}, quoted={self.quoted})"


class AffrunError(Exception):
    """Base class of every error affrun reports to the user as one line: text, and the options it names."""

    exit_code = 2

    def __init__(self, *parts: str | Opt) -> None:
        super().__init__(*parts)
        self.parts = parts
        self.vocabulary: dict[str, Vocabulary] = {}  # option key -> vocabulary; "" for every other option
        self.speller: Speller | None = None  # set by the front end that reports the error

    def use_vocabulary(self, vocabulary: Vocabulary, keys: frozenset[str] | set[str] | None = None) -> None:
        """Spell the options of this message (only those of ``keys``, when given) in ``vocabulary``. A front end
        calls it on an error on its way out, then re-raises it."""
        if keys is None:
            self.vocabulary = {"": vocabulary}
        else:
            self.vocabulary.update(dict.fromkeys(keys, vocabulary))

    def __str__(self) -> str:
        if all(isinstance(part, str) for part in self.parts):
            return "".join(self.parts)  # type: ignore[arg-type]
        spell = self.speller or _by_key
        default = self.vocabulary.get("", "cli")
        return "".join(
            part if isinstance(part, str) else spell(part, self.vocabulary.get(part.key, default))
            for part in self.parts
        )


def _by_key(option: Opt, vocabulary: Vocabulary) -> str:
    """An option no front end spelled: its key, and its value where the message quotes one."""
    return option.key if option.value is None else f"{option.key}={option.value!r}"


# An error line holds at most this many characters of message: what affrun echoes (a path, a value, a list of
# names) may come from hostile input of any length. The longest message affrun writes itself (a site profile's
# unknown key, with every valid key) is about 350.
LINE_LIMIT = 480


def one_line(text: str) -> str:
    """``text`` with only printable characters, for an error or a warning line: a newline, carriage return or tab
    becomes a space, any other character that is not printable (``\\v``, U+2028, an escape sequence a terminal
    would act on) a ``?``. A warning that echoes a path or a variable passes through it."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else " " if c in "\n\r\t" else "?" for c in text)


def error_line(exc: AffrunError) -> str:
    """The one line every front end prints for ``exc``: ``affrun: error: ...``, on one line and bounded (the
    middle of an overlong message is cut, keeping what was refused and why). Characters that are not printable
    become a space (newline, tab) or ``?`` (``\\v``, U+2028, an escape sequence a terminal would act on)."""
    text = one_line(str(exc))
    if len(text) > LINE_LIMIT:
        half = (LINE_LIMIT - 5) // 2
        text = f"{text[:half]} ... {text[-half:]}"
    return f"affrun: error: {text}"


class TopologyError(AffrunError):
    """The topology source (sysfs tree, snapshot, XML) is missing or unusable."""


class PlanError(AffrunError):
    """The request cannot be satisfied on this topology (too many ranks, bad GPU index...)."""


class RankCountMismatch(PlanError):
    """``--map`` or ``--gpus`` gives more or fewer entries than there are ranks: the data, for front ends that
    count ranks their own way (``affrun sbatch``: per node) to say so in their own words."""

    def __init__(self, key: Literal["cpu_map", "gpus"], given: int, ranks: int) -> None:
        unit = "CPU list(s)" if key == "cpu_map" else "GPU(s)"
        super().__init__(Opt(key), f" gives {given} {unit} for {ranks} ranks")
        self.key: Literal["cpu_map", "gpus"] = key
        self.given = given
        self.ranks = ranks

    def __reduce__(self) -> tuple[type[RankCountMismatch], tuple[str, int, int], dict[str, object]]:
        return type(self), (self.key, self.given, self.ranks), self.__dict__


class LaunchError(AffrunError):
    """Applying a plan or starting a process failed."""


class ConfigError(AffrunError):
    """A configuration file or option value is invalid."""
