"""A local Ray instance dies with the process that started it, however that process dies.

Ray's own fate sharing (``PR_SET_PDEATHSIG`` on the processes ``ray.init`` starts) kills
the GCS and the raylet when the driver dies, but not what the raylet started: after a
``kill -9`` of an ``asyncsim real`` driver, Ray 2.60's ``ray::DashboardAgent`` and
``ray::RuntimeEnvAgent`` stay (the latter's log ends with "Raylet is dead! Exiting Runtime
Env Agent"), even after a SIGTERM (measured here; docs/real.md, "Ray's processes").

So :func:`guard` starts this file as a tiny separate process before ``ray.init``. It holds
the read end of a pipe whose write end only the driver holds, and blocks reading it (no
polling, no CPU). When the driver exits or is killed, the kernel closes the write end; the
read returns EOF and the watchdog ends every process of that Ray session, found by two
marks (either suffices):

* an open file in the session's directory (``/tmp/ray/session_…``; the driver writes its
  path into the pipe once ``ray.init`` returns): every process of a Ray session writes its
  logs there, the agents and workers through their stdout/stderr; only processes running
  the driver's Python or one of Ray's own programs count (a ``tail -f`` of a log does not);
* ``ASYNCSIM_RAY_SESSION=<token>`` in its environment: the driver sets it while ``ray.init``
  starts the GCS and the raylet, and what they start inherits it. Not enough alone: Ray's
  agents overwrite their environment block with their process title (``setproctitle``),
  and command lines cannot tell sessions apart either (``ray::LearnerImpl``).

Processes of a cluster joined with ``--address`` carry neither mark: they are never touched.
The watchdog runs with ``python -I -S`` and imports only the standard library (it starts in
milliseconds; it must not import asyncsim, Ray or JAX).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

MARKER = "ASYNCSIM_RAY_SESSION"


# ----------------------------------------------------------------------------- the watchdog
def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:  # gone, a zombie, another user's
        return b""


def _holds_file_in(pid: int, folder: str) -> bool:
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(folder):
                return True
        except OSError:
            pass
    return False


def session_pids(token: str, session_dir: str | None = None, programs: tuple[str, ...] = (),
                 *, exclude: tuple[int, ...] = ()) -> list[int]:
    """The live processes of a Ray session (Linux): ``MARKER=token`` in the environment, or
    a file open in ``session_dir`` while running one of ``programs`` (paths or folders)."""

    needle = f"{MARKER}={token}".encode()
    folder = session_dir.rstrip("/") + "/" if session_dir else None
    out = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return out
    for e in entries:
        if not e.isdigit() or int(e) in exclude:
            continue
        pid = int(e)
        if needle in _read(f"/proc/{pid}/environ").split(b"\0"):
            out.append(pid)
        elif folder is not None and _holds_file_in(pid, folder):
            try:
                exe = os.readlink(f"/proc/{pid}/exe")
            except OSError:
                continue
            if any(exe == p or exe.startswith(p.rstrip("/") + "/") for p in programs):
                out.append(pid)
    return out


def _alive(pid: int) -> bool:
    stat = _read(f"/proc/{pid}/stat")
    try:
        state = stat.rsplit(b")", 1)[1].split()[0]
    except IndexError:
        return False
    return state not in (b"Z", b"X")  # a zombie is dead, only not yet reaped


def reap(token: str, session_dir: str | None = None, programs: tuple[str, ...] = (), *,
         grace: float = 1.0, exclude: tuple[int, ...] = ()) -> dict[int, str]:
    """SIGTERM the session's processes, SIGKILL what is left after ``grace`` seconds;
    again until none is left (a dying raylet may have started one more). Returns the
    processes signalled (pid: name)."""

    exclude = (*exclude, os.getpid())
    signalled: dict[int, str] = {}
    for rnd in range(6):
        pids = session_pids(token, session_dir, programs, exclude=exclude)
        if not pids:
            break
        sig = signal.SIGTERM if rnd == 0 else signal.SIGKILL
        for p in pids:
            name = _read(f"/proc/{p}/comm").decode(errors="replace").strip()
            try:
                os.kill(p, sig)
                signalled.setdefault(p, name)
            except OSError:
                pass
        deadline = time.monotonic() + (grace if rnd == 0 else 2.0)
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)  # only while ending the session: bounded
    return signalled


def main(argv: list[str]) -> int:
    """``watchdog.py TOKEN DRIVER_PID PROGRAM...``; stdin: the pipe (``session DIR`` lines)."""

    token, driver, programs = argv[1], int(argv[2]), tuple(argv[3:])
    # A Ctrl-C or a hang-up of the driver's terminal must not stop the watchdog before the
    # driver: it has its own session (no terminal) and ignores both anyway.
    for s in (signal.SIGINT, signal.SIGHUP):
        signal.signal(s, signal.SIG_IGN)
    data = b""
    while True:
        try:
            chunk = os.read(0, 4096)
        except InterruptedError:  # pragma: no cover - Python retries it anyway
            continue
        except OSError:
            break
        if not chunk:  # EOF: the driver closed the pipe, or it is gone
            break
        data += chunk
    session_dir = None
    for line in data.decode(errors="replace").splitlines():
        if line.startswith("session "):
            session_dir = line[len("session "):]
    ended = reap(token, session_dir, programs, exclude=(driver,))
    if ended and session_dir:
        # What it ended, next to Ray's own logs of the session.
        try:
            with open(os.path.join(session_dir, "logs", "asyncsim_watchdog.log"), "a") as f:
                f.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} driver {driver} gone; ended "
                        + ", ".join(f"{p} {n}" for p, n in sorted(ended.items())) + "\n")
        except OSError:
            pass
    return 0


# ----------------------------------------------------------------------------- driver side
class Guard:
    """The driver's end of a watchdog: ``env()`` is the marker to set around ``ray.init``,
    :meth:`session` tells it the session's folder, :meth:`close` (after ``ray.shutdown``)
    makes it end any straggler now and exit."""

    def __init__(self, token: str, proc: subprocess.Popen):
        self.token, self.proc = token, proc

    def env(self) -> dict[str, str]:
        return {MARKER: self.token}

    def session(self, session_dir: str) -> None:
        try:
            self.proc.stdin.write(f"session {session_dir}\n".encode())
            self.proc.stdin.flush()
        except (OSError, ValueError):  # the watchdog is gone: nothing to tell
            pass

    def close(self, *, wait: float | None = None) -> None:
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        if wait is not None:
            try:
                self.proc.wait(wait)
            except subprocess.TimeoutExpired:
                pass


def guard(programs: tuple[str, ...] = ()) -> Guard | None:
    """Start a watchdog for a Ray session this process is about to start: ``programs`` are
    the executables (files or folders) a process of that session runs, besides this Python.
    None where ``/proc`` is missing (not Linux): Ray's own fate sharing only."""

    if not os.path.isdir("/proc/self/fd"):
        return None
    token = f"{os.getpid()}-{time.time_ns()}-{os.urandom(4).hex()}"
    exe = os.path.realpath(sys.executable)
    env = {k: v for k, v in os.environ.items() if k != MARKER}
    proc = subprocess.Popen(
        [sys.executable, "-I", "-S", os.path.abspath(__file__), token, str(os.getpid()), exe,
         *programs],
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        cwd="/", env=env, close_fds=True, start_new_session=True)
    return Guard(token, proc)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
