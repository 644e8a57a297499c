"""Typed errors, and the one ``affrun: error:`` line every front end prints for them. A message names an option as
data (:class:`Opt`), which the front end that reports it spells in its user's vocabulary (docs/design.md §14).
A leaf: no affrun import. Its public face is :mod:`launcher.errors`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Literal

    Vocabulary = Literal["cli", "python", "profile"]  # who reads the message: flags, keywords, profile keys
    Speller = Callable[["Opt", Vocabulary], str]  # how a front end writes an option: launcher.options.table.spell


class Opt:
    """An option named in a message, by its key (``dest``) in :mod:`launcher.options.table`, with its value when
    the message quotes it (``quoted``: shown as Python's ``repr`` in every vocabulary)."""

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


LINE_LIMIT = 480  # characters of message in an error line (affrun's own longest is about 350)


def one_line(text: str) -> str:
    """``text`` with only printable characters, for an error or a warning line: a newline, carriage return or tab
    becomes a space, any other character that is not printable (``\\v``, U+2028, an escape sequence a terminal
    would act on) a ``?``. A warning that echoes a path or a variable passes through it."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else " " if c in "\n\r\t" else "?" for c in text)


def error_line(exc: AffrunError) -> str:
    """The one line every front end prints for ``exc``: ``affrun: error: ...``, :func:`one_line` and bounded (the
    middle of an overlong message is cut, keeping what was refused and why)."""
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


# The name users know them by, in tracebacks, reprs and pickles (submitit sends a task's error back pickled):
# launcher.errors, their public face, which gives these same classes.
for _error in (Opt, AffrunError, TopologyError, PlanError, RankCountMismatch, LaunchError, ConfigError):
    _error.__module__ = "launcher.errors"
