"""The ``affrun`` console script.

``affrun exec`` runs before every rank, so it is dispatched here without importing click or anything else
heavy (and ``affrun run``, whose options are exec's); every other command goes to the click group in :mod:`launcher.cli`.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] == "exec":
        from launcher.exec_cmd import main as exec_main

        sys.exit(exec_main(args[1:]))
    if args and args[0] == "run":  # argparse, like exec: the binding options come from the same table
        from launcher.run_cmd import main as run_main

        sys.exit(run_main(args[1:]))
    from launcher.cli import main as cli_main

    cli_main(args)


if __name__ == "__main__":
    main()
