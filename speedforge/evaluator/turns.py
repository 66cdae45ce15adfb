"""The device's turn: only the phases of a run that time hold the device.

A run prepares without the turn (loading, construction, each side's first call) and holds it for
correctness, the timed pairs and the guards, so several sandboxes may run at once per device
(`evaluator.overlap_runs`; docs/concepts/evaluator.md). The parent mediates the turn over a socket
of its own, so code in the sandbox can neither keep it past its run nor hand it on:

    child (harness)              parent (`Turn`, one per sandboxed run)
    "ask"          ------------>  waits for the device's host-wide lock (flock, `device_key`)
                   <------------  "go CPUS" once held (CPUS: where the timed phase runs, on the CPU)
    "done"         ------------>  released, once: after a cold run's pristine reference, sent
                                  before the candidate is imported (any later "done" is ignored)

Otherwise the parent releases the turn when the sandbox has ended. The time a run waited for it
does not count against the run's limit (`Turn.credit_s`). On the CPU the grant claims the CPUs the
timed phase is pinned to (speedforge.evaluator.cpus). A cold run has two turns, the pristine
reference's and the main one (`pristine_held_s` of `held_s`); `spans()` keeps the recent turns.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import fcntl
import os
import socket
import threading
import time
from pathlib import Path

from speedforge.evaluator import cpus as cpu_claims
from speedforge.evaluator import phases

LOCK_DIR_NAME = "speedforge-turns"
MAX_LINE = 64  # longer lines on the turn socket are not the harness's: ignored


@dataclasses.dataclass(frozen=True)
class Span:
    """One turn of one sandboxed job, in time.time() seconds."""

    key: str  # the device's turn key (device_key)
    label: str  # the job's candidate id and kind, e.g. "3f2a...:run"
    launched: float  # when the job's sandbox was started (its preparation began)
    asked: float
    granted: float
    released: float
    which: str = "main"  # "pristine": the pristine reference's turn; "main": the run's own

    @property
    def wait_s(self) -> float:
        return self.granted - self.asked

    @property
    def held_s(self) -> float:
        return self.released - self.granted


_SPANS: collections.deque[Span] = collections.deque(maxlen=1000)
_SPANS_LOCK = threading.Lock()


def spans() -> list[Span]:
    """The turns this process granted and released, oldest first (the last 1000)."""
    with _SPANS_LOCK:
        return list(_SPANS)


def device_key(device: str) -> str:
    """The name of a device's turn, the same in every process of the host that uses that device:
    "cpu", or "cuda-" and the physical GPU (its entry in CUDA_VISIBLE_DEVICES, as Ray sets it for
    each bench worker, else its index)."""
    kind, _, index = device.partition(":")
    if kind != "cuda":
        return kind
    number = int(index or 0)
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    physical = visible[number] if number < len(visible) else str(number)
    return "cuda-" + "".join(c if c.isalnum() or c in "-_" else "_" for c in physical)


def lock_dir() -> Path:
    return cpu_claims.host_lock_dir(LOCK_DIR_NAME)  # every user's evaluations on this host share a device's turn


class Turn:
    """The parent's side of one sandboxed run's turn: serves the child's requests on `sock` from
    a thread until `close()`, which releases whatever is held. `pin`: CPUs to claim for the timed
    phase (0: none). `pristine`: the job is a pristine job, whose one turn is the pristine turn."""

    def __init__(
        self, sock: socket.socket, key: str, label: str, done_allowed: bool, pin: int = 0, pristine: bool = False
    ) -> None:
        self.sock, self.key, self.label, self.pin = sock, key, label, pin
        self.done_allowed = done_allowed  # the one "done" of a run that times its pristine reference first
        self.pristine = pristine
        self.launched = time.time()
        self._ended = threading.Event()
        self._lock = threading.Lock()
        self._fd = -1  # the held lock file, -1 when not held
        self._cpus: contextlib.ExitStack | None = None
        self._asked: float | None = None  # time.time() of a pending or held request
        self._granted: float | None = None
        self._waited_s = 0.0  # finished waits
        self._held_s = 0.0  # finished holds
        self._pristine_held_s = 0.0  # of them, the pristine turn's
        self._which = ""  # the turn held or being waited for: "pristine" or "main"
        self.problem = ""  # why the turn was granted without the device's lock (a harness failure), if so
        self._thread = threading.Thread(target=self._serve, name="speedforge-turn", daemon=True)
        self._thread.start()

    def credit_s(self) -> float:
        """Seconds the run has waited for the turn so far (a wait under way included)."""
        with self._lock:
            pending = time.time() - self._asked if self._asked is not None and self._granted is None else 0.0
            return self._waited_s + pending

    @property
    def waited_s(self) -> float:
        return self.credit_s()

    @property
    def held_s(self) -> float:
        with self._lock:
            return self._held_s + (time.time() - self._granted if self._granted is not None else 0.0)

    @property
    def pristine_held_s(self) -> float:
        """Of `held_s`, the seconds the pristine turn held the device (a pristine job's, or a cold
        run's until the harness's "done")."""
        with self._lock:
            held = time.time() - self._granted if self._granted is not None and self._which == "pristine" else 0.0
            return self._pristine_held_s + held

    def _current(self) -> str:
        """The turn a request now is for: the pristine one until the harness's "done"."""
        return "pristine" if self.pristine or self.done_allowed else "main"

    def close(self) -> None:
        """The job has ended (its process group killed): stop serving, release the turn."""
        self._ended.set()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._thread.join(timeout=5)
        self._release()
        self.sock.close()

    # -- the serving thread ----------------------------------------------------------------------

    def _serve(self) -> None:
        buffer = b""
        while not self._ended.is_set():
            try:
                data = self.sock.recv(256)
            except OSError:
                return
            if not data:  # the job closed its end (or ended): the turn stays held until close()
                return
            buffer += data
            *lines, buffer = buffer.split(b"\n")
            buffer = buffer[-MAX_LINE:]
            for line in lines:
                if line == b"ask":
                    try:
                        self._grant()
                    except Exception as exc:  # a harness failure: the run goes on, with a warning, never hangs
                        self.problem = f"the device's turn failed ({type(exc).__name__}: {exc}): timed without it"
                        try:
                            self.sock.sendall(b"go \n")
                        except OSError:
                            pass
                elif line == b"done":
                    self._done()

    def _grant(self) -> None:
        with self._lock:
            if self._fd >= 0 or self._asked is not None:
                return  # held or being waited for: one turn at a time
            self._asked = time.time()
            self._which = which = self._current()
        phases.mark(f"turn:asked:{which}")
        fd = self._acquire()
        if fd < 0:  # the job ended while waiting
            with self._lock:
                self._waited_s += time.time() - self._asked
                self._asked = None
            return
        cpus: list[int] = []
        if self.pin:
            stack = contextlib.ExitStack()
            cpus = stack.enter_context(cpu_claims.claim(self.pin))
            self._cpus = stack
        with self._lock:
            self._fd = fd
            self._granted = time.time()
            self._waited_s += self._granted - self._asked
        phases.mark(f"turn:granted:{which}")
        try:
            self.sock.sendall(b"go " + ",".join(map(str, cpus)).encode() + b"\n")
        except OSError:
            pass

    def _done(self) -> None:
        if not self.done_allowed:
            return
        self.done_allowed = False  # the first "done" only: the harness's, before the candidate loads
        self._release()

    def _acquire(self) -> int:
        """Hold the device's lock (an exclusive flock on its file); -1 when the job ended first.
        Where the lock file cannot be opened the turn is granted without it (the evaluator stays
        total; `problem` says so, and the result carries it as a warning)."""
        try:
            fd = os.open(lock_dir() / f"{self.key}.lock", os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o444)
        except OSError as exc:
            self.problem = f"the device's turn was granted without its lock ({exc}): timed beside other runs maybe"
            return os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        poll_s = 0.001
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except OSError:
                pass
            if self._ended.wait(poll_s):
                os.close(fd)
                return -1
            poll_s = min(poll_s * 2, 0.01)

    def _release(self) -> None:
        with self._lock:
            fd, self._fd = self._fd, -1
            cpus, self._cpus = self._cpus, None
            granted, asked, which = self._granted, self._asked, self._which
            self._granted = self._asked = None
            now = time.time()
            if granted is not None:
                self._held_s += now - granted
                if which == "pristine":
                    self._pristine_held_s += now - granted
        if cpus is not None:
            cpus.close()
        if fd >= 0:
            os.close(fd)  # closing the descriptor releases its lock
            phases.mark(f"turn:released:{which}")
            with _SPANS_LOCK:
                _SPANS.append(Span(self.key, self.label, self.launched, asked, granted, now, which or "main"))


