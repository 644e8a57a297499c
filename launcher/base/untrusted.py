"""Reading untrusted text: ASCII-only integers and decimals (every duration on the command line), bounded JSON,
and bounded echoes of input in error messages.

Every parser of files, environment variables and option values goes through these, so that one rule holds
everywhere: ``str.isdigit`` and ``int`` accept ``'²'``, ``'١'``, ``'1_0'`` and ``' +3'``, which no kernel,
Slurm or CUDA writes; and an error message never repeats more than a few dozen characters of what it refuses
(a YAML alias bomb printed with ``repr`` expands to gigabytes). Standard library only: ``affrun exec`` imports it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

# The longest digit string read as a number. 2**64 has 20 digits; CPython refuses to convert more than 4,300.
MAX_DIGITS = 40
_ASCII_DIGITS = frozenset("0123456789")
_ASCII_HEX = frozenset("0123456789abcdefABCDEF")


def ascii_uint(text: str) -> int | None:
    """``text`` as a non-negative decimal integer if it is 1 to :data:`MAX_DIGITS` ASCII digits, else ``None``."""
    if not text or len(text) > MAX_DIGITS or not _ASCII_DIGITS.issuperset(text):
        return None
    return int(text)


def ascii_int(text: str) -> int | None:
    """Like :func:`ascii_uint`, with an optional leading ``-`` (sysfs writes ``-1`` for "unknown")."""
    if text.startswith("-"):
        value = ascii_uint(text[1:])
        return None if value is None else -value
    return ascii_uint(text)


def ascii_hex(text: str, max_digits: int = MAX_DIGITS) -> int | None:
    """``0x1f`` or ``1f`` as an integer (ASCII hex digits only, at most ``max_digits`` of them), else ``None``."""
    if text[:2].lower() == "0x":
        text = text[2:]
    if not text or len(text) > max_digits or not _ASCII_HEX.issuperset(text):
        return None
    return int(text, 16)


def ascii_decimal(text: str) -> float | None:
    """``text`` as a finite number if it is a plain decimal in ASCII: an optional sign, digits with at most one
    point (``5``, ``0.25``, ``.5``, ``2.``), an optional exponent (``1e-3``); else ``None``. ``float`` also reads
    ``nan``, ``inf``, ``1_0``, `` 5 `` and other scripts' digits (``'٥'``), which nobody types as a number."""
    if not text.isascii():
        return None
    head, mark, power = text.lower().partition("e")
    digits = power[1:] if power[:1] in ("+", "-") else power
    if mark and not (digits and _ASCII_DIGITS.issuperset(digits)):
        return None
    whole, _, fraction = (head[1:] if head[:1] in ("+", "-") else head).partition(".")
    if not (whole or fraction) or not _ASCII_DIGITS.issuperset(whole + fraction):
        return None
    value = float(text) + 0.0  # + 0.0: -0 reads as 0
    return value if value - value == 0.0 else None  # 1e999 reads as inf


def seconds(text: str, low: float = 0.0, *, inclusive: bool = False, high: float | None = None,
            error: type[Exception] = ValueError) -> float:
    """``text`` as a number of seconds over ``low`` (from ``low`` on with ``inclusive``) and at most ``high``: the
    one reader of every duration on affrun's command lines. Anything else raises ``error`` with the one wording,
    ``'nan' is not a number of seconds > 0`` (the caller puts the option's name before it)."""
    value = ascii_decimal(text)
    if value is not None and (value > low or (inclusive and value == low)) and (high is None or value <= high):
        return value
    bound = f"{'>=' if inclusive else '>'} {low:g}" if high is None else (
        f"from {low:g} to {high:g}" if inclusive else f"> {low:g} and at most {high:g}")
    raise error(f"{short(text)} is not a number of seconds {bound}")


def short(value: object, limit: int = 60) -> str:
    """A ``repr`` of ``value`` of at most about ``limit`` characters, for error messages.

    Containers are summarised without walking them (a YAML alias bomb is a small graph whose ``repr`` is huge).
    """
    if isinstance(value, (str, bytes)):
        text = repr(value[: limit + 1])
    elif isinstance(value, (bool, int, float)) or value is None:
        text = repr(value) if not isinstance(value, int) or value.bit_length() < 200 else "a huge integer"
    elif isinstance(value, dict):
        return f"a mapping of {len(value)} key(s)"
    elif isinstance(value, (list, tuple, set, frozenset)):
        return f"a list of {len(value)} item(s)"
    else:
        return f"a {type(value).__name__}"
    return text if len(text) <= limit else text[:limit] + "..."


def clip(text: str, limit: int = 80) -> str:
    """``text`` itself when short, else its first ``limit`` characters and ``...`` (for values echoed as typed)."""
    return text if len(text) <= limit else text[:limit] + "..."


class BadJSON(ValueError):
    """Text that is not JSON affrun accepts; the message is one short line."""


def _refuse_constant(name: str) -> Any:
    raise BadJSON(f"{name} is not a number affrun accepts")


