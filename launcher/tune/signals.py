"""Ctrl-C, SIGTERM and SIGHUP while ``affrun tune`` runs trials and writes its files: noted, never raised.

A ``KeyboardInterrupt`` raised wherever the signal lands (between starting a trial and watching it, inside
``subprocess``, in the middle of a sweep or of a file) could leave a trial running or a file half written. Under
:func:`noted`, the signal only sets :attr:`Interrupts.signum`; the trial's watch, the rounds and the command look
at it where stopping is safe, stop the trial and sweep it, print the table and exit 128 + the signal. A signal
that was ignored when tune started (``nohup``, a background job of a shell script) stays ignored.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

STOPPING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Interrupts:
    """The first stopping signal received (0: none yet)."""

    def __init__(self) -> None:
        self.signum = 0

    def __call__(self) -> bool:
        return self.signum != 0

    def note(self, signum: int, frame: FrameType | None) -> None:
        if not self.signum:
            self.signum = signum


@contextmanager
def noted(exiting: bool = False) -> Iterator[Interrupts]:
    """Note the stopping signals instead of acting on them, for the ``with`` block (main thread only). After it,
    the handlers before are restored; with ``exiting`` (the process exits next) the signals are ignored instead,
    so that one more Ctrl-C while the interpreter shuts down (which puts back the default action of every signal
    with a Python handler) does not end tune by the signal rather than with its exit status."""
    caught = Interrupts()
    previous = {}
    try:
        for sig in STOPPING:
            if signal.getsignal(sig) is not signal.SIG_IGN:
                previous[sig] = signal.signal(sig, caught.note)
        yield caught
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, signal.SIG_IGN if exiting else handler)