# -- a quiet device -----------------------------------------------------------------------------


@contextlib.contextmanager
def device_use(key: str, quiet: bool):
    """Hold the use of a device for one sandboxed run (or pristine) job, from before its launch to
    its end: shared by every job, or, `quiet`, alone. A quiet job waits for the jobs already on
    the device to end and keeps new ones from starting until it has ended, so that nothing else
    prepares (imports, first calls, autotuning, graph capture) or times on that device meanwhile:
    what the tripwire's confirmations run under (speedforge.evaluator.evaluate), since a
    confirmation that repeats the conditions of the trip confirms nothing. A gate lock makes the
    waiting quiet job go first: a stream of shared holders cannot starve it. Where the lock files
    cannot be opened the job runs without them."""
    folder = lock_dir()
    try:
        gate = os.open(folder / f"{key}.gate", os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o444)
    except OSError:
        yield
        return
    try:
        use = os.open(folder / f"{key}.use", os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o444)
    except OSError:
        os.close(gate)
        yield
        return
    try:
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(use, fcntl.LOCK_EX if quiet else fcntl.LOCK_SH)
        finally:
            if not quiet:  # a quiet job keeps the gate: no shared holder starts before it has ended
                fcntl.flock(gate, fcntl.LOCK_UN)
        yield
    finally:
        os.close(use)  # closing the descriptors releases their locks
        os.close(gate)


