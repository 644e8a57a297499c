"""A hostile training script for ``affrun tune``'s tests (tests/system/test_tune_hostile.py): a DataLoader loop
(items wait 5 ms) around the things a script may do to the processes and streams of its trial.

``--record DIR``: every process this script starts writes ``DIR/pid-PID`` (its start time from /proc, and what
it is), before it does anything else: the test's own list of what must be gone, kept apart from tune's.
``--daemon``: fork a child that stays in the rank's process group, ignores SIGTERM and sleeps.
``--escape``: double-fork out of the job: a child starts a session of its own, forks and exits; the grandchild
re-executes this file with an empty environment (no variable of the trial left in /proc/PID/environ), ignores
SIGTERM, SIGINT and SIGHUP, keeps the trial's stdout and stderr open, and sleeps. ``--hop``: the escaped process
forks a copy of itself and exits every 0.1 s, so that its pid never stays.
``--ignore-term``: the rank ignores SIGTERM; ``--escape-on-term``: at SIGTERM it escapes once more, and goes on.
``--setsid``: fork a child that calls setsid() (a session of its own, the environment kept) and sleeps.
``--spew MB``: print MB megabytes a second (stdout and stderr) while the loop runs; ``DIR/spewed`` says how many.
``--exit CODE --after S``: exit with CODE after S seconds of the loop (S = 0: before building any DataLoader).
``--no-loader``: never build a DataLoader: sleep. ``--stdin``: read stdin to its end first.
"""

import argparse
import os
import signal
import sys
import threading
import time


def start_time() -> str:
    with open("/proc/self/stat", encoding="ascii", errors="replace") as fh:
        return fh.read().rpartition(")")[2].split()[19]


def record(where: str | None, what: str) -> None:
    if where:
        with open(os.path.join(where, f"pid-{os.getpid()}"), "w") as fh:
            fh.write(f"{start_time()} {what}")


def escaper(where: str, hop: bool) -> None:
    """Run in an empty environment, in a session of its own: ignore the signals that stop a job, and stay."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    record(where, "escaped")
    while True:
        time.sleep(0.1 if hop else 3600)
        if hop:
            if os.fork():
                os._exit(0)
            record(where, "hopped")


def escape(where: str, hop: bool) -> None:
    """The classic double fork of a daemon, then an exec that leaves no variable of the trial behind."""
    pid = os.fork()
    if pid:
        os.waitpid(pid, 0)
        return
    try:
        os.setsid()
        if os.fork():
            os._exit(0)
        argv = [sys.executable, os.path.abspath(__file__), "--as-escaper", where, *(["--hop"] if hop else [])]
        os.execve(sys.executable, argv, {})
    finally:
        os._exit(1)


def sleeper(where: str | None, what: str, new_session: bool) -> None:
    if os.fork():
        return
    try:
        if new_session:
            os.setsid()
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        record(where, what)
        time.sleep(3600)
    finally:
        os._exit(0)


def spew(megabytes: float, where: str | None) -> None:
    line = b"spew " + b"x" * 1018 + b"\n"  # 1 KiB
    chunk = line * 64
    total = 0
    t0 = time.monotonic()
    while True:
        for fd in (1, 2):
            os.write(fd, chunk)
            total += len(chunk)
        if where:
            with open(os.path.join(where, "spewed"), "w") as fh:
                fh.write(str(total))
        ahead = total / (megabytes * 1e6) - (time.monotonic() - t0)
        if ahead > 0:
            time.sleep(ahead)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--record")
    p.add_argument("--as-escaper")
    p.add_argument("--hop", action="store_true")
    p.add_argument("--daemon", action="store_true")
    p.add_argument("--escape", action="store_true")
    p.add_argument("--ignore-term", action="store_true")
    p.add_argument("--escape-on-term", action="store_true")
    p.add_argument("--setsid", action="store_true")
    p.add_argument("--spew", type=float, default=0.0)
    p.add_argument("--exit", type=int)
    p.add_argument("--after", type=float, default=0.0)
    p.add_argument("--no-loader", action="store_true")
    p.add_argument("--stdin", action="store_true")
    args, _ = p.parse_known_args()
    if args.as_escaper:
        escaper(args.as_escaper, args.hop)
    where = args.record
    record(where, "rank")
    if args.stdin:
        sys.stdin.buffer.read()
    if args.daemon:
        sleeper(where, "daemon", new_session=False)
    if args.setsid:
        sleeper(where, "new session", new_session=True)
    if args.escape and where:
        escape(where, args.hop)
    if args.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if args.escape_on_term and where:
        signal.signal(signal.SIGTERM, lambda *_: escape(where, args.hop))
    if args.exit is not None and args.after == 0:
        sys.exit(args.exit)
    if args.spew:
        threading.Thread(target=spew, args=(args.spew, where), daemon=True).start()
    if args.no_loader:
        time.sleep(3600)
        return
    loop(args.exit, args.after)


def loop(code: int | None, after: float) -> None:
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Waits(Dataset):  # type: ignore[type-arg]
        def __len__(self) -> int:
            return 1 << 30

        def __getitem__(self, i: int) -> torch.Tensor:
            time.sleep(0.005)
            return torch.full((8,), float(i % 5))

    start = time.monotonic()
    for _ in DataLoader(Waits(), batch_size=None, num_workers=0):
        if code is not None and time.monotonic() - start >= after:
            print(f"tune_hostile: exiting {code} after {after:g} s of the loop", file=sys.stderr, flush=True)
            sys.exit(code)


if __name__ == "__main__":
    main()
