"""Whether a path given for a file affrun will write (``--feed-json``, ``affrun tune --save``/``--svg``) can be
written, checked before the work that produces it starts."""

from __future__ import annotations

import os


def unwritable(path: str) -> str | None:
    """Why ``path`` cannot be written as a file (``None`` when it can): empty, a directory, in a directory that
    does not exist or that this user may not write to."""
    if not path:
        return "is empty: give a file"
    full = os.path.abspath(path)
    where = os.path.dirname(full)
    if os.path.isdir(full):
        return "is a directory: give a file in an existing directory"
    if not os.path.isdir(where):
        return f"names a directory that does not exist ({where}): give a file in an existing directory"
    if not os.access(where, os.W_OK | os.X_OK):
        return f"its directory {where} is not writable"
    return None
