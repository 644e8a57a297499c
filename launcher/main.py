"""The ``affrun`` console script: runs the click group (:mod:`launcher.cli`), or ``affrun exec -- CMD`` without a
parser (:mod:`launcher.launch.rank`), and keeps the standard streams (docs/design.md §14, "The standard streams").
"""

from __future__ import annotations

import errno
import os
import sys

# What a write to a full or broken output fails with (a pipe whose reader left is EPIPE: BrokenPipeError).
_OUTPUT_ERRNOS = frozenset(getattr(errno, name, -1) for name in (
    "ENOSPC", "EDQUOT", "EFBIG", "EIO", "EBADF", "EAGAIN", "ENXIO", "ECONNRESET", "EINVAL"))


def main(argv: list[str] | None = None) -> None:
    """Run the command ``argv`` (default: ``sys.argv[1:]``) and exit with its status."""
    args = sys.argv[1:] if argv is None else argv
    _open_closed_streams()
    out = _Stream(sys.stdout, diagnostics=False)
    sys.stdout = out
    sys.stderr = _Stream(sys.stderr, diagnostics=True)
    status: str | int | None = 0
    try:
        try:
            if args[:2] == ["exec", "--"]:  # no option to read (every affrun torchrun worker): no parser loaded
                from launcher.launch.rank import unparsed

                status = unparsed(args[2:])
            else:
                from launcher.cli import cli

                cli.main(args=args, prog_name="affrun")
        except SystemExit as exc:
            status = exc.code
        out.flush()  # here, not in the interpreter's last flush, whose failure is a message and exit 120
        failed = out.failed  # argparse's --help swallows the error of its write
    except OSError as exc:
        if out.failed is None and (exc.errno not in _OUTPUT_ERRNOS or exc.filename is not None):
            raise  # not the output (sys.stdout.buffer, written directly, records nothing)
        failed = exc
    if failed is not None:
        if not isinstance(failed, BrokenPipeError):  # `... | head`: the reader left; exit 1 as click does, silently
            from launcher.base.errors import LaunchError, error_line

            print(error_line(LaunchError(f"cannot write the output (stdout): {failed.strerror or failed}")),
                  file=sys.stderr)
        _quiet_stdout()
        status = 1
    sys.exit(status)


def _open_closed_streams() -> None:
    """``/dev/null`` for a standard stream that was closed (``sys.stdout``/``sys.stderr`` is ``None``), on its own
    descriptor number and close-on-exec: the command affrun execs finds it closed again."""
    if sys.stdout is None:
        sys.stdout = open(os.devnull, "w", encoding="utf-8")
    if sys.stderr is None:
        sys.stderr = open(os.devnull, "w", encoding="utf-8")


class _Stream:
    """``sys.stdout`` or ``sys.stderr`` remembering the first error of a write (``failed``); on stderr
    (``diagnostics``) the error is then ignored. Every other attribute is the stream's own."""

    def __init__(self, stream: object, *, diagnostics: bool) -> None:
        self._stream = stream
        self._diagnostics = diagnostics
        self.failed: OSError | None = None

    def write(self, text: str) -> int:
        try:
            return int(self._stream.write(text))  # type: ignore[attr-defined]
        except OSError as exc:
            self._failed(exc)
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()  # type: ignore[attr-defined]
        except OSError as exc:
            self._failed(exc)

    def _failed(self, exc: OSError) -> None:
        if self.failed is None:
            self.failed = exc
        if not self._diagnostics:
            raise exc

    def __getattr__(self, name: str) -> object:
        return getattr(self._stream, name)


def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's last flush at exit does not raise again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    finally:
        os.close(devnull)


if __name__ == "__main__":
    main()
