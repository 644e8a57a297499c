"""A trial's output (its stdout and stderr together), kept as its last :data:`LIMIT` bytes only: a pipe read by a
thread, nothing on disk, memory bounded however fast the script prints. Tune shows one line of it (the last error
line of a failed trial), escaped."""

from __future__ import annotations

import os
import re
import select
import threading

from launcher.base.untrusted import clip, shown

LIMIT = 64 * 1024
_CHUNK = 64 * 1024


class Tail:
    """A pipe whose write end a trial's processes get (:attr:`fd`) and whose last bytes a thread keeps."""

    def __init__(self) -> None:
        self._read, self.fd = os.pipe()
        self._kept = bytearray()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._drain, name="affrun-tune-output", daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        while not self._done.is_set():
            ready, _, _ = select.select([self._read], [], [], 0.2)
            if not ready:
                continue
            chunk = os.read(self._read, _CHUNK)
            if not chunk:  # every writer is gone
                return
            self._kept += chunk
            if len(self._kept) > 2 * LIMIT:
                del self._kept[:-LIMIT]

    def started(self) -> None:
        """The trial has its copy of the write end: close tune's (idempotent)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def finish(self, wait: float = 1.0) -> bytes:
        """Stop reading (after what the trial's processes wrote before they were swept, up to ``wait`` seconds
        for a writer that survived) and return the last bytes."""
        self.started()
        self._thread.join(wait)
        self._done.set()
        self._thread.join()
        os.close(self._read)
        return bytes(self._kept[-LIMIT:])


# A Python exception's last line (``ValueError: ...``, ``KeyboardInterrupt``), and what torchrun's agent adds after
# a rank failed: its own ChildFailedError and the summary that ends in a link to its errors page.
_EXCEPTION = re.compile(r"[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)(:|$)")
_AGENT = ("ChildFailedError", "errors.html", "error_file:", "affrun: starting rank", "affrun: rank ")


def last_line(output: bytes) -> str:
    """The script's error in ``output``: its last exception line, else the last line that says an error, else the
    last line; one printable line of at most 200 characters. affrun's rank lines and torchrun's summary of a failed
    rank are left out (that summary's last line is a link, and it names no cause)."""
    lines = [ln.strip() for ln in output.decode(errors="replace").splitlines()
             if ln.strip() and not any(word in ln for word in _AGENT)]
    exceptions = [ln for ln in lines if _EXCEPTION.match(ln)]
    errors = [ln for ln in lines if "Error" in ln or "error" in ln]
    return clip(shown((exceptions or errors or lines or [""])[-1]), 200)