# -- the child's side -------------------------------------------------------------------------

_channel_fd = -1  # the turn socket of this job (set by speedforge.evaluator.child.execute)
_holding = False
# set by the harness while the candidate runs (a run takes its turn after the candidate's first
# call): left out of the guards' comparison of module-level values (speedforge.evaluator.guards)
HARNESS_STATE = ("_holding",)


def set_channel(fd: int) -> None:
    global _channel_fd
    _channel_fd = fd


def take() -> list[int]:
    """Ask the parent for the device's turn and wait for it; returns the CPUs the timed phase is
    pinned to ([] for none) after moving every thread of this process there. Without a turn
    socket (a job run outside a sandbox's parent) it returns at once."""
    global _holding
    if _channel_fd < 0 or _holding:
        return []
    phases.mark("turn_asked")
    try:
        os.write(_channel_fd, b"ask\n")
        reply = b""
        while not reply.endswith(b"\n"):
            data = os.read(_channel_fd, 256)
            if not data:
                return []  # the parent is gone: the job is being ended
            reply += data
    except OSError:
        return []
    _holding = True
    phases.mark("turn_granted")
    cpus = [int(c) for c in reply.decode().split(" ", 1)[1].strip().split(",") if c] if reply.startswith(b"go ") else []
    if cpus:
        _pin_threads(cpus)
    return cpus


def end_pristine() -> None:
    """The pristine reference of a run is timed: tell the parent (held or not), before any
    candidate code is imported; the parent honours only this first "done"."""
    global _holding
    if _channel_fd < 0:
        return
    try:
        os.write(_channel_fd, b"done\n")
    except OSError:
        pass
    _holding = False
    phases.mark("turn_done")


def _pin_threads(cpus: list[int]) -> None:
    """Every thread of this process (torch's pools included) onto `cpus`."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except OSError:  # a thread that just ended
            pass
