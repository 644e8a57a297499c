"""The ``affrun`` console script.

``affrun exec`` runs before every rank, so it is dispatched here without importing click or anything else
heavy (and ``affrun run``, whose options are exec's); every other command goes to the click group in :mod:`launcher.cli`.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] in ("exec", "run"):  # argparse, not click: run's options are exec's, from the same table
        if args[0] == "exec":
            from launcher.exec_cmd import main as command_main
        else:
            from launcher.run_cmd import main as command_main
        from launcher.errors import AffrunError, error_line

        try:
            status = command_main(args[1:])
            sys.stdout.flush()
        except AffrunError as exc:
            print(error_line(exc), file=sys.stderr)
            status = exc.exit_code
        except BrokenPipeError:
            _quiet_stdout()  # `affrun exec --dry-run ... | head`: the reader left; exit 1 as click does, no traceback
            status = 1
        sys.exit(status)
    from launcher.cli import main as cli_main

    cli_main(args)


def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's last flush at exit does not raise again (what the
    Python documentation advises for SIGPIPE)."""
    import os

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


if __name__ == "__main__":
    main()
