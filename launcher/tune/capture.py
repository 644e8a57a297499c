"""A trial's output, read from a pipe by a thread and kept as no more than the lines that can name its error,
each cut to its first :data:`HEAD` bytes (docs/tune.md, "One trial")."""

from __future__ import annotations

import os
import re
import select
import threading

from launcher.base.untrusted import clip, shown

HEAD = 4096  # the bytes kept of a line: its start names the exception (``ValueError: ...``)
_CHUNK = 64 * 1024

# A Python exception's last line; the lines of affrun and of torchrun's agent after a rank failed (never the blame).
_EXCEPTION = re.compile(r"[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)(:|$)")
_AGENT = ("ChildFailedError", "errors.html", "error_file:", "affrun: starting rank", "affrun: rank ",
          "torch/distributed/elastic/")
_EOL = re.compile(rb"[\r\n]")
_WORDS = (b"rror", b"Exception", b"Interrupt", b"Exit")  # what an exception or error line holds
# where an exception line may start in a block of lines (the C scan; each match is then read as _EXCEPTION)
_EXCEPTION_AT = re.compile(rb"(?:^|(?<=[\r\n]))[^\S\r\n]*[A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit)")


class Blame:
    """The candidate lines of an output fed in pieces, in bounded memory (a piece costs a few scans in C);
    :meth:`line` picks one."""

    def __init__(self) -> None:
        self._line = bytearray()  # the start of the line being read (at most HEAD bytes)
        self._exception = self._error = self._last = ""

    def feed(self, data: bytes) -> None:
        first = _EOL.search(data)
        if first is None:
            self._take(data)
            return
        self._take(data[:first.start()])
        self._end_line()
        end = max(data.rfind(b"\n"), data.rfind(b"\r"))
        self._scan(data[first.end():end])
        self._take(data[end + 1:])

    def _take(self, part: bytes) -> None:
        room = HEAD - len(self._line)
        if room > 0:
            self._line += part[:room]

    def _end_line(self) -> None:
        texts = _texts(bytes(self._line))
        self._line.clear()
        for text in texts:
            self._last = text
            if _EXCEPTION.match(text):
                self._exception = text
            if "Error" in text or "error" in text:
                self._error = text

    def _scan(self, block: bytes) -> None:
        """Complete lines: the last exception line, the last error line and the last line of ``block``."""
        if any(word in block for word in _WORDS):
            for match in reversed(list(_EXCEPTION_AT.finditer(block))):
                found = [t for t in _texts(_around(block, match.end())) if _EXCEPTION.match(t)]
                if found:
                    self._exception = found[-1]
                    break
            at = len(block)
            while (at := block.rfind(b"rror", 0, at)) >= 0:
                found = [t for t in _texts(_around(block, at)) if "Error" in t or "error" in t]
                if found:
                    self._error = found[-1]
                    break
        end = len(block)
        while rest := block[:end].rstrip():
            end = max(rest.rfind(b"\n"), rest.rfind(b"\r")) + 1
            found = _texts(rest[end:end + HEAD])
            if found:
                self._last = found[-1]
                return

    def line(self) -> str:
        """The script's error: its last exception line, else the last line that says an error, else the last
        line (affrun's and torchrun's agent's left out); one printable line of at most 200 characters."""
        self._end_line()
        return clip(shown(self._exception or self._error or self._last), 200)


def _around(block: bytes, at: int) -> bytes:
    """The line of ``block`` that holds byte ``at``: at most its first HEAD bytes."""
    start = max(block.rfind(b"\n", 0, at), block.rfind(b"\r", 0, at)) + 1
    stop = _EOL.search(block, at)
    return block[start:min(stop.start() if stop else len(block), start + HEAD)]


def _texts(raw: bytes) -> list[str]:
    """The lines of ``raw`` as Python splits them, stripped, but the empty ones and those of the agent."""
    texts = (t.strip() for t in raw.decode(errors="replace").splitlines())
    return [t for t in texts if t and not any(word in t for word in _AGENT)]


def last_line(output: bytes) -> str:
    """:meth:`Blame.line` of the whole of ``output``."""
    blame = Blame()
    blame.feed(output)
    return blame.line()


class Tail:
    """A pipe whose write end a trial's processes get (:attr:`fd`), which a thread reads into a :class:`Blame`."""

    def __init__(self) -> None:
        self._read, self.fd = os.pipe()
        self.blame = Blame()
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
            self.blame.feed(chunk)

    def started(self) -> None:
        """The trial has its copy of the write end: close tune's (idempotent)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def finish(self, wait: float = 1.0) -> str:
        """Stop reading (waiting up to ``wait`` seconds for a writer that survived the sweep) and return
        :meth:`Blame.line`."""
        self.started()
        self._thread.join(wait)
        self._done.set()
        self._thread.join()
        os.close(self._read)
        return self.blame.line()