def _finite_float(text: str) -> float:
    value = float(text)
    if value - value != 0.0:  # 1e999 reads as inf: refused, as the literal Infinity is, in the user's terms
        raise BadJSON(f"the number {clip(text, 40)} is out of range")
    return value


def load_json(text: str | bytes, *, finite: bool = False) -> Any:
    """Parse JSON as affrun writes it: no ``NaN``/``Infinity``; with ``finite``, no number too large for a float
    either (``1e999``: refused here, where the caller has no field to name; without it, the caller's range check
    names the field that holds ``inf``).
    Raises :class:`BadJSON` (one line) for anything else: nesting deeper than the recursion limit (the C decoder raises ``RecursionError``, cleanly) and integers
    over 4,300 digits (``ValueError``) included. Callers still check the range of every number they use."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            raise BadJSON("not UTF-8 text") from None
    import json  # json imports re and enum (about 7 ms): only a rank with AFFRUN_PLAN set reads JSON

    try:
        return json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float if finite else None)
    except BadJSON:
        raise
    except json.JSONDecodeError as exc:
        raise BadJSON(f"not valid JSON (line {exc.lineno}: {exc.msg})") from None
    except RecursionError:
        raise BadJSON("nested too deeply") from None
    except ValueError as exc:
        raise BadJSON(f"not valid JSON ({short(str(exc))})") from None


def unwritable(text: str, allow: str = "\t") -> str | None:
    """What in ``text`` a batch script line or a one-line value cannot hold, described (``a control character
    ('\\x85')``), or ``None``. One rule for every value affrun writes into a script or a line: no character of
    Unicode's categories Cc (C0 controls, DEL, C1 controls such as NEL ``\\x85`` and CSI ``\\x9b``), Zl (U+2028)
    or Zp (U+2029), but those of ``allow`` (a tab, by default); and no surrogate that UTF-8 cannot encode (YAML's
    ``"\\ud800"``; ``\\udc80``-``\\udcff`` are the bytes of a command-line word that was not UTF-8, written back
    as those bytes)."""
    if text.isprintable():
        return None  # the common case; every character below is non-printable
    for c in text:
        code = ord(c)
        if c in allow:
            continue
        if c in "\n\r":
            return f"{'a newline' if c == chr(10) else 'a carriage return'} ({c!r})"
        if code < 0x20 or 0x7F <= code < 0xA0 or code in (0x2028, 0x2029):
            return f"a control character ({c!r})"
        if 0xD800 <= code < 0xE000 and not 0xDC80 <= code <= 0xDCFF:
            return f"a lone surrogate ({c!r}), which is not text"
    return None


def printable_ascii(text: str) -> bool:
    """Whether ``text`` is printable ASCII only (a space to ``~``): the names programs give their threads from
    literals and numbers (NCCL's ``NCCL Progress 0``, torch's ``pt_autograd_0``), which a name that imitates one
    with a control character, a character that is not ASCII or a byte that is not UTF-8 is not."""
    return text.isascii() and text.isprintable()


def shown(text: str) -> str:
    """``text`` for one line of a text report: each character that is not printable written as ``repr`` writes it
    (``\\n``, ``\\r``, ``\\t``, ``\\x1b``, ``\\x85``, ``\\u200b``, ``\\u202e``, ``\\udcff``), so that an echoed value
    (an environment value, a command line, a process name) stays on its line and sends nothing to the terminal.
    Printable text, backslashes included, is left as it is: ``shown`` of a ``repr`` or of its own result changes
    nothing, so a report may pass every line through it once more. JSON reports keep the exact value instead."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def warning_line(text: str) -> str:
    """The one line of a warning: ``affrun: warning: TEXT``, as :func:`shown` writes it (a path, a user's value, a
    device's name in it stays on its line and sends nothing to the terminal)."""
    return shown(f"affrun: warning: {text}")


def note_line(text: str) -> str:
    """The one line of a note: ``affrun: note: TEXT``, as :func:`shown` writes it."""
    return shown(f"affrun: note: {text}")


def _shell_escape(c: str) -> str:
    if c in "\\'":
        return "\\" + c
    if c.isprintable():
        return c
    if c in "\n\r\t":
        return repr(c)[1:-1]
    if 0xDC80 <= ord(c) <= 0xDCFF:  # a byte of a word that was not UTF-8 (surrogateescape): that byte
        return f"\\x{ord(c) - 0xDC00:02x}"
    return "".join(f"\\x{b:02x}" for b in c.encode("utf-8", "surrogatepass"))


def shell_word(word: str) -> str:
    """``word`` quoted for a POSIX shell line (:func:`shlex.quote`); a word with a character that is not
    printable in bash's ``$'...'`` instead, its bytes escaped, so the line stays one line and pastes back exactly."""
    if word.isprintable():
        import shlex

        return shlex.quote(word)
    return "$'" + "".join(_shell_escape(c) for c in word) + "'"


def shell_join(words: Sequence[str]) -> str:
    """A command line for a report, each word as :func:`shell_word` quotes it."""
    return " ".join(shell_word(w) for w in words)
